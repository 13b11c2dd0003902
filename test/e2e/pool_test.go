package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// The pool suite checks the shared pool: clients with different fs
// capabilities share agent processes (the gateway serves fs for clients that
// lack it), initialize never waits for an agent process, processes are
// recycled after a number of sessions without exceeding max_processes, and a
// client that never answers an agent request is answered for after
// timeouts.client_request.

// fsProfile is the fs part of a client's initialize clientCapabilities.
type fsProfile struct {
	name        string
	omit        bool // no "fs" key at all
	read, write bool
}

var (
	fsBoth   = fsProfile{name: "fs-both", read: true, write: true}
	fsNone   = fsProfile{name: "fs-none"}
	fsRead   = fsProfile{name: "fs-read-only", read: true}
	fsAbsent = fsProfile{name: "fs-absent", omit: true}

	// mixedProfiles are the profiles the mixed tests cycle through.
	mixedProfiles = []fsProfile{fsBoth, fsNone, fsRead}
)

func (p fsProfile) caps() map[string]any {
	if p.omit {
		return map[string]any{}
	}
	return map[string]any{"fs": map[string]bool{"readTextFile": p.read, "writeTextFile": p.write}}
}

// left is the time remaining before ctx's deadline, capped at max. It fails
// the test, naming what was about to start, when the deadline has passed.
func left(t *testing.T, ctx context.Context, max time.Duration, what string) time.Duration {
	t.Helper()
	dl, ok := ctx.Deadline()
	if !ok {
		return max
	}
	d := time.Until(dl)
	if d <= 0 {
		t.Fatalf("the test's time budget ran out before %s", what)
	}
	return min(d, max)
}

// closedText describes why c's connection ended.
func closedText(c *client) string {
	err := c.Err()
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Sprintf("the gateway closed the connection with %d (%s), reason %q", int(ce.Code), ce.Code, ce.Reason)
	}
	return fmt.Sprintf("the connection ended: %v", err)
}

// waitFor reads c until the response to request id, passing every other
// message to other (nil: only session/update is expected). what names the
// request in failure messages, which say whether the gateway stayed silent
// or closed the connection (and with which code).
func waitFor(t *testing.T, c *client, what string, id int, timeout time.Duration, other func(rpcMsg)) rpcMsg {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-c.In:
			if !ok {
				t.Fatalf("%s: no answer; %s", what, closedText(c))
			}
			answer, unexpected := acpclient.AwaitStep(m, id, other)
			if answer {
				return m
			}
			if unexpected {
				t.Fatalf("%s: unexpected message while waiting for the answer: %s", what, m.Raw)
			}
		case <-timer.C:
			t.Fatalf("%s: no answer within %s (the gateway stayed silent)", what, timeout)
		}
	}
}

// initializeAs sends initialize with profile p and returns how long the
// answer took. An error answer fails the test.
func initializeAs(t *testing.T, c *client, p fsProfile, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	id := c.Request("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": p.caps(),
		"clientInfo":         map[string]string{"name": "e2e-pool-" + p.name, "version": "0"},
	})
	m := waitFor(t, c, "initialize ("+p.name+")", id, timeout, nil)
	took := time.Since(start)
	if m.Error != nil {
		t.Fatalf("initialize (%s) answered with an error after %s: %s", p.name, took.Round(time.Millisecond), m.Raw)
	}
	var res struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil || res.ProtocolVersion != 1 {
		t.Fatalf("initialize (%s) result: %s", p.name, m.Raw)
	}
	return took
}

// openSession sends session/new and returns the session ID; an error answer
// or silence fails the test.
func openSession(t *testing.T, c *client, cwd string, timeout time.Duration) string {
	t.Helper()
	start := time.Now()
	id := c.Request("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	m := waitFor(t, c, "session/new", id, timeout, nil)
	if m.Error != nil {
		t.Fatalf("session/new answered with an error after %s: %s", time.Since(start).Round(time.Millisecond), m.Raw)
	}
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("session/new without a sessionId: %s", m.Raw)
	}
	return sid
}

