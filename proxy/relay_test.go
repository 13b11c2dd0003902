package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/demoagent"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/pool"
)

// The test binary doubles as the agent: with ACPGATE_TEST_AGENT set it runs
// the demo agent (or misbehaves as told) on stdio, so the pool is tested
// against real subprocesses.
func TestMain(m *testing.M) {
	switch os.Getenv("ACPGATE_TEST_AGENT") {
	case "":
		goleak.VerifyTestMain(m)
		return
	case "demo":
		err := demoagent.Run(context.Background(), os.Stdin, os.Stdout, demoagent.Options{
			StateDir: os.Getenv("ACPGATE_TEST_STATE"), ChunkDelay: -1,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "exit3":
		os.Exit(3)
	case "flood":
		floodingAgent()
		os.Exit(0)
	case "permcount":
		permCountingAgent()
		os.Exit(0)
	case "usage":
		usageAgent()
		os.Exit(0)
	case "traced":
		tracedAgent()
		os.Exit(0)
	case "traced-v2":
		tracedV2Agent()
		os.Exit(0)
	case "child-steal":
		childStealAgent()
		os.Exit(0)
	case "init-error":
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.NewDecoder(os.Stdin).Decode(&req)
		fmt.Printf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"no credentials"}}`+"\n", req.ID)
		os.Exit(0)
	}
}

// testPool is a relay on a test agent (mode: see TestMain); mutate changes
// its pool's config, opts the relay's.
func testPool(t testing.TB, mode string, mutate func(*PoolConfig), opts ...func(*Config)) *Relay {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := PoolConfig{
		Agent: AgentConfig{
			Command:   []string{exe, "-test.run=^$"},
			Env:       map[string]string{"ACPGATE_TEST_AGENT": mode, "ACPGATE_TEST_STATE": t.TempDir()},
			StopGrace: 2 * time.Second,
		},
		MinIdle:         0,
		MaxProcesses:    4,
		AcquireTimeout:  10 * time.Second,
		MaxMessageBytes: 1 << 20,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	pol := policy.Default()
	pol.Extensions = []string{"_demo/*"} // the tests use the demo agent's echo
	rc := Config{Pool: cfg, ClientCaps: AllCapabilities, Tenants: []TenantConfig{{Policy: &pol}}}
	for _, o := range opts {
		o(&rc)
	}
	return startRelay(t, rc)
}

// startRelay is a relay on rc, closed when the test ends.
func startRelay(t testing.TB, rc Config) *Relay {
	t.Helper()
	r, err := NewRelay(rc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close relay: %v", err)
		}
	})
	return r
}

// sink collects what the relay sends one client.
type sink struct {
	ch chan []byte
}

func (s *sink) Supersede() {}

func (s *sink) Send(msg []byte, _ bool) bool {
	s.ch <- msg
	return true
}

type testConn struct {
	t testing.TB
	c *Conn
	s *sink
}

func newTestConn(t testing.TB, r *Relay, name string) *testConn {
	return connWith(t, r, ConnInfo{ID: name})
}

// connWith is a client of r's connection made with info, closed when the
// test ends.
func connWith(t testing.TB, r *Relay, info ConnInfo) *testConn {
	t.Helper()
	s := &sink{ch: make(chan []byte, 1000)}
	c, err := r.NewConn(info, s)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testConn{t: t, c: c, s: s}
	t.Cleanup(tc.c.Close)
	return tc
}

type msg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	raw string
}

func (tc *testConn) send(s string) { tc.c.Handle([]byte(s)) }

func (tc *testConn) next() msg {
	tc.t.Helper()
	select {
	case b := <-tc.s.ch:
		var m msg
		if err := json.Unmarshal(b, &m); err != nil {
			tc.t.Fatalf("relay sent invalid JSON %q: %v", b, err)
		}
		m.raw = string(b)
		return m
	case <-time.After(10 * time.Second):
		tc.t.Fatal("no message within 10 s")
	}
	return msg{}
}

// await returns the response with the given raw id, passing other messages
// to other.
func (tc *testConn) await(id string, other func(msg)) msg {
	tc.t.Helper()
	for {
		m := tc.next()
		if m.Method == "" && string(m.ID) == id {
			return m
		}
		if other != nil {
			other(m)
		}
	}
}

func (tc *testConn) init(caps string) {
	tc.t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":` + caps + `}}`)
	if m := tc.await(`"init"`, nil); m.Error != nil {
		tc.t.Fatalf("initialize: %s", m.raw)
	}
}

