package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/pathrewrite"
)

// agentReader routes the messages one agent process writes. It runs on the
// process's read goroutine only, so it reuses its scanner and buffers.
type agentReader struct {
	l   *procSide
	sc  jsonrpc.Scanner
	msg jsonrpc.Message
	// ids, idMsg: the second scan of an update that names sessions inside
	// it (child.go).
	ids     jsonrpc.Scanner
	idMsg   jsonrpc.Message
	edits   []jsonrpc.Edit
	resolve jsonrpc.Resolver
	event   observe.Event // what observers hear of a session/update, reused
	// A model switch an answer needs (answerEdits), for the session swSess.
	sw     *models.Switch
	swSess *Session
	// swGated: the session whose gate the request's end would have opened;
	// the switch's end opens it instead (establish.go).
	swGated *Session
}

func newAgentReader(l *procSide) *agentReader {
	r := &agentReader{l: l}
	r.sc.Methods = acp.Methods
	r.ids.Methods = acp.Methods
	r.resolve = r.specFor
	return r
}

func (r *agentReader) specFor(m *jsonrpc.Message) *jsonrpc.Spec {
	paths := r.l.ag.mapPaths
	if m.Kind != jsonrpc.KindResponse {
		return acp.ParamsSpec(m.Method, paths)
	}
	id, ok := acp.ParseAgentID(m.ID)
	if !ok {
		return nil
	}
	r.l.mu.Lock()
	req := r.l.pending[id]
	late := req == nil && r.l.late[id] != nil
	r.l.mu.Unlock()
	switch {
	case late: // a prompt's answer after the gateway ended its turn (lateAnswer)
		return acp.ResultSpec(acp.SessionPrompt, m.IsError, paths)
	case req == nil:
		return nil
	}
	return acp.ResultSpec(req.method, m.IsError, paths)
}

func (r *agentReader) handle(line []byte) {
	if err := r.sc.Scan(line, &r.msg, r.resolve); err != nil {
		// An agent that writes non-JSON to stdout breaks the protocol, but
		// one bad line must not take down every session on the process.
		r.l.ag.metrics.AgentProtocolErrors.WithLabelValues("invalid_json").Inc()
		r.l.p.Log().Warn("agent wrote an invalid message; skipped", "err", err, "bytes", len(line))
		return
	}
	m := &r.msg
	switch m.Kind {
	case jsonrpc.KindResponse:
		r.handleResponse(m)
	default:
		r.handleCall(m)
	}
}

// protocolError counts and logs agent output the gateway could not relay.
func (r *agentReader) protocolError(kind, msg string, args ...any) {
	r.l.ag.metrics.AgentProtocolErrors.WithLabelValues(kind).Inc()
	r.l.p.Log().Warn(msg, args...)
}

