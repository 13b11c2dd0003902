//go:build unix

package interop

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPermissionRulesSDK: standing permission rules (issue #32) decide the
// permission requests of an agent on the official SDK (perm-agent.mjs)
// for the SDK's own client (sdk-owner.mjs), over WebSocket and Streamable
// HTTP, on a gateway without tenants (paths relative to the session's
// cwd): a read is allowed with the request's allow_once option, "rm …"
// denied with reject_once, an edit under docs/ allowed, an edit elsewhere
// matches no rule and the SDK client is asked (and answers allow_once); a
// location outside the cwd under the "**" allow rule is not allowed: the
// client is asked. The audit trail says who settled each, and which rule.
func TestPermissionRulesSDK(t *testing.T) {
	node := requireNode(t, "@agentclientprotocol/sdk/package.json", "@agentclientprotocol/sdk/dist/transports/http-stream.js", "ws/package.json")
	h := newHarness(t)
	home, work := h.mkdir("home"), h.mkdir("work")
	trail := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := allowAllPolicy + "sessions:\n  detach_timeout: " + detachTimeout.String() + "\n" +
		fmt.Sprintf("audit: {file: %q}\n", trail) +
		"permissions:\n" +
		"  - {kind: read, decide: allow}\n" +
		"  - {kind: execute, title: \"rm *\", decide: deny}\n" +
		"  - {kind: edit, path: \"docs/**\", decide: allow}\n" +
		"  - {kind: delete, path: \"**\", decide: allow}\n"
	g := h.startGatewayWith(t, cfg, shellJoin(node, filepath.Join(interopDir, "perm-agent.mjs")), home, work)
	g.waitReady(t, readyLimit)

	type turn struct {
		call   string // the prompt: the tool call perm-agent.mjs asks about
		said   string // the agent's answer: the outcome it got
		asked  bool   // the client was asked
		by     string // permission.resolved's by
		ruleAt string // its rule's name ("": none)
	}
	turns := []turn{
		{`{"kind":"read","title":"Read notes.txt","paths":["notes.txt"]}`, "outcome: selected yes", false, "policy", "permissions[0] "},
		{`{"kind":"execute","title":"rm -rf build"}`, "outcome: selected no", false, "policy", "permissions[1] "},
		{`{"kind":"edit","title":"Edit docs/a.md","paths":["docs/a.md","docs/sub/b.md"]}`, "outcome: selected yes", false, "policy", "permissions[2] "},
		{`{"kind":"edit","title":"Edit src/a.go","paths":["src/a.go"]}`, "outcome: selected yes", true, "client", ""},
		{`{"kind":"delete","title":"Delete","paths":["../elsewhere/x"]}`, "outcome: selected yes", true, "client", ""},
	}
	var prompts []string
	for _, tu := range turns {
		prompts = append(prompts, tu.call)
	}
	sessions := map[string]string{} // transport → session
	for _, tr := range []struct{ name, url string }{
		{"ws", g.url()},
		{"http", "http://" + g.Addr + "/acp"},
	} {
		t.Run(tr.name, func(t *testing.T) {
			owner := h.startNode(t, home, work, "sdk-owner.mjs", append([]string{"--timeout", msString(scriptTimeout), "--transport", tr.name,
				"--permission-delay", "0", tr.url, work}, prompts...)...)
			if err := owner.wait(t, scriptTimeout); err != nil {
				t.Fatalf("sdk-owner.mjs: %v\n%s", err, owner.dump())
			}
			asked := map[string]bool{}
			said := map[string]string{}
			for _, l := range owner.snapshot() {
				switch {
				case l.Type == "session/new":
					sessions[tr.name] = l.SessionID
				case l.Type == "request" && l.Method == "session/request_permission":
					var p struct {
						ToolCall struct{ Title string } `json:"toolCall"`
					}
					mustUnmarshal(t, l.Params, &p)
					asked[p.ToolCall.Title] = true
				case l.Type == "session/prompt":
					var r struct{ Prompt, Text string }
					mustUnmarshal(t, []byte(l.raw), &r)
					said[r.Prompt] = r.Text
				case l.Type == "console" || l.Type == "error":
					t.Errorf("sdk-owner.mjs: %s", l.raw)
				}
			}
			for _, tu := range turns {
				var c struct{ Title string }
				mustUnmarshal(t, []byte(tu.call), &c)
				if said[tu.call] != tu.said || asked[c.Title] != tu.asked {
					t.Errorf("%s: the agent got %q and the client was asked: %v; want %q, %v", c.Title, said[tu.call], asked[c.Title], tu.said, tu.asked)
				}
			}
		})
	}

	g.stop(t) // flushes the trail
	b, err := os.ReadFile(trail)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r struct {
			Event, Session, By, Rule, OptionID string
		}
		mustUnmarshal(t, sc.Bytes(), &r)
		if r.Event == "permission.resolved" {
			got[r.Session] = append(got[r.Session], r.By+" "+r.OptionID+" "+strings.SplitAfter(r.Rule, "] ")[0])
		}
	}
	var want []string
	for _, tu := range turns {
		opt := strings.TrimPrefix(tu.said, "outcome: selected ")
		want = append(want, tu.by+" "+opt+" "+tu.ruleAt)
	}
	for name, sid := range sessions {
		if strings.Join(got[sid], "; ") != strings.Join(want, "; ") {
			t.Errorf("%s: the trail's permission.resolved:\n got %q\nwant %q\n%s", name, got[sid], want, b)
		}
	}
	if len(sessions) != 2 {
		t.Errorf("sessions %v", sessions)
	}
}
