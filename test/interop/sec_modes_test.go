package interop

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// policy.modes.allow with the real claude-code-acp (issue #36): its
// session/new result offers default, acceptEdits, plan, dontAsk (and
// bypassPermissions when not root); through a gateway allowing default and
// plan, the client sees only those, and a switch to another is refused
// before it reaches the agent. No model call is made.
func TestClaudeCodeACPModes(t *testing.T) {
	node := requireNode(t, "ws/package.json", "@zed-industries/claude-code-acp/dist/index.js")
	argv := []string{node, filepath.Join(interopDir, "node_modules", "@zed-industries", "claude-code-acp", "dist", "index.js")}
	h := newHarness(t)
	work, home := h.mkdir("work"), h.mkdir("home")
	g := h.startGatewayWith(t, allowAllPolicy+"  modes: {allow: [\"default\", \"plan\"]}\n", shellJoin(argv...), home, work)
	g.waitReady(t, readyLimit)
	p := dialPeer(t, g)
	defer p.close()
	if m := p.call("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, attachStep); len(m.Error) > 0 {
		t.Fatalf("initialize: %s", m.raw)
	}
	m := p.call("session/new", map[string]any{"cwd": work, "mcpServers": []any{}}, runLimit)
	var res struct {
		SessionID string `json:"sessionId"`
		Modes     struct {
			CurrentModeID  string `json:"currentModeId"`
			AvailableModes []struct {
				ID string `json:"id"`
			} `json:"availableModes"`
		} `json:"modes"`
	}
	p.mustResult(m, &res)
	var ids []string
	for _, md := range res.Modes.AvailableModes {
		ids = append(ids, md.ID)
	}
	if res.Modes.CurrentModeID != "default" || !slices.Equal(ids, []string{"default", "plan"}) {
		t.Errorf("modes through the gateway: current %q, available %q: %s", res.Modes.CurrentModeID, ids, m.raw)
	}
	for _, mode := range []string{"acceptEdits", "bypassPermissions", "dontAsk"} {
		m := p.call("session/set_mode", map[string]any{"sessionId": res.SessionID, "modeId": mode}, attachStep)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if len(m.Error) == 0 || json.Unmarshal(m.Error, &e) != nil || e.Code != -32602 ||
			!strings.Contains(e.Message, `is not allowed by the gateway policy (policy.modes.allow: "default", "plan")`) {
			t.Errorf("set_mode %s: %s", mode, m.raw)
		}
	}
	if m := p.call("session/set_mode", map[string]any{"sessionId": res.SessionID, "modeId": "plan"}, 30*time.Second); len(m.Error) > 0 {
		t.Errorf("set_mode plan: %s", m.raw)
	}
}