// handleResponse delivers an agent's answer to the client that asked.
func (r *agentReader) handleResponse(m *jsonrpc.Message) {
	l := r.l
	id, ok := acp.ParseAgentID(m.ID)
	if !ok {
		r.protocolError("unknown_id", "agent answered an id the gateway never sent; dropped", "id", truncate(string(m.ID), 64))
		return
	}
	if req, late := l.acknowledge(id, m); req != nil { // v2: the turn goes on
		if late { // a retry the agent ran again: its turn counts from here
			req.sess.events().turnStarted(req, nil, nil)
		}
		r.deliverAck(m, req)
		return
	}
	req := l.takeAnswered(id)
	if req == nil && r.lateAnswer(id, m) {
		return
	}
	if req == nil {
		r.protocolError("unknown_id", "agent answered an id the gateway never sent or already answered; dropped", "id", id)
		return
	}
	if req.method == acp.SessionPrompt && req.conn != nil && req.sess != nil {
		// A prompt still counts as running (a drain waits for it) until
		// its answer is in its client's queue.
		defer l.answered(req.conn.relay)
	}
	tracing.ObserveLatency(l.ag.metrics.RequestDuration.WithLabelValues(metrics.MethodLabel(req.method)), time.Since(req.start).Seconds(), req.span)
	c := req.conn
	if c == nil {
		return // the gateway's own request (session/close): answer not needed
	}
	if req.model != nil { // the agent's answer to a model switch (switchModel)
		r.switched(m, req)
		return
	}
	// A gate the request closed opens once its answer is out, or once the
	// switch the answer needs is done (switchModel).
	gated := req.hold.takeGated()
	defer func() { gated.ungate(c) }()
	edits, created, ok := r.answerEdits(m, req)
	if r.sw != nil {
		r.swGated, gated = gated, nil
	}
	if created != nil {
		c.index(created) // counted before the request's tenant slot is given back
	}
	req.answerSpan(m, created)
	if req.method == acp.SessionPrompt && req.sess != nil {
		promptAnswered(req, m)
		defer req.startNext() // once this answer is out
	}
	req.end()
	if req.method == acp.SessionPrompt && req.sess != nil {
		promptEnded(req, m) // after end: a detached owner left with nothing ends
	}
	if !ok {
		return
	}
	if e, ok := req.whyEdit(m.Raw, m.PayloadPos[0], m.PayloadPos[1]); ok && !m.IsError {
		edits = append(edits, e)
	}
	jsonrpc.SortEdits(edits)
	r.edits = edits
	out := pathrewrite.ScrubHostRoot(c.ten.mapper.Load(), jsonrpc.Splice(jsonrpc.GetBuffer(len(m.Raw)+64), m.Raw, edits))
	l.ag.metrics.Message(metrics.AgentToClient, req.method, len(out))
	if r.switchModel(req, out) {
		return // delivered once the agent has switched the session's model
	}
	c.deliverFor(out, nil, Facts{ID: req.clientID}, false)
}

// promptAnswered ends the turn of req, a prompt of a session the agent
// answered with m: its usage counted, the session's other clients told (the
// next turn is announced after), and the prompt waiting for the turn held
// until the answer is out (req.startNext).
func promptAnswered(req *outReq, m *jsonrpc.Message) {
	meterTurn(req, m)
	stop := "error"
	if !m.IsError {
		stop, _ = acp.StopReason(m)
	}
	if !req.retry { // a retry's answer ends no turn: its first sending's does
		req.sess.turnComplete(req.conn, stop)
	}
	req.holdNext = true
}

// switchModel sends the agent the model switch the answer out needs (r.sw,
// from answerEdits), as a request of the gateway's for the client: out is
// delivered once the agent has switched (switched); a failure ends the
// session (hold.loaded).
func (r *agentReader) switchModel(req *outReq, out []byte) bool {
	sw, s, gated := r.sw, r.swSess, r.swGated
	if sw == nil {
		return false
	}
	r.sw, r.swSess, r.swGated = nil, nil, nil
	sw.Hold(out)
	r.sendSwitch(req.conn, req.clientID, s, sw, gated)
	return true
}

// sendSwitch sends sw, a switch of s's model or mode for c's request
// clientID, whose answer it holds; its end opens the gate gated.
func (r *agentReader) sendSwitch(c *Conn, clientID []byte, s *Session, sw *models.Switch, gated *Session) {
	next := &outReq{conn: c, clientID: clientID, method: sw.Method(), sess: s, start: time.Now(), hold: &hold{conn: c, loaded: s, gated: gated}, model: sw}
	if r.l.track(next) {
		r.l.p.SendCtrl(sw.Request(next.agentID))
	} else {
		next.failWith(jsonrpc.CodeInternalError, "the agent process exited; try again", nil)
	}
}

// switched delivers the answer a switch held (switchModel) once the agent
// has switched, or makes the next switch it needs (a mode's after a
// model's); the agent refusing, the session ends and the client gets why.
func (r *agentReader) switched(m *jsonrpc.Message, req *outReq) {
	if err := req.model.Done(m, &req.sess.models); err != nil {
		req.sess.end(endRefused, req.conn)
		req.failWith(jsonrpc.CodeInvalidParams, "session refused: "+err.Error(), nil)
		return
	}
	req.hold.keepLoaded()
	gated := req.hold.takeGated()
	req.end()
	if next := req.model.Next(); next != nil {
		r.sendSwitch(req.conn, req.clientID, req.sess, next, gated)
		return
	}
	req.conn.deliverFor(req.model.Held(), nil, Facts{ID: req.clientID}, false)
	gated.ungate(req.conn) // after the answer: what it held is answered after it
}

