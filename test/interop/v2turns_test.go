//go:build unix

package interop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

// ACP v2 turns through the gateway (issue #37), with an agent on the SDK
// 2.4.0 agentProtocolRouter (v2-agent.mjs, v1 and v2 in one process) and
// the SDK's v2 client (v2-client.mjs) or the Go peer: a v2 prompt's answer
// is only its acknowledgement, and the turn runs until the session's idle
// state_update.

// v2Env is a gateway serving v2-agent.mjs to tenants: their tokens and
// roots.
type v2Env struct {
	h      *harness
	g      *gateway
	home   string
	tokens map[string]string
	roots  map[string]string
}

// startV2Gateway starts the gateway with v2-agent.mjs behind the tenants
// named, each with its tenants[] extra YAML (a line of its own under the
// tenant, "" for none), and top added to the config.
func startV2Gateway(t *testing.T, top string, tenants map[string]string) *v2Env {
	t.Helper()
	node := requireNode(t, "@agentclientprotocol/sdk/package.json", "@agentclientprotocol/sdk/dist/protocol-router.js", "ws/package.json")
	h := newHarness(t)
	e := &v2Env{h: h, home: h.mkdir("home"), tokens: map[string]string{}, roots: map[string]string{}}
	modules, err := filepath.EvalSymlinks(filepath.Join(interopDir, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := allowAllPolicy + top + fmt.Sprintf("sandbox: {home: %q, read_only: [%q, %q]}\ntenants:\n", h.mkdir("homes"), interopDir, modules)
	for name, extra := range tenants {
		// Two tokens, two subjects: tokens[name] and tokens[name+"2"].
		e.tokens[name] = name + "-" + hex.EncodeToString([]byte(h.mark))
		e.tokens[name+"2"] = name + "2-" + hex.EncodeToString([]byte(h.mark))
		sum, sum2 := sha256.Sum256([]byte(e.tokens[name])), sha256.Sum256([]byte(e.tokens[name+"2"]))
		e.roots[name] = h.mkdir(name)
		cfg += fmt.Sprintf("  - name: %s\n    root: %q\n    tokens_sha256: [%q, %q]\n", name, e.roots[name],
			hex.EncodeToString(sum[:]), hex.EncodeToString(sum2[:]))
		if extra != "" {
			cfg += "    " + extra + "\n"
		}
	}
	e.g = h.startGatewayWith(t, cfg, shellJoin(node, filepath.Join(interopDir, "v2-agent.mjs")), e.home, h.mkdir("work"))
	e.g.waitReady(t, readyLimit)
	return e
}

// v2URLs are the gateway's endpoint over both transports.
func (e *v2Env) urls() map[string]string {
	return map[string]string{"ws": e.g.url(), "http": "http://" + e.g.Addr + "/acp"}
}

// runV2Client runs one v2-client.mjs prompt as tenant over url, with the
// script's flags.
func (e *v2Env) runV2Client(t *testing.T, tenant, url, prompt string, flags ...string) *nodeRun {
	t.Helper()
	args := append([]string{"--timeout", msString(scriptTimeout), "--token", e.tokens[tenant]}, flags...)
	return e.h.runNode(t, e.home, e.roots[tenant], runLimit, "v2-client.mjs", append(args, url, e.roots[tenant], prompt)...)
}

// v2Idle is a client's idle state_update.
type v2Idle struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		SessionUpdate string          `json:"sessionUpdate"`
		State         string          `json:"state"`
		StopReason    string          `json:"stopReason"`
		Usage         json.RawMessage `json:"usage"`
	} `json:"update"`
	Meta struct {
		Acpgate struct {
			Budget *struct {
				Tenant, Unit string
				Spent, Limit float64
			} `json:"budget"`
		} `json:"acpgate"`
	} `json:"_meta"`
}

// ticks counts the agent_message_chunk ticks of a run.
func ticks(t *testing.T, r *nodeRun) int {
	n := 0
	for _, u := range r.find("session/update", "") {
		var p struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
				Content       struct{ Text string }
			} `json:"update"`
		}
		mustUnmarshal(t, u.Params, &p)
		if p.Update.SessionUpdate == "agent_message_chunk" && strings.HasPrefix(p.Update.Content.Text, "tick ") {
			n++
		}
	}
	return n
}

