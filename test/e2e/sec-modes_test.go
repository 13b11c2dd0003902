package e2e

// Issue #36, finding 6 of the review at 99b340a: the model allow-list
// holds under pipelining. A client that sends session/load, a switch to a
// forbidden model and a prompt back to back, before the load is answered,
// must not get a turn on the forbidden model: what it sends about the
// session waits until the gateway knows the session's model (and has
// switched it), then is checked in order. Over WebSocket and Streamable
// HTTP, with test/fakeagent offering FAKE_MODELS.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// slowLoad makes the fake agent answer a load 300 ms late: what the
// client pipelines after it reaches the gateway first, over either
// transport.
const slowLoad = `, FAKE_LOAD_DELAY_MS: "300"`

// pipeAwait reads p until every request in ids is answered, and returns
// the answers by id and the text of the agent's message chunks meanwhile.
func pipeAwait(t *testing.T, p subjPeer, ids ...int) (map[int]rpcMsg, string) {
	t.Helper()
	answers := map[int]rpcMsg{}
	var text strings.Builder
	deadline := time.Now().Add(modelWait)
	for len(answers) < len(ids) {
		m, ok := p.recv(time.Until(deadline))
		if !ok {
			t.Fatalf("answers to %v: got only %d within %s", ids, len(answers), modelWait)
		}
		if m.Method == "session/update" {
			if u := parseUpdate(t, m); u.Update.Kind == "agent_message_chunk" {
				text.WriteString(u.text())
			}
			continue
		}
		if m.Method != "" {
			t.Fatalf("unexpected: %.500s", m.Raw)
		}
		var id int
		if _, err := fmt.Sscan(string(m.ID), &id); err != nil {
			t.Fatalf("answer with id %s: %.300s", m.ID, m.Raw)
		}
		answers[id] = m
	}
	return answers, text.String()
}

// ranOn is the model the agent said the turn that said said ran on ("":
// it did not run).
func ranOn(text, said string) string {
	m := regexp.MustCompile(regexp.QuoteMeta("You said: "+said) + ` \[model ([^\]]+)\]`).FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// pipeSession makes a session on g's agent with a connection that leaves,
// then returns a new connection over tr: the load that follows is its
// first word about the session.
func pipeSession(t *testing.T, g *gateway, dial func(*testing.T, *gateway, string) subjPeer) (string, subjPeer) {
	t.Helper()
	c := dialInit(t, g)
	sid := c.newSession(t.TempDir())
	c.Close()
	return sid, dial(t, g, "")
}

// pipeline sends p session/load of sid, the switches, and a prompt saying
// said, back to back, and returns the answers by request (load, each
// switch, prompt) and the agent's text meanwhile; the load must pass.
func pipeline(t *testing.T, p subjPeer, sid, said string, switches ...rpcCall) ([]rpcMsg, string) {
	t.Helper()
	ids := []int{p.request("session/load", loadParams(sid))}
	for _, sw := range switches {
		ids = append(ids, p.request(sw.method, sw.params))
	}
	ids = append(ids, p.request("session/prompt", textPrompt(sid, said)))
	got, text := pipeAwait(t, p, ids...)
	if got[ids[0]].Error != nil {
		t.Fatalf("load: %s", got[ids[0]].Raw)
	}
	out := make([]rpcMsg, len(ids))
	for i, id := range ids {
		out[i] = got[id]
	}
	return out, text
}

// rpcCall is a request to send: its method and params.
type rpcCall struct {
	method string
	params map[string]any
}

// The review's attack: session/load, set_config_option(model=forbidden-x)
// (and session/set_model) and session/prompt back to back. The switch is
// refused, the agent never hears of it, and the prompt runs on allowed-a.
func TestModelAllowListPipelined(t *testing.T) {
	g := modelGateway(t, "allowed-a,forbidden-x", "config", `["allowed-*"]`, slowLoad)
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			sid, p := pipeSession(t, g, tr.dial)
			said := "pipelined after load over " + tr.name
			got, text := pipeline(t, p, sid, said,
				rpcCall{"session/set_model", map[string]any{"sessionId": sid, "modelId": "forbidden-x"}},
				rpcCall{"session/set_config_option", map[string]any{"sessionId": sid, "configId": "model", "value": "forbidden-x"}})
			if got[1].Error == nil {
				t.Errorf("session/set_model to forbidden-x passed: %s", got[1].Raw)
			}
			wantError(t, got[2], -32602, string(got[2].ID), `model "forbidden-x" is not allowed by the gateway policy (policy.models.allow: "allowed-*")`)
			if stopReason(t, got[3]) != "end_turn" {
				t.Errorf("prompt: %s", got[3].Raw)
			}
			if m := ranOn(text, said); m != "allowed-a" {
				t.Errorf("the pipelined prompt ran on %q, want allowed-a (agent said %q)", m, text)
			}
			for _, line := range []string{"fakeagent: set_config_option model=forbidden-x", "fakeagent: set_model forbidden-x"} {
				if n := g.agentLogged(line); n != 0 {
					t.Errorf("the agent got the forbidden switch (%q) %d times", line, n)
				}
			}
		})
	}
}

