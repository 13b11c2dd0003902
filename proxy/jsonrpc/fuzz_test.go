package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// ---------------------------------------------------------------------------
// Independent oracles built on encoding/json only.

// hasDuplicateKeys reports whether any JSON object in data (at any depth)
// has two members with the same name after unescaping, as encoding/json
// reads names. data must be valid JSON. Invalid UTF-8 and lone surrogates
// in names decode to U+FFFD, so they may collide here; callers test those
// separately.
func hasDuplicateKeys(data []byte) (bool, error) {
	type frame struct {
		obj       bool
		expectKey bool
		keys      map[string]struct{}
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].expectKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, &frame{obj: true, expectKey: true, keys: map[string]struct{}{}})
			case '[':
				stack = append(stack, &frame{})
			case '}', ']':
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].expectKey {
				top := stack[n-1]
				if _, dup := top.keys[v]; dup {
					return true, nil
				}
				top.keys[v] = struct{}{}
				top.expectKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

// located names the scanner compares member names against (the envelope
// and testResolve's specs).
var located = []string{"jsonrpc", "id", "method", "params", "result", "error", "sessionId", "requestId", "sessions"}

// hasCaseTwinName reports whether some member name in data (valid JSON)
// equals a located name under case folding without being it: the scanner
// refuses those (some decoders read them as the same field).
func hasCaseTwinName(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if s, ok := tok.(string); ok {
			for _, n := range located {
				if s != n && strings.EqualFold(s, n) {
					return true
				}
			}
		}
	}
}

