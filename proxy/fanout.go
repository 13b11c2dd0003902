package proxy

import (
	"encoding/json"
	"slices"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/turn"
)

// A session may have several clients (ACP RFD #533, session/attach): its
// owner (the plain client that created or loaded it; nil once it has left
// while others remain) and the members that attached. Every client gets
// the session's messages in the same order. The members also get what the
// RFD adds (prompt_received, turn_complete, permission_resolved, presence);
// a plain client only ever gets ACP v1.

// member is a client attached to a session with session/attach.
type member struct {
	conn     *Conn
	id       string // minted for it (NewClientID): unique in the session
	info     multiclient.ClientInfo
	readOnly bool
	// While its attach replays the history (catching), what the session
	// sends it waits in backlog. Guarded by the session's fan lock.
	catching bool
	backlog  []backlogged
	backlogB int  // bytes in backlog
	overrun  bool // the backlog passed maxBacklog: the attach fails
}

// maxBacklog bounds what a member catching up may have waiting: the agent
// sent more than this during its replay, so the replay is not worth
// finishing (the client may attach again with a smaller history).
const maxBacklog = 16 << 20

// backlogged is a message for a member still catching up.
type backlogged struct {
	msg []byte
	f   Facts
}

// send delivers msg to the member, or keeps it for after its replay (the
// session's fan lock held).
func (m *member) send(s *Session, msg []byte, f Facts) {
	if m.catching {
		if m.overrun || m.backlogB+len(msg) > maxBacklog {
			m.overrun = true
			jsonrpc.PutBuffer(msg)
			return
		}
		m.backlog = append(m.backlog, backlogged{msg, f})
		m.backlogB += len(msg)
		return
	}
	m.conn.deliverMember(msg, s, f, false)
}

func (m *member) peer() multiclient.Peer {
	return multiclient.Peer{ClientID: m.id, Name: m.info.Name, Version: m.info.Version, ReadOnly: m.readOnly}
}

// peerOf is c, a client of the session, as the others see it.
func (s *Session) peerOf(c *Conn) multiclient.Peer {
	if m := s.memberOf(c); m != nil {
		return m.peer()
	}
	return connPeer(c)
}

// connPeer is a plain client (the owner) as the others see it.
func connPeer(c *Conn) multiclient.Peer {
	c.mu.Lock()
	info := c.info
	c.mu.Unlock()
	return multiclient.Peer{ClientID: c.clientID, Name: info.Name, Version: info.Version}
}

// clientList returns the session's members (nil: none).
func (s *Session) clientList() []*member {
	if p := s.members.Load(); p != nil {
		return *p
	}
	return nil
}

// memberOf returns c's membership of the session (nil: c did not attach).
func (s *Session) memberOf(c *Conn) *member {
	for _, m := range s.clientList() {
		if m.conn == c {
			return m
		}
	}
	return nil
}

// shared reports whether the session's messages take the fan-out path:
// clients may attach to it (its tenant's sharing), or some have.
func (s *Session) shared() bool { return s.attachable || s.members.Load() != nil }

// primary is the client an agent message about the session goes to first:
// the owner, or with none the first member (for a request, the first that
// may answer).
func (s *Session) primary(request bool) *Conn {
	if c := s.Owner(); c != nil {
		return c
	}
	for _, m := range s.clientList() {
		if !request || !m.readOnly {
			return m.conn
		}
	}
	return nil
}

// deliverAll delivers a notification about the session to every client:
// primary gets msg itself, each member a copy; it is kept in the history.
// wait allows backpressure only with a single client (a slow member never
// delays the others: its sink cuts it off).
func (s *Session) deliverAll(primary *Conn, msg []byte, f Facts, wait bool) {
	s.deliverAllOf(primary, msg, f, wait, false)
}

// deliverAllOf is deliverAll; children: msg is about a child session (a
// child's own or a subagent_update), which members that do not route
// children (Conn.routesChildren) never get, and the session's own state
// does not note.
func (s *Session) deliverAllOf(primary *Conn, msg []byte, f Facts, wait, children bool) {
	if !s.shared() {
		primary.deliverFor(msg, s, f, wait)
		return
	}
	s.fan.Lock()
	defer s.fan.Unlock()
	if s.history != nil {
		s.history.Add(msg)
	}
	if !children {
		s.state.NoteUpdate(msg)
	}
	ms := s.clientList()
	for _, m := range ms {
		if m.conn != primary && (!children || m.conn.routesChildren()) {
			m.send(s, clone(msg), f)
		}
	}
	primary.deliverFor(msg, s, f, wait && len(ms) == 0)
}

// clone copies msg into a pooled buffer for another recipient.
func clone(msg []byte) []byte { return append(jsonrpc.GetBuffer(len(msg)), msg...) }

