package proxy

import (
	"encoding/json"
	"fmt"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/observe"
)

// Error codes of session/attach and of what an attached client may not do.
const (
	codeNotAuthorised = -32003 // the tenant's sharing policy refuses the attach
	codeReadOnly      = -32007 // a read-only client tried to write
)

// handleAttach serves session/attach: c becomes one more client of a live
// session its tenant's sharing policy lets it join. It gets, in order, the
// history the policy asks for, the result, the session's pending permission
// requests (re-issued with ids of its own, unless it is read-only), then
// live traffic: the fan lock makes each message reach it exactly once.
func (cr *clientReader) handleAttach(m *jsonrpc.Message) {
	c := cr.c
	if m.Kind != jsonrpc.KindRequest {
		return // a notification can get no answer: dropped
	}
	metrics := c.relay.metrics
	var p multiclient.AttachParams
	if err := json.Unmarshal(m.Payload, &p); err != nil || p.SessionID == "" {
		metrics.Attaches.WithLabelValues("invalid").Inc()
		cr.answerError(m.ID, jsonrpc.CodeInvalidParams, "session/attach needs params.sessionId (a string)", nil)
		return
	}
	cr.spanSession(p.SessionID)
	if err := p.Check(); err != nil {
		metrics.Attaches.WithLabelValues("invalid").Inc()
		cr.answerError(m.ID, jsonrpc.CodeInvalidParams, err.Error(), nil)
		return
	}
	s, readOnly, ok := cr.mayAttach(m, p)
	if !ok {
		return
	}
	if mem := s.memberOf(c); mem != nil {
		// Attached already (a page reloaded on a resumed connection): the
		// replay and result again, nothing added.
		if !cr.joinSession(m, s, mem, p.HistoryPolicy, false) {
			c.detach(s)
		}
		return
	}
	mem := &member{conn: c, id: p.ClientID, readOnly: readOnly}
	if mem.id == "" {
		mem.id = multiclient.NewClientID()
	}
	if p.ClientInfo != nil {
		mem.info = *p.ClientInfo
	} else {
		mem.info = connPeer(c).Info()
	}
	c.attach(s) // routed to c from now on (and counted once for its tenant)
	if !cr.joinSession(m, s, mem, p.HistoryPolicy, true) {
		c.detach(s)
		return
	}
	metrics.Attaches.WithLabelValues("ok").Inc()
	metrics.AttachedClients.Inc()
	s.emit(&observe.Event{Kind: observe.SessionAttached, Client: c.client(), ClientID: mem.id, ReadOnly: readOnly, History: p.HistoryPolicy})
	if c.isClosed() { // closed meanwhile: Close may not have seen the member
		c.leaveSession(s, false)
		return
	}
	cr.reqLog().Info("attached to a session", "session", s.GatewayID, "client_id", mem.id, "read_only", readOnly, "history", p.HistoryPolicy)
}

// mayAttach finds the live session p names and decides whether c may
// attach to it, and read-only or not. Another tenant's session fails as an
// unknown one does.
func (cr *clientReader) mayAttach(m *jsonrpc.Message, p multiclient.AttachParams) (s *Session, readOnly, ok bool) {
	c := cr.c
	metrics := c.relay.metrics
	agentSID, err := c.relay.sealer.Open(c.scope, p.SessionID)
	if err != nil {
		metrics.Attaches.WithLabelValues("not_found").Inc()
		cr.notFound(m, p.SessionID, false)
		return nil, false, false
	}
	s = c.ag.heldSession(agentSID)
	if s == nil || s.ten != c.ten || s.isLost() {
		metrics.Attaches.WithLabelValues("not_found").Inc()
		cr.answerError(m.ID, jsonrpc.CodeNotFound, "session not found: it is not live on this gateway replica "+
			"(it has ended, or its clients are connected to another replica: attach through the replica that serves it)",
			acp.SessionIDObject(p.SessionID))
		return nil, false, false
	}
	sharing := c.ten.sharing()
	other := c.subject != s.subject
	switch {
	case sharing.Attach == SharingOff:
		return cr.refuseAttach(m, "attach is off for this tenant")
	case other && sharing.Attach != SharingTenant:
		return cr.refuseAttach(m, "the session belongs to another subject")
	}
	c.mu.Lock()
	held := c.sessions[p.SessionID] == s
	c.mu.Unlock()
	if held && s.memberOf(c) == nil {
		metrics.Attaches.WithLabelValues("invalid").Inc()
		cr.answerError(m.ID, jsonrpc.CodeInvalidRequest, "this connection already holds the session", acp.SessionIDObject(p.SessionID))
		return nil, false, false
	}
	return s, p.Meta.Acpgate.ReadOnly || other && sharing.ReadOnlyForOthers, true
}