// takeAnswered takes the request an answer is for out of the table; a
// prompt's answer counts as running until it is delivered (answered).
func (l *procSide) takeAnswered(id int64) *outReq {
	l.mu.Lock()
	defer l.mu.Unlock()
	req := l.pending[id]
	delete(l.pending, id)
	if req != nil && req.method == acp.SessionPrompt && req.conn != nil && req.sess != nil {
		l.answering++
	}
	return req
}

// answered ends what takeAnswered counted.
func (l *procSide) answered(r *Relay) {
	l.mu.Lock()
	l.answering--
	l.mu.Unlock()
	r.promptsChanged()
}

// answerEdits settles what the answer means for the request's session and
// returns the edits that make the answer the client's. created is a new
// session to attach once the answer is ready. ok false: the client has been
// answered otherwise.
func (r *agentReader) answerEdits(m *jsonrpc.Message, req *outReq) (edits []jsonrpc.Edit, created *Session, ok bool) {
	c := req.conn
	edits = append(r.edits[:0], jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: req.clientID})
	s := req.sess // the session the answer is about (its model selectors)
	switch {
	case m.IsError:
		if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
			edits = append(edits, r.errorSessionEdit(m, f, req))
		}
	case acp.CreatesSession(req.method):
		e, cs, ok := r.created(m, req)
		if !ok {
			return nil, nil, false
		}
		edits, created, s = append(edits, e), cs, cs
	case req.hold.loaded != nil:
		s = req.hold.loaded
		if s.attachable {
			s.state.NoteResult(m.Payload)
		}
		req.hold.keepLoaded()
		s.events().sessionEvent(c, observe.SessionLoaded, "")
	case req.method == acp.SessionList:
		edits = r.listEdits(m, c, edits)
	case (req.method == acp.SessionClose || req.method == acp.SessionDelete) && req.sess != nil:
		// The client closed (or deleted) it, for every client: the session
		// and its quota slot are free.
		req.sess.end(endClosed, c)
	}
	if s != nil { // its model selectors (package models); a switch is made before it is delivered
		var err error
		establishes := acp.CreatesSession(req.method) || acp.LoadsSession(req.method)
		if edits, r.sw, err = s.models.Answer(m, models.ListsOf(c.ten.policy(c.ag.name)), establishes, s.AgentID, edits); err != nil {
			s.end(endRefused, c)
			c.Deliver(jsonrpc.AppendError(nil, req.clientID, jsonrpc.CodeInvalidParams, "session refused: "+err.Error(), nil))
			return nil, nil, false
		}
		r.swSess = s
	}
	return edits, created, true
}

// created registers the session a session-creating request made; it takes
// the request's process slot. Without a sessionId the client gets an error.
func (r *agentReader) created(m *jsonrpc.Message, req *outReq) (jsonrpc.Edit, *Session, bool) {
	c := req.conn
	f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1)
	sid, isStr := "", false
	if ok {
		sid, isStr = m.String(f)
	}
	if !isStr || sid == "" {
		tracing.WithTrace(r.l.p.Log(), req.span).Warn("agent answered a session-creating request without a sessionId", "method", req.method)
		c.Deliver(jsonrpc.AppendError(nil, req.clientID, jsonrpc.CodeInternalError,
			"the agent answered "+req.method+" without a sessionId", nil))
		return jsonrpc.Edit{}, nil, false
	}
	s, known := r.l.addCreated(c, sid, req.cwd, req.hold)
	if known != "" {
		// The agent named a session it already had (claude-code-acp does
		// for _meta.claudeCode.options.resume): sealing it for the caller
		// would hand it another's session, or eject its holder. The agent's
		// session stays as it is; the process slot goes back with the hold.
		// The client is not told which (whose it is, or where it is live).
		tracing.WithTrace(c.log, req.span).Warn("agent answered a session-creating request with a session the gateway already knows; refused",
			"method", req.method, "known", known, "agent_session", truncate(sid, 128))
		c.Deliver(jsonrpc.AppendError(nil, req.clientID, jsonrpc.CodeInternalError,
			"session refused: the agent answered "+req.method+" with an existing session; a new session must be new, nothing was created", nil))
		return jsonrpc.Edit{}, nil, false
	}
	if s.attachable {
		s.state.NoteResult(m.Payload)
	}
	s.events().sessionEvent(c, observe.SessionCreated, "")
	return jsonrpc.Edit{Start: f.Start, End: f.End, Repl: s.quotedID}, s, true
}

