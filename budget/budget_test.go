package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/usage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPeriodBounds(t *testing.T) {
	at := time.Date(2026, 12, 31, 23, 59, 0, 0, time.FixedZone("x", 3600))
	start, next := Day.Bounds(at)
	if want := time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC); !start.Equal(want) || !next.Equal(want.AddDate(0, 0, 1)) {
		t.Errorf("day: %v .. %v", start, next)
	}
	start, next = Month.Bounds(at)
	if want := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC); !start.Equal(want) || !next.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("month: %v .. %v", start, next)
	}
}

// Every store keeps the same ledger: additions sum (concurrently too),
// keys are apart, a reset forgets one key.
func TestStores(t *testing.T) {
	redis := redistest.Start(t)
	for name, open := range map[string]func(t *testing.T) Store{
		"memory": func(*testing.T) Store { return NewMemory() },
		"file": func(t *testing.T) Store {
			s, err := OpenStore("file:" + filepath.Join(t.TempDir(), "sub", "ledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"redis": func(t *testing.T) Store {
			s, err := OpenStore(redis.URL(1))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			ctx := context.Background()
			start, next := Day.Bounds(time.Now())
			acme := Key{Tenant: "acme-" + name, Period: Day, Start: start}
			globex := Key{Tenant: "globex-" + name, Period: Day, Start: start}
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					if _, err := s.Add(ctx, acme, Spent{Tokens: 5, Cost: map[string]float64{"USD": 0.25}}, nil, next); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			got, err := s.Add(ctx, globex, Spent{Cost: map[string]float64{"EUR": 1}}, nil, next)
			if err != nil || got.Tokens != 0 || got.Cost["EUR"] != 1 {
				t.Errorf("globex: %+v %v", got, err)
			}
			got, err = s.Get(ctx, acme)
			if err != nil || got.Tokens != 100 || got.Cost["USD"] != 5 {
				t.Errorf("acme after 20 concurrent adds: %+v %v", got, err)
			}
			if err := s.Reset(ctx, acme); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Get(ctx, acme); err != nil || got.Tokens != 0 || len(got.Cost) != 0 {
				t.Errorf("acme after a reset: %+v %v", got, err)
			}
			if got, _ := s.Get(ctx, globex); got.Cost["EUR"] != 1 {
				t.Errorf("globex after acme's reset: %+v", got)
			}
		})
	}
}

// The file store survives a restart, and a second process cannot open it
// meanwhile.
func TestFileSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	start, next := Month.Bounds(time.Now())
	key := Key{Tenant: "acme", Period: Month, Start: start}
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(context.Background(), key, Spent{Tokens: 7, Cost: map[string]float64{"USD": 1.5}}, []Mark{{Session: "s1", Currency: "USD", Total: 2}}, next); err != nil { // a new session's first report
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Get(context.Background(), key); err != nil || got.Tokens != 7 || got.Cost["USD"] != 3.5 {
		t.Errorf("after a restart: %+v %v (want 7 tokens, 1.5 + 2 USD)", got, err)
	}
	// The session's kept value survived too: a load's first report of
	// the same total counts nothing, a higher one its increase.
	for _, step := range []struct{ total, want float64 }{{2, 3.5}, {2.5, 4}} {
		got, err := s.Add(context.Background(), key, Spent{}, []Mark{{Session: "s1", Currency: "USD", First: true, From: step.total, Total: step.total}}, next)
		if err != nil || got.Cost["USD"] != step.want {
			t.Errorf("a report of %v after a restart: %+v %v, want %v USD", step.total, got, err, step.want)
		}
	}
}

// storeOpeners open each kind of store, Redis on db.
func storeOpeners(redis *redistest.Server, db int) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"memory": func(*testing.T) Store { return NewMemory() },
		"file": func(t *testing.T) Store {
			s, err := OpenStore("file:" + filepath.Join(t.TempDir(), "ledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"redis": func(t *testing.T) Store {
			s, err := OpenStore(redis.URL(db))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

// first is a load's first report of total in USD (session, currency).
func first(session string, total float64) []Mark {
	return []Mark{{Session: session, Currency: "USD", First: true, From: total, Total: total}}
}

// later is a later report of a load, total after from.
func later(session string, from, total float64) []Mark {
	return []Mark{{Session: session, Currency: "USD", From: from, Total: total}}
}

// Each store keeps every agent session's last counted cumulative cost
// (finding 5 of the review at 99b340a: the first report after a load was
// a baseline and counted nothing): a load's first report counts its
// increase over the kept value once, whoever sends it and however many at
// once; a later report of a load its increase over the load's previous
// one; a decrease, a replica sending the same total, a reset of the
// tenant's spend or a new period never let a later report count twice; a
// session with no kept value counts its first report in full; a jump past
// usage.MaxCostIncrease counts nothing.
func TestStoresKeepSessionCost(t *testing.T) {
	redis := redistest.Start(t)
	for name, open := range storeOpeners(redis, 3) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			ctx := context.Background()
			start, next := Day.Bounds(time.Now())
			tenant := "acme-" + name
			key := Key{Tenant: tenant, Period: Day, Start: start}
			spent := func(step string, marks []Mark, want float64) {
				t.Helper()
				got, err := s.Add(ctx, key, Spent{}, marks, next)
				if err != nil || math.Abs(got.Cost["USD"]-want) > 1e-9 {
					t.Errorf("%s: %+v %v; want %v USD", step, got, err, want)
				}
			}
			spent("a new session's first report", later("s1", 0, 3), 3)
			spent("a load's first report, 50", first("s1", 50), 50)
			spent("the same total from another load", first("s1", 50), 50)
			spent("a decrease", later("s1", 50, 40), 50)
			spent("back up, past the load's last", later("s1", 50, 60), 60)
			spent("a session with no kept value", first("s2", 5), 65)
			spent("a jump past any real cost", first("s3", 2e9), 65)
			spent("after the jump", later("s3", 2e9, 2e9+1), 66)
			spent("two sessions, one call", append(later("s1", 60, 61), first("s2", 7)...), 69)
			spent("one load's reports, one mark", []Mark{{Session: "s1", Currency: "USD", First: true, From: 61, Total: 64}}, 72)

			var wg sync.WaitGroup // 20 replicas' loads send one total at once
			for range 20 {
				wg.Go(func() {
					if _, err := s.Add(ctx, key, Spent{}, first("s4", 7), next); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			spent("after 20 concurrent first reports of 7", nil, 79)

			if err := s.Reset(ctx, key); err != nil {
				t.Fatal(err)
			}
			spent("a report already counted, after a reset", first("s1", 64), 0)
			tomorrow := Key{Tenant: tenant, Period: Day, Start: next}
			got, err := s.Add(ctx, tomorrow, Spent{}, first("s1", 65), next.AddDate(0, 0, 1))
			if err != nil || got.Cost["USD"] != 1 {
				t.Errorf("the next period: %+v %v; want 1 USD (its increase only)", got, err)
			}
			other := Key{Tenant: "globex-" + name, Period: Day, Start: start}
			if got, err := s.Add(ctx, other, Spent{}, first("s1", 65), next); err != nil || got.Cost["USD"] != 65 {
				t.Errorf("another tenant's session of the same key: %+v %v; want 65 USD (kept apart)", got, err)
			}
		})
	}
}

// The kept value is the session's last counted total, not its highest,
// and a load's first report below it is a total that started again
// (claude-agent-acp's SDK after session/load): with 5 kept, a load whose
// first report is 1 counts 1 (kept as the highest, it counted nothing
// until the load passed 5, so a client reloading before each cheap turn
// spent for free), one whose first is 7 counts 2; within one load 7, 6, 8
// counts 1 at 8 (the decrease moves nothing). A later report counts over
// its load's previous one, whatever another load did to the kept value
// (two processes running one session each spend).
func TestStoresRestartedTotal(t *testing.T) {
	redis := redistest.Start(t)
	for name, open := range storeOpeners(redis, 5) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			defer s.Close()
			ctx := context.Background()
			start, next := Day.Bounds(time.Now())
			key := Key{Tenant: "acme-" + name, Period: Day, Start: start}
			total := 0.0
			spent := func(step string, marks []Mark, inc float64) {
				t.Helper()
				total += inc
				got, err := s.Add(ctx, key, Spent{}, marks, next)
				if err != nil || math.Abs(got.Cost["USD"]-total) > 1e-9 {
					t.Errorf("%s: %+v %v; want %v USD (%v more)", step, got, err, total, inc)
				}
			}
			spent("a: a new session reports 5", later("a", 0, 5), 5)
			spent("a: a load's first report, 1 (restarted)", first("a", 1), 1)
			spent("a: another load's first, 1 again", first("a", 1), 0)
			spent("a: a cheaper turn after a reload, 0.5", first("a", 0.5), 0.5)

			spent("b: a new session reports 5", later("b", 0, 5), 5)
			spent("b: a load's first report, 7", first("b", 7), 2)
			spent("b: 6 in the same load", later("b", 7, 6), 0)
			spent("b: 8 in the same load", later("b", 7, 8), 1)

			// Two processes, one session: c's load p reports 10; q loads
			// it, its total restarted at 1; p's next report (12) counts
			// its own 2, not 11; q's (4) its own 3.
			spent("c: p reports 10", later("c", 0, 10), 10)
			spent("c: q loads, first report 1", first("c", 1), 1)
			spent("c: p reports 12", later("c", 10, 12), 2)
			spent("c: q reports 4", later("c", 1, 4), 3)
			spent("c: another load's first, 5", first("c", 5), 1)
		})
	}
}

// Two gateways on one Redis keep one value per session: a load's first
// report of a total the other sent is counted once, its increase over it
// too, and one below it in full (a total that started again).
func TestRedisKeptSharedByReplicas(t *testing.T) {
	redis := redistest.Start(t)
	a, err := OpenStore(redis.URL(4))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenStore(redis.URL(4))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	start, next := Day.Bounds(time.Now())
	key := Key{Tenant: "acme", Period: Day, Start: start}
	for _, step := range []struct {
		s           Store
		total, want float64
	}{{a, 3, 3}, {b, 3, 3}, {b, 50, 50}, {a, 50, 50}, {a, 40, 90}, {b, 500, 550}} {
		// Each a load's first report: below the kept value (40 after 50), a
		// total that started again counts in full.
		got, err := step.s.Add(ctx, key, Spent{}, first("s", step.total), next)
		if err != nil || got.Cost["USD"] != step.want {
			t.Errorf("a report of %v: %+v %v; want %v USD", step.total, got, err, step.want)
		}
	}
}

// The ledger counts a load's reports against the session's kept value
// (finding 5): a session's first turn 3, a load's 50 (reported live but
// metered as nothing here: Amount 0), and a prompt past the cap is
// refused before the store has it; the same total from another load counts
// nothing.
func TestLedgerCountsLoadedReports(t *testing.T) {
	l, _, _ := newLedger(t, NewMemory(), false, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 100}}})
	report := func(total, metered float64, first bool, from float64) {
		e := cost("acme", "g1", "USD", metered)
		e.Session.Key, e.Total, e.First, e.From = "k1", total, first, from
		l.Observe(e)
	}
	report(3, 3, false, 0)
	waitFlushed(t, l)
	report(50, 0, true, 50) // a load's first report
	if r := l.Prompt(prompt("acme")); r != nil {
		t.Fatalf("under the cap: %+v", r)
	}
	waitFlushed(t, l)
	report(50, 0, true, 50)  // another load, the same total
	report(40, 0, false, 50) // a decrease: nothing
	report(120, 70, false, 50)
	if r := l.Prompt(prompt("acme")); r == nil || r.Code != CodeExhausted {
		t.Errorf("past the cap, the report not flushed yet: %+v", r)
	}
	waitFlushed(t, l)
	st, err := l.Statuses(context.Background())
	if err != nil || len(st) != 1 || st[0].Spent.Cost["USD"] != 120 {
		t.Errorf("statuses: %+v %v; want 120 USD", st, err)
	}
}

