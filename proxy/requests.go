package proxy

import "sync"

// requests are a connection's requests in flight either way: the client's
// to the agent, by the client's raw id, and the agent's waiting for the
// client, by the id the client sees (a client's answer or cancellation
// names its own id). Once closed (the connection has ended) nothing more
// is taken. Its lock is a leaf.
type requests struct {
	mu        sync.Mutex
	closed    bool
	client    map[string]*outReq // the client's, by its raw id
	agent     map[int64]*inReq   // the agent's, by the id the client sees
	withdrawn map[int64]bool     // recent ids withdrawn with $/cancel_request (their late answers are expected)
	nextID    int64
}

// maxWithdrawn bounds the withdrawn ids a connection remembers.
const maxWithdrawn = 64

func newRequests() requests {
	return requests{client: map[string]*outReq{}, agent: map[int64]*inReq{}}
}

// pending counts the client's requests in flight.
func (q *requests) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.client)
}

// busy reports whether requests are in flight either way.
func (q *requests) busy() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.client) > 0 || len(q.agent) > 0
}

// clientReq is the client's request in flight with raw id (nil: none).
func (q *requests) clientReq(id []byte) *outReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.client[string(id)]
}

// trackClient records a client request sent to the agent; false once
// closed.
func (q *requests) trackClient(r *outReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.client[string(r.clientID)] = r
	return true
}

// forgetClient removes a client request that has ended.
func (q *requests) forgetClient(r *outReq) {
	q.mu.Lock()
	if q.client[string(r.clientID)] == r {
		delete(q.client, string(r.clientID))
	}
	q.mu.Unlock()
}

// addAgent gives in, an agent request, an id of the client's and
// registers it; false once closed.
func (q *requests) addAgent(in *inReq) (int64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, false
	}
	q.nextID++
	q.agent[q.nextID] = in
	return q.nextID, true
}

// takeAgent removes and returns the agent request the client sees as id
// (nil: none).
func (q *requests) takeAgent(id int64) *inReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	in := q.agent[id]
	delete(q.agent, id)
	return in
}

// forgetAgent forgets the agent request the client sees as id.
func (q *requests) forgetAgent(id int64) { q.takeAgent(id) }

// takeIfOurs removes in, if the client holds it as id: reports whether it
// did.
func (q *requests) takeIfOurs(id int64, in *inReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.agent[id] != in {
		return false
	}
	delete(q.agent, id)
	return true
}

// withdraw forgets an agent request the client was sent, now withdrawn
// with $/cancel_request: the client may still answer it.
func (q *requests) withdraw(id int64) {
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

// wasWithdrawn reports (once) whether id was withdrawn lately.
func (q *requests) wasWithdrawn(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.withdrawn[id]
	delete(q.withdrawn, id)
	return w
}

// empty reports whether no request is in flight either way.
func (q *requests) empty() bool { return !q.busy() }

// close takes every request in flight: nothing more is taken.
func (q *requests) close() (client map[string]*outReq, agent map[int64]*inReq) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	client, agent = q.client, q.agent
	q.client, q.agent = nil, nil
	return client, agent
}
