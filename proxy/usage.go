package proxy

import (
	"encoding/json"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/usage"
)

// Metering counts what agents report using per tenant and agent: the
// session's meter (package usage) checks and sums the reports, and what
// it counts or refuses goes to observers (observe.CostReported,
// observe.UsageRejected; acpgate_usage_rejected_total).

// Usage is what a session's agent reported using, summed over the
// session's life in this gateway.
type Usage = usage.Usage

// replaying marks a load or resume of s in flight; the hold undoes it.
func (h *hold) replaying(s *Session) {
	if s != nil && h.replay == nil {
		h.replay = s
		s.meter.ReplayStarted()
	}
}

// meterCost meters a usage_update's cost: an increase of the session's
// cumulative cost is reported to observers (observe.CostReported), a report
// that fails the checks counts nothing (observe.UsageRejected). e is the
// caller's event, reused.
func (ev sessionEvents) meterCost(m *jsonrpc.Message, e *observe.Event) {
	s := ev.s
	var p struct {
		Update struct {
			Cost json.RawMessage `json:"cost"`
		} `json:"update"`
	}
	if json.Unmarshal(m.Payload, &p) != nil || len(p.Update.Cost) == 0 || string(p.Update.Cost) == "null" {
		return // no cost reported
	}
	var inc float64
	var b usage.Budgeted
	cur, label, amount, reject := usage.ParseCost(p.Update.Cost)
	if reject == "" {
		inc, b, reject = s.meter.NoteCost(cur, label, amount)
	}
	if reject != "" {
		s.side.p.Log().Debug("agent usage_update counted as nothing here", "reason", reject, "session", s.GatewayID)
		ev.usageRejected(e, reject)
	}
	if b.Live {
		// Every live report, even one this meter counts as nothing (a
		// loaded session's first, a decrease): a budget counts it against
		// the value it keeps for the session, whichever process loaded it.
		ev.costReported(e, label, inc, amount, b)
	}
}

// turnTokens reads a PromptResponse's usage: the token counts that pass
// the checks, by kind label; each failing one is reported rejected.
func (ev sessionEvents) turnTokens(raw []byte) map[string]int64 {
	tokens, rejects := usage.ParseTokens(raw)
	for _, reject := range rejects {
		ev.usageRejected(nil, reject)
	}
	return tokens
}

// lateAnswer counts the usage of m, the answer to a prompt whose turn the
// gateway ended without it (timed out, cancelled in the agent's place):
// observe.TokensReported. false: no such prompt.
func (r *agentReader) lateAnswer(id int64, m *jsonrpc.Message) bool {
	s := r.l.takeLate(id)
	if s == nil {
		return false
	}
	if m.IsError {
		return true
	}
	if f, ok := acp.Tagged(m, acp.LabelUsage); ok {
		if tokens := s.events().turnTokens(m.Bytes(f)); len(tokens) > 0 {
			s.meter.NoteTokens(tokens)
			s.events().tokensReported(tokens)
		}
	}
	r.l.p.Log().Debug("a prompt answered after the gateway ended its turn; its usage counted", "session", s.GatewayID)
	return true
}

// meterTurn counts the end of req's turn, answered by m: its stop reason
// and the usage it reports (req.turnEnded).
func meterTurn(req *outReq, m *jsonrpc.Message) {
	stop, usage := "error", []byte(nil)
	if !m.IsError {
		if s, ok := acp.StopReason(m); ok {
			stop = s
		}
		if f, ok := acp.Tagged(m, acp.LabelUsage); ok {
			usage = m.Bytes(f)
		}
	}
	req.turnEnded(stop, usage)
}
