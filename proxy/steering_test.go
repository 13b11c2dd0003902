package proxy

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/policy"
)

// A "steer" test agent answers _session/steering with the params it got.
func init() {
	if os.Getenv("ACPGATE_TEST_AGENT") != "steer" {
		return
	}
	serveLines(func(m agentLine) {
		if answerSetup(os.Stdout, m) || m.Method != "_session/steering" {
			return
		}
		params := string(m.raw[strings.Index(string(m.raw), `"params":`)+len(`"params":`) : len(m.raw)-1])
		fmt.Fprintf(os.Stdout, `{"jsonrpc":"2.0","id":%s,"result":{"got":%s}}`+"\n", m.ID, params)
	})
	os.Exit(0)
}

// The steering extension (_session/steering, which claude-agent-acp and
// codex-acp ship) reaches the agent with the agent's own session ID, its
// other fields byte for byte, when extensions.allow lists it; a read-only
// client is refused it (-32007), and without the listing it is -32601.
func TestSteeringExtension(t *testing.T) {
	for _, allowed := range []bool{true, false} {
		r := testPool(t, "steer", nil, func(c *Config) {
			pol := policy.Default()
			if allowed {
				pol.Extensions = []string{"_session/steering"}
			}
			c.Tenants[0].Policy = &pol
		})
		owner, watcher := newTestConn(t, r, "owner"), newTestConn(t, r, "watcher")
		owner.init(`{}`)
		watcher.init(`{}`)
		sid := owner.newSession("1")
		steer := `{"jsonrpc":"2.0","id":2,"method":"_session/steering","params":{"sessionId":"` + sid + `","message":"focus on tests","x-extra":[1, 2]}}`
		owner.send(steer)
		got := owner.await("2", nil)
		switch {
		case allowed && (got.Error != nil || !strings.Contains(string(got.Result), `"sessionId":"s1","message":"focus on tests","x-extra":[1, 2]`)):
			t.Fatalf("allowed: %s, want the agent's own session ID and the rest unchanged", got.raw)
		case !allowed && (got.Error == nil || got.Error.Code != -32601):
			t.Fatalf("not listed: %s, want -32601", got.raw)
		}
		if !allowed {
			continue
		}
		if res := watcher.attach("3", sid, `,"_meta":{"acpgate":{"readOnly":true}}`); res.Error != nil {
			t.Fatalf("attach: %s", res.raw)
		}
		watcher.send(strings.Replace(steer, `"id":2`, `"id":4`, 1))
		if got := watcher.await("4", nil); got.Error == nil || got.Error.Code != codeReadOnly {
			t.Fatalf("a read-only client's steering: %s, want -32007", got.raw)
		}
	}
}