// hasLoneSurrogate reports whether a string in data (valid JSON) contains a
// \uXXXX escape of a UTF-16 surrogate that is not part of a valid pair.
func hasLoneSurrogate(data []byte) bool {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		var r rune
		for _, c := range b[:4] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 >= len(data) {
				return false
			}
			if data[i+1] != 'u' {
				i++
				continue
			}
			r, ok := hex4(data[i+2:])
			if !ok {
				return false
			}
			i += 5
			switch {
			case 0xDC00 <= r && r <= 0xDFFF:
				return true
			case 0xD800 <= r && r <= 0xDBFF:
				if i+6 < len(data) && data[i+1] == '\\' && data[i+2] == 'u' {
					if lo, ok := hex4(data[i+3:]); ok && 0xDC00 <= lo && lo <= 0xDFFF {
						i += 6
						continue
					}
				}
				return true
			}
		}
	}
	return false
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// disagreesWithEncodingJSON compares a successful scan with how
// encoding/json (standing in for any peer) reads the same bytes, for the
// envelope and for the fields testResolve's specs name. It returns "" when
// they agree, else what differs.
func disagreesWithEncodingJSON(raw []byte, m *Message) string {
	v, err := decodeJSON(raw)
	if err != nil {
		return "encoding/json cannot decode it: " + err.Error()
	}
	env, ok := v.(map[string]any)
	if !ok {
		return "encoding/json does not read an object"
	}
	if env["jsonrpc"] != "2.0" {
		return fmt.Sprintf("encoding/json reads jsonrpc as %#v", env["jsonrpc"])
	}
	id, hasID := env["id"]
	method, hasMethod := env["method"]
	switch m.Kind {
	case KindRequest, KindNotification:
		if !hasMethod || method != m.Method {
			return fmt.Sprintf("encoding/json reads method %#v", method)
		}
		if (m.Kind == KindRequest) != hasID {
			return fmt.Sprintf("encoding/json reads id %#v (present %v)", id, hasID)
		}
	case KindResponse:
		if hasMethod {
			return fmt.Sprintf("encoding/json reads a method %#v in a response", method)
		}
		if !hasID {
			return "encoding/json reads no id in a response"
		}
	default:
		return "scan succeeded with KindInvalid"
	}
	if m.ID != nil {
		sid, err := decodeJSON(m.ID)
		if err != nil || !reflect.DeepEqual(sid, id) {
			return fmt.Sprintf("encoding/json reads id %#v, scanner %s", id, m.ID)
		}
	}
	want := ""
	if m.Payload != nil {
		switch {
		case m.Kind != KindResponse:
			want = "params"
		case m.IsError:
			want = "error"
		default:
			want = "result"
		}
	}
	for _, k := range []string{"params", "result", "error"} {
		got, ok := env[k]
		if k != want {
			if ok {
				return fmt.Sprintf("encoding/json reads %q, the scanner did not", k)
			}
			continue
		}
		if !ok {
			return fmt.Sprintf("encoding/json reads no %q", k)
		}
		p, err := decodeJSON(m.Payload)
		if err != nil || !reflect.DeepEqual(p, got) {
			return fmt.Sprintf("encoding/json reads %s %#v, scanner %s", k, got, m.Payload)
		}
	}
	var payload any
	if want != "" {
		payload = env[want]
	}
	located := 0
	// leaf checks that obj[key] (if obj is an object with key) was located
	// exactly once as kind under parent, with the same value.
	leaf := func(obj any, key string, kind FieldKind, parent int) string {
		var hits []Field
		for _, f := range m.Fields {
			if f.Kind == kind && f.Parent == parent {
				hits = append(hits, f)
			}
		}
		mp, _ := obj.(map[string]any)
		val, ok := mp[key]
		if !ok {
			if len(hits) != 0 {
				return fmt.Sprintf("scanner located %q (kind %d, parent %d) that encoding/json does not see", m.Bytes(hits[0]), kind, parent)
			}
			return ""
		}
		if len(hits) != 1 {
			return fmt.Sprintf("encoding/json reads %s = %#v (parent %d), scanner located %d such fields", key, val, parent, len(hits))
		}
		located++
		got, err := decodeJSON(m.Bytes(hits[0]))
		if err != nil || !reflect.DeepEqual(got, val) {
			return fmt.Sprintf("encoding/json reads %s = %#v, scanner located %s", key, val, m.Bytes(hits[0]))
		}
		return ""
	}
	if m.Kind != KindResponse {
		if msg := leaf(payload, "sessionId", FieldSessionID, -1); msg != "" {
			return msg
		}
		if msg := leaf(payload, "requestId", FieldRequestID, -1); msg != "" {
			return msg
		}
	} else {
		if msg := leaf(payload, "sessionId", FieldSessionID, -1); msg != "" {
			return msg
		}
		mp, _ := payload.(map[string]any)
		arr, _ := mp["sessions"].([]any)
		var elems []int
		for i, f := range m.Fields {
			if f.Kind == FieldElement && f.Parent == -1 {
				elems = append(elems, i)
			}
		}
		if len(elems) != len(arr) {
			return fmt.Sprintf("encoding/json reads %d sessions, scanner located %d", len(arr), len(elems))
		}
		for j, idx := range elems {
			located++
			got, err := decodeJSON(m.Bytes(m.Fields[idx]))
			if err != nil || !reflect.DeepEqual(got, arr[j]) {
				return fmt.Sprintf("sessions[%d]: encoding/json reads %#v, scanner located %s", j, arr[j], m.Bytes(m.Fields[idx]))
			}
			if msg := leaf(arr[j], "sessionId", FieldSessionID, idx); msg != "" {
				return fmt.Sprintf("sessions[%d]: %s", j, msg)
			}
		}
	}
	if located != len(m.Fields) {
		return fmt.Sprintf("scanner located %d fields, encoding/json accounts for %d", len(m.Fields), located)
	}
	return ""
}

// ---------------------------------------------------------------------------
// FuzzScan

// sealedLike is an 87-character ID shaped like a sealed gateway session ID.
const sealedLike = "AYhV3bq0Zk2mF9sQeX7tLw4pR1cN8uJ6oD5gH0iK3lM2nB7vC9xZ4aS1dF6gH8jK0lQ2wE5rT7yU9iO3pA6sD8f"

