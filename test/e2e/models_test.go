package e2e

// The model allow-list (issue #32, policy.models.allow) on the real
// binary, with test/fakeagent advertising its models (FAKE_MODELS) in each
// shape: a v1 config option of category model, the v2 draft's shape
// (configId, grouped options), the older models API, and both. Each
// case fails without the feature: the client would see the models outside
// the list, its switch to one would reach the agent, and the session
// would run on the agent's first model.

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const modelWait = 20 * time.Second

// modelGateway starts a gateway whose agent is the fake agent offering
// models (FAKE_MODELS, comma-separated, the first its sessions' model) in
// shape, behind a policy allowing allow (YAML flow list).
func modelGateway(t *testing.T, models, shape, allow string, extraEnv string) *gateway {
	t.Helper()
	cfg := fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: sessions, FAKE_MODELS: %q, FAKE_MODEL_SHAPE: %q%s}, stop_grace: 1s}\n",
		fakeAgentBin(t), models, shape, extraEnv) +
		"pool: {min_idle: 1, max_processes: 1}\npolicy: {models: {allow: " + allow + "}}\n"
	return startGateway(t, gwOpts{config: cfg})
}

// selectors is what a result or config_option_update shows of a session's
// models.
type selectors struct {
	ConfigOptions []struct {
		ID           string            `json:"id"`
		ConfigID     string            `json:"configId"`
		Category     string            `json:"category"`
		CurrentValue string            `json:"currentValue"`
		Options      []json.RawMessage `json:"options"`
		Meta         json.RawMessage   `json:"_meta"`
	} `json:"configOptions"`
	Models *struct {
		CurrentModelID  string `json:"currentModelId"`
		AvailableModels []struct {
			ModelID string `json:"modelId"`
		} `json:"availableModels"`
	} `json:"models"`
}

func parseSelectors(t *testing.T, raw json.RawMessage) selectors {
	t.Helper()
	var s selectors
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return s
}

