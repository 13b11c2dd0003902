package proxy

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/pool"
)

// Session is one ACP session as the gateway routes it: the one place that
// says who owns it. Its owner changes only through its methods (a load by
// another connection, a take-over, the owner's end, the agent's death),
// each under the session's lock; the agent's reader loads the owner without
// any lock.
type Session struct {
	// Static after construction.
	GatewayID string    // what the client sees
	quotedID  []byte    // GatewayID as a JSON string, spliced into every update
	AgentID   string    // the agent's own ID
	cwd       string    // its cwd as the client asked for it (the fs stand-in's root without a tenant root)
	link      *procLink // the process that serves it
	ten       *tenant   // whose session quota it counts against

	subject    string   // the credential subject of the client that made it (Sharing)
	attachable bool     // its tenant's sharing lets clients attach: its messages take the fan-out path
	history    *history // what session/attach replays; nil: none kept. Guarded by fan.

	promptStart atomic.Int64              // unix nanos of the running prompt until its first update
	turnTrace   atomic.Pointer[turnTrace] // the traced turn in flight (nil: none or tracing off)
	meter       meter                     // what its agent reported using (usage.go)
	opened      time.Time                 // when it was created or loaded here
	adminEnded  atomic.Bool               // an administrator ended it (Relay.EndSession): refuse what names it

	// members are the clients attached with session/attach: a copy-on-write
	// list (nil: none) the agent's reader loads per message. Written under
	// mu. fan orders what goes to the session's clients (the agent's
	// messages, prompts others sent, presence) against an attach's replay,
	// so that an attaching client gets each message once: in the replay or
	// live (lock order: fan before any Conn or Session lock).
	members atomic.Pointer[[]*member]
	fan     sync.Mutex

	// owner is the connection the session's messages go to; nil once it
	// has none (ended, replaced, lost). Written under mu only.
	owner atomic.Pointer[Conn]

	mu    sync.Mutex
	lost  bool // the agent process died
	ended bool // closed, replaced, or left by its last client: nobody may attach
	// holders counts the connections that hold the session (the owner,
	// and a lost session's last owner until it closes it). While it is
	// above zero the session holds one of its tenant's session slots
	// (tenant.sessions), once however many hold it.
	holders int
	// inbound are the agent's requests about the session still waiting
	// for a client's answer (a take-over sends them again to the new
	// owner).
	inbound map[*inReq]struct{}
	// endedDetached and stopReason: a turn ended while its owner had no
	// socket, and how; a take-over reports it.
	endedDetached bool
	stopReason    string
	// prompt is the session's turn in flight (nil: none).
	prompt *outReq
	// slot is the process's session slot the session holds until it ends.
	slot *pool.Lease
	// queue: prompts of other clients waiting for the turn in flight
	// (session/attach), oldest first. running counts the prompts of the
	// turn sent to the agent and not ended (a client may send a second
	// during its own turn); turnConn is whose turn it is.
	queue    []queuedTurn
	running  int
	turnConn *Conn
	// state: the modes, config options and models the agent last reported,
	// for session/attach's result.
	state sessionState
	// turnEnded is when its last turn ended (the admin API's "since").
	turnEnded time.Time
}

// newSession makes a session of the link's process owned by c, holding
// slot.
func newSession(l *procLink, c *Conn, agentSID, cwd string, slot *pool.Lease) *Session {
	gwID := c.relay.sealer.Seal(c.scope, agentSID)
	s := &Session{GatewayID: gwID, quotedID: jsonrpc.AppendQuote(nil, gwID), AgentID: agentSID, cwd: cwd, link: l, ten: c.ten,
		slot: slot, inbound: map[*inReq]struct{}{}, subject: c.subject, opened: time.Now()}
	s.attachable = c.ten.sharing().Attach != SharingOff
	if n := c.relay.historyBytes(); n > 0 && s.attachable {
		s.history = &history{limit: n}
	}
	s.owner.Store(c)
	return s
}

// Owner is the connection the session's messages go to (nil: none).
func (s *Session) Owner() *Conn { return s.owner.Load() }

// ownerLeave ends c's ownership, in one decision: while members remain the
// session lives on for them (kept); else it has ended, and its slot is
// given back. owned false: c did not own it (or it was lost).
func (s *Session) ownerLeave(c *Conn) (owned, kept bool) {
	s.mu.Lock()
	if s.owner.Load() != c || s.lost {
		s.mu.Unlock()
		return false, false
	}
	s.owner.Store(nil)
	if s.members.Load() != nil {
		s.mu.Unlock()
		return true, true
	}
	s.ended = true
	slot := s.takeSlotLocked()
	s.mu.Unlock()
	slot.Release()
	return true, false
}

// drop ends the session whoever holds it (a failed load, a newer load of
// the same session, session/close) and returns the owner it had.
func (s *Session) drop() *Conn {
	s.mu.Lock()
	owner := s.owner.Swap(nil)
	s.ended = true
	slot := s.takeSlotLocked()
	s.mu.Unlock()
	slot.Release()
	return owner
}

// markLost records that the agent process died; it returns the owner.
func (s *Session) markLost() *Conn {
	s.mu.Lock()
	s.lost = true
	clear(s.inbound) // the agent's death answers them
	slot := s.takeSlotLocked()
	owner := s.owner.Load()
	s.mu.Unlock()
	slot.Release()
	return owner
}

