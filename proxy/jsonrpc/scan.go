// Package jsonrpc reads and edits JSON-RPC 2.0 messages without re-encoding
// them.
//
// A Scanner validates one message in a single pass of a token-streaming
// decoder (jsontext), records where the envelope members sit, and locates the
// payload fields a Spec names. Callers then splice replacements into the
// original bytes with Splice: every byte outside the replaced values is copied
// through verbatim (unknown fields, _meta, whitespace, key order).
//
// Duplicate object member names anywhere in the message and invalid UTF-8 are
// rejected, never forwarded: two peers that resolve a duplicate key
// differently would see two different messages.
package jsonrpc

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// Kind says what a message is.
type Kind uint8

const (
	KindInvalid Kind = iota
	KindRequest
	KindNotification
	KindResponse
)

func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindNotification:
		return "notification"
	case KindResponse:
		return "response"
	}
	return "invalid"
}

// FieldKind names what a located payload field holds, and so how a caller
// rewrites it.
type FieldKind uint8

const (
	FieldNone      FieldKind = iota
	FieldSessionID           // a session ID (string)
	FieldRequestID           // a JSON-RPC id embedded in a payload ($/cancel_request.requestId)
	FieldPath                // an absolute file-system path
	FieldURI                 // a URI that may be a file:// URI
	FieldElement             // an array element or object value as a whole (for filtering)
	FieldTag                 // a discriminator to inspect, e.g. a content block's "type"
	FieldMeta                // a _meta object, located whole so that members can be added to it
)

// Spec is a tree of payload fields to locate. The zero Spec locates nothing.
type Spec struct {
	Kind   FieldKind        // record this value itself with this kind
	Label  string           // names the field in error messages ("cwd", "prompt[].uri")
	Fields map[string]*Spec // object members to descend into
	Elems  *Spec            // every array element
}

// Field is one located value: Raw[Start:End] is its JSON text. Parent is the
// index in Message.Fields of the nearest enclosing located field (-1 if none).
type Field struct {
	Kind       FieldKind
	Start, End int
	Parent     int
	Label      string // the Spec's label
}

// Message is the scanned envelope of one JSON-RPC message. Byte ranges refer
// to Raw, which the Message does not own; it is valid while Raw is.
type Message struct {
	Raw    []byte
	Kind   Kind
	ID     []byte // raw JSON id (number or string; "null" for an error response to an unknown id); nil if absent
	IDPos  [2]int // start, end of ID in Raw
	Method string // "" for responses
	// Payload is the raw params (requests, notifications), result or error
	// (responses); nil if absent.
	Payload    []byte
	PayloadPos [2]int
	IsError    bool
	Fields     []Field
}

// ErrorClass tells a caller which JSON-RPC error a scan failure deserves.
type ErrorClass uint8

const (
	ErrParse   ErrorClass = iota + 1 // not JSON, invalid UTF-8, duplicate keys: -32700
	ErrInvalid                       // JSON, but not a JSON-RPC 2.0 message: -32600
	ErrBatch                         // a JSON array (batch), which ACP does not use: -32600
)

// ScanError is returned by Scan. Partial carries what was read of the
// envelope before the failure, so that an invalid request can still be
// answered with its id where one was found.
type ScanError struct {
	Class ErrorClass
	Err   error
	ID    []byte
}

func (e *ScanError) Error() string { return e.Err.Error() }
func (e *ScanError) Unwrap() error { return e.Err }

// Resolver picks the Spec for a message's payload once the scanner knows the
// method (requests, notifications) or the id (responses). It may return nil.
// It must read only Kind, Method, ID and IsError: while a big message is
// scanned through its shadow (see elide.go), Raw and Payload are the
// shadow's, and a resolver may be called twice for one message.
type Resolver func(m *Message) *Spec

