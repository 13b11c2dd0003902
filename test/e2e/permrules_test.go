package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// permRulesConfig is the configuration of TestPermissionRules: acme has
// its own rules, globex the top-level default list; acmeDocs is what
// acme's first docs rule decides.
func permRulesConfig(e *isoEnv, trail, acmeDocs string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool: {min_idle: 1}\nsession_key_file: %q\naudit: {file: %q}\n", e.keyFile, trail)
	b.WriteString("permissions:\n" +
		"  - {kind: edit, path: \"**\", decide: allow}\n" +
		"  - {kind: execute, decide: deny}\n")
	b.WriteString("tenants:\n")
	for _, name := range tenantNames {
		sum := sha256.Sum256([]byte(e.tokens[name]))
		fmt.Fprintf(&b, "  - name: %s\n    tokens_sha256: [%q]\n    root: %q\n    virtual_root: %s\n",
			name, hex.EncodeToString(sum[:]), e.roots[name], vroot)
		if name == "acme" {
			b.WriteString("    permissions:\n" +
				"      - {kind: edit, title: \"Write /workspace/ctl*\", decide: allow}\n" +
				"      - {kind: edit, path: \"docs/**\", decide: " + acmeDocs + "}\n" +
				"      - {kind: edit, path: \"secret/**\", decide: deny}\n" +
				"      - {kind: edit, title: \"Write *\", decide: ask}\n" +
				"      - {kind: edit, decide: allow}\n")
		}
	}
	return b.String()
}

// permStep is one permission request of the test as the audit trail must
// show it: settled by the policy with a rule, or by the client.
type permStep struct {
	session, by, rule, optionID string
}