// update is a session/update notification of the session carrying body
// (an update object).
func (s *Session) update(body []byte) []byte {
	params := make([]byte, 0, len(body)+len(s.quotedID)+32)
	params = append(append(append(params, `{"sessionId":`...), s.quotedID...), `,"update":`...)
	params = append(append(params, body...), '}')
	return jsonrpc.AppendRequest(jsonrpc.GetBuffer(len(params)+64), nil, acp.SessionUpdate, params)
}

// toMembersLocked sends an update to every member but skip, and to an
// owner that asked for them (Conn.aware) (s.fan held).
func (s *Session) toMembersLocked(body []byte, skip *Conn) {
	f := Facts{Method: acp.SessionUpdate, SessionID: s.GatewayID}
	for _, m := range s.clientList() {
		if m.conn != skip {
			m.send(s, s.update(body), f)
		}
	}
	if o := s.Owner(); o != nil && o != skip && o.aware.Load() {
		o.deliverFor(s.update(body), s, f, false)
	}
}

// audience reports whether anyone hears multi-client updates: a member,
// or an owner that asked for them.
func (s *Session) audience() bool {
	o := s.Owner()
	return s.members.Load() != nil || o != nil && o.aware.Load()
}

// toMembers is toMembersLocked taking s.fan.
func (s *Session) toMembers(body []byte, skip *Conn) {
	if !s.audience() {
		return
	}
	s.fan.Lock()
	s.toMembersLocked(body, skip)
	s.fan.Unlock()
}

// failQueued refuses the prompts waiting for a turn: c's (nil: all), with
// why.
func (s *Session) failQueued(c *Conn, why string) { s.failTurns(s.turn.DropQueued(c), why) }

// failTurns refuses prompts taken from the queue, with why.
func (s *Session) failTurns(failed []turn.Queued[*outReq], why string) {
	if len(failed) == 0 {
		return
	}
	s.events().promptsQueued(-len(failed))
	for _, t := range failed {
		if s.side.take(t.Prompt) {
			t.Prompt.failWith(jsonrpc.CodeRequestCancelled, why, nil)
		}
	}
}

// announcePrompt shows a prompt that is about to go to the agent to the
// session's other clients (members: prompt_received; a plain owner: the
// user_message_chunks session/load would replay) and keeps it in the
// history.
func (s *Session) announcePrompt(sender *Conn, blocks []json.RawMessage) {
	if len(blocks) == 0 || !s.shared() {
		return
	}
	var chunks [][]byte
	for _, b := range blocks {
		chunks = append(chunks, multiclient.UserMessageChunk(b))
	}
	received := multiclient.PromptReceived(blocks, s.peerOf(sender))
	s.fan.Lock()
	defer s.fan.Unlock()
	f := Facts{Method: acp.SessionUpdate, SessionID: s.GatewayID}
	for _, body := range chunks {
		msg := s.update(body)
		if s.history != nil {
			s.history.Add(msg)
		}
		if owner := s.Owner(); owner != nil && owner != sender && !owner.aware.Load() { // one that is hears prompt_received
			owner.deliverFor(msg, s, f, false)
		} else {
			jsonrpc.PutBuffer(msg)
		}
	}
	s.toMembersLocked(received, sender)
}

// turnComplete tells the members but the prompter that a turn ended, and
// how.
func (s *Session) turnComplete(prompter *Conn, stop string) {
	if s.audience() { // nothing built for a session no other client hears
		s.toMembers(multiclient.TurnComplete(stop), prompter)
	}
}

// join makes m a member (s.fan held): false with a reason when the session
// is full or has ended.
func (s *Session) join(m *member, maxClients int) (ok, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live() {
		return false, false
	}
	cur := s.clientList()
	clients := len(cur)
	if s.Owner() != nil {
		clients++
	}
	if clients >= maxClients {
		return false, true
	}
	next := append(slices.Clip(cur), m)
	s.members.Store(&next)
	return true, false
}

// leave ends c's membership. With no client left (no owner, no member) the
// session ends: the ending returned is its teardown, for the caller to run
// off every lock (nil: it lives on).
func (s *Session) leave(c *Conn) (m *member, e *ending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.clientList()
	i := slices.IndexFunc(cur, func(m *member) bool { return m.conn == c })
	if i < 0 {
		return nil, nil
	}
	m = cur[i]
	next := slices.Delete(slices.Clone(cur), i, i+1)
	if len(next) == 0 {
		s.members.Store(nil)
	} else {
		s.members.Store(&next)
	}
	if len(next) == 0 && s.owner.Load() == nil {
		e = s.endingLocked(endLastClientLeft, c)
	}
	return m, e
}