// idleOf is the run's idle line.
func idleOf(t *testing.T, r *nodeRun) v2Idle {
	t.Helper()
	lines := r.find("idle", "")
	if r.err != nil || len(lines) != 1 {
		t.Fatalf("v2-client.mjs: exit %v, %d idle lines\n%s", r.err, len(lines), r.dump())
	}
	var idle v2Idle
	mustUnmarshal(t, lines[0].Params, &idle)
	return idle
}

// A v2 turn ends at its idle state_update, not at its acknowledgement: a
// plain turn runs to end_turn with all its ticks, and a turn whose cost
// takes its tenant past its budget is cancelled with session/cancel, its
// idle update saying why (_meta.acpgate.budget), long before its 20 ticks;
// over WebSocket and Streamable HTTP. At 99b340a the budget cancelled
// nothing: the turn had ended, for the gateway, at its acknowledgement.
func TestV2TurnBudget(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{
		"ws": "budget: {cost: {USD: 1}}", "http": "budget: {cost: {USD: 1}}", "free": "",
	})
	for transport, url := range e.urls() {
		t.Run(transport, func(t *testing.T) {
			// Unbudgeted: the turn runs whole.
			r := e.runV2Client(t, "free", url, "ticks 5 0.5")
			if idle := idleOf(t, r); idle.Update.StopReason != "end_turn" || ticks(t, r) != 5 {
				t.Errorf("free turn: stopReason %q after %d ticks, want end_turn after 5\n%s", idle.Update.StopReason, ticks(t, r), r.dump())
			}
			var ack struct{ MessageID string }
			mustUnmarshal(t, r.find("session/prompt", "")[0].Result, &ack)
			if ack.MessageID == "" {
				t.Errorf("the prompt's answer has no messageId\n%s", r.dump())
			}
			// 0.2 USD a tick, 100 ms apart: the fifth crosses the 1 USD cap.
			start := time.Now()
			r = e.runV2Client(t, transport, url, "long 20 0.2")
			idle := idleOf(t, r)
			n := ticks(t, r)
			t.Logf("%s: stopReason %s after %d of 20 ticks, %v", transport, idle.Update.StopReason, n, time.Since(start).Round(time.Millisecond))
			if idle.Update.StopReason != "cancelled" || n >= 20 {
				t.Fatalf("the v2 turn past its budget: stopReason %q after %d of 20 ticks, want cancelled before the 20th\n%s",
					idle.Update.StopReason, n, r.dump())
			}
			if b := idle.Meta.Acpgate.Budget; b == nil || b.Tenant != transport || b.Unit != "USD" || b.Limit != 1 || b.Spent < 1 {
				t.Errorf("the idle update does not say why (_meta.acpgate.budget): %s", r.find("idle", "")[0].raw)
			}
		})
	}
	if n := e.g.CountLogs("budgets: turn cancelled, its tenant's budget exhausted", "", ""); n != 2 {
		t.Errorf("%d budget cancellations logged, want 2", n)
	}
	// Metering counts the free tenant's two turns from their idle usage
	// (50 input, 5 output tokens each) and their cost (2.5 USD each).
	_, text, err := metricscrape.Get(e.g.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]float64{"input": 100, "output": 10} {
		if got := metricscrape.Sum(text, "acpgate_usage_tokens_total", `tenant="free"`, `kind="`+kind+`"`); got != want {
			t.Errorf("free %s tokens = %v, want %v (the idle updates' usage)", kind, got, want)
		}
	}
	if got := metricscrape.Sum(text, "acpgate_usage_cost_total", `tenant="free"`, `currency="USD"`); got != 5 {
		t.Errorf("free cost = %v USD, want 5", got)
	}
}

