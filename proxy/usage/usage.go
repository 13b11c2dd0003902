// Package usage meters what ACP agents report using (usage_update's cost
// and PromptResponse.usage's token counts): it reads and checks the
// reports, and keeps a session's totals and the baselines of its
// cumulative cost. It records nothing itself; what fails a check comes
// back as a reason (Reject*).
//
// PromptResponse.usage is taken as the turn's own (counted whole each
// turn); usage_update.cost.amount is the session's cumulative cost, of
// which only the increase since the session's last report counts.
package usage

import (
	"encoding/json"
	"maps"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
)

// Limits of what a report may say; beyond them it counts nothing.
const (
	maxTurnTokens   = 1e12 // tokens of one kind in one turn
	MaxCostIncrease = 1e9  // a session's cost increase in one report (budgets apply it too)
	MaxCurrencies   = 8    // currencies a session tracks, and a tenant's labels name
	maxCurrencyLen  = 16   // a currency label's length
	maxCurrencyKey  = 64   // a currency's length; longer is invalid
)

// OtherCurrency labels the currencies not named by their own label.
const OtherCurrency = "other"

// Reasons a report counts nothing.
const (
	RejectInvalid    = "invalid"    // not a number, or not an integer token count
	RejectNegative   = "negative"   // below zero
	RejectTooLarge   = "too_large"  // beyond maxTurnTokens or MaxCostIncrease
	RejectDecreased  = "decreased"  // a cumulative cost went down (the new amount is the baseline)
	RejectCurrencies = "currencies" // a session's currency beyond MaxCurrencies
)

// usageKinds maps PromptResponse.usage's fields to the kind label.
var usageKinds = [...]struct{ field, kind string }{
	{"inputTokens", "input"}, {"outputTokens", "output"}, {"thoughtTokens", "thought"},
	{"cachedReadTokens", "cached_read"}, {"cachedWriteTokens", "cached_write"},
}

// Usage is what a session's agent reported using, summed over the
// session's life in this gateway.
type Usage struct {
	Tokens map[string]int64   // by kind: input, output, thought, cached_read, cached_write
	Cost   map[string]float64 // by currency: the increase of the agent's cumulative cost
}

// Meter is a session's usage so far and the baselines of its cumulative
// cost. Written by its process's reader; its lock is a leaf. The zero
// Meter is ready.
type Meter struct {
	// replays counts the loads and resumes of the session in flight: the
	// usage_update they bring only set the baseline.
	replays atomic.Int32

	mu       sync.Mutex
	tokens   map[string]int64
	cost     map[string]float64 // by currency
	last     map[string]float64 // the agent's last cumulative amount, by currency
	turnCost map[string]float64 // the turn in flight's share of cost
	// loaded: the session came to this gateway by a load, so the first
	// amount of a currency is a baseline, not an increase.
	loaded bool
	// own is the load's last report by currency as budgets count it (a
	// decrease leaves it): what the load's next report counts from.
	// reloaded: the session was loaded or resumed, so the load's first
	// live report of a currency (none in own) is compared with the
	// session's kept value (package budget).
	own      map[string]float64
	reloaded bool
	// replayed is the last amount by currency the load's replay carried
	// (the agent's total at load time): the load's first live report
	// counts over it.
	replayed map[string]float64
	// perSession: the agent's cumulative cost carries on across loads and
	// processes (SetPerSession), so a load's first live report with no
	// replayed amount counts over the session's kept value; else over 0.
	perSession bool
}

// Budgeted is a live report as budgets take it (package budget): a
// report that came outside a load's replay, from the agent's work since
// the session exists, whatever this meter counted. A replay's report, or
// one past MaxCurrencies, is not live.
//
// A load's (or resume's) first live report of a currency counts over
// the load's own baseline: the last amount its replay carried (the
// agent's total at load time), or, with none, 0, so it counts in full
// (an agent whose total carries on across loads but is not replayed is
// overcounted once per load: the safe side). A report below the
// replayed amount is a total that started again: it counts in full.
// Only for an agent whose total carries on across loads and processes
// (SetPerSession) does a first report with no replayed amount go to the
// session's kept value (First).
type Budgeted struct {
	Live bool
	// First: the first live report of its currency since the session was
	// loaded or resumed, of a per-session total with no replayed amount:
	// budgets compare it with the session's kept value (below it, the
	// total started again and counts in full; at or above, its increase).
	// From is then the report itself.
	First bool
	// From is what the report's increase counts from: the load's previous
	// report (0 for a session made here and its first report); for a
	// load's first report, its baseline (the replayed amount, or 0). A
	// report below it (not First) is a decrease: it counts nothing and
	// leaves From where it was.
	From float64
}