// echoTurn runs a prompt that the demo agent echoes, and checks that it ends
// with end_turn and streams "You said: <text>" back.
func echoTurn(t *testing.T, c *client, sid, text string, timeout time.Duration) {
	t.Helper()
	onUpdate, got := collectText(t, sid)
	m := waitFor(t, c, "session/prompt (echo)", c.Request("session/prompt", textPrompt(sid, text)), timeout, onUpdate)
	if m.Error != nil {
		t.Fatalf("echo prompt failed: %s", m.Raw)
	}
	if r := stopReason(t, m); r != "end_turn" {
		t.Fatalf("echo prompt: stopReason %q, want end_turn: %s", r, m.Raw)
	}
	if want := "You said: " + text; got.String() != want {
		t.Fatalf("echo prompt streamed %q, want %q", got.String(), want)
	}
}

// closeClean closes c with 1000 and checks that the gateway completed the
// close handshake (and had not closed the connection itself before).
func closeClean(t *testing.T, c *client) {
	t.Helper()
	select {
	case m, ok := <-c.In:
		if !ok {
			t.Fatalf("before the client closed: %s", closedText(c))
		}
		t.Errorf("unexpected message before close: %s", m.Raw)
	default:
	}
	err := c.CloseWith(websocket.StatusNormalClosure, "")
	if err != nil {
		t.Fatalf("close with 1000: %v (%s)", err, closedText(c))
	}
	if s := websocket.CloseStatus(c.Err()); s != -1 && s != websocket.StatusNormalClosure {
		t.Fatalf("close with 1000: the gateway answered %d", int(s))
	}
}

// metricSum sums every sample of the metric name, whatever its labels, and
// says whether it was exposed at all.
func metricSum(t *testing.T, g *gateway, name string) (float64, bool) {
	t.Helper()
	var sum float64
	found := false
	for k, v := range g.metrics(t) {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
			found = true
		}
	}
	return sum, found
}

