package permrules

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pathmap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// req is a session/request_permission as clients would be sent it.
func req(kind, title any, paths ...string) []byte {
	tc := map[string]any{"toolCallId": "t1"}
	if kind != nil {
		tc["kind"] = kind
	}
	if title != nil {
		tc["title"] = title
	}
	if paths != nil {
		var locs []map[string]string
		for _, p := range paths {
			locs = append(locs, map[string]string{"path": p})
		}
		tc["locations"] = locs
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "session/request_permission", "params": map[string]any{
		"sessionId": "s", "toolCall": tc,
		"options": []map[string]string{{"optionId": "yes", "kind": "allow_once"}, {"optionId": "no", "kind": "reject_once"}},
	}})
	return b
}

// workspace is a tenant root on disk, shown to clients as /workspace.
func workspace(t testing.TB) *pathmap.Mapper {
	t.Helper()
	m, err := pathmap.New(t.TempDir(), "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustCompile(t *testing.T, rules ...Rule) *List {
	t.Helper()
	l, err := Compile(rules, workspace(t), "permissions")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestMatching(t *testing.T) {
	for _, tt := range []struct {
		name string
		rule Rule
		msg  []byte
		want bool
	}{
		{"kind", Rule{Kind: "read", Decide: Allow}, req("read", "Read x"), true},
		{"other kind", Rule{Kind: "read", Decide: Allow}, req("edit", "Read x"), false},
		{"no kind in the request", Rule{Kind: "other", Decide: Allow}, req(nil, "x"), false},
		{"null kind, allow", Rule{Kind: "other", Decide: Allow}, req(json.RawMessage("null"), "x"), false},
		{"null kind, deny: asks", Rule{Kind: "other", Decide: Deny}, req(json.RawMessage("null"), "x"), true},
		{"catch-all", Rule{Decide: Deny}, req(nil, nil), true},
		{"title glob", Rule{Title: "rm *", Decide: Deny}, req("execute", "rm -rf /tmp/x"), true},
		{"title whole", Rule{Title: "rm", Decide: Deny}, req("execute", "rm -rf"), false},
		{"title ?", Rule{Title: "l?", Decide: Allow}, req("execute", "lé"), true},
		{"title class", Rule{Title: "[Rr]ead *", Decide: Allow}, req("read", "read a"), true},
		{"title escape", Rule{Title: `a\*`, Decide: Allow}, req("read", "ab"), false},
		{"title escaped star", Rule{Title: `a\*`, Decide: Allow}, req("read", "a*"), true},
		{"no title in the request", Rule{Title: "*", Decide: Deny}, req("read", nil), false},
		{"control char: never an allow", Rule{Title: "ls *", Decide: Allow}, req("execute", "ls x\nrm -rf /"), false},
		{"control char: a deny matches", Rule{Title: "*rm -rf*", Decide: Deny}, req("execute", "ls x\nrm -rf /"), true},
		{"escape char: never an allow", Rule{Title: "*", Decide: Allow}, req("execute", "\x1b[2Jok"), false},
		{"path", Rule{Kind: "edit", Path: "docs/**", Decide: Allow}, req("edit", "Edit", "/workspace/docs/a/b.md"), true},
		{"path ** none", Rule{Path: "docs/**", Decide: Allow}, req("edit", "Edit", "/workspace/docs"), true},
		{"path segment *", Rule{Path: "*.md", Decide: Allow}, req("edit", "Edit", "/workspace/a/b.md"), false},
		{"path ** middle", Rule{Path: "**/*.md", Decide: Allow}, req("edit", "Edit", "/workspace/a/b.md", "/workspace/c.md"), true},
		{"path every location for allow", Rule{Path: "docs/**", Decide: Allow}, req("edit", "Edit", "/workspace/docs/a", "/workspace/src/b"), false},
		{"path one location for deny", Rule{Path: "docs/**", Decide: Deny}, req("edit", "Edit", "/workspace/src/b", "/workspace/docs/a"), true},
		{"path no location", Rule{Path: "**", Decide: Allow}, req("edit", "Edit"), false},
		{"path no location, deny", Rule{Path: "**", Decide: Deny}, req("edit", "Edit"), false},
		{"** inside the root", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/workspace/a/b/c"), true},
		{"** the root itself", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/workspace"), true},
		{"** outside the root", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/etc/passwd"), false},
		{"** a sibling prefix", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/workspace2/x"), false},
		{"** climbing out", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/workspace/../etc/passwd"), false},
		{"** redacted", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/<outside-workspace>/passwd"), false},
		{"** relative location", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "workspace/x"), false},
		{"** one outside", Rule{Path: "**", Decide: Allow}, req("edit", "Edit", "/workspace/x", "/etc/x"), false},
		{"** outside, deny", Rule{Path: "**", Decide: Deny}, req("edit", "Edit", "/etc/x"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := mustCompile(t, tt.rule).Decide(tt.msg, "").Decide != ""
			if got != tt.want {
				t.Errorf("%v on %s: matched %v, want %v", tt.rule, tt.msg, got, tt.want)
			}
		})
	}
}

// The first match wins; ask stops the search; an allow or deny answers
// with the request's once option, else its always one, else cancelled.
func TestDecide(t *testing.T) {
	l := mustCompile(t,
		Rule{Kind: "execute", Title: "rm *", Decide: Deny},
		Rule{Kind: "execute", Decide: Ask},
		Rule{Decide: Allow},
	)
	v := l.Decide(req("execute", "rm -rf x"), "")
	if v.Decide != Deny || string(v.Outcome) != `{"optionId":"no","outcome":"selected"}` ||
		v.Rule != `permissions[0] {kind: "execute", title: "rm *", decide: deny}` {
		t.Errorf("rm: %+v %s", v, v.Outcome)
	}
	if v := l.Decide(req("execute", "ls"), ""); v.Decide != Ask || v.Outcome != nil || !strings.HasPrefix(v.Rule, "permissions[1] ") {
		t.Errorf("ls: %+v", v)
	}
	if v := l.Decide(req("read", "cat"), ""); v.Decide != Allow || string(v.Outcome) != `{"optionId":"yes","outcome":"selected"}` {
		t.Errorf("read: %+v %s", v, v.Outcome)
	}
	always := []byte(`{"params":{"toolCall":{"kind":"read"},"options":[{"optionId":"a","kind":"allow_always"},{"optionId":"r","kind":"reject_always"}]}}`)
	if v := l.Decide(always, ""); string(v.Outcome) != `{"optionId":"a","outcome":"selected"}` {
		t.Errorf("allow_always: %s", v.Outcome)
	}
	none := []byte(`{"params":{"toolCall":{"kind":"read"},"options":[{"optionId":"r","kind":"reject_once"}]}}`)
	if v := l.Decide(none, ""); string(v.Outcome) != `{"outcome":"cancelled"}` {
		t.Errorf("no allow option: %s", v.Outcome)
	}
	if v := l.Decide([]byte(`not json`), ""); v.Decide != "" {
		t.Errorf("unreadable request decided: %+v", v)
	}
	if v := (*List)(nil).Decide(req("read", "x"), ""); v.Decide != "" {
		t.Errorf("no list decided: %+v", v)
	}
}

// Without a root (no tenants), paths are relative to the session's cwd.
func TestCwdRoot(t *testing.T) {
	l, err := Compile([]Rule{{Path: "src/**", Decide: Allow}}, nil, "permissions")
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	p, q := filepath.Join(base, "p"), filepath.Join(base, "q")
	for _, d := range []string{p, q} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(q, filepath.Join(p, "src")); err != nil {
		t.Fatal(err)
	}
	if v := l.Decide(req("edit", "e", p+"/lib/src/a.go"), p); v.Decide != "" {
		t.Errorf("not under src: %+v", v)
	}
	if err := os.Remove(filepath.Join(p, "src")); err != nil {
		t.Fatal(err)
	}
	if v := l.Decide(req("edit", "e", p+"/src/a.go"), p); v.Decide != Allow {
		t.Errorf("inside the cwd: %+v", v)
	}
	if v := l.Decide(req("edit", "e", q+"/src/a.go"), p); v.Decide != "" {
		t.Errorf("outside the cwd: %+v", v)
	}
	if err := os.Symlink(q, filepath.Join(p, "src")); err != nil {
		t.Fatal(err)
	}
	if v := l.Decide(req("edit", "e", p+"/src/a.go"), p); v.Decide != "" {
		t.Errorf("through a link out of the cwd: %+v", v)
	}
	if v := l.Decide(req("edit", "e", "/nonexistent-permrules/src/a.go"), "/nonexistent-permrules"); v.Decide != "" {
		t.Errorf("a cwd that cannot be resolved: %+v", v)
	}
}

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		rule Rule
		key  string // "": valid
		msg  string
	}{
		{Rule{Kind: "read", Title: "Read *", Path: "docs/**", Decide: Allow}, "", ""},
		{Rule{Path: "**", Decide: Allow}, "", ""},
		{Rule{Decide: Deny}, "", ""},
		{Rule{Kind: "Read", Decide: Allow}, "kind", "not an ACP tool kind"},
		{Rule{Kind: "read"}, "decide", "required"},
		{Rule{Decide: "yes"}, "decide", `"yes" is not allow, deny or ask`},
		{Rule{Path: "/etc/**", Decide: Deny}, "path", "not absolute"},
		{Rule{Path: "../**", Decide: Deny}, "path", `".."`},
		{Rule{Path: "a/../../b", Decide: Deny}, "path", `".."`},
		{Rule{Path: "a//b", Decide: Deny}, "path", "empty"},
		{Rule{Path: "./a", Decide: Deny}, "path", "empty"},
		{Rule{Path: "a/[b", Decide: Deny}, "path", "syntax error"},
		{Rule{Title: "x[", Decide: Deny}, "title", "without its ]"},
		{Rule{Title: `x\`, Decide: Deny}, "title", `lone \`},
		{Rule{Title: "[]", Decide: Deny}, "title", "syntax error"},
		{Rule{Title: "rm\n*", Decide: Deny}, "title", "control character"},
	} {
		ps := tt.rule.Check()
		switch {
		case tt.key == "" && len(ps) > 0:
			t.Errorf("%v: %v", tt.rule, ps)
		case tt.key != "" && (len(ps) != 1 || ps[0].Key != tt.key || !strings.Contains(ps[0].Msg, tt.msg)):
			t.Errorf("%v: %v, want one problem with %s: …%s…", tt.rule, ps, tt.key, tt.msg)
		}
	}
	if _, err := Compile([]Rule{{Decide: Allow}, {Path: "../x", Decide: Allow}}, nil, "tenants[a].permissions"); err == nil ||
		!strings.Contains(err.Error(), `tenants[a].permissions[1].path: "../x"`) {
		t.Errorf("Compile: %v", err)
	}
}

// A rule's text escapes control characters for the audit trail and pages.
func TestRuleString(t *testing.T) {
	r := Rule{Kind: "execute", Title: "a\x1b[2J", Decide: Deny}
	if got := r.String(); got != `{kind: "execute", title: "a\x1b[2J", decide: deny}` || strings.ContainsFunc(got, isControl) {
		t.Errorf("String = %q", got)
	}
}

// The decider answers allow and deny with By "policy" and the rule, leaves
// ask and no match to the clients, counts what matched, and follows
// Update while other goroutines decide.
func TestDecider(t *testing.T) {
	tbl := func(rules ...Rule) *Table {
		l, err := Compile(rules, workspace(t), "permissions")
		if err != nil {
			t.Fatal(err)
		}
		return &Table{Tenants: map[string]*List{"acme": l}}
	}
	var mu sync.Mutex
	counts := map[string]int{}
	d := NewDecider(tbl(Rule{Kind: "read", Decide: Allow}, Rule{Kind: "edit", Decide: Ask}), func(tenant, decide string) {
		mu.Lock()
		counts[tenant+"/"+decide]++
		mu.Unlock()
	})
	ev := func(tenant string, msg []byte) *observe.Event {
		return &observe.Event{Kind: observe.PermissionRequested, Session: &observe.Session{Tenant: tenant, Label: tenant}, Msg: msg}
	}
	dec, ok := d.Permission(ev("acme", req("read", "r")))
	if !ok || dec.By != "policy" || dec.Decide != Allow || !strings.HasPrefix(dec.Rule, "permissions[0] ") {
		t.Errorf("read: %+v %v", dec, ok)
	}
	if _, ok := d.Permission(ev("acme", req("edit", "e"))); ok {
		t.Error("ask decided")
	}
	if _, ok := d.Permission(ev("other", req("read", "r"))); ok {
		t.Error("a tenant without rules decided")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 100 {
			d.Permission(ev("acme", req("read", "r")))
		}
	}()
	d.Update(tbl(Rule{Kind: "read", Decide: Deny}))
	wg.Wait()
	if dec, ok := d.Permission(ev("acme", req("read", "r"))); !ok || dec.Decide != Deny || string(dec.Outcome) != `{"optionId":"no","outcome":"selected"}` {
		t.Errorf("after Update: %+v", dec)
	}
	mu.Lock()
	defer mu.Unlock()
	if counts["acme/ask"] != 1 || counts["acme/allow"]+counts["acme/deny"] != 102 || len(counts) != 3 {
		t.Errorf("counts %v", counts)
	}
}

// The claude-code-acp example of docs/operations.md: its requests carry a title (Bash:
// the command in backticks) but no kind or locations.
func TestClaudeCodeTitles(t *testing.T) {
	l := mustCompile(t,
		Rule{Title: "`rm *", Decide: Deny},
		Rule{Title: "`git push*", Decide: Ask},
		Rule{Title: "`git *`", Decide: Allow},
		Rule{Title: "Edit `/workspace/docs/*`", Decide: Allow},
		Rule{Kind: "edit", Decide: Allow}, // never: no kind in its requests
	)
	for title, want := range map[string]string{
		"`rm -rf build`":                Deny,
		"`git push origin main`":        Ask,
		"`git status`":                  Allow,
		"`git status\nrm -rf ~`":        Deny,
		"`git status\n`":                "",
		"Edit `/workspace/docs/a/b.md`": Allow,
		"Edit `/workspace/src/main.go`": "",
	} {
		if got := l.Decide(req(nil, title), "").Decide; got != want {
			t.Errorf("%q: %q, want %q", title, got, want)
		}
	}
}

// The title matcher: every step kind, characters not bytes, and a glob an
// agent's title cannot make backtrack without bound.
func TestMatchTitleSteps(t *testing.T) {
	for _, tc := range []struct {
		glob, title string
		want        bool
	}{
		{"Read *", "Read /workspace/a.go", true},
		{"Read *", "Write /workspace/a.go", false},
		{"*", "", true},
		{"a*b*c", "a-b-c", true},
		{"a*b*c", "a-c-b", false},
		{"?é?", "aéb", true},
		{"?", "é", true},
		{"??", "é", false},
		{"[ab]x", "bx", true},
		{"[ab]x", "cx", false},
		{`\*x`, "*x", true},
		{`\*x`, "ax", false},
		{"*a*a*b", strings.Repeat("a", 1<<16), false},
		{"*a*a*b", strings.Repeat("a", 1<<16) + "b", true},
	} {
		toks, err := titleTokens(tc.glob)
		if err != nil {
			t.Fatal(err)
		}
		if got := matchTitle(toks, tc.title, false); got != tc.want {
			t.Errorf("matchTitle(%q, %.20q…) = %v; want %v", tc.glob, tc.title, got, tc.want)
		}
	}
	if _, err := titleTokens("[ab"); err == nil {
		t.Error("an unclosed class compiled")
	}
}

// BenchmarkMatchTitleCrafted: a title an agent crafts against "*a*a*b"
// (64 KiB of "a"): linear, where the recursive matcher took 83 s for 4 KB.
//
//	go test -run '^$' -bench MatchTitleCrafted ./permrules/
func BenchmarkMatchTitleCrafted(b *testing.B) {
	title := strings.Repeat("a", 1<<16)
	toks, _ := titleTokens("*a*a*b")
	for b.Loop() {
		if matchTitle(toks, title, false) {
			b.Fatal("matched")
		}
	}
}
