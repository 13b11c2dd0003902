package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/acpgate/acpgate/internal/syncbuf"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
)

// A request's hold is given back once: a second release changes nothing,
// and is counted and logged as the bug it is.
func TestHoldReleasedTwiceIsCountedAndLogged(t *testing.T) {
	var logs syncbuf.Buffer
	r := &Relay{sealer: sessionid.NewRandom(), log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: metrics.Nop()}
	c := r.newConnForBench(nil)
	c.log = r.log
	c.ag = &agent{name: DefaultAgent, metrics: r.metrics.ForAgent(DefaultAgent), sides: map[*pool.Process]*procSide{}}
	c.ag.obs = r.observers(c.ag, nil)
	c.ten.maxSessions = 1
	if ok, _ := c.ten.tryReserve(false); !ok {
		t.Fatal("the tenant's only slot was refused")
	}
	h := &hold{conn: c, quota: true}
	h.release()
	h.release()
	if c.ten.pending != 0 {
		t.Fatalf("tenant slots pending = %d after one hold was released twice, want 0", c.ten.pending)
	}
	if got := counterValue(c.ag.metrics.DoubleReleases.WithLabelValues("hold")); got != 1 {
		t.Errorf("acpgate_double_releases_total{what=hold} = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "released twice") {
		t.Errorf("no error logged for the double release: %q", logs.String())
	}
	// The tenant slot itself is guarded too.
	c.ten.unreserve(c.ag.metrics, c.log)
	if got := counterValue(c.ag.metrics.DoubleReleases.WithLabelValues("tenant_slot")); got != 1 || c.ten.pending != 0 {
		t.Errorf("a slot given back that was never held: counted %v, pending %d; want 1, 0", got, c.ten.pending)
	}
}

// detachedPair is two detached connections of one tenant, each holding a
// session whose turn ended while it was detached: each may take the other's
// over with a session/load.
func detachedPair(r *Relay, ag *agent, l *procSide) (a, b *Conn, sa, sb *Session) {
	mk := func(id string, seq uint64) *Conn {
		c := r.newConnForBench(nil) // no sink: detached
		c.id, c.seq, c.ag, c.log = id, seq, ag, r.log
		c.ten = r.tenants[""]
		c.detached, c.initialized = true, true
		return c
	}
	a, b = mk("a", 1), mk("b", 2)
	sa = l.addSession(a, sessionid.Opened{Agent: "sess-a"}, "", "/tmp", nil)
	a.index(sa)
	sb = l.addSession(b, sessionid.Opened{Agent: "sess-b"}, "", "/tmp", nil)
	b.index(sb)
	sa.turn.EndedWhileDetached("end_turn")
	sb.turn.EndedWhileDetached("end_turn")
	return a, b, sa, sb
}

// loadMsg is a session/load request for gwID, scanned as a connection
// scans it.
func loadMsg(t testing.TB, c *Conn, id int, gwID string) *jsonrpc.Message {
	var sc jsonrpc.Scanner
	sc.Methods = acp.Methods
	m := new(jsonrpc.Message)
	frame := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session/load","params":{"sessionId":%q,"cwd":"/tmp","mcpServers":[]}}`, id, gwID)
	if err := sc.Scan([]byte(frame), m, c.cr.resolve); err != nil {
		t.Fatal(err)
	}
	return m
}

// Two detached connections taking each other's sessions over at the same
// instant neither deadlock nor lose a session: each ends up with the
// other's, counted once.
func TestMutualTakeOverNeitherDeadlocksNorLosesASession(t *testing.T) {
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	pol := policy.Default()
	for i := range rounds {
		r := &Relay{sealer: sessionid.NewRandom(), log: slog.New(slog.DiscardHandler), metrics: metrics.Nop()}
		ten := makeTenant(TenantConfig{Policy: &pol}, nil, r.metrics)
		r.tenants = map[string]*tenant{"": ten}
		r.conns = map[*Conn]struct{}{}
		ag := &agent{name: DefaultAgent, metrics: r.metrics.ForAgent(DefaultAgent), sides: map[*pool.Process]*procSide{}}
		ag.obs = r.observers(ag, nil)
		ag.obs = r.observers(ag, nil)
		l := ag.newSide(nil).(*procSide) // take-overs never reach the process
		a, b, sa, sb := detachedPair(r, ag, l)
		ma, mb := loadMsg(t, a, 1, sb.GatewayID), loadMsg(t, b, 1, sa.GatewayID)
		var wg sync.WaitGroup
		var tookA, tookB bool
		wg.Add(2)
		// Each handles its load as its reader does (Conn.handleLocked,
		// then HandleFrom's check), both at once.
		var ready sync.WaitGroup
		ready.Add(2)
		start := make(chan struct{})
		takeOver := func(c *Conn, m *jsonrpc.Message, agentSID string, took *bool) {
			defer wg.Done()
			c.handleMu.Lock()
			ready.Done()
			<-start
			*took = c.cr.takeOver(m, agentSID)
			c.handleMu.Unlock()
			c.handled()
		}
		go takeOver(a, ma, sb.AgentID, &tookA)
		go takeOver(b, mb, sa.AgentID, &tookB)
		ready.Wait()
		close(start)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the two take-overs deadlocked", i)
		}
		if !tookA || !tookB {
			t.Fatalf("round %d: take-overs a=%v b=%v, want both", i, tookA, tookB)
		}
		if sa.Owner() != b || sb.Owner() != a {
			t.Fatalf("round %d: session a owned by %v, b by %v; want swapped", i, sa.Owner(), sb.Owner())
		}
		if a.sessions[sb.GatewayID] != sb || b.sessions[sa.GatewayID] != sa || len(a.sessions) != 1 || len(b.sessions) != 1 {
			t.Fatalf("round %d: a holds %v, b holds %v", i, a.sessions, b.sessions)
		}
		if ten.sessions != 2 {
			t.Fatalf("round %d: the tenant counts %d sessions, want 2", i, ten.sessions)
		}
		a.out.Release()
		b.out.Release()
	}
}

