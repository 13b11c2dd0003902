package jsonrpc

import (
	"slices"
	"testing"
)

func TestMessages(t *testing.T) {
	one := `{"jsonrpc":"2.0","id":1,"method":"a"}`
	two := `{"jsonrpc":"2.0","id":2,"method":"b","params":{"s":"x\ny"}}`
	for _, c := range []struct {
		name, frame string
		want        []string
	}{
		{"one message", one, []string{one}},
		{"one message and its newline (use-acp)", one + "\n", []string{one}},
		{"two messages, newline-delimited", one + "\n" + two + "\n", []string{one, two}},
		{"CRLF and blank lines", one + "\r\n\r\n" + two, []string{one, two}},
		{"pretty-printed: one value", "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1\n}\n", []string{"{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1\n}"}},
		{"garbage after a message", one + "\nnot json\n", []string{one, "not json"}},
		{"garbage first", "nope\n" + one, []string{"nope", one}},
		{"only whitespace with a newline", " \n ", []string{" \n "}},
		{"no newline, not JSON", "nope", []string{"nope"}},
		{"duplicate names are left to the scanner", `{"id":1,"id":2}` + "\n" + one, []string{`{"id":1,"id":2}`, one}},
	} {
		var got []string
		Messages([]byte(c.frame), func(m []byte) { got = append(got, string(m)) })
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
