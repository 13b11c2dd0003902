package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/outbox"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/pool"
)

// Sink carries messages to one client (outbox.Sink); FactSink and
// WrittenSink are what a sink may do besides, and Facts what the relay
// knows of a message it delivers.
type (
	Sink        = outbox.Sink
	FactSink    = outbox.FactSink
	WrittenSink = outbox.WrittenSink
	Facts       = outbox.Facts
)

// ConnInfo identifies a client connection.
type ConnInfo struct {
	ID     string // connection ID (the Acp-Connection-Id header)
	Tenant string // "" when the gateway runs without tenants
	// Subject is who the credential names (auth.Identity.Subject): "jwt:"
	// and the JWT's sub, or for a static token a stable name derived from
	// it, "token:…" (never the token). Who may attach to a session is
	// decided by it (Sharing).
	Subject string
	// Agent names the agent the connection uses ("" = the first
	// configured).
	Agent string
	Log   *slog.Logger
	// OnEnd, if set, is called once when the connection has ended for good
	// (not when a socket ends and the connection detaches).
	OnEnd func()
	// Affinity is "NAME=VALUE" of the balancer's affinity cookie the
	// connection's opening request carried ("" = none): the initialize
	// result says it (_meta.acpgate.affinity), for share links.
	Affinity string
	// Transport ("websocket", "http") and Remote (the client's address)
	// are what the admin API lists.
	Transport, Remote string
	// NoResume: the transport has no socket to resume (Streamable HTTP,
	// whose event streams replay by Last-Event-ID): no resume token, no
	// replay buffer.
	NoResume bool
}

// Conn is one client connection multiplexed onto the pool (lock order: see
// the package doc). Handle and HandleFrom may be called from several
// goroutines (an old socket's last frame and a resumed socket's first):
// they take turns under handleMu. The agent side delivers to the Sink from
// the processes' goroutines.
type Conn struct {
	seq    uint64 // the order the relay made it in (lockOutboxes)
	relay  *Relay
	id     string
	tenant string
	ten    *tenant
	ag     *agent // the agent the connection uses, its pool and metrics
	scope  string // what its session IDs are sealed to (sessionid.Scope)
	// subject is who the credential names (ConnInfo.Subject); clientID
	// names the connection to the other clients of a session it holds
	// (session/attach's connectedClients).
	subject, clientID string
	log               *slog.Logger
	ctx               context.Context
	cancel            context.CancelFunc

	// handleMu: the client's messages are handled one at a time, whichever
	// socket they came on (with a resume, the old socket's last message may
	// still be in hand when the new socket's first arrives). cr is what
	// handles them, used only under it.
	handleMu sync.Mutex
	cr       clientReader

	reqs        inflight.Table[*outReq, *inReq] // in flight either way
	queuedBytes inflight.Budget                 // its prompts waiting for sessions' turns (maxConnQueuedBytes)

	// auditLim bounds the policy.denied events one connection's client, or
	// its agent, can make the audit trail write.
	auditLim *audit.Limiter

	// Static after construction.
	token    string // the resume token ("" = resume off); never logged
	affinity string // ConnInfo.Affinity
	keeps    bool   // the outbox keeps what it sends: sinks borrow messages (Sink.Send)
	onEnd    func()
	opened   time.Time
	// transport and remote: ConnInfo's, for the admin API.
	transport, remote string

	out  outbox.Box[*Session] // what the client is sent, numbered, kept for a resume
	recv atomic.Int64         // client messages received, across sockets

	initArrived atomic.Bool // a valid initialize came (see HandshakeDone)
	recheckEnd  atomic.Bool // endIfEmpty found it handling a message: check once done (handled)
	aware       atomic.Bool // hears its sessions' multi-client updates as their owner (initialize _meta.acpgate.multiClient)

	mu          sync.Mutex
	initialized bool
	closed      bool
	prof        Profile                // what the client offered, within what the deployment allows
	info        multiclient.ClientInfo // the clientInfo of its initialize
	caps        policy.AgentCaps       // what the agent advertised
	home        *pool.Lease            // the process of the connection's session-less requests
	sessions    map[string]*Session    // by gateway session ID
	detached    bool                   // no socket: kept for a resume or a take-over
	detachSeq   int64                  // the last message numbered before the detach
	detachTimer *time.Timer            // ends the connection at sessions.detach_timeout
	detachedAt  time.Time              // when it last detached
	resuming    int                    // Resume calls not yet resumed on a socket (Conn.Resume) or aborted
}

