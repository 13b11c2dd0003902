package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/proxy/observe"
)

// Limits is one tenant's budget.
type Limits struct {
	Period Period
	Tokens int64              // input + output tokens a period (0: no cap)
	Cost   map[string]float64 // per currency, as the agents report it (absent: no cap)
}

// capped reports whether l caps anything.
func (l Limits) capped() bool { return l.Tokens > 0 || len(l.Cost) > 0 }

// Exhaustion is a cap a tenant has reached: what error.data and
// _meta.acpgate.budget say.
type Exhaustion struct {
	Tenant string  `json:"tenant"`
	Period Period  `json:"period"`
	Unit   string  `json:"unit"` // "tokens" or a currency
	Spent  float64 `json:"spent"`
	Limit  float64 `json:"limit"`
	Resets string  `json:"resets"` // RFC 3339, UTC
}

// Message is the refusal's text: "budget for tenant acme exhausted: 25.10 of
// 25.00 USD this day; resets 2026-12-01T00:00:00Z".
func (x Exhaustion) Message() string {
	amount := func(v float64) string {
		if x.Unit == "tokens" {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return fmt.Sprintf("budget for tenant %s exhausted: %s of %s %s this %s; resets %s",
		x.Tenant, amount(x.Spent), amount(x.Limit), x.Unit, x.Period, x.Resets)
}

// exhausted is the first cap s reaches under l (sorted by unit), if any.
func (l Limits) exhausted(tenant string, s Spent, next time.Time) (Exhaustion, bool) {
	x := Exhaustion{Tenant: tenant, Period: l.Period, Resets: next.UTC().Format(time.RFC3339)}
	if l.Tokens > 0 && s.Tokens >= l.Tokens {
		x.Unit, x.Spent, x.Limit = "tokens", float64(s.Tokens), float64(l.Tokens)
		return x, true
	}
	for _, cur := range slices.Sorted(maps.Keys(l.Cost)) {
		if limit := l.Cost[cur]; s.Cost[cur] >= limit {
			x.Unit, x.Spent, x.Limit = cur, s.Cost[cur], limit
			return x, true
		}
	}
	return x, false
}

// Codes of the errors a refused prompt gets.
const (
	CodeExhausted  = -32006 // a cap is reached
	CodeStoreError = -32603 // the ledger's store cannot be read (on_store_error: deny)
)

// Config configures a Ledger.
type Config struct {
	Store Store
	// AllowOnStoreError lets budgeted tenants' prompts run while the store
	// fails (their spend is added when it is back); false refuses them.
	AllowOnStoreError bool
	Limits            map[string]Limits // by tenant; tenants not named have no budget
	// Event records budget.exceeded and budget.reset in the audit trail
	// (nil: none).
	Event   func(event, tenant string, fields map[string]any)
	Metrics *Metrics
	Log     *slog.Logger
	Now     func() time.Time // nil: time.Now
}

// maxPendingSessions bounds the sessions a pending addition remembers
// (to cancel their turns once it is in the store).
const maxPendingSessions = 1024

// pending is spend not yet in the store, and the sessions whose turns
// reported it.
type pending struct {
	add Spent
	// marks: the agent sessions' live reports, in order: a report that
	// continues the last mark of its session and currency (not a load's
	// first, From its Total) extends it, so there is a mark per load (at
	// most maxPendingMarks). The store counts them against its kept
	// values (counted).
	marks    []Mark
	last     map[markKey]int // the index in marks of each session's last mark
	next     time.Time
	sessions map[string]struct{}
}

// maxPendingMarks bounds the marks a pending addition holds (a mark per
// load of a session: a store that fails while clients reload their
// sessions would make them pile up); past it, a report counts the most
// it may (counted with no kept value) and keeps no value.
const maxPendingMarks = 4096

// markKey is an agent session (its observe.Session.Key) and a currency.
type markKey struct{ session, currency string }

// maxKept bounds the kept values a ledger remembers (Ledger.kept); past
// it, it forgets them all and counts on the safe side until it learns them
// again.
const maxKept = 1 << 16

// Ledger keeps every budgeted tenant's spend. Observe queues what the
// agents report; one writer goroutine (ended by Close) adds it to the
// store, and cancels the turns that reported spend past a cap. Prompt
// (an observe.PromptDecider) refuses a prompt of a tenant that has reached
// a cap.
type Ledger struct {
	cfg    Config
	limits atomic.Pointer[map[string]Limits]
	now    func() time.Time

	mu   sync.Mutex
	pend map[Key]*pending
	// flying is what the writer took from pend and is adding to the
	// store: it counts until the store has it. gen counts the writer's
	// additions to a key, started (odd) and ended (even): spentOf reads
	// the store between two equal even values.
	flying   map[Key]Spent
	gen      map[Key]uint64
	exceeded map[Key]bool // budget.exceeded written for the key
	storeErr error        // the store's last failure, nil once a call succeeds
	// kept is the store's kept value of each session this ledger added a
	// mark of, as far as it knows (another replica may have moved it):
	// what a prompt's check estimates a mark not yet in the store adds.
	kept map[keptRef]float64

	// ctl is the relay's control, handed over by Provision: the writer
	// cancels a turn past a cap through it (nil until then).
	ctl atomic.Pointer[control]

	kick   chan struct{}
	ctx    context.Context
	stop   context.CancelFunc
	quit   chan struct{} // closed by Close: the writer ends after the flush it is in
	done   chan struct{}
	closed atomic.Bool
}

// New starts a ledger. cfg.Store must not be nil.
func New(cfg Config) *Ledger {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Ledger{cfg: cfg, now: cfg.Now, pend: map[Key]*pending{}, flying: map[Key]Spent{}, gen: map[Key]uint64{}, exceeded: map[Key]bool{}, kept: map[keptRef]float64{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	if l.now == nil {
		l.now = time.Now
	}
	l.SetLimits(cfg.Limits)
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.quit = make(chan struct{})
	go l.write()
	return l
}

// SetLimits replaces every tenant's limits (a reload).
func (l *Ledger) SetLimits(limits map[string]Limits) {
	m := map[string]Limits{}
	for t, lim := range limits {
		if lim.capped() {
			if !lim.Period.Valid() {
				lim.Period = Day
			}
			m[t] = lim
		}
	}
	l.limits.Store(&m)
	l.mu.Lock()
	clear(l.exceeded) // a raised cap, once reached, is recorded again
	l.mu.Unlock()
	if l.cfg.Metrics != nil {
		l.cfg.Metrics.limits(m)
	}
}

// limitsOf is the tenant's budget, if it has one.
func (l *Ledger) limitsOf(tenant string) (Limits, bool) {
	lim, ok := (*l.limits.Load())[tenant]
	return lim, ok
}

// key is the tenant's ledger key now, and when its period ends.
func (l *Ledger) key(tenant string, lim Limits) (Key, time.Time) {
	start, next := lim.Period.Bounds(l.now())
	return Key{Tenant: tenant, Period: lim.Period, Start: start}, next
}

// Wants takes the events that spend: cost reports and turns' ends.
func (l *Ledger) Wants(k observe.Kind) bool {
	return k == observe.CostReported || k == observe.TurnEnded || k == observe.TokensReported
}

// Observe queues what e reports spent for the writer. It never blocks on
// the store.
func (l *Ledger) Observe(e *observe.Event) {
	if e.Session == nil {
		return
	}
	lim, ok := l.limitsOf(e.Session.Tenant)
	if !ok {
		return // tenants without a budget never touch the store
	}
	var add Spent
	var mark *Mark
	switch e.Kind {
	case observe.CostReported:
		// The currency itself, not its metrics label: a tenant's first
		// currencies must not turn a capped one into "other".
		cur := e.Unit
		if cur == "" {
			cur = e.Currency
		}
		if _, capped := lim.Cost[cur]; !capped {
			return // only capped currencies go to the store
		}
		if e.Session.Key == "" { // nothing to keep a value by: what this process metered
			if e.Amount <= 0 {
				return
			}
			add.Cost = map[string]float64{cur: e.Amount}
			break
		}
		if !e.First && e.Total < e.From {
			return // a decrease within its load: counts nothing, changes nothing
		}
		// The store counts it against the session's kept value,
		// whichever connection or replica loaded it.
		mark = &Mark{Session: e.Session.Key, Currency: cur, First: e.First, From: e.From, Total: e.Total}
	case observe.TurnEnded, observe.TokensReported:
		add.Tokens = e.Tokens["input"] + e.Tokens["output"]
		if add.Tokens <= 0 {
			return
		}
	default:
		return
	}
	key, next := l.key(e.Session.Tenant, lim)
	l.mu.Lock()
	p := l.pend[key]
	if p == nil {
		p = &pending{next: next, sessions: map[string]struct{}{}}
		l.pend[key] = p
	}
	p.add.add(add)
	if mark != nil {
		p.mark(*mark)
	}
	if e.Kind == observe.CostReported && e.Turn != nil && len(p.sessions) < maxPendingSessions {
		p.sessions[e.Session.ID] = struct{}{} // a running turn: cancelled once past a cap
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// control boxes an observe.Control for an atomic.Pointer.
type control struct{ observe.Control }

// Provision implements observe.Provisioner: the relay the ledger observes
// hands over its control, through which the ledger cancels the running
// turns of a tenant past a cap (each answer carrying the Exhaustion under
// _meta.acpgate.budget).
func (l *Ledger) Provision(ctl observe.Control) { l.ctl.Store(&control{ctl}) }

var (
	_ observe.Observer      = (*Ledger)(nil)
	_ observe.PromptDecider = (*Ledger)(nil)
	_ observe.Provisioner   = (*Ledger)(nil)
)

// Prompt refuses a prompt of a tenant that has reached a cap (what the
// store holds and what is on its way there), or, with on_store_error deny,
// whose ledger cannot be read.
func (l *Ledger) Prompt(e *observe.Event) *observe.Refusal {
	if e.Session == nil {
		return nil
	}
	tenant := e.Session.Tenant
	lim, ok := l.limitsOf(tenant)
	if !ok {
		return nil
	}
	key, next := l.key(tenant, lim)
	// A prompt waits for this read on its client's reader: a store that
	// hangs is a failing store after checkTimeout, not after its own
	// timeouts and retries.
	ctx, cancel := context.WithTimeout(l.ctx, checkTimeout)
	defer cancel()
	spent, err := l.spentOf(ctx, key)
	l.noteStore(err)
	if err != nil {
		if l.cfg.AllowOnStoreError {
			return nil
		}
		data, _ := json.Marshal(map[string]string{"tenant": tenant, "store": l.cfg.Store.Name()})
		return &observe.Refusal{Code: CodeStoreError, Data: data,
			Message: "budget ledger unavailable (store " + l.cfg.Store.Name() + "): prompts of a tenant with a budget wait for it; try again shortly"}
	}
	x, over := lim.exhausted(tenant, spent, next)
	if !over {
		return nil
	}
	if m := l.cfg.Metrics; m != nil {
		m.refused(tenant)
	}
	data, _ := json.Marshal(x)
	return &observe.Refusal{Code: CodeExhausted, Message: x.Message(), Data: data}
}

// spentOf is what key holds: in the store, and reported but not in it
// yet. What the writer adds while the store is read counts once: the read
// is tried again (a few times; then such an addition may count twice, a
// prompt at the cap refused a moment early, never let through late).
func (l *Ledger) spentOf(ctx context.Context, key Key) (Spent, error) {
	for try := 0; ; try++ {
		var unstored Spent
		l.mu.Lock()
		g := l.gen[key]
		if p := l.pend[key]; p != nil {
			unstored.add(p.add)
			unstored.add(l.estimate(key.Tenant, p.marks))
		}
		unstored.add(l.flying[key])
		l.mu.Unlock()
		s, err := l.cfg.Store.Get(ctx, key)
		if err != nil {
			return Spent{}, err
		}
		l.mu.Lock()
		same := g%2 == 0 && l.gen[key] == g
		l.mu.Unlock()
		if same || try == 3 {
			s.add(unstored)
			return s, nil
		}
		select {
		case <-ctx.Done():
			return Spent{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// noteStore records the outcome of a store call.
func (l *Ledger) noteStore(err error) {
	l.mu.Lock()
	was := l.storeErr
	l.storeErr = err
	l.mu.Unlock()
	if err != nil && l.cfg.Metrics != nil {
		l.cfg.Metrics.storeError()
	}
	switch {
	case err != nil && was == nil:
		l.cfg.Log.Error("budget ledger store failing", "store", l.cfg.Store.Name(), "err", err)
	case err == nil && was != nil:
		l.cfg.Log.Info("budget ledger store back", "store", l.cfg.Store.Name())
	}
}

// checkTimeout bounds the store read a prompt's check waits for.
const checkTimeout = time.Second

// retryEvery is how soon the writer tries a failing store again.
const retryEvery = 500 * time.Millisecond

// write is the writer: it adds what is pending to the store whenever
// Observe queues some, and again every retryEvery while the store fails.
func (l *Ledger) write() {
	defer close(l.done)
	retry := time.NewTimer(retryEvery)
	retry.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-l.kick:
		case <-retry.C:
		}
		// Never cancelled midway: an add Redis applied but whose answer was
		// cut off would be added again (the store's own timeouts bound it).
		if !l.flush(context.Background()) {
			retry.Reset(retryEvery)
		}
	}
}

// flush adds everything pending to the store; false if some of it failed
// (it stays pending).
func (l *Ledger) flush(ctx context.Context) bool {
	l.mu.Lock()
	batch := l.pend
	l.pend = map[Key]*pending{}
	for key, p := range batch {
		f := p.add.clone()
		f.add(l.estimate(key.Tenant, p.marks))
		l.flying[key] = f
	}
	l.mu.Unlock()
	ok := true
	for key, p := range batch {
		if p.add.zero() && len(p.marks) == 0 {
			l.landed(key)
			continue
		}
		marks := p.marks
		l.mu.Lock()
		l.gen[key]++ // odd: adding
		l.mu.Unlock()
		total, err := l.cfg.Store.Add(ctx, key, p.add, marks, p.next)
		l.noteStore(err)
		if err != nil {
			ok = false
			l.requeue(key, p)
			continue
		}
		l.learn(key.Tenant, marks)
		l.landed(key)
		l.added(key, p, total)
	}
	return ok
}

// mark notes a live report of a session's cumulative cost: it extends
// the session's last mark if it continues it (counted gives the same),
// else it is a mark of its own.
func (p *pending) mark(m Mark) {
	k := markKey{m.Session, m.Currency}
	if i, ok := p.last[k]; ok && !m.First && m.From == p.marks[i].Total {
		p.marks[i].Total = m.Total
		return
	}
	if len(p.marks) >= maxPendingMarks {
		inc, _ := counted(0, false, m)
		p.add.addCost(m.Currency, inc)
		return
	}
	if p.last == nil {
		p.last = map[markKey]int{}
	}
	p.last[k] = len(p.marks)
	p.marks = append(p.marks, m)
}

// keptRef is a tenant's session's kept value of a currency.
type keptRef struct {
	tenant string
	markKey
}

// estimate is what marks of tenant's sessions add once in the store, as
// far as the ledger knows the store's kept values: a session it knows
// none of counts its load's first report in full, on the safe side (a
// prompt at the cap refused a moment early, until the store has them).
// Called with l.mu held.
func (l *Ledger) estimate(tenant string, marks []Mark) Spent {
	var s Spent
	var moved map[markKey]float64 // kept values the marks before moved
	for _, mk := range marks {
		k := markKey{mk.Session, mk.Currency}
		kept, known := moved[k]
		if !known {
			kept, known = l.kept[keptRef{tenant, k}]
		}
		inc, keep := counted(kept, known, mk)
		s.addCost(mk.Currency, inc)
		if keep {
			if moved == nil {
				moved = map[markKey]float64{}
			}
			moved[k] = mk.Total
		}
	}
	return s
}

// learn notes the kept values marks left in the store (another replica
// may have moved them since).
func (l *Ledger) learn(tenant string, marks []Mark) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.kept)+len(marks) > maxKept {
		clear(l.kept)
	}
	for _, mk := range marks {
		if mk.Total >= mk.From {
			l.kept[keptRef{tenant, markKey{mk.Session, mk.Currency}}] = mk.Total
		}
	}
}

// landed: what was flying for key is in the store (or was nothing).
func (l *Ledger) landed(key Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.flying, key)
	if l.gen[key]%2 == 1 {
		l.gen[key]++
	}
	for k := range l.gen { // past periods' counts are of no more use
		if k.Tenant == key.Tenant && k.Start.Before(key.Start) {
			delete(l.gen, k)
		}
	}
}

// requeue puts p, which the store did not take, back in front of what
// came meanwhile.
func (l *Ledger) requeue(key Key, p *pending) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.flying, key)
	if l.gen[key]%2 == 1 {
		l.gen[key]++
	}
	if q := l.pend[key]; q != nil {
		p.add.add(q.add)
		for _, mk := range q.marks {
			p.mark(mk)
		}
		for s := range q.sessions {
			if len(p.sessions) < maxPendingSessions {
				p.sessions[s] = struct{}{}
			}
		}
	}
	l.pend[key] = p
}

// added handles key's total once p is in the store: past a cap, the turns
// that reported p are cancelled, and the first time budget.exceeded is
// recorded.
func (l *Ledger) added(key Key, p *pending, total Spent) {
	if m := l.cfg.Metrics; m != nil {
		m.spent(key.Tenant, total)
	}
	lim, ok := l.limitsOf(key.Tenant)
	if !ok || lim.Period != key.Period {
		return
	}
	x, over := lim.exhausted(key.Tenant, total, p.next)
	if !over {
		return
	}
	why, _ := json.Marshal(x)
	if ctl := l.ctl.Load(); ctl != nil {
		for _, sid := range slices.Sorted(maps.Keys(p.sessions)) {
			if ctl.CancelTurn(sid, "budget", why) {
				l.cfg.Log.Info("budgets: turn cancelled, its tenant's budget exhausted", "tenant", key.Tenant, "session", sid)
			}
		}
	}
	l.mu.Lock()
	first := !l.exceeded[key]
	l.exceeded[key] = true
	l.mu.Unlock()
	if first {
		l.cfg.Log.Warn("tenant budget exhausted", "tenant", key.Tenant, "unit", x.Unit, "spent", x.Spent, "limit", x.Limit, "resets", x.Resets)
		if l.cfg.Event != nil {
			l.cfg.Event("budget.exceeded", key.Tenant, map[string]any{"period": x.Period, "unit": x.Unit, "spent": x.Spent, "limit": x.Limit, "resets": x.Resets})
		}
	}
}

// Status is a budgeted tenant's state for operators.
type Status struct {
	Tenant string `json:"tenant"`
	Period Period `json:"period"`
	Start  string `json:"start"`
	Resets string `json:"resets"`
	Spent  struct {
		Tokens int64              `json:"tokens"`
		Cost   map[string]float64 `json:"cost"`
	} `json:"spent"`
	Limits struct {
		Tokens int64              `json:"tokens,omitempty"`
		Cost   map[string]float64 `json:"cost,omitempty"`
	} `json:"limits"`
	Exhausted *Exhaustion `json:"exhausted,omitempty"`
}

// Statuses is every budgeted tenant's state, by name. A store that fails
// fails it.
func (l *Ledger) Statuses(ctx context.Context) ([]Status, error) {
	limits := *l.limits.Load()
	var out []Status
	for _, tenant := range slices.Sorted(maps.Keys(limits)) {
		lim := limits[tenant]
		key, next := l.key(tenant, lim)
		spent, err := l.spentOf(ctx, key)
		l.noteStore(err)
		if err != nil {
			return nil, err
		}
		st := Status{Tenant: tenant, Period: lim.Period, Start: key.Start.Format(time.RFC3339), Resets: next.UTC().Format(time.RFC3339)}
		st.Spent.Tokens, st.Spent.Cost = spent.Tokens, spent.Cost
		if st.Spent.Cost == nil {
			st.Spent.Cost = map[string]float64{}
		}
		st.Limits.Tokens, st.Limits.Cost = lim.Tokens, lim.Cost
		if x, over := lim.exhausted(tenant, spent, next); over {
			st.Exhausted = &x
		}
		out = append(out, st)
	}
	return out, nil
}

// ErrNoBudget: the tenant has no budget.
var ErrNoBudget = errors.New("tenant has no budget")

// Reset forgets what the tenant spent this period (an operator's
// decision), by whom (for the audit trail).
func (l *Ledger) Reset(ctx context.Context, tenant, by string) error {
	lim, ok := l.limitsOf(tenant)
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoBudget, tenant)
	}
	key, _ := l.key(tenant, lim)
	l.mu.Lock()
	p := l.pend[key]
	delete(l.pend, key) // what was on its way is part of what is forgiven
	delete(l.exceeded, key)
	l.mu.Unlock()
	var err error
	if p != nil && len(p.marks) > 0 {
		// Its sessions' reports are forgiven too, but their values are
		// kept: a later report counts only what it adds to them.
		if _, err = l.cfg.Store.Add(ctx, key, Spent{}, p.marks, p.next); err == nil {
			l.learn(tenant, p.marks)
		}
	}
	if err == nil {
		err = l.cfg.Store.Reset(ctx, key)
	}
	l.noteStore(err)
	if err != nil {
		return err
	}
	if m := l.cfg.Metrics; m != nil {
		m.reset(tenant)
	}
	l.cfg.Log.Info("tenant budget reset", "tenant", tenant, "by", by)
	if l.cfg.Event != nil {
		l.cfg.Event("budget.reset", tenant, map[string]any{"period": lim.Period, "start": key.Start.Format(time.RFC3339), "by": by})
	}
	return nil
}

// Close stops the writer after one last flush (bounded by ctx); what the
// store did not take is logged and counted as lost.
func (l *Ledger) Close(ctx context.Context) error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(l.quit)
	<-l.done // after the flush it was in
	defer l.stop()
	// Its own bound: the caller's ctx may be spent on the drain already.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if !l.flush(fctx) {
		l.mu.Lock()
		lost := l.pend
		l.pend = map[Key]*pending{}
		l.mu.Unlock()
		for key, p := range lost {
			spent := p.add.clone()
			l.mu.Lock()
			spent.add(l.estimate(key.Tenant, p.marks)) // the sessions' reports, as far as known
			l.mu.Unlock()
			l.cfg.Log.Error("budget spend not recorded: the store failed at shutdown", "tenant", key.Tenant, "tokens", spent.Tokens, "cost", spent.Cost)
			if m := l.cfg.Metrics; m != nil {
				m.lost(key.Tenant, spent)
			}
		}
	}
	return l.cfg.Store.Close()
}