func (tc *testConn) newSession(id string) string {
	tc.t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`)
	m := tc.await(id, nil)
	var r struct {
		SessionID string `json:"sessionId"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || r.SessionID == "" {
		tc.t.Fatalf("session/new: %s", m.raw)
	}
	return r.SessionID
}

const fsCaps = `{"fs":{"readTextFile":true,"writeTextFile":true}}`

func TestClientIDsDoNotCollide(t *testing.T) {
	r := testPool(t, "demo", func(c *PoolConfig) { c.MaxProcesses = 1 })
	a, b := newTestConn(t, r, "a"), newTestConn(t, r, "b")
	a.init(fsCaps)
	b.init(fsCaps)
	// Both clients use id 7 at once; each gets its own answer.
	sa, sb := a.newSession("7"), b.newSession("7")
	if sa == sb {
		t.Fatal("two sessions got one ID")
	}
	for _, tc := range []struct {
		c    *testConn
		sid  string
		text string
	}{{a, sa, "from a"}, {b, sb, "from b"}} {
		tc.c.send(`{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"` + tc.sid + `","prompt":[{"type":"text","text":"` + tc.text + `"}]}}`)
	}
	for _, tc := range []struct {
		c    *testConn
		sid  string
		text string
	}{{a, sa, "from a"}, {b, sb, "from b"}} {
		var got strings.Builder
		m := tc.c.await("7", func(m msg) {
			var u struct {
				SessionID string `json:"sessionId"`
				Update    struct {
					Content struct{ Text string } `json:"content"`
				} `json:"update"`
			}
			_ = json.Unmarshal(m.Params, &u)
			if u.SessionID != tc.sid {
				t.Errorf("update for %q reached the client of %q", u.SessionID, tc.sid)
			}
			got.WriteString(u.Update.Content.Text)
		})
		if m.Error != nil || got.String() != "You said: "+tc.text {
			t.Errorf("prompt %q: %s, text %q", tc.text, m.raw, got.String())
		}
	}
}

