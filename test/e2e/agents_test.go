package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/proctree"
)

// The agents suite runs several named agents behind one gateway (issue
// #16): the built-in demo agent, a second demo agent started with its own
// arguments (so its processes can be told apart, while it shares the demo
// agent's session store), and the fake agent (test/fakeagent, whose
// agentInfo differs). Each is reachable at /acp/<name> and /acp serves the
// default; unknown and forbidden agents are refused before the upgrade;
// GET /v1/agents lists a tenant's agents; session IDs are sealed to their
// agent; every agent has its own pool, metrics and processes; and a SIGHUP
// adds and removes agents while the others carry on.

// demo2Flag marks the second demo agent's processes on their command line
// (the demo agent's --chunk-delay, to a value nothing else uses).
const demo2Flag = "--chunk-delay=1ms"

// agentsConfig is a gateway with the named agents (agents is the YAML
// indented under agents:, default_agent demo) and both tenants; allowed
// gives a tenant's agents list (a tenant not in it may use every agent).
func (e *isoEnv) agentsConfig(agents string, allowed map[string][]string, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "session_key_file: %q\nagents:\n%sdefault_agent: demo\ntenants:\n", e.keyFile, agents)
	for _, name := range tenantNames {
		sum := sha256.Sum256([]byte(e.tokens[name]))
		fmt.Fprintf(&b, "  - name: %s\n    tokens_sha256: [%q]\n    root: %q\n    virtual_root: %s\n",
			name, hex.EncodeToString(sum[:]), e.roots[name], vroot)
		if l, ok := allowed[name]; ok {
			fmt.Fprintf(&b, "    agents: [%s]\n", strings.Join(l, ", "))
		}
	}
	b.WriteString(extra)
	return b.String()
}

// demoAgentWith is the YAML of an agent entry running the demo agent with
// flag (so that its processes can be found by it).
func demoAgentWith(name, flag string) string {
	return fmt.Sprintf("  %s: {command: [%q, demo-agent, %q], stop_grace: 1s}\n", name, binPath, flag)
}

// fakeAgent is the YAML of an agent entry running the fake agent.
func fakeAgent(t *testing.T, name string) string {
	return fmt.Sprintf("  %s: {command: [%q], stop_grace: 1s}\n", name, fakeAgentBin(t))
}

// dialAgent connects to path (as the tenant of token; "" = none) and
// initializes; it returns the client and the agentInfo.name the
// initialize answer carried.
func dialAgent(t *testing.T, g *gateway, path, token string) (*client, string) {
	t.Helper()
	var h http.Header
	if token != "" {
		h = bearer(token)
	}
	c, resp, err := dialWith(t, g, path, h, []string{"acp"})
	if err != nil {
		t.Fatalf("dial %s: %v (%s)", path, err, respText(resp))
	}
	res := c.initialize()
	info, _ := res["agentInfo"].(map[string]any)
	name, _ := info["name"].(string)
	return c, name
}

// connAgent is the agent the gateway logged for connection id.
func (g *gateway) connAgent(t *testing.T, id string) string {
	t.Helper()
	g.WaitLog(t, "connection opened", "conn", id, 10*time.Second)
	for _, r := range g.Logs() {
		if r["msg"] == "connection opened" && r["conn"] == id {
			s, _ := r["agent"].(string)
			return s
		}
	}
	return ""
}

// httpDo sends one plain HTTP request to path and returns the response
// with its body read.
func httpDo(t *testing.T, g *gateway, method, path, token, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, method, "http://"+g.Addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// openStream opens the event stream of an HTTP connection at path; the
// returned channel is closed when the gateway ends the stream.
func openStream(t *testing.T, ctx context.Context, g *gateway, path, token, conn string) <-chan struct{} {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Acp-Connection-Id", conn)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(r)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("GET %s (event stream): %d", path, resp.StatusCode)
	}
	ended := make(chan struct{})
	go func() { // ends with the body
		defer close(ended)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	return ended
}

const httpInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`

// wantJSONRefusal asserts an HTTP refusal with status and the JSON body
// {"error": reason, "message": ...}, made before any connection existed
// (no Acp-Connection-Id).
func wantJSONRefusal(t *testing.T, what string, resp *http.Response, body string, status int, reason string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("%s: status %d, want %d; body %q", what, resp.StatusCode, status, body)
	}
	var e struct{ Error, Message string }
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error != reason || e.Message == "" {
		t.Fatalf("%s: body %q, want {\"error\": %q, \"message\": ...}", what, body, reason)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q", what, ct)
	}
	if id := resp.Header.Get("Acp-Connection-Id"); id != "" {
		t.Errorf("%s: a refusal carries Acp-Connection-Id %q", what, id)
	}
}

// listedAgent is one entry of GET /v1/agents.
type listedAgent struct {
	Name            string          `json:"name"`
	AgentInfo       json.RawMessage `json:"agentInfo"`
	ProtocolVersion int             `json:"protocolVersion"`
	Ready           bool            `json:"ready"`
	Default         bool            `json:"default"`
}

func (a listedAgent) infoName() string {
	var info struct{ Name string }
	_ = json.Unmarshal(a.AgentInfo, &info)
	return info.Name
}

// listAgents gets /v1/agents as the tenant of token and returns its
// entries; any status but 200 fails the test.
func listAgents(t *testing.T, g *gateway, token string) []listedAgent {
	t.Helper()
	resp, body := httpDo(t, g, http.MethodGet, "/v1/agents", token, "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/agents: %d %q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("GET /v1/agents: Content-Type %q", ct)
	}
	var out struct {
		Agents []listedAgent `json:"agents"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || out.Agents == nil {
		t.Fatalf("GET /v1/agents: %v: %q", err, body)
	}
	return out.Agents
}

func agentNames(l []listedAgent) []string {
	var out []string
	for _, a := range l {
		out = append(out, a.Name)
	}
	return out
}

