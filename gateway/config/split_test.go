package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplitCommand(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"node", []string{"node"}},
		{"node agent.mjs", []string{"node", "agent.mjs"}},
		{"  node \t agent.mjs\n--flag  ", []string{"node", "agent.mjs", "--flag"}},
		{"npx @zed-industries/claude-code-acp", []string{"npx", "@zed-industries/claude-code-acp"}},
		{`node 'my agent.mjs'`, []string{"node", "my agent.mjs"}},
		{`node "my agent.mjs"`, []string{"node", "my agent.mjs"}},
		{`a 'b "c" d'`, []string{"a", `b "c" d`}},
		{`a "b 'c' d"`, []string{"a", `b 'c' d`}},
		{`a "say \"hi\""`, []string{"a", `say "hi"`}},
		{`a "x\\y"`, []string{"a", `x\y`}},
		{`a "\$HOME" "\` + "`" + `"`, []string{"a", "$HOME", "`"}},
		{`a "x\ny"`, []string{"a", `x\ny`}},                 // other backslashes stay in double quotes
		{`a 'x\y' 'it'\''s'`, []string{"a", `x\y`, "it's"}}, // none are special in single quotes
		{`a\ b c`, []string{"a b", "c"}},
		{`a \"b\" \\`, []string{"a", `"b"`, `\`}},
		{`a"b"'c'd`, []string{"abcd"}},
		{`a "" ''`, []string{"a", "", ""}},
		{`""`, []string{""}},
		{`echo $HOME ~ *.go`, []string{"echo", "$HOME", "~", "*.go"}}, // nothing is expanded
		{`ünï "cödé ✓"`, []string{"ünï", "cödé ✓"}},
	}
	for _, tc := range cases {
		got, err := SplitCommand(tc.in)
		if err != nil {
			t.Errorf("SplitCommand(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("SplitCommand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSplitCommandErrors(t *testing.T) {
	cases := []struct{ in, msg string }{
		{`node "agent.mjs`, `unterminated " quote`},
		{`node 'agent.mjs`, `unterminated ' quote`},
		{`a "b \"`, `unterminated " quote`},
		{`a 'b\'`, ``}, // a backslash does not escape in single quotes: 'b\' is complete
		{"", "empty command"},
		{"   \t\n ", "empty command"},
	}
	for _, tc := range cases {
		got, err := SplitCommand(tc.in)
		if tc.msg == "" {
			if err != nil || !reflect.DeepEqual(got, []string{"a", `b\`}) {
				t.Errorf("SplitCommand(%q) = %q, %v", tc.in, got, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("SplitCommand(%q) = %q, want an error", tc.in, got)
			continue
		}
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("SplitCommand(%q) error %q, want it to mention %q", tc.in, err, tc.msg)
		}
		if got != nil {
			t.Errorf("SplitCommand(%q) returned %q with its error", tc.in, got)
		}
	}
}
