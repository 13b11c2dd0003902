package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/adminview"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// What the admin API sees and does: snapshots of the connections and
// sessions, and an administrator's end of a session or a connection.

// Errors of EndSession and CloseConn: nothing of that ID.
var (
	ErrNoSuchSession = errors.New("no such session")
	ErrNoSuchConn    = errors.New("no such connection")
)

// adminCancelWait is how long EndSession waits for the agent to answer a
// cancelled turn before answering its client "cancelled" itself.
const adminCancelWait = 2 * time.Second

// maxAdminEnded bounds the ended session IDs remembered for their error.
const maxAdminEnded = 4096

// ConnSnapshots lists the open connections, attached or detached, in the
// order they were made.
func (r *Relay) ConnSnapshots() []adminview.Conn {
	conns := r.connList()
	slices.SortFunc(conns, func(a, b *Conn) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]adminview.Conn, 0, len(conns))
	for _, c := range conns {
		snap := adminview.Conn{ID: c.id, Tenant: c.tenant, Subject: c.subject, Agent: c.ag.name,
			Transport: c.transport, Remote: c.remote, Opened: c.opened}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			continue
		}
		snap.Detached = c.detached
		if c.detached {
			snap.DetachedAt = c.detachedAt
		}
		snap.Sessions = make([]string, 0, len(c.sessions))
		for id := range c.sessions {
			snap.Sessions = append(snap.Sessions, id)
		}
		c.mu.Unlock()
		slices.Sort(snap.Sessions)
		out = append(out, snap)
	}
	return out
}

// SessionSnapshots lists the live sessions of tenant ("" with all: every
// tenant's), oldest first.
func (r *Relay) SessionSnapshots(tenant string, all bool) []adminview.Session {
	var out []adminview.Session
	for _, s := range r.sessionList() {
		if !all && s.ten.name != tenant {
			continue
		}
		out = append(out, s.snapshot())
	}
	adminview.SortSessions(out)
	return out
}

// sessionList is every live session of every agent process.
func (r *Relay) sessionList() []*Session {
	var out []*Session
	for _, ag := range r.agentList() {
		for _, l := range ag.sideList() {
			for _, s := range *l.sessions.Load() {
				out = append(out, s)
			}
		}
	}
	return out
}

// findSession is the live session clients see as id (nil: none).
func (r *Relay) findSession(id string) *Session {
	for _, s := range r.sessionList() {
		if s.GatewayID == id {
			return s
		}
	}
	return nil
}

// snapshot is what the admin API lists of s.
func (s *Session) snapshot() adminview.Session {
	snap := adminview.Session{ID: s.GatewayID, Tenant: s.ten.name, Agent: s.side.ag.name, Usage: s.meter.Usage()}
	if s.parent != nil {
		snap.Parent = s.parent.GatewayID
	}
	members := s.clientList()
	snap.Clients = len(members)
	owner := s.owner.Load()
	prompt, running, lastEnded := s.turn.Since()
	snap.Since = s.opened
	if lastEnded.After(snap.Since) {
		snap.Since = lastEnded
	}
	if owner != nil {
		snap.Clients++
	}
	switch {
	case running:
		snap.State = adminview.Running
		if prompt != nil {
			s.side.mu.Lock()
			snap.TurnStarted = prompt.start
			s.side.mu.Unlock()
			snap.Since = snap.TurnStarted
		}
	case len(members) == 0 && (owner == nil || owner.Detached()):
		snap.State = adminview.Detached
		if owner != nil {
			owner.mu.Lock()
			snap.Since = owner.detachedAt
			owner.mu.Unlock()
		}
	default:
		snap.State = adminview.Idle
	}
	return snap
}

// EndSession ends the session clients see as id, for an administrator
// (by names them in the log): its running turn is cancelled on the agent
// (its client gets stopReason "cancelled", from the gateway if the agent
// does not answer within adminCancelWait), prompts waiting for a turn are
// refused, and every client is told and let go. Later requests naming it
// get an error that says so. An unknown id is ErrNoSuchSession. It
// returns whose session it was.
func (r *Relay) EndSession(id, by string) (Owner, error) {
	s := r.findSession(id)
	if s == nil || !s.closing() {
		return Owner{}, fmt.Errorf("%w: %q", ErrNoSuchSession, id)
	}
	r.adminEnded.Add(id)
	for _, k := range s.childList() { // they end with it
		r.adminEnded.Add(k.GatewayID)
	}
	why := adminEndedMsg(id)
	s.failQueued(nil, why)
	// The agent's requests are settled first, as a client that cancels
	// does: their clients are told before the turn can end.
	settleAll(s.inbound.List(), inPlace(byAdmin, jsonrpc.CodeRequestCancelled, why))
	if prompts := s.side.promptsOf(s); len(prompts) > 0 {
		r.cancelTurn(context.Background(), s, prompts)
	}
	s.end(endAdmin, nil)
	r.log.Info("session ended by an administrator", "session", id, "tenant", s.ten.name, "by", by)
	return Owner{Tenant: s.ten.name, Agent: s.side.ag.name}, nil
}

// AdminEnded is the sessions an administrator ended here (since this
// process started, the last maxAdminEnded): in a cluster, the store that
// keeps them for every replica is given them again after it lost them.
func (r *Relay) AdminEnded() []string { return r.adminEnded.List() }

// Owner is whose a session or connection an administrator acted on was.
type Owner struct{ Tenant, Agent string }

