package proxy

import (
	"encoding/json"
	"strconv"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// A session's owner can change: a connection that loads (or resumes) a
// session held by a detached connection of its tenant takes it over. When a
// turn ran while the owner was detached, the agent is not asked to load a
// session it is running: the gateway answers the load itself, delivers the
// session's updates since the detach, and sends the agent's pending
// requests about it again, with the new connection's ids. Otherwise the
// load goes to the agent as any load does ("the newest load wins",
// addSession).

// takeOver serves m, a session/load or session/resume request for the
// agent's session agentSID, as a take-over if a detached connection of c's
// tenant holds that session and a turn ran while it was detached. It
// reports whether it answered m.
func (cr *clientReader) takeOver(m *jsonrpc.Message, agentSID string) bool {
	c := cr.c
	s := c.ag.heldSession(agentSID)
	if s == nil {
		return false
	}
	owner := s.Owner()
	running, ended, stop := s.turn.Found()
	if owner == nil || owner == c || owner.tenant != c.tenant || !owner.Detached() {
		return false
	}
	turn := "idle"
	switch {
	case running:
		turn = "running"
	case ended:
		turn = "ended"
	}
	if turn == "idle" {
		s.events().takenOver(c, turn)
		return false // the agent replays it; addSession moves the owner
	}
	meta := map[string]any{"turn": turn}
	if turn == "ended" {
		meta["stopReason"] = stop
	}
	result, _ := json.Marshal(map[string]any{"_meta": map[string]any{"acpgate": meta}})
	if !cr.moveSession(s, owner, jsonrpc.AppendResult(nil, m.ID, result)) {
		return false
	}
	c.index(s) // before the owner lets go: the session keeps its tenant slot
	notice, f := s.endedNotice("taken over by another client")
	owner.deliverMember(notice, s, f, false) // kept for when it resumes
	owner.forget(s)
	for _, k := range s.childList() { // its children follow it
		if k.moveOwner(owner, c) {
			c.index(k)
			owner.forget(k)
		}
	}
	s.events().sessionEvent(c, observe.SessionLoaded, "")
	for _, in := range s.inbound.List() { // the agent's requests waiting for owner are c's
		in.handOver(owner, c)
	}
	s.events().takenOver(c, turn)
	cr.reqLog().Info("took a session over from a detached connection", "from_conn", owner.id, "turn", turn)
	if owner.subject == c.subject { // another subject's is kept, to be told when it resumes
		owner.endIfEmpty()
	}
	return true
}

// moveSession makes c the owner of s, held by the detached connection
// owner, and delivers answer, then what owner kept of s since it detached.
// The owner changes with both outboxes held, so that the session's
// messages reach c after those, in order. The outboxes are locked in the
// order of their connections (lockOutboxes): two connections taking each
// other's sessions over at once cannot deadlock.
func (cr *clientReader) moveSession(s *Session, owner *Conn, answer []byte) bool {
	c := cr.c
	owner.mu.Lock()
	since := owner.detachSeq
	owner.mu.Unlock()
	unlock := lockOutboxes(owner, c)
	buffered := owner.out.SinceLocked(s, since)
	moved := owner.out.SinkLocked() == nil && s.moveOwner(owner, c) // still detached
	if moved {
		c.out.DeliverLocked(answer, nil, Facts{}, false)
		for _, b := range buffered {
			c.out.DeliverLocked(b, s, Facts{}, false)
		}
	}
	unlock()
	if !moved {
		for _, b := range buffered {
			jsonrpc.PutBuffer(b)
		}
	}
	return moved
}

// lockOutboxes locks the outboxes of two connections in the order they
// were made and returns the unlock.
func lockOutboxes(a, b *Conn) (unlock func()) {
	if b.seq < a.seq {
		a, b = b, a
	}
	a.out.Lock()
	b.out.Lock()
	return func() {
		b.out.Unlock()
		a.out.Unlock()
	}
}

// endIfEmpty ends a detached connection left with nothing to resume: no
// session and no request in flight either way (its sessions were all taken
// over by its own subject). Its tenant connection slot is free at once. One
// another subject took a session from is kept until it resumes (to hear
// of it: _acpgate/session_ended) or its detach timeout ends it.
//
// A connection handling a message (a socket that dropped while its last
// message was handled) is left alone: its own take-over may be about to
// give it a session. It is marked, and checks again when it is done
// (handled).
func (c *Conn) endIfEmpty() {
	if !c.handleMu.TryLock() {
		c.recheckEnd.Store(true)
		return
	}
	defer c.handleMu.Unlock()
	c.mu.Lock()
	empty := c.detached && !c.closed && len(c.sessions) == 0
	c.mu.Unlock()
	empty = empty && c.reqs.Empty()
	if empty {
		c.log.Info("every session of the detached connection was taken over; ending it")
		c.Close()
	}
}

// heldSession finds the live session of the agent's session ID sid on any
// of the agent's processes.
func (ag *agent) heldSession(sid string) *Session {
	for _, l := range ag.sideList() {
		if s, _ := l.session([]byte(sid)); s != nil {
			return s
		}
	}
	return nil
}

// heldByTenant reports whether a connection of tenant holds the agent's
// session sid.
func (ag *agent) heldByTenant(sid, tenant string) bool {
	s := ag.heldSession(sid)
	if s == nil {
		return false
	}
	owner := s.Owner()
	return owner != nil && owner.tenant == tenant
}

// promptEnded notes the end of a prompt turn of req.sess, answered by m:
// for a session whose owner is detached it is kept for a take-over; for a
// session taken over meanwhile the new owner is told.
func promptEnded(req *outReq, m *jsonrpc.Message) {
	stop, errPayload := "", []byte(nil)
	if m.IsError {
		errPayload = m.Payload
	} else {
		stop, _ = acp.StopReason(m)
	}
	promptEndedWith(req, stop, errPayload)
}

// promptEndedWith is promptEnded for a turn that ended with stop, or with
// the JSON-RPC error errPayload (non-nil).
func promptEndedWith(req *outReq, stop string, errPayload []byte) {
	s := req.sess
	owner := s.Owner()
	if owner == nil || owner == req.conn && !owner.Detached() || s.memberOf(req.conn) != nil {
		return // the usual case: the client that asked reads the answer
	}
	if owner == req.conn { // ended while its owner is detached
		s.turn.EndedWhileDetached(stop)
		return
	}
	// Taken over while the turn ran: the new owner hears of its end.
	params := []byte(`{"sessionId":` + string(s.quotedID))
	if errPayload != nil {
		params = append(append(params, `,"error":`...), errPayload...)
	} else {
		params = append(append(params, `,"stopReason":`...), strconv.Quote(stop)...)
	}
	params = append(params, '}')
	owner.Deliver(jsonrpc.AppendRequest(nil, nil, methodTurnEnded, params))
	if owner.subject == req.conn.subject {
		req.conn.endIfEmpty()
	}
}