// A drain waits for v2 turns to go idle: 20 clients each mid-way through a
// 1 s turn when the gateway gets SIGTERM each get the turn's idle end_turn
// with all its ticks before the gateway closes them (at 99b340a none did:
// the drain saw no turn running once the prompts were acknowledged).
func TestV2DrainWaitsForIdle(t *testing.T) {
	const clients = 20
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	peers := make([]*peer, clients)
	sids := make([]string, clients)
	for i := range peers {
		p := dialTenant(t, e.g, e.tokens["ide"])
		defer p.close()
		m := p.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "drain", "version": "0"}, "capabilities": map[string]any{}}, attachStep)
		var init struct{ ProtocolVersion int }
		p.mustResult(m, &init)
		if init.ProtocolVersion != 2 {
			t.Fatalf("initialize: %s, want protocolVersion 2", m.raw)
		}
		var sess struct{ SessionID string }
		p.mustResult(p.call("session/new", map[string]any{"cwd": e.roots["ide"], "mcpServers": []any{}}, attachStep), &sess)
		peers[i], sids[i] = p, sess.SessionID
	}
	for i, p := range peers {
		var ack struct{ MessageID string }
		p.mustResult(p.call("session/prompt", map[string]any{"sessionId": sids[i], "prompt": []any{map[string]any{"type": "text", "text": "long 10"}}}, attachStep), &ack)
	}
	// Every turn is under way (its first tick arrived).
	for _, p := range peers {
		p.waitMsg(0, "the first tick", 10*time.Second, func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 1 "`) })
	}
	start := time.Now()
	e.g.stop(t)
	delivered := 0
	for i, p := range peers {
		idle := func(m peerMsg) bool {
			var u v2Idle
			return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == sids[i] &&
				u.Update.SessionUpdate == "state_update" && u.Update.State == "idle"
		}
		// Wait for the socket's end, then look.
		p.mu.Lock()
		for p.readErr == nil {
			changed := p.changed
			p.mu.Unlock()
			select {
			case <-changed:
			case <-time.After(20 * time.Second):
				t.Fatalf("client %d: its socket did not end within 20 s of SIGTERM", i)
			}
			p.mu.Lock()
		}
		p.mu.Unlock()
		if p.count(idle) == 1 && p.count(func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 10 "`) }) == 1 {
			_, m := p.waitMsg(0, "idle", time.Second, idle)
			var u v2Idle
			p.decode(m.Params, &u)
			if u.Update.StopReason == "end_turn" {
				delivered++
				continue
			}
		}
		t.Logf("client %d: no idle end_turn after tick 10 before the close:\n%s", i, p.dump())
	}
	t.Logf("%d of %d idle end_turn delivered; the drain took %v", delivered, clients, time.Since(start).Round(time.Millisecond))
	if delivered != clients {
		t.Errorf("the drain delivered %d of %d idle end_turn, want all", delivered, clients)
	}
}

// childIDs checks a run's subagent turn: the subagent_update names a child
// by an ID that is neither the agent's own (the child says its own in its
// text) nor the parent's; the child's own updates arrive under that ID,
// and (v2) the parent's idle update lists it in background[]. It returns
// the child's ID as the client knows it.
func checkChild(t *testing.T, v2 bool, parent string, updates []json.RawMessage, dump func() string) string {
	t.Helper()
	type upd struct {
		SessionID string `json:"sessionId"`
		Update    struct {
			SessionUpdate string          `json:"sessionUpdate"`
			SessionID     string          `json:"sessionId"`
			State         json.RawMessage `json:"state"` // a subagent_update's is an object
			Content       struct{ Text string }
			Background    []struct{ Type, SessionID string }
		} `json:"update"`
	}
	var child, agentChild string
	childUpdates, listed := 0, false
	for _, raw := range updates {
		var u upd
		mustUnmarshal(t, raw, &u)
		switch {
		case u.SessionID == parent && u.Update.SessionUpdate == "subagent_update":
			child = u.Update.SessionID
		case u.SessionID == parent && string(u.Update.State) == `"idle"`:
			listed = len(u.Update.Background) == 1 && u.Update.Background[0].SessionID == child && child != ""
		case u.SessionID != parent:
			if u.SessionID != child {
				t.Errorf("an update under session %q, neither the parent's nor its announced child's %q", u.SessionID, child)
			}
			childUpdates++
			if after, ok := strings.CutPrefix(u.Update.Content.Text, "child says "); ok {
				agentChild = after
			}
		}
	}
	if child == "" || agentChild == "" || child == agentChild || child == parent {
		t.Fatalf("child session: announced as %q, the agent's own %q, the parent %q; want a sealed ID of its own\n%s", child, agentChild, parent, dump())
	}
	if childUpdates != 3 {
		t.Errorf("%d updates of the child arrived, want 3 (running, its chunk, idle)\n%s", childUpdates, dump())
	}
	if v2 && !listed {
		t.Errorf("the parent's idle update does not list the child %q in background[]\n%s", child, dump())
	}
	return child
}

// A v2 subagent's child session reaches its client whole, under a sealed
// ID that is not the agent's, over WebSocket and Streamable HTTP. At
// 99b340a the subagent_update carried the agent's own child ID and every
// update of the child was dropped ("a notification for an unknown
// session").
func TestV2SubagentChild(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	for transport, url := range e.urls() {
		t.Run(transport, func(t *testing.T) {
			r := e.runV2Client(t, "ide", url, "subagent")
			if idle := idleOf(t, r); idle.Update.StopReason != "end_turn" {
				t.Errorf("stopReason %q, want end_turn", idle.Update.StopReason)
			}
			var updates []json.RawMessage
			for _, l := range r.find("session/update", "") {
				updates = append(updates, l.Params)
			}
			checkChild(t, true, r.find("session/new", "")[0].SessionID, updates, r.dump)
		})
	}
}

