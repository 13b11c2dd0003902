package proxy

import (
	"encoding/json"
	"maps"
	"math"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// Metering counts what agents report using (ACP usage_update and
// PromptResponse.usage) per tenant and agent. PromptResponse.usage is taken
// as the turn's own (counted whole each turn); usage_update.cost.amount is
// the session's cumulative cost, of which only the increase since the
// session's last report counts. What fails the checks below counts nothing
// (acpgate_usage_rejected_total).
const (
	maxTurnTokens   = 1e12 // tokens of one kind in one turn
	maxCostIncrease = 1e9  // a session's cost increase in one report
	maxCurrencies   = 8    // currencies a session tracks, and a tenant's labels name
	maxCurrencyLen  = 16   // a currency label's length
	maxCurrencyKey  = 64   // a currency's length; longer is invalid
)

// Labels of the fields metering locates (acp.go's specs).
const (
	labelUpdateKind = "update.sessionUpdate"
	labelStopReason = "stopReason"
	labelUsage      = "usage"
)

// Reasons a report counts nothing.
const (
	rejectInvalid    = "invalid"    // not a number, or not an integer token count
	rejectNegative   = "negative"   // below zero
	rejectTooLarge   = "too_large"  // beyond maxTurnTokens or maxCostIncrease
	rejectDecreased  = "decreased"  // a cumulative cost went down (the new amount is the baseline)
	rejectCurrencies = "currencies" // a session's currency beyond maxCurrencies
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

// meter is a session's usage so far and the baselines of its cumulative
// cost. Written by its process's reader; mu is a leaf.
type meter struct {
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
}

// usage is the session's Usage so far (copies).
func (s *Session) usage() Usage {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	return Usage{Tokens: maps.Clone(s.meter.tokens), Cost: maps.Clone(s.meter.cost)}
}

// replaying marks a load or resume of s in flight; the hold undoes it.
func (h *hold) replaying(s *Session) {
	if s != nil && h.replay == nil {
		h.replay = s
		s.meter.replays.Add(1)
	}
}

// meterLoaded marks a session that came by a load: the agent's cost so
// far was counted before, or is not this gateway's to count.
func (s *Session) meterLoaded() {
	s.meter.mu.Lock()
	s.meter.loaded = true
	s.meter.mu.Unlock()
}

// noteCost takes a report of the session's cumulative cost in currency cur
// (as the agent wrote it: each currency has a baseline of its own, even
// those whose label is "other") and returns the increase to count, or why
// it counts nothing. label is cur's label, what the session's sums go by.
func (s *Session) noteCost(cur, label string, amount float64) (inc float64, reject string) {
	mt := &s.meter
	replay := mt.replays.Load() > 0
	mt.mu.Lock()
	defer mt.mu.Unlock()
	last, known := mt.last[cur]
	switch {
	case !known && len(mt.last) >= maxCurrencies:
		return 0, rejectCurrencies
	case replay || !known && mt.loaded:
		setMap(&mt.last, cur, amount)
		return 0, ""
	case amount < last:
		mt.last[cur] = amount // the agent's counter restarted
		return 0, rejectDecreased
	case amount-last > maxCostIncrease:
		setMap(&mt.last, cur, amount) // counted as nothing; the next report counts from here
		return 0, rejectTooLarge
	}
	setMap(&mt.last, cur, amount)
	inc = amount - last
	if inc > 0 {
		addMap(&mt.cost, label, inc)
		addMap(&mt.turnCost, label, inc)
	}
	return inc, ""
}

// noteTokens adds a turn's token counts to the session's.
func (s *Session) noteTokens(tokens map[string]int64) {
	s.meter.mu.Lock()
	for k, n := range tokens {
		addMap(&s.meter.tokens, k, n)
	}
	s.meter.mu.Unlock()
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

// sessionUpdateKind is a session/update's sessionUpdate tag, as the scanner
// located it (nil: none).
func sessionUpdateKind(m *jsonrpc.Message) []byte {
	f, ok := taggedField(m, labelUpdateKind)
	if !ok {
		return nil
	}
	kind, _ := m.RawString(f)
	return kind
}

// meterCost meters a usage_update's cost: an increase of the session's
// cumulative cost is reported to observers (observe.CostReported), a report
// that fails the checks counts nothing (observe.UsageRejected). e is the
// caller's event, reused.
func (s *Session) meterCost(m *jsonrpc.Message, e *observe.Event) {
	var p struct {
		Update struct {
			Cost json.RawMessage `json:"cost"`
		} `json:"update"`
	}
	if json.Unmarshal(m.Payload, &p) != nil || len(p.Update.Cost) == 0 || string(p.Update.Cost) == "null" {
		return // no cost reported
	}
	var inc float64
	cur, label, amount, reject := parseCost(p.Update.Cost)
	if reject == "" {
		inc, reject = s.noteCost(cur, label, amount)
	}
	switch {
	case reject != "":
		s.link.p.Log().Debug("agent usage_update counted as nothing", "reason", reject, "session", s.GatewayID)
		*e = observe.Event{Kind: observe.UsageRejected, Session: s.info, Reason: reject}
	case inc > 0:
		*e = observe.Event{Kind: observe.CostReported, Session: s.info, Turn: s.curTurn(), Currency: s.ten.currencyLabel(label), Amount: inc}
	default:
		return
	}
	s.link.ag.obs.Observe(e)
}

// parseCost reads a usage_update's cost: {amount, currency}; cur is the
// currency as written, label what metrics call it (currencyOf).
func parseCost(raw json.RawMessage) (cur, label string, amount float64, reject string) {
	var c struct {
		Amount   json.RawMessage `json:"amount"`
		Currency json.RawMessage `json:"currency"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return "", "", 0, rejectInvalid
	}
	amount, reject = parseAmount(c.Amount, math.MaxFloat64)
	cur, label, ok := currencyOf(c.Currency)
	if reject == "" && !ok {
		reject = rejectInvalid
	}
	return cur, label, amount, reject
}

// taggedField finds the located tag of the given label.
func taggedField(m *jsonrpc.Message, label string) (jsonrpc.Field, bool) {
	for _, f := range m.Fields {
		if f.Kind == jsonrpc.FieldTag && f.Label == label {
			return f, true
		}
	}
	return jsonrpc.Field{}, false
}

// parseAmount reads a JSON number in [0, max]; else why not.
func parseAmount(raw json.RawMessage, max float64) (float64, string) {
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, rejectInvalid
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	switch {
	case err != nil && math.IsInf(v, 1):
		return 0, rejectTooLarge
	case err != nil && math.IsInf(v, -1):
		return 0, rejectNegative
	case err != nil || math.IsNaN(v):
		return 0, rejectInvalid
	case v < 0:
		return 0, rejectNegative
	case v > max:
		return 0, rejectTooLarge
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
	if cur == "" || len(cur) > maxCurrencyLen {
		return cur, "other", true
	}
	for _, c := range []byte(cur) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return cur, "other", true
		}
	}
	return cur, cur, true
}

// currencyLabel bounds the currency labels of the tenant's metrics to
// the first maxCurrencies seen; the rest are "other".
func (t *tenant) currencyLabel(cur string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.currencies[cur]; ok || cur == "other" {
		return cur
	}
	if len(t.currencies) >= maxCurrencies {
		return "other"
	}
	setMap(&t.currencies, cur, struct{}{})
	return cur
}

// turnTokens reads a PromptResponse's usage: the token counts that pass
// the checks, by kind label; each failing one is reported rejected.
func (s *Session) turnTokens(raw []byte) map[string]int64 {
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		s.emit(&observe.Event{Kind: observe.UsageRejected, Reason: rejectInvalid})
		return nil
	}
	var out map[string]int64
	for _, k := range usageKinds {
		v, ok := u[k.field]
		if !ok || string(v) == "null" {
			continue
		}
		n, reject := parseAmount(v, maxTurnTokens)
		if reject == "" && n != math.Trunc(n) {
			reject = rejectInvalid
		}
		if reject != "" {
			s.emit(&observe.Event{Kind: observe.UsageRejected, Reason: reject})
			continue
		}
		setMap(&out, k.kind, int64(n))
	}
	return out
}

// stopReasonOf is the stopReason of a session/prompt's answer as the
// scanner located it (specPromptResult); ok: the answer has one ("" if it
// is not a string).
func stopReasonOf(m *jsonrpc.Message) (stop string, ok bool) {
	f, ok := taggedField(m, labelStopReason)
	if !ok {
		return "", false
	}
	stop, _ = m.String(f)
	return stop, true
}

// meterTurn counts the end of req's turn, answered by m: its stop reason
// and the usage it reports (req.turnEnded).
func meterTurn(req *outReq, m *jsonrpc.Message) {
	stop, usage := "error", []byte(nil)
	if !m.IsError {
		if s, ok := stopReasonOf(m); ok {
			stop = s
		}
		if f, ok := taggedField(m, labelUsage); ok {
			usage = m.Bytes(f)
		}
	}
	req.turnEnded(stop, usage)
}