// TestPermissionRules: standing permission rules decide the demo agent's
// permission requests at the gateway, over WebSocket and Streamable HTTP
// (issue #32):
//
//   - acme's own list: a write under docs/ is allowed and one under secret/
//     denied, no client asked, the file written or not; a write elsewhere
//     meets an ask rule and the client is asked (the allow after it is not
//     reached); the execute tool call matches no rule and the client is
//     asked, as without rules;
//   - globex has no list and takes the top-level one: "**" allows a write
//     inside the root, but a write to a path outside the root is not
//     allowed by it: the client is asked, the location redacted; execute
//     is denied;
//   - a title with control characters never matches an allow rule's title
//     (an ask rule after it asks the client, the title intact), and leaves
//     the audit trail and the log valid JSON without raw control bytes;
//   - the audit trail has permission.requested then permission.resolved
//     for each, by "policy" with the rule's name and text, or by "client"
//     without a rule; the titles carry the virtual root, not the host's;
//   - acpgate_permission_rule_decisions_total counts by tenant and decide;
//   - SIGHUP swaps the rules: docs/ denied afterwards.
func TestPermissionRules(t *testing.T) {
	e := newIsoEnv(t)
	trail := filepath.Join(t.TempDir(), "audit.jsonl")
	cfgPath := filepath.Join(t.TempDir(), "acpgate.yaml")
	writeFile(t, cfgPath, []byte(permRulesConfig(e, trail, "allow")))
	for _, d := range []string{"docs", "secret"} {
		if err := os.Mkdir(filepath.Join(e.roots["acme"], d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, gwOpts{args: []string{"--config", cfgPath}})
	outside := "/tmp/acpgate-e2e-outside-" + harness.RandomHex(t, 6) + ".txt"
	var steps []permStep
	const ctl = "ctl\x1b[2J\x07.txt"

	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			a := tr.dial(t, g, e.tokens["acme"])
			asid := permSession(t, a, "acme")
			file := tr.name + ".txt"

			// The WebSocket client reads and writes files itself; over HTTP
			// the gateway stands in.
			text, asked := permTurn(t, a, asid, "write docs/"+file+" hello", "")
			if asked != nil || !strings.Contains(text, "Wrote 5 bytes to ") || !strings.Contains(text, "docs/"+file) {
				t.Errorf("docs/ (allow): asked %v, the agent said %q", asked != nil, text)
			}
			if b, err := os.ReadFile(filepath.Join(e.roots["acme"], "docs", file)); tr.name == "http" && (err != nil || string(b) != "hello") {
				t.Errorf("docs/%s: %q, %v", file, b, err)
			}
			steps = append(steps, permStep{asid, "policy", `tenants[acme].permissions[1] {kind: "edit", path: "docs/**", decide: allow}`, "allow"})

			text, asked = permTurn(t, a, asid, "write secret/"+file+" hello", "")
			if asked != nil || !strings.Contains(text, "Permission denied.") {
				t.Errorf("secret/ (deny): asked %v, the agent said %q", asked != nil, text)
			}
			if _, err := os.Stat(filepath.Join(e.roots["acme"], "secret", file)); !os.IsNotExist(err) {
				t.Errorf("secret/%s was written: %v", file, err)
			}
			steps = append(steps, permStep{asid, "policy", `tenants[acme].permissions[2] {kind: "edit", path: "secret/**", decide: deny}`, "reject"})

			text, asked = permTurn(t, a, asid, "write other-"+file+" hello", "reject")
			if asked == nil || !strings.Contains(text, "Permission denied.") {
				t.Errorf("ask: asked %v, the agent said %q", asked != nil, text)
			}
			steps = append(steps, permStep{asid, "client", "", "reject"})

			text, asked = permTurn(t, a, asid, "permission please", "allow")
			if asked == nil || !strings.Contains(text, "Permission granted (allow).") {
				t.Errorf("no match: asked %v, the agent said %q", asked != nil, text)
			}
			steps = append(steps, permStep{asid, "client", "", "allow"})

			text, asked = permTurn(t, a, asid, "write "+ctl+" hello", "reject")
			if asked == nil || !strings.Contains(text, "Permission denied.") {
				t.Fatalf("control characters: asked %v, the agent said %q", asked != nil, text)
			}
			if title := permTitle(t, *asked); title != "Write /workspace/"+ctl {
				t.Errorf("the client got the title %q, want it raw: %q", title, "Write /workspace/"+ctl)
			}
			steps = append(steps, permStep{asid, "client", "", "reject"})

			x := tr.dial(t, g, e.tokens["globex"])
			xsid := permSession(t, x, "globex")
			text, asked = permTurn(t, x, xsid, "write in-"+file+" hello", "")
			if asked != nil || !strings.Contains(text, "Wrote 5 bytes") {
				t.Errorf("globex ** (allow): asked %v, the agent said %q", asked != nil, text)
			}
			steps = append(steps, permStep{xsid, "policy", `permissions[0] {kind: "edit", path: "**", decide: allow}`, "allow"})

			text, asked = permTurn(t, x, xsid, "write "+outside+" hello", "reject")
			if asked == nil || !strings.Contains(text, "Permission denied.") {
				t.Errorf("globex outside the root: asked %v, the agent said %q", asked != nil, text)
			} else if loc := string(asked.Raw); strings.Contains(loc, `"path":"`+outside) || !strings.Contains(loc, "outside-workspace") {
				t.Errorf("the location outside the root is not redacted: %s", loc)
			}
			steps = append(steps, permStep{xsid, "client", "", "reject"})

			text, asked = permTurn(t, x, xsid, "permission please", "")
			if asked != nil || !strings.Contains(text, "Permission denied (reject).") {
				t.Errorf("globex execute (deny): asked %v, the agent said %q", asked != nil, text)
			}
			steps = append(steps, permStep{xsid, "policy", `permissions[1] {kind: "execute", decide: deny}`, "reject"})
		})
	}

	counts := map[string]float64{}
	for k, v := range g.metrics(t) {
		if strings.HasPrefix(k, "acpgate_permission_rule_decisions_total{") {
			for _, ten := range tenantNames {
				for _, d := range []string{"allow", "deny", "ask"} {
					if strings.Contains(k, `tenant="`+ten+`"`) && strings.Contains(k, `decide="`+d+`"`) {
						counts[ten+"/"+d] += v
					}
				}
			}
		}
	}
	want := map[string]float64{"acme/allow": 2, "acme/deny": 2, "acme/ask": 4, "globex/allow": 2, "globex/deny": 2}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("acpgate_permission_rule_decisions_total %s = %v, want %v (all: %v)", k, counts[k], n, counts)
		}
	}

	// SIGHUP: docs/ is denied from now on.
	writeFile(t, cfgPath, []byte(permRulesConfig(e, trail, "deny")))
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.WaitLog(t, "configuration reloaded", "", "", 10*time.Second)
	a := subjTransports[0].dial(t, g, e.tokens["acme"])
	asid := permSession(t, a, "acme")
	if text, asked := permTurn(t, a, asid, "write docs/reloaded.txt hello", ""); asked != nil || !strings.Contains(text, "Permission denied.") {
		t.Errorf("docs/ after the reload: asked %v, the agent said %q", asked != nil, text)
	}
	steps = append(steps, permStep{asid, "policy", `tenants[acme].permissions[1] {kind: "edit", path: "docs/**", decide: deny}`, "reject"})

	g.Stop(syscall.SIGTERM) // flushes the trail
	checkPermTrail(t, trail, steps, e)
	if logs := g.LogText(); strings.ContainsAny(logs, "\x1b\x07") {
		t.Error("the gateway's log holds a raw control character")
	}
}

// permSession opens a session in the virtual root.
func permSession(t *testing.T, p subjPeer, who string) string {
	t.Helper()
	m, _ := subjCall(t, p, who+"'s session/new", "session/new", map[string]any{"cwd": vroot, "mcpServers": []any{}})
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("%s's session/new: %s", who, m.Raw)
	}
	return sid
}