// clientReader handles what a client sends: it scans each message,
// applies the connection's limits and its tenant's policy, and routes it
// (route_client.go) or serves it (session/attach, a take-over). It is the
// connection's read side, as agentReader is a process's: used only by the
// goroutine that holds the connection's handleMu.
type clientReader struct {
	c     *Conn
	sc    jsonrpc.Scanner
	msg   jsonrpc.Message
	rspan trace.Span   // the request in hand's span, if it is traced (handleCall)
	rlog  *slog.Logger // log with rspan's trace, made when first wanted (reqLog)
	// rcarried: an outReq carries rspan now, and ends it (outReq.end);
	// else endRequestSpan does.
	rcarried bool
	edits    []jsonrpc.Edit
	resolve  jsonrpc.Resolver
	// traceParent: the trace context of the message in hand from its
	// transport (a POST's traceparent header; HandleScannedTrace).
	traceParent trace.SpanContext
	// meta removes what policy.meta does not allow from the message in
	// hand's _meta; metaEmptied: it removes every member (stripMeta).
	meta        policy.MetaFilter
	metaEmptied bool

	// choice: a permission answer the gateway put in a client's place
	// (modeChoice), scanned with choiceSc.
	choice   jsonrpc.Message
	choiceSc jsonrpc.Scanner

	limiter *rate.Limiter // the connection's message rate; nil = none
	logLim  *logx.Limiter // bounds what one client can make the gateway log
}

// KeepsSent reports whether the connection keeps what it sends for a
// resume: its sinks borrow the messages they are sent and must not pool
// them (Sink.Send).
func (c *Conn) KeepsSent() bool { return c.keeps }

// ID returns the connection ID.
func (c *Conn) ID() string { return c.id }

// Deliver sends the client a message about no session in particular (the
// relay's own answers; another replica's messages the gateway carries),
// numbered and kept as every message is, so that a resume replays it. msg
// is a pooled buffer (jsonrpc.GetBuffer), owned by the connection from now
// on.
func (c *Conn) Deliver(msg []byte) { c.deliverFor(msg, nil, Facts{}, false) }

// deliverFor sends a message about session sess (nil: none) to the client;
// f is what the relay knows of it (FactSink); wait allows backpressure
// (see Sink.Send).
func (c *Conn) deliverFor(msg []byte, sess *Session, f Facts, wait bool) {
	c.deliverTo(msg, sess, f, wait, true)
}

// deliverMember sends c, a member of sess, a message about it: never
// passed on to the owner (an attach-only update must not reach a plain
// client), even if c has left meanwhile.
func (c *Conn) deliverMember(msg []byte, sess *Session, f Facts, wait bool) {
	c.deliverTo(msg, sess, f, wait, false)
}

// deliverTo is deliverFor; redirect lets a detached owner's message about
// a session taken over meanwhile go to the new owner.
func (c *Conn) deliverTo(msg []byte, sess *Session, f Facts, wait, redirect bool) {
	o := &c.out
	o.Lock()
	if redirect && sess != nil && o.SinkLocked() == nil {
		// Detached: a take-over may have moved sess since the agent reader
		// looked its owner up. The owner changes under this lock, so the
		// check holds until the message is kept.
		if owner := sess.Owner(); owner != nil && owner != c && sess.memberOf(c) == nil {
			o.Unlock()
			owner.deliverFor(msg, sess, f, wait)
			return
		}
	}
	overflow := o.DeliverLocked(msg, sess, f, wait)
	o.Unlock()
	if overflow {
		c.overflowed()
	}
}

func (c *Conn) replyError(id []byte, code int, msg string, data []byte) {
	c.Deliver(jsonrpc.AppendError(nil, id, code, msg, data))
}

// answerError answers the request in hand with an error and records it on
// the request's span, if it is traced (c.handleMu held).
func (cr *clientReader) answerError(id []byte, code int, msg string, data []byte) {
	c := cr.c
	if cr.rspan != nil {
		tracing.Error(cr.rspan, code, msg)
	}
	c.replyError(id, code, msg, data)
}