// A child's ID is its parent's client's: session/status on it answers that
// client (the agent's answer), and gets -32002, the answer for an unknown
// session, from another subject of the same tenant and from another tenant.
// At 99b340a the client was given the agent's own child ID, which named
// nothing to the gateway: its own session/status on it got -32002.
func TestV2ChildIDRefusedToOthers(t *testing.T) {
	adminToken := "admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	adminSum := sha256.Sum256([]byte(adminToken))
	e := startV2Gateway(t, fmt.Sprintf("admin: {tokens_sha256: [%q]}\n", hex.EncodeToString(adminSum[:])), map[string]string{"alpha": "", "beta": ""})
	v2Open := func(p *peer, cwd string) string {
		p.mustResult(p.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
		var sess struct{ SessionID string }
		p.mustResult(p.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}, attachStep), &sess)
		return sess.SessionID
	}
	a := dialTenant(t, e.g, e.tokens["alpha"])
	defer a.close()
	parent := v2Open(a, e.roots["alpha"])
	from := a.count(func(peerMsg) bool { return true })
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": parent, "prompt": []any{map[string]any{"type": "text", "text": "subagent"}}}, attachStep), &struct{}{})
	a.waitMsg(from, "the parent's idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == parent && u.Update.State == "idle"
	})
	var updates []json.RawMessage
	a.mu.Lock()
	for _, m := range a.msgs {
		if m.Method == "session/update" {
			updates = append(updates, m.Params)
		}
	}
	a.mu.Unlock()
	child := checkChild(t, true, parent, updates, a.dump)

	status := func(p *peer, sid string) peerMsg {
		return p.call("session/status", map[string]any{"sessionId": sid}, attachStep)
	}
	var st struct{ Status string }
	a.mustResult(status(a, child), &st)
	if st.Status != "open" {
		t.Errorf("the owner's session/status on its child: %q, want open", st.Status)
	}
	b := dialTenant(t, e.g, e.tokens["beta"])
	defer b.close()
	v2Open(b, e.roots["beta"])
	a2 := dialTenant(t, e.g, e.tokens["alpha2"])
	defer a2.close()
	v2Open(a2, e.roots["alpha"])
	unknown := status(b, "gw_not-a-session")
	for who, m := range map[string]peerMsg{"another tenant": status(b, child), "another subject": status(a2, child),
		"another tenant, on the parent": status(b, parent), "another subject, on the parent": status(a2, parent)} {
		var got, want struct {
			Code    int
			Message string
		}
		b.decode(m.Error, &got)
		b.decode(unknown.Error, &want)
		if got.Code != -32002 || got != want {
			t.Errorf("%s's session/status on the child: %s, want the unknown session's %s", who, m.raw, unknown.raw)
		}
	}

	// The admin API lists the child under its parent; ending the parent
	// ends the child.
	admin := func(method, path string, out any) int {
		req, err := http.NewRequest(method, "http://"+e.g.Addr+"/v1/admin/"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			_ = json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	var list struct {
		Sessions []struct{ ID, Parent, Tenant string }
	}
	if code := admin(http.MethodGet, "sessions?tenant=alpha", &list); code != http.StatusOK {
		t.Fatalf("GET sessions: %d", code)
	}
	parents := map[string]string{}
	for _, s := range list.Sessions {
		parents[s.ID] = s.Parent
	}
	if p, ok := parents[child]; !ok || p != parent || parents[parent] != "" {
		t.Errorf("admin sessions: %+v; want the child %q listed with parent %q", list.Sessions, child, parent)
	}
	if code := admin(http.MethodDelete, "sessions/"+url.PathEscape(parent), nil); code/100 != 2 {
		t.Fatalf("DELETE the parent: %d", code)
	}
	if m := status(a, child); !strings.Contains(string(m.Error), "-32002") {
		t.Errorf("session/status on the child of an ended parent: %s, want -32002", m.raw)
	}
}

// v1 subagents (clientCapabilities.subagents, v1 unstable): a client that
// offers it gets a process told it, and its child session under a sealed
// ID; one that does not never receives a subagent_update, nor the child's
// updates, even from an agent that spawns a child regardless; over
// WebSocket and Streamable HTTP. At 99b340a the pool never told the agent
// the capability: no child session existed.
func TestV1SubagentChild(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	for transport, url := range e.urls() {
		t.Run(transport, func(t *testing.T) {
			r := e.runV2Client(t, "ide", url, "subagent", "--v1", "--subagents")
			if r.err != nil || len(r.find("session/prompt", "")) != 1 {
				t.Fatalf("v2-client.mjs --v1: exit %v\n%s", r.err, r.dump())
			}
			var updates []json.RawMessage
			for _, l := range r.find("session/update", "") {
				updates = append(updates, l.Params)
			}
			checkChild(t, false, r.find("session/new", "")[0].SessionID, updates, r.dump)

			// Without the capability, from an agent that ignores it.
			r = e.runV2Client(t, "ide", url, "subagent!", "--v1")
			if r.err != nil || len(r.find("session/prompt", "")) != 1 {
				t.Fatalf("v2-client.mjs --v1: exit %v\n%s", r.err, r.dump())
			}
			parent, done := r.find("session/new", "")[0].SessionID, false
			for _, l := range r.find("session/update", "") {
				var u struct {
					SessionID string `json:"sessionId"`
					Update    struct {
						SessionUpdate string `json:"sessionUpdate"`
						Content       struct{ Text string }
					} `json:"update"`
				}
				mustUnmarshal(t, l.Params, &u)
				if u.SessionID != parent || u.Update.SessionUpdate == "subagent_update" {
					t.Errorf("a v1 client without clientCapabilities.subagents got %s", l.raw)
				}
				done = done || u.Update.Content.Text == "parent done"
			}
			if !done {
				t.Errorf("the parent's own update did not arrive\n%s", r.dump())
			}
		})
	}
}

// v2Peer opens a v2 session as tenant's peer over WebSocket.
func (e *v2Env) v2Peer(t *testing.T, token, cwd string) (*peer, string) {
	t.Helper()
	p := dialTenant(t, e.g, token)
	p.mustResult(p.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	var sess struct{ SessionID string }
	p.mustResult(p.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}, attachStep), &sess)
	return p, sess.SessionID
}