// listEdits rewrites every session in a session/list result for c and drops
// the ones c may not see (pathrewrite.List): those whose cwd is outside c's
// tenant root (with tenants, the agent lists every tenant's sessions), and
// those its tenant's sharing keeps from c's subject. Each is sealed with
// the subject that made it, as far as this gateway knows (access.Owners).
func (r *agentReader) listEdits(m *jsonrpc.Message, c *Conn, edits []jsonrpc.Edit) []jsonrpc.Edit {
	sharing := c.ten.sharing() // one for the whole list, even across a reload
	return pathrewrite.List(c.ten.mapper.Load(), m, edits, func(sid string) (string, bool) {
		owner := c.relay.owners.Of(c.scope, sid)
		if sharing.Decide(c.subject, owner, access.List) == access.Refused {
			return "", false
		}
		return c.relay.sealer.Seal(c.scope, owner, sid), true
	})
}

// errorSessionEdit rewrites error.data.sessionId (v2 -32002): it becomes
// the client's ID only when it is the session the request addressed.
// Anything else is redacted: sealing an arbitrary agent session ID for the
// asking tenant would hand it a loadable ID for a session it never held.
func (r *agentReader) errorSessionEdit(m *jsonrpc.Message, f jsonrpc.Field, req *outReq) jsonrpc.Edit {
	sid, ok := m.String(f)
	repl := []byte(`""`)
	switch {
	case !ok:
	case req.sess != nil && sid == req.sess.AgentID:
		repl = req.sess.quotedID
	case req.hold != nil && req.hold.loaded != nil && sid == req.hold.loaded.AgentID:
		repl = req.hold.loaded.quotedID
	}
	return jsonrpc.Edit{Start: f.Start, End: f.End, Repl: repl}
}

// handleCall routes an agent's request or notification to the client that
// owns the session (or the request) it is about: it finds the recipient,
// applies the tenant's policy and root, then forwards it.
func (r *agentReader) handleCall(m *jsonrpc.Message) {
	rc, ok := r.recipient(m, r.edits[:0])
	if !ok {
		return
	}
	var idled []*outReq  // v2 prompts whose turn this update ends
	isChildNews := false // a subagent_update
	if m.Method == acp.SessionUpdate && rc.sess != nil {
		kind := acp.UpdateKind(m)
		isChildNews = string(kind) == "subagent_update"
		if isChildNews && !rc.conn.routesChildren() {
			r.l.p.Log().Debug("subagent_update for a v1 client that did not offer clientCapabilities.subagents; dropped", "session", rc.sess.GatewayID)
			return
		}
		rc.sess.events().updated(m, kind, &r.event)
		rc.edits = rc.sess.models.Edits(m, models.ListsOf(rc.conn.ten.policy(rc.conn.ag.name)), rc.edits)
		rc.edits = r.childEdits(m, rc.sess, rc.conn, kind, rc.edits)
		if string(kind) == "state_update" {
			idled, rc.edits = r.idleTurns(m, rc.sess, rc.edits)
			defer r.idleDelivered(idled)
		}
	}
	edits, ok := r.gate(m, rc)
	if !ok {
		return
	}
	if m.Kind == jsonrpc.KindRequest {
		if m.Method == acp.RequestPermission && rc.sess != nil && r.decided(m, rc.sess, edits) {
			return
		}
		if s := rc.sess; s != nil && s.shared() {
			s.fan.Lock() // an attach sees the request whole, or not at all
			defer s.fan.Unlock()
		}
		r.forwardRequest(m, rc, edits)
		return
	}
	out := r.splice(m, rc.conn, edits)
	// A notification about a session is kept with it for a take-over.
	// Backpressure only when no other client's session shares the process.
	f := Facts{Method: m.Method}
	if rc.sess == nil {
		rc.conn.deliverFor(out, nil, f, rc.solo)
		return
	}
	f.SessionID = rc.sess.streamID()
	if root := rc.sess.root(); root != rc.sess || isChildNews { // a child's: its parent's clients get it
		root.deliverAllOf(rc.conn, out, f, rc.solo, true)
		return
	}
	rc.sess.deliverAll(rc.conn, out, f, rc.solo)
}

