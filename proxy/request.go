package proxy

import (
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/proxy/pool"
)

// hold is everything handling one client request takes: a tenant session
// slot, a process session slot, the request's count on its process, and
// the session route a load makes before the agent answers. It is made in
// one place (Conn.handleCall and its handlers), carried by the outReq, and
// released once when the request ends, whichever way it ends. What the
// request's success keeps (the slot a new session holds, a load's route) is
// taken out of it first. A second release is logged and counted
// (acpgate_double_releases_total{what="hold"}).
type hold struct {
	conn    *Conn
	quota   bool        // a tenant session slot
	slot    *pool.Lease // a process session slot
	request *pool.Lease // the request's count on its process
	// attach is the session a load/resume makes the connection's. It is
	// routed from the moment the request is sent, because the agent
	// replays history before it answers; ending the request without
	// keepAttach undoes it.
	attach   *Session
	released atomic.Bool
}

// takeSlot removes the process slot from the hold: the new session holds
// it now.
func (h *hold) takeSlot() *pool.Lease {
	s := h.slot
	h.slot = nil
	return s
}

// keepAttach keeps the load's route when the request ends.
func (h *hold) keepAttach() { h.attach = nil }

// release gives back what the hold still has. Only the first call does.
func (h *hold) release() {
	if h == nil {
		return
	}
	c := h.conn
	if !h.released.CompareAndSwap(false, true) {
		c.ag.metrics.DoubleReleases.WithLabelValues("hold").Inc()
		c.log.Error("a request's hold was released twice; ignored")
		return
	}
	if h.quota {
		c.ten.unreserve(c.ag.metrics, c.log)
	}
	h.slot.Release()
	h.request.Release()
	if h.attach != nil {
		h.attach.link.removeSession(h.attach)
		h.attach.drop()
		c.detach(h.attach)
	}
}

// outReq is a client→agent request waiting for the agent's answer.
type outReq struct {
	conn     *Conn  // nil for the gateway's own requests
	clientID []byte // the client's raw id
	agentID  int64
	link     *procLink // the process the request went to
	method   string
	sess     *Session // the session the request is about, if any
	cwd      string   // session/new and the like: the cwd the client asked for
	start    time.Time
	hold     *hold       // nil for the gateway's own requests
	ended    atomic.Bool // end has run (Session.promptStarted)
}

// end finishes a request that has been taken from its process's table:
// the connection forgets it and its hold is released.
func (r *outReq) end() {
	r.ended.Store(true)
	if r.conn != nil {
		r.conn.forgetClientReq(r)
	}
	r.hold.release()
	if r.method == mSessionPrompt && r.conn != nil {
		if r.sess != nil {
			r.sess.promptDone(r)
		}
		r.conn.relay.promptsChanged()
	}
}

// inReq is an agent→client request waiting for the client's answer.
type inReq struct {
	link    *procLink
	agentID []byte // the agent's raw id
	method  string
	start   time.Time
	sess    *Session // the session it is about, if any
	// Guarded by link.mu: a take-over moves the request to another
	// connection. msg is as the client was sent it (a take-over sends it
	// again); pendingTo is where a take-over that came before msg was set
	// moved it.
	msg       []byte
	conn      *Conn
	connID    int64 // the id the client sees
	pendingTo *Conn
	// answered is set by whoever answers the agent first: the client, or
	// the gateway in its place (disconnect, client_request timeout).
	answered atomic.Bool
}

// claim reports whether the caller is the one to answer in: true once.
func (in *inReq) claim() bool { return in.answered.CompareAndSwap(false, true) }

// route returns the connection the request waits on and its id there.
func (in *inReq) route() (*Conn, int64) {
	in.link.mu.Lock()
	defer in.link.mu.Unlock()
	return in.conn, in.connID
}

// forget removes in from its process's table of requests to the client,
// unless another request has taken its id since.
func (in *inReq) forget() {
	in.link.mu.Lock()
	if in.link.inbound[string(in.agentID)] == in {
		delete(in.link.inbound, string(in.agentID))
	}
	in.link.mu.Unlock()
	if in.sess != nil {
		in.sess.requestDone(in)
	}
}
