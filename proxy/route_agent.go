package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// agentReader routes the messages one agent process writes. It runs on the
// process's read goroutine only, so it reuses its scanner and buffers.
type agentReader struct {
	p       *agentProc
	sc      jsonrpc.Scanner
	msg     jsonrpc.Message
	edits   []jsonrpc.Edit
	resolve jsonrpc.Resolver
}

func newAgentReader(p *agentProc) *agentReader {
	r := &agentReader{p: p}
	r.sc.Methods = knownMethods
	r.resolve = r.specFor
	return r
}

func (r *agentReader) specFor(m *jsonrpc.Message) *jsonrpc.Spec {
	paths := r.p.pool.cfg.mapPaths
	if m.Kind != jsonrpc.KindResponse {
		return paramsSpec(m.Method, paths)
	}
	id, ok := parseAgentID(m.ID)
	if !ok {
		return nil
	}
	r.p.mu.Lock()
	req := r.p.pending[id]
	r.p.mu.Unlock()
	if req == nil {
		return nil
	}
	return resultSpec(req.method, m.IsError, paths)
}

// parseAgentID reads an id the gateway issued to an agent (a positive
// integer).
func parseAgentID(raw []byte) (int64, bool) {
	if len(raw) == 0 || len(raw) > 19 {
		return 0, false
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func (r *agentReader) handle(line []byte) {
	p := r.p
	if err := r.sc.Scan(line, &r.msg, r.resolve); err != nil {
		// An agent that writes non-JSON to stdout breaks the protocol, but
		// one bad line must not take down every session on the process.
		p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("invalid_json").Inc()
		p.log.Warn("agent wrote an invalid message; skipped", "err", err, "bytes", len(line))
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

// handleResponse delivers an agent's answer to the client that asked.
func (r *agentReader) handleResponse(m *jsonrpc.Message) {
	p := r.p
	id, ok := parseAgentID(m.ID)
	if !ok {
		p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("unknown_id").Inc()
		p.log.Warn("agent answered an id the gateway never sent; dropped", "id", truncate(string(m.ID), 64))
		return
	}
	p.mu.Lock()
	req := p.pending[id]
	delete(p.pending, id)
	if req != nil && req.reserved {
		p.reserved--
	}
	// A prompt still counts as running (a drain waits for it) until its
	// answer is in its client's queue.
	answering := req != nil && req.method == mSessionPrompt && req.conn != nil && req.sess != nil
	if answering {
		p.answering++
	}
	p.mu.Unlock()
	if answering {
		defer func() {
			p.mu.Lock()
			p.answering--
			p.mu.Unlock()
		}()
	}
	if req == nil {
		p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("unknown_id").Inc()
		p.log.Warn("agent answered an id the gateway never sent or already answered; dropped", "id", id)
		return
	}
	metrics := p.pool.cfg.metrics
	metrics.RequestDuration.WithLabelValues(methodLabel(req.method)).Observe(since(req.start))
	if req.internal != nil {
		req.internal <- append([]byte(nil), m.Raw...)
		return
	}
	c := req.conn
	if c == nil {
		// The gateway's own request (session/close), answer not needed;
		// the process may have become unused.
		p.pool.changed()
		return
	}
	c.forgetClientReq(req)
	if req.method == mSessionPrompt && req.sess != nil {
		p.promptEnded(req, m)
	}
	edits := append(r.edits[:0], jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: req.clientID})
	var created *Session
	switch {
	case m.IsError:
		if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
			edits = append(edits, r.errorSessionEdit(m, f, req))
		}
		if req.attach != nil {
			p.dropSession(req.attach)
			c.detach(req.attach)
		}
		if req.attach != nil || createsSession(req.method) {
			p.pool.changed() // the reserved slot was given back above
		}
	case createsSession(req.method):
		f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1)
		sid, isStr := "", false
		if ok {
			sid, isStr = m.String(f)
		}
		if !isStr || sid == "" {
			p.pool.changed() // the reserved slot was given back above
			p.log.Warn("agent answered a session-creating request without a sessionId", "method", req.method)
			c.deliver(jsonrpc.AppendError(nil, req.clientID, jsonrpc.CodeInternalError,
				"the agent answered "+req.method+" without a sessionId", nil))
			return
		}
		created = p.addSession(c, sid, req.cwd)
		c.ten.event(c.ag.metrics, "created")
		edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: created.quotedID})
	case req.attach != nil:
		c.ten.event(c.ag.metrics, "loaded")
	case req.method == mSessionList:
		edits = r.listEdits(m, c, edits)
	case (req.method == mSessionClose || req.method == mSessionDelete) && req.sess != nil:
		// The client closed (or deleted) it: the session and its quota slot are free.
		p.dropSession(req.sess)
		c.detach(req.sess)
		c.ten.event(c.ag.metrics, "closed")
		p.pool.changed()
	}
	jsonrpc.SortEdits(edits)
	r.edits = edits
	out := c.ten.scrubHostRoot(jsonrpc.Splice(jsonrpc.GetBuffer(len(m.Raw)+64), m.Raw, edits))
	if created != nil {
		c.attach(created)
	}
	metrics.message(dirAgentToClient, req.method, len(out))
	c.deliver(out)
}

