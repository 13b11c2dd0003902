package pool

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/internal/syncbuf"
)

// The test binary doubles as the agent: with POOL_TEST_AGENT set it
// answers initialize, and echoes every other request's method back as a
// notification, on stdio.
func TestMain(m *testing.M) {
	if os.Getenv("POOL_TEST_AGENT") == "" {
		goleak.VerifyTestMain(m)
		return
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(in.Bytes(), &req)
		if req.Method == "initialize" {
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentInfo":{"name":"pooltest"}}}`+"\n", req.ID)
			continue
		}
		fmt.Printf(`{"jsonrpc":"2.0","method":"echo","params":{"method":%q}}`+"\n", req.Method)
	}
	os.Exit(0)
}

// recorder is a Handler that keeps what it is given.
type recorder struct {
	mu     sync.Mutex
	lines  []string
	exited chan error
}

func (r *recorder) Line(line []byte) {
	r.mu.Lock()
	r.lines = append(r.lines, string(line))
	r.mu.Unlock()
}
func (r *recorder) Tick(time.Time)   {}
func (r *recorder) Exited(err error) { r.exited <- err }
func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}
func newRecorder(*Process) *recorder { return &recorder{exited: make(chan error, 1)} }
func counter(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func testPool(t *testing.T, logs *syncbuf.Buffer, mutate func(*Config)) (*Pool, *sync.Map) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	handlers := &sync.Map{} // *Process → *recorder
	cfg := Config{
		Agent: AgentConfig{
			Command:   []string{exe, "-test.run=^$"},
			Env:       map[string]string{"POOL_TEST_AGENT": "1"},
			StopGrace: 2 * time.Second,
		},
		MaxProcesses:    2,
		AcquireTimeout:  10 * time.Second,
		MaxMessageBytes: 1 << 20,
		NewHandler: func(p *Process) Handler {
			r := newRecorder(p)
			handlers.Store(p, r)
			return r
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	var w *syncbuf.Buffer = logs
	if w == nil {
		w = &syncbuf.Buffer{}
	}
	p := New(cfg, slog.New(slog.NewTextHandler(w, nil)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	return p, handlers
}

func acquire(t *testing.T, p *Pool, forSession bool) *Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := p.Acquire(ctx, Profile{Version: 1}, forSession)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A lease is released once: a second release changes no count, and is
// logged and counted as the bug it is.
func TestLeaseReleasedTwiceIsCountedAndLogged(t *testing.T) {
	var logs syncbuf.Buffer
	p, _ := testPool(t, &logs, nil)
	l := acquire(t, p, true)
	if st := p.Stats(); st.Reserved != 1 {
		t.Fatalf("reserved %d after one session lease, want 1", st.Reserved)
	}
	home := acquire(t, p, false)
	l.Release()
	l.Release()
	home.Release()
	if st := p.Stats(); st.Reserved != 0 || st.Sessions != 0 {
		t.Fatalf("after the releases: %+v, want nothing held", st)
	}
	if got := counter(p.cfg.Metrics.DoubleReleases.WithLabelValues("session")); got != 1 {
		t.Errorf("double releases of sessions counted %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "released twice") {
		t.Errorf("no error logged for the double release:\n%s", logs.String())
	}
	var nobody *Lease
	nobody.Release() // held by no one: nothing to give back
}

// A client waiting for room is woken by the release that makes it, not by
// a periodic re-check.
func TestAcquireWaitsForRelease(t *testing.T) {
	p, _ := testPool(t, nil, func(c *Config) { c.MaxProcesses, c.MaxSessionsPerProcess = 1, 1 })
	first := acquire(t, p, true)
	got := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(context.Background(), Profile{Version: 1}, true)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	deadline := time.Now().Add(10 * time.Second)
	for waiting := 0; waiting == 0; {
		p.mu.Lock()
		waiting = p.waiters
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the second acquire never waited")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case l := <-got:
		t.Fatalf("a second session slot on a full pool: %v", l)
	default:
	}
	first.Commit()
	first.Release()
	second := <-got
	if second.Process() != first.Process() {
		t.Errorf("the freed slot went to another process")
	}
	second.Release()
}

// A process's lines go to its handler (the pool's initialize answer
// excepted), and its exit is reported once.
func TestHandlerGetsLinesAndExit(t *testing.T) {
	p, handlers := testPool(t, nil, nil)
	l := acquire(t, p, false)
	a := l.Process()
	v, _ := handlers.Load(a)
	rec := v.(*recorder)
	if err := a.Send(context.Background(), []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`+"\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(rec.got()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if lines := rec.got(); len(lines) != 1 || !strings.Contains(lines[0], `"ping"`) {
		t.Fatalf("handler got %q, want the echo of ping alone", lines)
	}
	if a.Init().Version != 1 {
		t.Errorf("init version %d, want 1", a.Init().Version)
	}
	l.Release()
	a.Stop()
	select {
	case err := <-rec.exited:
		if err == nil {
			t.Error("no exit reason")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never heard of the exit")
	}
	if _, ok := a.LeaseRequest(); ok {
		t.Error("a request lease on a dead process")
	}
}

// A process that has served pool.recycle_after_sessions sessions retires:
// it takes no new session.
func TestCommitRetiresAfterSessions(t *testing.T) {
	p, _ := testPool(t, nil, func(c *Config) { c.RecycleAfterSessions = 1 })
	l := acquire(t, p, true)
	l.Commit()
	l.Commit() // once only
	if !l.Process().Retiring() {
		t.Fatal("not retiring after its one session")
	}
	if st := p.Stats(); st.Sessions != 1 || st.Reserved != 0 {
		t.Errorf("after a commit: %+v, want 1 session, 0 reserved", st)
	}
	next := acquire(t, p, true)
	if next.Process() == l.Process() {
		t.Error("a retiring process was chosen for a new session")
	}
	next.Release()
	l.Release()
}

// The warm choice: the most recently active tenant without an idle
// process.
func TestWarmTenant(t *testing.T) {
	q := &Pool{tenants: []string{"a", "b", "c"}, lastUse: map[string]uint64{"b": 2, "c": 1}}
	if got := q.warmTenantLocked(); got != "b" {
		t.Errorf("warm tenant %q, want b (the most recently active)", got)
	}
	idle := &Process{prof: Profile{Tenant: "b"}}
	idle.state.Store(uint32(Ready))
	q.procs = []*Process{idle}
	if got := q.warmTenantLocked(); got != "c" {
		t.Errorf("warm tenant %q, want c (b has an idle process)", got)
	}
}

// NewHandler runs with no pool lock held: a handler may use the pool's
// API (here Profile, which takes the pool's lock) while it is made.
func TestNewHandlerRunsUnlocked(t *testing.T) {
	made := make(chan Profile, 4)
	p, _ := testPool(t, nil, func(c *Config) {
		c.NewHandler = func(a *Process) Handler {
			select {
			case made <- a.Profile():
			default:
			}
			return newRecorder(a)
		}
	})
	got := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(context.Background(), Profile{Version: 1}, false)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case l := <-got:
		if prof := <-made; prof.Version != 1 {
			t.Errorf("the handler saw profile %+v", prof)
		}
		l.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("no process within 10 s: NewHandler deadlocked on the pool's lock")
	}
}

// A process whose command cannot start is never reaped, yet its handler
// hears of its end, as of any exit.
func TestFailedStartTellsHandler(t *testing.T) {
	p, handlers := testPool(t, nil, func(c *Config) {
		c.Agent.Command = []string{"/nonexistent/acpgate-pool-test-agent"}
		c.MaxProcesses = 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Acquire(ctx, Profile{Version: 1}, false); err == nil {
		t.Fatal("a lease on a process that cannot start")
	}
	n := 0
	handlers.Range(func(k, v any) bool {
		n++
		select {
		case err := <-v.(*recorder).exited:
			if err == nil {
				t.Error("Exited without the start's error")
			}
		case <-time.After(10 * time.Second):
			t.Error("the handler of a process that never started never heard of its end")
		}
		select {
		case <-k.(*Process).Exited():
		default:
			t.Error("Exited() is not closed for a process that never started")
		}
		return true
	})
	if n == 0 {
		t.Fatal("no handler was made")
	}
	if st := p.Stats(); st.Processes != 0 {
		t.Errorf("%d processes left, want 0", st.Processes)
	}
}

// RetireTenant retires one tenant's processes: an idle one stops, one with
// a session keeps it until it ends, new sessions get a fresh process, and
// the other tenant's processes are left alone.
func TestRetireTenant(t *testing.T) {
	p, _ := testPool(t, nil, func(c *Config) {
		c.TenantBound, c.Tenants, c.MinIdle, c.MaxProcesses, c.MaxSessionsPerProcess = true, []string{"a", "b"}, 0, 4, 1
	})
	get := func(tenant string) *Lease {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := p.Acquire(ctx, Profile{Tenant: tenant, Version: 1}, true)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	busy := get("a")
	busy.Commit()
	idle := get("a")
	idleProc := idle.Process()
	idle.Release()
	other := get("b")
	if busy.Process() == idleProc {
		t.Fatal("two sessions on one process with max_sessions_per_process 1")
	}
	if n := p.RetireTenant("a", "agent_env"); n != 2 {
		t.Fatalf("RetireTenant retired %d processes, want 2", n)
	}
	if n := p.RetireTenant("a", "agent_env"); n != 0 {
		t.Errorf("retiring again retired %d, want 0", n)
	}
	select {
	case <-idleProc.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the tenant's idle process was not stopped")
	}
	if !busy.Process().Alive() || !other.Process().Alive() || other.Process().Retiring() {
		t.Fatal("the busy process or the other tenant's was stopped or retired")
	}
	fresh := get("a")
	if fresh.Process() == busy.Process() || fresh.Process() == idleProc {
		t.Error("a retired process took a new session")
	}
	fresh.Release()
	other.Release()
	busy.Release()
	select {
	case <-busy.Process().Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the retired process was not stopped once its session ended")
	}
}
