package gateway

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/gateway/config"
)

// withAgents configures named agents (each the demo agent, this test
// binary, with state of its own) and the default.
func withAgents(t *testing.T, def string, names ...string) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents = map[string]*config.NamedAgent{}
		for _, n := range names {
			a := &config.NamedAgent{Agent: c.Agent, Pool: c.Pool}
			a.Env = map[string]string{"ACPGATE_TEST_AGENT": "demo", "ACPGATE_TEST_STATE": t.TempDir()}
			c.Agents[n] = a
		}
		c.DefaultAgent = def
	}
}

func cloneAgents(c *config.Config) map[string]*config.NamedAgent {
	m := maps.Clone(c.Agents)
	for k, v := range m {
		cp := *v
		m[k] = &cp
	}
	return m
}

// A reload adds and removes agents and changes their policy; any other
// change to a running agent is refused.
func TestReloadAgents(t *testing.T) {
	ts := startServer(t, withAgents(t, "a", "a", "b"))
	defer ts.shutdown()
	ts.waitReady()
	cur := ts.s.config()

	next := *cur
	next.Agents = cloneAgents(cur)
	next.Agents["a"].Pool.MaxProcesses++
	if err := ts.s.Reload(&next); err == nil || !strings.Contains(err.Error(), "agents a: settings other than policy need a restart") {
		t.Fatalf("a pool change of a running agent: %v", err)
	}

	next = *cur
	next.Agents = cloneAgents(cur)
	load := false
	next.Agents["a"].Policy.Session.Load = &load
	c := *next.Agents["b"]
	next.Agents["c"] = &c
	delete(next.Agents, "b")
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("adding c, removing b, a's policy: %v", err)
	}
	if ts.s.relay.AgentPool("c") == nil {
		t.Fatal("agent c has no pool after the reload")
	}
	if code, _ := ts.get("/acp/b"); code != 404 {
		t.Errorf("GET /acp/b after its removal: %d, want 404", code)
	}
	waitFor(t, 20*time.Second, "agent b drained", func() bool { return ts.s.relay.AgentPool("b") == nil })
	if ts.s.relay.AgentPool("a") == nil {
		t.Error("agent a lost in the reload")
	}
	_, body := ts.get("/v1/agents")
	if !strings.Contains(body, `"name":"a"`) || !strings.Contains(body, `"name":"c"`) || strings.Contains(body, `"name":"b"`) {
		t.Errorf("/v1/agents after the reload: %s", body)
	}
	waitFor(t, 20*time.Second, "ready with agents a and c", func() bool { code, _ := ts.get("/readyz"); return code == 200 })
	_, body = ts.get("/metrics")
	for _, want := range []string{`acpgate_drains_in_progress{kind="agent"} 0`, `acpgate_drains_in_progress{kind="gateway"} 0`,
		`acpgate_agent_processes{agent="c",state="ready"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(body, "acpgate_drains"))
		}
	}
}
