package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

// The test spec mirrors what the relay locates: params.sessionId and
// params.requestId in requests and notifications; result.sessionId and
// result.sessions[] (each element whole, with its sessionId) in responses.
var (
	testLeafSession = &Spec{Kind: FieldSessionID}
	testParamsSpec  = &Spec{Fields: map[string]*Spec{
		"sessionId": testLeafSession,
		"requestId": {Kind: FieldRequestID},
	}}
	testResultSpec = &Spec{Fields: map[string]*Spec{
		"sessionId": testLeafSession,
		"sessions": {Elems: &Spec{Kind: FieldElement, Fields: map[string]*Spec{
			"sessionId": testLeafSession,
		}}},
	}}
)

func testResolve(m *Message) *Spec {
	if m.Kind == KindResponse {
		return testResultSpec
	}
	return testParamsSpec
}

// wantField is a located field by its JSON text (Raw[Start:End]).
type wantField struct {
	kind   FieldKind
	text   string
	parent int
}

func classOf(err error) ErrorClass {
	var se *ScanError
	if errors.As(err, &se) {
		return se.Class
	}
	return 0
}

func TestScan(t *testing.T) {
	type tc struct {
		name    string
		in      string
		class   ErrorClass // 0: success
		kind    Kind
		id      string // raw; "" means absent
		method  string
		payload string // raw; "" means absent
		isError bool
		fields  []wantField
		errID   string // ScanError.ID on failure; "" means nil
	}
	sid := func(text string) wantField { return wantField{FieldSessionID, text, -1} }
	tests := []tc{
		// Requests, notifications, responses.
		{
			name:    "request",
			in:      `{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"sess_1","prompt":[{"type":"text","text":"hi"}]}}`,
			kind:    KindRequest,
			id:      `1`,
			method:  "session/prompt",
			payload: `{"sessionId":"sess_1","prompt":[{"type":"text","text":"hi"}]}`,
			fields:  []wantField{sid(`"sess_1"`)},
		},
		{
			name:    "notification",
			in:      `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hello"}}}}`,
			kind:    KindNotification,
			method:  "session/update",
			payload: `{"sessionId":"sess_1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hello"}}}`,
			fields:  []wantField{sid(`"sess_1"`)},
		},
		{
			name:   "notification without params",
			in:     `{"jsonrpc":"2.0","method":"initialized"}`,
			kind:   KindNotification,
			method: "initialized",
		},
		{
			name:    "request with params array",
			in:      `{"jsonrpc":"2.0","id":2,"method":"m","params":[1,{"sessionId":"no"}]}`,
			kind:    KindRequest,
			id:      `2`,
			method:  "m",
			payload: `[1,{"sessionId":"no"}]`,
		},
		{
			name:    "string id",
			in:      `{"jsonrpc":"2.0","id":"req-\"7\"","method":"session/cancel","params":{"sessionId":"s"}}`,
			kind:    KindRequest,
			id:      `"req-\"7\""`,
			method:  "session/cancel",
			payload: `{"sessionId":"s"}`,
			fields:  []wantField{sid(`"s"`)},
		},
		{
			name:    "negative float id",
			in:      `{"jsonrpc":"2.0","id":-1.5e3,"method":"m","params":{}}`,
			kind:    KindRequest,
			id:      `-1.5e3`,
			method:  "m",
			payload: `{}`,
		},
		{
			name:    "null id request",
			in:      `{"jsonrpc":"2.0","id":null,"method":"m","params":{}}`,
			kind:    KindRequest,
			id:      `null`,
			method:  "m",
			payload: `{}`,
		},
		{
			name:    "result",
			in:      `{"jsonrpc":"2.0","id":3,"result":{"sessionId":"sess_new","modes":null}}`,
			kind:    KindResponse,
			id:      `3`,
			payload: `{"sessionId":"sess_new","modes":null}`,
			fields:  []wantField{sid(`"sess_new"`)},
		},
		{
			name:    "null result",
			in:      `{"jsonrpc":"2.0","id":3,"result":null}`,
			kind:    KindResponse,
			id:      `3`,
			payload: `null`,
		},
		{
			name:    "result before id (deferred)",
			in:      `{"result":{"x":[1,2],"sessionId":"sess_late"},"id":"a","jsonrpc":"2.0"}`,
			kind:    KindResponse,
			id:      `"a"`,
			payload: `{"x":[1,2],"sessionId":"sess_late"}`,
			fields:  []wantField{sid(`"sess_late"`)},
		},
		{
			name:    "error with null id",
			in:      `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
			kind:    KindResponse,
			id:      `null`,
			payload: `{"code":-32700,"message":"Parse error"}`,
			isError: true,
		},
		{
			name:    "error with data",
			in:      `{"jsonrpc":"2.0","id":9,"error":{"code":-32002,"message":"not found","data":{"sessionId":"x"}}}`,
			kind:    KindResponse,
			id:      `9`,
			payload: `{"code":-32002,"message":"not found","data":{"sessionId":"x"}}`,
			isError: true,
		},
		{
			name:    "error before id (deferred)",
			in:      `{"error":{"code":1,"message":"m","sessionId":"e"},"jsonrpc":"2.0","id":4}`,
			kind:    KindResponse,
			id:      `4`,
			payload: `{"code":1,"message":"m","sessionId":"e"}`,
			isError: true,
			fields:  []wantField{sid(`"e"`)},
		},
		// Method escapes.
		{
			name:    "method with escapes",
			in:      `{"jsonrpc":"2.0","id":1,"method":"sess\u0069on\/prompt","params":{"sessionId":"s"}}`,
			kind:    KindRequest,
			id:      `1`,
			method:  "session/prompt",
			payload: `{"sessionId":"s"}`,
			fields:  []wantField{sid(`"s"`)},
		},
		{
			name:   "method with non-ASCII and quote",
			in:     `{"jsonrpc":"2.0","method":"x/\u00e9\"q\"","params":{}}`,
			kind:   KindNotification,
			method: "x/é\"q\"",

			payload: `{}`,
		},
		// Key order: params before method (and id) must resolve late and
		// still report absolute offsets.
		{
			name:    "params before method",
			in:      `{"params":{"prompt":"p","sessionId":"sess_early"},"method":"session/prompt","id":5,"jsonrpc":"2.0"}`,
			kind:    KindRequest,
			id:      `5`,
			method:  "session/prompt",
			payload: `{"prompt":"p","sessionId":"sess_early"}`,
			fields:  []wantField{sid(`"sess_early"`)},
		},
		{
			name:    "params before method, pretty printed",
			in:      "{\n  \"params\" :\r\n\t {\n    \"requestId\": 42,\n    \"sessionId\": \"s-pp\"\n  },\n  \"jsonrpc\": \"2.0\",\n  \"method\": \"$/cancel_request\"\n}\n",
			kind:    KindNotification,
			method:  "$/cancel_request",
			payload: "{\n    \"requestId\": 42,\n    \"sessionId\": \"s-pp\"\n  }",
			fields:  []wantField{{FieldRequestID, `42`, -1}, sid(`"s-pp"`)},
		},
		{
			name:    "method, params, id (resolved before id is known)",
			in:      `{"jsonrpc":"2.0","method":"session/load","params":{"sessionId":"s9"},"id":"z"}`,
			kind:    KindRequest,
			id:      `"z"`,
			method:  "session/load",
			payload: `{"sessionId":"s9"}`,
			fields:  []wantField{sid(`"s9"`)},
		},
		// Nested specs.
		{
			name: "session list (FieldElement with children)",
			in: `{"jsonrpc":"2.0","id":11,"result":{"sessions":[` +
				`{"sessionId":"a","title":"A"},` +
				` {"title":"no id"} ,` +
				`{"cwd":"/x","sessionId":"c","_meta":{"sessionId":"not me"}},` +
				`"odd",` +
				`[{"sessionId":"nested array, not me"}]` +
				`],"nextCursor":"n","sessionId":"top"}}`,
			kind: KindResponse,
			id:   `11`,
			payload: `{"sessions":[` +
				`{"sessionId":"a","title":"A"},` +
				` {"title":"no id"} ,` +
				`{"cwd":"/x","sessionId":"c","_meta":{"sessionId":"not me"}},` +
				`"odd",` +
				`[{"sessionId":"nested array, not me"}]` +
				`],"nextCursor":"n","sessionId":"top"}`,
			fields: []wantField{
				{FieldElement, `{"sessionId":"a","title":"A"}`, -1},
				{FieldSessionID, `"a"`, 0},
				{FieldElement, `{"title":"no id"}`, -1},
				{FieldElement, `{"cwd":"/x","sessionId":"c","_meta":{"sessionId":"not me"}}`, -1},
				{FieldSessionID, `"c"`, 3},
				{FieldElement, `"odd"`, -1},
				{FieldElement, `[{"sessionId":"nested array, not me"}]`, -1},
				sid(`"top"`),
			},
		},
		{
			name:    "session list, result before id, whitespace",
			in:      "{\"result\": {\"sessions\": [ {\"sessionId\": \"a\"} ,\n\t{\"sessionId\": \"b\"} ] }, \"jsonrpc\": \"2.0\", \"id\": 12}",
			kind:    KindResponse,
			id:      `12`,
			payload: "{\"sessions\": [ {\"sessionId\": \"a\"} ,\n\t{\"sessionId\": \"b\"} ] }",
			fields: []wantField{
				{FieldElement, `{"sessionId": "a"}`, -1},
				{FieldSessionID, `"a"`, 0},
				{FieldElement, `{"sessionId": "b"}`, -1},
				{FieldSessionID, `"b"`, 2},
			},
		},
		{
			name:    "empty sessions, sessions not an array",
			in:      `{"jsonrpc":"2.0","id":1,"result":{"sessions":{"sessionId":"no"}}}`,
			kind:    KindResponse,
			id:      `1`,
			payload: `{"sessions":{"sessionId":"no"}}`,
		},
		{
			name:    "members not in spec are skipped",
			in:      `{"jsonrpc":"2.0","x":{"sessionId":"no"},"method":"session/update","_meta":[1,{"a":"b"}],"params":{"update":{"sessionId":"no"},"_meta":{"sessionId":"no"},"sessionId":"yes","extra":[{"sessionId":"no"}]}}`,
			kind:    KindNotification,
			method:  "session/update",
			payload: `{"update":{"sessionId":"no"},"_meta":{"sessionId":"no"},"sessionId":"yes","extra":[{"sessionId":"no"}]}`,
			fields:  []wantField{sid(`"yes"`)},
		},
		{
			name:    "escaped member name inside params is located",
			in:      `{"jsonrpc":"2.0","method":"m","params":{"session\u0049d":"esc"}}`,
			kind:    KindNotification,
			method:  "m",
			payload: `{"session\u0049d":"esc"}`,
			fields:  []wantField{sid(`"esc"`)},
		},
		{
			name:    "non-string sessionId is still located",
			in:      `{"jsonrpc":"2.0","method":"m","params":{"sessionId":{"a":[1]}}}`,
			kind:    KindNotification,
			method:  "m",
			payload: `{"sessionId":{"a":[1]}}`,
			fields:  []wantField{sid(`{"a":[1]}`)},
		},
		{
			name:   "trailing whitespace",
			in:     "{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\r\n \t",
			kind:   KindNotification,
			method: "m",
		},

		// Parse errors: duplicate keys.
		{name: "duplicate id", in: `{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}`, class: ErrParse, errID: `1`},
		{name: "duplicate jsonrpc", in: `{"jsonrpc":"2.0","jsonrpc":"2.0","method":"m"}`, class: ErrParse},
		{name: "duplicate method", in: `{"jsonrpc":"2.0","method":"a","method":"b"}`, class: ErrParse},
		{name: "duplicate params", in: `{"jsonrpc":"2.0","method":"m","params":{},"params":{"sessionId":"s"}}`, class: ErrParse},
		{name: "duplicate unknown top-level member", in: `{"jsonrpc":"2.0","id":1,"method":"m","x":1,"x":2}`, class: ErrParse, errID: `1`},
		{name: "duplicate escaped top-level member", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{},"\u0070arams":{}}`, class: ErrParse, errID: `1`},
		{name: "duplicate sessionId in params", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"sessionId":"a","sessionId":"b"}}`, class: ErrParse, errID: `1`},
		{name: "duplicate sessionId, escaped spelling", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"sessionId":"a","session\u0049d":"b"}}`, class: ErrParse, errID: `1`},
		{name: "duplicate deep in params", in: `{"jsonrpc":"2.0","id":"d","method":"m","params":{"a":{"b":[1,{"c":1,"d":{"e":1,"e":2}}]}}}`, class: ErrParse, errID: `"d"`},
		{name: "duplicate in skipped member", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"k":1,"k":1},"sessionId":"s"}}`, class: ErrParse, errID: `1`},
		{name: "duplicate in deferred params", in: `{"params":{"sessionId":"a","x":{"y":1,"y":1}},"method":"m","jsonrpc":"2.0"}`, class: ErrParse},
		{name: "duplicate in session list element", in: `{"jsonrpc":"2.0","id":1,"result":{"sessions":[{"sessionId":"a","sessionId":"b"}]}}`, class: ErrParse, errID: `1`},
		{name: "duplicate in deferred result", in: `{"result":{"sessions":[{"t":1,"t":2}]},"id":1,"jsonrpc":"2.0"}`, class: ErrParse},
		{name: "duplicate in error", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1,"code":2,"message":""}}`, class: ErrParse, errID: `1`},
		{name: "duplicate inside batch", in: `[{"a":1,"a":2}]`, class: ErrParse},

		// Parse errors: invalid UTF-8 (raw bytes) and lone surrogates.
		{name: "invalid UTF-8 in params value", in: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"text\":\"a\xffb\"}}", class: ErrParse, errID: `1`},
		{name: "invalid UTF-8 in located sessionId", in: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"sessionId\":\"\xfe\"}}", class: ErrParse, errID: `1`},
		{name: "invalid UTF-8 in key", in: "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"\xff\":1}}", class: ErrParse},
		{name: "invalid UTF-8 in method", in: "{\"jsonrpc\":\"2.0\",\"method\":\"m\xc3\"}", class: ErrParse},
		{name: "invalid UTF-8 in id", in: "{\"jsonrpc\":\"2.0\",\"id\":\"\xff\",\"method\":\"m\"}", class: ErrParse},
		{name: "invalid UTF-8 in unknown member", in: "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"x\":[\"\xed\xa0\x80\"]}", class: ErrParse},
		{name: "invalid UTF-8 in deferred params", in: "{\"params\":{\"a\":\"\xff\"},\"jsonrpc\":\"2.0\",\"method\":\"m\"}", class: ErrParse},
		{name: "overlong UTF-8 encoding", in: "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"a\":\"\xc0\xaf\"}}", class: ErrParse},
		{name: "lone high surrogate", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"text":"\ud800"}}`, class: ErrParse, errID: `1`},
		{name: "lone low surrogate", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"text":"\udc00x"}}`, class: ErrParse, errID: `1`},
		{name: "high surrogate then non-surrogate", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"text":"\ud83d\u0041"}}`, class: ErrParse, errID: `1`},
		{name: "lone surrogate in key", in: `{"jsonrpc":"2.0","method":"m","params":{"\udfff":1}}`, class: ErrParse},
		{name: "lone surrogate in method", in: `{"jsonrpc":"2.0","method":"m\ud800"}`, class: ErrParse},

		// Other parse errors.
		{name: "empty", in: ``, class: ErrParse},
		{name: "only whitespace", in: " \r\n\t", class: ErrParse},
		{name: "truncated", in: `{"jsonrpc":"2.0","method":"m"`, class: ErrParse},
		{name: "truncated after id", in: `{"jsonrpc":"2.0","id":5,"method":`, class: ErrParse, errID: `5`},
		{name: "not JSON", in: `hello`, class: ErrParse},
		{name: "trailing object", in: `{"jsonrpc":"2.0","id":1,"method":"m"}{}`, class: ErrParse, errID: `1`},
		{name: "two empty objects", in: `{}{}`, class: ErrParse},
		{name: "trailing newline then object", in: "{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"m\"}", class: ErrParse},
		{name: "trailing garbage", in: `{"jsonrpc":"2.0","method":"m"} x`, class: ErrParse},
		{name: "trailing comma", in: `{"jsonrpc":"2.0","method":"m",}`, class: ErrParse},
		{name: "single quotes", in: `{'jsonrpc':'2.0'}`, class: ErrParse},

		// Batches.
		{name: "batch", in: `[{"jsonrpc":"2.0","id":1,"method":"m"},{"jsonrpc":"2.0","method":"n"}]`, class: ErrBatch},
		{name: "empty batch", in: ` []`, class: ErrBatch},
		{name: "invalid batch", in: `[1,`, class: ErrParse},

		// Invalid requests.
		{name: "jsonrpc 1.0", in: `{"jsonrpc":"1.0","id":1,"method":"m"}`, class: ErrInvalid, errID: `1`},
		{name: "jsonrpc missing", in: `{"id":"x","method":"m","params":{}}`, class: ErrInvalid, errID: `"x"`},
		{name: "jsonrpc number", in: `{"jsonrpc":2.0,"method":"m"}`, class: ErrInvalid},
		{name: "jsonrpc with spaces", in: `{"jsonrpc":" 2.0","method":"m"}`, class: ErrInvalid},
		{name: "result and error", in: `{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}`, class: ErrInvalid, errID: `1`},
		{name: "error and result", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"},"result":{}}`, class: ErrInvalid, errID: `1`},
		{name: "params and result", in: `{"jsonrpc":"2.0","id":1,"params":{},"result":{}}`, class: ErrInvalid, errID: `1`},
		{name: "method and result", in: `{"jsonrpc":"2.0","id":1,"method":"m","result":{}}`, class: ErrInvalid, errID: `1`},
		{name: "response without id", in: `{"jsonrpc":"2.0","result":{}}`, class: ErrInvalid},
		{name: "id only", in: `{"jsonrpc":"2.0","id":1}`, class: ErrInvalid, errID: `1`},
		{name: "empty object", in: `{}`, class: ErrInvalid},
		{name: "method not a string", in: `{"jsonrpc":"2.0","id":1,"method":1}`, class: ErrInvalid, errID: `1`},
		{name: "params string", in: `{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}`, class: ErrInvalid, errID: `1`},
		{name: "params null", in: `{"jsonrpc":"2.0","method":"m","params":null}`, class: ErrInvalid},
		{name: "top-level string", in: `"x"`, class: ErrInvalid},
		{name: "top-level number", in: `12`, class: ErrInvalid},
		{name: "top-level null", in: `null`, class: ErrInvalid},
	}
	var s Scanner
	var m Message
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := []byte(tt.in)
			orig := append([]byte(nil), raw...)
			err := s.Scan(raw, &m, testResolve)
			if !bytes.Equal(raw, orig) {
				t.Fatalf("Scan modified its input")
			}
			if tt.class != 0 {
				if err == nil {
					t.Fatalf("Scan(%q) succeeded (kind %v), want error class %d", tt.in, m.Kind, tt.class)
				}
				var se *ScanError
				if !errors.As(err, &se) {
					t.Fatalf("error %T %v is not a *ScanError", err, err)
				}
				if se.Class != tt.class {
					t.Fatalf("class = %d (%v), want %d", se.Class, err, tt.class)
				}
				if got := string(se.ID); got != tt.errID {
					t.Errorf("ScanError.ID = %q, want %q", got, tt.errID)
				}
				if se.Error() == "" || se.Unwrap() == nil {
					t.Errorf("ScanError has no message or cause")
				}
				return
			}
			if err != nil {
				t.Fatalf("Scan(%q): %v", tt.in, err)
			}
			checkMessage(t, &m)
			if m.Kind != tt.kind {
				t.Errorf("Kind = %v, want %v", m.Kind, tt.kind)
			}
			if (m.ID == nil) != (tt.id == "") || string(m.ID) != tt.id {
				t.Errorf("ID = %q (nil %v), want %q", m.ID, m.ID == nil, tt.id)
			}
			if m.Method != tt.method {
				t.Errorf("Method = %q, want %q", m.Method, tt.method)
			}
			if (m.Payload == nil) != (tt.payload == "") || string(m.Payload) != tt.payload {
				t.Errorf("Payload = %q, want %q", m.Payload, tt.payload)
			}
			if m.IsError != tt.isError {
				t.Errorf("IsError = %v, want %v", m.IsError, tt.isError)
			}
			var got []wantField
			for _, f := range m.Fields {
				got = append(got, wantField{f.Kind, string(m.Bytes(f)), f.Parent})
			}
			if !reflect.DeepEqual(got, tt.fields) {
				t.Errorf("Fields:\n got %+v\nwant %+v", got, tt.fields)
			}
		})
	}
}

