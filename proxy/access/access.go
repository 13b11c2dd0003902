// Package access decides who may touch a session: one rule, its tenant's
// sharing, for every method that names a session (load, resume, a
// take-over, attach, delete, close, list). A session belongs to the
// credential subject that made it; that subject travels sealed in the
// session's ID (package sessionid), so the rule needs no table, except to
// list sessions the agent names by its own IDs (Owners).
package access

// Sharing is a tenant's rule for the sessions of its subjects.
type Sharing struct {
	// Attach: SameSubject (also ""), Tenant or Off.
	Attach string
	// ReadOnlyForOthers: with Attach Tenant, another subject only
	// watches: its attach is read-only, its load becomes a read-only
	// attach, and what would write is refused.
	ReadOnlyForOthers bool
}

// Sharing.Attach values.
const (
	SameSubject = "same_subject" // only the subject that made a session touches it (the default)
	Tenant      = "tenant"       // any subject of the tenant does
	Off         = "off"          // as SameSubject, and nobody attaches, not even that subject
)

// Action is what a client asks to do with a session it does not hold.
type Action uint8

const (
	List   Action = iota // see it in session/list
	Attach               // session/attach
	Load                 // session/load, session/resume, a take-over of a detached holder's session
	Write                // session/delete, session/close, and anything else that changes it
)

// Verdict is what the rule allows.
type Verdict uint8

const (
	// Refused: the session is unknown to the caller (-32002, as for a
	// forged ID), and it is never listed.
	Refused Verdict = iota
	// Allowed: as its maker may.
	Allowed
	// ReadOnly: only to watch. An attach is read-only, a load becomes a
	// read-only attach, a write is refused as a read-only client's is.
	ReadOnly
)

// Decide is what caller may do with a session owner made. A subject may
// do anything with its own sessions (Off's ban on attaching is the
// caller's to apply). The empty owner (a session ID of before subjects were
// sealed in it, or a listed session whose maker this gateway does not
// know) is nobody's: only a gateway without credentials, whose callers are
// all "", treats it as its own.
func (s Sharing) Decide(caller, owner string, a Action) Verdict {
	switch {
	case caller == owner:
		return Allowed
	case s.Attach != Tenant:
		return Refused
	case s.ReadOnlyForOthers && a != List:
		return ReadOnly
	}
	return Allowed
}
