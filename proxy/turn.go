package proxy

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/proxy/observe"
)

// turn is a session's turn: the prompt the agent is working on, the
// prompts of other clients waiting for it to end (session/attach), when
// it started and when the last one ended, and its span. The Session owns
// it (Session.turn); its lock is a leaf but for procLink.mu (a prompt that
// waited is still pending), taken after Session.mu where both are held.
type turn struct {
	// Read by the agent's reader without a lock.
	firstUpdate atomic.Int64                 // unix nanos the running prompt went to the agent, until its first update
	cur         atomic.Pointer[observe.Turn] // the prompt in flight as observers know it (nil: none)

	mu sync.Mutex
	// prompt is the turn in flight (nil: none); running counts its prompts
	// sent to the agent and not ended (a client may send a second during
	// its own turn); conn is whose turn it is.
	prompt  *outReq
	running int
	conn    *Conn
	// queue: prompts of other clients waiting for the turn in flight,
	// oldest first.
	queue []queuedTurn
	// lastEnded is when its last turn ended (the admin API's "since").
	lastEnded time.Time
	// endedDetached and stopReason: a turn ended while its owner had no
	// socket, and how; a take-over reports it.
	endedDetached bool
	stopReason    string
}

// queuedTurn is a prompt waiting for another client's turn: tracked with
// its process already, its line ready to send.
type queuedTurn struct {
	req    *outReq
	line   []byte
	blocks []json.RawMessage // the prompt as its client sent it
}

// maxQueuedPrompts bounds the prompts waiting for another client's turn.
const maxQueuedPrompts = 8

// take decides a prompt's fate on a shared session: it runs now (no turn
// in flight, or the turn is its own client's: a single client's behaviour
// is unchanged), waits for the turn in flight, or is refused (the queue is
// full).
func (t *turn) take(q queuedTurn) (now, full bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.running == 0 && len(t.queue) == 0: // nobody's turn: it is this client's
		t.prompt, t.conn = q.req, q.req.conn
	case t.running > 0 && t.conn == q.req.conn: // its own turn goes on
	case len(t.queue) >= maxQueuedPrompts:
		return false, true
	default:
		t.queue = append(t.queue, q)
		return false, false
	}
	t.running++
	q.req.turn = true
	return true, false
}

// started records r as the turn in flight of a session nobody else
// prompts, unless it has ended already (the agent died as it was sent).
func (t *turn) started(r *outReq) {
	t.mu.Lock()
	if !r.ended.Load() {
		t.prompt = r
	}
	t.mu.Unlock()
}

// done counts the end of r, a prompt of the session, and returns the
// prompt that waited for the turn to end, if any: its turn starts now.
// pending says whether a waiting prompt is still in flight (not failed
// meanwhile); dequeued counts the prompts taken from the queue.
func (t *turn) done(r *outReq, pending func(*outReq) bool) (next queuedTurn, ok bool, dequeued int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.prompt == r {
		t.prompt = nil
		t.lastEnded = time.Now()
	}
	if !r.turn {
		return next, false, 0 // a prompt that waited and ended before its turn
	}
	r.turn = false
	if t.running--; t.running > 0 {
		return next, false, 0
	}
	t.conn = nil
	for len(t.queue) > 0 {
		next, t.queue = t.queue[0], t.queue[1:]
		dequeued++
		if !next.req.ended.Load() && pending(next.req) {
			t.prompt, t.conn, t.running = next.req, next.req.conn, 1
			next.req.turn = true
			return next, true, dequeued
		}
	}
	return next, false, dequeued
}

// dropQueued takes the prompts waiting for a turn: c's (nil: all).
func (t *turn) dropQueued(c *Conn) []queuedTurn {
	t.mu.Lock()
	defer t.mu.Unlock()
	var failed []queuedTurn
	kept := t.queue[:0]
	for _, q := range t.queue {
		if c == nil || q.req.conn == c {
			failed = append(failed, q)
		} else {
			kept = append(kept, q)
		}
	}
	clear(t.queue[len(kept):])
	t.queue = kept
	return failed
}

// isRunning reports whether r is a prompt of the turn in flight (not one
// still waiting for it).
func (t *turn) isRunning(r *outReq) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.turn
}

// inFlight reports whether a turn is in flight.
func (t *turn) inFlight() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlightLocked()
}

func (t *turn) inFlightLocked() bool {
	return t.running > 0 || t.prompt != nil && !t.prompt.ended.Load()
}

// name says whether a turn is in flight: "running" or "idle".
func (t *turn) name() string {
	if t.inFlight() {
		return "running"
	}
	return "idle"
}

// endedWhileDetached records that a turn ended while the owner had no
// socket, and how.
func (t *turn) endedWhileDetached(stopReason string) {
	t.mu.Lock()
	t.endedDetached, t.stopReason = true, stopReason
	t.mu.Unlock()
}

// found says what a take-over finds: whether a turn is running, whether
// one ended while the owner was detached, and how.
func (t *turn) found() (running, ended bool, stopReason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prompt != nil, t.endedDetached, t.stopReason
}

// taken forgets a turn that ended while detached: the session has a new
// owner, who was told.
func (t *turn) taken() {
	t.mu.Lock()
	t.endedDetached, t.stopReason = false, ""
	t.mu.Unlock()
}

// ending takes what the session's end settles: the prompts waiting (when
// take), and whether a turn is in flight.
func (t *turn) ending(take bool) (queued []queuedTurn, running bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if take {
		queued, t.queue = t.queue, nil
	}
	return queued, t.inFlightLocked()
}

// since is what the admin API reports of the turn: the prompt in flight
// (nil: none), whether one runs, and when the last ended.
func (t *turn) since() (prompt *outReq, running bool, lastEnded time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prompt, t.inFlightLocked(), t.lastEnded
}