// Scanner reuses its decoder and buffers across messages; it is not safe for
// concurrent use.
type Scanner struct {
	// Methods interns method names so that scanning a known method does not
	// allocate: keys and values are the same strings. May be nil.
	Methods map[string]string

	// SnakeTwins also rejects a payload member that is the snake_case
	// spelling of a field the Spec locates ("session_id" for "sessionId",
	// "mcp_servers" for "mcpServers", "field_meta" for "_meta"): the models
	// of ACP's Python SDK accept those names as well (pydantic's
	// populate_by_name), so an agent built on it would read a field the
	// gateway never located or checked. Set for clients' messages.
	SnakeTwins bool

	bb     bytes.Buffer
	dec    jsontext.Decoder
	stack  []int  // parent field indexes while walking
	method []byte // unquoted method name
	name   []byte // unquoted envelope member name, when it has escapes
	member []byte // the same for payload members (walk)

	// Eliding long strings (see elide.go).
	orig       []byte // the message, while scanning its shadow; else nil
	shadowBuf  []byte
	elisions   []elision
	minMessage int // 0: elideMinMessage; tests lower them
	minString  int // 0: elideMinString
}

var errTrailing = errors.New("trailing data after the JSON-RPC message")

// Scan validates raw as a single JSON-RPC 2.0 message and fills m. m.Fields
// is reused (truncated) so that a caller can keep one Message per goroutine.
func (s *Scanner) Scan(raw []byte, m *Message, resolve Resolver) error {
	minMessage, minString := cmp.Or(s.minMessage, elideMinMessage), cmp.Or(s.minString, elideMinString)
	if len(raw) >= minMessage && s.shadow(raw, minString) {
		s.orig = raw
		err := s.scan(s.shadowBuf, m, resolve)
		s.orig = nil
		if cap(s.shadowBuf) > maxKeptShadow { // a connection does not keep a big message's shadow
			s.shadowBuf = nil
		}
		if cap(s.elisions) > maxKeptShadow/64 {
			s.elisions = nil
		}
		if err == nil {
			s.unshadow(raw, m)
			return nil
		}
		// Scanned again below, so that the error and its offsets are
		// jsontext's own for the message as sent.
	}
	return s.scan(raw, m, resolve)
}

// unshadow maps what scanning the shadow found back to raw.
func (s *Scanner) unshadow(raw []byte, m *Message) {
	m.Raw = raw
	if m.ID != nil {
		m.IDPos = [2]int{s.rawOffset(m.IDPos[0]), s.rawOffset(m.IDPos[1])}
		m.ID = raw[m.IDPos[0]:m.IDPos[1]]
	}
	if m.Payload != nil {
		m.PayloadPos = [2]int{s.rawOffset(m.PayloadPos[0]), s.rawOffset(m.PayloadPos[1])}
		m.Payload = raw[m.PayloadPos[0]:m.PayloadPos[1]]
	}
	for i := range m.Fields {
		f := &m.Fields[i]
		f.Start, f.End = s.rawOffset(f.Start), s.rawOffset(f.End)
	}
}

// value returns the text of the value v that ends at end, from the message
// as sent when the scanner reads a shadow (where a long string is "").
func (s *Scanner) value(v jsontext.Value, end int) jsontext.Value {
	if s.orig == nil {
		return v
	}
	return s.orig[s.rawOffset(end-len(v)):s.rawOffset(end)]
}

