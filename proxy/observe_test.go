package proxy

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/policy"
)

// watcher is a test observer and decider: it keeps a copy of each event it
// hears, refuses prompts with refuse and answers permission requests with
// decide (nil: neither).
type watcher struct {
	mu     sync.Mutex
	events []observe.Event
	refuse *observe.Refusal
	decide *observe.Decision
}

func (w *watcher) Observe(e *observe.Event) {
	cp := *e
	cp.Msg, cp.Params, cp.UpdateKind = slices.Clone(e.Msg), slices.Clone(e.Params), slices.Clone(e.UpdateKind)
	w.mu.Lock()
	w.events = append(w.events, cp)
	w.mu.Unlock()
}

func (w *watcher) Prompt(*observe.Event) *observe.Refusal { return w.refuse }

func (w *watcher) Permission(e *observe.Event) (observe.Decision, bool) {
	if w.decide == nil {
		return observe.Decision{}, false
	}
	w.Observe(e) // what the decider was asked
	return *w.decide, true
}

func (w *watcher) kinds() []observe.Kind {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []observe.Kind
	for _, e := range w.events {
		out = append(out, e.Kind)
	}
	return out
}

func (w *watcher) find(k observe.Kind) *observe.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.events {
		if w.events[i].Kind == k {
			return &w.events[i]
		}
	}
	return nil
}

// watchedRelay is a relay on the usage agent (mode "usage") or the traced
// one, with w observing and deciding.
func watchedRelay(t *testing.T, mode string, w *watcher) *Relay {
	return testPool(t, mode, func(p *PoolConfig) { p.MaxProcesses = 1 }, func(c *Config) {
		pol := policy.Default()
		pol.Extensions = []string{"_usage/*"}
		c.Tenants = []TenantConfig{{Name: "acme", Policy: &pol}}
		c.Observers = []observe.Observer{w}
		c.Deciders = []observe.Decider{w}
	})
}