func TestOpenStoreRefuses(t *testing.T) {
	for _, spec := range []string{"file:", "sqlite:/x", "redis://:secret@host:badport", `redis://u:se"cret\x@host:badport`,
		"redis://u:secret@host/notadb", "redis://u:secret@host/1/2", "redis://u:secret@host?dial_timeout=x"} {
		if err := CheckStore(spec); err == nil || strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "cret") {
			t.Errorf("CheckStore(%q): %v", spec, err)
		}
		_, err := OpenStore(spec)
		if err == nil {
			t.Errorf("%q opened", spec)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", spec, err)
		}
	}
}

// flaky is a store that fails while down is set.
type flaky struct {
	Store
	mu   sync.Mutex
	down bool
}

var errDown = errors.New("connection refused")

func (f *flaky) setDown(v bool) { f.mu.Lock(); f.down = v; f.mu.Unlock() }
func (f *flaky) isDown() bool   { f.mu.Lock(); defer f.mu.Unlock(); return f.down }
func (f *flaky) Get(ctx context.Context, k Key) (Spent, error) {
	if f.isDown() {
		return Spent{}, errDown
	}
	return f.Store.Get(ctx, k)
}
func (f *flaky) Add(ctx context.Context, k Key, s Spent, marks []Mark, next time.Time) (Spent, error) {
	if f.isDown() {
		return Spent{}, errDown
	}
	return f.Store.Add(ctx, k, s, marks, next)
}

