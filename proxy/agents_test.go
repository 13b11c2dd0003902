package proxy

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/policy"
)

// twoAgents is a relay with agents "a" and "b" (both the demo agent, each
// with its own state), the tenants given (none: the anonymous one).
func twoAgents(t *testing.T, tenants []TenantConfig) *Relay {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec := func(name string) AgentSpec {
		return AgentSpec{Name: name, Pool: PoolConfig{
			Agent: AgentConfig{
				Command:   []string{exe, "-test.run=^$"},
				Env:       map[string]string{"ACPGATE_TEST_AGENT": "demo", "ACPGATE_TEST_STATE": t.TempDir()},
				StopGrace: 2 * time.Second,
			},
			MaxProcesses:   1,
			AcquireTimeout: 10 * time.Second,
		}}
	}
	if tenants == nil {
		pol := policy.Default()
		tenants = []TenantConfig{{Policy: &pol}}
	}
	return startRelay(t, Config{Agents: []AgentSpec{spec("a"), spec("b")}, ClientCaps: AllCapabilities, Tenants: tenants})
}

func agentConn(t *testing.T, r *Relay, tenant, agent string) *testConn {
	t.Helper()
	return connWith(t, r, ConnInfo{ID: agent + "-conn", Tenant: tenant, Agent: agent})
}

// A session ID is bound to the agent that issued it: the other agent (of
// the same tenant) answers it as unknown, and each agent has processes of
// its own.
func TestSessionIDBoundToAgent(t *testing.T) {
	r := twoAgents(t, nil)
	a, b := agentConn(t, r, "", "a"), agentConn(t, r, "", "b")
	a.init(fsCaps)
	b.init(fsCaps)
	sid := a.newSession("1")
	for _, method := range []string{"session/load", "session/prompt"} {
		b.send(`{"jsonrpc":"2.0","id":2,"method":"` + method + `","params":{"sessionId":"` + sid +
			`","cwd":"/tmp","mcpServers":[],"prompt":[{"type":"text","text":"hi"}]}}`)
		if m := b.await("2", nil); m.Error == nil || m.Error.Code != -32002 {
			t.Errorf("%s of agent a's session on agent b: %s, want -32002", method, m.raw)
		}
	}
	if a.c.ag.name != "a" || b.c.ag.name != "b" {
		t.Errorf("agents %q, %q", a.c.ag.name, b.c.ag.name)
	}
	if r.AgentPool("a") == r.AgentPool("b") || r.AgentPool("a").Stats().Sessions != 1 || r.AgentPool("b").Stats().Sessions != 0 {
		t.Errorf("pools: a %+v, b %+v; want the session on a's own pool", r.AgentPool("a").Stats(), r.AgentPool("b").Stats())
	}
}

// A tenant's agents list is enforced by the relay too, unknown and retired
// agents take no connection, and CloseAgent ends a retired agent's
// connections and forgets it.
func TestAgentAdmission(t *testing.T) {
	pol := policy.Default()
	r := twoAgents(t, []TenantConfig{{Name: "acme", Policy: &pol, Agents: []string{"b"}}, {Name: "zeta", Policy: &pol}})
	sk := &sink{ch: make(chan []byte, 10)}
	if _, err := r.NewConn(ConnInfo{ID: "x", Tenant: "acme", Agent: "a"}, sk); !errors.Is(err, ErrAgentNotAllowed) {
		t.Errorf("acme on a: %v, want ErrAgentNotAllowed", err)
	}
	if _, err := r.NewConn(ConnInfo{ID: "x", Tenant: "acme", Agent: "nope"}, sk); !errors.Is(err, ErrUnknownAgent) {
		t.Errorf("unknown agent: %v, want ErrUnknownAgent", err)
	}
	z := agentConn(t, r, "zeta", "a")
	z.init(fsCaps)
	z.newSession("1")
	if !r.RetireAgent("a") {
		t.Fatal("RetireAgent(a) = false")
	}
	if _, err := r.NewConn(ConnInfo{ID: "y", Tenant: "zeta", Agent: "a"}, sk); !errors.Is(err, ErrUnknownAgent) {
		t.Errorf("retired agent: %v, want ErrUnknownAgent", err)
	}
	if _, ok := r.AgentStatus("a"); ok {
		t.Error("AgentStatus reports a retired agent")
	}
	if n := agentConns(r, "a"); n != 1 {
		t.Errorf("AgentConns(a) = %d, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.CloseAgent(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if r.AgentPool("a") != nil || agentConns(r, "a") != 0 {
		t.Error("agent a outlived CloseAgent")
	}
	if st, ok := r.AgentStatus("b"); !ok || st.Name != "b" {
		t.Errorf("agent b: %+v %v", st, ok)
	}
}

// A resume token names the gateway process that issued it: another
// process refuses it as another replica's, and one of its own that it does
// not hold as unknown.
func TestResumeRefusalReasons(t *testing.T) {
	a, b := twoAgents(t, nil), twoAgents(t, nil)
	a.resume = SessionsConfig{DetachTimeout: time.Minute, ReplayBufferBytes: 1 << 20}
	c := agentConn(t, a, "", "a")
	if c.c.token == "" || !strings.HasPrefix(c.c.token, a.instance+".") {
		t.Fatalf("token %q does not start with the instance %q", c.c.token, a.instance)
	}
	if _, err := b.Resume("", "", "a", c.c.token, 0); err == nil {
		t.Fatal("another relay resumed a token it never issued")
	}
	if _, err := a.Resume("", "", "a", a.instance+".nope", 0); err == nil {
		t.Fatal("a forged token resumed")
	}
	if _, err := a.Resume("", "", "b", c.c.token, 0); err == nil {
		t.Fatal("agent a's connection resumed on agent b")
	}
	for _, tc := range []struct {
		r      *Relay
		reason string
	}{{b, metrics.RefusedOtherReplica}, {a, metrics.RefusedUnknown}, {a, metrics.RefusedMismatch}} {
		var m dto.Metric
		if err := tc.r.metrics.Resumes.WithLabelValues("refused", tc.reason).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			v := m.GetCounter().GetValue()
			t.Errorf("refused{reason=%q} = %g (%v), want 1", tc.reason, v, err)
		}
	}
}

// agentConns counts the named agent's open connections (detached ones
// included).
func agentConns(r *Relay, name string) int {
	n := 0
	for _, c := range r.connList() {
		if c.ag.name == name {
			n++
		}
	}
	return n
}