// A session the agent keeps on a model a reload has since forbidden: the
// prompt pipelined after its load runs after the gateway's switch, on the
// allowed model.
func TestModelAllowListPipelinedStoredModel(t *testing.T) {
	g := modelGateway(t, "allowed-a,forbidden-x", "config", `null`, slowLoad)
	var sids []string
	for range subjTransports { // one session per transport, on forbidden-x
		c := dialInit(t, g)
		sid := c.newSession(t.TempDir())
		m := c.Call("session/set_config_option", map[string]any{"sessionId": sid, "configId": "model", "value": "forbidden-x"}, modelWait)
		if m.Error != nil {
			t.Fatalf("switch with no list: %s", m.Raw)
		}
		c.Close()
		sids = append(sids, sid)
	}
	_ = g.reloadPolicy(t, `["allowed-*"]`)
	for i, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			sid, p := sids[i], tr.dial(t, g, "")
			said := "stored on forbidden over " + tr.name
			got, text := pipeline(t, p, sid, said)
			if stopReason(t, got[1]) != "end_turn" {
				t.Errorf("prompt: %s", got[1].Raw)
			}
			if m := ranOn(text, said); m != "allowed-a" {
				t.Errorf("the pipelined prompt ran on %q, want allowed-a (agent said %q)", m, text)
			}
		})
	}
}

// Held messages of a load that fails get a clear error, never a hang:
// the agent never gets the prompt.
func TestModelAllowListPipelinedFailedLoad(t *testing.T) {
	cfg := fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: sessions, FAKE_MODELS: \"allowed-a,forbidden-x\"%s}, stop_grace: 1s}\n", fakeAgentBin(t), slowLoad) +
		"pool: {min_idle: 1, max_processes: 1}\npolicy: {session: {load: true, delete: true}, models: {allow: [\"allowed-*\"]}}\n"
	g := startGateway(t, gwOpts{config: cfg})
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			sid, p := pipeSession(t, g, tr.dial)
			del := dialInit(t, g) // the agent forgets the session: its load fails
			if m := del.Call("session/delete", map[string]any{"sessionId": sid}, modelWait); m.Error != nil {
				t.Fatalf("delete: %s", m.Raw)
			}
			said := "after a failed load over " + tr.name
			load := p.request("session/load", loadParams(sid))
			prompt := p.request("session/prompt", textPrompt(sid, said))
			got, _ := pipeAwait(t, p, load, prompt)
			if got[load].Error == nil {
				t.Fatalf("the load of a deleted session passed: %s", got[load].Raw)
			}
			wantError(t, got[prompt], -32600, fmt.Sprint(prompt), "session/prompt was not sent: the gateway held it until session "+sid+" was established, and it was not (the session failed to load)")
			for _, r := range g.Logs() {
				if r["msg"] == "agent stderr" && strings.Contains(fmt.Sprint(r["line"]), said) {
					t.Errorf("the agent got the prompt: %v", r["line"])
				}
			}
		})
	}
}

// Unknown is not allowed: under a model allow-list, a session whose agent
// reports no model runs no turn, and the client is told why.
func TestModelAllowListUnknownModel(t *testing.T) {
	cfg := fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: sessions}, stop_grace: 1s}\n", fakeAgentBin(t)) +
		"pool: {min_idle: 1, max_processes: 1}\npolicy: {models: {allow: [\"allowed-*\"]}}\n"
	g := startGateway(t, gwOpts{config: cfg})
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.dial(t, g, "")
			got, _ := pipeAwait(t, p, p.request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}))
			var created struct {
				SessionID string `json:"sessionId"`
			}
			for _, m := range got {
				if m.Error != nil || json.Unmarshal(m.Result, &created) != nil {
					t.Fatalf("session/new: %s", m.Raw)
				}
			}
			said := "no model known over " + tr.name
			id := p.request("session/prompt", textPrompt(created.SessionID, said))
			got, _ = pipeAwait(t, p, id)
			wantError(t, got[id], -32600, fmt.Sprint(id), `the gateway could not learn which model this session runs on (the agent did not report it), and the gateway policy restricts models (policy.models.allow: "allowed-*")`)
			for _, r := range g.Logs() {
				if r["msg"] == "agent stderr" && strings.Contains(fmt.Sprint(r["line"]), said) {
					t.Errorf("the agent got the prompt: %v", r["line"])
				}
			}
		})
	}
}