// recipient is who an agent message goes to, and the edits so far.
type recipient struct {
	conn  *Conn
	sess  *Session
	solo  bool // the session is the process's only one
	edits []jsonrpc.Edit
}

// recipient finds the client of m by its sessionId and requestId. A
// message no client can take is orphaned.
func (r *agentReader) recipient(m *jsonrpc.Message, edits []jsonrpc.Edit) (recipient, bool) {
	rc := recipient{edits: edits}
	if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		sid, _ := m.RawString(f)
		var n int
		rc.sess, n = r.l.session(sid)
		rc.solo = n == 1
		if rc.sess != nil {
			rc.conn = rc.sess.primary(m.Kind == jsonrpc.KindRequest)
		}
		if rc.conn == nil {
			r.orphan(m, "no client holds session "+strconv.Quote(truncate(string(sid), 64)))
			return rc, false
		}
		rc.edits = append(rc.edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: rc.sess.quotedID})
	}
	if f, ok := m.FieldOf(jsonrpc.FieldRequestID, -1); ok && !r.requestRecipient(m, f, &rc) {
		return rc, false
	}
	if rc.conn == nil {
		r.orphan(m, "it names no session")
		return rc, false
	}
	return rc, true
}

// requestRecipient resolves params.requestId: the agent withdrawing one of
// its own requests to a client ($/cancel_request), or request-scoped
// elicitation about a client request the agent is still working on.
func (r *agentReader) requestRecipient(m *jsonrpc.Message, f jsonrpc.Field, rc *recipient) bool {
	raw := m.Bytes(f)
	l := r.l
	if m.Method == acp.CancelRequest {
		in := l.findInbound(raw)
		var connID int64
		var copies []inCopy
		if in != nil {
			in.mu.Lock()
			rc.conn, connID = in.conn, in.connID
			copies, in.copies = in.copies, nil
			in.mu.Unlock()
		}
		if len(copies) > 0 { // the agent withdrew it: from every client, after their copy
			in.sess.fan.Lock()
			for _, cp := range copies {
				cp.conn.reqs.Withdraw(cp.id)
				cp.conn.Deliver(acp.CancelRequestMsg(cp.id))
			}
			in.sess.fan.Unlock()
		}
		if in == nil || rc.conn == nil {
			return false // already answered
		}
		rc.edits = append(rc.edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: strconv.AppendInt(nil, connID, 10)})
		return true
	}
	id, ok := acp.ParseAgentID(raw)
	l.mu.Lock()
	req := l.pending[id]
	l.mu.Unlock()
	switch {
	case !ok || req == nil || req.conn == nil:
		r.orphan(m, "the request it refers to is not in flight")
		return false
	case rc.conn != nil && rc.conn != req.conn:
		r.orphan(m, "session and request belong to different clients")
		return false
	}
	rc.conn = req.conn
	rc.edits = append(rc.edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: req.clientID})
	return true
}