var fuzzSeeds = []string{
	`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_abc123","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hello, world!\n"}}}}`,
	`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_abc123","update":{"sessionUpdate":"tool_call","toolCallId":"call_1","title":"Read file","kind":"read","status":"pending","locations":[{"path":"/home/u/p/main.go"}]}}}`,
	`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"sess_abc123","prompt":[{"type":"text","text":"Explain this \"code\""},{"type":"resource_link","uri":"file:///home/u/p/main.go","name":"main.go"}]}}`,
	`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true},"terminal":true}}}`,
	`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true},"authMethods":[]}}`,
	`{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/home/u/p","mcpServers":[]}}`,
	`{"jsonrpc":"2.0","id":3,"result":{"sessionId":"sess_new","modes":{"currentModeId":"ask","availableModes":[{"id":"ask","name":"Ask"}]}}}`,
	`{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}`,
	`{"jsonrpc":"2.0","id":7,"result":{"sessions":[{"sessionId":"a","cwd":"/x","title":"A"},{"sessionId":"b","cwd":"/y"},{"cwd":"/z"}],"nextCursor":null}}`,
	`{"jsonrpc":"2.0","id":4,"error":{"code":-32002,"message":"Resource not found","data":{"sessionId":"sess_gone"}}}`,
	`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
	`{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"sess_abc123"}}`,
	`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5}}`,
	`{"jsonrpc":"2.0","id":"srv-1","method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c"},"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}}`,
	`{"jsonrpc":"2.0","id":"srv-1","result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`,
	`{"params":{"sessionId":"late","_meta":{"sessionId":"no"}},"method":"session/update","jsonrpc":"2.0"}`,
	`{"result":{"sessionId":"late"},"id":9,"jsonrpc":"2.0"}`,
	"{\n  \"jsonrpc\": \"2.0\",\n  \"method\": \"session/update\",\r\n  \"params\": { \"sessionId\" : \"s\\u0031\", \"update\": {} }\n}\n",
	`{"jsonrpc":"2.0","method":"m","params":{"session\u0049d":"esc","t":"\ud83d\ude00 \u00e9 \/"}}`,
	`{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,"a":2}}`,
	`{"jsonrpc":"2.0","method":"m","params":{"t":"\ud800"}}`,
	"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"t\":\"\xff\"}}",
	`[{"jsonrpc":"2.0","method":"m"}]`,
	`{"jsonrpc":"1.0","id":1,"method":"m"}`,
	`{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}`,
	`{}{}`,
	``,
}

func FuzzScan(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	repl := []byte(`"` + sealedLike + `"`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		orig := append([]byte(nil), raw...)
		var s Scanner
		var m Message
		err := s.Scan(raw, &m, testResolve)
		if !bytes.Equal(raw, orig) {
			t.Fatalf("Scan modified its input")
		}

		// A scanner and message that were used before must give the
		// same answer as fresh ones.
		var s2 Scanner
		var m2 Message
		_ = s2.Scan([]byte(fuzzSeeds[8]), &m2, testResolve)
		err2 := s2.Scan(raw, &m2, testResolve)
		if classOf(err) != classOf(err2) {
			t.Fatalf("fresh scanner: %v; reused scanner: %v", err, err2)
		}
		checkElision(t, raw, err, &m)

		if err != nil {
			var se *ScanError
			if !errors.As(err, &se) {
				t.Fatalf("error %T is not a *ScanError: %v", err, err)
			}
			switch se.Class {
			case ErrParse, ErrInvalid, ErrBatch:
			default:
				t.Fatalf("unknown error class %d: %v", se.Class, err)
			}
			if se.ID != nil && !json.Valid(se.ID) {
				t.Fatalf("ScanError.ID %q is not JSON", se.ID)
			}
			if se.Class == ErrParse && json.Valid(raw) {
				dup, derr := hasDuplicateKeys(raw)
				if derr != nil {
					t.Fatalf("duplicate checker: %v", derr)
				}
				if !dup && utf8.Valid(raw) && !hasLoneSurrogate(raw) && !hasCaseTwinName(raw) {
					t.Fatalf("ErrParse (%v) for valid JSON without duplicate keys, case-variant names, invalid UTF-8 or lone surrogates: %q", err, raw)
				}
			}
			return
		}

		// Accepted: valid JSON, no duplicate names, valid Unicode.
		if !json.Valid(raw) {
			t.Fatalf("accepted input that encoding/json rejects: %q", raw)
		}
		if dup, derr := hasDuplicateKeys(raw); dup || derr != nil {
			t.Fatalf("accepted input with a duplicate key (%v): %q", derr, raw)
		}
		if !utf8.Valid(raw) {
			t.Fatalf("accepted invalid UTF-8: %q", raw)
		}
		if hasLoneSurrogate(raw) {
			t.Fatalf("accepted a lone surrogate escape: %q", raw)
		}
		checkMessage(t, &m)
		if msg := disagreesWithEncodingJSON(raw, &m); msg != "" {
			t.Fatalf("scanner and encoding/json disagree on %q: %s", raw, msg)
		}
		if !reflect.DeepEqual(fieldsOrNil(m.Fields), fieldsOrNil(m2.Fields)) || m.Kind != m2.Kind || !bytes.Equal(m.ID, m2.ID) {
			t.Fatalf("reused scanner disagrees: %+v vs %+v", m, m2)
		}

		// Replace every located session ID.
		var edits []Edit
		for _, f := range m.Fields {
			if f.Kind == FieldSessionID {
				edits = append(edits, Edit{Start: f.Start, End: f.End, Repl: repl})
			}
		}
		SortEdits(edits)
		for i := 1; i < len(edits); i++ {
			if edits[i].Start < edits[i-1].End {
				t.Fatalf("session ID fields overlap: %+v", edits)
			}
		}
		out := Splice([]byte("prefix"), raw, edits)
		if !bytes.HasPrefix(out, []byte("prefix")) {
			t.Fatalf("Splice lost dst")
		}
		out = out[len("prefix"):]
		if !json.Valid(out) {
			t.Fatalf("spliced output is not valid JSON: %q", out)
		}
		checkSegments(t, raw, out, edits)

		// The rewritten message scans the same, with the new IDs.
		var m3 Message
		if err := s.Scan(out, &m3, testResolve); err != nil {
			t.Fatalf("rescan of spliced output: %v\n%q", err, out)
		}
		if m3.Kind != m.Kind || m3.Method != m.Method || !bytes.Equal(m3.ID, m.ID) || len(m3.Fields) != len(m.Fields) {
			t.Fatalf("rescan differs: %+v vs %+v", m3, m)
		}
		for i, f := range m3.Fields {
			if f.Kind != FieldSessionID {
				continue
			}
			if v, ok := m3.String(f); !ok || v != sealedLike {
				t.Fatalf("rescanned field %d = %q", i, m3.Bytes(f))
			}
		}
	})
}