func (s *Scanner) scan(raw []byte, m *Message, resolve Resolver) error {
	fields := m.Fields[:0]
	*m = Message{Raw: raw, Fields: fields}
	s.bb = *bytes.NewBuffer(raw)
	s.dec.Reset(&s.bb)
	s.stack = s.stack[:0]
	d := &s.dec

	switch d.PeekKind() {
	case '{':
	case '[':
		if _, err := d.ReadValue(); err != nil {
			return &ScanError{Class: ErrParse, Err: err}
		}
		return &ScanError{Class: ErrBatch, Err: errors.New("batch arrays are not supported: send one JSON-RPC message per frame")}
	case 0:
		_, err := d.ReadToken()
		if err == nil || err == io.EOF {
			err = errors.New("empty message")
		}
		return &ScanError{Class: ErrParse, Err: err}
	default:
		if _, err := d.ReadValue(); err != nil {
			return &ScanError{Class: ErrParse, Err: err}
		}
		return &ScanError{Class: ErrInvalid, Err: errors.New("a JSON-RPC message must be a JSON object")}
	}
	if _, err := d.ReadToken(); err != nil {
		return &ScanError{Class: ErrParse, Err: err}
	}
	var (
		version                     bool
		hasMethod, hasResult, hasID bool
		deferred                    bool
		invalid                     error
	)
	for d.PeekKind() == '"' {
		quoted, err := d.ReadValue()
		if err != nil {
			return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
		}
		// Compare names unescaped: "\u0070arams" is "params" to every peer.
		name, err := unquoteName(&s.name, quoted)
		if err != nil {
			return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
		}
		switch string(name) {
		case "jsonrpc":
			v, err := d.ReadValue()
			if err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
			version = string(s.value(v, int(d.InputOffset()))) == `"2.0"`
			if !version && invalid == nil {
				invalid = errors.New(`"jsonrpc" must be "2.0"`)
			}
		case "id":
			v, err := d.ReadValue()
			if err != nil {
				return &ScanError{Class: ErrParse, Err: err}
			}
			hasID = true
			if k := v.Kind(); k != '0' && k != '"' && k != 'n' {
				// Not an id one can answer: the error reply gets null.
				if invalid == nil {
					invalid = errors.New(`"id" must be a string, a number or null`)
				}
				continue
			}
			end := int(d.InputOffset())
			m.ID, m.IDPos = s.value(v, end), [2]int{end - len(v), end}
		case "method":
			v, err := d.ReadValue()
			if err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
			v = s.value(v, int(d.InputOffset()))
			if v.Kind() != '"' {
				if invalid == nil {
					invalid = errors.New(`"method" must be a string`)
				}
				continue
			}
			s.method, err = jsontext.AppendUnquote(s.method[:0], v)
			if err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
			m.Method = s.intern(s.method)
			hasMethod = true
		case "params", "result", "error":
			isParams := string(name) == "params"
			if string(name) == "error" {
				m.IsError = true
			}
			if !isParams {
				hasResult = true
			}
			if m.Payload != nil && invalid == nil {
				invalid = errors.New("a message has one of params, result or error")
			}
			start := int(d.InputOffset())
			var spec *Spec
			if resolve != nil && ((isParams && hasMethod) || (!isParams && hasID)) {
				m.Kind = kindOf(hasMethod, hasID, hasResult)
				spec = resolve(m)
			} else if resolve != nil {
				deferred = true
			}
			if spec != nil {
				if err := s.walk(m, spec, -1); err != nil {
					return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
				}
			} else if _, err := d.ReadValue(); err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
			end := int(d.InputOffset())
			v := raw[start:end]
			v = bytes.TrimLeft(v, " \t\r\n:")
			m.Payload, m.PayloadPos = v, [2]int{end - len(v), end}
		default:
			if twin, ok := caseTwin(name, envelopeNames...); ok {
				return &ScanError{Class: ErrParse, Err: caseTwinError(name, twin), ID: m.ID}
			}
			if err := d.SkipValue(); err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
		}
	}
	if _, err := d.ReadToken(); err != nil {
		return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
	}
	if _, err := d.ReadToken(); err != io.EOF {
		if err == nil {
			err = errTrailing
		}
		return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
	}
	m.Kind = kindOf(hasMethod, hasID, hasResult)
	switch {
	case invalid != nil:
	case !version:
		invalid = errors.New(`missing "jsonrpc": "2.0"`)
	case m.Kind == KindInvalid && hasMethod:
		invalid = errors.New("a request has no result or error")
	case m.Kind == KindInvalid:
		invalid = errors.New(`not a request, notification or response: no "method", or a response without "id"`)
	case m.Kind == KindResponse && m.Payload == nil:
		invalid = errors.New(`a response needs "result" or "error"`)
	case m.Kind != KindResponse && m.Payload != nil && m.Payload[0] != '{' && m.Payload[0] != '[':
		invalid = errors.New(`"params" must be an object or an array`)
	}
	if invalid != nil {
		return &ScanError{Class: ErrInvalid, Err: invalid, ID: m.ID}
	}
	if deferred && m.Payload != nil {
		if spec := resolve(m); spec != nil {
			base := m.PayloadPos[0]
			s.bb = *bytes.NewBuffer(m.Payload)
			s.dec.Reset(&s.bb)
			n := len(m.Fields)
			if err := s.walk(m, spec, -1); err != nil {
				return &ScanError{Class: ErrParse, Err: err, ID: m.ID}
			}
			for i := n; i < len(m.Fields); i++ {
				m.Fields[i].Start += base
				m.Fields[i].End += base
			}
		}
	}
	return nil
}