type cancelled struct {
	mu  sync.Mutex
	ids []string
	why []Exhaustion
	ch  chan struct{}
}

// CancelTurn is the relay's control (observe.Control) as the ledger sees it.
func (c *cancelled) CancelTurn(id, _ string, why []byte) bool {
	var x Exhaustion
	_ = json.Unmarshal(why, &x)
	c.mu.Lock()
	c.ids, c.why = append(c.ids, id), append(c.why, x)
	c.mu.Unlock()
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return true
}

// events are the audit events a ledger recorded.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.list, ",")
}

func newLedger(t *testing.T, store Store, allow bool, limits map[string]Limits) (*Ledger, *cancelled, *events) {
	t.Helper()
	c := &cancelled{ch: make(chan struct{}, 100)}
	ev := &events{}
	l := New(Config{Store: store, AllowOnStoreError: allow, Limits: limits,
		Metrics: NewMetrics(prometheus.NewRegistry(), nil),
		Event: func(kind, tenant string, _ map[string]any) {
			ev.mu.Lock()
			ev.list = append(ev.list, kind+" "+tenant)
			ev.mu.Unlock()
		}})
	l.Provision(c)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return l, c, ev
}

func sess(tenant, id string) *observe.Session { return &observe.Session{ID: id, Tenant: tenant} }