// max_sessions holds when the holder of a session ends while another
// connection's load of it is on its way: the load's slot is held from its
// quota check on, so no other session takes the one the holder gave back.
func TestQuotaHeldWhileHolderEndsDuringLoad(t *testing.T) {
	r := testPool(t, "demo", nil)
	pol := policy.Default()
	if err := r.UpdateTenants([]TenantConfig{{Policy: &pol, MaxSessions: 1}}); err != nil {
		t.Fatal(err)
	}
	a, b, c := newTestConn(t, r, "a"), newTestConn(t, r, "b"), newTestConn(t, r, "c")
	a.init(`{}`)
	b.init(`{}`)
	c.init(`{}`)
	sid := a.newSession("1")
	id, err := r.sealer.Open(b.c.scope, sid)
	if err != nil {
		t.Fatal(err)
	}
	agentSID := id.Agent
	// b's load of a's session passes its quota check (the session moves:
	// it is already counted)...
	m := loadMsg(t, b.c, 2, sid)
	if !b.c.ag.heldByTenant(agentSID, "") || !b.c.cr.reserveQuota(m, true) {
		t.Fatal("the load of a session the tenant holds was refused")
	}
	h := &hold{conn: b.c, quota: true}
	// ...then a ends before the session has moved.
	a.c.Close()
	// Another client's new session must not take the slot on its way.
	c.send(`{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`)
	if got := c.await("3", nil); got.Error == nil || got.Error.Code != codeQuota {
		t.Fatalf("session/new while a load holds the tenant's last slot: %s, want error %d", got.raw, codeQuota)
	}
	// The load goes on and completes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, err := b.c.cr.placeLoad(ctx, m, id, sid, nil, h)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := m.FieldOf(jsonrpc.FieldSessionID, -1)
	b.c.cr.send(ctx, m, rt, []jsonrpc.Edit{{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, agentSID)}}, nil)
	if got := b.await("2", nil); got.Error != nil {
		t.Fatalf("session/load: %s", got.raw)
	}
	ten := r.tenants[""]
	ten.mu.Lock()
	sessions, pending := ten.sessions, ten.pending
	ten.mu.Unlock()
	if sessions != 1 || pending != 0 {
		t.Fatalf("tenant holds %d sessions (%d slots pending), want 1 (max_sessions 1) and 0", sessions, pending)
	}
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// factSink is a sink that routes by the relay's facts (FactSink): it
// records them next to each message.
type factSink struct {
	sink
	mu    sync.Mutex
	facts map[string]Facts // by message
}

