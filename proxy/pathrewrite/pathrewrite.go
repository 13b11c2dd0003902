// Package pathrewrite rewrites the file-system paths and file URIs a
// scanned JSON-RPC message locates (jsonrpc.FieldPath, jsonrpc.FieldURI)
// between a tenant's virtual root and its host root (a pathmap.Mapper), as
// edits to splice, and scrubs the host root out of an agent's free text.
package pathrewrite

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/pathmap"
)

// pathError is a client path the tenant may not use.
type pathError struct {
	label string
	err   error
}

func (e *pathError) Error() string { return "params." + e.label + ": " + e.err.Error() }

// ToAgent rewrites the path and file URI fields of a client message from
// the virtual root to the host root (nil mapper: none), appending to
// edits. A path outside the root, or one that escapes it through a
// symlink, is refused naming the field.
func ToAgent(mapper *pathmap.Mapper, m *jsonrpc.Message, edits []jsonrpc.Edit) ([]jsonrpc.Edit, error) {
	if mapper == nil {
		return edits, nil
	}
	for _, f := range m.Fields {
		if f.Kind != jsonrpc.FieldPath && f.Kind != jsonrpc.FieldURI {
			continue
		}
		v, ok := m.String(f)
		if !ok {
			return edits, &pathError{f.Label, errors.New("must be a string")}
		}
		var mapped string
		var err error
		if f.Kind == jsonrpc.FieldPath {
			mapped, err = mapper.ToAgent(v)
		} else {
			mapped, err = mapper.URIToAgent(v)
		}
		if err != nil {
			return edits, &pathError{f.Label, err}
		}
		if mapped != v {
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
		}
	}
	return edits, nil
}

// ToClient rewrites the path and file URI fields of an agent message from
// the host root to the virtual root (nil mapper: none), appending to
// edits. Host paths outside the root are redacted, except in a request
// that asks the client to act on the file (confined): then outside is
// returned as the label of the offending field, and nothing is edited.
func ToClient(mapper *pathmap.Mapper, m *jsonrpc.Message, edits []jsonrpc.Edit, confined bool) ([]jsonrpc.Edit, string) {
	if mapper == nil {
		return edits, ""
	}
	for _, f := range m.Fields {
		if f.Kind != jsonrpc.FieldPath && f.Kind != jsonrpc.FieldURI {
			continue
		}
		v, ok := m.String(f)
		if !ok {
			continue // not a string: nothing to map, passed as it is
		}
		// Outside the root, both return the redacted stand-in
		// ("/<outside-workspace>/<basename>", or its file URI).
		var mapped string
		if f.Kind == jsonrpc.FieldPath {
			mapped, ok = mapper.ToClient(v)
		} else {
			mapped, ok = mapper.URIToClient(v)
		}
		if !ok && confined {
			return edits, f.Label
		}
		if mapped != v {
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
		}
	}
	return edits, ""
}

// ScrubHostRoot replaces the host root with the virtual root wherever it
// still appears in agent output (free text: tool titles, rawInput,
// messages), so a tenant never learns where its files live on the host.
// Only whole path prefixes match ("/srv/acme" not in "/srv/acme2"). Roots
// with characters JSON escapes are left alone, as is everything with a nil
// mapper. out, when replaced, goes back to jsonrpc's buffer pool.
func ScrubHostRoot(m *pathmap.Mapper, out []byte) []byte {
	if m == nil || m.Root() == m.VirtualRoot() {
		return out
	}
	root, virt := m.Root(), m.VirtualRoot()
	if !jsonPlain(root) || !jsonPlain(virt) {
		return out
	}
	i := bytes.Index(out, []byte(root))
	if i < 0 {
		return out
	}
	if virt == "/" {
		virt = ""
	}
	var b []byte // from the pool once there is something to replace
	rest := out
	for ; i >= 0; i = bytes.Index(rest, []byte(root)) {
		end := i + len(root)
		if end < len(rest) && !pathBoundary(rest[end]) || i > 0 && !pathStart(rest[i-1]) {
			if b != nil { // not a path: copied as it is (before b, out's prefix is implied)
				b = append(b, rest[:end]...)
			}
			rest = rest[end:]
			continue
		}
		if b == nil {
			b = jsonrpc.GetBuffer(len(out) + 64)
			b = append(b, out[:len(out)-len(rest)]...)
		}
		b = append(b, rest[:i]...)
		b = append(b, virt...)
		if (end == len(rest) || rest[end] != '/') && virt == "" {
			b = append(b, '/')
		}
		rest = rest[end:]
	}
	if b == nil {
		return out
	}
	b = append(b, rest...)
	jsonrpc.PutBuffer(out)
	return b
}