// updatesSince are the session/update params p received from index from.
func (p *peer) updatesSince(from int) []json.RawMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []json.RawMessage
	for _, m := range p.msgs[from:] {
		if m.Method == "session/update" {
			out = append(out, m.Params)
		}
	}
	return out
}

// A resumed history (v2 session/resume with replayFrom, on a second
// connection of the same subject) brings the child back: its
// subagent_update under the same sealed ID, the child's own replayed
// updates under it, and each session's replay_complete under its own ID.
// At 99b340a the replay named the agent's own child ID and dropped the
// child's updates and its replay_complete.
func TestV2ResumeBringsChildBack(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, parent := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": parent, "prompt": []any{map[string]any{"type": "text", "text": "subagent"}}}, attachStep), &struct{}{})
	a.waitMsg(0, "the parent's idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == parent && u.Update.State == "idle"
	})
	child := checkChild(t, true, parent, a.updatesSince(0), a.dump)

	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	from := b.count(func(peerMsg) bool { return true })
	if m := b.call("session/resume", map[string]any{"sessionId": parent, "cwd": e.roots["ide"], "replayFrom": map[string]any{"type": "start"}}, attachStep); len(m.Error) > 0 {
		t.Fatalf("session/resume: %s", m.raw)
	}
	complete := map[string]int{}
	announced, childUpdates := "", 0
	for _, raw := range b.updatesSince(from) {
		var u struct {
			SessionID string `json:"sessionId"`
			Update    struct {
				SessionUpdate string `json:"sessionUpdate"`
				SessionID     string `json:"sessionId"`
			} `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		switch {
		case u.Update.SessionUpdate == "replay_complete":
			complete[u.SessionID]++
		case u.Update.SessionUpdate == "subagent_update":
			announced = u.Update.SessionID
		case u.SessionID == child:
			childUpdates++
		case u.SessionID != parent:
			t.Errorf("a replayed update under %q, neither the parent's nor the child's", u.SessionID)
		}
	}
	if announced != child || childUpdates != 3 {
		t.Errorf("the replay announced child %q (want %q) with %d of its updates (want 3)\n%s", announced, child, childUpdates, b.dump())
	}
	if complete[parent] != 1 || complete[child] != 1 || len(complete) != 2 {
		t.Errorf("replay_complete by session: %v; want one for the parent %q and one for the child %q\n%s", complete, parent, child, b.dump())
	}
	// The child is the resuming client's now: its session/status answers.
	var st struct{ Status string }
	b.mustResult(b.call("session/status", map[string]any{"sessionId": child}, attachStep), &st)
	if st.Status != "open" {
		t.Errorf("session/status on the resumed child: %q, want open", st.Status)
	}
}

// dialURL is dialWith at url (a resume's query).
func dialURL(t *testing.T, url string, protos ...string) *peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, attachStep)
	defer dcancel()
	ws, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{Subprotocols: protos})
	if err != nil {
		cancel()
		t.Fatalf("dial %s: %v", url, err)
	}
	ws.SetReadLimit(64 << 20)
	p := &peer{t: t, ws: ws, ctx: ctx, cancel: cancel, nextID: 1, changed: make(chan struct{}), stopped: make(chan struct{})}
	go p.read()
	return p
}

// A v2 client that resumes a dropped socket gets, after the gateway's
// replay of what it missed, a replay_complete for each of its sessions.
// At 99b340a the replay ended with nothing to say so.
func TestV2SocketResumeReplayComplete(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a := dialTenant(t, e.g, e.tokens["ide"])
	m := a.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep)
	var init struct {
		Meta struct {
			Acpgate struct {
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	a.mustResult(m, &init)
	if init.Meta.Acpgate.ResumeToken == "" {
		t.Fatalf("no _meta.acpgate.resumeToken in the initialize result: %s", m.raw)
	}
	var sess struct{ SessionID string }
	a.mustResult(a.call("session/new", map[string]any{"cwd": e.roots["ide"], "mcpServers": []any{}}, attachStep), &sess)
	sid := sess.SessionID
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "ticks 3"}}}, attachStep), &struct{}{})
	a.waitMsg(0, "the idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.Update.State == "idle"
	})
	missed := a.count(func(peerMsg) bool { return true }) - 2 // all but initialize's and session/new's answers
	_ = a.ws.CloseNow()                                       // no close frame: the connection is kept for a resume
	a.cancel()
	<-a.stopped

	q := "?resume=" + url.QueryEscape(init.Meta.Acpgate.ResumeToken) + "&received=2"
	b := dialURL(t, e.g.url()+q, "acp", "acp.bearer."+e.tokens["ide"])
	defer b.close()
	i, _ := b.waitMsg(0, "replay_complete", 10*time.Second, func(m peerMsg) bool {
		return m.Method == "session/update" && strings.Contains(string(m.Params), `"replay_complete"`)
	})
	b.mu.Lock()
	first, got := b.msgs[0], b.msgs[i]
	b.mu.Unlock()
	if first.Method != "_acpgate/resumed" {
		t.Errorf("the resumed socket's first message: %s", first.raw)
	}
	if i != 1+missed {
		t.Errorf("replay_complete is message %d, want %d: after the %d replayed\n%s", i, 1+missed, missed, b.dump())
	}
	b.checkSession(got, sid)
}

// The drain waits for v2 turns over Streamable HTTP too: five SDK v2
// clients (v2-client.mjs, createHttpStream) mid-way through a 1.5 s turn
// when the gateway gets SIGTERM each get the idle end_turn with all 15
// ticks. (At 99b340a no turn was running once acknowledged: the admin API
// never listed one.)
func TestV2DrainWaitsForIdleHTTP(t *testing.T) {
	const clients = 5
	adminToken := "admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	adminSum := sha256.Sum256([]byte(adminToken))
	e := startV2Gateway(t, fmt.Sprintf("admin: {tokens_sha256: [%q]}\n", hex.EncodeToString(adminSum[:])), map[string]string{"ide": ""})
	runs := make([]*nodeRun, clients)
	done := make(chan int, clients)
	for i := range clients {
		go func() {
			runs[i] = e.runV2Client(t, "ide", e.urls()["http"], "long 15")
			done <- i
		}()
	}
	// SIGTERM once every turn runs, as the admin API sees them.
	running := func() int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.g.Addr+"/v1/admin/sessions", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		var list struct{ Sessions []struct{ State string } }
		_ = json.NewDecoder(resp.Body).Decode(&list)
		n := 0
		for _, s := range list.Sessions {
			if s.State == "running" {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for running() < clients && time.Now().Before(deadline) && len(done) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	n := running()
	start := time.Now()
	e.g.stop(t)
	for range clients {
		<-done
	}
	if n < clients {
		t.Errorf("%d of %d turns running (admin API) when the gateway got SIGTERM, want all", n, clients)
	}
	delivered := 0
	for i, r := range runs {
		if lines := r.find("idle", ""); r.err == nil && len(lines) == 1 {
			var idle v2Idle
			mustUnmarshal(t, lines[0].Params, &idle)
			if idle.Update.StopReason == "end_turn" && ticks(t, r) == 15 {
				delivered++
				continue
			}
		}
		t.Logf("client %d: no idle end_turn after 15 ticks: exit %v\n%s", i, r.err, r.dump())
	}
	t.Logf("%d of %d idle end_turn delivered over Streamable HTTP; the drain took %v", delivered, clients, time.Since(start).Round(time.Millisecond))
	if delivered != clients {
		t.Errorf("the drain delivered %d of %d idle end_turn, want all", delivered, clients)
	}
}

// Several clients on one v2 session: an attached client hears
// turn_complete when the owner's v2 turn goes idle, not at its
// acknowledgement, and its own prompt, sent mid-turn, waits for that idle
// update before it goes to the agent (the gateway's per-session queue). At
// 99b340a turn_complete came at the acknowledgement, and the second prompt
// went to the agent at once.
func TestV2SharedSessionTurn(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, sid := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "b", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	b.mustResult(b.call("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none", "clientId": "b",
		"clientInfo": map[string]any{"name": "b", "version": "1"}}, attachStep), &struct{}{})

	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "long 5"}}}, attachStep), &struct{}{})
	b.waitMsg(0, "the owner's first tick", 10*time.Second, func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 1 "`) })
	b.send(map[string]any{"jsonrpc": "2.0", "id": 99, "method": "session/prompt", "params": map[string]any{"sessionId": sid,
		"prompt": []any{map[string]any{"type": "text", "text": "ticks 1"}}}})
	isIdle := func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.Update.State == "idle"
	}
	idle, _ := b.waitMsg(0, "the owner's idle update", 10*time.Second, isIdle)
	lastTick, _ := b.waitMsg(0, "the owner's fifth tick", time.Second, func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 5 "`) })
	done, _ := b.waitMsg(0, "turn_complete", 10*time.Second, isUpdate("turn_complete"))
	ack, _ := b.waitMsg(0, "the answer to its own prompt", 10*time.Second, func(m peerMsg) bool { return m.Method == "" && string(m.ID) == "99" })
	b.waitMsg(idle+1, "its own turn's idle update", 10*time.Second, isIdle)
	if done < lastTick {
		t.Errorf("turn_complete (message %d) came before the owner's last tick (message %d)\n%s", done, lastTick, b.dump())
	}
	if ack < idle {
		t.Errorf("the second client's prompt was answered (message %d) before the owner's turn went idle (message %d): it did not wait\n%s", ack, idle, b.dump())
	}
}

