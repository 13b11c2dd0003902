package metrics

import (
	"bytes"

	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"go.opentelemetry.io/otel/trace"
)

// Wants says which of a session's events the agent's metrics count
// (observe.Selective).
func (am *Agent) Wants(k observe.Kind) bool {
	return k != observe.TurnStarted && k != observe.PermissionRequested && k != observe.FileServed
}

// Observe counts a session's event in the agent's metrics: the agent is
// an observe.Observer of its sessions.
func (am *Agent) Observe(e *observe.Event) {
	label := e.Session.Label
	switch e.Kind {
	case observe.SessionCreated, observe.SessionLoaded, observe.SessionClosed, observe.SessionLost:
		am.SessionsTotal.WithLabelValues(label, e.Kind.SessionName()).Inc()
	case observe.Update:
		if e.First {
			var span trace.Span
			if e.Turn != nil {
				span = e.Turn.Span
			}
			tracing.ObserveLatency(am.FirstUpdate, e.Duration.Seconds(), span)
		}
	case observe.CostReported:
		am.UsageCost.WithLabelValues(label, e.Currency).Add(e.Amount)
	case observe.UsageRejected:
		am.UsageRejected.WithLabelValues(e.Reason).Inc()
	case observe.TurnEnded:
		am.PromptSeconds.WithLabelValues(label).Add(e.Duration.Seconds())
		for k, n := range e.Tokens {
			am.UsageTokens.WithLabelValues(label, k).Add(float64(n))
		}
	case observe.TokensReported:
		for k, n := range e.Tokens {
			am.UsageTokens.WithLabelValues(label, k).Add(float64(n))
		}
	case observe.PermissionResolved:
		if outcome := resolutionLabel(e.By, e.Outcome); outcome != "" {
			am.root.PermissionResolutions.WithLabelValues(outcome).Inc()
		}
	case observe.SessionAttached:
		am.root.Attaches.WithLabelValues("ok").Inc()
		am.root.AttachedClients.Inc()
	case observe.SessionDetached:
		am.root.AttachedClients.Dec()
	case observe.AttachRefused:
		am.root.Attaches.WithLabelValues(e.Reason).Inc()
	case observe.TakenOver:
		am.root.Takeovers.WithLabelValues(e.Reason).Inc()
	case observe.PromptsQueued:
		am.root.PromptsQueued.Add(float64(e.Count))
	}
}

// resolutionLabel is how acpgate_permission_resolutions_total counts a
// permission request settled by by with outcome ("": not counted).
func resolutionLabel(by string, outcome []byte) string {
	switch by {
	case "timeout", "disconnect":
		return by
	case "admin":
		return "cancelled"
	case "client":
		if bytes.Contains(outcome, []byte(`"selected"`)) {
			return "selected"
		}
		return "cancelled"
	}
	return ""
}