func cost(tenant, id, cur string, amount float64) *observe.Event {
	return &observe.Event{Kind: observe.CostReported, Session: sess(tenant, id), Turn: &observe.Turn{}, Currency: cur, Amount: amount}
}

func tokens(tenant, id string, in, out int64) *observe.Event {
	return &observe.Event{Kind: observe.TurnEnded, Session: sess(tenant, id), Tokens: map[string]int64{"input": in, "output": out, "thought": 1000}}
}

func prompt(tenant string) *observe.Event {
	return &observe.Event{Kind: observe.TurnStarted, Session: sess(tenant, "s")}
}

// waitFlushed waits until nothing is pending.
func waitFlushed(t *testing.T, l *Ledger) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		n := len(l.pend) + len(l.flying)
		l.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("spend still pending after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A tenant over its cost cap, and one over its token cap, are refused with
// a message and data naming the budget; another tenant is not; the turn
// whose report crossed the cap is cancelled, once the report is in.
func TestLedgerCaps(t *testing.T) {
	l, c, events := newLedger(t, NewMemory(), false, map[string]Limits{
		"acme":   {Period: Day, Cost: map[string]float64{"USD": 25}},
		"globex": {Period: Month, Tokens: 1000},
	})
	if r := l.Prompt(prompt("acme")); r != nil {
		t.Fatalf("a fresh budget refused: %+v", r)
	}
	l.Observe(cost("acme", "a1", "USD", 20))
	l.Observe(cost("acme", "a1", "EUR", 100)) // no cap in EUR
	waitFlushed(t, l)
	if r := l.Prompt(prompt("acme")); r != nil {
		t.Fatalf("under the cap, refused: %+v", r)
	}
	l.Observe(cost("acme", "a2", "USD", 5.1))
	select {
	case <-c.ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the turn that crossed the cap was not cancelled")
	}
	r := l.Prompt(prompt("acme"))
	if r == nil || r.Code != CodeExhausted || !strings.HasPrefix(r.Message, "budget for tenant acme exhausted: 25.10 of 25.00 USD this day; resets ") {
		t.Fatalf("over the cap: %+v", r)
	}
	var x Exhaustion
	if err := json.Unmarshal(r.Data, &x); err != nil || x.Unit != "USD" || x.Limit != 25 || x.Period != Day || x.Resets == "" {
		t.Errorf("error.data %s: %+v", r.Data, x)
	}
	c.mu.Lock()
	if strings.Join(c.ids, ",") != "a2" || c.why[0].Unit != "USD" {
		t.Errorf("cancelled %v (%+v), want a2 only", c.ids, c.why)
	}
	c.mu.Unlock()
	if r := l.Prompt(prompt("globex")); r != nil {
		t.Errorf("another tenant refused: %+v", r)
	}
	if r := l.Prompt(prompt("initech")); r != nil {
		t.Errorf("a tenant without a budget refused: %+v", r)
	}
	// Tokens: input + output of each turn's end (thought tokens are not capped).
	l.Observe(tokens("globex", "g1", 600, 300))
	if r := l.Prompt(prompt("globex")); r != nil {
		t.Errorf("globex at 900 of 1000 tokens refused: %+v", r)
	}
	l.Observe(tokens("globex", "g1", 50, 50))
	waitFlushed(t, l)
	if r := l.Prompt(prompt("globex")); r == nil || !strings.Contains(r.Message, "1000 of 1000 tokens this month") {
		t.Errorf("globex at its token cap: %+v", r)
	}
	for deadline := time.Now().Add(5 * time.Second); events.String() != "budget.exceeded acme,budget.exceeded globex"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("events %q", events.String())
		}
	}
	// An operator's reset serves the tenant again.
	if err := l.Reset(context.Background(), "acme", "admin:ops"); err != nil {
		t.Fatal(err)
	}
	if r := l.Prompt(prompt("acme")); r != nil {
		t.Errorf("after a reset: %+v", r)
	}
	if err := l.Reset(context.Background(), "initech", "admin:ops"); !errors.Is(err, ErrNoBudget) {
		t.Errorf("reset of a tenant without a budget: %v", err)
	}
	st, err := l.Statuses(context.Background())
	if err != nil || len(st) != 2 || st[0].Tenant != "acme" || st[1].Exhausted == nil || st[1].Spent.Tokens != 1000 {
		t.Errorf("statuses: %+v %v", st, err)
	}
}