// HandleFrom processes one frame the client sent on sink's socket: one
// message, or several newline-delimited ones (jsonrpc.Messages), each
// handled as if it had come alone. A frame from a socket that is no longer
// the connection's (superseded by a resume) is dropped uncounted: the
// resumed client sends it again. Frames, not messages, are what a resume
// counts.
func (c *Conn) HandleFrom(sink Sink, frame []byte) {
	c.handleMu.Lock() // counted and handled in one order, whichever socket
	if c.countFrom(sink) {
		jsonrpc.Messages(frame, c.cr.handleLocked)
	}
	c.handleMu.Unlock()
	c.handled()
}

// countFrom counts a client message from sink's socket and reports whether
// that socket is the connection's; one from a superseded socket is not
// counted (the resumed client sends it again). Attach reads the count under
// the same lock.
func (c *Conn) countFrom(sink Sink) bool {
	c.out.Lock()
	defer c.out.Unlock()
	if c.out.SinkLocked() != sink {
		return false
	}
	c.recv.Add(1)
	return true
}

// Handle processes one frame from the client, as HandleFrom does.
func (c *Conn) Handle(frame []byte) {
	c.handleMu.Lock()
	c.recv.Add(1)
	jsonrpc.Messages(frame, c.cr.handleLocked)
	c.handleMu.Unlock()
	c.handled()
}

// handleLocked processes one client message (c.handleMu held).
func (cr *clientReader) handleLocked(frame []byte) {
	c := cr.c
	m := &cr.msg
	if err := cr.sc.Scan(frame, m, cr.resolve); err != nil {
		var se *jsonrpc.ScanError
		errors.As(err, &se)
		switch se.Class {
		case jsonrpc.ErrParse:
			c.replyError(nil, jsonrpc.CodeParseError, "parse error: "+err.Error(), nil)
		default:
			c.replyError(se.ID, jsonrpc.CodeInvalidRequest, "invalid request: "+err.Error(), nil)
		}
		return
	}
	cr.handleMessage(m)
}

// handled follows the handling of a frame (handleMu released): a take-over
// that found the connection busy and possibly empty asked it to check.
func (c *Conn) handled() {
	if c.recheckEnd.CompareAndSwap(true, false) {
		c.endIfEmpty()
	}
}

// ScanClient scans a client message as a connection does (HandleScannedTrace):
// the fields the relay rewrites are located. sc is the caller's, reused.
func ScanClient(sc *jsonrpc.Scanner, frame []byte, m *jsonrpc.Message) error {
	if sc.Methods == nil {
		sc.Methods = acp.Methods
	}
	sc.SnakeTwins = true
	return sc.Scan(frame, m, acp.ClientSpec)
}

// HandleScannedTrace processes one client message from sink's socket
// that the caller has scanned with ScanClient (Streamable HTTP reads each
// POST once), as HandleFrom would, with the trace context the transport
// carried it in (a POST's traceparent header, see
// tracing.ParseTraceparent): the parent of the request's span unless its
// params._meta names one.
func (c *Conn) HandleScannedTrace(sink Sink, m *jsonrpc.Message, parent trace.SpanContext) {
	c.handleMu.Lock()
	if c.countFrom(sink) {
		c.cr.traceParent = parent
		c.cr.handleMessage(m)
		c.cr.traceParent = trace.SpanContext{}
	}
	c.handleMu.Unlock()
	c.handled()
}

// handleMessage processes one scanned client message (c.handleMu held).
func (cr *clientReader) handleMessage(m *jsonrpc.Message) {
	c := cr.c
	if len(m.ID) > maxIDBytes || len(m.Method) > maxMethodBytes {
		c.replyError(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: ids are limited to %d bytes and method names to %d", maxIDBytes, maxMethodBytes), nil)
		return
	}
	if m.Kind == jsonrpc.KindResponse {
		cr.handleResponse(m)
		return
	}
	if !cr.allow(m) {
		return
	}
	c.mu.Lock()
	initialized := c.initialized
	c.mu.Unlock()
	switch {
	case !initialized && m.Method == acp.Initialize && m.Kind == jsonrpc.KindRequest:
		cr.rspan = cr.startSpan(m)
		cr.handleInitialize(m) // answered here, from what the pool learnt
		cr.endRequestSpan()
	case !initialized:
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, jsonrpc.CodeInvalidRequest, "the connection is not initialized: the first request must be initialize", nil)
		}
	case m.Method == acp.Initialize:
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, jsonrpc.CodeInvalidRequest, "the connection is already initialized", nil)
		}
	default:
		cr.handleCall(m)
	}
}

// Limits on what one message may carry.
const (
	maxIDBytes     = 256
	maxMethodBytes = 256
)

