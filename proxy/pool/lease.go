package pool

import "sync/atomic"

// What a lease holds of a process.
type leaseKind uint8

const (
	// kindSession is a session slot: reserved for a request that may make
	// a session, committed once the session exists (Commit), held until
	// the session ends.
	kindSession leaseKind = iota
	// kindHome makes the process a connection's home: where its requests
	// that name no session go.
	kindHome
	// kindRequest is a client request in flight on the process.
	kindRequest
)

func (k leaseKind) String() string { return [...]string{"session", "home", "request"}[k] }

// A Lease is what one holder takes of a process: a session slot, a home,
// or a request in flight. It is released exactly once; a second release is
// logged and counted (Metrics.DoubleReleases) and changes nothing. A nil
// Lease is held by no one: its methods do nothing.
type Lease struct {
	// Static after construction.
	p    *Process
	kind leaseKind

	committed bool // a session slot that is a session now (pool.mu)
	released  atomic.Bool
}

// Process returns the process the lease is on.
func (l *Lease) Process() *Process {
	if l == nil {
		return nil
	}
	return l.p
}

// Release gives the lease back. Capacity it frees wakes whoever waits for
// it.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	if !l.released.CompareAndSwap(false, true) {
		l.p.pool.doubleRelease(l.p, l.kind.String())
		return
	}
	if l.kind == kindRequest {
		if l.p.requests.Add(-1) < 0 {
			l.p.requests.Add(1)
			l.p.pool.doubleRelease(l.p, "request_count")
			return
		}
		l.p.pool.kickMaintainer() // a retiring process may be unused now
		return
	}
	l.p.pool.release(l)
}

// Commit turns a reserved session slot into a session of the process: the
// process counts it as served (and retires past
// pool.recycle_after_sessions). A second Commit does nothing.
func (l *Lease) Commit() {
	if l == nil || l.kind != kindSession {
		return
	}
	l.p.pool.commit(l)
}