// waitAgentsListed polls /v1/agents as token until it lists exactly names,
// every one ready with protocol version 1 and the agentInfo name infos
// gives it (the newest initialize answer of its pool), and only def marked
// default.
func waitAgentsListed(t *testing.T, g *gateway, token, def string, names []string, infos map[string]string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := listAgents(t, g, token)
		problem := ""
		if got := agentNames(l); !slices.Equal(got, names) {
			t.Fatalf("/v1/agents lists %v, want %v", got, names)
		}
		for _, a := range l {
			switch {
			case !a.Ready || a.ProtocolVersion != 1 || a.infoName() != infos[a.Name]:
				problem = fmt.Sprintf("%s: ready %v, protocolVersion %d, agentInfo %s; want ready, 1, name %q",
					a.Name, a.Ready, a.ProtocolVersion, a.AgentInfo, infos[a.Name])
			case a.Default != (a.Name == def):
				t.Fatalf("%s: default %v (the default agent is %s)", a.Name, a.Default, def)
			}
		}
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/agents after 30 s: %s", problem)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// demoStore maps the demo agent's stored sessions (agent session ID) to
// the directory that holds them, below the sandbox homes of the state dir.
func demoStore(t *testing.T, g *gateway) map[string]string {
	t.Helper()
	out := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(g.stateDir, "homes", "*", "tmp", "acpgate-demo-agent", "*.json"))
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = filepath.Dir(f)
	}
	return out
}

// newStored runs f and returns the one session it added to the demo
// agents' store, and where.
func newStored(t *testing.T, g *gateway, f func()) (id, dir string) {
	t.Helper()
	before := demoStore(t, g)
	f()
	for k, d := range demoStore(t, g) {
		if _, old := before[k]; !old {
			if id != "" {
				t.Fatalf("more than one new stored session (%s, %s)", id, k)
			}
			id, dir = k, d
		}
	}
	if id == "" {
		t.Fatal("no new session in the demo agents' store")
	}
	return id, dir
}

func loadParams(sid string) map[string]any {
	return map[string]any{"sessionId": sid, "cwd": vroot, "mcpServers": []any{}}
}

// metricValue is the sum of the samples of name whose labels hold every
// one of labels, and whether there was one.
func metricValue(m map[string]float64, name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for k, v := range m {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(k, l)
		}
		if all {
			sum += v
			found = true
		}
	}
	return sum, found
}

// ---------------------------------------------------------------------------