// permTurn runs prompt to its end and returns the agent's text. A
// permission request is answered with the option answer and returned; with
// answer "" one fails the test (the gateway should have decided).
func permTurn(t *testing.T, p subjPeer, sid, prompt, answer string) (string, *rpcMsg) {
	t.Helper()
	var asked *rpcMsg
	var msgs []rpcMsg
	m := subjAwait(t, p, prompt, p.request("session/prompt", textPrompt(sid, prompt)), func(m rpcMsg) {
		switch m.Method {
		case "session/update":
			msgs = append(msgs, m)
		case "fs/write_text_file":
			if answer == "" && !strings.HasPrefix(m.Param("path"), vroot+"/") {
				t.Errorf("%q: a write outside the root: %s", prompt, m.Raw)
			}
			p.respond(m, map[string]any{})
		case "session/request_permission":
			asked = &m
			if answer == "" {
				t.Errorf("%q: the client was asked: %s", prompt, m.Raw)
				answer = "reject"
			}
			p.respond(m, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": answer}})
		default:
			t.Errorf("%q: unexpected %s", prompt, m.Raw)
		}
	})
	if stopReason(t, m) != "end_turn" {
		t.Errorf("%q: %s", prompt, m.Raw)
	}
	return updatesText(t, msgs, "agent_message_chunk"), asked
}

// permTitle is the tool call's title in a permission request.
func permTitle(t *testing.T, m rpcMsg) string {
	t.Helper()
	var p struct {
		ToolCall struct{ Title string } `json:"toolCall"`
	}
	if err := json.Unmarshal(m.Params, &p); err != nil {
		t.Fatal(err)
	}
	return p.ToolCall.Title
}

// checkPermTrail checks the permission events of the trail against steps,
// in order per session: each permission.resolved follows its
// permission.requested, names who settled it and, for the policy, the
// rule. No line holds a raw control character or a host root.
func checkPermTrail(t *testing.T, trail string, steps []permStep, e *isoEnv) {
	t.Helper()
	raw := mustRead(t, trail)
	if bytes.ContainsAny(raw, "\x1b\x07") {
		t.Error("the audit trail holds a raw control character")
	}
	got := map[string][]permStep{}
	requested := map[string]int{}
	for _, r := range readTrail(t, trail) {
		for _, root := range e.real {
			if strings.Contains(r.line, root) {
				t.Errorf("%s names the host root: %s", r.Event, r.line)
			}
		}
		switch r.Event {
		case "permission.requested":
			requested[r.Session]++
			if title, _ := r.Fields["title"].(string); !strings.HasPrefix(title, "Write /workspace/") && title != "Run a harmless command" &&
				!strings.HasPrefix(title, "Write /tmp/acpgate-e2e-outside-") {
				t.Errorf("permission.requested title %q", title)
			}
		case "permission.resolved":
			if requested[r.Session] != len(got[r.Session])+1 {
				t.Errorf("permission.resolved without its permission.requested before it: %s", r.line)
			}
			str := func(k string) string { s, _ := r.Fields[k].(string); return s }
			got[r.Session] = append(got[r.Session], permStep{r.Session, str("by"), str("rule"), str("optionId")})
		}
	}
	want := map[string][]permStep{}
	for _, s := range steps {
		want[s.session] = append(want[s.session], s)
	}
	for sid, w := range want {
		if fmt.Sprint(got[sid]) != fmt.Sprint(w) {
			t.Errorf("session %s's permission.resolved:\n got %v\nwant %v", sid, got[sid], w)
		}
	}
}

// TestPermissionRulesRefused: check-config and serve refuse a rule whose
// path climbs out with ".." or is absolute, an unknown kind or decide and a
// bad glob, naming each; a SIGHUP to such a file is refused and the
// running rules stay.
func TestPermissionRulesRefused(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, []byte("permissions:\n"+
		"  - {kind: edit, path: \"../outside/**\", decide: allow}\n"+
		"  - {kind: edit, path: \"/etc/**\", decide: allow}\n"+
		"  - {kind: exec, decide: allow}\n"+
		"  - {title: \"rm [\", decide: nope}\n"))
	for _, args := range [][]string{{"check-config", "--config", bad}, {"serve", "--listen", "127.0.0.1:0", "--config", bad}} {
		out, err := exec.Command(binPath, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
			t.Fatalf("%s accepted the rules: %v\n%s", args[0], err, out)
		}
		for _, want := range []string{
			`line 2, column 24: permissions[0].path: "../outside/**": must not climb out with ".."`,
			`line 3, column 24: permissions[1].path: "/etc/**": must be relative to the tenant's root, not absolute`,
			`permissions[2].kind: "exec" is not an ACP tool kind`,
			`permissions[3].title: "rm [": has a [ without its ]`,
			`permissions[3].decide: "nope" is not allow, deny or ask`,
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s does not say %q:\n%s", args[0], want, out)
			}
		}
	}

	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, []byte("permissions:\n  - {kind: execute, decide: deny}\n"))
	g := startGateway(t, gwOpts{args: []string{"--config", good}})
	writeFile(t, good, mustRead(t, bad))
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.WaitLog(t, "configuration reload refused; keeping the running configuration", "", "", 10*time.Second)
	c, sid := dialSession(t, g, t.TempDir())
	if text := promptOK(t, c, sid, "permission please"); !strings.Contains(text, "Permission denied (reject).") {
		t.Errorf("after the refused reload the running rule should still deny: the agent said %q", text)
	}
}
