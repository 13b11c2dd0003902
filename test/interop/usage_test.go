//go:build unix

package interop

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

// The gateway meters what an agent on the official SDK reports
// (usage-agent.mjs): per tenant, the tokens of each PromptResponse.usage,
// the increase of each session's cumulative usage_update cost (counted
// once, the replay of a session/load not at all) and the prompts' time.
func TestUsageMetered(t *testing.T) {
	node := requireNode(t, "@agentclientprotocol/sdk/package.json")
	h := newHarness(t)
	home, work := h.mkdir("home"), h.mkdir("work")
	tokens, roots := map[string]string{}, map[string]string{}
	modules, err := filepath.EvalSymlinks(filepath.Join(interopDir, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := allowAllPolicy + fmt.Sprintf("pool: {max_processes: 2}\nsandbox: {home: %q, read_only: [%q, %q]}\ntenants:\n",
		h.mkdir("homes"), interopDir, modules)
	for _, name := range []string{"alpha", "beta"} {
		tokens[name] = name + "-" + hex.EncodeToString([]byte(h.mark))
		sum := sha256.Sum256([]byte(tokens[name]))
		roots[name] = h.mkdir(name)
		cfg += fmt.Sprintf("  - name: %s\n    root: %q\n    tokens_sha256: [%q]\n", name, roots[name], hex.EncodeToString(sum[:]))
	}
	g := h.startGatewayWith(t, cfg, shellJoin(node, filepath.Join(interopDir, "usage-agent.mjs")), home, work)
	g.waitReady(t, readyLimit)

	// alpha: two turns, a load of the session by a second connection (its
	// usage_update replayed), and a turn there; beta: one turn.
	a := dialTenant(t, g, tokens["alpha"])
	defer a.close()
	sid := a.usageSession(roots["alpha"])
	a.usageTurn(sid)
	a.usageTurn(sid)
	a2 := dialTenant(t, g, tokens["alpha"])
	defer a2.close()
	a2.initialize()
	if m := a2.call("session/load", map[string]any{"sessionId": sid, "cwd": roots["alpha"], "mcpServers": []any{}}, attachStep); len(m.Error) > 0 {
		t.Fatalf("session/load: %s", m.raw)
	}
	a2.usageTurn(sid)
	b := dialTenant(t, g, tokens["beta"])
	defer b.close()
	b.usageTurn(b.usageSession(roots["beta"]))

	_, text, err := metricscrape.Get(g.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for tenant, turns := range map[string]float64{"alpha": 3, "beta": 1} {
		ten := `tenant="` + tenant + `"`
		for kind, n := range map[string]float64{"input": 100, "output": 20, "thought": 5, "cached_read": 7, "cached_write": 3} {
			if got := metricscrape.Sum(text, "acpgate_usage_tokens_total", ten, `kind="`+kind+`"`); got != n*turns {
				t.Errorf("%s %s tokens = %v, want %v", tenant, kind, got, n*turns)
			}
		}
		if got := metricscrape.Sum(text, "acpgate_usage_cost_total", ten, `currency="USD"`); got != 0.125*turns {
			t.Errorf("%s cost = %v USD, want %v (each session's cumulative cost once, the replay not counted)", tenant, got, 0.125*turns)
		}
		if got := metricscrape.Sum(text, "acpgate_prompt_seconds_total", ten); got <= 0 {
			t.Errorf("%s prompt seconds = %v, want > 0", tenant, got)
		}
	}
	if got := metricscrape.Sum(text, "acpgate_usage_rejected_total"); got != 0 {
		t.Errorf("usage reports rejected: %v, want none", got)
	}
}

// dialTenant connects a peer with a tenant's token (in the subprotocols,
// as a browser sends it).
func dialTenant(t *testing.T, g *gateway, token string) *peer {
	t.Helper()
	return dialWith(t, g, "acp", "acp.bearer."+token)
}

func (p *peer) initialize() {
	p.t.Helper()
	if m := p.call("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, attachStep); len(m.Error) > 0 {
		p.t.Fatalf("initialize: %s", m.raw)
	}
}

// usageSession initializes and opens a session.
func (p *peer) usageSession(cwd string) string {
	p.t.Helper()
	p.initialize()
	var res struct{ SessionID string }
	p.mustResult(p.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}, attachStep), &res)
	return res.SessionID
}

// usageTurn runs one prompt to its end.
func (p *peer) usageTurn(sid string) {
	p.t.Helper()
	var res struct{ StopReason string }
	p.mustResult(p.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "go"}}}, attachStep), &res)
	if res.StopReason != "end_turn" {
		p.t.Errorf("stopReason %q, want end_turn", res.StopReason)
	}
}

// checkReportedUsage checks the gateway's usage metrics against what the
// agent reported in a probe run through it: the tokens of its prompt
// answers and the increases of its sessions' cumulative cost (none
// reported: none counted).
func checkReportedUsage(t *testing.T, g *gateway, r *nodeRun) {
	t.Helper()
	tokens, cost := map[string]float64{}, map[string]float64{}
	last := map[string]float64{} // session and currency → last amount
	for _, u := range sessionUpdates(t, r) {
		c, _ := u.update["cost"].(map[string]any)
		amount, ok := c["amount"].(float64)
		cur, _ := c["currency"].(string)
		if u.kind != "usage_update" || !ok {
			continue
		}
		key := u.sessionID + " " + cur
		cost[cur] += max(0, amount-last[key])
		last[key] = amount
	}
	fields := map[string]string{"inputTokens": "input", "outputTokens": "output", "thoughtTokens": "thought", "cachedReadTokens": "cached_read", "cachedWriteTokens": "cached_write"}
	for _, l := range r.find("response", "session/prompt") {
		var resp struct {
			Result struct{ Usage map[string]float64 } `json:"result"`
		}
		mustUnmarshal(t, l.Message, &resp)
		for f, n := range resp.Result.Usage {
			if kind, ok := fields[f]; ok {
				tokens[kind] += n
			}
		}
	}
	_, text, err := metricscrape.Get(g.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range fields {
		if got := metricscrape.Sum(text, "acpgate_usage_tokens_total", `kind="`+kind+`"`); got != tokens[kind] {
			t.Errorf("acpgate_usage_tokens_total{kind=%q} = %v, the agent reported %v", kind, got, tokens[kind])
		}
	}
	if got, want := metricscrape.Sum(text, "acpgate_usage_cost_total"), sumValues(cost); got != want {
		t.Errorf("acpgate_usage_cost_total = %v, the agent reported %v (%v)", got, want, cost)
	}
	t.Logf("usage the agent reported: tokens %v, cost %v; rejected by the gateway: %v", tokens, cost,
		metricscrape.Sum(text, "acpgate_usage_rejected_total"))
}

func sumValues(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}
