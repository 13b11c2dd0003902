package proxy

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// permPair is two clients of one session on the permcount agent (one
// process), a its owner and b attached, with a permission request of the
// agent's waiting for both: qa and qb are their copies.
type permPair struct {
	r      *Relay
	w      *watcher
	a, b   *testConn
	sid    string
	qa, qb msg
}

func newPermPair(t *testing.T, w *watcher) *permPair {
	t.Helper()
	r := testPool(t, "permcount", func(p *PoolConfig) { p.MaxProcesses = 1 }, func(c *Config) {
		c.Observers = []observe.Observer{w}
		if w.decide != nil {
			c.Deciders = []observe.Decider{w}
		}
	})
	pp := &permPair{r: r, w: w, a: newTestConn(t, r, "a"), b: newTestConn(t, r, "b")}
	pp.a.init(`{}`)
	pp.b.init(`{}`)
	pp.sid = pp.a.newSession("1")
	if res := pp.b.attach("2", pp.sid, ""); res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	if w.decide == nil {
		pp.a.prompt("3", pp.sid, "go")
		pp.qa, pp.qb = pp.a.untilMethod(acp.RequestPermission, nil), pp.b.untilMethod(acp.RequestPermission, nil)
	}
	return pp
}

// answers is how many answers to its requests the agent got, asked on tc.
func answers(t *testing.T, tc *testConn, id string) int {
	t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":"` + id + `","method":"_demo/count","params":{}}`)
	got := tc.await(`"`+id+`"`, nil)
	var res struct {
		Answers int `json:"answers"`
	}
	if err := json.Unmarshal(got.Result, &res); err != nil {
		t.Fatalf("_demo/count: %s", got.raw)
	}
	return res.Answers
}

// withdrawn waits for tc to be sent $/cancel_request for q, its copy.
func withdrawn(t *testing.T, tc *testConn, q msg) {
	t.Helper()
	m := tc.untilMethod(acp.CancelRequest, nil)
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(m.Params, &p) != nil || string(p.RequestID) != string(q.ID) {
		t.Fatalf("%s withdrew %s, want its copy %s", tc.c, m.Params, q.ID)
	}
}

