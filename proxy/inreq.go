package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
)

// An agent's request to a client, from the agent's reader to its one
// settlement. The reader makes it (Conn.trackAgentReq), it is indexed once,
// by its session (Session.inbound; one about no session by its process,
// procSide.loose), and a client sees it by an id of its own (Conn.reqs). It
// ends in settle, whoever ends it: the client that answers, or the gateway
// in the clients' place (the last client let go, the client did not answer
// in time, an administrator ended the session, the agent exited, a decider
// decided, no client can take it). Callers only say why (a settlement).

// inReq is an agent→client request waiting for a client's answer.
type inReq struct {
	// Set when made, read-only after.
	side    *procSide
	agentID []byte // the agent's raw id
	method  string
	start   time.Time
	sess    *Session   // the session it is about, if any
	span    trace.Span // nil: not traced; ended by settle

	// mu guards what follows. A leaf: nothing is locked under it.
	mu sync.Mutex
	// settled: settle has begun; nothing more is copied, adopted or sent.
	settled bool
	// msg is as the client was sent it (a take-over or an attach sends it
	// again). conn and connID are the client it waits on and the id that
	// client sees: a take-over moves them, and a member's copy takes their
	// place when that client lets go. pendingTo is where a take-over that
	// came before msg was set moved it.
	msg       []byte
	conn      *Conn
	connID    int64
	pendingTo *Conn
	// copies are the other clients of the session that were sent it too
	// (session/attach): the first answer wins, the others are withdrawn.
	copies []inCopy
}

// inCopy is one client's copy of an agent request: the connection and the
// id it was sent with.
type inCopy struct {
	conn *Conn
	id   int64
}

// Who settled an agent request, as observers hear it (observe.Event.By):
// the client that answered, or the gateway in the clients' place. A
// decider's settlement is by the decider's name.
const (
	byClient      = "client"
	byTimeout     = "timeout"      // no client answered within timeouts.client_request
	byDisconnect  = "disconnect"   // its last client disconnected or detached
	byAdmin       = "admin"        // an administrator ended its session
	byAgentExited = "agent_exited" // its agent process exited: nobody to answer
	byNoRecipient = "no_recipient" // no client could take it
)

// settlement is how an agent request is settled, and by whom.
type settlement struct {
	by string // see byClient and the others, or a decider's name
	// client is the client whose answer it is (by "client"): its own copy
	// is not withdrawn.
	client *Conn
	// line is what the agent gets, a whole line: a client's answer (sent
	// with backpressure until ctx ends) or a decider's. nil: the gateway
	// answers in the clients' place (code and why; a permission request is
	// cancelled), unless the agent has exited (silent).
	line   []byte
	ctx    context.Context
	code   int
	why    string
	silent bool
	// failed: the span records why as an error (the clients failed to
	// answer), not as an outcome.
	failed bool
	// outcome is a permission request's RequestPermissionOutcome; rule and
	// decide are a decider's (observe.Decision).
	outcome      []byte
	rule, decide string
}

var cancelledOutcome = []byte(`{"outcome":"cancelled"}`)

// inPlace is the gateway's settlement in the clients' place: a permission
// request is cancelled, anything else gets the error code and why.
func inPlace(by string, code int, why string) settlement {
	return settlement{by: by, code: code, why: why, outcome: cancelledOutcome}
}

// answered is the settlement of a client's answer m (line: m as the agent
// gets it).
func answered(ctx context.Context, c *Conn, m *jsonrpc.Message, line []byte) settlement {
	st := settlement{by: byClient, client: c, line: line, ctx: ctx, outcome: cancelledOutcome}
	if !m.IsError {
		var res struct {
			Outcome json.RawMessage `json:"outcome"`
		}
		if json.Unmarshal(m.Payload, &res) == nil && len(res.Outcome) > 0 {
			st.outcome = res.Outcome
		}
	}
	return st
}

