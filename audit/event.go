// Package audit is acpgate's audit trail: one JSON line per event (who
// opened, prompted, approved, read or wrote what, and when), appended to a
// file off the relay's hot path, each line numbered (seq, from 1 in each
// run) and chained to the one before it by its SHA-256 so that a changed,
// removed or inserted line is found by Verify (acpgate audit verify).
// Events the trail lost leave a gap line (audit.gap) saying how many and
// why; with a key, every line carries a MAC, so that re-chaining the lines
// after an edit needs the key.
//
// It imports nothing of the gateway or the relay: both hand it Events.
package audit

// Event is one line of the audit trail. The writer adds ts, seq and prev
// (and kid and mac with a key); the rest is the caller's.
type Event struct {
	Event   string // what happened: "session.created", "permission.resolved", …
	Tenant  string
	Subject string // who: "jwt:" and the JWT's sub, or a static token's derived name "token:…" (never a token)
	Agent   string
	Conn    string // the connection's ID (Acp-Connection-Id)
	Session string // the session ID as the client sees it
	Fields  []Field
}

// Field is one of an event's own fields, written after the common ones in
// the order given. Value is anything encoding/json marshals (anything else
// is written as a string saying so). A field named like a common key (ts,
// event, tenant, subject, agent, conn, session, seq, prev, kid, mac, old_kid, mac_old) is
// left out.
type Field struct {
	Key   string
	Value any
}

// F is a Field.
func F(key string, value any) Field { return Field{Key: key, Value: value} }

// Recorder takes events. Record must not block or fail: the relay calls it
// on its own goroutines, some under a session's locks.
type Recorder interface {
	Record(Event)
}

// RecorderFunc is a function as a Recorder.
type RecorderFunc func(Event)

// Record calls f.
func (f RecorderFunc) Record(ev Event) { f(ev) }
