package jsonrpc

import "testing"

func TestMetaEdit(t *testing.T) {
	const v = `{"unit":"USD"}`
	for _, tc := range []struct{ in, want string }{
		{`{}`, `{"_meta":{"acpgate":{"budget":{"unit":"USD"}}}}`},
		{`{"stopReason":"cancelled"}`, `{"_meta":{"acpgate":{"budget":{"unit":"USD"}}},"stopReason":"cancelled"}`},
		{` { "stopReason" : "cancelled", "_meta" : { "x" : [1, {"acpgate": 2}] } } `,
			` { "stopReason" : "cancelled", "_meta" : {"acpgate":{"budget":{"unit":"USD"}}, "x" : [1, {"acpgate": 2}] } } `},
		{`{"_meta":{"acpgate":{}}}`, `{"_meta":{"acpgate":{"budget":{"unit":"USD"}}}}`},
		{`{"_meta":{"acpgate":{"turn":"x"}},"a":1}`, `{"_meta":{"acpgate":{"budget":{"unit":"USD"},"turn":"x"}},"a":1}`},
		// Left alone: the sender's key, or a shape that cannot hold it.
		{`{"_meta":{"acpgate":{"budget":1}}}`, ""},
		{`{"_meta":null}`, ""},
		{`{"_meta":{"acpgate":[]}}`, ""},
		{`[]`, ""},
		{`"x"`, ""},
	} {
		raw := []byte(`{"id":1,"result":` + tc.in + `}`)
		start := len(`{"id":1,"result":`)
		e, ok := MetaEdit(raw, start, len(raw)-1, "budget", []byte(v))
		got := ""
		if ok {
			got = string(Splice(nil, raw, []Edit{e}))
			got = got[start : len(got)-1]
		}
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}