// A client attached to a v2 session gets its subagent's child too: the
// subagent_update and the child's own updates, under the child's sealed
// ID. At 99b340a the child's updates were dropped for every client.
func TestV2AttachedClientGetsChild(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, sid := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "b", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	b.mustResult(b.call("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none", "clientId": "b",
		"clientInfo": map[string]any{"name": "b", "version": "1"}}, attachStep), &struct{}{})
	from := b.count(func(peerMsg) bool { return true })
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "subagent"}}}, attachStep), &struct{}{})
	b.waitMsg(from, "the parent's idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == sid && u.Update.State == "idle"
	})
	var updates []json.RawMessage
	for _, raw := range b.updatesSince(from) {
		var u struct {
			Update struct{ SessionUpdate string } `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		if !slices.Contains(attachOnlyKinds, u.Update.SessionUpdate) { // prompt_received, turn_complete: the attached client's own
			updates = append(updates, raw)
		}
	}
	checkChild(t, true, sid, updates, b.dump)
}

// A child follows its parent when another connection of the same subject
// takes the parent over from a detached connection mid-turn: the child is
// the new connection's (its session/status answers there), and the turn's
// rest, the child's news included, reaches it. Without the move, the child
// stayed with the detached connection: -32002 for the new one.
func TestV2TakeoverMovesChild(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, parent := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": parent, "prompt": []any{map[string]any{"type": "text", "text": "subagent 20"}}}, attachStep), &struct{}{})
	a.waitMsg(0, "the parent's first tick", 10*time.Second, func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 1 "`) })
	child := ""
	for _, raw := range a.updatesSince(0) {
		var u struct {
			Update struct{ SessionUpdate, SessionID string } `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		if u.Update.SessionUpdate == "subagent_update" {
			child = u.Update.SessionID
		}
	}
	if child == "" {
		t.Fatalf("no subagent_update\n%s", a.dump())
	}
	_ = a.ws.CloseNow() // no close frame: a detaches, its turn runs on
	a.cancel()
	<-a.stopped

	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "b", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	var res struct {
		Meta struct {
			Acpgate struct{ Turn string } `json:"acpgate"`
		} `json:"_meta"`
	}
	b.mustResult(b.call("session/resume", map[string]any{"sessionId": parent, "cwd": e.roots["ide"]}, attachStep), &res)
	if res.Meta.Acpgate.Turn != "running" {
		t.Fatalf("session/resume of the detached parent: turn %q, want a take-over of the running turn\n%s", res.Meta.Acpgate.Turn, b.dump())
	}
	var st struct{ Status string }
	b.mustResult(b.call("session/status", map[string]any{"sessionId": child}, attachStep), &st)
	if st.Status != "open" {
		t.Errorf("session/status on the child after the take-over: %q, want open", st.Status)
	}
	b.waitMsg(0, "the parent's idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == parent && u.Update.State == "idle"
	})
}

// A v2 turn whose agent reports requires_action (its permission request
// waits for the client) is in flight as requires_action: a client that
// attaches then is told so (_meta.acpgate.turn), and the turn ends at its
// idle update once the owner answers. At 99b340a the turn had ended at its
// acknowledgement: "idle".
func TestV2RequiresAction(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, sid := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "permission"}}}, attachStep), &struct{}{})
	_, req := a.waitMsg(0, "the permission request", 10*time.Second, func(m peerMsg) bool { return m.Method == "session/request_permission" })

	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "b", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	var att struct {
		Meta struct {
			Acpgate struct{ Turn string } `json:"acpgate"`
		} `json:"_meta"`
	}
	b.mustResult(b.call("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none", "clientId": "b",
		"clientInfo": map[string]any{"name": "b", "version": "1"}}, attachStep), &att)
	if att.Meta.Acpgate.Turn != "requires_action" {
		t.Errorf("session/attach while the permission request waits: turn %q, want requires_action", att.Meta.Acpgate.Turn)
	}
	a.answerPermission(req, "allow_once")
	a.waitMsg(0, "the idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.Update.State == "idle" && u.Update.StopReason == "end_turn"
	})
}

// v2Admin calls the admin API at addr with token; out, if set, gets the
// JSON answer. It returns the status code.
func v2Admin(t *testing.T, addr, token, method, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+"/v1/admin/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// An administrator ending a session mid-way through a v2 turn cancels the
// turn: the agent gets session/cancel and the client the turn's idle
// update, stopReason cancelled, well before its 20 ticks, then
// _acpgate/session_ended. At 99b340a the turn had ended, for the gateway,
// at its acknowledgement: nothing was cancelled and the agent ticked on.
func TestV2AdminEndCancelsTurn(t *testing.T) {
	adminToken := "admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	adminSum := sha256.Sum256([]byte(adminToken))
	e := startV2Gateway(t, fmt.Sprintf("admin: {tokens_sha256: [%q]}\n", hex.EncodeToString(adminSum[:])), map[string]string{"ide": ""})
	a, sid := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]any{"type": "text", "text": "long 20"}}}, attachStep), &struct{}{})
	a.waitMsg(0, "the first tick", 10*time.Second, func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick 1 "`) })
	if code := v2Admin(t, e.g.Addr, adminToken, http.MethodDelete, "sessions/"+url.PathEscape(sid), nil); code/100 != 2 {
		t.Fatalf("DELETE the session: %d", code)
	}
	_, m := a.waitMsg(0, "the idle update", 10*time.Second, func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.Update.State == "idle"
	})
	var idle v2Idle
	a.decode(m.Params, &idle)
	ticked := a.count(func(m peerMsg) bool { return strings.Contains(string(m.Params), `"tick `) })
	if idle.Update.StopReason != "cancelled" || ticked >= 20 {
		t.Errorf("the ended session's turn: stopReason %q after %d of 20 ticks, want cancelled before the 20th\n%s", idle.Update.StopReason, ticked, a.dump())
	}
	a.waitMsg(0, "_acpgate/session_ended", 10*time.Second, func(m peerMsg) bool { return m.Method == "_acpgate/session_ended" })
}