// codeBusy answers a client over its rate or pending-request limit.
const codeBusy = -32006

// allow applies the connection's and the tenant's rate limits and the
// pending-request cap. Cancellations always pass: they reduce load.
func (cr *clientReader) allow(m *jsonrpc.Message) bool {
	c := cr.c
	if (m.Method == acp.SessionCancel || m.Method == acp.CancelRequest) && m.Kind == jsonrpc.KindNotification && len(m.Raw) <= maxFreeCancelBytes {
		return true
	}
	var why string
	switch {
	case cr.limiter != nil && !cr.limiter.Allow():
		why = fmt.Sprintf("rate limit: at most %g messages per second on this connection", float64(cr.limiter.Limit()))
	case c.ten.limiter != nil && !c.ten.limiter.Allow():
		why = fmt.Sprintf("rate limit: tenant %q is over its message rate", c.tenant)
	case m.Kind == jsonrpc.KindRequest && c.relay.limits.MaxPendingRequests > 0 && c.reqs.Pending() >= c.relay.limits.MaxPendingRequests:
		why = fmt.Sprintf("too many requests in flight: at most %d per connection; wait for answers", c.relay.limits.MaxPendingRequests)
	default:
		return true
	}
	c.denied("rate_limited", m.Method)
	if m.Kind == jsonrpc.KindRequest {
		c.replyError(m.ID, codeBusy, why, nil)
	} else if cr.logLim.Allow() {
		c.log.Info("notification dropped", "method", m.Method, "why", why)
	}
	return false
}

// maxFreeCancelBytes: a cancellation notification up to this size is never
// limited (it reduces load); a bigger one is treated like any message.
const maxFreeCancelBytes = 4 << 10

// Busy reports whether requests are in flight either way (a running prompt
// among them), so an idle timeout must wait.
func (c *Conn) Busy() bool {
	return c.reqs.Busy()
}

// handleInitialize answers the client's initialize from the agent's cached
// answer, at once. Only before any agent process has ever initialized (a
// cold pool) does it wait for one, up to pool.acquire_timeout; the
// handshake timeout does not run meanwhile (HandshakeDone).
func (cr *clientReader) handleInitialize(m *jsonrpc.Message) {
	c := cr.c
	prof, err := c.relay.profileFor(c, m.Payload)
	if err != nil {
		c.replyError(m.ID, jsonrpc.CodeInvalidParams, "initialize: "+err.Error(), nil)
		return
	}
	c.initArrived.Store(true)
	var home *pool.Lease
	init, ok := c.ag.pool.CachedInit(prof)
	if !ok {
		ctx, cancel := context.WithTimeout(c.ctx, c.ag.cfg.AcquireTimeout)
		home, err = c.ag.pool.Acquire(ctx, prof, false)
		cancel()
		if err != nil {
			c.initArrived.Store(false)
			cr.reqLog().Warn("initialize: no agent", "err", err)
			c.replyError(m.ID, jsonrpc.CodeInternalError, "no agent available: "+pool.ClientReason(err), nil)
			return
		}
		init = home.Process().Init()
	}
	result, err := policy.FilterInitialize(init.Result, *c.ten.policy(c.ag.name))
	info, self := multiclient.InitClientInfo(m.Payload), "" // an owner that hears multi-client updates learns its clientId
	if info.MultiClient {
		self = c.clientID
	}
	if err == nil && (c.token != "" || c.affinity != "" || self != "") {
		result = acp.WithAcpgateMeta(result, c.token, c.affinity, self)
	}
	if err == nil && c.ten.sharing().Attach != SharingOff {
		result = acp.WithAttachCapability(result)
	}
	c.mu.Lock()
	if c.closed || err != nil {
		c.mu.Unlock()
		home.Release()
		if err != nil {
			cr.reqLog().Error("the agent's initialize result cannot be filtered; refusing", "err", err)
			c.replyError(m.ID, jsonrpc.CodeInternalError, "the agent's initialize result is malformed", nil)
		}
		return
	}
	c.initialized, c.prof, c.home, c.caps = true, prof, home, init.Caps
	c.info = info
	c.mu.Unlock()
	c.aware.Store(info.MultiClient)
	cr.reqLog().Debug("initialized", "protocol_version", init.Version, "cached", home == nil)
	c.Deliver(jsonrpc.AppendResult(nil, m.ID, result))
}