// TestAgents runs the demo agent (default), a second demo agent and the
// fake agent behind one gateway with two tenants: acme may use every agent,
// globex only demo.
func TestAgents(t *testing.T) {
	e := newIsoEnv(t)
	// fake has policy keys of its own: no extension methods (the global
	// policy allows _demo/*).
	agents := "  demo: {}\n" + demoAgentWith("demo2", demo2Flag) +
		fmt.Sprintf("  fake: {command: [%q], stop_grace: 1s, policy: {extensions: {allow: []}}}\n", fakeAgentBin(t))
	g := startGateway(t, gwOpts{config: e.agentsConfig(agents, map[string][]string{"globex": {"demo"}}, "pool: {min_idle: 1}\n"+policyAllowDemo)})
	waitReady(t, g, 60*time.Second)
	acmeTok, globexTok := e.tokens["acme"], e.tokens["globex"]
	infos := map[string]string{"demo": "acpgate-demo-agent", "demo2": "acpgate-demo-agent", "fake": "fakeagent"}

	t.Run("each agent at its path completes a turn; /acp is the default", func(t *testing.T) {
		for _, tc := range []struct{ path, agent string }{
			{"/acp/demo", "demo"}, {"/acp/demo2", "demo2"}, {"/acp/fake", "fake"}, {"/acp", "demo"},
		} {
			c, info := dialAgent(t, g, tc.path, acmeTok)
			if info != infos[tc.agent] {
				t.Errorf("%s: initialize says agentInfo.name %q, want %q (agent %s)", tc.path, info, infos[tc.agent], tc.agent)
			}
			if got := g.connAgent(t, c.ConnID); got != tc.agent {
				t.Errorf("%s: the gateway put the connection on agent %q, want %q", tc.path, got, tc.agent)
			}
			sid := c.newSession(vroot)
			text := "hello via " + tc.path
			if got := promptOK(t, c, sid, text); got != "You said: "+text {
				t.Errorf("%s: the turn streamed %q", tc.path, got)
			}
			c.Close()
		}
		// Each agent ran processes of its own command.
		if len(g.agentProcs(fakeAgentBin(t))) == 0 || len(g.agentProcs(demo2Flag)) == 0 {
			t.Errorf("missing agent processes: fake %v, demo2 %v", g.agentProcs(fakeAgentBin(t)), g.agentProcs(demo2Flag))
		}
		// The same over Streamable HTTP: initialize on /acp/fake is the
		// fake agent's answer.
		resp, body := httpDo(t, g, http.MethodPost, "/acp/fake", acmeTok, httpInit, nil)
		if resp.StatusCode != 200 || resp.Header.Get("Acp-Connection-Id") == "" || !strings.Contains(body, `"name":"fakeagent"`) {
			t.Fatalf("POST initialize to /acp/fake: %d %q", resp.StatusCode, body)
		}
		conn := resp.Header.Get("Acp-Connection-Id")
		// The connection belongs to fake: another agent's path does not
		// know it.
		list := `{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}`
		if resp, body := httpDo(t, g, http.MethodPost, "/acp/demo", acmeTok, list, map[string]string{"Acp-Connection-Id": conn}); resp.StatusCode != 404 {
			t.Errorf("fake's HTTP connection used on /acp/demo: %d %q", resp.StatusCode, body)
		}
		if resp, body := httpDo(t, g, http.MethodDelete, "/acp/fake", acmeTok, "", map[string]string{"Acp-Connection-Id": conn}); resp.StatusCode != 202 {
			t.Errorf("DELETE /acp/fake: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("unknown agent 404, forbidden agent 403, before any upgrade", func(t *testing.T) {
		refusedBefore, _ := metricValue(g.metrics(t), "acpgate_auth_failures_total", `reason="agent_not_allowed"`)
		opened := g.CountLogs("connection opened", "", "")
		// WebSocket: an HTTP answer instead of 101.
		refused(t, g, "/acp/nope", bearer(acmeTok), []string{"acp"}, 404, "unknown_agent", acmeTok)
		refused(t, g, "/acp/nope", bearer(globexTok), []string{"acp"}, 404, "unknown_agent", globexTok)
		refused(t, g, "/acp/fake", bearer(globexTok), []string{"acp"}, 403, "agent_not_allowed", globexTok)
		refused(t, g, "/acp/demo2", bearer(globexTok), []string{"acp"}, 403, "agent_not_allowed", globexTok)
		// Authentication comes first: no credentials is 401 whatever the
		// agent.
		refused(t, g, "/acp/nope", nil, []string{"acp"}, 401, "missing_token")
		refused(t, g, "/acp/fake", nil, []string{"acp"}, 401, "missing_token")
		// Streamable HTTP: POST (initialize), GET (stream) and DELETE.
		for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			hdr := map[string]string{}
			body := ""
			switch m {
			case http.MethodPost:
				body = httpInit
			case http.MethodGet:
				hdr["Accept"] = "text/event-stream"
				hdr["Acp-Connection-Id"] = "00000000-0000-4000-8000-000000000000"
			case http.MethodDelete:
				hdr["Acp-Connection-Id"] = "00000000-0000-4000-8000-000000000000"
			}
			resp, b := httpDo(t, g, m, "/acp/nope", acmeTok, body, hdr)
			wantJSONRefusal(t, m+" /acp/nope as acme", resp, b, 404, "unknown_agent")
			resp, b = httpDo(t, g, m, "/acp/fake", globexTok, body, hdr)
			wantJSONRefusal(t, m+" /acp/fake as globex", resp, b, 403, "agent_not_allowed")
			if resp, b := httpDo(t, g, m, "/acp/nope", "", body, hdr); resp.StatusCode != 401 {
				t.Errorf("%s /acp/nope without credentials: %d %q, want 401", m, resp.StatusCode, b)
			}
		}
		if n := g.CountLogs("connection opened", "", ""); n != opened {
			t.Errorf("%d connections were opened by refused requests", n-opened)
		}
		if v, _ := metricValue(g.metrics(t), "acpgate_auth_failures_total", `reason="agent_not_allowed"`); v-refusedBefore != 5 {
			t.Errorf("acpgate_auth_failures_total{reason=\"agent_not_allowed\"} rose by %g, want 5 (2 upgrades, 3 HTTP)", v-refusedBefore)
		}
		// globex's own agent is served, at its path and at /acp.
		for _, path := range []string{"/acp/demo", "/acp"} {
			c, info := dialAgent(t, g, path, globexTok)
			if info != "acpgate-demo-agent" {
				t.Errorf("globex at %s: agentInfo %q", path, info)
			}
			c.Close()
		}
		resp, body := httpDo(t, g, http.MethodPost, "/acp", globexTok, httpInit, nil)
		if resp.StatusCode != 200 || resp.Header.Get("Acp-Connection-Id") == "" {
			t.Fatalf("POST initialize to /acp as globex: %d %q", resp.StatusCode, body)
		}
		httpDo(t, g, http.MethodDelete, "/acp", globexTok, "", map[string]string{"Acp-Connection-Id": resp.Header.Get("Acp-Connection-Id")})
	})

	t.Run("/v1/agents lists the tenant's agents", func(t *testing.T) {
		waitAgentsListed(t, g, acmeTok, "demo", []string{"demo", "demo2", "fake"}, infos)
		waitAgentsListed(t, g, globexTok, "demo", []string{"demo"}, infos)
		for _, tok := range []string{"", "acme-not-a-token", acmeTok[:len(acmeTok)-1] + "x"} {
			resp, body := httpDo(t, g, http.MethodGet, "/v1/agents", tok, "", nil)
			if resp.StatusCode != 401 || strings.Contains(body, "demo") {
				t.Errorf("GET /v1/agents with token %q: %d %q, want 401 without the list", tok, resp.StatusCode, body)
			}
		}
	})

	t.Run("a session ID is sealed to its agent: -32002 on another", func(t *testing.T) {
		demo, _ := dialAgent(t, g, "/acp/demo", acmeTok)
		demo2, _ := dialAgent(t, g, "/acp/demo2", acmeTok)
		fake, _ := dialAgent(t, g, "/acp/fake", acmeTok)
		var sid, sid2 string
		agentSID, dir := newStored(t, g, func() { sid = demo.newSession(vroot) })
		agentSID2, dir2 := newStored(t, g, func() { sid2 = demo2.newSession(vroot) })
		// Both demo agents keep their sessions in the one store (the
		// tenant's home): were the ID to open on the other agent, that agent
		// would load the session. Only the seal stops it.
		if dir != dir2 {
			t.Fatalf("the two demo agents keep sessions apart (%s, %s): the case proves nothing", dir, dir2)
		}
		t.Logf("demo session %s, demo2 session %s, both in %s", agentSID, agentSID2, dir)
		promptOK(t, demo, sid, "a turn of demo's")
		promptOK(t, demo2, sid2, "a turn of demo2's")
		fakeSID := fake.newSession(vroot)
		for _, tc := range []struct {
			name string
			c    *client
			sid  string
		}{
			{"demo's session on demo2", demo2, sid},
			{"demo2's session on demo", demo, sid2},
			{"demo's session on fake", fake, sid},
			{"fake's session on demo", demo, fakeSID},
		} {
			m := tc.c.Call("session/prompt", textPrompt(tc.sid, "hijack"), turn)
			wantError(t, m, -32002, strconv.Itoa(tc.c.NextID), "session not found")
			if tc.c != fake { // the fake agent cannot load sessions
				m = tc.c.Call("session/load", loadParams(tc.sid), turn)
				wantError(t, m, -32002, strconv.Itoa(tc.c.NextID), "session not found")
			}
			if t.Failed() {
				t.Fatalf("%s was not refused", tc.name)
			}
		}
		// The refusals cost the connections nothing.
		promptOK(t, demo, sid, "still mine")
		promptOK(t, demo2, sid2, "still mine too")
		promptOK(t, fake, fakeSID, "and mine")
		// On its own agent each ID still works, on any connection: demo's
		// through /acp (the default agent, the same scope), demo2's through
		// a new /acp/demo2 connection (the load moves the session there).
		for _, tc := range []struct{ path, sid, turn string }{{"/acp", sid, "still mine"}, {"/acp/demo2", sid2, "still mine too"}} {
			c, _ := dialAgent(t, g, tc.path, acmeTok)
			replay, got := collectText(t, tc.sid)
			m := c.Await(c.Request("session/load", loadParams(tc.sid)), turn, replay)
			if m.Error != nil {
				t.Fatalf("session/load of its own agent's session at %s: %s", tc.path, m.Raw)
			}
			if !strings.Contains(got.String(), "You said: "+tc.turn) {
				t.Errorf("the load at %s replayed %q", tc.path, got.String())
			}
			promptOK(t, c, tc.sid, "loaded at "+tc.path)
			c.Close()
		}
	})

	t.Run("a resume token is bound to its agent", func(t *testing.T) {
		c, resp, err := dialWith(t, g, "/acp/demo2", bearer(acmeTok), []string{"acp"})
		if err != nil {
			t.Fatalf("dial /acp/demo2: %v (%s)", err, respText(resp))
		}
		var meta struct {
			Acpgate struct {
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		}
		b, _ := json.Marshal(c.initialize()["_meta"])
		if json.Unmarshal(b, &meta) != nil || meta.Acpgate.ResumeToken == "" {
			t.Fatalf("no _meta.acpgate.resumeToken in the initialize result: %s", b)
		}
		sid := c.newSession(vroot)
		c.Kill() // no close frame: the connection is kept for a resume
		q := "?resume=" + url.QueryEscape(meta.Acpgate.ResumeToken) + "&received=2"
		for _, path := range []string{"/acp/demo", "/acp", "/acp/fake"} {
			wantResumeRefused(t, g, bearer(acmeTok), path+q, "demo2's token at "+path)
		}
		// Refused elsewhere, the token still resumes at its own agent.
		r, resp, err := dialWith(t, g, "/acp/demo2"+q, bearer(acmeTok), []string{"acp"})
		if err != nil {
			t.Fatalf("resume at /acp/demo2 after the refusals: %v (%s)", err, respText(resp))
		}
		if m := r.Next(10 * time.Second); m.Method != "_acpgate/resumed" {
			t.Fatalf("resume: the first message is %s", m.Raw)
		}
		if got := promptOK(t, r, sid, "resumed on demo2"); got != "You said: resumed on demo2" {
			t.Errorf("a turn after the resume streamed %q", got)
		}
		r.Close()
	})

	t.Run("an agent's policy keys apply to it alone", func(t *testing.T) {
		for _, path := range []string{"/acp/demo", "/acp/demo2"} {
			c, _ := dialAgent(t, g, path, acmeTok)
			echoOK(t, c)
			c.Close()
		}
		c, _ := dialAgent(t, g, "/acp/fake", acmeTok)
		m := c.Call("_demo/echo", map[string]any{"k": "v"}, turn)
		wantError(t, m, -32601, strconv.Itoa(c.NextID), `"_demo/echo" is not allowed by the gateway policy`)
		c.Close()
	})

	t.Run("metrics carry every agent's series", func(t *testing.T) {
		// A connection, a session and a turn on each agent, held during
		// the scrape, and an HTTP connection to fake.
		for _, agent := range []string{"demo", "demo2", "fake"} {
			c, _ := dialAgent(t, g, "/acp/"+agent, acmeTok)
			promptOK(t, c, c.newSession(vroot), "counted on "+agent)
		}
		resp, body := httpDo(t, g, http.MethodPost, "/acp/fake", acmeTok, httpInit, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("POST initialize to /acp/fake: %d %q", resp.StatusCode, body)
		}
		defer httpDo(t, g, http.MethodDelete, "/acp/fake", acmeTok, "", map[string]string{"Acp-Connection-Id": resp.Header.Get("Acp-Connection-Id")})
		m := g.metrics(t)
		if v, ok := metricValue(m, "acpgate_connections_open", `agent="fake"`, `tenant="acme"`, `transport="http"`); !ok || v != 1 {
			t.Errorf("acpgate_connections_open{agent=\"fake\",tenant=\"acme\",transport=\"http\"} is %g (exposed: %v), want 1", v, ok)
		}
		for _, agent := range []string{"demo", "demo2", "fake"} {
			a := `agent="` + agent + `"`
			for _, s := range []struct {
				name   string
				labels []string
			}{
				{"acpgate_agent_processes", []string{a}},
				{"acpgate_agent_spawns_total", []string{a}},
				{"acpgate_sessions_active", []string{a, `tenant="acme"`}},
				{"acpgate_connections_open", []string{a, `tenant="acme"`, `transport="websocket"`}},
				{"acpgate_messages_total", []string{a, `method="session/prompt"`}},
			} {
				if v, ok := metricValue(m, s.name, s.labels...); !ok || v < 1 {
					t.Errorf("%s{%s} is %g (exposed: %v), want at least 1", s.name, strings.Join(s.labels, ","), v, ok)
				}
			}
		}
		// globex never used demo2 or fake.
		for _, agent := range []string{"demo2", "fake"} {
			if v, ok := metricValue(m, "acpgate_connections_open", `agent="`+agent+`"`, `tenant="globex"`); ok && v != 0 {
				t.Errorf("globex has %g open connections to %s", v, agent)
			}
		}
		if t.Failed() {
			t.Logf("\n%s", metricLines(t, g, "acpgate_"))
		}
	})
}

// TestAgentsPoolLimitsIndependent: an agent whose pool is full (one
// process, one session) makes its next session wait and fail after its
// acquire_timeout, while another agent of the same gateway opens sessions
// and runs turns at once; a freed slot is the full agent's again.
func TestAgentsPoolLimitsIndependent(t *testing.T) {
	const acquire = 5 * time.Second
	const tightFlag = "--chunk-delay=2ms"
	cfg := "agents:\n  demo: {}\n" +
		fmt.Sprintf("  tight:\n    command: [%q, demo-agent, %q]\n    stop_grace: 1s\n", binPath, tightFlag) +
		fmt.Sprintf("    pool: {max_processes: 1, max_sessions_per_process: 1, min_idle: 0, acquire_timeout: %s}\n", acquire) +
		"default_agent: demo\npool: {min_idle: 1}\n"
	g := startGateway(t, gwOpts{config: cfg})
	waitReady(t, g, 60*time.Second)
	cwd := t.TempDir()

	holder, _ := dialAgent(t, g, "/acp/tight", "")
	held := holder.newSession(cwd)
	echoTurn(t, holder, held, "holding tight's only slot", turn)
	waiter, _ := dialAgent(t, g, "/acp/tight", "")
	roomy, _ := dialAgent(t, g, "/acp", "")

	start := time.Now()
	wait := waiter.Request("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	// demo is untouched by tight's limits: sessions and a turn while
	// tight's session/new waits.
	var sids []string
	for range 3 {
		sids = append(sids, openSession(t, roomy, cwd, turn))
	}
	echoTurn(t, roomy, sids[2], "demo has room", turn)
	roomyTook := time.Since(start)
	select {
	case m := <-waiter.In:
		t.Fatalf("tight's second session was answered while demo worked (after %s): %s", time.Since(start), m.Raw)
	default:
	}
	if roomyTook >= acquire {
		t.Fatalf("demo took %s for 3 sessions and a turn, as long as tight's acquire_timeout", roomyTook)
	}
	m := waitFor(t, waiter, "session/new on the full agent", wait, acquire+turn, nil)
	took := time.Since(start)
	if m.Error == nil || !strings.Contains(m.Error.Message, "no agent process free") {
		t.Fatalf("session/new on the full agent: %s, want the pool-busy error", m.Raw)
	}
	if took < acquire-100*time.Millisecond {
		t.Fatalf("the full agent refused after %s, before its acquire_timeout %s", took, acquire)
	}
	t.Logf("demo: 3 sessions and a turn in %s; tight refused its second session after %s", roomyTook.Round(time.Millisecond), took.Round(time.Millisecond))
	if n := len(g.agentProcs(tightFlag)); n != 1 {
		t.Errorf("tight runs %d processes, max_processes is 1", n)
	}
	// The slot frees with the holder's connection.
	closeClean(t, holder)
	sid := openSession(t, waiter, cwd, acquire+turn)
	echoTurn(t, waiter, sid, "tight's slot again", turn)
	echoTurn(t, roomy, sids[0], "demo still fine", turn)
	if n := len(g.agentProcs(tightFlag)); n != 1 {
		t.Errorf("tight runs %d processes, max_processes is 1", n)
	}
}

// TestAgentsNoProcessOutlives: no process of either agent is left after
// the gateway ends, drained (SIGTERM) or killed (SIGKILL).
func TestAgentsNoProcessOutlives(t *testing.T) {
	// Adopt orphans, so that what a dead gateway leaves behind is seen (and
	// reaped) here rather than by init.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, 36 /* PR_SET_CHILD_SUBREAPER */, 1, 0); errno != 0 {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	fake := fakeAgentBin(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			cfg := "agents:\n  demo: {stop_grace: 1s}\n" + fakeAgent(t, "fake") +
				"default_agent: demo\npool: {min_idle: 1, max_processes: 3}\nshutdown_grace: 1s\n"
			g := startGateway(t, gwOpts{config: cfg})
			cwd := t.TempDir()
			d, _ := dialAgent(t, g, "/acp/demo", "")
			sid := d.newSession(cwd)
			d.Request("session/prompt", textPrompt(sid, "slow"))
			d.Next(turn) // the prompt is running
			f, _ := dialAgent(t, g, "/acp/fake", "")
			echoTurn(t, f, f.newSession(cwd), "fake is here", turn)
			var procs map[int]string
			deadline := time.Now().Add(10 * time.Second)
			for len(g.agentProcs("demo-agent")) == 0 || len(g.agentProcs(fake)) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("want processes of both agents: demo %v, fake %v", g.agentProcs("demo-agent"), g.agentProcs(fake))
				}
				time.Sleep(50 * time.Millisecond)
			}
			procs = proctree.Descendants(g.Cmd.Process.Pid)
			t.Logf("before %v: %v", sig, procs)
			stopAndWaitGone(t, g, sig, procs, 15*time.Second)
		})
	}
}

