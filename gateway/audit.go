package gateway

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
)

// record writes ev to the audit trail, if there is one.
func (s *Server) record(ev audit.Event) {
	if s.audit != nil {
		s.audit.Record(ev)
	}
}

// event is an audit event about l's connection.
func (l *link) event(kind string, fields ...audit.Field) audit.Event {
	return audit.Event{Event: kind, Tenant: l.tenant, Subject: l.subject, Agent: l.agent, Conn: l.id, Fields: fields}
}

// recordOpened records connection.opened for a socket (a WebSocket, resumed or
// not) or a Streamable HTTP connection.
func (l *link) recordOpened(fields ...audit.Field) {
	l.s.record(l.event("connection.opened", append([]audit.Field{
		audit.F("transport", l.kind), audit.F("remote", l.remote)}, fields...)...))
}

// recordClosed records connection.closed: label is why (the metrics reason),
// attrs the transport's own (a WebSocket's close code).
func (l *link) recordClosed(label string, attrs []any) {
	if l.s.audit == nil {
		return
	}
	fields := []audit.Field{audit.F("transport", l.kind), audit.F("remote", l.remote), audit.F("reason", label)}
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "close_code" {
			fields = append(fields, audit.F("close_code", attrs[i+1]))
		}
	}
	fields = append(fields, audit.F("duration_ms", time.Since(l.start).Milliseconds()))
	l.s.record(l.event("connection.closed", fields...))
}

// authFailed records auth.failed for a request the authenticator refused
// (an upgrade, a POST, a ticket request…): the reason, never the
// credential.
func (s *Server) authFailed(r *http.Request, reason string) {
	if s == nil || s.audit == nil {
		return
	}
	s.recordRefusal(audit.Event{Event: "auth.failed", Fields: []audit.Field{
		audit.F("reason", reason), audit.F("remote", r.RemoteAddr), audit.F("path", r.URL.Path)}})
}

// openAudit opens the audit trail (nil when audit.file is unset) and
// registers its metrics on reg.
func openAudit(cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) (*audit.Log, error) {
	if cfg.Audit.File == "" {
		return nil, nil
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_audit_events_total", Help: "Events written to the audit trail, by event.",
	}, []string{"event"})
	writeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "acpgate_audit_write_errors_total", Help: "Failed writes to the audit trail (a full disk…); their events are lost.",
	})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "acpgate_audit_dropped_total", Help: "Audit events lost: the writer was behind (the disk stalled) or their write failed.",
	})
	trail, err := audit.Open(audit.Config{
		File:       cfg.Audit.File,
		Written:    func(ev string) { events.WithLabelValues(ev).Inc() },
		Dropped:    func(n int) { dropped.Add(float64(n)) },
		WriteError: writeErrors.Inc,
	}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(events, writeErrors, dropped)
	return trail, nil
}

// ReopenAudit opens the audit file afresh (on SIGHUP, after logrotate
// moved it); the new file's first line chains to the old one's last.
// Without an audit file it does nothing.
func (s *Server) ReopenAudit() error {
	if s.trail == nil {
		return nil
	}
	return s.trail.Reopen()
}

// closeAudit writes what the audit trail holds and closes it (Shutdown,
// once the relay has stopped).
func (s *Server) closeAudit() error {
	if s.trail == nil {
		return nil
	}
	return s.trail.Close()
}

// recordRefusal records ev, an event anyone can cause without a credential,
// at most 20 a second (bursts of 100), so that a flood of refused requests
// cannot crowd the trail's other events out; the next one written says
// how many were left out (suppressed).
func (s *Server) recordRefusal(ev audit.Event) {
	if s.audit == nil {
		return
	}
	fields, ok := s.refusals.Let(ev.Fields)
	if !ok {
		return
	}
	ev.Fields = fields
	s.record(ev)
}