// settle ends the request, once: of all who try, only the first does, and
// it reports whether it was the one. The steps, in this order:
//
//  1. claim: the request is settled; nothing more is copied or adopted;
//  2. forget: out of its index, so the agent may use its id again;
//  3. withdraw every other client's copy ($/cancel_request) and tell the
//     session's members how it was settled (permission_resolved), under
//     Session.fan, after the copies they were sent: every client hears
//     before the agent goes on;
//  4. emit PermissionResolved (a permission request), off every lock:
//     before the agent hears, so that the audit trail records the answer
//     before what the agent does with it (the file it writes once allowed);
//  5. answer the agent (nothing, if it has exited), and end the span.
//
// It takes Session.fan: never call it with a fan lock held.
func (in *inReq) settle(st settlement) bool {
	in.mu.Lock()
	if in.settled {
		in.mu.Unlock()
		return false
	}
	in.settled = true
	msg := in.msg
	copies := in.connsLocked(st.client)
	in.mu.Unlock()

	in.index().Done(in)

	s := in.sess
	perm := in.method == acp.RequestPermission && s != nil
	var body []byte
	if perm && s.audience() {
		body = st.news(s, msg)
	}
	if len(copies) > 0 || body != nil {
		if s != nil {
			s.fan.Lock() // a copy is sent under the fan lock: its withdrawal follows it
		}
		for _, cp := range copies {
			cp.conn.reqs.Withdraw(cp.id)
			cp.conn.Deliver(acp.CancelRequestMsg(cp.id))
		}
		if body != nil {
			s.toMembersLocked(body, nil)
		}
		if s != nil {
			s.fan.Unlock()
		}
	}

	if perm {
		in.permissionResolved(st, msg)
	}
	switch {
	case st.line != nil && st.ctx != nil:
		if err := in.side.p.Send(st.ctx, st.line); err != nil {
			tracing.WithTrace(in.log(st.client), in.span).Debug("answer for an exited agent dropped", "err", err)
		}
	case st.line != nil:
		in.side.p.SendCtrl(st.line)
	case !st.silent:
		in.side.answerForClient(in.agentID, in.method, st.code, st.why)
	}
	if in.span != nil {
		switch {
		case st.failed:
			tracing.Error(in.span, jsonrpc.CodeInternalError, st.why)
		case st.client == nil:
			in.span.SetAttributes(attribute.String(tracing.AttrOutcome, st.why))
		}
		in.span.End()
	}
	return true
}

// log is the log of the request's client (c, or the one it waits on), or
// of its process.
func (in *inReq) log(c *Conn) *slog.Logger {
	if c == nil {
		in.mu.Lock()
		c = in.conn
		in.mu.Unlock()
	}
	if c != nil {
		return c.log
	}
	return in.side.p.Log()
}

// isSettled reports whether settle has begun.
func (in *inReq) isSettled() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.settled
}

// index is the one set that holds the request while it waits.
func (in *inReq) index() *inflight.Set[*inReq] {
	if in.sess != nil {
		return &in.sess.inbound
	}
	return &in.side.loose
}

// message is the request as its client was sent it (nil: not yet sent).
func (in *inReq) message() []byte {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.msg
}

// route returns the connection the request waits on and its id there.
func (in *inReq) route() (*Conn, int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.conn, in.connID
}

// connsLocked lists every client holding a copy of the request, except
// skip (in.mu held).
func (in *inReq) connsLocked(skip *Conn) []inCopy {
	var out []inCopy
	if in.conn != nil && in.conn != skip {
		out = append(out, inCopy{in.conn, in.connID})
	}
	for _, cp := range in.copies {
		if cp.conn != skip {
			out = append(out, cp)
		}
	}
	return out
}

// sentTo reports whether c holds a copy of the request.
func (in *inReq) sentTo(c *Conn) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, cp := range in.connsLocked(nil) {
		if cp.conn == c {
			return true
		}
	}
	return false
}

// copyTo sends c, another client of the request's session that may answer
// it, a copy with an id of its own: the first answer of any client wins.
func (in *inReq) copyTo(c *Conn) {
	if in.message() == nil || in.isSettled() {
		return
	}
	id, ok := c.reqs.AddAgent(in)
	if !ok {
		return
	}
	in.mu.Lock()
	if in.settled { // settled meanwhile: withdrawn before it is sent
		in.mu.Unlock()
		c.reqs.ForgetAgent(id)
		return
	}
	in.copies = append(in.copies, inCopy{c, id})
	msg := in.msg
	in.mu.Unlock()
	if c.isClosed() { // Close may have missed the copy: it is c's to give up
		if _, had, last := in.leave(c); had && last {
			// Not here: the caller may hold the session's fan lock.
			c.relay.bg.Go(func() { in.lastLeft(c, "the client disconnected") })
		}
		return
	}
	if out := acp.WithID(msg, id); out != nil {
		c.Deliver(out)
	}
}

// leave removes c's copy: id is the id c had, had whether it had one, last
// whether no client holds a copy any more (the request must then be
// settled in the clients' place: lastLeft). A member's copy becomes the
// primary when the primary's client leaves.
func (in *inReq) leave(c *Conn) (id int64, had, last bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.conn == c {
		id, had = in.connID, true
		in.conn, in.connID = nil, 0
		if len(in.copies) > 0 {
			in.conn, in.connID = in.copies[0].conn, in.copies[0].id
			in.copies = in.copies[1:]
		}
	} else {
		for i, cp := range in.copies {
			if cp.conn == c {
				id, had = cp.id, true
				in.copies = append(in.copies[:i:i], in.copies[i+1:]...)
				break
			}
		}
	}
	return id, had, had && in.conn == nil && len(in.copies) == 0
}

