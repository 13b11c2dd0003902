package access

import (
	"sync"
	"time"
)

// Defaults of OwnersConfig.
const (
	// DefaultOwnersPerScope bounds the owners kept in memory for one
	// tenant and agent.
	DefaultOwnersPerScope = 1 << 16
	// DefaultOwnersRetention is how long an owner is kept after its
	// session was last made, loaded or ended here.
	DefaultOwnersRetention = 30 * 24 * time.Hour
)

// OwnersConfig bounds what Owners keeps. The zero value is the defaults.
type OwnersConfig struct {
	// PerScope bounds the owners kept in memory per tenant and agent
	// (sessionid.Scope): past it, the scope's oldest noted is forgotten
	// from memory (a file keeps it). One tenant's sessions never push out
	// another's. 0: DefaultOwnersPerScope.
	PerScope int
	// Retention: an owner whose session was last made, loaded or ended
	// here longer ago is forgotten, in memory and in the file. 0:
	// DefaultOwnersRetention.
	Retention time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (c OwnersConfig) perScope() int {
	if c.PerScope > 0 {
		return c.PerScope
	}
	return DefaultOwnersPerScope
}

func (c OwnersConfig) retention() time.Duration {
	if c.Retention > 0 {
		return c.Retention
	}
	return DefaultOwnersRetention
}

func (c OwnersConfig) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// touchEvery is how stale the file's last use of a session may be before
// a use is written again: a session loaded often is not written each time.
func (c OwnersConfig) touchEvery() time.Duration { return min(time.Hour, c.retention()/4) }

// Owners remembers who made the sessions this gateway has seen made or
// loaded, by tenant and agent (scope) and agent session ID: session/list
// seals each session the agent lists with its owner, and a create that
// names a session another subject made is refused. A session it does not
// know (made on another replica, before a restart without a file,
// forgotten past PerScope without a file, or not used for Retention) has
// the empty owner until its maker loads it by its ID again. NewOwners
// keeps them in memory (the zero Owners too, with the defaults); OpenOwners
// in a file too. Safe for concurrent use.
type Owners struct {
	cfg    OwnersConfig
	mu     sync.Mutex
	scopes map[string]*scopeOwners
	file   *ownersFile // nil: memory only
	shared Shared      // nil: this gateway's alone (Share)
}

// Shared is a store of owners the replicas of a cluster share: a session
// made on one is known to all, so that each lists it for its maker and
// refuses it to anyone else.
type Shared interface {
	// Get is who made the session and when it was last used ("": not
	// known, or the store failed: Get bounds its wait).
	Get(scope, agentSID string) (subject string, used int64)
	// Put records it; it never waits for the store.
	Put(scope, agentSID, subject string, used int64)
}

// Share makes o read what it does not know from sh and write what it
// notes to it too. Call it before o is used.
func (o *Owners) Share(sh Shared) { o.shared = sh }

// NewOwners is an Owners kept in memory only.
func NewOwners(cfg OwnersConfig) *Owners { return &Owners{cfg: cfg} }

// scopeOwners is what one tenant and agent's owners keep in memory: at
// most PerScope, the oldest noted going first.
type scopeOwners struct {
	m     map[string]*ownerRec
	order []string // ring of the keys in the order they were first kept
	next  int
}

type ownerRec struct {
	subject string
	used    int64 // unix seconds the session was last made, loaded or ended here
	stored  int64 // the last use the file has, as far as this process wrote or read it
}

type ownerKey struct{ scope, agentSID string }

// expired reports whether a session last used at used is forgotten now.
func (o *Owners) expired(used int64, now time.Time) bool {
	return now.Sub(time.Unix(used, 0)) > o.cfg.retention()
}

// Note records that subject made the session agentSID of scope
// (sessionid.Scope), or, if another subject is known to have made it, that
// it was used (loaded or ended) now: a session's maker never changes while
// it is remembered. The empty subject records nothing. It never waits for
// the file: one writer goroutine keeps it.
func (o *Owners) Note(scope, agentSID, subject string) {
	if subject == "" {
		return
	}
	o.Of(scope, agentSID) // brings the file's record into memory
	now := o.cfg.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	rec := o.scopeLocked(scope).m[agentSID]
	switch {
	case rec == nil:
		rec = o.rememberLocked(scope, agentSID, subject, now.Unix(), 0)
	case o.expired(rec.used, now):
		rec.subject, rec.used = subject, now.Unix() // forgotten: whoever makes it now is its maker
	case now.Unix() > rec.used:
		rec.used = now.Unix()
	}
	if now.Sub(time.Unix(rec.stored, 0)) >= o.cfg.touchEvery() {
		if o.file != nil && o.file.put(ownerKey{scope, agentSID}, rec.subject, rec.used) && o.shared == nil {
			rec.stored = rec.used
		}
		if o.shared != nil {
			o.shared.Put(scope, agentSID, rec.subject, rec.used)
			rec.stored = rec.used
		}
	}
}

// Of is who made the session agentSID of scope ("": not known).
func (o *Owners) Of(scope, agentSID string) string {
	now := o.cfg.now()
	o.mu.Lock()
	var rec *ownerRec
	if so := o.scopes[scope]; so != nil {
		rec = so.m[agentSID]
	}
	subject, ok := "", rec != nil
	if ok && !o.expired(rec.used, now) {
		subject = rec.subject
	}
	noFile := o.file == nil || o.file.closed
	o.mu.Unlock()
	if ok || noFile && o.shared == nil {
		return subject
	}
	var used int64
	if !noFile {
		subject, used = o.file.get(ownerKey{scope, agentSID})
	}
	if subject == "" && o.shared != nil {
		subject, used = o.shared.Get(scope, agentSID)
	}
	if subject == "" || o.expired(used, now) {
		return ""
	}
	o.mu.Lock()
	if o.scopeLocked(scope).m[agentSID] == nil {
		o.rememberLocked(scope, agentSID, subject, used, used)
	}
	o.mu.Unlock()
	return subject
}

// scopeLocked is scope's owners in memory, made if need be (o.mu held).
func (o *Owners) scopeLocked(scope string) *scopeOwners {
	so := o.scopes[scope]
	if so == nil {
		if o.scopes == nil {
			o.scopes = make(map[string]*scopeOwners)
		}
		so = &scopeOwners{m: make(map[string]*ownerRec)}
		o.scopes[scope] = so
	}
	return so
}

// rememberLocked keeps a record the scope does not have in memory, the
// scope's oldest going past PerScope (o.mu held).
func (o *Owners) rememberLocked(scope, agentSID, subject string, used, stored int64) *ownerRec {
	so := o.scopeLocked(scope)
	if n := o.cfg.perScope(); len(so.order) < n {
		so.order = append(so.order, agentSID)
	} else {
		delete(so.m, so.order[so.next])
		so.order[so.next] = agentSID
		so.next = (so.next + 1) % n
	}
	rec := &ownerRec{subject: subject, used: used, stored: stored}
	so.m[agentSID] = rec
	return rec
}

// kept is how many owners scope keeps in memory (tests).
func (o *Owners) kept(scope string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if so := o.scopes[scope]; so != nil {
		return len(so.m)
	}
	return 0
}

// Range calls fn for every owner kept in memory that has not expired (a
// store shared with other replicas is written again from it after it lost
// its data). fn runs with no lock held.
func (o *Owners) Range(fn func(scope, agentSID, subject string, used int64)) {
	type rec struct {
		scope, sid, subject string
		used                int64
	}
	now := o.cfg.now()
	o.mu.Lock()
	var all []rec
	for scope, so := range o.scopes {
		for sid, r := range so.m {
			if !o.expired(r.used, now) {
				all = append(all, rec{scope, sid, r.subject, r.used})
			}
		}
	}
	o.mu.Unlock()
	for _, r := range all {
		fn(r.scope, r.sid, r.subject, r.used)
	}
}