func (s *Scanner) intern(b []byte) string {
	if v, ok := s.Methods[string(b)]; ok {
		return v
	}
	return string(b)
}

func kindOf(hasMethod, hasID, hasResult bool) Kind {
	switch {
	case hasMethod && hasResult:
		return KindInvalid
	case hasMethod && hasID:
		return KindRequest
	case hasMethod:
		return KindNotification
	case hasID && hasResult:
		return KindResponse
	}
	return KindInvalid
}

// walk reads one value at the decoder's position, recording the fields spec
// names. parent is the index of the enclosing recorded field.
func (s *Scanner) walk(m *Message, spec *Spec, parent int) error {
	d := &s.dec
	if spec.Kind != FieldNone && spec.Fields == nil && spec.Elems == nil {
		v, err := d.ReadValue()
		if err != nil {
			return err
		}
		end := int(d.InputOffset())
		m.Fields = append(m.Fields, Field{Kind: spec.Kind, Start: end - len(v), End: end, Parent: parent, Label: spec.Label})
		return nil
	}
	self := parent
	if spec.Kind != FieldNone {
		self = len(m.Fields)
		m.Fields = append(m.Fields, Field{Kind: spec.Kind, Parent: parent, Label: spec.Label})
	}
	kind := d.PeekKind()
	switch {
	case kind == '{' && spec.Fields != nil:
		if _, err := d.ReadToken(); err != nil {
			return err
		}
		if self != parent {
			m.Fields[self].Start = int(d.InputOffset()) - 1
		}
		for d.PeekKind() == '"' {
			quoted, err := d.ReadValue()
			if err != nil {
				return err
			}
			name, err := unquoteName(&s.member, quoted) // Spec names are plain
			if err != nil {
				return err
			}
			sub := spec.Fields[string(name)]
			if sub == nil {
				if err := checkCaseTwin(spec.Fields, name); err != nil {
					return err
				}
				if s.SnakeTwins && bytes.IndexByte(name, '_') >= 0 {
					if err := checkSnakeTwin(spec.Fields, name); err != nil {
						return err
					}
				}
				if err := d.SkipValue(); err != nil {
					return err
				}
				continue
			}
			if err := s.walk(m, sub, self); err != nil {
				return err
			}
		}
		if _, err := d.ReadToken(); err != nil {
			return err
		}
	case kind == '[' && spec.Elems != nil:
		if _, err := d.ReadToken(); err != nil {
			return err
		}
		if self != parent {
			m.Fields[self].Start = int(d.InputOffset()) - 1
		}
		for d.PeekKind() != ']' && d.PeekKind() != 0 {
			if err := s.walk(m, spec.Elems, self); err != nil {
				return err
			}
		}
		if _, err := d.ReadToken(); err != nil {
			return err
		}
	default:
		v, err := d.ReadValue()
		if err != nil {
			return err
		}
		if self != parent {
			end := int(d.InputOffset())
			m.Fields[self].Start = end - len(v)
		}
	}
	if self != parent {
		m.Fields[self].End = int(d.InputOffset())
	}
	return nil
}