// resolved waits for the PermissionResolved events to settle and returns
// them: exactly one is wanted.
func resolved(t *testing.T, w *watcher) observe.Event {
	t.Helper()
	waitFor(t, "PermissionResolved", func() bool { return w.find(observe.PermissionResolved) != nil })
	time.Sleep(50 * time.Millisecond) // a second one would have come by now
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []observe.Event
	for _, e := range w.events {
		if e.Kind == observe.PermissionResolved {
			out = append(out, e)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d PermissionResolved events, want 1: %+v", len(out), out)
	}
	return out[0]
}

// A client's answer settles the request: the agent gets it once, the
// other client's copy is withdrawn, observers hear it once, by the client.
func TestSettleByClient(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	pp.a.send(`{"jsonrpc":"2.0","id":` + string(pp.qa.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	withdrawn(t, pp.b, pp.qb)
	if m := pp.a.await("3", nil); m.Error != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	if n := answers(t, pp.a, "n"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
	if e := resolved(t, pp.w); e.By != byClient || e.Client.Conn != "a" || string(e.Outcome) != `{"outcome":"selected","optionId":"allow"}` {
		t.Fatalf("resolved %+v", e)
	}
	// b's late answer is dropped.
	pp.b.send(`{"jsonrpc":"2.0","id":` + string(pp.qb.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	if n := answers(t, pp.a, "n2"); n != 1 {
		t.Fatalf("after a late answer the agent got %d answers, want 1", n)
	}
}

// The last client to let go settles it in the clients' place, once: the
// first to go settles nothing.
func TestSettleByDisconnect(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	pp.b.c.Close()
	c := newTestConn(t, pp.r, "c") // on the same process: the agent's count
	c.init(`{}`)
	if n := answers(t, c, "n"); n != 0 || pp.w.find(observe.PermissionResolved) != nil {
		t.Fatalf("one of two clients left: the agent got %d answers, events %v", n, pp.w.kinds())
	}
	pp.a.c.Close()
	if e := resolved(t, pp.w); e.By != byDisconnect || e.Client.Conn != "" || string(e.Outcome) != `{"outcome":"cancelled"}` {
		t.Fatalf("resolved %+v", e)
	}
	if n := answers(t, c, "n2"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
}

// A request no client answers in time is settled once, every copy
// withdrawn, however often the maintainer looks.
func TestSettleByTimeout(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	l := sessionOf(pp.a, pp.sid).side
	later := time.Now().Add(time.Hour)
	l.expireInbound(later, time.Minute)
	l.expireInbound(later, time.Minute)
	withdrawn(t, pp.a, pp.qa)
	withdrawn(t, pp.b, pp.qb)
	if e := resolved(t, pp.w); e.By != byTimeout {
		t.Fatalf("resolved %+v", e)
	}
	if n := answers(t, pp.a, "n"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
}

// An administrator ending the session settles its requests once, every
// copy withdrawn.
func TestSettleByAdmin(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	if _, err := pp.r.EndSession(pp.sid, "test"); err != nil {
		t.Fatal(err)
	}
	withdrawn(t, pp.a, pp.qa)
	withdrawn(t, pp.b, pp.qb)
	if e := resolved(t, pp.w); e.By != byAdmin {
		t.Fatalf("resolved %+v", e)
	}
	if n := answers(t, pp.a, "n"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
}

// The agent's death settles its requests: nothing is sent to it, every
// copy is withdrawn, and observers hear it was cancelled.
func TestSettleByAgentExit(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	pp.a.send(`{"jsonrpc":"2.0","id":"die","method":"_demo/exit","params":{}}`)
	withdrawn(t, pp.a, pp.qa)
	withdrawn(t, pp.b, pp.qb)
	if e := resolved(t, pp.w); e.By != byAgentExited || string(e.Outcome) != `{"outcome":"cancelled"}` {
		t.Fatalf("resolved %+v", e)
	}
}

// A decider settles it before any client is asked: the agent gets the
// decision once, the member hears who decided, observers hear it once.
func TestSettleByDecider(t *testing.T) {
	w := &watcher{decide: &observe.Decision{Outcome: []byte(`{"outcome":"selected","optionId":"allow"}`), By: "rule:go", Rule: "go *", Decide: "allow"}}
	pp := newPermPair(t, w)
	pp.a.prompt("3", pp.sid, "go")
	if m := pp.a.await("3", func(m msg) {
		if m.Method == acp.RequestPermission {
			t.Errorf("the client was asked: %s", m.raw)
		}
	}); m.Error != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	for {
		m := pp.b.next()
		if m.Method == acp.RequestPermission {
			t.Fatalf("the member was asked: %s", m.raw)
		}
		if m.Method == acp.SessionUpdate && m.update().SessionUpdate == "permission_resolved" {
			break
		}
	}
	if e := resolved(t, w); e.By != "rule:go" || e.Rule != "go *" {
		t.Fatalf("resolved %+v", e)
	}
	if n := answers(t, pp.a, "n"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
}

// A request no client can take is answered once by the gateway.
func TestSettleOrphan(t *testing.T) {
	pp := newPermPair(t, &watcher{})
	l := sessionOf(pp.a, pp.sid).side
	var m jsonrpc.Message
	var sc jsonrpc.Scanner
	if err := sc.Scan([]byte(`{"jsonrpc":"2.0","id":"x1","method":"session/request_permission","params":{}}`), &m, nil); err != nil {
		t.Fatal(err)
	}
	l.reader.orphan(&m, "test")
	if n := answers(t, pp.a, "n"); n != 1 {
		t.Fatalf("the agent got %d answers, want 1", n)
	}
}

// Every way of settling at once, on one request: the agent gets exactly
// one answer and observers hear of exactly one settlement, every round.
func TestSettleRacesOnce(t *testing.T) {
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	pp := newPermPair(t, &watcher{})
	l := sessionOf(pp.a, pp.sid).side
	for i := range rounds {
		pid := "3"
		if i > 0 {
			pid = strconv.Itoa(100 + i)
			pp.a.prompt(pid, pp.sid, "go")
			pp.qa, pp.qb = pp.a.untilMethod(acp.RequestPermission, nil), pp.b.untilMethod(acp.RequestPermission, nil)
		}
		ins := l.inbound()
		if len(ins) != 1 {
			t.Fatalf("round %d: %d requests waiting, want 1", i, len(ins))
		}
		in := ins[0]
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, f := range []func(){
			func() {
				pp.a.c.Handle([]byte(`{"jsonrpc":"2.0","id":` + string(pp.qa.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`))
			},
			func() {
				pp.b.c.Handle([]byte(`{"jsonrpc":"2.0","id":` + string(pp.qb.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`))
			},
			func() { in.expire(time.Now().Add(time.Hour), time.Minute) },
			func() { in.settle(inPlace(byAdmin, jsonrpc.CodeRequestCancelled, "test")) },
			func() { in.lastLeft(pp.a.c, "test") },
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				f()
			}()
		}
		close(start)
		wg.Wait()
		pp.a.await(pid, nil) // the agent had an answer: the turn ends
		if n := answers(t, pp.a, "n"+strconv.Itoa(i)); n != i+1 {
			t.Fatalf("round %d: the agent got %d answers in all, want %d", i, n, i+1)
		}
	}
	waitFor(t, "the events", func() bool { return resolvedCount(pp.w) >= rounds })
	time.Sleep(50 * time.Millisecond)
	if n := resolvedCount(pp.w); n != rounds {
		t.Fatalf("%d PermissionResolved events for %d requests", n, rounds)
	}
}

func resolvedCount(w *watcher) int {
	n := 0
	for _, k := range w.kinds() {
		if k == observe.PermissionResolved {
			n++
		}
	}
	return n
}