// TestAgentsReload: a SIGHUP adds an agent (reachable, listed, usable by a
// tenant whose agents list now names it) and removes one while a prompt
// runs on it: the prompt gets shutdown_grace, then is cancelled, its socket
// closes with 1001, the path is 404 and the agent's processes stop, while
// a connection to another agent carries on untouched. A change to a
// running agent's command is refused; a removed agent can be added again
// once drained.
func TestAgentsReload(t *testing.T) {
	const grace = 2 * time.Second
	const oldFlag = "--chunk-delay=3ms"
	e := newIsoEnv(t)
	extra := fmt.Sprintf("shutdown_grace: %s\npool: {min_idle: 1}\n", grace) + policyAllowDemo
	before := "  demo: {}\n" + demoAgentWith("old", oldFlag)
	g := startGateway(t, gwOpts{config: e.agentsConfig(before, map[string][]string{"globex": {"demo"}}, extra)})
	cfgPath := g.Cmd.Args[slices.Index(g.Cmd.Args, "--config")+1]
	waitReady(t, g, 60*time.Second)
	acmeTok, globexTok := e.tokens["acme"], e.tokens["globex"]
	reload := func(t *testing.T, cfg, want string) {
		t.Helper()
		writeFile(t, cfgPath, []byte(cfg))
		n := g.CountLogs(want, "", "")
		if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		g.waitMoreLogs(t, want, n, 20*time.Second)
	}

	byst := newBystander(t, "demo-bystander", dialToken(t, g, acmeTok), vroot)
	victim, _ := dialAgent(t, g, "/acp/old", acmeTok)
	vsid := victim.newSession(vroot)
	prompt := victim.Request("session/prompt", textPrompt(vsid, "slow"))
	if m := victim.Next(turn); m.Method != "session/update" {
		t.Fatalf("the slow prompt on old: %s", m.Raw)
	}
	// A Streamable-HTTP connection to old, with its event stream open.
	resp, body := httpDo(t, g, http.MethodPost, "/acp/old", acmeTok, httpInit, nil)
	httpVictim := resp.Header.Get("Acp-Connection-Id")
	if resp.StatusCode != 200 || httpVictim == "" {
		t.Fatalf("POST initialize to /acp/old: %d %q", resp.StatusCode, body)
	}
	streamCtx, stopStream := context.WithCancel(context.Background())
	defer stopStream()
	streamEnded := openStream(t, streamCtx, g, "/acp/old", acmeTok, httpVictim)
	oldPIDs := g.agentProcs(oldFlag)
	if len(oldPIDs) == 0 {
		t.Fatal("no process of agent old")
	}
	refused(t, g, "/acp/third", bearer(acmeTok), []string{"acp"}, 404, "unknown_agent")
	// What the prompt streamed so far is not counted below.
	for len(victim.In) > 0 {
		if m := <-victim.In; m.Method != "session/update" {
			t.Fatalf("the slow prompt on old: %s", m.Raw)
		}
	}

	// old removed, third added, globex may now use third.
	third := fakeAgent(t, "third")
	after := "  demo: {}\n" + third
	sent := time.Now()
	reload(t, e.agentsConfig(after, map[string][]string{"globex": {"demo", "third"}}, extra), "configuration reloaded")

	t.Run("the removed agent is refused at once", func(t *testing.T) {
		refused(t, g, "/acp/old", bearer(acmeTok), []string{"acp"}, 404, "unknown_agent")
		resp, body := httpDo(t, g, http.MethodPost, "/acp/old", acmeTok, httpInit, nil)
		wantJSONRefusal(t, "POST /acp/old", resp, body, 404, "unknown_agent")
		if names := agentNames(listAgents(t, g, acmeTok)); slices.Contains(names, "old") {
			t.Errorf("/v1/agents still lists old while it drains: %v", names)
		}
	})

	t.Run("the removed agent's prompt gets shutdown_grace, then its socket closes 1001", func(t *testing.T) {
		st, msgs := closedWith(t, victim, grace+turn)
		closed := time.Since(sent)
		if st != websocket.StatusGoingAway {
			t.Errorf("the removed agent's socket closed with %v (%s), want 1001", st, closedText(victim))
		}
		ticks, answered := 0, false
		for _, m := range msgs {
			switch {
			case m.Method == "session/update":
				if !answered {
					ticks++
				}
			case m.IsResponseTo(prompt):
				answered = true
				if r := stopReason(t, m); r != "cancelled" && r != "end_turn" {
					t.Errorf("the running prompt ended with %q, want cancelled (or end_turn)", r)
				}
			default:
				t.Errorf("unexpected message on the removed agent's socket: %s", m.Raw)
			}
		}
		if !answered {
			t.Errorf("the running prompt was never answered before the close (%d messages)", len(msgs))
		}
		// The prompt ticks every 100 ms: it ran on through the grace.
		if ticks < int(grace/(100*time.Millisecond))/2 {
			t.Errorf("only %d updates after the reload: the prompt did not get shutdown_grace", ticks)
		}
		if closed < grace-100*time.Millisecond {
			t.Errorf("the socket closed %s after the SIGHUP, before shutdown_grace (%s)", closed, grace)
		}
		t.Logf("%d updates, then the close %s after the SIGHUP", ticks, closed.Round(time.Millisecond))
	})

	t.Run("the removed agent's processes stop", func(t *testing.T) {
		g.WaitLog(t, "agent removed: drained", "agent", "old", 20*time.Second)
		deadline := time.Now().Add(10 * time.Second)
		for {
			var left []int
			for _, pid := range oldPIDs {
				if proctree.Alive(pid) {
					left = append(left, pid)
				}
			}
			left = append(left, g.agentProcs(oldFlag)...)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("processes of the removed agent are still running: %v", left)
			}
			time.Sleep(50 * time.Millisecond)
		}
		refused(t, g, "/acp/old", bearer(acmeTok), []string{"acp"}, 404, "unknown_agent")
		// Its HTTP connection ended too, event stream and all.
		select {
		case <-streamEnded:
		case <-time.After(10 * time.Second):
			t.Errorf("the event stream of the removed agent's HTTP connection is still open")
		}
		g.WaitLog(t, "connection closed", "conn", httpVictim, 10*time.Second)
		if g.CountLogs("connection closed", "reason", "agent removed") == 0 {
			t.Errorf("no HTTP connection closed for the reason \"agent removed\"")
		}
		m := g.metrics(t)
		if v, ok := metricValue(m, "acpgate_agent_processes", `agent="old"`); ok {
			t.Errorf("acpgate_agent_processes still reports agent old (%g)", v)
		}
		for _, name := range []string{"acpgate_sessions_active", "acpgate_connections_open"} {
			if v, _ := metricValue(m, name, `agent="old"`); v != 0 {
				t.Errorf("%s{agent=\"old\"} is %g after the agent was drained, want 0", name, v)
			}
		}
	})

	t.Run("the other agent's connection is untouched", func(t *testing.T) {
		byst.check(t)
	})

	t.Run("the added agent is reachable and listed", func(t *testing.T) {
		for _, tok := range []string{acmeTok, globexTok} {
			c, info := dialAgent(t, g, "/acp/third", tok)
			if info != "fakeagent" {
				t.Errorf("/acp/third: agentInfo %q, want fakeagent", info)
			}
			sid := c.newSession(vroot)
			if got := promptOK(t, c, sid, "hello third"); got != "You said: hello third" {
				t.Errorf("/acp/third: %q", got)
			}
			c.Close()
		}
		infos := map[string]string{"demo": "acpgate-demo-agent", "third": "fakeagent"}
		waitAgentsListed(t, g, acmeTok, "demo", []string{"demo", "third"}, infos)
		waitAgentsListed(t, g, globexTok, "demo", []string{"demo", "third"}, infos)
		waitReady(t, g, 30*time.Second)
		m := g.metrics(t)
		if v, _ := metricValue(m, "acpgate_config_reloads_total", `result="success"`); v != 1 {
			t.Errorf("acpgate_config_reloads_total{result=\"success\"} = %g, want 1", v)
		}
		if v, ok := metricValue(m, "acpgate_agent_spawns_total", `agent="third"`); !ok || v < 1 {
			t.Errorf("acpgate_agent_spawns_total{agent=\"third\"} = %g (%v)", v, ok)
		}
	})

	t.Run("changing a running agent's command is refused", func(t *testing.T) {
		// The same file also takes third from globex: refused with the
		// rest, that does not apply either.
		changed := "  demo: {}\n" + fmt.Sprintf("  third: {command: [%q, demo-agent], stop_grace: 1s}\n", binPath)
		reload(t, e.agentsConfig(changed, map[string][]string{"globex": {"demo"}}, extra),
			"configuration reload refused; keeping the running configuration")
		if !strings.Contains(g.LogText(), "agents third: settings other than policy need a restart") {
			t.Errorf("the refusal does not name the agent and the reason")
		}
		if v, _ := metricValue(g.metrics(t), "acpgate_config_reloads_total", `result="failure"`); v != 1 {
			t.Errorf("acpgate_config_reloads_total{result=\"failure\"} = %g, want 1", v)
		}
		for _, tok := range []string{acmeTok, globexTok} {
			c, info := dialAgent(t, g, "/acp/third", tok)
			if info != "fakeagent" {
				t.Errorf("after the refused reload /acp/third is %q, want the running fakeagent", info)
			}
			c.Close()
		}
	})

	t.Run("an agent's policy reloads, for open connections too", func(t *testing.T) {
		open, _ := dialAgent(t, g, "/acp/third", acmeTok)
		echoOK(t, open)
		noExt := "  demo: {}\n" + fmt.Sprintf("  third: {command: [%q], stop_grace: 1s, policy: {extensions: {allow: []}}}\n", fakeAgentBin(t))
		reload(t, e.agentsConfig(noExt, map[string][]string{"globex": {"demo", "third"}}, extra), "configuration reloaded")
		fresh, _ := dialAgent(t, g, "/acp/third", acmeTok)
		for _, c := range []*client{open, fresh} {
			m := c.Call("_demo/echo", map[string]any{"k": "v"}, turn)
			wantError(t, m, -32601, strconv.Itoa(c.NextID), `"_demo/echo" is not allowed by the gateway policy`)
			c.Close()
		}
		byst.check(t) // demo's policy is unchanged: its echo passes
		after = noExt
	})

	t.Run("a drained agent can be added again", func(t *testing.T) {
		reload(t, e.agentsConfig(after+demoAgentWith("old", oldFlag), map[string][]string{"globex": {"demo", "third"}}, extra),
			"configuration reloaded")
		c, _ := dialAgent(t, g, "/acp/old", acmeTok)
		sid := c.newSession(vroot)
		if got := promptOK(t, c, sid, "old is back"); got != "You said: old is back" {
			t.Errorf("/acp/old after adding it again: %q", got)
		}
		if len(g.agentProcs(oldFlag)) == 0 {
			t.Errorf("no process of the re-added agent")
		}
		c.Close()
		refused(t, g, "/acp/old", bearer(globexTok), []string{"acp"}, 403, "agent_not_allowed")
		byst.check(t)
	})
}