// takeSlotLocked removes the slot, to be released once (s.mu held).
func (s *Session) takeSlotLocked() *pool.Lease {
	slot := s.slot
	s.slot = nil
	return slot
}

// moveOwner makes to the owner if from still owns the session and it is
// not lost: a take-over. A turn that ended while detached is forgotten.
func (s *Session) moveOwner(from, to *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owner.Load() != from || s.lost {
		return false
	}
	s.owner.Store(to)
	s.endedDetached, s.stopReason = false, ""
	return true
}

// held records that one more connection holds the session; the first
// takes the tenant's session slot.
func (s *Session) held() {
	s.mu.Lock()
	s.holders++
	first := s.holders == 1
	s.mu.Unlock()
	if first {
		s.ten.added(s.link.ag.metrics, 1)
	}
}

// unheld records that a connection no longer holds the session; the last
// gives the tenant's session slot back. One more than were held is a bug:
// logged, counted, and ignored.
func (s *Session) unheld(log *slog.Logger) {
	s.mu.Lock()
	ok := s.holders > 0
	if ok {
		s.holders--
	}
	last := ok && s.holders == 0
	s.mu.Unlock()
	switch {
	case !ok:
		s.link.ag.metrics.DoubleReleases.WithLabelValues("session_holder").Inc()
		log.Error("a session was let go by more connections than held it; ignored", "session", s.GatewayID)
	case last:
		s.ten.added(s.link.ag.metrics, -1)
	}
}

// addRequest records an agent request about the session waiting for a
// client; false once the session has been lost (the agent's death answers
// its requests).
func (s *Session) addRequest(in *inReq) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost {
		return false
	}
	s.inbound[in] = struct{}{}
	return true
}

// requestDone forgets an agent request about the session: answered, by
// the client or in its place.
func (s *Session) requestDone(in *inReq) {
	s.mu.Lock()
	delete(s.inbound, in)
	s.mu.Unlock()
}

// requests lists the agent requests about the session still waiting for
// a client.
func (s *Session) requests() []*inReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*inReq, 0, len(s.inbound))
	for in := range s.inbound {
		out = append(out, in)
	}
	return out
}

// isLost reports whether the session's agent process died.
func (s *Session) isLost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// endedWhileDetached records that a turn ended while the owner had no
// socket.
func (s *Session) endedWhileDetached(stopReason string) {
	s.mu.Lock()
	s.endedDetached, s.stopReason = true, stopReason
	s.mu.Unlock()
}

// turnState says what a take-over finds: the owner, whether a turn is
// running, whether one ended while detached, and how.
func (s *Session) turnState() (owner *Conn, running, ended bool, stopReason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owner.Load(), s.prompt != nil, s.endedDetached, s.stopReason
}

// promptStarted records the session's turn in flight, unless it has ended
// already (the agent died as it was sent).
func (s *Session) promptStarted(r *outReq) {
	s.mu.Lock()
	if !r.ended.Load() {
		s.prompt = r
	}
	s.mu.Unlock()
}

// promptDone forgets r, the session's turn, once it has ended, and
// returns the prompt that waited for it, if any: it is the turn now.
func (s *Session) promptDone(r *outReq) (next queuedTurn, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prompt == r {
		s.prompt = nil
		s.turnEnded = time.Now()
	}
	return s.turnEndedLocked(r)
}

// addSession registers a session the agent now serves for c; cwd is its
// working directory as the agent got it; it holds slot, committed now.
// Another connection that held the same agent session loses it: the
// newest load wins.
func (l *procLink) addSession(c *Conn, agentSID, cwd string, slot *pool.Lease) *Session {
	s := newSession(l, c, agentSID, cwd, slot)
	slot.Commit()
	l.mu.Lock()
	old := l.putSessionLocked(agentSID, s)
	l.mu.Unlock()
	if old != nil {
		if prev := old.drop(); prev != nil && prev != c {
			prev.detach(old)
		}
		old.detachMembers() // they watched the session this load replaces
		old.failQueued(nil, "the session was loaded again by another client")
		old.retire()
	}
	return s
}

// removeSession forgets s (closed, failed to load, or ended) and reports
// whether it was still the process's session of its ID (not replaced by a
// newer load of the same agent session, which the agent must keep).
func (l *procLink) removeSession(s *Session) bool {
	l.mu.Lock()
	current := l.deleteSessionLocked(s)
	l.mu.Unlock()
	s.retire()
	return current
}

// finishSession ends s on the agent once no client holds it: a turn still
// running is cancelled, prompts waiting for one are refused, and the
// session is closed where the agent supports session/close. Nothing is
// sent for a session a newer load has replaced.
func (l *procLink) finishSession(s *Session, prompting bool) {
	running := prompting || s.promptRunning()
	current := l.removeSession(s)
	s.failQueued(nil, "the session has ended")
	if !current {
		return
	}
	params := sessionIDObject(s.AgentID)
	if running {
		l.p.Notify(mSessionCancel, params)
	}
	if l.p.Init().Caps.Close { // advertised (v1 marker, v2 draft marker, or later v2 baseline)
		l.fireAndForget(mSessionClose, params)
	}
}

// truncate shortens s to n bytes for a log line, marking the cut.
func truncate(s string, n int) string { return logx.Truncate(s, n) }