// SetPerSession tells the meter the agent's cumulative cost carries on
// across loads and processes (usage.cost_total: per_session): a load's
// first live report with no replayed amount is compared with the
// session's kept value (Budgeted.First). Call it before the session's
// first report.
func (mt *Meter) SetPerSession() {
	mt.mu.Lock()
	mt.perSession = true
	mt.mu.Unlock()
}

// Usage is the session's Usage so far (copies).
func (mt *Meter) Usage() Usage {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	return Usage{Tokens: maps.Clone(mt.tokens), Cost: maps.Clone(mt.cost)}
}

// ReplayStarted marks a load or resume of the session in flight: until
// ReplayEnded, a cost report only sets the baseline (and counts nothing
// for budgets); the first live report of each currency after it is a
// load's first (Budgeted.First).
func (mt *Meter) ReplayStarted() {
	mt.replays.Add(1)
	mt.mu.Lock()
	clear(mt.own)
	clear(mt.replayed)
	mt.reloaded = true
	mt.mu.Unlock()
}

// ReplayEnded undoes one ReplayStarted.
func (mt *Meter) ReplayEnded() { mt.replays.Add(-1) }

// Loaded marks a session that came by a load: this meter takes the first
// amount of a currency as its baseline (the agent's cost so far was
// metered before, or elsewhere). Budgets do not: they count a load's live
// reports against the value kept for the session (package budget).
func (mt *Meter) Loaded() {
	mt.mu.Lock()
	mt.loaded = true
	mt.mu.Unlock()
}

// TurnStarted starts a turn's share of cost from nothing.
func (mt *Meter) TurnStarted() {
	mt.mu.Lock()
	clear(mt.turnCost)
	mt.mu.Unlock()
}

// TurnCost is the cost counted since TurnStarted, by label (a copy).
func (mt *Meter) TurnCost() map[string]float64 {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	return maps.Clone(mt.turnCost)
}

// NoteCost takes a report of the session's cumulative cost in currency cur
// (as the agent wrote it: each currency has a baseline of its own, even
// those whose label is "other") and returns the increase to count here
// (this process's metering), or why it counts nothing. label is cur's
// label, what the session's sums go by.
//
// b is the report as budgets take it (Budgeted).
func (mt *Meter) NoteCost(cur, label string, amount float64) (inc float64, b Budgeted, reject string) {
	replay := mt.replays.Load() > 0
	mt.mu.Lock()
	defer mt.mu.Unlock()
	last, known := mt.last[cur]
	switch {
	case !known && len(mt.last) >= MaxCurrencies:
		return 0, Budgeted{}, RejectCurrencies
	case replay:
		setMap(&mt.last, cur, amount)
		setMap(&mt.replayed, cur, amount)
		return 0, Budgeted{}, ""
	}
	b = mt.budgeted(cur, amount)
	switch {
	case !known && mt.loaded:
		setMap(&mt.last, cur, amount)
		return 0, b, ""
	case amount < last:
		mt.last[cur] = amount // the agent's counter restarted
		return 0, b, RejectDecreased
	case amount-last > MaxCostIncrease:
		setMap(&mt.last, cur, amount) // counted as nothing; the next report counts from here
		return 0, b, RejectTooLarge
	}
	setMap(&mt.last, cur, amount)
	inc = amount - last
	if inc > 0 {
		addMap(&mt.cost, label, inc)
		addMap(&mt.turnCost, label, inc)
	}
	return inc, b, ""
}