// pathBoundary: the byte after a root that ends a path component.
func pathBoundary(c byte) bool {
	return c == '/' || c == '"' || c == '\\' || c == ' ' || c == '\'' || c == '`' || c == ':' || c == ')' || c == ']' || c == ',' || c == '\n' || c == '\t'
}

// pathStart: the byte before a root where a path may start.
func pathStart(c byte) bool {
	return c == '"' || c == ' ' || c == '\'' || c == '`' || c == '(' || c == '[' || c == '=' || c == ':' || c == ',' || c == '\n' || c == '\t' || c == '>'
}

// jsonPlain reports whether s appears in JSON text as itself.
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// PromptBlocks is the prompt of line, a session/prompt request as its agent
// gets it (its paths mapped to the agent's root: mapper, nil for none), as
// its client sent it: the blocks with their paths mapped back. nil: line is
// not such a request.
func PromptBlocks(mapper *pathmap.Mapper, line []byte) []json.RawMessage {
	var sc jsonrpc.Scanner
	var m jsonrpc.Message
	sc.Methods = acp.Methods
	line = bytes.TrimSuffix(line, []byte("\n"))
	spec := func(*jsonrpc.Message) *jsonrpc.Spec { return acp.ParamsSpec(acp.SessionPrompt, true) }
	if sc.Scan(line, &m, spec) != nil {
		return nil
	}
	if edits, _ := ToClient(mapper, &m, nil, false); len(edits) > 0 {
		jsonrpc.SortEdits(edits)
		line = jsonrpc.Splice(nil, line, edits)
		if sc.Scan(line, &m, spec) != nil {
			return nil
		}
	}
	return acp.PromptBlocks(m.Payload)
}

// List rewrites every session of a session/list result m (its sessionId,
// cwd and other directories) for a client of the tenant mapper maps, and
// drops the ones the client may not see: those whose cwd is outside the
// tenant root (with tenants, the agent lists every tenant's sessions), and
// those seal refuses. seal gives the client-visible ID of an agent session
// ID, or false to hide it.
func List(mapper *pathmap.Mapper, m *jsonrpc.Message, edits []jsonrpc.Edit, seal func(agentSID string) (string, bool)) []jsonrpc.Edit {
	var elems [][2]int
	var hidden []bool
	for i, f := range m.Fields {
		if f.Kind != jsonrpc.FieldElement {
			continue
		}
		var sidField, cwdField *jsonrpc.Field
		var dirs []jsonrpc.Field
		for j := i + 1; j < len(m.Fields) && m.Fields[j].Parent == i; j++ {
			switch g := &m.Fields[j]; g.Kind {
			case jsonrpc.FieldSessionID:
				sidField = g
			case jsonrpc.FieldPath:
				if g.Label == "sessions[].cwd" {
					cwdField = g
				} else {
					dirs = append(dirs, *g)
				}
			}
		}
		sid, ok := "", false
		if sidField != nil {
			sid, ok = m.String(*sidField)
		}
		var clientCwd string // the cwd as the client sees it
		if ok && mapper != nil {
			cwd, isStr := "", false
			if cwdField != nil {
				cwd, isStr = m.String(*cwdField)
			}
			var inside bool
			clientCwd, inside = mapper.ToClient(cwd)
			ok = isStr && inside
		}
		var id string
		if ok {
			id, ok = seal(sid)
		}
		elems = append(elems, [2]int{f.Start, f.End})
		hidden = append(hidden, !ok)
		if !ok {
			continue
		}
		edits = append(edits, jsonrpc.Edit{Start: sidField.Start, End: sidField.End, Repl: jsonrpc.AppendQuote(nil, id)})
		if mapper != nil {
			edits = append(edits, jsonrpc.Edit{Start: cwdField.Start, End: cwdField.End, Repl: jsonrpc.AppendQuote(nil, clientCwd)})
			for _, pf := range dirs {
				v, _ := m.String(pf)
				mapped, _ := mapper.ToClient(v) // redacted if outside
				edits = append(edits, jsonrpc.Edit{Start: pf.Start, End: pf.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
			}
		}
	}
	return jsonrpc.DeleteElements(edits, elems, func(i int) bool { return hidden[i] })
}
