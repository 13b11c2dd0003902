package gateway

import (
	"errors"
	"net/http"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/auth"
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

// authFailed records auth.failed for a refused request: the reason, never
// the credential.
func (s *Server) authFailed(r *http.Request, err error) {
	if s.audit == nil {
		return
	}
	reason := "refused"
	var e *auth.Error
	if errors.As(err, &e) {
		reason = e.Reason
	}
	s.record(audit.Event{Event: "auth.failed", Fields: []audit.Field{
		audit.F("reason", reason), audit.F("remote", r.RemoteAddr), audit.F("path", r.URL.Path)}})
}