// What agents report that is not spend changes nothing.
func TestLedgerIgnoresNonSpend(t *testing.T) {
	l, _, _ := newLedger(t, NewMemory(), false, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 1}, Tokens: 10}})
	for _, e := range []*observe.Event{
		cost("acme", "s", "USD", -5), cost("acme", "s", "USD", 0), cost("acme", "s", "", 5),
		tokens("acme", "s", -100, 0), {Kind: observe.CostReported, Currency: "USD", Amount: 5},
		{Kind: observe.Update, Session: sess("acme", "s")},
	} {
		l.Observe(e)
	}
	waitFlushed(t, l)
	if r := l.Prompt(prompt("acme")); r != nil {
		t.Errorf("refused after no spend: %+v", r)
	}
	if st, _ := l.Statuses(context.Background()); st[0].Spent.Tokens != 0 || st[0].Spent.Cost["USD"] != 0 {
		t.Errorf("status %+v", st[0])
	}
}

// The store fails: with deny, budgeted tenants' prompts get an error naming
// the store, and are served again once it is back; spend reported meanwhile
// is added then, with deny and with allow.
func TestLedgerStoreFails(t *testing.T) {
	for _, allow := range []bool{false, true} {
		store := &flaky{Store: NewMemory()}
		l, _, _ := newLedger(t, store, allow, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 10}}})
		store.setDown(true)
		r := l.Prompt(prompt("acme"))
		switch {
		case allow && r != nil:
			t.Errorf("allow: refused while the store is down: %+v", r)
		case !allow && (r == nil || r.Code != CodeStoreError || !strings.Contains(r.Message, "store memory")):
			t.Errorf("deny: %+v", r)
		}
		if r := l.Prompt(prompt("globex")); r != nil {
			t.Errorf("a tenant without a budget refused while the store is down: %+v", r)
		}
		l.Observe(cost("acme", "s", "USD", 12)) // while down
		time.Sleep(2 * retryEvery)
		store.setDown(false)
		waitFlushed(t, l)
		if r := l.Prompt(prompt("acme")); r == nil || r.Code != CodeExhausted {
			t.Errorf("allow %v: the spend made while the store was down was not added: %+v", allow, r)
		}
	}
}