// budgeted is a live report of amount in cur as budgets take it, and
// moves the load's own value (own) unless it is a decrease. Called with
// mt.mu held.
func (mt *Meter) budgeted(cur string, amount float64) Budgeted {
	from, ok := mt.own[cur]
	if !ok && mt.reloaded { // the load's first live report
		setMap(&mt.own, cur, amount)
		base, replayed := mt.replayed[cur]
		switch {
		case !replayed && mt.perSession:
			return Budgeted{Live: true, First: true, From: amount}
		case amount < base: // the total started again despite its replay
			base = 0
		}
		return Budgeted{Live: true, From: base}
	}
	if amount < from {
		return Budgeted{Live: true, From: from}
	}
	setMap(&mt.own, cur, amount)
	return Budgeted{Live: true, From: from}
}

// NoteTokens adds a turn's token counts to the session's.
func (mt *Meter) NoteTokens(tokens map[string]int64) {
	mt.mu.Lock()
	for k, n := range tokens {
		addMap(&mt.tokens, k, n)
	}
	mt.mu.Unlock()
}

func setMap[V any](m *map[string]V, k string, v V) {
	if *m == nil {
		*m = map[string]V{}
	}
	(*m)[k] = v
}

func addMap[V int64 | float64](m *map[string]V, k string, v V) {
	if *m == nil {
		*m = map[string]V{}
	}
	(*m)[k] += v
}

// ParseCost reads a usage_update's cost: {amount, currency}; cur is the
// currency as written, label what metrics call it (currencyOf).
func ParseCost(raw json.RawMessage) (cur, label string, amount float64, reject string) {
	var c struct {
		Amount   json.RawMessage `json:"amount"`
		Currency json.RawMessage `json:"currency"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return "", "", 0, RejectInvalid
	}
	amount, reject = parseAmount(c.Amount, math.MaxFloat64)
	cur, label, ok := currencyOf(c.Currency)
	if reject == "" && !ok {
		reject = RejectInvalid
	}
	return cur, label, amount, reject
}

// parseAmount reads a JSON number in [0, max]; else why not.
func parseAmount(raw json.RawMessage, max float64) (float64, string) {
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, RejectInvalid
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	switch {
	case err != nil && math.IsInf(v, 1):
		return 0, RejectTooLarge
	case err != nil && math.IsInf(v, -1):
		return 0, RejectNegative
	case err != nil || math.IsNaN(v):
		return 0, RejectInvalid
	case v < 0:
		return 0, RejectNegative
	case v > max:
		return 0, RejectTooLarge
	}
	return v, ""
}

// currencyOf reads a currency: cur as written, and its label, cur itself
// when it is [A-Za-z0-9_-]{1,16}, else "other". ok false: not a string,
// or longer than maxCurrencyKey.
func currencyOf(raw json.RawMessage) (cur, label string, ok bool) {
	if json.Unmarshal(raw, &cur) != nil || len(cur) > maxCurrencyKey {
		return "", "", false
	}
	return cur, CurrencyLabel(cur), true
}

// CurrencyLabel is what metering (and budgets) call currency cur: cur
// itself when it is [A-Za-z0-9_-]{1,16}, else OtherCurrency.
func CurrencyLabel(cur string) string {
	if cur == "" || len(cur) > maxCurrencyLen {
		return OtherCurrency
	}
	for _, c := range []byte(cur) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return OtherCurrency
		}
	}
	return cur
}

// ParseTokens reads a PromptResponse's usage: the token counts that pass
// the checks, by kind label, and why each failing one counts nothing, in
// the order of the kinds.
func ParseTokens(raw []byte) (tokens map[string]int64, rejects []string) {
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		return nil, []string{RejectInvalid}
	}
	for _, k := range usageKinds {
		v, ok := u[k.field]
		if !ok || string(v) == "null" {
			continue
		}
		n, reject := parseAmount(v, maxTurnTokens)
		if reject == "" && n != math.Trunc(n) {
			reject = RejectInvalid
		}
		if reject != "" {
			rejects = append(rejects, reject)
			continue
		}
		setMap(&tokens, k.kind, int64(n))
	}
	return tokens, rejects
}

// Labels bounds the currency labels of a tenant's metrics to the first
// MaxCurrencies seen; the rest are OtherCurrency. Safe for concurrent use.
type Labels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// Of is the label of the currency cur.
func (l *Labels) Of(cur string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[cur]; ok || cur == OtherCurrency {
		return cur
	}
	if len(l.seen) >= MaxCurrencies {
		return OtherCurrency
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	l.seen[cur] = struct{}{}
	return cur
}