// modelOption is the model config option's current value and values
// (groups flattened); ok false: none.
func (s selectors) modelOption(t *testing.T) (cur string, values []string, ok bool) {
	t.Helper()
	for _, o := range s.ConfigOptions {
		if o.Category != "model" {
			continue
		}
		for _, raw := range o.Options {
			var e struct {
				Value   *string `json:"value"`
				Options []struct {
					Value string `json:"value"`
				} `json:"options"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			if e.Value != nil {
				values = append(values, *e.Value)
			}
			for _, v := range e.Options {
				values = append(values, v.Value)
			}
		}
		return o.CurrentValue, values, true
	}
	return "", nil, false
}

// apiModels is the models API's current model and models.
func (s selectors) apiModels() (cur string, values []string, ok bool) {
	if s.Models == nil {
		return "", nil, false
	}
	for _, m := range s.Models.AvailableModels {
		values = append(values, m.ModelID)
	}
	return s.Models.CurrentModelID, values, true
}

// agentLogged counts the fake agent's stderr lines equal to line.
func (g *gateway) agentLogged(line string) int { return g.CountLogs("agent stderr", "line", line) }

// promptModel runs a turn and returns the model the agent says it ran on.
func promptModel(t *testing.T, c *client, sid string) string {
	t.Helper()
	var text strings.Builder
	m := c.Await(c.Request("session/prompt", textPrompt(sid, "hi")), modelWait, func(m rpcMsg) {
		if m.Method == "session/update" {
			text.WriteString(parseUpdate(t, m).text())
		}
	})
	if stopReason(t, m) != "end_turn" {
		t.Fatalf("prompt: %s", m.Raw)
	}
	_, model, ok := strings.Cut(text.String(), "[model ")
	if !ok {
		t.Fatalf("the agent did not say its model: %q", text.String())
	}
	return strings.TrimSuffix(model, "]")
}

func TestModelAllowList(t *testing.T) {
	const offered = "claude-opus-4,claude-haiku-3,claude-sonnet-4,claude-sonnet-4-5"
	allowed := []string{"claude-sonnet-4", "claude-sonnet-4-5"}
	for _, shape := range []string{"config", "v2", "api", "both"} {
		t.Run(shape, func(t *testing.T) {
			g := modelGateway(t, offered, shape, `["claude-sonnet-*"]`, "")
			c := dialInit(t, g)
			var updates []rpcMsg
			collect := func(m rpcMsg) {
				if m.Method != "session/update" {
					t.Fatalf("unexpected: %s", m.Raw)
				}
				updates = append(updates, m)
			}

			// session/new: the list filtered; the agent switched from its
			// first model (opus) to the first allowed one before the
			// client got the result, which says so.
			m := c.Await(c.Request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}), modelWait, collect)
			if m.Error != nil {
				t.Fatalf("session/new: %s", m.Raw)
			}
			sid := m.NewSessionID()
			res := parseSelectors(t, m.Result)
			if shape != "api" {
				cur, values, ok := res.modelOption(t)
				if !ok || cur != "claude-sonnet-4" || !slices.Equal(values, allowed) {
					t.Errorf("session/new model option: current %q values %q: %s", cur, values, m.Result)
				}
				if len(res.ConfigOptions) != 2 || string(res.ConfigOptions[1].Meta) != `{"fake":"kept"}` {
					t.Errorf("the mode option or the model option's _meta did not pass: %s", m.Result)
				}
			}
			if shape == "api" || shape == "both" {
				cur, values, ok := res.apiModels()
				if !ok || cur != "claude-sonnet-4" || !slices.Equal(values, allowed) {
					t.Errorf("session/new models: current %q values %q: %s", cur, values, m.Result)
				}
			}
			switchLine := "fakeagent: set_config_option model=claude-sonnet-4"
			if shape == "api" {
				switchLine = "fakeagent: set_model claude-sonnet-4"
			}
			g.WaitLog(t, "agent stderr", "line", switchLine, modelWait)
			if got := promptModel(t, c, sid); got != "claude-sonnet-4" {
				t.Errorf("the first turn ran on %q", got)
			}

			// The update the agent sent for the switch came before the
			// result (the session is the client's from the agent's answer
			// on: nothing the agent says of it meanwhile is lost), filtered.
			if len(updates) == 0 {
				t.Error("the agent's config_option_update during the switch did not reach the client")
			}
			for _, u := range updates {
				var p struct {
					Update selectors `json:"update"`
				}
				_ = json.Unmarshal(u.Params, &p)
				if cur, values, ok := p.Update.modelOption(t); ok && (cur != "claude-sonnet-4" || !slices.Equal(values, allowed)) {
					t.Errorf("config_option_update: %s", u.Raw)
				}
			}

			if shape == "api" {
				// session/set_model is not let through by the policy: the
				// allow-list is the second gate.
				m := c.Call("session/set_model", map[string]any{"sessionId": sid, "modelId": "claude-opus-4"}, modelWait)
				wantErrorCode(t, "session/set_model", m, -32601)
				return
			}

			// A switch to a model outside the list: -32602 naming the
			// model and the list; the agent never hears of it and its
			// model is unchanged.
			id := c.Request("session/set_config_option", map[string]any{"sessionId": sid, "configId": "model", "value": "claude-opus-4"})
			m = c.Await(id, modelWait, collect)
			wantError(t, m, -32602, fmt.Sprint(id), `model "claude-opus-4" is not allowed by the gateway policy (policy.models.allow: "claude-sonnet-*")`)
			if n := g.agentLogged("fakeagent: set_config_option model=claude-opus-4"); n != 0 {
				t.Errorf("the agent got the refused switch %d times", n)
			}
			if got := promptModel(t, c, sid); got != "claude-sonnet-4" {
				t.Errorf("after the refused switch the turn ran on %q", got)
			}

			// An allowed switch: the result and the config_option_update
			// the agent sends show only the allowed models.
			updates = updates[:0]
			params := map[string]any{"sessionId": sid, "configId": "model", "value": "claude-sonnet-4-5"}
			if shape == "v2" {
				params["type"] = "id"
			}
			m = c.Await(c.Request("session/set_config_option", params), modelWait, collect)
			if m.Error != nil {
				t.Fatalf("allowed switch: %s", m.Raw)
			}
			if cur, values, _ := parseSelectors(t, m.Result).modelOption(t); cur != "claude-sonnet-4-5" || !slices.Equal(values, allowed) {
				t.Errorf("set_config_option result: %s", m.Result)
			}
			if len(updates) != 1 {
				t.Fatalf("want the agent's config_option_update, got %d updates", len(updates))
			}
			var p struct {
				Update selectors `json:"update"`
			}
			_ = json.Unmarshal(updates[0].Params, &p)
			if cur, values, ok := p.Update.modelOption(t); !ok || cur != "claude-sonnet-4-5" || !slices.Equal(values, allowed) {
				t.Errorf("config_option_update: %s", updates[0].Raw)
			}
			if got := promptModel(t, c, sid); got != "claude-sonnet-4-5" {
				t.Errorf("after the allowed switch the turn ran on %q", got)
			}

			// session/load of the session (its model allowed now): no
			// switch, the list filtered.
			c2 := dialInit(t, g)
			m = c2.Await(c2.Request("session/load", map[string]any{"sessionId": sid, "cwd": t.TempDir(), "mcpServers": []any{}}), modelWait, func(rpcMsg) {})
			if m.Error == nil {
				if cur, values, _ := parseSelectors(t, m.Result).modelOption(t); cur != "claude-sonnet-4-5" || !slices.Equal(values, allowed) {
					t.Errorf("session/load result: %s", m.Result)
				}
			}
		})
	}
}

// A session whose agent offers no allowed model is refused, saying why;
// one whose model is allowed already is not switched; a load of a session
// whose model the policy no longer allows (another gateway made it) is
// switched before it is answered.
func TestModelAllowListSession(t *testing.T) {
	t.Run("no allowed model", func(t *testing.T) {
		g := modelGateway(t, "claude-opus-4,claude-haiku-3", "config", `["claude-sonnet-*"]`, "")
		c := dialInit(t, g)
		id := c.Request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}})
		m := c.Await(id, modelWait, nil)
		wantError(t, m, -32602, fmt.Sprint(id), `session refused: the agent offers no model that the gateway policy allows (offered: "claude-opus-4", "claude-haiku-3"; policy.models.allow: "claude-sonnet-*")`)
		// The tenant's session slot and the process's are back: sessions
		// keep being refused the same way, never for a quota.
		for range 3 {
			id := c.Request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}})
			wantError(t, c.Await(id, modelWait, nil), -32602, fmt.Sprint(id), "session refused")
		}
	})
	t.Run("allowed already", func(t *testing.T) {
		g := modelGateway(t, "claude-sonnet-4,claude-opus-4", "both", `["claude-sonnet-*"]`, "")
		c := dialInit(t, g)
		m := c.Call("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}, modelWait)
		if m.Error != nil {
			t.Fatalf("session/new: %s", m.Raw)
		}
		res := parseSelectors(t, m.Result)
		cur, values, _ := res.modelOption(t)
		acur, avalues, _ := res.apiModels()
		if cur != "claude-sonnet-4" || acur != "claude-sonnet-4" || !slices.Equal(values, []string{"claude-sonnet-4"}) || !slices.Equal(avalues, values) {
			t.Errorf("result: %s", m.Result)
		}
		if got := promptModel(t, c, m.NewSessionID()); got != "claude-sonnet-4" {
			t.Errorf("ran on %q", got)
		}
		for _, r := range g.Logs() {
			if r["msg"] == "agent stderr" && strings.Contains(fmt.Sprint(r["line"]), "set_") {
				t.Errorf("the agent was switched: %v", r["line"])
			}
		}
	})
	t.Run("load switches", func(t *testing.T) {
		// The agent's sessions start on opus; one made with no list stays
		// on it; after a reload to sonnet only, loading it switches it.
		g := modelGateway(t, "claude-opus-4,claude-sonnet-4", "config", `null`, "")
		c := dialInit(t, g)
		sid := c.newSession(t.TempDir())
		if got := promptModel(t, c, sid); got != "claude-opus-4" {
			t.Fatalf("with no list the session runs on %q", got)
		}
		c.Close()
		_ = g.reloadPolicy(t, `["claude-sonnet-*"]`)
		c2 := dialInit(t, g)
		m := c2.Await(c2.Request("session/load", map[string]any{"sessionId": sid, "cwd": t.TempDir(), "mcpServers": []any{}}), modelWait, func(rpcMsg) {})
		if m.Error != nil {
			t.Fatalf("load: %s", m.Raw)
		}
		if cur, values, _ := parseSelectors(t, m.Result).modelOption(t); cur != "claude-sonnet-4" || !slices.Equal(values, []string{"claude-sonnet-4"}) {
			t.Errorf("load result: %s", m.Result)
		}
		g.WaitLog(t, "agent stderr", "line", "fakeagent: set_config_option model=claude-sonnet-4", modelWait)
		if got := promptModel(t, c2, sid); got != "claude-sonnet-4" {
			t.Errorf("after the load the turn ran on %q", got)
		}
	})
}

// Hostile: model IDs made of glob metacharacters are never patterns; a
// huge options list is filtered; duplicate IDs.
func TestModelAllowListHostile(t *testing.T) {
	t.Run("metacharacters", func(t *testing.T) {
		g := modelGateway(t, "*,claude-sonnet-[4],claude-sonnet-?,claude-sonnet-4", "config", `["claude-sonnet-4"]`, "")
		c := dialInit(t, g)
		m := c.Call("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}, modelWait)
		if m.Error != nil {
			t.Fatalf("session/new: %s", m.Raw)
		}
		sid := m.NewSessionID()
		if cur, values, _ := parseSelectors(t, m.Result).modelOption(t); cur != "claude-sonnet-4" || !slices.Equal(values, []string{"claude-sonnet-4"}) {
			t.Errorf("result: %s", m.Result)
		}
		for _, v := range []string{"*", "claude-sonnet-?", "claude-sonnet-[4]"} {
			id := c.Request("session/set_config_option", map[string]any{"sessionId": sid, "configId": "model", "value": v})
			wantError(t, c.Await(id, modelWait, nil), -32602, fmt.Sprint(id), "is not allowed by the gateway policy")
			if n := g.agentLogged("fakeagent: set_config_option model=" + v); n != 0 {
				t.Errorf("the agent got %q", v)
			}
		}
		if got := promptModel(t, c, sid); got != "claude-sonnet-4" {
			t.Errorf("ran on %q", got)
		}
	})
	t.Run("huge list", func(t *testing.T) {
		// 20,000 models offered after opus (the sessions' model) and
		// sonnet: the one allowed is sonnet.
		g := modelGateway(t, "claude-opus-4,claude-sonnet-4", "v2", `["claude-sonnet-*"]`, `, FAKE_MODELS_PAD: "20000"`)
		c := dialInit(t, g)
		m := c.Await(c.Request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}), modelWait, func(rpcMsg) {})
		if m.Error != nil {
			t.Fatalf("session/new: %.300s", m.Raw)
		}
		if cur, values, _ := parseSelectors(t, m.Result).modelOption(t); cur != "claude-sonnet-4" || !slices.Equal(values, []string{"claude-sonnet-4"}) {
			t.Errorf("result: %.500s", m.Result)
		}
		if len(m.Raw) > 4096 {
			t.Errorf("the filtered result is %d bytes", len(m.Raw))
		}
		if got := promptModel(t, c, m.NewSessionID()); got != "claude-sonnet-4" {
			t.Errorf("ran on %q", got)
		}
	})
	t.Run("duplicate IDs", func(t *testing.T) {
		g := modelGateway(t, "claude-opus-4,claude-sonnet-4,claude-opus-4,claude-sonnet-4", "both", `["claude-sonnet-*"]`, "")
		c := dialInit(t, g)
		m := c.Await(c.Request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}), modelWait, func(rpcMsg) {})
		if m.Error != nil {
			t.Fatalf("session/new: %s", m.Raw)
		}
		res := parseSelectors(t, m.Result)
		want := []string{"claude-sonnet-4", "claude-sonnet-4"}
		if cur, values, _ := res.modelOption(t); cur != "claude-sonnet-4" || !slices.Equal(values, want) {
			t.Errorf("config option: %s", m.Result)
		}
		if cur, values, _ := res.apiModels(); cur != "claude-sonnet-4" || !slices.Equal(values, want) {
			t.Errorf("models: %s", m.Result)
		}
		id := c.Request("session/set_config_option", map[string]any{"sessionId": m.NewSessionID(), "configId": "model", "value": "claude-opus-4"})
		wantError(t, c.Await(id, modelWait, func(rpcMsg) {}), -32602, fmt.Sprint(id), "not allowed")
	})
}

// reloadPolicy rewrites the gateway's policy.models.allow (a YAML flow
// list) in its configuration file and reloads it (SIGHUP).
func (g *gateway) reloadPolicy(t *testing.T, allow string) string {
	t.Helper()
	return g.reloadList(t, "models", allow)
}

// reloadList is reloadPolicy for policy.<key>.allow (models or modes), the
// configuration's last line.
func (g *gateway) reloadList(t *testing.T, key, allow string) string {
	t.Helper()
	path := g.Cmd.Args[slices.Index(g.Cmd.Args, "--config")+1]
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head, _, ok := strings.Cut(string(old), "policy: {"+key+": {allow: ")
	if !ok {
		t.Fatalf("no %s policy in %s", key, old)
	}
	cfg := head + "policy: {" + key + ": {allow: " + allow + "}}\n"
	writeFile(t, path, []byte(cfg))
	n := g.CountLogs("configuration reloaded", "", "")
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.waitMoreLogs(t, "configuration reloaded", n, modelWait)
	return cfg
}
