// Package turn is a session's turn: the prompt its agent is working on,
// the prompts of other clients waiting for it to end (session/attach),
// when it started and when the last one ended, and its span as observers
// know it.
//
// An ACP v2 turn is in flight from its prompt's acknowledgement to the
// agent's idle state_update (the relay keeps its prompt running until
// then); while the agent reports requires_action, Name says so.
//
// A turn is one client's at a time. That client's own second prompt joins
// its turn (a single client's behaviour is unchanged); another client's
// waits, in a queue of at most MaxQueued, and goes to the agent when the
// turn ends. A Turn knows nothing of how a prompt travels: it holds
// prompts (a Prompt, generic in whose it is) and says which runs when.
package turn

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/proxy/observe"
)

// Prompt is a prompt request as a turn holds it; C is its client, whose
// zero value is nobody.
type Prompt[C comparable] interface {
	comparable
	Ended() bool // its request has ended (answered or failed)
	Client() C   // whose prompt it is
}

// Queued is a prompt waiting for another client's turn: tracked with its
// process already, its line ready to send (the one copy of it kept).
type Queued[P any] struct {
	Prompt P
	Line   []byte
}

// Bounds of the prompts waiting for another client's turn, in number and
// in bytes (their lines).
const (
	MaxQueued      = 8
	MaxQueuedBytes = 32 << 20
)

// Why a prompt cannot wait for the turn: the queue is full, or its caller
// has no room for it (Take's mayWait false).
var (
	ErrNoRoom  = errors.New("no room for the prompt to wait")
	ErrTooMany = fmt.Errorf("%d prompts already wait for this session's turn; try again when one has run", MaxQueued)
	ErrTooBig  = fmt.Errorf("the prompts waiting for this session's turn would pass %d MiB; try again when one has run", MaxQueuedBytes>>20)
)

// Turn is a session's turn; its zero value is idle. Its lock is a leaf but
// for what Done's pending takes.
type Turn[C comparable, P Prompt[C]] struct {
	// Read by the agent's reader without a lock.
	FirstUpdate atomic.Int64                 // unix nanos the running prompt went to the agent, until its first update
	Cur         atomic.Pointer[observe.Turn] // the prompt in flight as observers know it (nil: none)

	mu sync.Mutex
	// prompt is the turn in flight (zero: none); running are its prompts
	// sent to the agent and not ended (a client may send a second during
	// its own turn), the ones Done counts; client is whose turn it is.
	prompt  P
	running []P
	client  C
	// queue: prompts of other clients waiting for the turn in flight,
	// oldest first; queuedBytes the size of their lines.
	queue       []Queued[P]
	queuedBytes int
	// lastEnded is when its last turn ended.
	lastEnded time.Time
	// endedDetached and stopReason: a turn ended while its owner had no
	// socket, and how; a take-over reports it.
	endedDetached bool
	stopReason    string
	// action: the agent reported the turn in flight requires_action (ACP
	// v2: a permission or elicitation waits for a client).
	action bool
}

// Take decides a prompt's fate on a shared session: it runs now (no turn
// in flight, or the turn is its own client's), waits for the turn in
// flight (if mayWait), or is refused (full: ErrTooMany, ErrTooBig, or
// ErrNoRoom when it would wait and may not).
func (t *Turn[C, P]) Take(q Queued[P], mayWait bool) (now bool, full error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case len(t.running) == 0 && len(t.queue) == 0: // nobody's turn: it is this client's
		t.prompt, t.client = q.Prompt, q.Prompt.Client()
		t.action = false
	case len(t.running) > 0 && t.client == q.Prompt.Client(): // its own turn goes on
	case !mayWait:
		return false, ErrNoRoom
	case len(t.queue) >= MaxQueued:
		return false, ErrTooMany
	case t.queuedBytes+len(q.Line) > MaxQueuedBytes:
		return false, ErrTooBig
	default:
		t.queue = append(t.queue, q)
		t.queuedBytes += len(q.Line)
		return false, nil
	}
	t.running = append(t.running, q.Prompt)
	return true, nil
}

// Started records p as the turn in flight of a session nobody else
// prompts, unless it has ended already (the agent died as it was sent).
// Unlike a prompt Take runs, p is not counted: IsRunning says false.
func (t *Turn[C, P]) Started(p P) {
	t.mu.Lock()
	if !p.Ended() {
		t.prompt = p
	}
	t.mu.Unlock()
}

