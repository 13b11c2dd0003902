package proxy

import (
	"bytes"

	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/audittrail"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"go.opentelemetry.io/otel/trace"
)

// observers is what watches the agent's sessions: the relay's metrics
// first, then the configured observers, the audit trail and the turns'
// spans (each when it is on).
func (r *Relay) observers(ag *agent, extra []observe.Observer) *observe.Set {
	os := append([]observe.Observer{metricsObserver{ag.metrics}}, extra...)
	if r.audit != nil {
		os = append(os, audittrail.New(r.audit, r.prompts))
	}
	if r.tracer != nil {
		os = append(os, tracing.New(r.tracer))
	}
	return observe.NewSet(os...)
}

// metricsObserver counts a session's events in the agent's metrics.
type metricsObserver struct{ am *metrics.Agent }

var sessionEventNames = map[observe.Kind]string{
	observe.SessionCreated: "created", observe.SessionLoaded: "loaded",
	observe.SessionClosed: "closed", observe.SessionLost: "lost",
}

func (o metricsObserver) Wants(k observe.Kind) bool {
	return k != observe.TurnStarted && k != observe.PermissionRequested && k != observe.FileServed
}

func (o metricsObserver) Observe(e *observe.Event) {
	am, label := o.am, e.Session.Label
	switch e.Kind {
	case observe.SessionCreated, observe.SessionLoaded, observe.SessionClosed, observe.SessionLost:
		am.SessionsTotal.WithLabelValues(label, sessionEventNames[e.Kind]).Inc()
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
	case observe.PermissionResolved:
		if outcome := resolutionLabel(e.By, e.Outcome); outcome != "" {
			am.Root().PermissionResolutions.WithLabelValues(outcome).Inc()
		}
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
