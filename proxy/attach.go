package proxy

import (
	"encoding/json"
	"fmt"

	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/sessionid"
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
	var p multiclient.AttachParams
	if err := json.Unmarshal(m.Payload, &p); err != nil || p.SessionID == "" {
		c.attachRefused(nil, "invalid")
		cr.answerError(m.ID, jsonrpc.CodeInvalidParams, "session/attach needs params.sessionId (a string)", nil)
		return
	}
	cr.spanSession(p.SessionID)
	if err := p.Check(); err != nil {
		c.attachRefused(nil, "invalid")
		cr.answerError(m.ID, jsonrpc.CodeInvalidParams, err.Error(), nil)
		return
	}
	s, readOnly, ok := cr.mayAttach(m, p)
	if ok {
		cr.join(m, s, p, readOnly, false)
	}
}

// join makes c a client of s for m (a session/attach, or a load that
// became a read-only attach: asLoad), or replays to it again if it is one.
func (cr *clientReader) join(m *jsonrpc.Message, s *Session, p multiclient.AttachParams, readOnly, asLoad bool) {
	c := cr.c
	if mem := s.memberOf(c); mem != nil {
		// Attached already (a page reloaded on a resumed connection): the
		// replay and result again, nothing added.
		if !cr.joinSession(m, s, mem, p.HistoryPolicy, false, asLoad) {
			c.forget(s)
		}
		return
	}
	mem := &member{conn: c, id: multiclient.NewClientID(), readOnly: readOnly} // never the client's choice
	if p.ClientInfo != nil {
		mem.info = *p.ClientInfo
	} else {
		mem.info = connPeer(c).Info()
	}
	c.index(s) // routed to c from now on (and counted once for its tenant)
	if !cr.joinSession(m, s, mem, p.HistoryPolicy, true, asLoad) {
		c.forget(s)
		return
	}
	c.joinChildren(s)
	s.events().memberJoined(c, mem, p.HistoryPolicy)
	if c.isClosed() { // closed meanwhile: Close may not have seen the member
		c.leaveSession(s, false)
		return
	}
	cr.reqLog().Info("attached to a session", "session", s.GatewayID, "client_id", mem.id, "read_only", readOnly, "history", p.HistoryPolicy)
}

// mayAttach finds the live session p names and decides whether c may
// attach to it, and read-only or not (cr.open). Another tenant's session
// fails as an unknown one does.
func (cr *clientReader) mayAttach(m *jsonrpc.Message, p multiclient.AttachParams) (s *Session, readOnly, ok bool) {
	c := cr.c
	id, verdict, ok := cr.open(m, p.SessionID, access.Attach)
	if !ok {
		c.attachRefused(nil, "not_found")
		return nil, false, false
	}
	s = c.ag.heldSession(id.Agent)
	if s == nil || s.ten != c.ten || s.isLost() {
		c.attachRefused(nil, "not_found") // another tenant's session is not named to its observers
		cr.answerError(m.ID, jsonrpc.CodeNotFound, "session not found: it is not live on this gateway replica "+
			"(it has ended, or its clients are connected to another replica: attach through the replica that serves it)",
			acp.SessionIDObject(p.SessionID))
		return nil, false, false
	}
	if c.ten.sharing().Attach == SharingOff {
		c.attachRefused(s, "refused")
		c.denied("attach", m.Method)
		cr.answerError(m.ID, codeNotAuthorised, "not authorised to attach to this session: attach is off for this tenant", nil)
		return nil, false, false
	}
	c.mu.Lock()
	held := c.sessions[p.SessionID] == s
	c.mu.Unlock()
	if held && s.memberOf(c) == nil {
		c.attachRefused(s, "invalid")
		cr.answerError(m.ID, jsonrpc.CodeInvalidRequest, "this connection already holds the session", acp.SessionIDObject(p.SessionID))
		return nil, false, false
	}
	return s, p.Meta.Acpgate.ReadOnly || verdict == access.ReadOnly, true
}