// Done counts the end of p, a prompt of the session, and returns the
// prompt that waited for the turn to end, if any: its turn starts now.
// pending, called under the turn's lock, says whether a waiting prompt is
// still in flight (not failed meanwhile); dequeued counts the prompts
// taken from the queue.
func (t *Turn[C, P]) Done(p P, pending func(P) bool) (next Queued[P], ok bool, dequeued int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var none P
	if t.prompt == p {
		t.prompt = none
		t.lastEnded = time.Now()
	}
	if !t.uncount(p) {
		return next, false, 0 // a prompt that waited and ended before its turn
	}
	if len(t.running) > 0 {
		return next, false, 0
	}
	var nobody C
	t.client = nobody
	t.action = false
	for len(t.queue) > 0 {
		next, t.queue = t.queue[0], t.queue[1:]
		t.queuedBytes -= len(next.Line)
		dequeued++
		if !next.Prompt.Ended() && pending(next.Prompt) {
			t.prompt, t.client = next.Prompt, next.Prompt.Client()
			t.running = append(t.running, next.Prompt)
			return next, true, dequeued
		}
	}
	return next, false, dequeued
}

// uncount takes p from the running prompts, reporting whether it was one.
func (t *Turn[C, P]) uncount(p P) bool {
	for i, r := range t.running {
		if r == p {
			last := len(t.running) - 1
			t.running[i] = t.running[last]
			var none P
			t.running[last] = none
			t.running = t.running[:last]
			return true
		}
	}
	return false
}

// DropQueued takes the prompts waiting for a turn: c's (zero: all).
func (t *Turn[C, P]) DropQueued(c C) []Queued[P] {
	t.mu.Lock()
	defer t.mu.Unlock()
	var nobody C
	var failed []Queued[P]
	kept := t.queue[:0]
	for _, q := range t.queue {
		if c == nobody || q.Prompt.Client() == c {
			failed = append(failed, q)
		} else {
			kept = append(kept, q)
		}
	}
	clear(t.queue[len(kept):])
	t.queue = kept
	for _, q := range failed {
		t.queuedBytes -= len(q.Line)
	}
	return failed
}

// IsRunning reports whether p is a prompt of the turn in flight counted by
// Take (not one still waiting for it).
func (t *Turn[C, P]) IsRunning(p P) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.running {
		if r == p {
			return true
		}
	}
	return false
}

// InFlight reports whether a turn is in flight.
func (t *Turn[C, P]) InFlight() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlightLocked()
}

func (t *Turn[C, P]) inFlightLocked() bool {
	var none P
	return len(t.running) > 0 || t.prompt != none && !t.prompt.Ended()
}

// Name says whether a turn is in flight: "running", "requires_action"
// (in flight, and its agent reported it waits for a client), or "idle".
func (t *Turn[C, P]) Name() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case !t.inFlightLocked():
		return "idle"
	case t.action:
		return "requires_action"
	}
	return "running"
}

// RequiresAction records what the agent reported of the turn in flight
// (ACP v2 state_update): on, it waits for a client (requires_action); off,
// it runs, or it is over.
func (t *Turn[C, P]) RequiresAction(on bool) {
	t.mu.Lock()
	t.action = on
	t.mu.Unlock()
}

// EndedWhileDetached records that a turn ended while the owner had no
// socket, and how.
func (t *Turn[C, P]) EndedWhileDetached(stopReason string) {
	t.mu.Lock()
	t.endedDetached, t.stopReason = true, stopReason
	t.mu.Unlock()
}

// Found says what a take-over finds: whether a turn is running, whether
// one ended while the owner was detached, and how.
func (t *Turn[C, P]) Found() (running, ended bool, stopReason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var none P
	return t.prompt != none, t.endedDetached, t.stopReason
}

// Taken forgets a turn that ended while detached: the session has a new
// owner, who was told.
func (t *Turn[C, P]) Taken() {
	t.mu.Lock()
	t.endedDetached, t.stopReason = false, ""
	t.mu.Unlock()
}

// Ending takes what the session's end settles: the prompts waiting (when
// take), and whether a turn is in flight.
func (t *Turn[C, P]) Ending(take bool) (queued []Queued[P], running bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if take {
		queued, t.queue, t.queuedBytes = t.queue, nil, 0
	}
	return queued, t.inFlightLocked()
}

// Since is what the admin API reports of the turn: the prompt in flight
// (zero: none), whether one runs, and when the last ended.
func (t *Turn[C, P]) Since() (prompt P, running bool, lastEnded time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prompt, t.inFlightLocked(), t.lastEnded
}
