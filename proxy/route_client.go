package proxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/pathrewrite"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
	"github.com/acpgate/acpgate/proxy/turn"
)

// errAnswered: the handler has answered the client itself (an error, a
// take-over, a lost session closed); nothing is sent to an agent.
var errAnswered = errors.New("answered by the gateway")

// routed is where a client message goes and what handling it took.
type routed struct {
	side *procSide
	sess *Session // the session the message is about, if any
	h    *hold
}

// handleCall routes a client request or notification to an agent process:
// it checks the message, lets one handler per class of message choose the
// process and take what the request holds, then sends it.
func (cr *clientReader) handleCall(m *jsonrpc.Message) {
	if m.Method == acp.CancelRequest {
		cr.forwardCancelRequest(m)
		return
	}
	if cr.c.ag.gating.Load() > 0 && cr.holdBack(m) {
		return // handled once its session is established (establish.go)
	}
	cr.handleCallNow(m)
}

// handleCallNow is handleCall past the session's gate.
func (cr *clientReader) handleCallNow(m *jsonrpc.Message) {
	c := cr.c
	isReq := m.Kind == jsonrpc.KindRequest
	if isReq && c.reqs.Client(m.ID) != nil {
		c.replyError(m.ID, jsonrpc.CodeInvalidRequest, "request id "+truncate(string(m.ID), 64)+" is already in flight", nil)
		return
	}
	span := cr.startSpan(m) // ended once: by the outReq that carries it, else by endRequestSpan
	cr.rspan = span
	defer cr.endRequestSpan()
	switch m.Method {
	case acp.SessionAttach:
		cr.handleAttach(m)
		return
	case acp.SessionDetach:
		cr.handleDetach(m)
		return
	}
	if cr.readOnlyWrite(m) || !cr.checkPolicy(m) {
		return
	}
	if m.Method == acp.SessionStatus {
		handleStatus(cr, m)
		tracing.AnsweredByGateway(span)
		return
	}
	// Paths are checked before anything is reserved or taken over.
	edits, pathErr := pathrewrite.ToAgent(c.ten.mapper.Load(), m, cr.edits[:0])
	if pathErr != nil {
		c.denied("path_outside_root", m.Method)
		cr.reqLog().Info("refused a path outside the tenant root", "method", m.Method, "err", pathErr)
		if isReq {
			cr.answerError(m.ID, jsonrpc.CodeInvalidParams, pathErr.Error(), nil)
		}
		return
	}
	// _meta keeps only what policy.meta allows (a malformed one is refused).
	edits, ok := cr.stripMeta(m, edits)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.ag.cfg.AcquireTimeout)
	defer cancel()
	if span != nil {
		ctx = trace.ContextWithSpan(ctx, span) // the pool wait's parent
	}
	rt, edits, err := cr.route(ctx, m, edits)
	switch {
	case errors.Is(err, errAnswered):
		return
	case err != nil:
		cr.reqLog().Warn("no agent for request", "method", m.Method, "err", err)
		if isReq {
			cr.answerError(m.ID, jsonrpc.CodeInternalError, "no agent available: "+pool.ClientReason(err), nil)
		}
		return
	}
	cr.routedSpan(span, rt, m)
	cr.send(ctx, m, rt, edits, span)
}

// route chooses the handler for the class of m: about a session, creating
// one, or neither (the connection's home process).
func (cr *clientReader) route(ctx context.Context, m *jsonrpc.Message, edits []jsonrpc.Edit) (*routed, []jsonrpc.Edit, error) {
	if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		rt, agentSID, err := cr.routeSession(ctx, m, f)
		if err != nil {
			return nil, edits, err
		}
		return rt, append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, agentSID)}), nil
	}
	if acp.CreatesSession(m.Method) {
		rt, err := cr.routeCreate(ctx, m)
		return rt, edits, err
	}
	rt, err := cr.routeHome(ctx)
	return rt, edits, err
}

// routeSession routes a message that names a session: a load or resume, a
// delete, a close of a lost session, or anything for a live one.
func (cr *clientReader) routeSession(ctx context.Context, m *jsonrpc.Message, f jsonrpc.Field) (*routed, string, error) {
	c := cr.c
	gwID, isStr := m.String(f)
	if !isStr {
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, jsonrpc.CodeInvalidParams, "params.sessionId must be a string", nil)
		}
		return nil, "", errAnswered
	}
	c.mu.Lock()
	sess := c.sessions[gwID]
	c.mu.Unlock()
	if sess != nil && sess.stage() == stageClosing || (sess == nil || sess.stage() == stageEnded) && c.relay.endedByAdminAnywhere(gwID) {
		cr.endedByAdmin(m, gwID)
		return nil, "", errAnswered
	}
	live := sess != nil && sess.live()
	switch {
	case acp.LoadsSession(m.Method):
		return cr.routeLoad(ctx, m, gwID, sess, live)
	case !live && m.Method == acp.SessionDelete:
		id, _, ok := cr.open(m, gwID, access.Write)
		if !ok {
			return nil, "", errAnswered
		}
		rt, err := cr.routeHome(ctx)
		return rt, id.Agent, err
	case !live && sess != nil && m.Method == acp.SessionClose:
		cr.closeLost(m, sess)
		return nil, "", errAnswered
	case !live:
		cr.notFound(m, gwID, sess != nil && sess.isLost())
		return nil, "", errAnswered
	}
	rt, err := cr.routeLive(m, sess)
	return rt, sess.AgentID, err
}