// open opens gwID, a session c does not hold, and applies its tenant's
// sharing to what c asks (a). It answers m itself, and reports false, when
// the ID does not open, the rule refuses (-32002: another subject's session
// is unknown to c, as a forged ID is), or a would change a session c may
// only watch (-32007).
func (cr *clientReader) open(m *jsonrpc.Message, gwID string, a access.Action) (sessionid.Opened, access.Verdict, bool) {
	c := cr.c
	id, err := c.relay.sealer.Open(c.scope, gwID)
	if err != nil {
		cr.notFound(m, gwID, false)
		return id, access.Refused, false
	}
	v := c.ten.sharing().Decide(c.subject, id.Subject, a)
	switch {
	case v == access.Refused && id.Legacy && m.Kind == jsonrpc.KindRequest:
		c.denied("other_subject", m.Method)
		cr.answerError(m.ID, jsonrpc.CodeNotFound, "session not found: its ID was issued before sessions were bound to "+
			"the subject that made them, and this tenant's sharing opens it to no subject; start a new session", acp.SessionIDObject(gwID))
	case v == access.Refused:
		c.denied("other_subject", m.Method)
		cr.notFound(m, gwID, false)
	case v == access.ReadOnly && a == access.Write:
		c.denied("read_only", m.Method)
		if m.Kind == jsonrpc.KindRequest {
			cr.answerError(m.ID, codeReadOnly, "read-only: another subject's session, which this tenant's sharing lets you only watch: "+m.Method+" is not allowed", nil)
		}
	default:
		return id, v, true
	}
	return id, v, false
}

// watch serves a session/load or session/resume of another subject's
// session that c may only watch: a read-only attach in its place,
// answered with the load's (or resume's) result, after the history for a
// load. The session must be live on this replica.
func (cr *clientReader) watch(m *jsonrpc.Message, gwID, agentSID string) {
	c := cr.c
	if m.Kind != jsonrpc.KindRequest {
		return
	}
	s := c.ag.heldSession(agentSID)
	if s == nil || s.ten != c.ten || !s.live() {
		cr.answerError(m.ID, jsonrpc.CodeNotFound, "session not found: another subject's session opens here read-only, "+
			"and only while it is live on this gateway replica", acp.SessionIDObject(gwID))
		return
	}
	p := multiclient.AttachParams{SessionID: gwID, HistoryPolicy: "full"}
	if m.Method == acp.SessionResume {
		p.HistoryPolicy = "none"
	}
	cr.join(m, s, p, true, true)
}

