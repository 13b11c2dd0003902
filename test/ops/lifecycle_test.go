package ops

import (
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// agentTree returns the gateway's descendants (supervisors and agents),
// failing if there are none.
func agentTree(t *testing.T, g *gateway) map[int]string {
	t.Helper()
	procs := proctree.Descendants(g.Cmd.Process.Pid)
	n := 0
	for _, cmd := range procs {
		if strings.Contains(cmd, "demo-agent") && !strings.Contains(cmd, "supervise") {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no demo agent below the gateway: %v", procs)
	}
	return procs
}

// waitGone waits until none of procs is alive.
func waitGone(t *testing.T, procs map[int]string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for pid, cmd := range procs {
			if proctree.Alive(pid) {
				left = append(left, cmd)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			sort.Strings(left)
			t.Fatalf("processes outlived the gateway:\n  %s", strings.Join(left, "\n  "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitExit(t *testing.T, g *gateway, timeout time.Duration) {
	t.Helper()
	select {
	case <-g.Done():
	case <-time.After(timeout):
		t.Fatalf("gateway still running %s after SIGTERM", timeout)
	}
	if g.ExitCode() != 0 {
		t.Fatalf("gateway exit status %d after a drain, want 0", g.ExitCode())
	}
}

// TestDrainLetsRunningPromptFinish sends SIGTERM in the middle of a
// streamed reply: the reply completes, the gateway is not ready and takes
// no new connection meanwhile, then it closes with 1001, exits 0, and
// leaves no agent process behind.
func TestDrainLetsRunningPromptFinish(t *testing.T) {
	g := startGateway(t, gwOpts{config: "shutdown_grace: 10s\nobservability:\n  metrics_listen: 127.0.0.1:0\n"})
	c, sid := dialSession(t, g.Addr)
	procs := agentTree(t, g)

	// The echo streams 8 characters every 15 ms: 2010 characters ≈ 3.8 s,
	// time enough for the checks below even on a loaded machine, and well
	// within shutdown_grace.
	text := strings.Repeat("0123456789", 200)
	id := c.Request("session/prompt", promptParams(sid, text))
	var got strings.Builder
	first := time.After(10 * time.Second)
	for got.Len() == 0 {
		select {
		case m := <-c.In:
			if s, ok := chunkText(m); ok {
				got.WriteString(s)
			}
		case <-first:
			t.Fatal("no chunk within 10 s")
		}
	}
	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	g.WaitLogs(t, "draining", 1, 5*time.Second)

	// During the drain: not ready, no new connection.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if metricscrape.Sample(g.metrics(t), "acpgate_ready", "") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("acpgate_ready did not drop to 0 during the drain")
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, body, err := httpGet("http://" + g.Addr + "/readyz")
	switch {
	case err == nil && code == http.StatusServiceUnavailable:
		t.Logf("/readyz during the drain: 503 %q", strings.TrimSpace(body))
	case err != nil && errRefused(err):
		// The listener is closed when the drain starts: a probe fails to
		// connect, which the kubelet counts as not ready too.
		t.Logf("/readyz during the drain: connection refused (the listener is closed)")
	default:
		t.Errorf("/readyz during the drain: %d %q %v, want 503 or a refused connection", code, body, err)
	}
	if c2, resp, err := dial(t, g.Addr, ""); err == nil {
		c2.Close()
		t.Error("a new WebSocket was accepted during the drain")
	} else {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Logf("new WebSocket during the drain: refused (HTTP %d): %v", status, err)
	}
	select {
	case <-g.Done():
		t.Fatal("the gateway exited while a prompt was still streaming")
	default:
	}

	m := c.Await(id, 15*time.Second, func(m rpcMsg) {
		if s, ok := chunkText(m); ok {
			got.WriteString(s)
		}
	})
	if r := stopReason(t, m); r != "end_turn" {
		t.Errorf("stopReason %q, want end_turn", r)
	}
	if want := "You said: " + text; got.String() != want {
		t.Errorf("streamed %d characters, want %d: %q", got.Len(), len(want), got.String())
	}
	if st := c.CloseStatus(15 * time.Second); st != websocket.StatusGoingAway {
		t.Errorf("close status %v, want 1001 going away", st)
	}
	waitExit(t, g, 20*time.Second)
	waitGone(t, procs)
}

// TestDrainCancelsPromptsAtGrace: a prompt that outlasts shutdown_grace is
// cancelled at its end; the client gets stopReason "cancelled", then 1001.
func TestDrainCancelsPromptsAtGrace(t *testing.T) {
	g := startGateway(t, gwOpts{config: "shutdown_grace: 1s\n"})
	c, sid := dialSession(t, g.Addr)
	procs := agentTree(t, g)

	id := c.Request("session/prompt", promptParams(sid, "slow"))
	ticks := 0
	first := time.After(10 * time.Second)
	for ticks == 0 {
		select {
		case m := <-c.In:
			if s, ok := chunkText(m); ok && strings.HasPrefix(s, "tick ") {
				ticks++
			}
		case <-first:
			t.Fatal("no tick within 10 s")
		}
	}
	start := time.Now()
	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	m := c.Await(id, 15*time.Second, func(m rpcMsg) {
		if _, ok := chunkText(m); ok {
			ticks++
		}
	})
	took := time.Since(start)
	if r := stopReason(t, m); r != "cancelled" {
		t.Errorf("stopReason %q, want cancelled", r)
	}
	t.Logf("cancelled %s after SIGTERM, %d ticks streamed", took.Round(time.Millisecond), ticks)
	if took < 900*time.Millisecond || took > 8*time.Second {
		t.Errorf("the prompt ended %s after SIGTERM; want about shutdown_grace (1s)", took)
	}
	if st := c.CloseStatus(15 * time.Second); st != websocket.StatusGoingAway {
		t.Errorf("close status %v, want 1001 going away", st)
	}
	waitExit(t, g, 20*time.Second)
	waitGone(t, procs)
}

// TestSIGHUPReload: tenants and tokens reload without dropping open
// connections; a file that does not parse, or that changes a setting
// needing a restart, is refused and the running configuration stays.
func TestSIGHUPReload(t *testing.T) {
	dir := t.TempDir()
	rootA, rootB := filepath.Join(dir, "alpha"), filepath.Join(dir, "beta")
	for _, d := range []string{rootA, rootB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tokA, tokB, tokC := "a-"+harness.RandomHex(t, 16), "b-"+harness.RandomHex(t, 16), "c-"+harness.RandomHex(t, 16)
	alpha := tenant{name: "alpha", tokens: []string{tokA}, root: rootA}
	beta := tenant{name: "beta", tokens: []string{tokB}, root: rootB}
	g := startGateway(t, gwOpts{config: tenantsYAML(t, dir, alpha)})

	reload := func(cfg string) {
		t.Helper()
		writeFile(t, g.cfgPath, cfg)
		if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(tok string) {
		t.Helper()
		c, resp, err := dial(t, g.Addr, tok)
		if err == nil {
			c.Close()
			t.Fatalf("token %s… was accepted", tok[:2])
		}
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("token %s…: %v, want 401", tok[:2], err)
		}
	}
	roundTrip := func(c *client, sid, what string) {
		t.Helper()
		if r, text := c.prompt(sid, "hello "+what); r != "end_turn" || text != "You said: hello "+what {
			t.Fatalf("%s: prompt got %q %q", what, r, text)
		}
	}
	// The gateway logs a reload's outcome just before it counts it: wait
	// for the counters to reach the expected values.
	wantReloads := func(success, failure float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			text := g.metrics(t)
			s := metricscrape.Sample(text, "acpgate_config_reloads_total", `result="success"`)
			f := metricscrape.Sample(text, "acpgate_config_reloads_total", `result="failure"`)
			if s == success && f == failure {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("acpgate_config_reloads_total success=%v failure=%v, want %v and %v", s, f, success, failure)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	cA := mustDial(t, g.Addr, tokA)
	cA.initialize()
	sidA := cA.NewSession(rootA)
	roundTrip(cA, sidA, "before")
	refused(tokB)

	// Add tenant beta with token B.
	reload(tenantsYAML(t, dir, alpha, beta))
	g.WaitLogs(t, "configuration reloaded", 1, 10*time.Second)
	cB := mustDial(t, g.Addr, tokB)
	cB.initialize()
	roundTrip(cB, cB.NewSession(rootB), "beta")
	roundTrip(cA, sidA, "after the reload")

	// An unknown key: refused, the running configuration stays.
	reload(tenantsYAML(t, dir, alpha, beta) + "bogus_key: 1\n")
	g.WaitLogs(t, "configuration reload refused; keeping the running configuration", 1, 10*time.Second)
	cB2 := mustDial(t, g.Addr, tokB)
	cB2.Close()
	wantReloads(1, 1)

	// A setting that needs a restart: refused too.
	reload("pool:\n  max_processes: 3\n" + tenantsYAML(t, dir, alpha, beta))
	g.WaitLogs(t, "configuration reload refused; keeping the running configuration", 2, 10*time.Second)
	wantReloads(1, 2)

	// Rotate alpha's token: A is refused from now on, C accepted, and the
	// connection opened with A lives on.
	reload(tenantsYAML(t, dir, tenant{name: "alpha", tokens: []string{tokC}, root: rootA}, beta))
	g.WaitLogs(t, "configuration reloaded", 2, 10*time.Second)
	refused(tokA)
	cC := mustDial(t, g.Addr, tokC)
	cC.initialize()
	roundTrip(cC, cC.NewSession(rootA), "token C")
	roundTrip(cA, sidA, "after the rotation")
	roundTrip(cB, cB.NewSession(rootB), "beta again")
	wantReloads(2, 2)
}