// gate applies the tenant's policy and root to an agent message: a method
// the client may not be sent, or a request to act on a path outside the
// root, is refused to the agent; a file request the gateway stands in for
// is served. ok reports whether m goes on to the client.
func (r *agentReader) gate(m *jsonrpc.Message, rc recipient) (edits []jsonrpc.Edit, ok bool) {
	conn, isReq := rc.conn, m.Kind == jsonrpc.KindRequest
	standIn, err := r.allowAgent(conn, m.Method)
	if err != nil {
		log := rc.sess.turnLog(r.l.p.Log())
		conn.denied("agent_method", m.Method)
		if !isReq {
			log.Debug("agent notification refused by policy; dropped", "method", m.Method, "err", err)
			return nil, false
		}
		log.Info("agent request refused by policy", "method", m.Method, "err", err)
		r.refuse(m, jsonrpc.CodeMethodNotFound, err.Error())
		if m.Method == acp.RequestPermission && rc.sess != nil {
			rc.sess.events().permissionRefused(m.Raw)
		}
		return nil, false
	}
	edits, outside := pathrewrite.ToClient(conn.ten.mapper.Load(), m, rc.edits, isReq && acp.Confined(m.Method))
	if outside != "" {
		// The agent asks the client to act on a file outside the tenant's
		// root: refused here, never shown to the client.
		rc.sess.turnLog(r.l.p.Log()).Warn("agent asked for a path outside the tenant root; refused", "method", m.Method, "field", outside, "tenant", conn.tenant)
		conn.denied("path_outside_root", m.Method)
		r.refuse(m, jsonrpc.CodeInvalidParams, "params."+outside+": outside the workspace of this session; the gateway refused it")
		return nil, false
	}
	if standIn {
		if isReq {
			r.standInFs(conn, rc.sess, m)
		}
		return nil, false
	}
	return edits, true
}

// decided lets the agent's deciders answer m, a permission request about
// s, in the clients' place (edits: the tenant's view of its paths): the
// agent gets the decision, the session's members hear how it was settled,
// and no client is asked. false: no decider decided.
func (r *agentReader) decided(m *jsonrpc.Message, s *Session, edits []jsonrpc.Edit) bool {
	if !r.l.ag.dec.DecidesPermissions() {
		return false
	}
	es := slices.Clone(edits)
	jsonrpc.SortEdits(es)
	view := pathrewrite.ScrubHostRoot(s.ten.mapper.Load(), jsonrpc.Splice(nil, m.Raw, es)) // as clients would see it
	d, ok := s.events().permissionDecided(view)
	if !ok {
		return false
	}
	result := append(append([]byte(`{"outcome":`), d.Outcome...), '}')
	in := &inReq{side: r.l, agentID: m.ID, method: m.Method, start: time.Now(), sess: s, msg: view}
	in.settle(settlement{by: d.By, line: append(jsonrpc.AppendResult(nil, m.ID, result), '\n'),
		outcome: d.Outcome, rule: d.Rule, decide: d.Decide})
	s.turnLog(r.l.p.Log()).Info("permission request decided at the gateway", "by", d.By, "rule", d.Rule)
	return true
}

// refuse answers an agent request with an error in the client's place.
func (r *agentReader) refuse(m *jsonrpc.Message, code int, msg string) {
	r.l.p.SendCtrl(append(jsonrpc.AppendError(nil, m.ID, code, msg, nil), '\n'))
}

// splice makes the message the client gets.
func (r *agentReader) splice(m *jsonrpc.Message, conn *Conn, edits []jsonrpc.Edit) []byte {
	jsonrpc.SortEdits(edits)
	r.edits = edits
	out := pathrewrite.ScrubHostRoot(conn.ten.mapper.Load(), jsonrpc.Splice(jsonrpc.GetBuffer(len(m.Raw)+64), m.Raw, edits))
	r.l.ag.metrics.Message(metrics.AgentToClient, m.Method, len(out))
	return out
}