// joinSession adds mem to s (unless add is false: a re-attach) and sends c
// the replay, the result, then what came meanwhile and the pending
// requests; false if it answered m with an error. The replay goes out
// without the session's fan lock (a slow client must not hold the agent's
// reader up): what the session sends meanwhile waits in the member's
// backlog, so each message reaches c once and in order.
func (cr *clientReader) joinSession(m *jsonrpc.Message, s *Session, mem *member, policy string, add, asLoad bool) bool {
	c := cr.c
	s.fan.Lock()
	ok, full := true, false
	if add {
		ok, full = s.join(mem, c.relay.resume.MaxClients)
	}
	if !ok || full {
		s.fan.Unlock()
		if full {
			c.attachRefused(s, "full")
			cr.answerError(m.ID, codeBusy, fmt.Sprintf("the session has reached sessions.max_clients (%d) clients", c.relay.resume.MaxClients), nil)
		} else {
			c.attachRefused(s, "not_found")
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
	if policy == "full" && s.history != nil && c.profile().Version >= 2 {
		msg, f := s.replayComplete()
		c.deliverMember(msg, s, f, true)
		for _, k := range s.descendants() { // the history holds its children's updates too
			msg, f := k.replayComplete()
			c.deliverMember(msg, s, f, true)
		}
	}
	s.fan.Lock()
	if mem.overrun { // the session outran the replay: what c missed is gone
		e := cr.overran(m, s, mem)
		s.fan.Unlock()
		c.attachRefused(s, "full") // observers hear of it off the fan lock
		if !add {
			s.events().memberLeft(c, mem) // it had joined before
		}
		e.run()      // no client left: the session ends, off the fan lock
		return false // the caller lets go of s
	}
	defer s.fan.Unlock()
	if add { // the others know of c before c can act
		s.toMembersLocked(multiclient.Presence("client_connected", mem.peer()), c)
	}
	c.Deliver(jsonrpc.AppendResult(nil, m.ID, s.attachResult(mem, policy, replayed, trimmed, asLoad)))
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
// ends, by the teardown returned (s.fan held: the caller tells observers).
func (cr *clientReader) overran(m *jsonrpc.Message, s *Session, mem *member) *ending {
	c := cr.c
	for _, b := range mem.backlog {
		jsonrpc.PutBuffer(b.msg)
	}
	mem.backlog, mem.backlogB, mem.catching, mem.overrun = nil, 0, false, false
	cr.answerError(m.ID, codeBusy, fmt.Sprintf("the session sent more than %d bytes while its history was replayed; attach again, or with historyPolicy \"none\"", maxBacklog), nil)
	_, e := s.leave(c)
	return e
}

// attachResult is session/attach's result for mem (or, asLoad, the
// session/load or session/resume result of a load that became an attach).
func (s *Session) attachResult(mem *member, policy string, replayed int, trimmed, asLoad bool) []byte {
	r := multiclient.Result{SessionID: s.GatewayID, ClientID: mem.id, HistoryPolicy: policy, ReadOnly: mem.readOnly,
		Replayed: replayed, Trimmed: trimmed, Turn: s.turn.Name(), Lists: models.ListsOf(s.ten.policy(s.side.ag.name))}
	if o := s.Owner(); o != nil {
		r.Clients = append(r.Clients, connPeer(o))
	}
	for _, m := range s.clientList() {
		r.Clients = append(r.Clients, m.peer())
	}
	if asLoad {
		return multiclient.LoadResult(r, s.state.Get())
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
	c.forget(s)
	if m.Kind == jsonrpc.KindRequest {
		res, _ := json.Marshal(map[string]string{"sessionId": p.SessionID, "status": "detached"})
		c.Deliver(jsonrpc.AppendResult(nil, m.ID, res))
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
	if mem, e := s.leave(c); mem != nil {
		c.leaveChildren(s)
		s.events().memberLeft(c, mem)
		letGoOf(c, s, "the client detached")
		s.toMembers(multiclient.Presence("client_disconnected", mem.peer()), nil)
		e.run() // c was its last client: the session ends
		return
	}
	if owned, kept := s.ownerLeave(c, prompting); owned && kept {
		letGoOf(c, s, "the client detached")
		s.toMembers(multiclient.Presence("client_disconnected", connPeer(c)), nil)
	}
}

// sessionNamed is the session of c's that m names (nil: none).
func (c *Conn) sessionNamed(m *jsonrpc.Message) *Session {
	f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1)
	if !ok {
		return nil
	}
	gwID, _ := m.String(f)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[gwID]
}

// readOnlyWrite refuses m if it names a session c is a read-only member
// of: every method but session/detach, before the policy looks at it, so
// that each gets the one documented error.
func (cr *clientReader) readOnlyWrite(m *jsonrpc.Message) bool {
	c := cr.c
	s := c.sessionNamed(m)
	if s == nil {
		return false
	}
	if mem := s.root().memberOf(c); mem == nil || !mem.readOnly { // a child: its parent's rights
		return false
	}
	c.denied("read_only", m.Method)
	if m.Kind == jsonrpc.KindRequest {
		cr.answerError(m.ID, codeReadOnly, "read-only attach: "+m.Method+" is not allowed", nil)
	}
	return true
}