// HandshakeDone reports whether the client has sent a valid initialize
// (answered or still waiting for a first agent process): the handshake
// timeout no longer applies.
func (c *Conn) HandshakeDone() bool { return c.initArrived.Load() }

// checkPolicy enforces the tenant's capability policy on a client message:
// a method that is off (or the agent never advertised) gets -32601, a
// disallowed MCP server, prompt content type or additionalDirectories gets
// -32602. Nothing refused reaches the agent.
func (cr *clientReader) checkPolicy(m *jsonrpc.Message) bool {
	c := cr.c
	c.mu.Lock()
	caps := c.caps
	c.mu.Unlock()
	if r := c.ten.policy(c.ag.name).CheckClient(m, caps); r != nil {
		cr.refuse(m, r.Code, r.Reason, r.Err)
		return false
	}
	return true
}

// stripMeta appends to edits those that remove from m's _meta (params, or
// result of an answer) every member policy.meta does not allow: the
// message still goes, without them. A removal is logged at debug with the
// members' names (never their values) and counted. ok false: _meta is not
// an object; a request or notification has been refused (-32602), an
// answer's _meta is replaced by {} (it must still reach the agent).
func (cr *clientReader) stripMeta(m *jsonrpc.Message, edits []jsonrpc.Edit) (_ []jsonrpc.Edit, ok bool) {
	c := cr.c
	cr.metaEmptied = false
	mi := acp.MetaIndex(m)
	if mi < 0 {
		return edits, true // the common case: nothing to look up
	}
	out, res, err := cr.meta.Edits(edits, m, c.ten.policy(c.ag.name).Meta)
	if err != nil {
		if m.Kind == jsonrpc.KindResponse {
			f := m.Fields[mi]
			c.log.Debug("a client's answer had a _meta that is not an object; sent with {}", "method", answerMethod(m))
			return append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: []byte("{}")}), true
		}
		cr.refuse(m, jsonrpc.CodeInvalidParams, "meta", fmt.Errorf("params.%w", err))
		return edits, false
	}
	if len(res.Removed) > 0 {
		c.ten.metaRemoved(c.ag.metrics, len(res.Removed))
		if c.log.Enabled(context.Background(), slog.LevelDebug) {
			names := make([]string, len(res.Removed))
			for i, n := range res.Removed {
				names[i] = logx.Quote(n, 64)
			}
			cr.reqLog().Debug("removed _meta members policy.meta.allow does not allow", "method", answerMethod(m), "keys", names)
		}
	}
	cr.metaEmptied = res.Emptied
	return out, true
}

// answerMethod is m's method, or "answer" for a client's answer.
func answerMethod(m *jsonrpc.Message) string {
	if m.Kind == jsonrpc.KindResponse {
		return "answer"
	}
	return m.Method
}

// refuse answers a message the policy refused (a notification is dropped)
// and counts it. The error never carries MCP commands, env or headers.
func (cr *clientReader) refuse(m *jsonrpc.Message, code int, reason string, err error) {
	c := cr.c
	c.denied(reason, m.Method)
	cr.reqLog().Info("refused by policy", "method", m.Method, "reason", reason, "err", err)
	if m.Kind == jsonrpc.KindRequest {
		c.replyError(m.ID, code, err.Error(), nil)
	}
}

// reserveQuota holds one of the tenant's session slots for m, or answers m
// with the quota error. A session that moves from another of the tenant's
// connections (move) is already counted: its slot is held past the cap.
func (cr *clientReader) reserveQuota(m *jsonrpc.Message, move bool) bool {
	c := cr.c
	ok, max := c.ten.tryReserve(move)
	if ok {
		return true
	}
	c.denied("session_quota", m.Method)
	cr.reqLog().Info("tenant session quota reached", "tenant", c.tenant, "max_sessions", max)
	c.replyError(m.ID, codeQuota, fmt.Sprintf("session quota reached: tenant %q may hold at most %d sessions; close one first",
		c.tenant, max), nil)
	return false
}

// profile is what the client offered, within what the deployment allows.
func (c *Conn) profile() Profile {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prof
}

// notFound answers a request for a session this connection does not hold.
func (cr *clientReader) notFound(m *jsonrpc.Message, gwID string, lost bool) {
	c := cr.c
	if m.Kind != jsonrpc.KindRequest {
		c.log.Debug("notification for an unknown session dropped", "method", m.Method)
		return
	}
	msg := "session not found"
	if lost {
		msg = "session not found: its agent process exited; load the session again"
	}
	data := acp.SessionIDObject(gwID)
	cr.answerError(m.ID, jsonrpc.CodeNotFound, msg, data)
}

