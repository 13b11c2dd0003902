package proxy

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// A session may have several clients (ACP RFD #533, session/attach): its
// owner (the plain client that created or loaded it; nil once it has left
// while others remain) and the members that attached. Every client gets
// the session's messages in the same order. The members also get what the
// RFD adds (prompt_received, turn_complete, permission_resolved, presence);
// a plain client only ever gets ACP v1.

// clientInfo is a client's name and version, as its initialize (or its
// session/attach) said.
type clientInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// member is a client attached to a session with session/attach.
type member struct {
	conn     *Conn
	id       string // the clientId it gave, or one minted for it
	info     clientInfo
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

// peer is a client as the others see it.
type peer struct {
	ClientID string `json:"clientId"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func (m *member) peer() peer {
	return peer{ClientID: m.id, Name: m.info.Name, Version: m.info.Version, ReadOnly: m.readOnly}
}

// connPeer is a plain client (the owner) as the others see it.
func connPeer(c *Conn) peer {
	c.mu.Lock()
	info := c.info
	c.mu.Unlock()
	return peer{ClientID: c.clientID, Name: info.Name, Version: info.Version}
}

// newClientID mints a client ID.
func newClientID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "c-" + hex.EncodeToString(b[:])
}

// maxStateUpdate bounds the size of a mode or config option update the
// attach result follows.
const maxStateUpdate = 16 << 10

// Defaults of SessionsConfig.
const (
	defaultHistoryBytes = 2 << 20
	defaultMaxClients   = 8
)

func (r *Relay) historyBytes() int {
	if r.resume.HistoryBytes == 0 {
		return defaultHistoryBytes
	}
	return max(r.resume.HistoryBytes, 0)
}

func (r *Relay) maxClients() int {
	if r.resume.MaxClients <= 0 {
		return defaultMaxClients
	}
	return r.resume.MaxClients
}

// history is the bounded record of a live session's messages that
// session/attach replays: two generations of messages back to back. New
// messages go to the current one; when it would pass half the limit, it
// becomes the previous one and the old previous one's buffer, emptied, is
// the current one. So a history keeps at least the newest half of its
// limit (unless a message bigger than that came: see add) and at most its
// limit, and once it has filled up it allocates nothing: the two buffers
// take turns.
type history struct {
	limit     int
	prev, cur histGen
	trimmed   bool // something was dropped: a replay starts at the oldest kept
}

// histGen is messages back to back; ends[i] is where message i ends.
type histGen struct {
	buf  []byte
	ends []int
}

// add keeps msg as the newest message. A message bigger than half the
// limit is not kept, and neither is anything older (a replay must not skip
// one): the history starts again after it. The buffers grow as append
// would, but never past half the limit each, so that what they hold stays
// within the limit (a 16 MB update once made a 2 MiB history hold 16 MB).
func (h *history) add(msg []byte) {
	half := max(h.limit/2, 1)
	if len(msg) > half {
		h.trimmed = true
		h.prev = histGen{buf: h.prev.buf[:0], ends: h.prev.ends[:0]}
		h.cur = histGen{buf: h.cur.buf[:0], ends: h.cur.ends[:0]}
		return
	}
	if len(h.cur.buf) > 0 && len(h.cur.buf)+len(msg) > half {
		h.trimmed = h.trimmed || len(h.prev.ends) > 0
		h.prev, h.cur = h.cur, histGen{buf: h.prev.buf[:0], ends: h.prev.ends[:0]}
	}
	if n := len(h.cur.buf) + len(msg); n > cap(h.cur.buf) {
		b := make([]byte, len(h.cur.buf), min(max(n, 2*cap(h.cur.buf)), half))
		copy(b, h.cur.buf)
		h.cur.buf = b
	}
	h.cur.buf = append(h.cur.buf, msg...)
	h.cur.ends = append(h.cur.ends, len(h.cur.buf))
}

// bytes is the size of the kept messages.
func (h *history) bytes() int { return len(h.prev.buf) + len(h.cur.buf) }

// each calls f with every kept message, oldest first (f must not keep it).
func (h *history) each(f func(msg []byte)) {
	for _, g := range []*histGen{&h.prev, &h.cur} {
		from := 0
		for _, end := range g.ends {
			f(g.buf[from:end])
			from = end
		}
	}
}

// kept is the number of messages kept.
func (h *history) kept() int { return len(h.prev.ends) + len(h.cur.ends) }

// release drops every message (the session has ended).
func (h *history) release() { h.prev, h.cur = histGen{}, histGen{} }

// sessionState is what a session/attach result reports of the session's
// configuration, as the agent last gave it (raw JSON; nil: never given).
type sessionState struct {
	Modes         json.RawMessage `json:"modes,omitempty"`
	ConfigOptions json.RawMessage `json:"configOptions,omitempty"`
	Models        json.RawMessage `json:"models,omitempty"`
}

// agentState is the configuration the agent last reported of a session,
// for session/attach's result. Its lock is a leaf.
type agentState struct {
	mu  sync.Mutex
	cur sessionState
}

// get is the configuration last reported.
func (a *agentState) get() sessionState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// noteResult records the configuration a session/new, load or resume
// result carries.
func (a *agentState) noteResult(result []byte) {
	var st sessionState
	if json.Unmarshal(result, &st) != nil {
		return
	}
	a.mu.Lock()
	a.cur = st
	a.mu.Unlock()
}

// noteUpdate keeps the recorded configuration current: a mode or config
// option change the agent reports. Those are small: a message over
// maxStateUpdate is not searched (streamed content is most of the bytes).
func (a *agentState) noteUpdate(msg []byte) {
	if len(msg) > maxStateUpdate || !bytes.Contains(msg, []byte(`_update"`)) {
		return // most updates are chunks: one short search rules them out
	}
	isMode := bytes.Contains(msg, []byte(`"current_mode_update"`))
	if !isMode && !bytes.Contains(msg, []byte(`"config_option_update"`)) {
		return
	}
	var n struct {
		Params struct {
			Update struct {
				SessionUpdate string          `json:"sessionUpdate"`
				CurrentModeID json.RawMessage `json:"currentModeId"`
				ConfigOptions json.RawMessage `json:"configOptions"`
			} `json:"update"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &n) != nil {
		return
	}
	u := n.Params.Update
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case u.SessionUpdate == "current_mode_update" && u.CurrentModeID != nil && a.cur.Modes != nil:
		var modes map[string]json.RawMessage
		if json.Unmarshal(a.cur.Modes, &modes) == nil {
			modes["currentModeId"] = u.CurrentModeID
			a.cur.Modes, _ = json.Marshal(modes)
		}
	case u.SessionUpdate == "config_option_update" && u.ConfigOptions != nil:
		a.cur.ConfigOptions = u.ConfigOptions
	}
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
	if !s.shared() {
		primary.deliverFor(msg, s, f, wait)
		return
	}
	s.fan.Lock()
	defer s.fan.Unlock()
	if s.history != nil {
		s.history.add(msg)
	}
	s.state.noteUpdate(msg)
	ms := s.clientList()
	for _, m := range ms {
		if m.conn != primary {
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

// toMembers sends an update to every member but skip (s.fan held).
func (s *Session) toMembersLocked(body []byte, skip *Conn) {
	for _, m := range s.clientList() {
		if m.conn != skip {
			m.send(s, s.update(body), Facts{Method: acp.SessionUpdate, SessionID: s.GatewayID})
		}
	}
}

// toMembers is toMembersLocked taking s.fan.
func (s *Session) toMembers(body []byte, skip *Conn) {
	if s.members.Load() == nil {
		return
	}
	s.fan.Lock()
	s.toMembersLocked(body, skip)
	s.fan.Unlock()
}

// presence tells the members that a client connected or left.
func (s *Session) presence(event string, who peer, skip *Conn) {
	s.toMembers(presenceBody(event, who), skip)
}

// presenceBody is a client_connected or client_disconnected update.
func presenceBody(event string, who peer) []byte {
	body, _ := json.Marshal(struct {
		SessionUpdate string `json:"sessionUpdate"`
		Client        peer   `json:"client"`
		Timestamp     string `json:"timestamp"`
	}{event, who, time.Now().UTC().Format(time.RFC3339Nano)})
	return body
}

// failQueued refuses the prompts waiting for a turn: c's (nil: all), with
// why.
func (s *Session) failQueued(c *Conn, why string) { s.failTurns(s.turn.dropQueued(c), why) }

// failTurns refuses prompts taken from the queue, with why.
func (s *Session) failTurns(failed []queuedTurn, why string) {
	if len(failed) == 0 {
		return
	}
	s.link.ag.metrics.Root().PromptsQueued.Sub(float64(len(failed)))
	for _, t := range failed {
		if s.link.take(t.req) {
			t.req.failWith(jsonrpc.CodeRequestCancelled, why, nil)
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
		body, _ := json.Marshal(struct {
			SessionUpdate string          `json:"sessionUpdate"`
			Content       json.RawMessage `json:"content"`
		}{"user_message_chunk", b})
		chunks = append(chunks, body)
	}
	var by peer
	if m := s.memberOf(sender); m != nil {
		by = m.peer()
	} else {
		by = connPeer(sender)
	}
	received, _ := json.Marshal(struct {
		SessionUpdate string            `json:"sessionUpdate"`
		Prompt        []json.RawMessage `json:"prompt"`
		SentBy        peer              `json:"sentBy"`
	}{"prompt_received", blocks, by})
	s.fan.Lock()
	defer s.fan.Unlock()
	f := Facts{Method: acp.SessionUpdate, SessionID: s.GatewayID}
	for _, body := range chunks {
		msg := s.update(body)
		if s.history != nil {
			s.history.add(msg)
		}
		if owner := s.Owner(); owner != nil && owner != sender {
			owner.deliverFor(msg, s, f, false)
		} else {
			jsonrpc.PutBuffer(msg)
		}
	}
	s.toMembersLocked(received, sender)
}

// promptBlocks reads the prompt of a session/prompt's params.
func promptBlocks(params []byte) []json.RawMessage {
	var p struct {
		Prompt []json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Prompt
}

// turnComplete tells the members but the prompter that a turn ended.
func (s *Session) turnComplete(prompter *Conn, answer *jsonrpc.Message) {
	if s.members.Load() == nil {
		return
	}
	stop := "error"
	if !answer.IsError {
		stop, _ = acp.StopReason(answer)
	}
	body, _ := json.Marshal(struct {
		SessionUpdate string `json:"sessionUpdate"`
		StopReason    string `json:"stopReason"`
	}{"turn_complete", stop})
	s.toMembers(body, prompter)
}

// addMember attaches c (s.fan held): false with a reason when the session
// is full or has ended.
func (s *Session) addMember(m *member, maxClients int) (ok, full bool) {
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

// removeMember detaches c. With no client left (no owner, no member) the
// session ends: the ending returned is its teardown, for the caller to run
// off every lock (nil: it lives on).
func (s *Session) removeMember(c *Conn) (m *member, e *ending) {
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