func (cr *clientReader) refuseAttach(m *jsonrpc.Message, why string) (*Session, bool, bool) {
	c := cr.c
	c.relay.metrics.Attaches.WithLabelValues("refused").Inc()
	c.denied("attach", m.Method)
	cr.reqLog().Info("session/attach refused", "why", why)
	cr.answerError(m.ID, codeNotAuthorised, "not authorised to attach to this session: "+why, nil)
	return nil, false, false
}

// joinSession adds mem to s (unless add is false: a re-attach) and sends c
// the replay, the result, then what came meanwhile and the pending
// requests; false if it answered m with an error. The replay goes out
// without the session's fan lock (a slow client must not hold the agent's
// reader up): what the session sends meanwhile waits in the member's
// backlog, so each message reaches c once and in order.
func (cr *clientReader) joinSession(m *jsonrpc.Message, s *Session, mem *member, policy string, add bool) bool {
	c := cr.c
	s.fan.Lock()
	ok, full := true, false
	if add {
		ok, full = s.addMember(mem, c.relay.maxClients())
	}
	if !ok || full {
		s.fan.Unlock()
		if full {
			c.relay.metrics.Attaches.WithLabelValues("full").Inc()
			cr.answerError(m.ID, codeBusy, fmt.Sprintf("the session has reached sessions.max_clients (%d) clients", c.relay.maxClients()), nil)
		} else {
			c.relay.metrics.Attaches.WithLabelValues("not_found").Inc()
			cr.notFound(m, s.GatewayID, false)
		}
		return false
	}
	mem.catching = true
	var replay [][]byte
	replayed, trimmed := 0, false
	if policy == "full" && s.history != nil {
		s.history.Each(func(msg []byte) { replay = append(replay, clone(msg)) })
		replayed, trimmed = s.history.Kept(), s.history.Trimmed()
	}
	s.fan.Unlock()
	f := Facts{Method: acp.SessionUpdate, SessionID: s.GatewayID}
	for _, msg := range replay {
		c.deliverMember(msg, s, f, true) // may wait for this client to read
	}
	s.fan.Lock()
	if mem.overrun { // the session outran the replay: what c missed is gone
		e := cr.overran(m, s, mem, add)
		s.fan.Unlock()
		e.run()      // no client left: the session ends, off the fan lock
		return false // the caller lets go of s
	}
	defer s.fan.Unlock()
	if add { // the others know of c before c can act
		s.toMembersLocked(multiclient.Presence("client_connected", mem.peer()), c)
	}
	c.deliver(jsonrpc.AppendResult(nil, m.ID, s.attachResult(mem, policy, replayed, trimmed)))
	for _, b := range mem.backlog {
		c.deliverMember(b.msg, s, b.f, false)
	}
	mem.backlog, mem.backlogB, mem.catching = nil, 0, false
	if !mem.readOnly {
		for _, in := range s.inbound.List() {
			if (in.method == acp.RequestPermission || in.method == acp.ElicitationCreate) && !in.sentTo(c) {
				in.copyTo(c)
			}
		}
	}
	return true
}

// overran fails an attach whose session sent more than maxBacklog during
// its replay: mem leaves the session; with no client left the session
// ends, by the teardown returned (s.fan held).
func (cr *clientReader) overran(m *jsonrpc.Message, s *Session, mem *member, add bool) *ending {
	c := cr.c
	for _, b := range mem.backlog {
		jsonrpc.PutBuffer(b.msg)
	}
	mem.backlog, mem.backlogB, mem.catching, mem.overrun = nil, 0, false, false
	c.relay.metrics.Attaches.WithLabelValues("full").Inc()
	cr.answerError(m.ID, codeBusy, fmt.Sprintf("the session sent more than %d bytes while its history was replayed; attach again, or with historyPolicy \"none\"", maxBacklog), nil)
	if !add {
		c.relay.metrics.AttachedClients.Dec() // counted when it first attached
	}
	_, e := s.removeMember(c)
	return e
}