// forwardCancelRequest translates $/cancel_request for one of the client's
// requests in flight.
func (cr *clientReader) forwardCancelRequest(m *jsonrpc.Message) {
	c := cr.c
	f, ok := m.FieldOf(jsonrpc.FieldRequestID, -1)
	if !ok {
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, jsonrpc.CodeInvalidParams, "$/cancel_request needs params.requestId", nil)
		}
		return
	}
	req := c.reqs.Client(m.Bytes(f))
	if req == nil {
		if m.Kind == jsonrpc.KindRequest {
			c.Deliver(jsonrpc.AppendResult(nil, m.ID, []byte("null")))
		}
		return // already answered: nothing to cancel
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.ag.cfg.AcquireTimeout)
	defer cancel()
	agentID := strconv.AppendInt(nil, req.agentID, 10)
	var out []byte
	if m.Kind == jsonrpc.KindRequest {
		// $/cancel_request is a notification; a client that sent it as a
		// request gets its answer from the gateway, and the agent gets the
		// notification.
		c.Deliver(jsonrpc.AppendResult(nil, m.ID, []byte("null")))
		params := append(append([]byte(`{"requestId":`), agentID...), '}')
		out = append(jsonrpc.AppendRequest(nil, nil, acp.CancelRequest, params), '\n')
	} else {
		edits, ok := cr.stripMeta(m, append(cr.edits[:0], jsonrpc.Edit{Start: f.Start, End: f.End, Repl: agentID}))
		if !ok {
			return
		}
		jsonrpc.SortEdits(edits)
		cr.edits = edits
		out = jsonrpc.SpliceLine(nil, m.Raw, edits)
	}
	if err := req.side.p.Send(ctx, out); err != nil {
		c.log.Debug("$/cancel_request not passed on: the agent process is gone or not reading", "err", err)
	}
}

// handleResponse forwards the client's answer to an agent's request.
func (cr *clientReader) handleResponse(m *jsonrpc.Message) {
	c := cr.c
	id, ok := acp.ParseAgentID(m.ID)
	in := c.reqs.TakeAgent(id)
	if !ok || in == nil {
		if c.reqs.WasWithdrawn(id) {
			c.log.Debug("client answered an agent request after it was withdrawn; dropped", "id", id)
			return
		}
		if cr.logLim.Allow() {
			c.log.Warn("client answered a request id the gateway never sent; dropped", "id", truncate(string(m.ID), 64))
		}
		return
	}
	if acp.Declines(m) {
		// An error or a cancellation settles nothing while another client
		// of the session may still answer: only this client's copy goes.
		if _, _, last := in.leave(c); !last {
			tracing.WithTrace(c.log, in.span).Debug("a client declined an agent request others may answer", "method", in.method)
			return
		}
	}
	if in.isSettled() {
		tracing.WithTrace(c.log, in.span).Debug("client answered an agent request the gateway had already answered for it; dropped", "method", in.method)
		return
	}
	if m.IsError {
		tracing.Answer(in.span, m.Payload)
	}
	if in.method == acp.RequestPermission && in.sess != nil && !m.IsError {
		m = cr.modeChoice(in, m) // an option that would switch to a mode outside the list: cancelled
	}
	// Its result._meta keeps only what policy.meta allows, as a request's.
	edits, _ := cr.stripMeta(m, append(cr.edits[:0], jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: in.agentID}))
	jsonrpc.SortEdits(edits)
	cr.edits = edits
	out := jsonrpc.SpliceLine(nil, m.Raw, edits)
	ctx, cancel := context.WithTimeout(c.ctx, c.ag.cfg.AcquireTimeout)
	defer cancel()
	if !in.settle(answered(ctx, c, m, out)) {
		tracing.WithTrace(c.log, in.span).Debug("client answered an agent request the gateway had already answered for it; dropped", "method", in.method)
		return
	}
	c.ag.metrics.Message(metrics.ClientToAgent, in.method, len(out)-1)
	if (in.method == acp.FsRead || in.method == acp.FsWrite) && !m.IsError {
		in.clientFsDone(c, m)
	}
}

// errConnClosed: the connection has ended; nothing more is taken for it.
var errConnClosed = errors.New("the client has disconnected")

