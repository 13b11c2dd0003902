package gateway

import (
	"io"
	"maps"
	"net/http"
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

// GET /v1/agents lists the tenant's agents; a page on an allowed origin
// may read it, and its preflight is answered.
func TestAgentsListCORS(t *testing.T) {
	ts := startServer(t, func(c *config.Config) {
		withTenant(t)(c)
		withAgents(t, "a", "a", "b")(c)
		c.Tenants[0].Agents = []string{"b"}
		c.Auth.AllowedOrigins = []string{"https://ide.example.com"}
	})
	defer ts.shutdown()
	req, _ := http.NewRequest(http.MethodOptions, "http://"+ts.addr+"/v1/agents", nil)
	req.Header.Set("Origin", "https://ide.example.com")
	req.Header.Set("Access-Control-Request-Method", "GET")
	resp, err := ts.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "https://ide.example.com" {
		t.Errorf("preflight: %d, allow-origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	req, _ = http.NewRequest(http.MethodGet, "http://"+ts.addr+"/v1/agents", nil)
	req.Header.Set("Origin", "https://ide.example.com")
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = ts.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://ide.example.com" ||
		!strings.Contains(string(body), `"name":"b"`) || strings.Contains(string(body), `"name":"a"`) {
		t.Errorf("GET: %d, allow-origin %q, %s (want only agent b)", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), body)
	}
	if code, _ := ts.get("/v1/agents"); code != http.StatusUnauthorized {
		t.Errorf("without a token: %d, want 401", code)
	}
}
