package gateway

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
)

// auditTrail is the gateway's side of the audit trail (audit.file): the
// events it records itself (connections, refusals, admin actions), and the
// file's reopen and close. Without audit.file it records nothing.
type auditTrail struct {
	rec  audit.Recorder // nil: no audit trail
	file *audit.Log     // the same, to reopen and close; nil: none
	// refusals bounds the events anyone can make the trail write without a
	// credential (auth.failed, admin.denied).
	refusals *audit.Limiter
}

// on reports whether there is a trail to record to.
func (t *auditTrail) on() bool { return t.rec != nil }

// record writes ev to the audit trail, if there is one.
func (t *auditTrail) record(ev audit.Event) {
	if t.rec != nil {
		t.rec.Record(ev)
	}
}

// event is an audit event about l's connection.
func (l *link) event(kind string, fields ...audit.Field) audit.Event {
	return audit.Event{Event: kind, Tenant: l.tenant, Subject: l.subject, Agent: l.agent, Conn: l.id, Fields: fields}
}

// recordOpened records connection.opened for a socket (a WebSocket, resumed or
// not) or a Streamable HTTP connection.
func (l *link) recordOpened(fields ...audit.Field) {
	l.s.audit.record(l.event("connection.opened", append([]audit.Field{
		audit.F("transport", l.kind), audit.F("remote", l.remote)}, fields...)...))
}

// recordClosed records connection.closed: label is why (the metrics reason),
// attrs the transport's own (a WebSocket's close code).
func (l *link) recordClosed(label string, attrs []any) {
	if !l.s.audit.on() {
		return
	}
	fields := []audit.Field{audit.F("transport", l.kind), audit.F("remote", l.remote), audit.F("reason", label)}
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "close_code" {
			fields = append(fields, audit.F("close_code", attrs[i+1]))
		}
	}
	fields = append(fields, audit.F("duration_ms", time.Since(l.start).Milliseconds()))
	l.s.audit.record(l.event("connection.closed", fields...))
}

// authFailed records auth.failed for a request the authenticator refused
// (an upgrade, a POST, a ticket request…): the reason, never the
// credential.
func (t *auditTrail) authFailed(r *http.Request, reason string) {
	if t == nil || !t.on() { // nil: New has not finished
		return
	}
	t.refusal(audit.Event{Event: "auth.failed", Fields: []audit.Field{
		audit.F("reason", reason), audit.F("remote", r.RemoteAddr), audit.F("path", r.URL.Path)}})
}

// openAudit opens the audit trail (recording nothing when audit.file is
// unset) and registers its metrics on reg.
func openAudit(cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) (*auditTrail, error) {
	t := &auditTrail{refusals: audit.NewLimiter(20, 100)}
	if cfg.Audit.File == "" {
		return t, nil
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
	file, err := audit.Open(audit.Config{
		File:       cfg.Audit.File,
		Written:    func(ev string) { events.WithLabelValues(ev).Inc() },
		Dropped:    func(n int) { dropped.Add(float64(n)) },
		WriteError: writeErrors.Inc,
	}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(events, writeErrors, dropped)
	t.rec, t.file = file, file
	return t, nil
}

// ReopenAudit opens the audit file afresh (on SIGHUP, after logrotate
// moved it); the new file's first line chains to the old one's last.
// Without an audit file it does nothing.
func (s *Server) ReopenAudit() error { return s.audit.reopen() }

// reopen opens the audit file afresh (ReopenAudit).
func (t *auditTrail) reopen() error {
	if t.file == nil {
		return nil
	}
	return t.file.Reopen()
}

// close writes what the audit trail holds and closes it (Shutdown, once the
// relay has stopped).
func (t *auditTrail) close() error {
	if t.file == nil {
		return nil
	}
	return t.file.Close()
}

// refusal records ev, an event anyone can cause without a credential, at
// most 20 a second (bursts of 100), so that a flood of refused requests
// cannot crowd the trail's other events out; the next one written says how
// many were left out (suppressed).
func (t *auditTrail) refusal(ev audit.Event) {
	if !t.on() {
		return
	}
	fields, ok := t.refusals.Let(ev.Fields)
	if !ok {
		return
	}
	ev.Fields = fields
	t.record(ev)
}