// attachResult is session/attach's result for mem.
func (s *Session) attachResult(mem *member, policy string, replayed int, trimmed bool) []byte {
	r := multiclient.Result{SessionID: s.GatewayID, ClientID: mem.id, HistoryPolicy: policy, ReadOnly: mem.readOnly,
		Replayed: replayed, Trimmed: trimmed, Turn: s.turn.Name()}
	if o := s.Owner(); o != nil {
		r.Clients = append(r.Clients, connPeer(o))
	}
	for _, m := range s.clientList() {
		r.Clients = append(r.Clients, m.peer())
	}
	return multiclient.AttachResult(r, s.state.Get())
}

// handleDetach serves session/detach: c stops being a client of the
// session. The session lives on while another client holds it.
func (cr *clientReader) handleDetach(m *jsonrpc.Message) {
	c := cr.c
	var p struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil || p.SessionID == "" {
		if m.Kind == jsonrpc.KindRequest {
			cr.answerError(m.ID, jsonrpc.CodeInvalidParams, "session/detach needs params.sessionId (a string)", nil)
		}
		return
	}
	cr.spanSession(p.SessionID)
	c.mu.Lock()
	s := c.sessions[p.SessionID]
	c.mu.Unlock()
	if s == nil {
		cr.notFound(m, p.SessionID, false)
		return
	}
	c.leaveSession(s, false) // a turn running is cancelled if c was its last client (finishSession)
	c.detach(s)
	if m.Kind == jsonrpc.KindRequest {
		res, _ := json.Marshal(map[string]string{"sessionId": p.SessionID, "status": "detached"})
		c.deliver(jsonrpc.AppendResult(nil, m.ID, res))
	}
}

// leaveSession ends c's part in s, c's connection ending or detaching
// from it: a member leaves; an owner leaves a session others are attached
// to running for them; a session c alone held ends (its turn cancelled if
// c was prompting, closed on the agent). The agent's requests waiting for
// c go to the clients that remain, or are answered in c's place when none
// does.
func (c *Conn) leaveSession(s *Session, prompting bool) {
	s.failQueued(c, "the client left the session")
	if mem, e := s.removeMember(c); mem != nil {
		c.relay.metrics.AttachedClients.Dec()
		s.emit(&observe.Event{Kind: observe.SessionDetached, Client: c.client(), ClientID: mem.id, ReadOnly: mem.readOnly})
		c.dropRequestsOf(s)
		s.presence("client_disconnected", mem.peer(), nil)
		e.run() // c was its last client: the session ends
		return
	}
	if owned, kept := s.ownerLeave(c, prompting); owned && kept {
		c.dropRequestsOf(s)
		s.presence("client_disconnected", connPeer(c), nil)
	}
}

// dropRequestsOf gives up c's copies of the agent's requests about s: each
// is answered in c's place only when no other client has one.
func (c *Conn) dropRequestsOf(s *Session) {
	for _, in := range s.inbound.List() {
		id, had, last := in.leave(c)
		if !had {
			continue
		}
		c.reqs.ForgetAgent(id)
		if last {
			in.answerInPlace(c, "the client detached")
		}
	}
}

// readOnlyWrite refuses m if it names a session c is a read-only member
// of: every method but session/detach, before the policy looks at it, so
// that each gets the one documented error.
func (cr *clientReader) readOnlyWrite(m *jsonrpc.Message) bool {
	c := cr.c
	f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1)
	if !ok {
		return false
	}
	gwID, _ := m.String(f)
	c.mu.Lock()
	s := c.sessions[gwID]
	c.mu.Unlock()
	if s == nil {
		return false
	}
	if mem := s.memberOf(c); mem == nil || !mem.readOnly {
		return false
	}
	c.denied("read_only", m.Method)
	if m.Kind == jsonrpc.KindRequest {
		cr.answerError(m.ID, codeReadOnly, "read-only attach: "+m.Method+" is not allowed", nil)
	}
	return true
}
