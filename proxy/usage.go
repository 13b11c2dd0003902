package proxy

import (
	"encoding/json"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
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

// meterUpdate counts a usage_update's cost (kind: the update's
// sessionUpdate tag, sessionUpdateKind). Other kinds cost nothing more.
func (r *agentReader) meterUpdate(m *jsonrpc.Message, s *Session, kind []byte) {
	if string(kind) != "usage_update" {
		return
	}
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
	am := r.l.ag.metrics
	if reject != "" {
		am.UsageRejected.WithLabelValues(reject).Inc()
		r.l.p.Log().Debug("agent usage_update counted as nothing", "reason", reject, "session", s.GatewayID)
		return
	}
	if inc > 0 {
		am.UsageCost.WithLabelValues(s.ten.label, s.ten.currencyLabel(label)).Add(inc)
	}
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
// the checks, by kind label; each failing one is counted as rejected.
func turnTokens(raw []byte, am *agentMetrics) map[string]int64 {
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		am.UsageRejected.WithLabelValues(rejectInvalid).Inc()
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
			am.UsageRejected.WithLabelValues(reject).Inc()
			continue
		}
		setMap(&out, k.kind, int64(n))
	}
	return out
}

// promptBegins notes that req, a prompt, goes to the agent now: its
// turn's time and cost count from here; prompt.started is recorded (with
// its text when Config.AuditPrompts). blocks: the prompt's, if read
// already; else they are read from params when needed.
func (c *Conn) promptBegins(req *outReq, blocks []json.RawMessage, params []byte) {
	s := req.sess
	s.meter.mu.Lock()
	clear(s.meter.turnCost)
	s.meter.mu.Unlock()
	req.began.Store(time.Now().UnixNano())
	if !c.relay.auditing() {
		return
	}
	if !c.relay.prompts {
		c.event("prompt.started", s.GatewayID)
		return
	}
	if blocks == nil {
		blocks = promptBlocks(params)
	}
	c.event("prompt.started", s.GatewayID, audit.F("prompt", promptText(blocks)))
}

// promptText joins the text blocks of a prompt.
func promptText(blocks []json.RawMessage) string {
	var texts []string
	for _, b := range blocks {
		var blk struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(b, &blk) == nil && blk.Type == "text" {
			texts = append(texts, blk.Text)
		}
	}
	return strings.Join(texts, "\n")
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

// meterTurn counts the end of req's turn, answered by m (nil: ended
// without an answer): its tokens and time, and prompt.ended. Only the
// first call for a turn that began counts.
func (r *agentReader) meterTurn(req *outReq, m *jsonrpc.Message) {
	stop, usage := "error", []byte(nil)
	if m != nil && !m.IsError {
		if s, ok := stopReasonOf(m); ok {
			stop = s
		}
		if f, ok := taggedField(m, labelUsage); ok {
			usage = m.Bytes(f)
		}
	}
	req.turnOver(stop, usage)
}

// turnOver counts the end of a prompt's turn once: its time, its tokens
// (usage: PromptResponse.usage, nil: none) and prompt.ended.
func (req *outReq) turnOver(stop string, usage []byte) {
	began := req.began.Swap(0)
	if began == 0 {
		return
	}
	s, c := req.sess, req.conn
	am := s.link.ag.metrics
	d := time.Since(time.Unix(0, began))
	am.PromptSeconds.WithLabelValues(s.ten.label).Add(d.Seconds())
	var tokens map[string]int64
	if usage != nil {
		tokens = turnTokens(usage, am)
		for k, n := range tokens {
			am.UsageTokens.WithLabelValues(s.ten.label, k).Add(float64(n))
		}
		s.noteTokens(tokens)
	}
	s.meter.mu.Lock()
	cost := maps.Clone(s.meter.turnCost)
	s.meter.mu.Unlock()
	if !c.relay.auditing() {
		return
	}
	fields := []audit.Field{audit.F("stop_reason", stop), audit.F("duration_ms", d.Milliseconds())}
	if len(tokens) > 0 {
		fields = append(fields, audit.F("usage", tokens))
	}
	if len(cost) > 0 {
		fields = append(fields, audit.F("cost", cost))
	}
	c.event("prompt.ended", s.GatewayID, fields...)
}