// One process serves clients with and without file access; for the one
// without, the gateway answers the agent's fs requests itself from the
// session's workspace, and the client never sees them.
func TestOneProcessServesEveryFsProfile(t *testing.T) {
	r := testPool(t, "demo", nil)
	full, bare := newTestConn(t, r, "full"), newTestConn(t, r, "bare")
	full.init(fsCaps)
	bare.init(`{}`)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/notes.txt", []byte("the notes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bare.send(`{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"` + dir + `","mcpServers":[]}}`)
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if m := bare.await("1", nil); m.Error != nil || json.Unmarshal(m.Result, &sess) != nil {
		t.Fatalf("session/new: %s", m.raw)
	}
	sidFull := full.newSession("1")
	if n := r.Pool().Stats().Processes; n != 1 {
		t.Fatalf("clients that differ only in file access use %d processes, want 1", n)
	}
	bare.send(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"` + sess.SessionID + `","prompt":[{"type":"text","text":"read ` + dir + `/notes.txt"}]}}`)
	var reply strings.Builder
	m := bare.await("2", func(m msg) {
		if strings.HasPrefix(m.Method, "fs/") {
			t.Fatalf("a client without file access was asked: %s", m.raw)
		}
		reply.WriteString(m.raw)
	})
	if m.Error != nil || !strings.Contains(reply.String(), "the notes") {
		t.Fatalf("the agent did not get the file from the gateway: %s; updates %s", m.raw, reply.String())
	}
	// The client with file access is still asked itself.
	full.send(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"` + sidFull + `","prompt":[{"type":"text","text":"read /tmp/x.txt"}]}}`)
	asked := false
	full.await("2", func(m msg) {
		if m.Method == "fs/read_text_file" {
			asked = true
			full.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"content":"from the client"}}`)
		}
	})
	if !asked {
		t.Fatal("the client with fs.readTextFile was not asked to read")
	}
}

// terminalRelay is a relay of one demo agent process whose policy allows
// the client terminal.
func terminalRelay(t *testing.T) *Relay {
	pol := policy.Default()
	pol.Client.Terminal = true
	r := testPool(t, "demo", func(c *PoolConfig) { c.MaxProcesses = 1; c.AcquireTimeout = 5 * time.Second })
	if err := r.UpdateTenants([]TenantConfig{{Policy: &pol}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// With terminal allowed, terminal and non-terminal clients need different
// processes; on a full pool an unused process of the other kind is replaced,
// so neither kind starves.
func TestTerminalSplitNeverStarves(t *testing.T) {
	r := terminalRelay(t)
	for i, caps := range []string{`{"terminal":true}`, `{}`, `{"terminal":true}`} {
		c := newTestConn(t, r, fmt.Sprint("c", i))
		start := time.Now()
		c.init(caps)
		c.newSession("1")
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("client %d (%s) waited %s", i, caps, d)
		}
		told := r.agentList()[0].sideList()[0].p.Profile()
		if want := strings.Contains(caps, "terminal"); told.Terminal != want {
			t.Fatalf("client %d (%s) got a process told terminal=%v", i, caps, told.Terminal)
		}
		c.c.Close()
		// Once the session/close is answered the process is unused, and
		// the next client's kind replaces it.
		waitFor(t, "the process to become unused", func() bool {
			st := r.Pool().Stats()
			return st.Sessions == 0 && st.Reserved == 0 && st.Requests == 0
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client with terminal may use a process told none when the pool cannot
// give it one of its own: it is never made to wait for one.
func TestTerminalClientUsesPlainProcessWhenFull(t *testing.T) {
	r := terminalRelay(t)
	plain := newTestConn(t, r, "plain")
	plain.init(`{}`)
	plain.newSession("1") // the only process, busy with a session
	term := newTestConn(t, r, "term")
	start := time.Now()
	term.init(`{"terminal":true}`)
	term.newSession("1")
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the terminal client waited %s for a process it could use at once", d)
	}
	if n := r.Pool().Stats().Processes; n != 1 {
		t.Fatalf("%d processes on a pool of 1", n)
	}
}

func TestSessionsPackOntoProcesses(t *testing.T) {
	r := testPool(t, "demo", func(c *PoolConfig) { c.MaxSessionsPerProcess = 2 })
	c := newTestConn(t, r, "c")
	c.init(fsCaps)
	for i := 1; i <= 3; i++ {
		c.newSession(fmt.Sprint(i))
	}
	st := r.Pool().Stats()
	if st.Processes != 2 || st.Sessions != 3 {
		t.Fatalf("3 sessions at 2 per process: %+v", st)
	}
	c.c.Close() // sessions are closed on the agent and leave the pool
	deadline := time.Now().Add(5 * time.Second)
	for r.Pool().Stats().Sessions != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sessions still held after the client left: %+v", r.Pool().Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSessionListIsRewritten(t *testing.T) {
	r := testPool(t, "demo", nil)
	c := newTestConn(t, r, "c")
	c.init(fsCaps)
	sid := c.newSession("1")
	c.send(`{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}`)
	m := c.await("2", nil)
	if strings.Contains(m.raw, `"demo-`) {
		t.Fatalf("session/list leaks agent session IDs: %s", m.raw)
	}
	if !strings.Contains(m.raw, `"`+sid+`"`) {
		t.Fatalf("session/list lacks the client's session %s: %s", sid, m.raw)
	}
}

