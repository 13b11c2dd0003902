package models

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"
)

// selector is one model or mode selector as an agent message carries it:
// a session config option of category "model" or "mode" (type "select"),
// or the models API's or the modes' object. Every range is in the
// message's bytes.
type selector struct {
	api     bool   // the models or modes object, not a config option
	id      string // a config option's ID
	v2      bool   // its ID is "configId" (v2), not "id" (v1)
	kind    kind   // what it selects (its category): a model, a mode, or neither
	sel     bool   // type "select" (or an object)
	elem    [2]int // the config option element, or the models object
	cur     string // currentValue / currentModelId / currentModeId
	curOK   bool   // cur is a string
	curPos  [2]int
	entries []entry // options[] / availableModels[]
}

// entry is one value a selector offers, or a group of them.
type entry struct {
	pos   [2]int
	value string // value / modelId
	ok    bool   // value is a string
	group bool   // a group: sub are its values
	sub   []entry
}

// walker reads one JSON value of doc token by token, locating what it
// reads: base is the offset of the decoder's input in doc.
type walker struct {
	dec  *jsontext.Decoder
	base int
}

func newWalker(doc []byte, start, end int) *walker {
	return &walker{dec: jsontext.NewDecoder(bytes.NewReader(doc[start:end])), base: start}
}

// at is the offset in doc just past what was read last.
func (w *walker) at() int { return w.base + int(w.dec.InputOffset()) }

// str reads a value: a string's text, with its range.
func (w *walker) str() (s string, ok bool, pos [2]int, err error) {
	v, err := w.dec.ReadValue()
	if err != nil {
		return "", false, pos, err
	}
	pos = [2]int{w.at() - len(v), w.at()}
	if v.Kind() != '"' {
		return "", false, pos, nil
	}
	u, err := jsontext.AppendUnquote(nil, v)
	return string(u), err == nil, pos, nil
}

// object reads an object, calling member for each member name (the
// decoder before its value); member must read the value. A value that is
// not an object is skipped: ok false.
func (w *walker) object(member func(name string) error) (pos [2]int, ok bool, err error) {
	if w.dec.PeekKind() != '{' {
		v, err := w.dec.ReadValue()
		return [2]int{w.at() - len(v), w.at()}, false, err
	}
	if _, err := w.dec.ReadToken(); err != nil {
		return pos, false, err
	}
	pos[0] = w.at() - 1
	for w.dec.PeekKind() == '"' {
		name, err := w.dec.ReadToken()
		if err != nil {
			return pos, false, err
		}
		if err := member(name.String()); err != nil {
			return pos, false, err
		}
	}
	if _, err := w.dec.ReadToken(); err != nil {
		return pos, false, err
	}
	pos[1] = w.at()
	return pos, true, nil
}

// array reads an array, calling elem for each element (which must read
// it). A value that is not an array is skipped: ok false.
func (w *walker) array(elem func() error) (ok bool, err error) {
	if w.dec.PeekKind() != '[' {
		_, err := w.dec.ReadValue()
		return false, err
	}
	if _, err := w.dec.ReadToken(); err != nil {
		return false, err
	}
	for w.dec.PeekKind() != ']' {
		if w.dec.PeekKind() == 0 {
			return false, w.dec.SkipValue() // the decoder's own error
		}
		if err := elem(); err != nil {
			return false, err
		}
	}
	_, err = w.dec.ReadToken()
	return true, err
}

// configOptions reads a configOptions array at doc[start:end]: every
// element, model selector or not (a nil-free slice of all of them, so that
// dropping some keeps the array's commas right).
func configOptions(doc []byte, start, end int) ([]selector, error) {
	w := newWalker(doc, start, end)
	var out []selector
	_, err := w.array(func() error {
		var s selector
		pos, _, err := w.object(func(name string) error {
			var err error
			switch name {
			case "id", "configId":
				var ok bool
				s.id, ok, _, err = w.str()
				if !ok {
					s.id = ""
				}
				s.v2 = name == "configId"
			case "category":
				var cat string
				cat, _, _, err = w.str()
				s.kind = kindOfCategory(cat)
			case "type":
				var typ string
				typ, _, _, err = w.str()
				s.sel = typ == "select"
			case "currentValue":
				s.cur, s.curOK, s.curPos, err = w.str()
			case "options":
				s.entries, err = w.entries("value", true)
			default:
				err = w.dec.SkipValue()
			}
			return err
		})
		s.elem = pos
		out = append(out, s)
		return err
	})
	return out, err
}

// apiObject reads the object of kind k at doc[start:end]: the models
// API's {currentModelId, availableModels: [{modelId, ...}]} or the modes'
// {currentModeId, availableModes: [{id, ...}]}. ok false: not an object
// (null: the agent has none).
func apiObject(doc []byte, start, end int, k kind) (s selector, ok bool, err error) {
	w := newWalker(doc, start, end)
	s = selector{api: true, kind: k, sel: true}
	o := kinds[k]
	s.elem, ok, err = w.object(func(name string) error {
		var err error
		switch name {
		case o.current:
			s.cur, s.curOK, s.curPos, err = w.str()
		case o.available:
			s.entries, err = w.entries(o.key, false)
		default:
			err = w.dec.SkipValue()
		}
		return err
	})
	return s, ok, err
}

// entries reads an array of values (objects naming their value under key)
// and, with groups, of groups of them ({options: [...]}). An element of
// another shape is an entry without a value.
func (w *walker) entries(key string, groups bool) ([]entry, error) {
	var out []entry
	_, err := w.array(func() error {
		var e entry
		pos, _, err := w.object(func(name string) error {
			var err error
			switch {
			case name == key:
				e.value, e.ok, _, err = w.str()
			case name == "options" && groups:
				e.group = true
				e.sub, err = w.entries(key, false)
			default:
				err = w.dec.SkipValue()
			}
			return err
		})
		e.pos = pos
		out = append(out, e)
		return err
	})
	return out, err
}