// forwardRequest tracks an agent request for its client, with an id of the
// client's, and sends it. A session taken over meanwhile sends it to the
// new owner.
func (r *agentReader) forwardRequest(m *jsonrpc.Message, rc recipient, edits []jsonrpc.Edit) {
	l, conn := r.l, rc.conn
	span := conn.relay.agentReqSpan(rc.sess, m)
	in, connID, err := conn.trackAgentReq(l, m.ID, m.Method, rc.sess, span)
	if err != nil && span != nil {
		tracing.Error(span, jsonrpc.CodeInternalError, err.Error())
		span.End()
	}
	if errors.Is(err, errDuplicateAgentID) {
		// Two requests with one id: the client's answer could not be
		// told apart. The second is refused; the first goes on.
		r.protocolError("duplicate_id", "agent reused the id of a request still in flight; refused", "method", m.Method)
		r.refuse(m, jsonrpc.CodeInvalidRequest, "request id "+truncate(string(m.ID), 64)+" is already in flight")
		return
	}
	if err != nil {
		r.orphan(m, err.Error())
		return
	}
	edits = append(edits, jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: strconv.AppendInt(nil, connID, 10)})
	out := r.splice(m, conn, edits)
	kept := append([]byte(nil), out...) // a take-over sends it again
	if m.Method == acp.RequestPermission && rc.sess != nil {
		// Observers hear it was asked before any client can answer it.
		rc.sess.events().permissionRequested(conn, kept)
	}
	in.mu.Lock()
	in.msg = kept
	to := in.pendingTo
	in.pendingTo = nil
	in.mu.Unlock()
	var owner *Conn
	if rc.sess != nil {
		if o := rc.sess.Owner(); o != nil && o != conn {
			owner = o
		}
	}
	switch { // taken over meanwhile: the new owner gets it, with an id of its own
	case to != nil:
		jsonrpc.PutBuffer(out)
		in.adoptBy(to)
	case owner != nil:
		jsonrpc.PutBuffer(out)
		in.handOver(conn, owner)
	case rc.sess != nil && rc.sess.parent != nil: // a child's: on its parent's stream
		conn.deliverFor(out, nil, Facts{ID: strconv.AppendInt(nil, connID, 10), Method: m.Method, SessionID: rc.sess.streamID()}, false)
	default:
		conn.Deliver(out)
	}
	if rc.sess != nil && (m.Method == acp.RequestPermission || m.Method == acp.ElicitationCreate) {
		// Every other client of the session that may answer gets it too.
		for _, mem := range rc.sess.clientList() {
			if !mem.readOnly && !mem.catching && mem.conn != conn { // one catching up gets it after its replay
				in.copyTo(mem.conn)
			}
		}
	}
}

// allowAgent decides whether an agent may send method to conn: the tenant's
// policy, and the client capabilities the process was told (an agent that
// asks for what it was not told is refused). standIn reports a file request
// the gateway serves itself: the process was told file access, but this
// client did not offer it or its tenant's policy does not let agents ask
// clients for it.
func (r *agentReader) allowAgent(conn *Conn, method string) (standIn bool, err error) {
	if method != acp.FsRead && method != acp.FsWrite && !strings.HasPrefix(method, "terminal/") {
		// The hot path (session/update) takes no lock here.
		return false, conn.ten.policy(conn.ag.name).AllowAgentMethod(method)
	}
	told := r.l.p.Profile()
	if method == acp.FsRead || method == acp.FsWrite {
		if method == acp.FsRead && !told.FsRead || method == acp.FsWrite && !told.FsWrite {
			return false, fmt.Errorf("%s needs a client capability this agent process was not told of", method)
		}
		conn.mu.Lock()
		offered := method == acp.FsRead && conn.prof.FsRead || method == acp.FsWrite && conn.prof.FsWrite
		conn.mu.Unlock()
		return !offered || conn.ten.policy(conn.ag.name).AllowAgentMethod(method) != nil, nil
	}
	if err := conn.ten.policy(conn.ag.name).AllowAgentMethod(method); err != nil {
		return false, err
	}
	if !told.Terminal {
		return false, fmt.Errorf("%s needs a client capability this client did not offer", method)
	}
	return false, nil
}

// orphan handles an agent message no client can take: a request is answered
// on the client's behalf so the agent never waits forever; a notification is
// dropped.
func (r *agentReader) orphan(m *jsonrpc.Message, why string) {
	r.l.ag.metrics.AgentProtocolErrors.WithLabelValues("no_recipient").Inc()
	if m.Kind != jsonrpc.KindRequest {
		r.l.p.Log().Debug("agent notification has no recipient; dropped", "method", m.Method, "why", why)
		return
	}
	r.l.p.Log().Info("agent request has no recipient; answered by the gateway", "method", m.Method, "why", why)
	in := &inReq{side: r.l, agentID: m.ID, method: m.Method, start: time.Now()}
	in.settle(inPlace(byNoRecipient, jsonrpc.CodeRequestCancelled, "no client to answer: "+why))
}