// A capped currency counts by its own name, even when the tenant's metrics
// label it "other" (an agent that reported other currencies first must not
// make the cap stop counting); an uncapped one never reaches the store.
func TestLedgerCountsTheCurrencyNotItsLabel(t *testing.T) {
	l, _, _ := newLedger(t, NewMemory(), false, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 1}}})
	e := cost("acme", "s", "other", 2)
	e.Unit = "USD"
	l.Observe(e)
	l.Observe(cost("acme", "s", "EUR", 5))
	waitFlushed(t, l)
	if r := l.Prompt(prompt("acme")); r == nil || r.Code != CodeExhausted {
		t.Errorf("USD labelled other: %+v", r)
	}
	if st, _ := l.Statuses(context.Background()); st[0].Spent.Cost["EUR"] != 0 || st[0].Spent.Cost["other"] != 0 {
		t.Errorf("an uncapped currency or a label reached the ledger: %+v", st[0].Spent.Cost)
	}
}

// A reset forgives what the sessions reported but not yet stored, and
// keeps their values: the same total reported again counts nothing.
func TestLedgerResetKeepsSessionValues(t *testing.T) {
	store := &flaky{Store: NewMemory()}
	l, _, _ := newLedger(t, store, true, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 100}}})
	report := func(total float64) { // each a load's first
		e := cost("acme", "g1", "USD", 0)
		e.Session.Key, e.Total, e.First, e.From = "k1", total, true, total
		l.Observe(e)
	}
	store.setDown(true)
	report(5)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		l.mu.Lock()
		failed := l.storeErr != nil && len(l.pend) == 1
		l.mu.Unlock()
		if failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the store's failure never seen")
		}
	}
	store.setDown(false)
	if err := l.Reset(context.Background(), "acme", "test"); err != nil {
		t.Fatal(err)
	}
	report(5)
	waitFlushed(t, l)
	report(6)
	waitFlushed(t, l)
	st, err := l.Statuses(context.Background())
	if err != nil || len(st) != 1 || st[0].Spent.Cost["USD"] != 1 {
		t.Errorf("statuses: %+v %v; want 1 USD (6 over the 5 forgiven)", st, err)
	}
}

// Reports that wait together for the store (it failed meanwhile) keep
// their loads apart: a load's reports make one mark, a load's first
// report starts another, so a batch counts what the reports one by one
// would. A session's reports 5; a load restarts at 1, then 3; another at
// 2, then 4: 5 + 1 + 2 + 2 + 2 = 12 (merged as the highest, 5).
func TestLedgerBatchesLoads(t *testing.T) {
	store := &flaky{Store: NewMemory()}
	l, _, _ := newLedger(t, store, true, map[string]Limits{"acme": {Cost: map[string]float64{"USD": 100}}})
	store.setDown(true)
	for _, r := range []struct {
		first       bool
		from, total float64
	}{{false, 0, 5}, {true, 1, 1}, {false, 1, 3}, {false, 3, 2}, {true, 2, 2}, {false, 2, 4}} {
		e := cost("acme", "g1", "USD", 0)
		e.Session.Key, e.Total, e.First, e.From = "k1", r.total, r.first, r.from
		l.Observe(e)
	}
	start, _ := Day.Bounds(time.Now())
	key := Key{Tenant: "acme", Period: Day, Start: start}
	var est Spent
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) { // the writer may hold them a moment
		l.mu.Lock()
		p := l.pend[key]
		if p != nil {
			est = l.estimate("acme", p.marks)
		}
		l.mu.Unlock()
		if p != nil || time.Now().After(deadline) {
			break
		}
	}
	if est.Cost["USD"] != 12 {
		t.Errorf("what the pending reports are estimated to add: %v; want 12", est.Cost)
	}
	store.setDown(false)
	waitFlushed(t, l)
	st, err := l.Statuses(context.Background())
	if err != nil || len(st) != 1 || st[0].Spent.Cost["USD"] != 12 {
		t.Errorf("statuses: %+v %v; want 12 USD", st, err)
	}
}