// routeLoad routes a session/load or session/resume. A live session of
// this connection's goes to its process. Another's goes as its tenant's
// sharing says (cr.open): refused, watched (a read-only attach in the
// load's place), or opened: a detached connection's session may be taken
// over, or the load goes to the process that still serves the session (or
// any with room), and the session is routed to this connection from now
// on, before the agent replays its history.
func (cr *clientReader) routeLoad(ctx context.Context, m *jsonrpc.Message, gwID string, sess *Session, live bool) (*routed, string, error) {
	c := cr.c
	id, verdict, ok := cr.open(m, gwID, access.Load)
	switch {
	case !ok:
		return nil, "", errAnswered
	case live:
		h := &hold{conn: c}
		h.replaying(sess)
		if m.Kind == jsonrpc.KindRequest && c.gatesSessions() {
			h.gate(sess)
		}
		return &routed{side: sess.side, sess: sess, h: h}, id.Agent, nil
	case verdict == access.ReadOnly:
		cr.watch(m, gwID, id.Agent)
		return nil, "", errAnswered
	}
	agentSID := id.Agent
	isReq := m.Kind == jsonrpc.KindRequest
	if isReq && cr.takeOver(m, agentSID) {
		return nil, "", errAnswered
	}
	h := &hold{conn: c}
	// A lost session this connection holds is still counted. One another
	// connection of the tenant holds moves here ("the newest load wins"):
	// its slot is reserved past the cap, so that the holder ending
	// meanwhile never lets another session in over the quota.
	if isReq && sess == nil {
		if !cr.reserveQuota(m, c.ag.heldByTenant(agentSID, c.tenant)) {
			return nil, "", errAnswered
		}
		h.quota = true
	}
	rt, err := cr.placeLoad(ctx, m, id, gwID, sess, h)
	return rt, agentSID, err
}

// placeLoad finds the process for a load of the session id (gwID to c) and,
// for a request, routes the session to c from now on. h holds what the
// load took so far.
func (cr *clientReader) placeLoad(ctx context.Context, m *jsonrpc.Message, id sessionid.Opened, gwID string, sess *Session, h *hold) (*routed, error) {
	c := cr.c
	wait := tracing.PoolWait(c.relay.tracer, ctx)
	lease, err := c.ag.placeSession(ctx, c.profile(), id.Agent)
	tracing.EndWait(wait, err)
	if err != nil {
		h.release()
		return nil, err
	}
	h.slot = lease
	l := c.ag.side(lease.Process())
	if m.Kind == jsonrpc.KindRequest {
		h.loaded = l.addSession(c, id, gwID, acp.SessionCwd(m), h.takeSlot())
		h.loaded.meter.Loaded()
		h.replaying(h.loaded)
		if c.gatesSessions() { // before the client can name it
			h.gate(h.loaded)
		}
		c.index(h.loaded)
	}
	return &routed{side: l, sess: sess, h: h}, nil
}

// routeLive routes a message for a live session to its process. A
// session-creating request naming a session (session/fork) makes a new
// session on the same process: it takes a tenant slot and a process slot
// like session/new.
func (cr *clientReader) routeLive(m *jsonrpc.Message, sess *Session) (*routed, error) {
	c := cr.c
	if r := sess.models.Check(m, models.ListsOf(c.ten.policy(c.ag.name))); r != nil {
		cr.refuse(m, r.Code, r.Reason, r.Err)
		return nil, errAnswered
	}
	h := &hold{conn: c}
	if acp.CreatesSession(m.Method) && m.Kind == jsonrpc.KindRequest {
		if !cr.reserveQuota(m, false) {
			return nil, errAnswered
		}
		h.quota = true
		slot, ok := sess.side.p.TryLeaseSession()
		if !ok {
			h.release()
			c.replyError(m.ID, codeBusy, "the agent process of this session is full; try again later", nil)
			return nil, errAnswered
		}
		h.slot = slot
	}
	return &routed{side: sess.side, sess: sess, h: h}, nil
}