var envelopeNames = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// caseTwin reports whether name (not one of names exactly) equals one of
// them under Unicode case folding. Some decoders, Go's encoding/json among
// them, match member names that way: such a member would be read as the
// field the gateway located, by the peer and not by the gateway (a parser
// differential), so it is rejected like a duplicate.
func caseTwin(name []byte, names ...string) (string, bool) {
	for _, n := range names {
		if len(name) >= len(n)/3 && strings.EqualFold(string(name), n) {
			return n, true
		}
	}
	return "", false
}

func checkCaseTwin(fields map[string]*Spec, name []byte) error {
	for n := range fields {
		if twin, ok := caseTwin(name, n); ok {
			return caseTwinError(name, twin)
		}
	}
	return nil
}

// checkSnakeTwin reports a name that is the snake_case spelling of one of
// fields' names (see Scanner.SnakeTwins). Only names with an underscore
// that the Spec does not locate get here; the comparison allocates nothing.
func checkSnakeTwin(fields map[string]*Spec, name []byte) error {
	for n := range fields {
		if snakeTwin(name, n) {
			return fmt.Errorf("member name %q is the snake_case spelling of %q; some peers read them as one", name, n)
		}
	}
	return nil
}

// snakeTwin reports whether name is n as Python models name its field,
// case folded: camelCase words joined by underscores, a leading underscore
// as "field_" ("_meta" is field_meta). A name n spells the same either way
// ("cwd") is no twin.
func snakeTwin(name []byte, n string) bool {
	i, differs := 0, false
	if strings.HasPrefix(n, "_") {
		if len(name) < 5 || !strings.EqualFold(string(name[:5]), "field") {
			return false
		}
		i, differs = 5, true
	}
	for _, r := range n {
		if unicode.IsUpper(r) {
			if i > 0 {
				if i >= len(name) || name[i] != '_' {
					return false
				}
				i++
				differs = true
			}
		}
		c, size := utf8.DecodeRune(name[i:])
		if i >= len(name) || unicode.ToLower(c) != unicode.ToLower(r) {
			return false
		}
		i += size
	}
	return differs && i == len(name)
}

func caseTwinError(name []byte, twin string) error {
	return fmt.Errorf("member name %q differs from %q only in case; some peers read them as one", name, twin)
}

// unquoteName returns a member name unescaped: the bytes inside quoted
// when it has no escapes, else its unquoted text, in *buf.
func unquoteName(buf *[]byte, quoted jsontext.Value) ([]byte, error) {
	name := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(name, '\\') < 0 {
		return name, nil
	}
	var err error
	*buf, err = jsontext.AppendUnquote((*buf)[:0], quoted)
	return *buf, err
}

// String returns the unquoted text of a located string field, or ok=false
// if the field is not a JSON string.
func (m *Message) String(f Field) (string, bool) {
	b, ok := m.RawString(f)
	return string(b), ok
}

// RawString returns the contents of a located string field without
// copying when it has no escapes (the common case), else its unquoted text.
// The slice may alias Raw.
func (m *Message) RawString(f Field) ([]byte, bool) {
	v := m.Raw[f.Start:f.End]
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, true
	}
	s, err := jsontext.AppendUnquote(nil, v)
	return s, err == nil
}

// Bytes returns the raw JSON text of a located field.
func (m *Message) Bytes(f Field) []byte { return m.Raw[f.Start:f.End] }

// FieldOf returns the first located field of the given kind whose parent is
// parent, and whether there was one.
func (m *Message) FieldOf(kind FieldKind, parent int) (Field, bool) {
	for _, f := range m.Fields {
		if f.Kind == kind && f.Parent == parent {
			return f, true
		}
	}
	return Field{}, false
}

// String describes the failure (the same text as Error, prefixed).
func (e *ScanError) String() string { return fmt.Sprintf("scan: %v", e.Err) }