// An observer hears a session's life in order, from the session and its
// turn: created, the turn started, its updates (the first marked), the
// cost it reported, the turn ended with its stop reason, tokens and cost,
// and the session closed when its only client leaves.
func TestObserversHearASessionsLife(t *testing.T) {
	w := &watcher{}
	r := watchedRelay(t, "usage", w)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	m := c.turn("2", sid, []string{chunk, costUpdate("0.5", `"USD"`), chunk},
		`{"stopReason":"end_turn","usage":{"inputTokens":10,"outputTokens":2}}`)
	if m.Error != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	c.c.Close()
	want := []observe.Kind{observe.SessionCreated, observe.TurnStarted, observe.Update, observe.CostReported,
		observe.Update, observe.Update, observe.TurnEnded, observe.SessionClosed}
	waitFor(t, "the session's close", func() bool { return len(w.kinds()) >= len(want) })
	if got := w.kinds(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	for _, e := range evs {
		if e.Session == nil || e.Session.ID != sid || e.Session.Tenant != "acme" || e.Session.Agent != DefaultAgent {
			t.Errorf("%v: session %+v, want %s of acme", e.Kind, e.Session, sid)
		}
	}
	if evs[0].Client.Conn != "a" || evs[len(evs)-1].Reason != "client_left" {
		t.Errorf("created by %+v, closed for %q", evs[0].Client, evs[len(evs)-1].Reason)
	}
	turn := evs[1].Turn
	if turn == nil || !evs[2].First || evs[4].First || evs[2].Turn != turn || string(evs[2].UpdateKind) != "agent_message_chunk" {
		t.Errorf("the updates' turn or first mark: %+v / %+v", evs[2], evs[4])
	}
	if cost := evs[3]; cost.Currency != "USD" || cost.Amount != 0.5 {
		t.Errorf("cost reported: %s %v", cost.Currency, cost.Amount)
	}
	end := evs[6]
	if end.Turn != turn || end.StopReason != "end_turn" || end.Tokens["input"] != 10 || end.Tokens["output"] != 2 || end.Cost["USD"] != 0.5 {
		t.Errorf("turn ended: %+v", end)
	}
}

// A decider refuses a prompt before it reaches the agent: the client gets
// the decider's error, whole, and no turn starts.
func TestDeciderRefusesPrompt(t *testing.T) {
	w := &watcher{refuse: &observe.Refusal{Code: -32006, Message: "budget for tenant acme exhausted", Data: []byte(`{"limit":25}`)}}
	r := watchedRelay(t, "usage", w)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	m := c.turn("2", sid, []string{chunk}, `{"stopReason":"end_turn"}`)
	if m.Error == nil || m.Error.Code != -32006 || m.Error.Message != "budget for tenant acme exhausted" || !strings.Contains(m.raw, `"data":{"limit":25}`) {
		t.Fatalf("refused prompt answered %s", m.raw)
	}
	if w.find(observe.TurnStarted) != nil || w.find(observe.Update) != nil {
		t.Errorf("a refused prompt reached the agent: %v", w.kinds())
	}
	// The session is unharmed: with the refusal lifted, a prompt runs.
	w.mu.Lock()
	w.refuse = nil
	w.mu.Unlock()
	if m := c.turn("3", sid, []string{chunk}, `{"stopReason":"end_turn"}`); m.Error != nil {
		t.Fatalf("prompt after the refusal: %s", m.raw)
	}
}

// A decider answers an agent's permission request in the clients' place:
// the agent gets the decision, no client is asked, and observers hear who
// settled it.
func TestDeciderAnswersPermission(t *testing.T) {
	w := &watcher{decide: &observe.Decision{Outcome: []byte(`{"outcome":"selected","optionId":"allow"}`), By: "rule:read"}}
	r := watchedRelay(t, "traced", w)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	c.send(`{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[]}}`)
	m := c.await("9", func(m msg) {
		if m.Method == acp.RequestPermission {
			t.Errorf("the client was asked: %s", m.raw)
		}
	})
	var res struct {
		Meta struct {
			Answer string `json:"answer"`
		} `json:"_meta"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	var sc jsonrpc.Scanner
	var ans jsonrpc.Message
	if err := sc.Scan([]byte(res.Meta.Answer), &ans, nil); err != nil || string(ans.ID) != `"perm1"` ||
		string(ans.Payload) != `{"outcome":{"outcome":"selected","optionId":"allow"}}` {
		t.Fatalf("the agent got %q", res.Meta.Answer)
	}
	asked, resolved := w.find(observe.PermissionRequested), w.find(observe.PermissionResolved)
	if asked == nil || !strings.Contains(string(asked.Msg), `"toolCallId":"t1"`) || asked.Session.ID != sid {
		t.Fatalf("the decider was asked %+v", asked)
	}
	if resolved == nil || resolved.By != "rule:read" || string(resolved.Outcome) != `{"outcome":"selected","optionId":"allow"}` {
		t.Fatalf("resolved: %+v", resolved)
	}
}

// provisioned is a plug-in that acts on the relay: it counts the controls
// it was handed.
type provisioned struct {
	watcher
	mu   sync.Mutex
	ctls []observe.Control
}

func (p *provisioned) Provision(ctl observe.Control) {
	p.mu.Lock()
	p.ctls = append(p.ctls, ctl)
	p.mu.Unlock()
}

// A plug-in registered as an observer and a decider is handed the relay's
// control once, when the relay is made, and only what it implements is
// asked of it.
func TestPluginProvisionedOnce(t *testing.T) {
	p := &provisioned{}
	r := testPool(t, "usage", nil, func(c *Config) {
		c.Observers = []observe.Observer{p}
		c.Deciders = []observe.Decider{p, struct{}{}} // one that decides nothing is never asked
	})
	p.mu.Lock()
	ctls := p.ctls
	p.mu.Unlock()
	if len(ctls) != 1 || ctls[0] != observe.Control(r) {
		t.Fatalf("handed %d controls (%v), want the relay once", len(ctls), ctls)
	}
	if ctls[0].CancelTurn("no-such-session", "budget", []byte(`{}`)) {
		t.Fatal("a turn of no session was cancelled")
	}
}

// The attach gauges and counters are derived from the session's events
// (metrics.Agent), whichever way a member goes: joined, refused, and let go
// when the session ends.
func TestAttachMetricsFromEvents(t *testing.T) {
	w := &watcher{}
	r := testPool(t, "demo", nil, func(c *Config) { c.Observers = []observe.Observer{w} })
	m := r.metrics
	ok0, nf0 := counterValue(m.Attaches.WithLabelValues("ok")), counterValue(m.Attaches.WithLabelValues("not_found"))
	_, peerC, sid := sharedSession(t, r, "")
	if n := gaugeValue(m.AttachedClients); n != 1 {
		t.Fatalf("attached clients %v after one attach, want 1", n)
	}
	if n := counterValue(m.Attaches.WithLabelValues("ok")) - ok0; n != 1 {
		t.Fatalf("attaches ok +%v, want +1", n)
	}
	if res := peerC.attach("9", "no-such-session", ""); res.Error == nil {
		t.Fatalf("attach to no session: %s", res.raw)
	}
	if n := counterValue(m.Attaches.WithLabelValues("not_found")) - nf0; n != 1 {
		t.Fatalf("attaches not_found +%v, want +1", n)
	}
	if e := w.find(observe.AttachRefused); e == nil || e.Reason != "not_found" || e.Client.Conn != "peer" {
		t.Fatalf("AttachRefused %+v", e)
	}
	if _, err := r.EndSession(sid, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member let go", func() bool { return gaugeValue(m.AttachedClients) == 0 })
	if e := w.find(observe.SessionDetached); e == nil || e.Client.Conn != "peer" {
		t.Fatalf("SessionDetached %+v", e)
	}
}