// metricLines returns the exposed samples whose name starts with prefix,
// sorted, for failure messages.
func metricLines(t *testing.T, g *gateway, prefix string) string {
	t.Helper()
	var out []string
	for k, v := range g.metrics(t) {
		if strings.HasPrefix(k, prefix) && !strings.Contains(k, "_bucket{") {
			out = append(out, fmt.Sprintf("%s %g", k, v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// waitReady polls /readyz until it answers 200, so that timing checks do not
// include the first agent's start.
func waitReady(t *testing.T, g *gateway, timeout time.Duration) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		last := ""
		resp, err := hc.Get("http://" + g.Addr + "/readyz")
		if err != nil {
			last = err.Error()
		} else {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within %s (last: %s)", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------

// TestPoolMixedProfilesSequential runs 30 clients one after the other,
// cycling three fs capability profiles. With processes shared across
// profiles, one or two agent processes serve them all.
func TestPoolMixedProfilesSequential(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := startGateway(t, gwOpts{config: "pool: {min_idle: 1, max_processes: 2}\n"})
	waitReady(t, g, 30*time.Second)
	cwd := t.TempDir()
	const clients = 30
	var slowest time.Duration
	for i := range clients {
		p := mixedProfiles[i%len(mixedProfiles)]
		ok := t.Run(fmt.Sprintf("client%02d-%s", i, p.name), func(t *testing.T) {
			c := dial(t, g)
			took := initializeAs(t, c, p, left(t, ctx, 5*time.Second, "initialize"))
			slowest = max(slowest, took)
			if took > 2*time.Second {
				t.Fatalf("initialize (%s) took %s; want < 2 s", p.name, took.Round(time.Millisecond))
			}
			sid := openSession(t, c, cwd, left(t, ctx, 20*time.Second, "session/new"))
			echoTurn(t, c, sid, fmt.Sprintf("echo check number %d", i), left(t, ctx, 20*time.Second, "the prompt"))
			closeClean(t, c)
		})
		if !ok {
			t.Fatalf("client %d (%s) failed; spawns so far: %s", i, p.name, metricLines(t, g, "acpgate_agent_spawns_total"))
		}
	}
	spawns, found := metricSum(t, g, "acpgate_agent_spawns_total")
	if !found {
		t.Fatalf("/metrics has no acpgate_agent_spawns_total")
	}
	t.Logf("%d clients, %g agent spawns, slowest initialize %s", clients, spawns, slowest.Round(time.Millisecond))
	if spawns > 3 {
		t.Fatalf("%d sequential clients with 3 fs profiles caused %g agent spawns; want ≤ 3 (processes shared across profiles):\n%s",
			clients, spawns, metricLines(t, g, "acpgate_agent_"))
	}
}

// TestPoolMixedProfilesConcurrent runs 12 clients at once, 4 of each fs
// profile, on at most 2 agent processes: all of them initialize first, then
// each opens a session and runs a prompt. Everything must be done in 60 s.
//
// The clients are plain goroutines with the error-returning wsClient
// (parallel subtests would run only GOMAXPROCS at a time).
func TestPoolMixedProfilesConcurrent(t *testing.T) {
	const (
		clients = 12
		budget  = 60 * time.Second
	)
	g := startGateway(t, gwOpts{config: "pool: {max_processes: 2}\n"})
	waitReady(t, g, 30*time.Second)
	cwd := t.TempDir()
	start := time.Now()
	deadline := start.Add(budget)

	// All clients initialize before any opens a session, so that every
	// profile is connected at the same time.
	var initialized sync.WaitGroup
	initialized.Add(clients)
	allInitialized := make(chan struct{})
	go func() { initialized.Wait(); close(allInitialized) }()

	errs := make([]error, clients)
	initTook := make([]time.Duration, clients)
	var wg sync.WaitGroup
	for i := range clients {
		p := mixedProfiles[i%len(mixedProfiles)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			arrive := func() { once.Do(initialized.Done) }
			defer arrive() // a client that failed does not hold the others up
			fail := func(format string, a ...any) {
				errs[i] = fmt.Errorf("client %02d (%s): "+format, append([]any{i, p.name}, a...)...)
			}
			c, err := wsDial(g.Addr, nil)
			if err != nil {
				fail("dial: %v", err)
				return
			}
			defer c.Kill() // after close below: a no-op
			step := func(what, method string, params any) (rpcMsg, bool) {
				m, err := c.Call(method, params, time.Until(deadline))
				switch {
				case errors.Is(err, errClosed):
					var ce websocket.CloseError
					if errors.As(c.Err(), &ce) {
						fail("%s: the gateway closed the connection with %d %q", what, int(ce.Code), ce.Reason)
					} else {
						fail("%s: %v", what, err)
					}
					return m, false
				case err != nil:
					fail("%s: %v", what, err)
					return m, false
				case m.Error != nil:
					fail("%s: error answer %s", what, m.Raw)
					return m, false
				}
				return m, true
			}
			t0 := time.Now()
			if _, ok := step("initialize", "initialize", map[string]any{
				"protocolVersion":    1,
				"clientCapabilities": p.caps(),
				"clientInfo":         map[string]string{"name": "e2e-pool-" + p.name, "version": "0"},
			}); !ok {
				return
			}
			initTook[i] = time.Since(t0)
			arrive()
			select {
			case <-allInitialized:
			case <-time.After(time.Until(deadline)):
				fail("initialized, but not every other client was within %s", budget)
				return
			}
			m, ok := step("session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			if !ok {
				return
			}
			var res struct {
				SessionID string `json:"sessionId"`
			}
			if json.Unmarshal(m.Result, &res) != nil || res.SessionID == "" {
				fail("session/new without a sessionId: %s", m.Raw)
				return
			}
			text := fmt.Sprintf("concurrent echo from client %d", i)
			id, err := c.Request("session/prompt", textPrompt(res.SessionID, text))
			if err != nil {
				fail("send the prompt: %v", err)
				return
			}
			var got strings.Builder
			m, err = c.Await(id, time.Until(deadline), func(m rpcMsg) error {
				s, isChunk, err := chunkText(m, res.SessionID)
				if err != nil {
					return err
				}
				if !isChunk && m.Method != "session/update" {
					return fmt.Errorf("unexpected message: %.300s", m.Raw)
				}
				got.WriteString(s)
				return nil
			})
			if err != nil {
				fail("prompt: %v", err)
				return
			}
			var r struct {
				StopReason string `json:"stopReason"`
			}
			if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || r.StopReason != "end_turn" {
				fail("prompt: %s, want stopReason end_turn", m.Raw)
				return
			}
			if want := "You said: " + text; got.String() != want {
				fail("prompt streamed %q, want %q", got.String(), want)
				return
			}
			if err := c.WS.Close(websocket.StatusNormalClosure, ""); err != nil {
				fail("close with 1000: %v", err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	var slowest time.Duration
	for i, err := range errs {
		if err != nil {
			t.Error(err)
		}
		slowest = max(slowest, initTook[i])
		if initTook[i] > 2*time.Second {
			t.Errorf("client %02d: initialize took %s; want < 2 s", i, initTook[i].Round(time.Millisecond))
		}
	}
	t.Logf("%d concurrent clients done in %s (slowest initialize %s); agent processes now %v; %s", clients,
		took.Round(time.Millisecond), slowest.Round(time.Millisecond), g.agentPIDs(), metricLines(t, g, "acpgate_agent_spawns_total"))
	if took > budget {
		t.Errorf("%d concurrent clients took %s; want ≤ %s", clients, took.Round(time.Millisecond), budget)
	}
}

// TestGatewayServesFsForClientWithout: a tenant client that offers no fs
// capability still gets an agent that reads and writes the tenant's files:
// the gateway answers the agent's fs requests itself, from the tenant root,
// and the client never sees them. Paths outside the root stay refused.
//
// Prompt text is never rewritten (docs/operations.md, "Free text"), and the demo agent
// resolves a relative path against its session cwd, which is the host root:
// the prompts use relative paths so that the agent asks for files under the
// host root, exactly as a real agent working in its cwd would.
func TestGatewayServesFsForClientWithout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "acme")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	token := "acme-" + harness.RandomHex(t, 24)
	sum := sha256.Sum256([]byte(token))
	g := startGateway(t, gwOpts{config: fmt.Sprintf(`pool: {min_idle: 1}
tenants:
  - name: acme
    tokens_sha256: [%q]
    root: %q
    virtual_root: %s
`, hex.EncodeToString(sum[:]), root, vroot)})

	firstLine := "pool-e2e notes " + harness.RandomHex(t, 6)
	writeFile(t, filepath.Join(root, "notes.txt"), []byte(firstLine+"\nthe second line\n"))

	// session opens a connection without fs and a session in /workspace.
	session := func(t *testing.T) (*client, string) {
		t.Helper()
		c, resp, err := dialWith(t, g, "/acp", bearer(token), []string{"acp"})
		if err != nil {
			t.Fatalf("dial with the tenant's token: %v (%s)", err, respText(resp))
		}
		initializeAs(t, c, fsAbsent, left(t, ctx, 5*time.Second, "initialize"))
		return c, openSession(t, c, vroot, left(t, ctx, 20*time.Second, "session/new"))
	}
	// prompt runs one prompt; the client answers permission requests with
	// allow and must never be asked for a file.
	prompt := func(t *testing.T, c *client, sid, text string) (stop, reply string, permissions int) {
		t.Helper()
		var b strings.Builder
		m := waitFor(t, c, "session/prompt "+text, c.Request("session/prompt", textPrompt(sid, text)), left(t, ctx, turn, "the prompt"), func(m rpcMsg) {
			switch m.Method {
			case "session/update":
				u := parseUpdate(t, m)
				if u.SessionID != sid {
					t.Errorf("update for another session: %s", m.Raw)
				}
				if u.Update.Kind == "agent_message_chunk" {
					b.WriteString(u.text())
				}
			case "session/request_permission":
				permissions++
				c.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
			case "fs/read_text_file", "fs/write_text_file":
				t.Errorf("a client without fs capabilities received %s: %s", m.Method, m.Raw)
				c.Send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "no fs here"}})
			default:
				t.Errorf("unexpected message: %s", m.Raw)
				if m.Method != "" && len(m.ID) > 0 {
					c.Send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "unexpected"}})
				}
			}
		})
		if m.Error != nil {
			t.Fatalf("prompt %q failed: %s", text, m.Raw)
		}
		return stopReason(t, m), b.String(), permissions
	}

	t.Run("read inside the root", func(t *testing.T) {
		c, sid := session(t)
		stop, reply, _ := prompt(t, c, sid, "read notes.txt")
		if stop != "end_turn" {
			t.Fatalf("stopReason %q, want end_turn; reply %q", stop, reply)
		}
		if !strings.Contains(reply, fmt.Sprintf("%q", firstLine)) {
			t.Fatalf("the agent's reply %q does not quote the file's first line %q (the gateway did not serve the read)", reply, firstLine)
		}
		closeClean(t, c)
	})

	t.Run("write inside the root", func(t *testing.T) {
		c, sid := session(t)
		const content = "hello-from-agent"
		stop, reply, permissions := prompt(t, c, sid, "write out.txt "+content)
		if stop != "end_turn" {
			t.Fatalf("stopReason %q, want end_turn; reply %q", stop, reply)
		}
		if permissions != 1 {
			t.Errorf("%d permission requests reached the client, want 1 (the agent asks before writing)", permissions)
		}
		got, err := os.ReadFile(filepath.Join(root, "out.txt"))
		if err != nil {
			t.Fatalf("the file was not written under the host root: %v; the agent said %q", err, reply)
		}
		if string(got) != content {
			t.Fatalf("%s holds %q, want %q", filepath.Join(root, "out.txt"), got, content)
		}
		if want := fmt.Sprintf("Wrote %d bytes", len(content)); !strings.Contains(reply, want) {
			t.Errorf("the agent's reply %q lacks %q", reply, want)
		}
		closeClean(t, c)
	})

	t.Run("read outside the root", func(t *testing.T) {
		c, sid := session(t)
		passwd, err := os.ReadFile("/etc/passwd")
		if err != nil || len(passwd) == 0 {
			t.Skipf("no /etc/passwd to compare with: %v", err)
		}
		secret, _, _ := strings.Cut(string(passwd), "\n")
		stop, reply, _ := prompt(t, c, sid, "read /etc/passwd")
		if stop != "end_turn" {
			t.Fatalf("stopReason %q, want end_turn; reply %q", stop, reply)
		}
		if strings.Contains(reply, secret) || strings.Contains(reply, "root:x:") || strings.Contains(reply, "The first line is") {
			t.Fatalf("the agent read /etc/passwd through the gateway: %q", reply)
		}
		closeClean(t, c)
	})

	t.Run("write outside the root", func(t *testing.T) {
		c, sid := session(t)
		target := filepath.Join(outside, "planted.txt")
		stop, reply, _ := prompt(t, c, sid, "write "+target+" pwned")
		if stop != "end_turn" {
			t.Fatalf("stopReason %q, want end_turn; reply %q", stop, reply)
		}
		if _, err := os.Stat(target); err == nil {
			t.Fatalf("%s, outside the tenant root, was written; the agent said %q", target, reply)
		}
		closeClean(t, c)
	})
}

// TestPoolRecycleAfterSessions: with recycle_after_sessions: 4, 12 sessions
// in a row make the gateway retire processes and start new ones, and at no
// moment do more than max_processes (2) agent processes run.
func TestPoolRecycleAfterSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const maxProcs = 2
	g := startGateway(t, gwOpts{config: fmt.Sprintf(
		"agent: {stop_grace: 2s}\npool: {min_idle: 1, max_processes: %d, recycle_after_sessions: 4}\n", maxProcs)})

	// Sample the gateway's agent processes every 20 ms for the whole run.
	type sample struct {
		at   time.Duration
		pids []int
	}
	var (
		peak     sample
		samples  int
		stopSamp = make(chan struct{})
		sampDone = make(chan struct{})
		start    = time.Now()
	)
	go func() {
		defer close(sampDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			pids := g.agentPIDs()
			samples++
			if len(pids) > len(peak.pids) {
				sort.Ints(pids)
				peak = sample{time.Since(start), pids}
			}
			select {
			case <-stopSamp:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	stopSampling := func() {
		select {
		case <-stopSamp:
		default:
			close(stopSamp)
		}
		<-sampDone
	}
	defer stopSampling()

	cwd := t.TempDir()
	const sessions = 12
	for i := range sessions {
		ok := t.Run(fmt.Sprintf("session%02d", i), func(t *testing.T) {
			c := dial(t, g)
			initializeAs(t, c, fsBoth, left(t, ctx, 5*time.Second, "initialize"))
			sid := openSession(t, c, cwd, left(t, ctx, 20*time.Second, "session/new"))
			echoTurn(t, c, sid, fmt.Sprintf("recycle check number %d", i), left(t, ctx, 20*time.Second, "the prompt"))
			closeClean(t, c)
		})
		if !ok {
			t.Fatalf("session %d failed", i)
		}
	}

	// Retiring the last process happens after its session closed: give
	// the counters a moment.
	var spawns, recycled float64
	deadline := time.Now().Add(left(t, ctx, 10*time.Second, "reading the metrics"))
	for {
		spawns, _ = metricSum(t, g, "acpgate_agent_spawns_total")
		recycled, _ = metricSum(t, g, "acpgate_agent_recycled_total")
		if (spawns >= 3 && recycled >= 2) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Keep sampling a little after the last recycle.
	time.Sleep(500 * time.Millisecond)
	stopSampling()

	t.Logf("%d sessions: %g spawns, %g recycled; peak %d agent processes %v at %s (%d samples)",
		sessions, spawns, recycled, len(peak.pids), peak.pids, peak.at.Round(time.Millisecond), samples)
	if recycled < 2 || spawns < 3 {
		t.Errorf("after %d sessions with recycle_after_sessions: 4: acpgate_agent_recycled_total %g (want ≥ 2), spawns %g (want ≥ 3):\n%s",
			sessions, recycled, spawns, metricLines(t, g, "acpgate_agent_"))
	}
	if len(peak.pids) > maxProcs {
		t.Errorf("%d agent processes ran at once (%v, %s into the run); max_processes is %d",
			len(peak.pids), peak.pids, peak.at.Round(time.Millisecond), maxProcs)
	}
	if samples < 10 {
		t.Errorf("only %d process samples were taken", samples)
	}
}

// TestClientRequestTimeout: a client that never answers the agent's
// permission request is answered for by the gateway after
// timeouts.client_request, with outcome "cancelled"; the demo agent then
// marks its tool call failed and ends the turn with stopReason "cancelled"
// (demoagent/turn.go, permission()). A late answer from the client is
// harmless.
func TestClientRequestTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const timeout = 2 * time.Second
	g := startGateway(t, gwOpts{config: "timeouts: {client_request: 2s}\n"})
	c := dial(t, g)
	initializeAs(t, c, fsBoth, left(t, ctx, 10*time.Second, "initialize"))
	sid := openSession(t, c, t.TempDir(), left(t, ctx, 20*time.Second, "session/new"))

	var (
		perm      *rpcMsg
		askedAt   time.Time
		reply     strings.Builder
		toolState = map[string]string{}
		cancels   int
	)
	id := c.Request("session/prompt", textPrompt(sid, "ask me for permission"))
	m := waitFor(t, c, "session/prompt (permission, unanswered)", id, left(t, ctx, 10*time.Second, "the prompt"), func(m rpcMsg) {
		switch m.Method {
		case "session/request_permission":
			if perm != nil {
				t.Errorf("a second permission request: %s", m.Raw)
				return
			}
			perm, askedAt = &m, time.Now()
			if m.Param("sessionId") != sid {
				t.Errorf("permission request for the wrong session: %s", m.Raw)
			}
			// Never answered.
		case "session/update":
			var u struct {
				SessionID string `json:"sessionId"`
				Update    struct {
					Kind       string          `json:"sessionUpdate"`
					ToolCallID string          `json:"toolCallId"`
					Status     string          `json:"status"`
					Content    json.RawMessage `json:"content"`
				} `json:"update"`
			}
			if err := json.Unmarshal(m.Params, &u); err != nil || u.SessionID != sid {
				t.Errorf("bad or foreign session/update: %s", m.Raw)
			}
			switch u.Update.Kind {
			case "tool_call", "tool_call_update":
				toolState[u.Update.ToolCallID] = u.Update.Status
			case "agent_message_chunk":
				reply.WriteString(parseUpdate(t, m).text())
			}
		case "$/cancel_request":
			// The gateway may tell the client its request is void.
			cancels++
		default:
			t.Errorf("unexpected message: %s", m.Raw)
		}
	})
	if perm == nil {
		t.Fatalf("the prompt ended without a permission request reaching the client: %s", m.Raw)
	}
	waited := time.Since(askedAt)
	if m.Error != nil {
		t.Fatalf("the prompt failed after %s instead of ending cancelled: %s", waited.Round(time.Millisecond), m.Raw)
	}
	if r := stopReason(t, m); r != "cancelled" {
		t.Fatalf("stopReason %q after %s, reply %q; want cancelled (the gateway answers the unanswered permission request with outcome cancelled)",
			r, waited.Round(time.Millisecond), reply.String())
	}
	if waited < timeout*3/4 || waited > 5*time.Second {
		t.Errorf("the turn ended %s after the permission request; want about client_request (%s), at most 5 s",
			waited.Round(time.Millisecond), timeout)
	}
	if reply.Len() > 0 {
		t.Errorf("the agent replied %q; on a cancelled permission request it says nothing", reply.String())
	}
	if toolState["call_1"] != "failed" {
		t.Errorf("tool call states %v; want call_1 failed", toolState)
	}
	t.Logf("turn cancelled %s after the unanswered permission request (%d $/cancel_request to the client)", waited.Round(time.Millisecond), cancels)

	// The client answers late: the connection carries on.
	c.Respond(perm.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
	echoTurn(t, c, sid, "still here after the late answer", left(t, ctx, 20*time.Second, "the prompt after the late answer"))
	closeClean(t, c)
}

// TestPoolInitializeNeverStarves: with a single agent process, held by
// client A (with fs), client B (without fs) is initialized at once and
// shares A's process.
func TestPoolInitializeNeverStarves(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const acquire = 3 * time.Second
	g := startGateway(t, gwOpts{config: "pool: {min_idle: 0, max_processes: 1, acquire_timeout: 3s}\n"})
	cwd := t.TempDir()

	a := dial(t, g)
	initializeAs(t, a, fsBoth, left(t, ctx, 20*time.Second, "A's initialize"))
	sidA := openSession(t, a, cwd, left(t, ctx, 20*time.Second, "A's session/new"))
	echoTurn(t, a, sidA, "client A is here", left(t, ctx, 20*time.Second, "A's prompt"))
	pidsA := g.agentPIDs()

	b := dial(t, g)
	// 5 s to tell a slow answer from none; it must come within 2 s.
	took := initializeAs(t, b, fsNone, left(t, ctx, 5*time.Second, "B's initialize"))
	if took > 2*time.Second {
		t.Fatalf("B's initialize took %s while A holds the only agent process; want < 2 s", took.Round(time.Millisecond))
	}
	start := time.Now()
	sidB := openSession(t, b, cwd, left(t, ctx, acquire+3*time.Second, "B's session/new"))
	t.Logf("B initialized in %s, its session opened in %s", took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	echoTurn(t, b, sidB, "client B shares the process", left(t, ctx, 20*time.Second, "B's prompt"))
	if pids := g.agentPIDs(); len(pids) > 1 {
		t.Errorf("agent processes %v (A's: %v); max_processes is 1", pids, pidsA)
	}
	// A is not disturbed.
	echoTurn(t, a, sidA, "client A is still here", left(t, ctx, 20*time.Second, "A's second prompt"))
	closeClean(t, b)
	closeClean(t, a)
}
