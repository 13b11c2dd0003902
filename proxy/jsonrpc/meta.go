package jsonrpc

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"
)

// MetaEdit is the edit that sets _meta.acpgate.<key> to value in the JSON
// object at obj[start:end] of a message (its result, or params), creating
// _meta and acpgate where they are missing, and touching nothing else:
// every other byte passes unchanged. ok is false when obj is not an object,
// _meta or _meta.acpgate is present but not an object, or key is there
// already (it is the sender's, and stays).
func MetaEdit(raw []byte, start, end int, key string, value []byte) (Edit, bool) {
	path := []string{"_meta", "acpgate", key}
	obj := raw[start:end]
	dec := jsontext.NewDecoder(bytes.NewReader(obj))
	for depth := 0; ; depth++ {
		if dec.PeekKind() != '{' {
			return Edit{}, false
		}
		if _, err := dec.ReadToken(); err != nil {
			return Edit{}, false
		}
		at := start + int(dec.InputOffset()) // just past the object's '{'
		empty := dec.PeekKind() == '}'
		found := false
		for dec.PeekKind() != '}' {
			name, err := dec.ReadToken()
			if err != nil {
				return Edit{}, false
			}
			if name.String() == path[depth] {
				found = true
				break
			}
			if err := dec.SkipValue(); err != nil {
				return Edit{}, false
			}
		}
		if found && depth == len(path)-1 {
			return Edit{}, false // the key is the sender's
		}
		if found {
			continue // into the object that names the next step
		}
		// Missing from here on: one member holds the rest of the path.
		repl := AppendQuote(nil, path[depth])
		repl = append(repl, ':')
		for _, p := range path[depth+1:] {
			repl = append(AppendQuote(append(repl, '{'), p), ':')
		}
		repl = append(repl, value...)
		for range path[depth+1:] {
			repl = append(repl, '}')
		}
		if !empty {
			repl = append(repl, ',')
		}
		return Edit{Start: at, End: at, Repl: repl}, true
	}
}