func fieldsOrNil(f []Field) []Field {
	if len(f) == 0 {
		return nil
	}
	return f
}

// checkSegments verifies that out is raw with edits applied: every byte
// outside the edited ranges is identical and in order.
func checkSegments(t testing.TB, raw, out []byte, edits []Edit) {
	t.Helper()
	at, o := 0, 0
	for i, e := range edits {
		seg := raw[at:e.Start]
		if o+len(seg) > len(out) || !bytes.Equal(out[o:o+len(seg)], seg) {
			t.Fatalf("segment before edit %d differs: raw[%d:%d] = %q", i, at, e.Start, seg)
		}
		o += len(seg)
		if o+len(e.Repl) > len(out) || !bytes.Equal(out[o:o+len(e.Repl)], e.Repl) {
			t.Fatalf("replacement %d not found at output offset %d", i, o)
		}
		o += len(e.Repl)
		at = e.End
	}
	if !bytes.Equal(out[o:], raw[at:]) {
		t.Fatalf("tail differs: %q vs %q", out[o:], raw[at:])
	}
}

// ---------------------------------------------------------------------------
// FuzzLineReader

// chunkReader returns data in pieces whose sizes come from sizes.
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(r.data)
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)])%23 + 1
		r.i++
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

type lineResult struct {
	line    string
	tooLong int // Size of a *LineTooLongError; 0 for a line
}

// modelLines is the documented LineReader behaviour: lines end at '\n';
// a trailing "\r" (the CRLF ending) is dropped; lines that are empty or
// white space are skipped; a line of more than max bytes (everything
// before the '\n') is reported as too long.
func modelLines(data []byte, max int) []lineResult {
	segs := bytes.Split(data, []byte("\n"))
	if len(segs[len(segs)-1]) == 0 {
		segs = segs[:len(segs)-1]
	}
	var out []lineResult
	for _, seg := range segs {
		if len(seg) > max {
			out = append(out, lineResult{tooLong: len(seg)})
			continue
		}
		line := bytes.TrimRight(seg, "\r")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		out = append(out, lineResult{line: string(line)})
	}
	return out
}

