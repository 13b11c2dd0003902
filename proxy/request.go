package proxy

import (
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/turn"
)

// hold is everything handling one client request takes: a tenant session
// slot, a process session slot, the request's count on its process, and
// the session route a load makes before the agent answers. The handlers
// that route a request make it (route_client.go); it is carried by the
// outReq and released once when the request ends, whichever way it ends. What the
// request's success keeps (the slot a new session holds, a load's route) is
// taken out of it first. A second release is logged and counted
// (acpgate_double_releases_total{what="hold"}).
type hold struct {
	conn    *Conn
	quota   bool        // a tenant session slot
	slot    *pool.Lease // a process session slot
	request *pool.Lease // the request's count on its process
	// loaded is the session a load/resume makes the connection's. It is
	// routed from the moment the request is sent, because the agent
	// replays history before it answers; ending the request without
	// keepLoaded undoes it.
	loaded   *Session
	replay   *Session // a load or resume in flight of this session (Session.meter)
	gated    *Session // a load or resume that closed this session's gate (establish.go)
	released atomic.Bool
}

// takeSlot removes the process slot from the hold: the new session holds
// it now.
func (h *hold) takeSlot() *pool.Lease {
	s := h.slot
	h.slot = nil
	return s
}

// keepLoaded keeps the load's route when the request ends.
func (h *hold) keepLoaded() { h.loaded = nil }

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
	if h.replay != nil {
		h.replay.meter.ReplayEnded()
	}
	if h.loaded != nil {
		h.loaded.end(endLoadFailed, c)
	}
	if h.gated != nil {
		h.gated.ungate(c)
	}
}

// outReq is a client→agent request waiting for the agent's answer.
type outReq struct {
	conn     *Conn  // nil for the gateway's own requests
	clientID []byte // the client's raw id
	agentID  int64
	side     *procSide // the process the request went to
	method   string
	sess     *Session // the session the request is about, if any
	cwd      string   // session/new and the like: the cwd the client asked for
	start    time.Time
	hold     *hold       // nil for the gateway's own requests
	ended    atomic.Bool // end has run (Ended)
	// answering: the gateway took the request from its process's table to
	// answer it itself (procSide.take); a prompt counts as running until
	// that answer is in its client's queue (fail). Under link.mu.
	answering bool
	// acked: a v2 prompt the agent has acknowledged; its turn runs until
	// the session's idle state_update (v2turn.go).
	acked atomic.Bool
	// key: a v2 prompt's idempotencyKey; retry: a prompt whose key the
	// session's agent was sent before, which starts no turn of its own
	// (v2turn.go). Set before the prompt goes to the agent, under link.mu.
	key   string
	retry bool
	// queued: the bytes of a prompt waiting for its turn counted against
	// its connection's bound (Conn.holdQueued), until it runs or ends.
	queued atomic.Int64
	// A prompt whose answer is being delivered: the prompt that waited for
	// its turn starts once the answer is out (startNext), not at end.
	holdNext bool
	next     *turn.Queued[*outReq]
	began    atomic.Int64 // a prompt: unix nanos it went to the agent, until its turn is counted (turnEnded)
	// span is the request's (nil: tracing off); answered: the agent's
	// answer set its status; oturn: a prompt's turn as observers know it.
	span     trace.Span
	answered bool
	oturn    *observe.Turn
	// why: a prompt the gateway cancelled (Relay.CancelTurn) says why in
	// its answer's _meta.acpgate.
	why atomic.Pointer[cancelWhy]
	// model: a model switch the gateway asks for, holding the answer to
	// the client's session/new or load (agentReader.switchModel).
	model *models.Switch
}

// Ended and Client make an outReq a turn.Prompt: whether it has ended,
// and whose it is.
func (r *outReq) Ended() bool   { return r.ended.Load() }
func (r *outReq) Client() *Conn { return r.conn }

// end finishes a request that has been taken from its process's table:
// the connection forgets it and its hold is released.
func (r *outReq) end() {
	r.ended.Store(true)
	if r.method == acp.SessionPrompt && r.conn != nil && r.sess != nil {
		r.turnEnded("error", nil) // ended unanswered (an answer counted it already)
	}
	if r.conn != nil {
		r.releaseQueued()
		r.conn.reqs.ForgetClient(r.clientID, r)
	}
	r.hold.release()
	r.endSpan()
	if r.method == acp.SessionPrompt && r.conn != nil {
		if r.sess != nil {
			next, ok, dequeued := r.sess.turn.Done(r, r.sess.side.isPending)
			r.sess.events().promptsQueued(-dequeued)
			if ok && r.holdNext {
				r.next = &next
			} else if ok {
				r.conn.relay.bg.Go(func() { r.sess.startTurn(next) })
			}
		}
		r.conn.relay.promptsChanged()
	}
}

// fail ends r, taken from its process's table to be answered by the
// gateway (procSide.take, failRoutes, expireRequests), and gives its client
// msg, the gateway's answer. A prompt counted as running until msg is in
// the client's queue: a drain that waits for it never closes the client
// first.
func (r *outReq) fail(msg []byte) {
	r.end()
	if r.acked.Load() { // its client has had the answer: the turn ends idle
		idle := r.idleInPlace(msg)
		r.conn.deliverFor(idle, r.sess, Facts{Method: acp.SessionUpdate, SessionID: r.sess.streamID()}, false)
	} else {
		r.conn.deliverFor(msg, nil, Facts{ID: r.clientID}, false)
	}
	if l := r.side; l != nil {
		l.mu.Lock()
		counted := r.answering
		r.answering = false
		if counted {
			l.answering--
		}
		l.mu.Unlock()
		if counted {
			r.conn.relay.promptsChanged()
		}
	}
}

// releaseQueued gives back what r, a prompt that may wait for a turn,
// holds of its connection's and its tenant's queued bytes (Conn.queuedBytes,
// tenant.queuedBytes): once, when it leaves the queue to run or ends.
func (r *outReq) releaseQueued() {
	if n := r.queued.Swap(0); n != 0 {
		r.conn.queuedBytes.Release(n)
		r.conn.ten.queuedBytes.Release(n)
	}
}

// cancelInPlace answers r, a prompt whose agent did not answer its
// session/cancel in time (taken with procSide.take), in the agent's place:
// stopReason "cancelled", to its client and, as turn_complete, to the
// session's other clients.
func (r *outReq) cancelInPlace() {
	if r.side != nil {
		r.side.expectLate(r) // its answer, if it comes, counts its usage
	}
	r.turnEnded("cancelled", nil)
	r.sess.turnComplete(r.conn, "cancelled")
	msg := jsonrpc.AppendResult(nil, r.clientID, []byte(`{"stopReason":"cancelled"}`))
	if e, ok := r.whyEdit(msg, len(msg)-len(`{"stopReason":"cancelled"}}`), len(msg)-1); ok {
		msg = jsonrpc.Splice(nil, msg, []jsonrpc.Edit{e})
	}
	r.fail(msg)
}

// failWith is fail with a JSON-RPC error.
func (r *outReq) failWith(code int, msg string, data []byte) {
	r.fail(jsonrpc.AppendError(nil, r.clientID, code, msg, data))
}

// startNext starts the prompt that waited for r's turn (holdNext).
func (r *outReq) startNext() {
	if next := r.next; next != nil { // not on the agent reader: its send may wait
		r.next = nil
		r.conn.relay.bg.Go(func() { r.sess.startTurn(*next) })
	}
}