func (s *factSink) SendScanned(msg, id []byte, method, sessionID string, wait bool) bool {
	s.mu.Lock()
	s.facts[string(msg)] = Facts{ID: append([]byte(nil), id...), Method: method, SessionID: sessionID}
	s.mu.Unlock()
	return s.Send(msg, wait)
}

// A sink that routes by facts gets, with each answer and each session
// update, what a scan of the message would find: the answer's id, the
// update's method and the session ID the client sees.
func TestFactSinkGetsWhatAScanFinds(t *testing.T) {
	r := testPool(t, "demo", nil)
	s := &factSink{sink: sink{ch: make(chan []byte, 1000)}, facts: map[string]Facts{}}
	c, err := r.NewConn(ConnInfo{ID: "facts"}, s)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testConn{t: t, c: c, s: &s.sink}
	t.Cleanup(c.Close)
	tc.init(`{}`)
	sid := tc.newSession("1")
	tc.send(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[{"type":"text","text":"hello"}]}}`)
	updates := 0
	tc.await("2", func(m msg) {
		if m.Method == "session/update" {
			updates++
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	answers, scanned := 0, 0
	for raw, f := range s.facts {
		var m msg
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatal(err)
		}
		var p struct {
			SessionID string `json:"sessionId"`
		}
		_ = json.Unmarshal(m.Params, &p)
		switch {
		case m.Method == "" && string(f.ID) == string(m.ID) && f.Method == "":
			answers++
		case m.Method != "" && f.ID == nil && f.Method == m.Method && f.SessionID == p.SessionID && p.SessionID == sid:
			scanned++
		default:
			t.Errorf("facts %+v for %s", f, raw)
		}
	}
	if answers < 2 || scanned != updates || updates == 0 {
		t.Errorf("facts for %d answers and %d of %d updates", answers, scanned, updates)
	}
}

// A session holds one of its tenant's session slots however many
// connections hold it, until the last lets go; letting go more often than
// it was held is counted and logged, never a negative count.
func TestSessionHoldsOneTenantSlot(t *testing.T) {
	var logs syncbuf.Buffer
	pol := policy.Default()
	r := &Relay{sealer: sessionid.NewRandom(), log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: metrics.Nop()}
	ten := makeTenant(TenantConfig{Policy: &pol}, nil, r.metrics)
	r.tenants = map[string]*tenant{"": ten}
	r.conns = map[*Conn]struct{}{}
	ag := &agent{name: DefaultAgent, metrics: r.metrics.ForAgent(DefaultAgent), sides: map[*pool.Process]*procSide{}}
	ag.obs = r.observers(ag, nil)
	l := ag.newSide(nil).(*procSide)
	a, b, sa, _ := detachedPair(r, ag, l)
	count := func() int {
		ten.mu.Lock()
		defer ten.mu.Unlock()
		return ten.sessions
	}
	if got := count(); got != 2 {
		t.Fatalf("two sessions held: the tenant counts %d, want 2", got)
	}
	b.index(sa) // a second connection holds a's session too
	if got := count(); got != 2 {
		t.Fatalf("a session held by two connections: the tenant counts %d, want 2", got)
	}
	a.forget(sa)
	if got := count(); got != 2 {
		t.Fatalf("one of its two holders let go: the tenant counts %d, want 2", got)
	}
	b.forget(sa)
	if got := count(); got != 1 {
		t.Fatalf("the last holder let go: the tenant counts %d, want 1", got)
	}
	sa.dropRef(r.log) // a bug: nobody holds it
	if got := count(); got != 1 {
		t.Fatalf("a session let go once too often: the tenant counts %d, want 1", got)
	}
	if got := counterValue(ag.metrics.DoubleReleases.WithLabelValues("session_holder")); got != 1 {
		t.Errorf("acpgate_double_releases_total{what=session_holder} = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "more connections than held it") {
		t.Errorf("no error logged: %q", logs.String())
	}
	a.out.Release()
	b.out.Release()
}

// The relay's workers: Close waits for what runs, and once it has begun
// nothing more starts (Relay.Close closes them after the agents' readers,
// which start work, have stopped).
func TestWorkersCloseWaitsThenRefuses(t *testing.T) {
	var w workers
	release, ran := make(chan struct{}), make(chan struct{})
	w.Go(func() { close(ran); <-release })
	<-ran
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while work ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the work ended")
	}
	w.Go(func() { t.Error("work started after Close") })
	w.Close() // again: nothing to wait for
}