func TestAgentThatCannotStart(t *testing.T) {
	for _, tc := range []struct {
		mode, want string
	}{
		{"exit3", "exit status 3"},
		{"init-error", "no credentials"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			r := testPool(t, tc.mode, nil)
			c := newTestConn(t, r, "c")
			c.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
			m := c.await("1", nil)
			// The client hears that the agent fails, without host details
			// (argv, the agent's own words); the pool keeps those for logs.
			if m.Error == nil || !strings.Contains(m.Error.Message, "the agent is failing to start") {
				t.Fatalf("initialize against a failing agent: %s", m.raw)
			}
			last := fmt.Sprint(r.Pool().LastError())
			if !strings.Contains(last, tc.want) {
				t.Fatalf("the pool's last error %q lacks %q", last, tc.want)
			}
			// While backing off, the next client hears at once, without a
			// spawn storm.
			start := time.Now()
			c2 := newTestConn(t, r, "c2")
			c2.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
			m = c2.await("1", nil)
			if m.Error == nil || !strings.Contains(m.Error.Message, "failing to start") || time.Since(start) > time.Second {
				t.Fatalf("second client: %s after %s", m.raw, time.Since(start))
			}
			if r.Pool().Ready() {
				t.Fatal("a pool whose agent cannot start reports ready")
			}
		})
	}
}

func TestConcurrentClients(t *testing.T) {
	r := testPool(t, "demo", func(c *PoolConfig) { c.MaxProcesses = 2; c.MaxSessionsPerProcess = 50 })
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newTestConn(t, r, fmt.Sprint("c", i))
			c.init(fsCaps)
			sid := c.newSession("1")
			for j := range 5 {
				id := fmt.Sprint(10 + j)
				c.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"_demo/echo","params":{"n":` + id + `,"sessionId":"` + sid + `"}}`)
				m := c.await(id, nil)
				if !strings.Contains(string(m.Result), `"n":`+id) {
					t.Errorf("echo %s: %s", id, m.raw)
				}
			}
			c.c.Close()
		}()
	}
	wg.Wait()
}

// TestTenantBoundPool: with processes bound to a tenant from their start
// (the sandbox), warm processes are started for a tenant, a process is
// never handed to another tenant, and each start is launched for its
// tenant.
func TestTenantBoundPool(t *testing.T) {
	var mu sync.Mutex
	var launched []string
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	cfg := PoolConfig{
		Agent: AgentConfig{
			Command:   []string{exe, "-test.run=^$"},
			StopGrace: 2 * time.Second,
			Launch: func(tenant string) (Launch, error) {
				mu.Lock()
				launched = append(launched, tenant)
				mu.Unlock()
				return Launch{Env: append(os.Environ(), "ACPGATE_TEST_AGENT=demo", "ACPGATE_TEST_STATE="+state), Sandbox: "test"}, nil
			},
		},
		MinIdle: 1, MaxProcesses: 4, AcquireTimeout: 10 * time.Second, MaxMessageBytes: 1 << 20,
		TenantBound: true, Tenants: []string{"a", "b"},
	}
	p := pool.New(cfg, slog.New(slog.DiscardHandler))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !p.Ready() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	if !slices.Equal(launched, []string{"a"}) {
		t.Errorf("warm launches %v, want one for the first configured tenant", launched)
	}
	mu.Unlock()
	b, err := p.Acquire(ctx, Profile{Tenant: "b", Version: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if got := b.Process().Profile().Tenant; got != "b" {
		t.Fatalf("tenant b was given a process of tenant %q", got)
	}
	mu.Lock()
	if !slices.Contains(launched, "b") {
		t.Errorf("no process launched for b: %v", launched)
	}
	mu.Unlock()

}