// handOver passes the request from from, whose session a take-over moved,
// to to, unless it is no longer from's (a take-over or a settle took it).
func (in *inReq) handOver(from, to *Conn) {
	_, id := in.route()
	if from.reqs.TakeIfOurs(id, in) {
		in.adoptBy(to)
	}
}

// adoptBy makes the request, taken over from another connection, c's: it
// gets an id of c's and is sent again.
func (in *inReq) adoptBy(c *Conn) {
	in.mu.Lock()
	msg := in.msg
	if msg == nil {
		// The agent reader has not sent it yet: it adopts it here once it
		// has (see agentReader.forwardRequest).
		in.pendingTo = c
	}
	in.mu.Unlock()
	if msg == nil {
		return
	}
	id, ok := c.reqs.AddAgent(in)
	if !ok {
		return
	}
	in.mu.Lock()
	settled := in.settled
	if !settled {
		in.conn, in.connID = c, id
	}
	in.mu.Unlock()
	if settled {
		c.reqs.ForgetAgent(id)
		return
	}
	if out := acp.WithID(msg, id); out != nil {
		c.Deliver(out)
	}
}

// letGo gives up c's copy of the request, if it has one: the last client
// to let go settles it in the clients' place (why says how).
func (in *inReq) letGo(c *Conn, why string) {
	id, had, last := in.leave(c)
	if !had {
		return
	}
	c.reqs.ForgetAgent(id)
	if last {
		in.lastLeft(c, why)
	}
}

// lastLeft settles the request in its clients' place, the last of which,
// c, has let go (why says how): a permission request is cancelled,
// anything else refused.
func (in *inReq) lastLeft(c *Conn, why string) {
	if in.settle(inPlace(byDisconnect, jsonrpc.CodeRequestCancelled, why)) {
		tracing.WithTrace(c.log, in.span).Info("answered an agent request for a disconnected client", "method", in.method)
	}
}

// expire settles the request in its clients' place if none answered it
// within limit: a permission request is cancelled, anything else gets
// -32603. A late answer is dropped.
func (in *inReq) expire(now time.Time, limit time.Duration) {
	if now.Sub(in.start) < limit {
		return
	}
	log := in.log(nil)
	st := inPlace(byTimeout, jsonrpc.CodeInternalError, fmt.Sprintf("the client did not answer %s within %s", in.method, limit))
	st.failed = true
	if !in.settle(st) {
		return
	}
	in.side.ag.metrics.AgentProtocolErrors.WithLabelValues("client_timeout").Inc()
	tracing.WithTrace(log, in.span).Info("the client did not answer an agent request in time; answered in its place",
		"method", in.method, "waited", now.Sub(in.start).Round(time.Second))
}

// letGoOf gives up c's copies of the agent's requests about s (c leaves
// it, why says how): each is settled in c's place only when no other
// client has one.
func letGoOf(c *Conn, s *Session, why string) {
	for _, in := range s.inbound.List() {
		in.letGo(c, why)
	}
}

// settleAll settles each of ins so (once each: see settle).
func settleAll(ins []*inReq, st settlement) {
	for _, in := range ins {
		in.settle(st)
	}
}

// inbound lists the agent's requests through the process waiting for a
// client: its sessions' (Session.inbound) and those about none.
func (l *procSide) inbound() []*inReq {
	out := l.loose.List()
	for _, s := range *l.sessions.Load() {
		out = append(out, s.inbound.List()...)
	}
	return out
}

// findInbound is the agent's request with raw id still waiting for a
// client (nil: none). Only the process's reader adds one, so on the reader
// a nil stays nil.
func (l *procSide) findInbound(raw []byte) *inReq {
	if in := findIn(l.loose.List(), raw); in != nil {
		return in
	}
	for _, s := range *l.sessions.Load() {
		if in := findIn(s.inbound.List(), raw); in != nil {
			return in
		}
	}
	return nil
}

func findIn(ins []*inReq, raw []byte) *inReq {
	for _, in := range ins {
		if bytes.Equal(in.agentID, raw) {
			return in
		}
	}
	return nil
}

// expireInbound settles, in the client's place, the agent's requests a
// client has left unanswered for longer than limit.
func (l *procSide) expireInbound(now time.Time, limit time.Duration) {
	if limit <= 0 {
		return
	}
	for _, in := range l.inbound() {
		in.expire(now, limit)
	}
}

// news is the permission_resolved update the members of s hear of msg, a
// permission request of s settled so: by whom (the client that answered,
// none for the gateway), with what, and by what rule.
func (st settlement) news(s *Session, msg []byte) []byte {
	var resolvedBy *multiclient.Peer
	if st.client != nil {
		p := s.peerOf(st.client)
		resolvedBy = &p
	}
	return multiclient.ByPolicy(multiclient.PermissionResolved(msg, resolvedBy, st.outcome), st.rule, st.decide)
}