// routeCreate routes session/new (and the like) to a process with room,
// holding a tenant slot and a process slot until the agent answers.
func (cr *clientReader) routeCreate(ctx context.Context, m *jsonrpc.Message) (*routed, error) {
	c := cr.c
	h := &hold{conn: c}
	if m.Kind == jsonrpc.KindRequest {
		if !cr.reserveQuota(m, false) {
			return nil, errAnswered
		}
		h.quota = true
	}
	wait := tracing.PoolWait(c.relay.tracer, ctx)
	lease, err := c.ag.pool.Acquire(ctx, c.profile(), true)
	tracing.EndWait(wait, err)
	if err != nil {
		h.release()
		return nil, err
	}
	h.slot = lease
	return &routed{side: c.ag.side(lease.Process()), h: h}, nil
}

// routeHome routes a message that names no session to the connection's
// home process.
func (cr *clientReader) routeHome(ctx context.Context) (*routed, error) {
	c := cr.c
	l, err := c.homeProc(ctx)
	if err != nil {
		return nil, err
	}
	return &routed{side: l, h: &hold{conn: c}}, nil
}

// closeLost answers session/close for a session whose agent died: closing
// it only has to forget it here.
func (cr *clientReader) closeLost(m *jsonrpc.Message, sess *Session) {
	c := cr.c
	c.forget(sess)
	if sess.isLost() { // an ended one was told already
		sess.events().sessionEvent(c, observe.SessionClosed, "")
	}
	if m.Kind == jsonrpc.KindRequest {
		c.Deliver(jsonrpc.AppendResult(nil, m.ID, []byte("{}")))
	}
}

// send tracks a request (its hold goes with it) and passes the message to
// its process with the edits spliced in. A notification holds nothing.
func (cr *clientReader) send(ctx context.Context, m *jsonrpc.Message, rt *routed, edits []jsonrpc.Edit, span trace.Span) {
	c := cr.c
	var req *outReq
	if m.Kind == jsonrpc.KindRequest {
		if rt.sess != nil && m.Method == acp.SessionPrompt {
			if refusal := c.refusePrompt(rt.sess, nil, m.Payload); refusal != nil { // never reaches the agent
				rt.h.release()
				cr.answerError(m.ID, refusal.Code, refusal.Message, refusal.Data)
				return
			}
		}
		req = cr.track(m, rt, span)
		if req == nil {
			return
		}
		edits = append(edits, jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: strconv.AppendInt(nil, req.agentID, 10)})
		if e, ok := tracing.ParentEdit(m, span, cr.metaEmptied); ok {
			edits = append(edits, e)
		}
	} else {
		rt.h.release()
	}
	jsonrpc.SortEdits(edits)
	cr.edits = edits
	out := jsonrpc.SpliceLine(nil, m.Raw, edits) // one line, as the agent reads
	if rt.sess != nil && m.Method == acp.SessionPrompt && req != nil && rt.side.speaksV2() {
		rt.side.noteKey(req, acp.TaggedString(m, acp.LabelIdempotencyKey))
	}
	if rt.sess != nil && m.Method == acp.SessionPrompt && req != nil && !cr.takeTurn(m, rt, req, out) {
		return // waits for another client's turn, or refused
	}
	if rt.sess != nil && m.Method == acp.SessionPrompt && req != nil && !req.retry {
		rt.sess.events().turnStarted(req, nil, m.Payload)
	}
	c.ag.metrics.Message(metrics.ClientToAgent, m.Method, len(out))
	err := rt.side.p.Send(ctx, out)
	switch {
	case err == nil:
	case req == nil:
		c.log.Debug("notification not passed on: the agent process is gone or not reading", "method", m.Method, "err", err)
	case rt.side.take(req): // answer only if no one else did (the agent's death answers all)
		req.failWith(jsonrpc.CodeInternalError, "the agent cannot take the request: "+pool.ClientReason(err), nil)
	}
}

// track registers a request with the connection and its process. It
// answers and returns nil when either has ended meanwhile.
func (cr *clientReader) track(m *jsonrpc.Message, rt *routed, span trace.Span) *outReq {
	c := cr.c
	req := &outReq{
		conn:     c,
		clientID: append([]byte(nil), m.ID...),
		method:   m.Method,
		sess:     rt.sess,
		cwd:      acp.CreatedCwd(m),
		start:    time.Now(),
		hold:     rt.h,
		span:     span,
	}
	var ok bool
	if rt.h.request, ok = rt.side.p.LeaseRequest(); !ok || !rt.side.track(req) {
		rt.h.release()
		cr.answerError(m.ID, jsonrpc.CodeInternalError, "the agent process exited; try again", nil)
		return nil
	}
	cr.rcarried = true                          // req ends the span now (outReq.end)
	if !c.reqs.TrackClient(req.clientID, req) { // the connection closed meanwhile
		if rt.side.untrack(req) {
			req.hold.release()
			cr.rcarried = false // never sent: the gateway answered it
		}
		return nil
	}
	return req
}

