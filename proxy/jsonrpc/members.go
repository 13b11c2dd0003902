package jsonrpc

import (
	"bytes"
	"errors"

	"github.com/go-json-experiment/json/jsontext"
)

// Members walks the members of one JSON object to remove some of them by
// splice edits (a client's _meta). It keeps its decoder and buffers from
// one object to the next; it is not safe for concurrent use.
type Members struct {
	bb    bytes.Buffer
	dec   jsontext.Decoder
	elems [][2]int
	drops []bool
	name  []byte
}

var errNotObject = errors.New("not a JSON object")

// Delete appends to dst the edits that remove, from the JSON object at
// raw[start:end], every member drop reports (with its name unescaped: a
// "claude\u0043ode" is "claudeCode", as every peer reads it), leaving valid
// JSON: each removed member goes with one separating comma, and an object
// whose members all go is left "{}" (with its whitespace). Duplicate names
// are each asked about. Every other byte is kept. removed and kept count
// the members that go and stay. An error (the value is not an object, or
// not valid JSON) appends nothing.
func (w *Members) Delete(dst []Edit, raw []byte, start, end int, drop func(name []byte) bool) (_ []Edit, removed, kept int, err error) {
	obj := raw[start:end]
	w.bb = *bytes.NewBuffer(obj)
	w.dec.Reset(&w.bb, jsontext.AllowDuplicateNames(true))
	d := &w.dec
	if d.PeekKind() != '{' {
		return dst, 0, 0, errNotObject
	}
	if _, err := d.ReadToken(); err != nil {
		return dst, 0, 0, err
	}
	w.elems, w.drops = w.elems[:0], w.drops[:0]
	for d.PeekKind() == '"' {
		// Between the value before (or the '{') and the name there is
		// only whitespace and a comma: the name starts at its quote.
		at := int(d.InputOffset())
		at += bytes.IndexByte(obj[at:], '"')
		quoted, err := d.ReadValue()
		if err != nil {
			return dst, 0, 0, err
		}
		name, err := unquoteName(&w.name, quoted)
		if err != nil {
			return dst, 0, 0, err
		}
		gone := drop(name)
		if err := d.SkipValue(); err != nil {
			return dst, 0, 0, err
		}
		w.elems = append(w.elems, [2]int{start + at, start + int(d.InputOffset())})
		w.drops = append(w.drops, gone)
		if gone {
			removed++
		}
	}
	if _, err := d.ReadToken(); err != nil { // the closing '}'
		return dst, 0, 0, err
	}
	if int(d.InputOffset()) != len(bytes.TrimRight(obj, " \t\r\n")) {
		return dst, 0, 0, errors.New("trailing data after the JSON object")
	}
	kept = len(w.elems) - removed
	if removed == 0 {
		return dst, 0, kept, nil
	}
	return DeleteElements(dst, w.elems, func(i int) bool { return w.drops[i] }), removed, kept, nil
}