// listEdits rewrites every session in a session/list result for c and drops
// the ones c may not see: those whose cwd is outside c's tenant root (with
// tenants, the agent lists every tenant's sessions).
func (r *agentReader) listEdits(m *jsonrpc.Message, c *Conn, edits []jsonrpc.Edit) []jsonrpc.Edit {
	var elems [][2]int
	var hidden []bool
	mapper := c.ten.mapper.Load() // one mapper for the whole list, even across a reload
	for i, f := range m.Fields {
		if f.Kind != jsonrpc.FieldElement {
			continue
		}
		var sidField, cwdField *jsonrpc.Field
		var dirs []jsonrpc.Field
		for j := i + 1; j < len(m.Fields) && m.Fields[j].Parent == i; j++ {
			switch g := &m.Fields[j]; g.Kind {
			case jsonrpc.FieldSessionID:
				sidField = g
			case jsonrpc.FieldPath:
				if g.Label == "sessions[].cwd" {
					cwdField = g
				} else {
					dirs = append(dirs, *g)
				}
			}
		}
		sid, ok := "", false
		if sidField != nil {
			sid, ok = m.String(*sidField)
		}
		var clientCwd string // the cwd as the client sees it
		if ok && mapper != nil {
			cwd, isStr := "", false
			if cwdField != nil {
				cwd, isStr = m.String(*cwdField)
			}
			var inside bool
			clientCwd, inside = mapper.ToClient(cwd)
			ok = isStr && inside
		}
		elems = append(elems, [2]int{f.Start, f.End})
		hidden = append(hidden, !ok)
		if !ok {
			continue
		}
		edits = append(edits, jsonrpc.Edit{Start: sidField.Start, End: sidField.End,
			Repl: jsonrpc.AppendQuote(nil, c.relay.sealer.Seal(c.scope, sid))})
		if mapper != nil {
			edits = append(edits, jsonrpc.Edit{Start: cwdField.Start, End: cwdField.End, Repl: jsonrpc.AppendQuote(nil, clientCwd)})
			for _, pf := range dirs {
				v, _ := m.String(pf)
				mapped, _ := mapper.ToClient(v) // redacted if outside
				edits = append(edits, jsonrpc.Edit{Start: pf.Start, End: pf.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
			}
		}
	}
	return jsonrpc.DeleteElements(edits, elems, func(i int) bool { return hidden[i] })
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
	case req.attach != nil && sid == req.attach.AgentID:
		repl = req.attach.quotedID
	}
	return jsonrpc.Edit{Start: f.Start, End: f.End, Repl: repl}
}

// handleCall routes an agent's request or notification to the client that
// owns the session (or the request) it is about.
func (r *agentReader) handleCall(m *jsonrpc.Message) {
	p := r.p
	var (
		conn  *Conn
		sess  *Session
		solo  bool // the session is the process's only one
		edits = r.edits[:0]
	)
	if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		sid, _ := m.RawString(f)
		p.mu.Lock()
		sess = p.sessions[string(sid)] // no allocation for a map index
		if sess != nil {
			conn = sess.owner
		}
		solo = len(p.sessions) == 1
		p.mu.Unlock()
		if conn == nil {
			r.orphan(m, "no client holds session "+strconv.Quote(truncate(string(sid), 64)))
			return
		}
		edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: sess.quotedID})
		if t := sess.promptStart.Load(); t != 0 && m.Method == mSessionUpdate && sess.promptStart.CompareAndSwap(t, 0) {
			p.pool.cfg.metrics.FirstUpdate.Observe(time.Since(time.Unix(0, t)).Seconds())
		}
	}
	if f, ok := m.FieldOf(jsonrpc.FieldRequestID, -1); ok {
		raw := m.Bytes(f)
		switch m.Method {
		case mCancelRequest:
			// The agent withdraws one of its own requests to a client.
			p.mu.Lock()
			in := p.inbound[string(raw)]
			var connID int64
			if in != nil {
				conn, connID = in.conn, in.connID
			}
			p.mu.Unlock()
			if in == nil {
				return // already answered
			}
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: strconv.AppendInt(nil, connID, 10)})
		default:
			// Request-scoped elicitation: requestId is a client request the
			// agent is still working on.
			id, ok := parseAgentID(raw)
			p.mu.Lock()
			req := p.pending[id]
			p.mu.Unlock()
			if !ok || req == nil || req.conn == nil {
				r.orphan(m, "the request it refers to is not in flight")
				return
			}
			if conn != nil && conn != req.conn {
				r.orphan(m, "session and request belong to different clients")
				return
			}
			conn = req.conn
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: req.clientID})
		}
	}
	if conn == nil {
		r.orphan(m, "it names no session")
		return
	}
	isReq := m.Kind == jsonrpc.KindRequest
	standIn, err := r.allowAgent(conn, m.Method)
	if err != nil {
		conn.ten.denied(conn.ag.metrics, "agent_method")
		if !isReq {
			p.log.Debug("agent notification refused by policy; dropped", "method", m.Method, "err", err)
			return
		}
		p.log.Info("agent request refused by policy", "method", m.Method, "err", err)
		p.sendCtrl(append(jsonrpc.AppendError(nil, m.ID, jsonrpc.CodeMethodNotFound, err.Error(), nil), '\n'))
		return
	}
	edits, outside := conn.ten.mapToClient(m, edits, isReq && confinedRequest(m.Method))
	if outside != "" {
		// The agent asks the client to act on a file outside the tenant's
		// root: refused here, never shown to the client.
		p.log.Warn("agent asked for a path outside the tenant root; refused", "method", m.Method, "field", outside, "tenant", conn.tenant)
		conn.ten.denied(conn.ag.metrics, "path_outside_root")
		msg := "params." + outside + ": outside the workspace of this session; the gateway refused it"
		p.sendCtrl(append(jsonrpc.AppendError(nil, m.ID, jsonrpc.CodeInvalidParams, msg, nil), '\n'))
		return
	}
	if standIn {
		if isReq {
			r.standInFs(conn, sess, m)
		}
		return
	}
	var in *inReq
	if isReq {
		var err error
		var connID int64
		in, connID, err = conn.trackAgentReq(p, m.ID, m.Method, sess)
		if errors.Is(err, errDuplicateAgentID) {
			// Two requests with one id: the client's answer could not be
			// told apart. The second is refused; the first goes on.
			p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("duplicate_id").Inc()
			p.log.Warn("agent reused the id of a request still in flight; refused", "method", m.Method)
			p.sendCtrl(append(jsonrpc.AppendError(nil, m.ID, jsonrpc.CodeInvalidRequest,
				"request id "+truncate(string(m.ID), 64)+" is already in flight", nil), '\n'))
			return
		}
		if err != nil {
			r.orphan(m, err.Error())
			return
		}
		edits = append(edits, jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: strconv.AppendInt(nil, connID, 10)})
	}
	jsonrpc.SortEdits(edits)
	r.edits = edits
	out := conn.ten.scrubHostRoot(jsonrpc.Splice(jsonrpc.GetBuffer(len(m.Raw)+64), m.Raw, edits))
	p.pool.cfg.metrics.message(dirAgentToClient, m.Method, len(out))
	if in != nil {
		kept := append([]byte(nil), out...) // a take-over sends it again
		p.mu.Lock()
		in.msg = kept
		to := in.pendingTo
		in.pendingTo = nil
		var owner *Conn
		if sess != nil && sess.owner != nil && sess.owner != conn {
			owner = sess.owner
		}
		p.mu.Unlock()
		switch { // taken over meanwhile: the new owner gets it, with an id of its own
		case to != nil:
			jsonrpc.PutBuffer(out)
			to.adopt(in)
		case owner != nil:
			jsonrpc.PutBuffer(out)
			conn.handOver(in, owner)
		default:
			conn.deliver(out)
		}
		return
	}
	// A notification about a session is kept with it for a take-over.
	// Backpressure only when no other client's session shares the process.
	conn.deliverFor(out, sess, solo)
}