// takeTurn starts the session's turn with req, a prompt whose line is out,
// unless another client's turn runs: then it waits (queued, sent when that
// turn ends) or, with the queue full, is refused. It reports whether the
// prompt goes to the agent now.
func (cr *clientReader) takeTurn(m *jsonrpc.Message, rt *routed, req *outReq, out []byte) bool {
	c := cr.c
	s := rt.sess
	if !s.shared() {
		if !req.retry { // the turn stays its first sending's
			s.turn.Started(req)
		}
		return true
	}
	t := turn.Queued[*outReq]{Prompt: req, Line: out}
	// Room to wait, if it must: in the connection's bound, then the
	// tenant's (all its connections together).
	n := int64(len(out))
	roomConn := c.queuedBytes.Hold(n)
	roomTenant := roomConn && c.ten.queuedBytes.Hold(n)
	if roomConn && !roomTenant {
		c.queuedBytes.Release(n)
	}
	mayWait := roomTenant
	if mayWait {
		req.queued.Store(n)
	}
	now, full := s.turn.Take(t, mayWait)
	if now || full != nil {
		req.releaseQueued() // it runs now, or does not wait
	}
	switch {
	case full == turn.ErrNoRoom && !roomConn:
		if rt.side.take(req) {
			req.failWith(codeBusy, fmt.Sprintf("this connection's prompts waiting for sessions' turns would pass %s; try again when one has run",
				sizeText(c.queuedBytes.Max)), nil)
		}
		return false
	case full == turn.ErrNoRoom:
		if rt.side.take(req) {
			req.failWith(codeBusy, fmt.Sprintf("the prompts of tenant %q waiting for sessions' turns, over all its connections, would pass %s; "+
				"try again when one has run", c.tenant, sizeText(c.ten.queuedBytes.Max)), nil)
		}
		return false
	case full != nil:
		if rt.side.take(req) {
			req.failWith(codeBusy, full.Error(), nil)
		}
		return false
	case !now:
		s.events().promptsQueued(1)
		cr.reqLog().Debug("prompt waits for another client's turn", "session", s.GatewayID)
		return false
	}
	if !req.retry { // a retry's prompt was announced at its first sending
		s.announcePrompt(c, acp.PromptBlocks(m.Payload))
	}
	return true
}

// maxConnQueuedBytes bounds what one connection's prompts waiting for
// sessions' turns may hold, over all its sessions (each session's queue
// has its own bound, turn.MaxQueuedBytes; all the tenant's connections
// together, Limits.TenantQueuedPromptBytes).
const maxConnQueuedBytes = 64 << 20

// sizeText is n bytes as a bound is named in an error: in MiB when whole.
func sizeText(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// startTurn sends a prompt that waited for another client's turn, now
// that turn has ended.
func (s *Session) startTurn(t turn.Queued[*outReq]) {
	t.Prompt.releaseQueued()
	c := t.Prompt.conn
	if c.isClosed() {
		if s.side.untrack(t.Prompt) {
			t.Prompt.end()
		}
		return
	}
	if s.gate.Active() {
		// A load of the session went to the agent while this prompt
		// waited its turn: the gateway does not know the session's model
		// and mode until that load is done (establish.go), and this
		// prompt was checked against what they were before. Unknown is
		// not allowed.
		if s.side.take(t.Prompt) {
			t.Prompt.failWith(jsonrpc.CodeInvalidRequest, "the prompt was not sent: session "+s.GatewayID+
				" was being loaded again when its turn came, and the gateway checks a prompt against the session's model and mode once a load is done; send it again", nil)
		}
		return
	}
	blocks := pathrewrite.PromptBlocks(c.ten.mapper.Load(), t.Line) // the tenant's view of the agent's line
	if refusal := c.refusePrompt(s, blocks, nil); refusal != nil {
		if s.side.take(t.Prompt) {
			t.Prompt.failWith(refusal.Code, refusal.Message, refusal.Data)
		}
		return
	}
	if !t.Prompt.retry { // a retry's turn is its first sending's
		s.announcePrompt(c, blocks)
		s.events().turnStarted(t.Prompt, blocks, nil)
	}
	s.side.restart(t.Prompt) // the prompt timeout counts from now, not from the wait
	ctx, cancel := context.WithTimeout(c.ctx, c.ag.cfg.AcquireTimeout)
	defer cancel()
	if err := s.side.p.Send(ctx, t.Line); err != nil && s.side.take(t.Prompt) {
		t.Prompt.failWith(jsonrpc.CodeInternalError, "the agent cannot take the request: "+pool.ClientReason(err), nil)
	}
}
