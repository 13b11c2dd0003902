package proxy

import (
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/policy"
)

// A session ends once, whatever ends it and however many things end it at
// the same moment: its owner's connection closing, its attached client
// detaching, an administrator, and its owner's session/close racing each
// other. Observers hear of its close once, every slot it held is given
// back once (no double release), and its tenant holds no session after.
func TestSessionEndsOnceWhateverEndsIt(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := &watcher{}
	r := testPool(t, "usage", func(p *PoolConfig) { p.MaxProcesses = 1 }, func(c *Config) {
		pol := policy.Default()
		c.Metrics = metrics.New(reg, 10)
		c.Tenants = []TenantConfig{{Name: "acme", Policy: &pol}}
		c.Observers = []observe.Observer{w}
	})
	const rounds = 30
	for i := range rounds {
		owner, member := acmeConn(t, r, fmt.Sprintf("o%d", i)), acmeConn(t, r, fmt.Sprintf("m%d", i))
		owner.init(`{}`)
		member.init(`{}`)
		sid := owner.newSession("1")
		if m := member.attach("2", sid, ""); m.Error != nil {
			t.Fatalf("attach: %s", m.raw)
		}
		var wg sync.WaitGroup
		ends := []func(){
			func() { owner.c.Close() },
			func() {
				member.send(`{"jsonrpc":"2.0","id":3,"method":"session/detach","params":{"sessionId":"` + sid + `"}}`)
			},
			func() { _, _ = r.EndSession(sid, "test") },
			func() { member.c.Close() },
		}
		// Each round starts the ends in another order.
		for k := range ends {
			f := ends[(k+i)%len(ends)]
			wg.Go(f)
		}
		wg.Wait()
		waitFor(t, "the session's end", func() bool { return closedEvents(w, sid) > 0 })
	}
	for _, e := range w.events {
		if e.Kind == observe.SessionClosed && closedEvents(w, e.Session.ID) != 1 {
			t.Errorf("session %s: %d session closed events, want 1", e.Session.ID, closedEvents(w, e.Session.ID))
		}
	}
	if n := metricValue(t, reg, "acpgate_double_releases_total", nil); n != 0 {
		t.Errorf("acpgate_double_releases_total = %v, want 0", n)
	}
	ten := r.tenants["acme"]
	waitFor(t, "the tenant's sessions given back", func() bool {
		ten.mu.Lock()
		defer ten.mu.Unlock()
		return ten.sessions == 0
	})
	ag := r.agents[DefaultAgent]
	waitFor(t, "the process's session slots given back", func() bool {
		for _, n := range ag.pool.Stats().PerProcess {
			if n != 0 {
				return false
			}
		}
		return true
	})
}

func closedEvents(w *watcher, sid string) int { return eventsAbout(w, sid, observe.SessionClosed) }

func lostEvents(w *watcher, sid string) int { return eventsAbout(w, sid, observe.SessionLost) }

// eventsAbout counts the events of kind about session sid w heard.
func eventsAbout(w *watcher, sid string, kind observe.Kind) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.events {
		if e.Kind == kind && e.Session.ID == sid {
			n++
		}
	}
	return n
}

// Session.end runs the teardown once however many causes end the session
// at the same moment: exactly one call reports it ended the session, and
// observers hear of one end.
func TestSessionEndRunsOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := &watcher{}
	r := testPool(t, "usage", nil, func(c *Config) {
		pol := policy.Default()
		c.Metrics = metrics.New(reg, 10)
		c.Tenants = []TenantConfig{{Name: "acme", Policy: &pol}}
		c.Observers = []observe.Observer{w}
	})
	causes := []endCause{endClosed, endReplaced, endLoadFailed, endClientLeft, endLastClientLeft, endAdmin, endAgentExited, endRefused}
	for i := range 20 {
		c := acmeConn(t, r, fmt.Sprintf("c%d", i))
		c.init(`{}`)
		sid := c.newSession("1")
		s := sessionOf(c, sid)
		var ended sync.WaitGroup
		var mu sync.Mutex
		var won []endCause
		for _, cause := range causes {
			ended.Go(func() {
				if s.end(cause, c.c) {
					mu.Lock()
					won = append(won, cause)
					mu.Unlock()
				}
			})
		}
		ended.Wait()
		if len(won) != 1 {
			t.Fatalf("round %d: %d calls ended the session (%v), want 1", i, len(won), won)
		}
		if st := s.stage(); st != stageEnded && st != stageLost {
			t.Errorf("round %d: stage %d after its end", i, st)
		}
		if n := closedEvents(w, sid) + lostEvents(w, sid); won[0] != endReplaced && won[0] != endLoadFailed && n != 1 {
			t.Errorf("round %d (%v): %d close or lost events, want 1", i, won[0], n)
		}
	}
	if n := metricValue(t, reg, "acpgate_double_releases_total", nil); n != 0 {
		t.Errorf("acpgate_double_releases_total = %v, want 0", n)
	}
}

// A client whose close (or failed load) ends a session another cause is
// ending already, or has ended, still lets go of it: an administrator's
// end in progress, or the agent's death, does not leave it holding a
// session nobody serves.
func TestClientLetsGoOfAnEndingSession(t *testing.T) {
	r := testPool(t, "usage", nil, func(c *Config) {
		pol := policy.Default()
		c.Tenants = []TenantConfig{{Name: "acme", Policy: &pol}}
	})
	for _, tc := range []struct {
		name  string
		first func(*Session)
		cause endCause
	}{
		{"closed while an administrator ends it", func(s *Session) { s.closing() }, endClosed},
		{"its load failed after the agent died", func(s *Session) { s.end(endAgentExited, nil) }, endLoadFailed},
	} {
		c := acmeConn(t, r, tc.name)
		c.init(`{}`)
		sid := c.newSession("1")
		s := sessionOf(c, sid)
		tc.first(s)
		s.end(tc.cause, c.c)
		if sessionOf(c, sid) != nil {
			t.Errorf("%s: the client still holds the session", tc.name)
		}
	}
}