// checkMessage checks the structural invariants of a scanned message: every
// range lies in Raw, is the JSON text it claims to be, and nests properly.
func checkMessage(t testing.TB, m *Message) {
	t.Helper()
	raw := m.Raw
	inRange := func(what string, a, b int) bool {
		if a < 0 || b > len(raw) || a > b {
			t.Errorf("%s range [%d,%d) outside Raw (len %d)", what, a, b, len(raw))
			return false
		}
		return true
	}
	if m.ID != nil {
		if inRange("ID", m.IDPos[0], m.IDPos[1]) && !bytes.Equal(raw[m.IDPos[0]:m.IDPos[1]], m.ID) {
			t.Errorf("Raw[IDPos] = %q, ID = %q", raw[m.IDPos[0]:m.IDPos[1]], m.ID)
		}
		if !json.Valid(m.ID) {
			t.Errorf("ID %q is not a JSON value", m.ID)
		}
	}
	if m.Payload != nil {
		if inRange("Payload", m.PayloadPos[0], m.PayloadPos[1]) && !bytes.Equal(raw[m.PayloadPos[0]:m.PayloadPos[1]], m.Payload) {
			t.Errorf("Raw[PayloadPos] = %q, Payload = %q", raw[m.PayloadPos[0]:m.PayloadPos[1]], m.Payload)
		}
		if !json.Valid(m.Payload) {
			t.Errorf("Payload %q is not a JSON value", m.Payload)
		}
	}
	for i, f := range m.Fields {
		if !inRange("field", f.Start, f.End) {
			continue
		}
		if m.Payload == nil || f.Start < m.PayloadPos[0] || f.End > m.PayloadPos[1] {
			t.Errorf("field %d [%d,%d) is outside the payload %v", i, f.Start, f.End, m.PayloadPos)
		}
		if !json.Valid(m.Bytes(f)) {
			t.Errorf("field %d %q is not a JSON value", i, m.Bytes(f))
		}
		if f.Parent >= i || f.Parent < -1 {
			t.Errorf("field %d has parent %d", i, f.Parent)
			continue
		}
		if f.Parent >= 0 {
			p := m.Fields[f.Parent]
			if f.Start <= p.Start || f.End >= p.End {
				t.Errorf("field %d [%d,%d) not strictly inside its parent %d [%d,%d)", i, f.Start, f.End, f.Parent, p.Start, p.End)
			}
		}
		if i > 0 && f.Start < m.Fields[i-1].Start {
			t.Errorf("fields out of document order: %d starts at %d before %d at %d", i, f.Start, i-1, m.Fields[i-1].Start)
		}
	}
}

