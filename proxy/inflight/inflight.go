// Package inflight is what is in flight for a connection and a session: a
// connection's requests either way (Table) and the agent's requests about a
// session waiting for a client (Set). Each has one lock, a leaf: no other
// lock is taken while it is held, and no code outside the package runs
// under it.
package inflight

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Table is a connection's requests in flight either way: the client's to
// the agent (C), by the client's raw id, and the agent's waiting for the
// client (A), by the id the client sees (a client's answer or cancellation
// names its own id). Once closed (the connection has ended) nothing more is
// taken. Make one with NewTable.
type Table[C, A comparable] struct {
	mu        sync.Mutex
	closed    bool
	client    map[string]C   // the client's, by its raw id
	agent     map[int64]A    // the agent's, by the id the client sees
	withdrawn map[int64]bool // recent ids withdrawn with $/cancel_request (their late answers are expected)
	nextID    int64
}

// maxWithdrawn bounds the withdrawn ids a table remembers.
const maxWithdrawn = 64

// NewTable is an empty table.
func NewTable[C, A comparable]() Table[C, A] {
	return Table[C, A]{client: map[string]C{}, agent: map[int64]A{}}
}

// Pending counts the client's requests in flight.
func (q *Table[C, A]) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.client)
}

// Busy reports whether requests are in flight either way.
func (q *Table[C, A]) Busy() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.client) > 0 || len(q.agent) > 0
}

// Empty reports whether no request is in flight either way.
func (q *Table[C, A]) Empty() bool { return !q.Busy() }

// Client is the client's request in flight with raw id (the zero C: none).
func (q *Table[C, A]) Client(id []byte) C {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.client[string(id)]
}

// TrackClient records r, a client request sent to the agent with raw id;
// false once closed.
func (q *Table[C, A]) TrackClient(id []byte, r C) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.client[string(id)] = r
	return true
}

// ForgetClient removes r, a client request with raw id that has ended, if
// it is still the one tracked with that id.
func (q *Table[C, A]) ForgetClient(id []byte, r C) {
	q.mu.Lock()
	if q.client[string(id)] == r {
		delete(q.client, string(id))
	}
	q.mu.Unlock()
}

// AddAgent gives a, an agent request, an id of the client's and registers
// it; false once closed.
func (q *Table[C, A]) AddAgent(a A) (int64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, false
	}
	q.nextID++
	q.agent[q.nextID] = a
	return q.nextID, true
}

// TakeAgent removes and returns the agent request the client sees as id
// (the zero A: none).
func (q *Table[C, A]) TakeAgent(id int64) A {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.agent[id]
	delete(q.agent, id)
	return a
}

// ForgetAgent forgets the agent request the client sees as id.
func (q *Table[C, A]) ForgetAgent(id int64) { q.TakeAgent(id) }

// TakeIfOurs removes a, if the client holds it as id: reports whether it
// did.
func (q *Table[C, A]) TakeIfOurs(id int64, a A) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.agent[id] != a {
		return false
	}
	delete(q.agent, id)
	return true
}

// Withdraw forgets an agent request the client was sent, now withdrawn
// with $/cancel_request: the client may still answer it, and WasWithdrawn
// says so once. Only the latest withdrawn ids are remembered.
func (q *Table[C, A]) Withdraw(id int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.agent, id)
	if len(q.withdrawn) >= maxWithdrawn {
		clear(q.withdrawn)
	}
	if q.withdrawn == nil {
		q.withdrawn = map[int64]bool{}
	}
	q.withdrawn[id] = true
}

// WasWithdrawn reports (once) whether id was withdrawn lately.
func (q *Table[C, A]) WasWithdrawn(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.withdrawn[id]
	delete(q.withdrawn, id)
	return w
}

// Close takes every request in flight: nothing more is taken.
func (q *Table[C, A]) Close() (client map[string]C, agent map[int64]A) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	client, agent = q.client, q.agent
	q.client, q.agent = nil, nil
	return client, agent
}

// Set is a set of requests waiting for an answer. Once closed it takes no
// more. Its zero value is an empty set.
type Set[T comparable] struct {
	mu     sync.Mutex
	closed bool
	set    map[T]struct{}
}

// Add records t; false once closed.
func (w *Set[T]) Add(t T) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	if w.set == nil {
		w.set = map[T]struct{}{}
	}
	w.set[t] = struct{}{}
	return true
}

// Done forgets t.
func (w *Set[T]) Done(t T) {
	w.mu.Lock()
	delete(w.set, t)
	w.mu.Unlock()
}

// List is what the set holds, in no order.
func (w *Set[T]) List() []T {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]T, 0, len(w.set))
	for t := range w.set {
		out = append(out, t)
	}
	return out
}

// Close forgets everything and takes no more.
func (w *Set[T]) Close() {
	w.mu.Lock()
	w.closed = true
	clear(w.set)
	w.mu.Unlock()
}

// Budget is bytes held against a bound: what may be held at once (Max) is
// taken by Hold and given back by Release. The zero value holds nothing
// and refuses everything.
type Budget struct {
	Max  int64
	held atomic.Int64
}

// Hold takes n bytes; false (nothing taken) if that would pass Max.
func (b *Budget) Hold(n int64) bool {
	if b.held.Add(n) > b.Max {
		b.held.Add(-n)
		return false
	}
	return true
}

// Release gives back n bytes Hold took.
func (b *Budget) Release(n int64) { b.held.Add(-n) }

// Held is what is held now.
func (b *Budget) Held() int64 { return b.held.Load() }

// Recent remembers the last Max keys it was told of, the oldest forgotten
// first. Its lock is a leaf.
type Recent[K comparable] struct {
	Max   int
	mu    sync.Mutex
	keys  map[K]struct{}
	order []K
}

// Add remembers k.
func (r *Recent[K]) Add(k K) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.keys[k]; ok {
		return
	}
	if r.keys == nil {
		r.keys = map[K]struct{}{}
	}
	if len(r.order) >= r.Max {
		delete(r.keys, r.order[0])
		r.order = r.order[1:]
	}
	r.keys[k] = struct{}{}
	r.order = append(r.order, k)
}

// Has reports whether k is remembered.
func (r *Recent[K]) Has(k K) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.keys[k]
	return ok
}

// List is every key remembered, oldest first.
func (r *Recent[K]) List() []K {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}
