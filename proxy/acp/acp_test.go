package acp

import "testing"

func TestWithResumeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"protocolVersion":1}`, `{"_meta":{"acpgate":{"resumeToken":"T"}},"protocolVersion":1}`},
		{`{}`, `{"_meta":{"acpgate":{"resumeToken":"T"}}}`},
		{`{"a":1,"_meta":{"x":true}}`, `{"a":1,"_meta":{"acpgate":{"resumeToken":"T"},"x":true}}`},
		{`{"_meta": { }, "b": 2}`, `{"_meta": {"acpgate":{"resumeToken":"T"} }, "b": 2}`},
		{`{"_meta":null}`, `{"_meta":null}`},                                                                       // not an object: left alone
		{`{"_meta":{"acpgate":{"x":1}}}`, `{"_meta":{"acpgate":{"x":1}}}`},                                         // the agent's own key stays
		{`{"s":"_meta","n":{"_meta":1}}`, `{"_meta":{"acpgate":{"resumeToken":"T"}},"s":"_meta","n":{"_meta":1}}`}, // only the top level counts
	} {
		if got := string(WithAcpgateMeta([]byte(tc.in), "T", "", "")); got != tc.want {
			t.Errorf("WithAcpgateMeta(%s, T) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
