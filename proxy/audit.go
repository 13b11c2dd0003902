package proxy

import "github.com/acpgate/acpgate/audit"

// event records one audit event about c (and sess, when it names one: the
// ID the client sees); nothing when the audit trail is off.
func (c *Conn) event(kind, sess string, fields ...audit.Field) {
	a := c.relay.audit
	if a == nil {
		return
	}
	a.Record(audit.Event{Event: kind, Tenant: c.tenant, Subject: c.subject, Agent: c.ag.name,
		Conn: c.id, Session: sess, Fields: fields})
}

// auditing reports whether the audit trail is on (a caller that must
// build an event's fields checks it first).
func (r *Relay) auditing() bool { return r.audit != nil }
