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

// An agent a reload adds does not hold readiness until it has had a
// process ready: a broken one leaves the replica serving the others. And
// a Streamable HTTP connection opened on /acp keeps its agent when a
// reload changes default_agent.
func TestReloadKeepsServing(t *testing.T) {
	ts := startServer(t, withAgents(t, "a", "a", "b"))
	defer ts.shutdown()
	ts.waitReady()
	c := &httpClient{t: t, ts: ts, hc: &http.Client{}}
	resp, body := c.do(http.MethodPost, map[string]string{"Content-Type": "application/json"}, httpInit)
	if c.conn = resp.Header.Get(ConnectionIDHeader); resp.StatusCode != 200 || !strings.Contains(body, `"result"`) {
		t.Fatalf("initialize on /acp: %d %s", resp.StatusCode, body)
	}
	cur := ts.s.config()
	next := *cur
	next.Agents = cloneAgents(cur)
	broken := *next.Agents["a"]
	broken.Command = []string{"/nonexistent/agent"}
	next.Agents["broken"] = &broken
	next.DefaultAgent = "b"
	if err := ts.s.Reload(&next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the broken agent's first start to fail", func() bool {
		st, ok := ts.s.relay.AgentStatus("broken")
		return ok && !st.Ready
	})
	if code, body := ts.get("/readyz"); code != 200 {
		t.Errorf("/readyz with a broken agent added by a reload: %d %q, want 200", code, body)
	}
	// The connection opened on /acp (agent a) is still a's.
	code, body := c.post(nil, `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`)
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Errorf("POST on /acp after default_agent changed: %d %s", code, body)
	}
	h := ts.s.links.httpConn(c.conn)
	if h == nil || h.agent != "a" {
		t.Errorf("the connection's agent changed: %+v", h)
	}
}
