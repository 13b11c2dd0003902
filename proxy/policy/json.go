package policy

import (
	"bytes"
	"errors"
	"io"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// member is one member of a JSON object, located in the object's bytes.
type member struct {
	name       string // unquoted
	start, end int    // `"name" : value`, from the name's quote to the value's end
	val        []byte // the raw value: obj[end-len(val):end]
}

var errNotObject = errors.New("not a JSON object")

// objectMembers splits obj, one JSON object (surrounding whitespace
// allowed), into its members. The default jsontext options apply: invalid
// UTF-8 and duplicate names (at any depth) are errors, since a peer that
// keeps the first duplicate and one that keeps the last would disagree
// about what the gateway allowed.
func objectMembers(obj []byte) ([]member, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(obj))
	if dec.PeekKind() != jsontext.KindBeginObject {
		if _, err := dec.ReadValue(); err != nil {
			return nil, err
		}
		return nil, errNotObject
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, err
	}
	var ms []member
	for dec.PeekKind() == jsontext.KindString {
		quoted, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		start := int(dec.InputOffset()) - len(quoted)
		name, err := jsontext.AppendUnquote(nil, quoted)
		if err != nil {
			return nil, err
		}
		val, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		ms = append(ms, member{name: string(name), start: start, end: end, val: obj[end-len(val) : end]})
	}
	if _, err := dec.ReadToken(); err != nil { // '}', or the syntax error
		return nil, err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("trailing data after the JSON object")
		}
		return nil, err
	}
	return ms, nil
}

// lookup returns the value of the member called name, or nil.
func lookup(ms []member, name string) []byte {
	for _, m := range ms {
		if m.name == name {
			return m.val
		}
	}
	return nil
}

// subMembers returns the members of the object under name, and whether
// there is such an object (absent, null and malformed values are not).
func subMembers(ms []member, name string) ([]member, bool) {
	v := lookup(ms, name)
	if kindOf(v) != jsontext.KindBeginObject {
		return nil, false
	}
	sub, err := objectMembers(v)
	return sub, err == nil
}

func kindOf(v []byte) jsontext.Kind {
	if len(v) == 0 {
		return jsontext.KindInvalid
	}
	return jsontext.Value(v).Kind()
}

// isMarker reports whether v is an ACP support marker that says "yes": an
// object ({} or one with nested data). Absent, null and malformed values
// mean unsupported.
func isMarker(v []byte) bool { return kindOf(v) == jsontext.KindBeginObject }

// isTrue reports whether v is the literal true (v1 boolean capabilities;
// malformed values fall back to the default, false).
func isTrue(v []byte) bool { return kindOf(v) == jsontext.KindTrue }

// nonEmptyArray reports whether v is an array with at least one element.
func nonEmptyArray(v []byte) bool {
	if kindOf(v) != jsontext.KindBeginArray {
		return false
	}
	return len(bytes.TrimSpace(v[1:len(v)-1])) > 0
}

// intValue parses a JSON number that is a non-negative integer ("2", "2.0",
// "2e0"); anything else is 0.
func intValue(v []byte) int {
	if kindOf(v) != jsontext.KindNumber {
		return 0
	}
	if n, err := strconv.ParseUint(string(v), 10, 16); err == nil {
		return int(n)
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f < 0 || f > 65535 || f != float64(int(f)) {
		return 0
	}
	return int(f)
}

// stringValue unquotes v if it is a JSON string.
func stringValue(v []byte) (string, bool) {
	if kindOf(v) != jsontext.KindString {
		return "", false
	}
	s, err := jsontext.AppendUnquote(nil, v)
	if err != nil {
		return "", false
	}
	return string(s), true
}

// An action says what happens to one member of an object being rewritten.
type action struct {
	drop bool
	repl []byte // when not nil, the member's new value
}

var keep = action{}

// rewriteObject returns obj with each member kept, dropped or given a new
// value as decide says; the bytes of everything else (other members, names,
// whitespace, order) are unchanged. It returns obj itself when nothing
// changes.
func rewriteObject(obj []byte, decide func(m member) (action, error)) ([]byte, error) {
	ms, err := objectMembers(obj)
	if err != nil {
		return nil, err
	}
	acts := make([]action, len(ms))
	changed, lastKept := false, -1
	for i, m := range ms {
		if acts[i], err = decide(m); err != nil {
			return nil, err
		}
		a := acts[i]
		if a.drop || (a.repl != nil && !bytes.Equal(a.repl, m.val)) {
			changed = true
		}
		if !a.drop {
			lastKept = i
		}
	}
	if !changed {
		return obj, nil
	}
	if lastKept < 0 { // every member goes: "{...}" becomes "{}"
		open := bytes.IndexByte(obj, '{')
		closing := bytes.LastIndexByte(obj, '}')
		out := make([]byte, 0, len(obj)-(closing-open-1))
		out = append(out, obj[:open+1]...)
		return append(out, obj[closing:]...), nil
	}
	elems := make([][2]int, len(ms))
	var edits []jsonrpc.Edit
	for i, m := range ms {
		elems[i] = [2]int{m.start, m.end}
		if a := acts[i]; !a.drop && a.repl != nil {
			edits = append(edits, jsonrpc.Edit{Start: m.end - len(m.val), End: m.end, Repl: a.repl})
		}
	}
	edits = jsonrpc.DeleteElements(edits, elems, func(i int) bool { return acts[i].drop })
	jsonrpc.SortEdits(edits)
	return jsonrpc.Splice(nil, obj, edits), nil
}