// homeProc returns the process that serves the connection's requests that
// name no session, acquiring a new one if the first has died or retires.
func (c *Conn) homeProc(ctx context.Context) (*procSide, error) {
	c.mu.Lock()
	home, prof := c.home, c.prof
	c.mu.Unlock()
	if p := home.Process(); p != nil && p.Alive() && !p.Retiring() {
		return c.ag.side(p), nil
	}
	wait := tracing.PoolWait(c.relay.tracer, ctx)
	lease, err := c.ag.pool.Acquire(ctx, prof, false)
	tracing.EndWait(wait, err)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		lease.Release()
		return nil, errConnClosed
	}
	old := c.home
	c.home = lease
	c.mu.Unlock()
	old.Release()
	return c.ag.side(lease.Process()), nil
}

// trackAgentReq registers an agent request (about sess, if any) for this
// client and returns it, with the id the client sees. span is its span
// (nil: not traced), ended when it is forgotten.
func (c *Conn) trackAgentReq(l *procSide, agentID []byte, method string, sess *Session, span trace.Span) (*inReq, int64, error) {
	if l.findInbound(agentID) != nil { // only this process's reader adds one, so the check holds
		return nil, 0, errDuplicateAgentID
	}
	in := &inReq{side: l, agentID: append([]byte(nil), agentID...), conn: c, method: method, start: time.Now(), sess: sess, span: span}
	id, ok := c.reqs.AddAgent(in)
	if !ok {
		return nil, 0, errConnClosed
	}
	in.mu.Lock()
	in.connID = id // guarded by in.mu, as a take-over moves it
	in.mu.Unlock()
	if !in.index().Add(in) {
		c.reqs.ForgetAgent(id)
		return nil, 0, errSessionLost
	}
	return in, id, nil
}

var (
	errDuplicateAgentID = errors.New("request id is already in flight")
	errSessionLost      = errors.New("the session's agent process has exited")
)

// index makes s one of the connection's sessions (Conn.sessions), by the
// ID it sees. A session created for a connection that has closed meanwhile
// is closed on the agent.
func (c *Conn) index(s *Session) {
	c.mu.Lock()
	if !c.closed {
		old := c.sessions[s.GatewayID] // a lost session the load replaces
		c.sessions[s.GatewayID] = s
		c.mu.Unlock()
		if old != s {
			s.addRef()
			if old != nil {
				if mem, _ := old.leave(c); mem != nil {
					old.events().memberLeft(c, mem)
				}
				old.dropRef(c.log)
			}
		}
		return
	}
	c.mu.Unlock()
	c.leaveSession(s, false)
}

// forget takes s out of the connection's sessions: another connection took
// it over, it was closed, or its load failed (index's undo).
func (c *Conn) forget(s *Session) {
	c.mu.Lock()
	had := c.sessions[s.GatewayID] == s
	if had {
		delete(c.sessions, s.GatewayID)
	}
	c.mu.Unlock()
	if had {
		s.dropRef(c.log)
	}
}

// Close ends the connection: the client's running prompts are cancelled, the
// agent's requests waiting for it are answered in its place, and its
// sessions are closed on the agent where the agent supports session/close.
// The agent processes stay in the pool. Repeating it does nothing.
func (c *Conn) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	sessions, home := c.sessions, c.home
	c.sessions, c.home = nil, nil
	wasDetached := c.detached
	c.detached = false
	if c.detachTimer != nil {
		c.detachTimer.Stop()
	}
	c.mu.Unlock()
	clientReqs, agentReqs := c.reqs.Close()
	c.cancel()
	if wasDetached {
		c.relay.metrics.Detached.Dec()
	}
	for _, in := range agentReqs { // another client of its session may answer it yet
		in.letGo(c, "the client disconnected")
	}
	prompting := make(map[*Session]bool)
	for _, r := range clientReqs {
		if r.method == acp.SessionPrompt && r.sess != nil {
			prompting[r.sess] = true
		}
	}
	for _, s := range sessions {
		c.leaveSession(s, prompting[s])
		s.dropRef(c.log)
	}
	home.Release()
	c.relay.connClosed(c)
	c.out.Release()
	if c.onEnd != nil {
		c.onEnd()
	}
}

// String describes the connection for logs.
func (c *Conn) String() string { return fmt.Sprintf("conn %s", c.id) }

// isClosed reports whether the connection has ended.
func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