// modeGateway starts a gateway whose agent is the fake agent offering
// modes (FAKE_MODES, the first its sessions' mode) in shape, behind a
// policy allowing allow (YAML flow list) of them.
func modeGateway(t *testing.T, modes, shape, allow string) *gateway {
	t.Helper()
	cfg := fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: sessions, FAKE_MODES: %q, FAKE_MODE_SHAPE: %q%s}, stop_grace: 1s}\n",
		fakeAgentBin(t), modes, shape, slowLoad) +
		"pool: {min_idle: 1, max_processes: 1}\npolicy: {modes: {allow: " + allow + "}}\n"
	return startGateway(t, gwOpts{config: cfg})
}

// shownModes is what a result shows of a session's modes: the modes
// object's current mode and modes, the mode config option's.
func shownModes(t *testing.T, result json.RawMessage) (objCur string, obj []string, optCur string, opt []string) {
	t.Helper()
	var r struct {
		Modes *struct {
			CurrentModeID  string `json:"currentModeId"`
			AvailableModes []struct {
				ID string `json:"id"`
			} `json:"availableModes"`
		} `json:"modes"`
		ConfigOptions []struct {
			Category     string `json:"category"`
			CurrentValue string `json:"currentValue"`
			Options      []struct {
				Value string `json:"value"`
			} `json:"options"`
		} `json:"configOptions"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		t.Fatalf("%v: %s", err, result)
	}
	if r.Modes != nil {
		objCur = r.Modes.CurrentModeID
		for _, m := range r.Modes.AvailableModes {
			obj = append(obj, m.ID)
		}
	}
	for _, o := range r.ConfigOptions {
		if o.Category == "mode" {
			optCur = o.CurrentValue
			for _, v := range o.Options {
				opt = append(opt, v.Value)
			}
		}
	}
	return objCur, obj, optCur, opt
}

// modeOf is the mode the agent said the turn that said said ran in.
func modeOf(text, said string) string {
	m := regexp.MustCompile(regexp.QuoteMeta("You said: "+said) + ` \[mode ([^\]]+)\]`).FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// policy.modes.allow keeps bypassPermissions and acceptEdits away from
// clients: the agent's sessions start in bypassPermissions and are
// switched before the client hears of them; clients see only the allowed
// modes, in the modes object and the mode config option; a switch to
// another is refused and never reaches the agent.
func TestModeAllowList(t *testing.T) {
	const offered = "bypassPermissions,default,acceptEdits,plan"
	for _, shape := range []string{"both", "modes", "config"} {
		t.Run(shape, func(t *testing.T) {
			g := modeGateway(t, offered, shape, `["default", "plan"]`)
			p := subjWS{dialInit(t, g)}
			id := p.request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}})
			got, _ := pipeAwait(t, p, id)
			m := got[id]
			if m.Error != nil {
				t.Fatalf("session/new: %s", m.Raw)
			}
			sid := m.NewSessionID()
			objCur, obj, optCur, opt := shownModes(t, m.Result)
			if shape != "config" && (objCur != "default" || strings.Join(obj, ",") != "default,plan") {
				t.Errorf("modes object: current %q, modes %q: %s", objCur, obj, m.Result)
			}
			if shape != "modes" && (optCur != "default" || strings.Join(opt, ",") != "default,plan") {
				t.Errorf("mode option: current %q, values %q: %s", optCur, opt, m.Result)
			}
			switchLine := "fakeagent: set_config_option mode=default"
			if shape == "modes" {
				switchLine = "fakeagent: set_mode default"
			}
			g.WaitLog(t, "agent stderr", "line", switchLine, modelWait)

			said := "first turn"
			id = p.request("session/prompt", textPrompt(sid, said))
			got, text := pipeAwait(t, p, id)
			if stopReason(t, got[id]) != "end_turn" || modeOf(text, said) != "default" {
				t.Errorf("the first turn ran in %q: %s", modeOf(text, said), got[id].Raw)
			}

			for _, req := range []struct {
				method string
				params map[string]any
				line   string
			}{
				{"session/set_mode", map[string]any{"sessionId": sid, "modeId": "bypassPermissions"}, "fakeagent: set_mode bypassPermissions"},
				{"session/set_config_option", map[string]any{"sessionId": sid, "configId": "mode", "value": "acceptEdits"}, "fakeagent: set_config_option mode=acceptEdits"},
			} {
				id := p.request(req.method, req.params)
				got, _ := pipeAwait(t, p, id)
				bad := req.params["modeId"]
				if bad == nil {
					bad = req.params["value"]
				}
				wantError(t, got[id], -32602, fmt.Sprint(id), fmt.Sprintf(`mode %q is not allowed by the gateway policy (policy.modes.allow: "default", "plan")`, bad))
				if n := g.agentLogged(req.line); n != 0 {
					t.Errorf("the agent got the refused switch %q", req.line)
				}
			}

			id = p.request("session/set_mode", map[string]any{"sessionId": sid, "modeId": "plan"})
			if got, _ := pipeAwait(t, p, id); got[id].Error != nil {
				t.Fatalf("allowed switch: %s", got[id].Raw)
			}
			said = "after the switch"
			id = p.request("session/prompt", textPrompt(sid, said))
			got, text = pipeAwait(t, p, id)
			if stopReason(t, got[id]) != "end_turn" || modeOf(text, said) != "plan" {
				t.Errorf("after the allowed switch the turn ran in %q", modeOf(text, said))
			}
		})
	}
}

// The pipelined attack with modes: session/load, session/set_mode and
// set_config_option(mode) to bypassPermissions, and a prompt, back to
// back: both switches are refused and the prompt runs in the allowed
// mode the gateway switched the session to.
func TestModeAllowListPipelined(t *testing.T) {
	g := modeGateway(t, "bypassPermissions,default", "both", `["default"]`)
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			sid, p := pipeSession(t, g, tr.dial)
			said := "pipelined modes over " + tr.name
			got, text := pipeline(t, p, sid, said,
				rpcCall{"session/set_mode", map[string]any{"sessionId": sid, "modeId": "bypassPermissions"}},
				rpcCall{"session/set_config_option", map[string]any{"sessionId": sid, "configId": "mode", "value": "bypassPermissions"}})
			for _, m := range got[1:3] {
				wantError(t, m, -32602, string(m.ID), `mode "bypassPermissions" is not allowed by the gateway policy (policy.modes.allow: "default")`)
			}
			if stopReason(t, got[3]) != "end_turn" {
				t.Errorf("prompt: %s", got[3].Raw)
			}
			if m := modeOf(text, said); m != "default" {
				t.Errorf("the pipelined prompt ran in %q, want default (agent said %q)", m, text)
			}
			for _, line := range []string{"fakeagent: set_mode bypassPermissions", "fakeagent: set_config_option mode=bypassPermissions"} {
				if n := g.agentLogged(line); n != 0 {
					t.Errorf("the agent got the forbidden switch (%q) %d times", line, n)
				}
			}
		})
	}
}

// policy.modes.allow reloads like the rest of policy: a session made in
// bypassPermissions with no list runs its turns there; after a reload
// allowing only default, its live holder's next prompt is refused, saying
// why, and a load (a prompt pipelined behind it) switches it to default
// first.
func TestModeAllowListReload(t *testing.T) {
	g := modeGateway(t, "bypassPermissions,default", "both", `null`)
	c := subjWS{dialInit(t, g)}
	id := c.request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}})
	got, _ := pipeAwait(t, c, id)
	sid := got[id].NewSessionID()
	id = c.request("session/prompt", textPrompt(sid, "before the reload"))
	if got, text := pipeAwait(t, c, id); stopReason(t, got[id]) != "end_turn" || modeOf(text, "before the reload") != "bypassPermissions" {
		t.Fatalf("with no list the turn ran in %q", modeOf(text, "before the reload"))
	}
	_ = g.reloadList(t, "modes", `["default"]`)
	id = c.request("session/prompt", textPrompt(sid, "after the reload"))
	got, _ = pipeAwait(t, c, id)
	wantError(t, got[id], -32600, fmt.Sprint(id), `this session runs on mode "bypassPermissions", which the gateway policy does not allow (policy.modes.allow: "default"); switch it to an allowed mode first`)
	c.Close()

	p := subjWS{dialInit(t, g)}
	got2, text := pipeline(t, p, sid, "loaded after the reload")
	if stopReason(t, got2[1]) != "end_turn" || modeOf(text, "loaded after the reload") != "default" {
		t.Errorf("after the load the turn ran in %q", modeOf(text, "loaded after the reload"))
	}
	g.WaitLog(t, "agent stderr", "line", "fakeagent: set_config_option mode=default", modelWait)
}

// A permission option named after a mode outside the list (as
// claude-code-acp's "Always Allow", optionId acceptEdits, which switches
// the session into it) is not passed on when a client picks it: the agent
// hears the request was cancelled. Another option passes.
func TestModeAllowListPermissionOption(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			g := modeGateway(t, "default,acceptEdits", "both", `["default"]`) // its own log
			p := tr.dial(t, g, "")
			id := p.request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}})
			got, _ := pipeAwait(t, p, id)
			sid := got[id].NewSessionID()
			for _, c := range []struct{ option, want, stop string }{
				{"acceptEdits", "fakeagent: permission answered cancelled ", "cancelled"},
				{"allow", "fakeagent: permission answered selected allow", "end_turn"},
			} {
				id := p.request("session/prompt", textPrompt(sid, "permission please, "+tr.name+" "+c.option))
				answer := subjAwait(t, p, "prompt", id, func(m rpcMsg) {
					if m.Method == "session/request_permission" {
						p.respond(m, map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": c.option}})
					}
				})
				if got := stopReason(t, answer); got != c.stop {
					t.Errorf("picking %s: stopReason %q, want %q", c.option, got, c.stop)
				}
				g.WaitLog(t, "agent stderr", "line", c.want, modelWait) // stderr comes apart from stdout, in order
			}
			if n := g.agentLogged("fakeagent: permission answered selected acceptEdits"); n != 0 {
				t.Errorf("the agent got the acceptEdits answer %d times", n)
			}
		})
	}
}

// A prompt that waited its turn in a shared session while the session's
// owner sent session/load again is not sent when its turn comes: the load
// closed the gate, the gateway no longer knows the session's model, and
// the prompt was checked against the model before it (unknown is not
// allowed). It gets a clear error; it never reaches the agent during the
// load.
func TestModelAllowListQueuedPromptDuringLoad(t *testing.T) {
	g := modelGateway(t, "allowed-a,forbidden-x", "config", `["allowed-*"]`, `, FAKE_LOAD_DELAY_MS: "1500"`)
	for attempt := 1; ; attempt++ {
		owner := dialInit(t, g)
		sid := owner.newSession(t.TempDir())
		member := dialInit(t, g)
		if m := member.Call("session/attach", attachParams(sid, "member", false), turn); m.Error != nil {
			t.Fatalf("attach: %s", m.Raw)
		}
		running := owner.Request("session/prompt", textPrompt(sid, "trickle 1"))
		if m := owner.Next(5 * time.Second); m.Method != "session/update" { // its first chunk: the turn is on
			t.Fatalf("the owner's turn: %s", m.Raw)
		}
		said := fmt.Sprintf("queued behind the owner's turn, attempt %d", attempt)
		queued := member.Request("session/prompt", textPrompt(sid, said))
		time.Sleep(300 * time.Millisecond) // the member's prompt waits its turn before the load goes
		held := g.CountLogs("held until the session is established", "method", "session/prompt")
		load := owner.Request("session/load", loadParams(sid))
		owner.Await(load, 15*time.Second, func(m rpcMsg) {
			if m.IsResponseTo(running) && m.Error != nil {
				t.Errorf("the owner's turn: %s", m.Raw)
			}
		})
		m := member.Await(queued, 15*time.Second, func(rpcMsg) {})
		if m.Error == nil && g.CountLogs("held until the session is established", "method", "session/prompt") > held && attempt < 3 {
			// The member's prompt reached the gateway after the load after
			// all (a loaded machine): the gate held it, rightly, and it
			// ran once the load was done. Try again.
			owner.Close()
			member.Close()
			continue
		}
		if m.Error == nil || !strings.Contains(m.Error.Message, "was being loaded again when its turn came") {
			t.Fatalf("the queued prompt: %s; want it refused while the load runs", m.Raw)
		}
		for _, r := range g.Logs() {
			if line, _ := r["line"].(string); r["msg"] == "agent stderr" && strings.HasSuffix(line, " "+said) {
				t.Fatalf("the agent got the queued prompt: %s", line)
			}
		}
		return
	}
}