// TestAgentsReadiness: /readyz is ready only while every agent can start a
// process. An agent that cannot (here the fake agent exiting before
// initialize) keeps it 503, naming that agent, and /v1/agents shows it not
// ready, while the other agent serves; a reload that removes it makes the
// gateway ready.
func TestAgentsReadiness(t *testing.T) {
	cfg := func(broken bool) string {
		s := "agents:\n  demo: {}\n"
		if broken {
			s += fmt.Sprintf("  broken: {command: [%q], env: {FAKE_MODE: exit-before-init}, stop_grace: 1s}\n", fakeAgentBin(t))
		}
		return s + "default_agent: demo\n"
	}
	g := startGateway(t, gwOpts{config: cfg(true)})
	cfgPath := g.Cmd.Args[slices.Index(g.Cmd.Args, "--config")+1]
	g.WaitLog(t, "agent ready", "agent", "demo", 30*time.Second)
	g.WaitLog(t, "agent stderr", "agent", "broken", 30*time.Second) // it has tried
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	readyz := func() (int, string) {
		t.Helper()
		resp, err := hc.Get("http://" + g.Addr + "/readyz")
		if err != nil {
			t.Fatalf("GET /readyz: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Not ready, for as long as the agent fails (a while of retries).
	for range 10 {
		if code, body := readyz(); code != 503 || !strings.Contains(body, `"broken"`) {
			t.Fatalf("/readyz with an agent that cannot start: %d %q, want 503 naming it", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	l := listAgents(t, g, "")
	if names := agentNames(l); !slices.Equal(names, []string{"broken", "demo"}) {
		t.Fatalf("/v1/agents lists %v", names)
	}
	if b := l[0]; b.Ready || string(b.AgentInfo) != "null" {
		t.Errorf("/v1/agents: the broken agent is %+v, want not ready with agentInfo null", b)
	}
	if d := l[1]; !d.Ready || !d.Default || d.infoName() != "acpgate-demo-agent" {
		t.Errorf("/v1/agents: demo is %+v", d)
	}
	// The other agent serves meanwhile.
	c, _ := dialAgent(t, g, "/acp", "")
	echoTurn(t, c, c.newSession(t.TempDir()), "demo serves", turn)
	c.Close()

	writeFile(t, cfgPath, []byte(cfg(false)))
	n := g.CountLogs("configuration reloaded", "", "")
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.waitMoreLogs(t, "configuration reloaded", n, 20*time.Second)
	waitReady(t, g, 20*time.Second)
	g.WaitLog(t, "agent removed: drained", "agent", "broken", 20*time.Second)
	if code, body := readyz(); code != 200 {
		t.Fatalf("/readyz once the broken agent is removed: %d %q", code, body)
	}
}

// TestAgentsSandboxPaths: an agent's sandbox paths are its processes' alone.
// Two agents run the same fake agent for one tenant; only the one whose
// sandbox.read_only lists a directory can read it.
func TestAgentsSandboxPaths(t *testing.T) {
	requireLandlock(t)
	e := newIsoEnv(t)
	tools := filepath.Join(e.dir, "tools")
	if err := os.Mkdir(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(tools, "tool.txt"), []byte("the tools agent's own"))
	bin := fakeAgentBin(t)
	agents := "  demo: {}\n" +
		fmt.Sprintf("  tools: {command: [%q], stop_grace: 1s, sandbox: {read_only: [%q]}}\n", bin, tools) +
		fmt.Sprintf("  plain: {command: [%q], stop_grace: 1s}\n", bin)
	g := startGateway(t, gwOpts{config: e.agentsConfig(agents, nil, hostilePolicy)})
	file := filepath.Join(tools, "tool.txt")
	for _, tc := range []struct {
		agent string
		ok    bool
	}{{"tools", true}, {"plain", false}} {
		c, _ := dialAgent(t, g, "/acp/"+tc.agent, e.tokens["acme"])
		c.newSession(vroot) // the process is acme's
		a := host(t, c, map[string]any{"op": "read", "path": file})
		if a.OK != tc.ok || tc.ok && a.Data != "the tools agent's own" {
			t.Errorf("agent %s reading %s: %+v, want ok %v", tc.agent, file, a, tc.ok)
		}
		c.Close()
	}
}

// TestAgentsFromSingleAgent: a single-agent gateway (agent: block, its agent
// named "default") becomes a multi-agent one by a reload that names that
// agent default and adds another; the session IDs it issued keep opening at
// /acp and /acp/default (the agent named default seals as before), and are
// refused on the added agent.
func TestAgentsFromSingleAgent(t *testing.T) {
	e := newIsoEnv(t)
	single := e.config(e.keyFile, nil)
	g := startGateway(t, gwOpts{config: single})
	cfgPath := g.Cmd.Args[slices.Index(g.Cmd.Args, "--config")+1]
	tok := e.tokens["acme"]
	c := dialToken(t, g, tok)
	sid := c.newSession(vroot)
	promptOK(t, c, sid, "before the reload")
	c.Close()
	refused(t, g, "/acp/fake", bearer(tok), []string{"acp"}, 404, "unknown_agent")

	named := single + fmt.Sprintf("agents:\n  default: {}\n  fake: {command: [%q], stop_grace: 1s}\ndefault_agent: default\n", fakeAgentBin(t))
	writeFile(t, cfgPath, []byte(named))
	n := g.CountLogs("configuration reloaded", "", "")
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.waitMoreLogs(t, "configuration reloaded", n, 20*time.Second)

	for _, path := range []string{"/acp", "/acp/default"} {
		c, _ := dialAgent(t, g, path, tok)
		replay, got := collectText(t, sid)
		m := c.Await(c.Request("session/load", loadParams(sid)), turn, replay)
		if m.Error != nil || !strings.Contains(got.String(), "You said: before the reload") {
			t.Fatalf("session/load at %s of a session from before the reload: %s (replayed %q)", path, m.Raw, got.String())
		}
		c.Close()
	}
	f, info := dialAgent(t, g, "/acp/fake", tok)
	if info != "fakeagent" {
		t.Errorf("/acp/fake: agentInfo %q", info)
	}
	m := f.Call("session/prompt", textPrompt(sid, "hijack"), turn)
	wantError(t, m, -32002, strconv.Itoa(f.NextID), "session not found")
	echoTurn(t, f, f.newSession(vroot), "fake added", turn)
	waitAgentsListed(t, g, tok, "default", []string{"default", "fake"}, map[string]string{"default": "acpgate-demo-agent", "fake": "fakeagent"})
}