// TestScanResolverSeesEnvelope checks what the Resolver is shown, inline
// and deferred, and that it is called once per payload.
func TestScanResolverSeesEnvelope(t *testing.T) {
	tests := []struct {
		in     string
		method string
		kind   Kind
		id     string
		isErr  bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"a","params":{}}`, "a", KindRequest, "1", false},
		{`{"params":{},"jsonrpc":"2.0","id":1,"method":"a"}`, "a", KindRequest, "1", false},
		{`{"jsonrpc":"2.0","method":"n","params":{}}`, "n", KindNotification, "", false},
		{`{"jsonrpc":"2.0","id":"r","result":{}}`, "", KindResponse, `"r"`, false},
		{`{"error":{"code":1,"message":""},"id":"r","jsonrpc":"2.0"}`, "", KindResponse, `"r"`, true},
	}
	var s Scanner
	var m Message
	for _, tt := range tests {
		calls := 0
		err := s.Scan([]byte(tt.in), &m, func(m *Message) *Spec {
			calls++
			if m.Method != tt.method || m.Kind != tt.kind || string(m.ID) != tt.id || m.IsError != tt.isErr {
				t.Errorf("%s: resolver saw method %q kind %v id %q isError %v", tt.in, m.Method, m.Kind, m.ID, m.IsError)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		if calls != 1 {
			t.Errorf("%s: resolver called %d times", tt.in, calls)
		}
		if len(m.Fields) != 0 {
			t.Errorf("%s: fields located with a nil spec", tt.in)
		}
	}
	// A nil Resolver locates nothing.
	if err := s.Scan([]byte(`{"params":{"sessionId":"s"},"jsonrpc":"2.0","method":"a"}`), &m, nil); err != nil || len(m.Fields) != 0 {
		t.Errorf("nil resolver: err %v, fields %v", err, m.Fields)
	}
	// A resolver is not consulted for a message that turns out invalid.
	err := s.Scan([]byte(`{"params":{},"jsonrpc":"1.0","method":"a"}`), &m, func(*Message) *Spec {
		t.Errorf("resolver called for an invalid message")
		return nil
	})
	if classOf(err) != ErrInvalid {
		t.Errorf("jsonrpc 1.0: %v", err)
	}
}

// TestScanEscapedEnvelopeNames: JSON allows any member name to be written
// with escapes, and every JSON decoder (including the agent's) reads
// "\u0070arams" as "params". The scanner must either understand such a
// name or reject the message; it must never forward a message whose
// envelope it read differently from the peer. Otherwise a client can hide
// params.sessionId (or the id) from the gateway: the gateway sees no
// sessionId, rewrites nothing and forwards the raw session ID to the agent.
func TestScanEscapedEnvelopeNames(t *testing.T) {
	tests := []string{
		`{"jsonrpc":"2.0","id":1,"method":"session/prompt","\u0070arams":{"sessionId":"someone-elses-agent-session"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session/prompt","p\u0061rams":{"sessionId":"x"}}`,
		`{"jsonrpc":"2.0","\u0069d":7,"method":"session/prompt","params":{"sessionId":"x"}}`,
		`{"jsonrpc":"2.0","method":"session/cancel","\u0070arams":{"sessionId":"x"}}`,
		`{"jsonrpc":"2.0","\u006dethod":"session/prompt","id":1,"params":{"sessionId":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"re\u0073ult":{"sessionId":"x"}}`,
		`{"\u006asonrpc":"2.0","method":"m"}`,
	}
	var s Scanner
	var m Message
	for _, in := range tests {
		err := s.Scan([]byte(in), &m, testResolve)
		if err != nil {
			continue // rejecting is fine
		}
		if msg := disagreesWithEncodingJSON([]byte(in), &m); msg != "" {
			t.Errorf("%s\n  scanned as kind %v, id %q, method %q, fields %v, but %s", in, m.Kind, m.ID, m.Method, m.Fields, msg)
		}
	}
}

// TestScanInvalidIDNotEchoed: ScanError.ID is what the gateway puts in the
// error response. JSON-RPC 2.0 §5: when the id cannot be determined it MUST
// be null; an object or array id is not an id and must not be echoed.
func TestScanInvalidIDNotEchoed(t *testing.T) {
	for _, in := range []string{
		`{"jsonrpc":"2.0","id":{"x":[1,2,3]},"method":"m"}`,
		`{"jsonrpc":"2.0","id":[1],"method":"m"}`,
		`{"jsonrpc":"2.0","id":true,"method":"m"}`,
	} {
		var s Scanner
		var m Message
		err := s.Scan([]byte(in), &m, nil)
		var se *ScanError
		if !errors.As(err, &se) || se.Class != ErrInvalid {
			t.Fatalf("%s: err %v, want ErrInvalid", in, err)
		}
		if se.ID != nil {
			t.Errorf("%s: ScanError.ID = %s; an id that is not a string, number or null must not be echoed (want nil → null)", in, se.ID)
		}
	}
}

func TestScanReuse(t *testing.T) {
	msgs := []string{
		`{"jsonrpc":"2.0","id":11,"result":{"sessions":[{"sessionId":"a"},{"sessionId":"b"},{"sessionId":"c"}]}}`,
		`{"params":{"sessionId":"s1"},"jsonrpc":"2.0","method":"session/update"}`,
		`{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1,"a":2}}`,
		`{"jsonrpc":"2.0","method":"initialized"}`,
		`[{}]`,
		`{"jsonrpc":"2.0","id":"q","method":"session/prompt","params":{"sessionId":"s2","requestId":3}}`,
		`{"result":{"sessionId":"r"},"id":5,"jsonrpc":"2.0"}`,
	}
	var reused Scanner
	var rm Message
	for round := 0; round < 3; round++ {
		for _, in := range msgs {
			var fresh Scanner
			var fm Message
			ferr := fresh.Scan([]byte(in), &fm, testResolve)
			rerr := reused.Scan([]byte(in), &rm, testResolve)
			if classOf(ferr) != classOf(rerr) {
				t.Fatalf("%s: fresh %v, reused %v", in, ferr, rerr)
			}
			if ferr != nil {
				continue
			}
			a, b := fm, rm
			if len(a.Fields) == 0 && len(b.Fields) == 0 {
				a.Fields, b.Fields = nil, nil
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s: reused scanner/message differ:\nfresh  %+v\nreused %+v", in, fm, rm)
			}
		}
	}
}

func TestScanMethodsInterned(t *testing.T) {
	name := "session/update"
	s := Scanner{Methods: map[string]string{name: name}}
	var m Message
	raw := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}`)
	if err := s.Scan(raw, &m, testResolve); err != nil {
		t.Fatal(err)
	}
	if m.Method != name || strings.Compare(m.Method, name) != 0 {
		t.Fatalf("Method = %q", m.Method)
	}
	if unsafeStringData(m.Method) != unsafeStringData(name) {
		t.Errorf("known method not interned")
	}
	// Unknown methods still work.
	if err := s.Scan([]byte(`{"jsonrpc":"2.0","method":"x/y"}`), &m, nil); err != nil || m.Method != "x/y" {
		t.Fatalf("unknown method: %v %q", err, m.Method)
	}
}

// TestScanPreservesBytes: scanning never changes the message and splicing
// with no edits reproduces it exactly, whitespace and key order included.
func TestScanPreservesBytes(t *testing.T) {
	in := "{ \"method\" : \"session/update\" ,\n\t\"params\":{\r\n \"sessionId\" :\t\"s\\u0031\" , \"update\":{\"text\":\"line\\nbreak \\\"q\\\" \\u00e9 é\"}},\"jsonrpc\":\"2.0\"   }"
	var s Scanner
	var m Message
	if err := s.Scan([]byte(in), &m, testResolve); err != nil {
		t.Fatal(err)
	}
	if got := Splice(nil, m.Raw, nil); string(got) != in {
		t.Fatalf("Splice with no edits changed the message:\n%q\n%q", got, in)
	}
	f, ok := m.FieldOf(FieldSessionID, -1)
	if !ok {
		t.Fatal("sessionId not located")
	}
	if v, _ := m.String(f); v != "s1" {
		t.Fatalf("sessionId = %q", v)
	}
	out := string(Splice(nil, m.Raw, []Edit{{Start: f.Start, End: f.End, Repl: []byte(`"NEW"`)}}))
	want := strings.Replace(in, `"s\u0031"`, `"NEW"`, 1)
	if out != want {
		t.Fatalf("got  %q\nwant %q", out, want)
	}
}

func TestMessageString(t *testing.T) {
	in := `{"jsonrpc":"2.0","method":"m","params":{"a":"plain","b":"q\"uote\\ \u00e9\ud83d\ude00 \/","c":12,"d":{"x":1},"e":"","f":null,"g":"é"}}`
	spec := &Spec{Fields: map[string]*Spec{}}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		spec.Fields[k] = &Spec{Kind: FieldPath}
	}
	var s Scanner
	var m Message
	if err := s.Scan([]byte(in), &m, func(*Message) *Spec { return spec }); err != nil {
		t.Fatal(err)
	}
	type res struct {
		s  string
		ok bool
	}
	want := []res{{"plain", true}, {"q\"uote\\ é😀 /", true}, {"", false}, {"", false}, {"", true}, {"", false}, {"é", true}}
	if len(m.Fields) != len(want) {
		t.Fatalf("located %d fields", len(m.Fields))
	}
	for i, f := range m.Fields {
		s, ok := m.String(f)
		if s != want[i].s || ok != want[i].ok {
			t.Errorf("field %d %s: String = %q, %v; want %q, %v", i, m.Bytes(f), s, ok, want[i].s, want[i].ok)
		}
	}
}

func TestFieldOf(t *testing.T) {
	in := `{"jsonrpc":"2.0","id":1,"result":{"sessions":[{"sessionId":"a"},{"x":1},{"sessionId":"c"}],"sessionId":"top"}}`
	var s Scanner
	var m Message
	if err := s.Scan([]byte(in), &m, testResolve); err != nil {
		t.Fatal(err)
	}
	f, ok := m.FieldOf(FieldSessionID, -1)
	if v, _ := m.String(f); !ok || v != "top" {
		t.Errorf("FieldOf(session, -1) = %q, %v", v, ok)
	}
	f, ok = m.FieldOf(FieldSessionID, 0)
	if v, _ := m.String(f); !ok || v != "a" {
		t.Errorf("FieldOf(session, 0) = %q, %v", v, ok)
	}
	if _, ok := m.FieldOf(FieldSessionID, 2); ok {
		t.Errorf("FieldOf(session, 2) found a field in an element without one")
	}
	f, ok = m.FieldOf(FieldSessionID, 3)
	if v, _ := m.String(f); !ok || v != "c" {
		t.Errorf("FieldOf(session, 3) = %q, %v", v, ok)
	}
	if f, ok := m.FieldOf(FieldElement, -1); !ok || string(m.Bytes(f)) != `{"sessionId":"a"}` {
		t.Errorf("FieldOf(element, -1) = %s, %v", m.Bytes(f), ok)
	}
	if _, ok := m.FieldOf(FieldRequestID, -1); ok {
		t.Errorf("FieldOf(requestId) found a field that is not there")
	}
	if f, ok := m.FieldOf(FieldURI, -1); ok || f != (Field{}) {
		t.Errorf("FieldOf on a missing kind returned %+v, %v", f, ok)
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{
		KindInvalid: "invalid", KindRequest: "request", KindNotification: "notification",
		KindResponse: "response", Kind(200): "invalid",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

func TestScanErrorUnwrap(t *testing.T) {
	var s Scanner
	var m Message
	err := s.Scan([]byte(`{"jsonrpc":"2.0","method":"m"} {}`), &m, nil)
	if !errors.Is(err, errTrailing) {
		t.Errorf("trailing data: errors.Is(err, errTrailing) = false for %v", err)
	}
	var se *ScanError
	if !errors.As(err, &se) || !strings.Contains(se.String(), "trailing") {
		t.Errorf("ScanError.String() = %q", se.String())
	}
}

func unsafeStringData(s string) *byte { return unsafe.StringData(s) }

// A client scanner (SnakeTwins) refuses a member that is the snake_case
// spelling of a located field, which ACP's Python SDK models also accept;
// other underscored names pass, and without SnakeTwins (agents' messages)
// nothing changes.
func TestSnakeTwins(t *testing.T) {
	for _, c := range []struct {
		name, field string
		twin        bool
	}{
		{"session_id", "sessionId", true}, {"MCP_SERVERS", "mcpServers", true}, {"field_meta", "_meta", true},
		{"additional_directories", "additionalDirectories", true}, {"cwd", "cwd", false}, {"sessionid", "sessionId", false},
		{"session_idx", "sessionId", false}, {"session_i", "sessionId", false}, {"fiel", "_meta", false}, {"field_met", "_meta", false},
	} {
		if got := snakeTwin([]byte(c.name), c.field); got != c.twin {
			t.Errorf("snakeTwin(%q, %q) = %v, want %v", c.name, c.field, got, c.twin)
		}
	}
	spec := &Spec{Fields: map[string]*Spec{"sessionId": {Kind: 1, Label: "sessionId"}, "_meta": {Kind: 2, Label: "_meta"}}}
	resolve := func(*Message) *Spec { return spec }
	for _, c := range []struct {
		params string
		bad    bool
	}{
		{`{"sessionId":"a","session_id":"b"}`, true},
		{`{"sessionId":"a","SESSION_ID":"b"}`, true},
		{`{"field_meta":{"x":1}}`, true},
		{`{"my_option":1,"sessionId":"a"}`, false},
		{`{"session_idx":1}`, false},
	} {
		raw := []byte(`{"jsonrpc":"2.0","id":1,"method":"x","params":` + c.params + `}`)
		var m Message
		err := (&Scanner{SnakeTwins: true}).Scan(raw, &m, resolve)
		if (err != nil) != c.bad || c.bad && !strings.Contains(err.Error(), "snake_case") {
			t.Errorf("%s: %v, want refused %v", c.params, err, c.bad)
		}
		if err := (&Scanner{}).Scan(raw, &m, resolve); err != nil {
			t.Errorf("%s without SnakeTwins: %v", c.params, err)
		}
	}
}