// What a load's reports count, as the session's meter (package usage)
// marks them for each agent's usage.cost_total, in each store. Each load
// is a meter of its own (another process or gateway): its replay, if any,
// then its live reports.
//   - An agent whose total starts again at each load and is not replayed
//     (claude-agent-acp): a new session's turn of 1, then three loads
//     with a turn of 1 each. per_load counts each (4); per_session
//     (misconfigured for it) compares each load's first report with the
//     kept value and counts only the first (1). At the branch's previous
//     state every agent was per_session: 1 of 4.
//   - An agent that replays its total: 3, a load replaying 3 reports 5,
//     another replaying 5 reports 5 and 6: 6 under both; the replays count
//     nothing.
//   - An agent whose total carries on unsaid: 3, a load reports 5.
//     per_load counts it in full (8, the safe side); per_session its
//     increase over the kept value (5).
func TestLedgerCostTotalSettings(t *testing.T) {
	redis := redistest.Start(t)
	type load struct {
		replay  []float64 // what its replay carries (nil: no load, a new session)
		loaded  bool
		reports []float64
	}
	for _, tc := range []struct {
		name             string
		loads            []load
		perLoad, perSess float64
	}{
		{"restarted total, not replayed", []load{{reports: []float64{1}}, {loaded: true, reports: []float64{1}},
			{loaded: true, reports: []float64{1}}, {loaded: true, reports: []float64{1}}}, 4, 1},
		{"carried total, replayed", []load{{reports: []float64{3}}, {loaded: true, replay: []float64{3}, reports: []float64{5}},
			{loaded: true, replay: []float64{1, 5}, reports: []float64{5, 6}}}, 6, 6},
		{"carried total, not replayed", []load{{reports: []float64{3}}, {loaded: true, reports: []float64{5}}}, 8, 5},
		{"a replayed total, then a restarted one", []load{{reports: []float64{4}}, {loaded: true, replay: []float64{4}, reports: []float64{1, 2}}}, 6, 6},
	} {
		for _, perSession := range []bool{false, true} {
			want := tc.perLoad
			if perSession {
				want = tc.perSess
			}
			for name, open := range storeOpeners(redis, 6) {
				t.Run(fmt.Sprintf("%s/per-session %v/%s", tc.name, perSession, name), func(t *testing.T) {
					tenant := fmt.Sprintf("t%d", time.Now().UnixNano()) // the Redis db is shared by the subtests
					l, _, _ := newLedger(t, open(t), false, map[string]Limits{tenant: {Cost: map[string]float64{"USD": 1000}}})
					for _, ld := range tc.loads {
						var mt usage.Meter
						if perSession {
							mt.SetPerSession()
						}
						if ld.loaded {
							mt.Loaded()
							mt.ReplayStarted()
							for _, v := range ld.replay {
								if _, b, _ := mt.NoteCost("USD", "USD", v); b.Live {
									t.Fatalf("a replay's report of %v is live", v)
								}
							}
							mt.ReplayEnded()
						}
						for _, v := range ld.reports {
							inc, b, _ := mt.NoteCost("USD", "USD", v)
							e := cost(tenant, "g1", "USD", inc)
							e.Unit, e.Session.Key, e.Total, e.First, e.From = "USD", "k1", v, b.First, b.From
							l.Observe(e)
						}
						waitFlushed(t, l)
					}
					st, err := l.Statuses(context.Background())
					if err != nil || len(st) != 1 || math.Abs(st[0].Spent.Cost["USD"]-want) > 1e-9 {
						t.Errorf("statuses: %+v %v; want %v USD", st, err, want)
					}
				})
			}
		}
	}
}