// allowAgent decides whether an agent may send method to conn: the tenant's
// policy, and the client capabilities the process was told (an agent that
// asks for what it was not told is refused). standIn reports a file request
// the gateway serves itself: the process was told file access, but this
// client did not offer it or its tenant's policy does not let agents ask
// clients for it.
func (r *agentReader) allowAgent(conn *Conn, method string) (standIn bool, err error) {
	if method != mFsRead && method != mFsWrite && !strings.HasPrefix(method, "terminal/") {
		// The hot path (session/update) takes no lock here.
		return false, conn.ten.policy(conn.ag.name).AllowAgentMethod(method)
	}
	told := r.p.profile()
	if method == mFsRead || method == mFsWrite {
		if method == mFsRead && !told.FsRead || method == mFsWrite && !told.FsWrite {
			return false, fmt.Errorf("%s needs a client capability this agent process was not told of", method)
		}
		conn.mu.Lock()
		offered := method == mFsRead && conn.prof.FsRead || method == mFsWrite && conn.prof.FsWrite
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
	p := r.p
	p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("no_recipient").Inc()
	if m.Kind != jsonrpc.KindRequest {
		p.log.Debug("agent notification has no recipient; dropped", "method", m.Method, "why", why)
		return
	}
	p.log.Info("agent request has no recipient; answered by the gateway", "method", m.Method, "why", why)
	p.answerForClient(m.ID, m.Method, jsonrpc.CodeRequestCancelled, "no client to answer: "+why)
}

// answerForClient answers an agent→client request in the client's place:
// a permission request is cancelled, anything else gets error code.
func (p *agentProc) answerForClient(agentID []byte, method string, code int, why string) {
	var out []byte
	if method == mRequestPerm {
		out = jsonrpc.AppendResult(nil, agentID, []byte(`{"outcome":{"outcome":"cancelled"}}`))
	} else {
		out = jsonrpc.AppendError(nil, agentID, code, why, nil)
	}
	p.sendCtrl(append(out, '\n'))
}

// addSession registers a session the agent now serves for c; cwd is its
// working directory as the agent got it. The process retires once it has
// been given pool.recycle_after_sessions sessions.
func (p *agentProc) addSession(c *Conn, agentSID, cwd string) *Session {
	gwID := c.relay.sealer.Seal(c.scope, agentSID)
	s := &Session{
		GatewayID: gwID,
		quotedID:  jsonrpc.AppendQuote(nil, gwID),
		AgentID:   agentSID,
		cwd:       cwd,
		proc:      p,
		owner:     c,
	}
	p.mu.Lock()
	if old := p.sessions[agentSID]; old != nil && old.owner != nil && old.owner != c {
		// Another connection held it (a reconnect before the old
		// connection timed out): the newest load wins.
		prev := old.owner
		old.owner = nil
		p.mu.Unlock()
		prev.detach(old)
		p.mu.Lock()
	}
	p.sessions[agentSID] = s
	p.served++
	due := p.pool.cfg.RecycleAfterSessions > 0 && p.served >= p.pool.cfg.RecycleAfterSessions
	p.mu.Unlock()
	if due {
		p.retire("sessions")
	}
	return s
}

// dropSession forgets a session whose load or resume failed.
func (p *agentProc) dropSession(s *Session) {
	p.mu.Lock()
	if p.sessions[s.AgentID] == s {
		delete(p.sessions, s.AgentID)
	}
	s.owner = nil
	p.mu.Unlock()
}