// promptsOf lists the client prompts of s in flight through the process.
func (l *procSide) promptsOf(s *Session) []*outReq {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*outReq
	for _, req := range l.pending {
		if req.method == acp.SessionPrompt && req.conn != nil && req.sess == s {
			out = append(out, req)
		}
	}
	return out
}

// cancelWhy is why the gateway cancelled a turn: _meta.acpgate.<key> of
// its answer.
type cancelWhy struct {
	key   string
	value []byte
}

// whyEdit is the edit that says in r's answer (raw, its result object at
// start:end) why the gateway cancelled it, if it did.
func (r *outReq) whyEdit(raw []byte, start, end int) (jsonrpc.Edit, bool) {
	if w := r.why.Load(); w != nil && start < end {
		return jsonrpc.MetaEdit(raw, start, end, w.key, w.value)
	}
	return jsonrpc.Edit{}, false
}

// CancelTurn cancels the turn the session id (as its clients see it) is
// running, for the gateway (a budget): the agent gets session/cancel, and
// the prompt's answer says why under _meta.acpgate.<key> (value: JSON). An
// agent that has not answered within adminCancelWait is answered for
// ("cancelled"). False: no such live session, no turn running, its turn
// cancelled already, or the relay closing.
func (r *Relay) CancelTurn(id, key string, value []byte) bool {
	s := r.findSession(id)
	if s == nil || !s.live() {
		return false
	}
	prompts, fresh := s.side.promptsOf(s), false
	for _, req := range prompts {
		fresh = req.why.CompareAndSwap(nil, &cancelWhy{key: key, value: value}) || fresh
	}
	if !fresh {
		return false // no turn running, or it is being cancelled already
	}
	return r.bg.Go(func() { r.cancelTurn(r.ctx, s, prompts) })
}

// cancelTurn asks the agent to cancel the turn of s its prompts run, and
// waits up to adminCancelWait (or ctx) for their answers; past it the
// gateway answers them for the agent, "cancelled".
func (r *Relay) cancelTurn(ctx context.Context, s *Session, prompts []*outReq) {
	s.side.p.Notify(acp.SessionCancel, acp.SessionIDObject(s.AgentID))
	ctx, cancel := context.WithTimeout(ctx, adminCancelWait)
	defer cancel()
	_ = r.waitPromptsUntil(ctx, func() bool { return !slices.ContainsFunc(prompts, func(req *outReq) bool { return !req.ended.Load() }) })
	for _, req := range prompts {
		if s.side.take(req) { // the agent did not answer in time
			req.cancelInPlace()
		}
	}
}

// methodSessionEnded tells a session's clients that it ended for them: an
// administrator ended it, or another client loaded or took it over.
const methodSessionEnded = "_acpgate/session_ended"

// endedNotice is the methodSessionEnded notification for s, saying why.
func (s *Session) endedNotice(why string) ([]byte, Facts) {
	params := append(append([]byte(`{"sessionId":`), s.quotedID...), `,"reason":`...)
	params = append(jsonrpc.AppendQuote(params, why), '}')
	return jsonrpc.AppendRequest(nil, nil, methodSessionEnded, params), Facts{Method: methodSessionEnded, SessionID: s.GatewayID}
}

// tell tells every client of the ending session but the one that caused
// it that it has ended, and why (methodSessionEnded), then each gives up
// the agent's requests waiting for it (answered in their place).
func (e *ending) tell(why string) {
	s, owner, members := e.s, e.owner, e.members
	if owner == e.by {
		owner = nil
	}
	msg, f := s.endedNotice(why)
	s.fan.Lock()
	for _, m := range members {
		m.send(s, clone(msg), f)
	}
	if owner != nil {
		owner.deliverFor(msg, s, f, false)
	}
	s.fan.Unlock()
	for _, m := range members {
		letGoOf(m.conn, s, "the session ended")
	}
	if owner != nil {
		letGoOf(owner, s, "the session ended")
	}
}

// adminEndedMsg is the error a request naming a session an administrator
// ended gets.
func adminEndedMsg(id string) string {
	return fmt.Sprintf("session %s was ended by an administrator", id)
}

// endedByAdmin answers a request naming a session an administrator ended.
func (cr *clientReader) endedByAdmin(m *jsonrpc.Message, gwID string) {
	c := cr.c
	if m.Kind != jsonrpc.KindRequest {
		return
	}
	c.replyError(m.ID, jsonrpc.CodeNotFound, adminEndedMsg(gwID), acp.SessionIDObject(gwID))
}

// CloseConn ends the connection id for good, for an administrator: its
// resume token is refused from now on, then closeSockets (if not nil) lets
// the transport close its sockets with its own reason, before the
// connection ends as Close does. An unknown id is ErrNoSuchConn. It
// returns whose connection it was.
func (r *Relay) CloseConn(id, by string, closeSockets func()) (Owner, error) {
	var c *Conn
	r.mu.Lock()
	for cc := range r.conns {
		if cc.id == id {
			c = cc
			break
		}
	}
	if c != nil && c.token != "" {
		delete(r.resumable, c.token)
	}
	r.mu.Unlock()
	if c == nil {
		return Owner{}, fmt.Errorf("%w: %q", ErrNoSuchConn, id)
	}
	if closeSockets != nil {
		closeSockets()
	}
	c.Close()
	r.log.Info("connection closed by an administrator", "conn", id, "tenant", c.tenant, "by", by)
	return Owner{Tenant: c.tenant, Agent: c.ag.name}, nil
}