func readLines(t testing.TB, lr *LineReader, maxCalls int) []lineResult {
	t.Helper()
	var got []lineResult
	for i := 0; ; i++ {
		if i > maxCalls {
			t.Fatalf("no io.EOF after %d calls", maxCalls)
		}
		line, err := lr.Next()
		if err == io.EOF {
			if line != nil {
				t.Fatalf("io.EOF with a line %q", line)
			}
			return got
		}
		var tl *LineTooLongError
		if errors.As(err, &tl) {
			if tl.Size <= tl.Limit {
				t.Fatalf("LineTooLongError with size %d <= limit %d", tl.Size, tl.Limit)
			}
			got = append(got, lineResult{tooLong: tl.Size})
			continue
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got = append(got, lineResult{line: string(line)})
	}
}

func FuzzLineReader(f *testing.F) {
	f.Add([]byte("{\"a\":1}\n\n{\"b\":2}\r\nlast"), uint16(20), []byte{1, 2, 3})
	f.Add([]byte("0123456789abcdefXYZ\nshort\n"), uint16(16), []byte{})
	f.Add([]byte("\r\n\r\n  \n\t\nx"), uint16(15), []byte{0})
	f.Add([]byte("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nbb\n"), uint16(40), []byte{7, 30})
	f.Add([]byte("abc\r\r\n\rdef\n"), uint16(16), []byte{100})
	f.Add([]byte(strings.Repeat("x", 300)+"\n"+strings.Repeat("y", 299)+"\n"), uint16(299), []byte{200, 255})
	f.Fuzz(func(t *testing.T, data []byte, limit uint16, sizes []byte) {
		max := int(limit % 512)
		lr := NewLineReader(&chunkReader{data: data, sizes: sizes}, max)
		var got []lineResult
		for i := 0; ; i++ {
			if i > len(data)+1 {
				t.Fatalf("no io.EOF after %d calls", i)
			}
			line, err := lr.Next()
			if err == io.EOF {
				break
			}
			var tl *LineTooLongError
			if errors.As(err, &tl) {
				if tl.Limit != max || tl.Size <= max {
					t.Fatalf("LineTooLongError{Limit: %d, Size: %d} with limit %d", tl.Limit, tl.Size, max)
				}
				got = append(got, lineResult{tooLong: tl.Size})
				continue
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if len(line) > max {
				t.Fatalf("line of %d bytes exceeds the limit %d: %q", len(line), max, line)
			}
			if bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("line contains a newline: %q", line)
			}
			got = append(got, lineResult{line: string(line)})
		}
		if want := modelLines(data, max); !reflect.DeepEqual(got, want) {
			t.Fatalf("limit %d, input %q:\n got %+v\nwant %+v", max, data, got, want)
		}
	})
}

// ---------------------------------------------------------------------------
// FuzzSplice: DeleteElements on arrays of small JSON values, located the way
// the relay locates session/list entries.

var spliceVals = []string{
	`1`, `"a"`, `null`, `{}`, `[]`, `{"sessionId":"x"}`, `[1,[2]]`, `true`,
	`"a,b"`, `"]"`, `{"sessionId":"y","t":[1,2]}`, `-0.5e1`, `","`,
	`{"a":{"b":[]}}`, `""`, `false`,
}

var spliceWS = []string{"", " ", "\n", "\t", "\r\n  ", "  "}

// buildArray makes an array from data: data[0] picks the length (0-8),
// data[1] which elements to delete, then two bytes per element pick its
// value and the white space around its comma.
func buildArray(data []byte) (arr string, vals []string, mask uint8) {
	at := func(i int) byte {
		if i < len(data) {
			return data[i]
		}
		return 0
	}
	n := int(at(0) % 9)
	mask = at(1)
	var b strings.Builder
	b.WriteString("[")
	b.WriteString(spliceWS[int(at(2))%len(spliceWS)])
	for i := 0; i < n; i++ {
		v := spliceVals[int(at(3+2*i))%len(spliceVals)]
		ws := at(4 + 2*i)
		vals = append(vals, v)
		b.WriteString(v)
		b.WriteString(spliceWS[int(ws&7)%len(spliceWS)])
		if i < n-1 {
			b.WriteString(",")
			b.WriteString(spliceWS[int(ws>>4)%len(spliceWS)])
		}
	}
	b.WriteString("]")
	return b.String(), vals, mask
}

// checkDeleted splices edits into raw and checks that the result is valid
// JSON whose result.sessions holds exactly the kept values.
func checkDeleted(t testing.TB, raw []byte, edits []Edit, vals []string, deleted func(int) bool) {
	t.Helper()
	for i := 1; i < len(edits); i++ {
		if edits[i].Start < edits[i-1].End {
			t.Fatalf("DeleteElements edits overlap, Splice cannot apply them: %+v in %q", edits, raw)
		}
	}
	out := Splice(nil, raw, edits)
	if !json.Valid(out) {
		t.Fatalf("deleting from %s gives invalid JSON: %s", raw, out)
	}
	var got struct {
		Result struct {
			Sessions []json.RawMessage `json:"sessions"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	var want []string
	for i, v := range vals {
		if !deleted(i) {
			want = append(want, v)
		}
	}
	if len(got.Result.Sessions) != len(want) {
		t.Fatalf("deleting from %s gives %s: %d elements, want %d", raw, out, len(got.Result.Sessions), len(want))
	}
	for i, g := range got.Result.Sessions {
		if string(g) != want[i] {
			t.Fatalf("deleting from %s gives %s: element %d = %s, want %s", raw, out, i, g, want[i])
		}
	}
}

func FuzzSplice(f *testing.F) {
	f.Add([]byte{3, 0b010, 5, 0, 0x11, 1, 0x22, 2, 0x30})
	f.Add([]byte{1, 1, 0, 5, 0})
	f.Add([]byte{4, 0b1001, 1, 8, 0x12, 9, 0x21, 12, 0x34, 3, 0})
	f.Add([]byte{2, 0b01, 3, 0, 0, 1, 0})
	f.Add([]byte{5, 0b00100, 4, 10, 0x55, 6, 0x44, 13, 0x33, 14, 0x22, 15, 0x11})
	f.Fuzz(func(t *testing.T, data []byte) {
		arr, vals, mask := buildArray(data)
		raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"sessions":` + arr + `,"nextCursor":null}}`)
		m, elems := scanElements(t, raw)
		if len(elems) != len(vals) {
			t.Fatalf("located %d elements in %s, want %d", len(elems), raw, len(vals))
		}
		for i, e := range elems {
			if string(m.Bytes(e)) != vals[i] {
				t.Fatalf("element %d = %s, want %s", i, m.Bytes(e), vals[i])
			}
		}

		// Deleting any one element removes it, white space, and exactly
		// one comma (none if it is the only element).
		for i, el := range elems {
			edits := deleteElements(raw, elems, func(j int) bool { return j == i })
			if len(edits) != 1 {
				t.Fatalf("deleting element %d gives %d edits", i, len(edits))
			}
			e := edits[0]
			if e.Start > el.Start || e.End < el.End || e.Repl != nil {
				t.Fatalf("DeleteElements(%d) = %+v does not cover [%d,%d)", i, e, el.Start, el.End)
			}
			extra := string(raw[e.Start:el.Start]) + string(raw[el.End:e.End])
			commas := strings.Count(extra, ",")
			if strings.Trim(extra, ", \t\r\n") != "" || (len(elems) > 1) != (commas == 1) || commas > 1 {
				t.Fatalf("DeleteElements(%d) also removes %q from %s", i, extra, raw)
			}
			checkDeleted(t, raw, edits, vals, func(j int) bool { return j == i })
		}

		// Deleting several elements at once, as the relay does when it
		// filters a session/list result.
		drop := func(j int) bool { return mask&(1<<j) != 0 }
		edits := deleteElements(raw, elems, drop)
		checkDeleted(t, raw, edits, vals, drop)
	})
}

// checkElision scans raw again with every string value elided (see
// elide.go) and with none, and requires the same answer as the default
// scanner's (err, m) from all three.
func checkElision(t *testing.T, raw []byte, err error, m *Message) {
	t.Helper()
	for _, min := range []int{1, 1 << 30} {
		s := Scanner{minMessage: min, minString: min}
		var m2 Message
		err2 := s.Scan(raw, &m2, testResolve)
		if fmt.Sprint(err) != fmt.Sprint(err2) {
			t.Fatalf("elision threshold %d: error %v, want %v (input %q)", min, err2, err, raw)
		}
		if err != nil {
			continue
		}
		if !bytes.Equal(m.Raw, m2.Raw) || m.Kind != m2.Kind || !bytes.Equal(m.ID, m2.ID) || m.IDPos != m2.IDPos ||
			m.Method != m2.Method || !bytes.Equal(m.Payload, m2.Payload) || m.PayloadPos != m2.PayloadPos ||
			m.IsError != m2.IsError || !slices.Equal(m.Fields, m2.Fields) {
			t.Fatalf("elision threshold %d: message %+v, want %+v (input %q)", min, m2, *m, raw)
		}
	}
}
