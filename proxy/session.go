package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/history"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
	"github.com/acpgate/acpgate/proxy/turn"
	"github.com/acpgate/acpgate/proxy/usage"
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
	side      *procSide // the process that serves it
	ten       *tenant   // whose session quota it counts against
	info      *observe.Session

	// parent: a subagent's child session, the session that announced it
	// (subagent_update); nil for a session a client made (child.go).
	parent     *Session
	subject    string           // the credential subject that made it, sealed in its ID (Sharing)
	scope      string           // its tenant and agent (sessionid.Scope)
	owners     *access.Owners   // where its maker and last use are noted (Relay.owners)
	attachable bool             // its tenant's sharing lets clients attach: its messages take the fan-out path
	history    *history.History // what session/attach replays; nil: none kept. Guarded by fan.

	turn turn.Turn[*Conn, *outReq] // its prompts: the one in flight, those waiting (package turn)
	// keys are the v2 idempotencyKeys of the prompts sent to its agent
	// (v2turn.go). Guarded by link.mu.
	keys promptKeys
	// inbound are the agent's requests about the session still waiting
	// for a client's answer (a take-over sends them again to the new
	// owner).
	inbound inflight.Set[*inReq]
	// state: the modes, config options and models the agent last reported,
	// for session/attach's result (kept for a session clients may attach to).
	state  multiclient.Record
	models models.Seen // its model selectors as last seen (the allow-list)
	// gate holds its client's messages while a load or resume establishes
	// it under a restricting allow-list (establish.go).
	gate   inflight.Gate[heldMsg]
	meter  usage.Meter   // what its agent reported using
	opened time.Time     // when it was created or loaded here
	life   atomic.Uint32 // its lifeStage (life.go); written under mu

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

	mu sync.Mutex
	// refs counts the connections that refer to the session (the owner,
	// and a lost session's last owner until it closes it). While it is
	// above zero the session holds one of its tenant's session slots
	// (tenant.sessions), once however many refer to it.
	refs int
	// slot is the process's session slot the session holds until it ends.
	slot *pool.Lease
	// children are the child sessions it announced, ended with it.
	children []*Session
}

// newSession makes a session of the side's process owned by c, holding
// slot: id is the agent's session and the subject it belongs to, gwID the
// ID the client named it by ("": a new session, sealed now).
func newSession(l *procSide, c *Conn, id sessionid.Opened, gwID, cwd string, slot *pool.Lease) *Session {
	if gwID == "" {
		gwID = c.relay.sealer.Seal(c.scope, id.Subject, id.Agent)
	}
	s := &Session{GatewayID: gwID, quotedID: jsonrpc.AppendQuote(nil, gwID), AgentID: id.Agent, cwd: cwd, side: l, ten: c.ten,
		slot: slot, subject: id.Subject, scope: c.scope, owners: c.relay.owners, opened: time.Now()}
	s.info = &observe.Session{ID: gwID, Tenant: c.ten.name, Label: c.ten.label, Agent: l.ag.name, Cwd: cwd, Key: sessionKey(l.ag.name, id.Agent)}
	if l.ag.costPerSession {
		s.meter.SetPerSession()
	}
	s.attachable = c.ten.sharing().Attach != SharingOff
	if n := c.relay.resume.HistoryBytes; n > 0 && s.attachable {
		s.history = history.New(n)
	}
	s.owner.Store(c)
	return s
}

// Owner is the connection the session's messages go to (nil: none).
func (s *Session) Owner() *Conn { return s.owner.Load() }

// ownerLeave ends c's ownership, in one decision: while members remain the
// session lives on for them (kept); else it ends (endClientLeft; prompting:
// c had a prompt in flight, cancelled on the agent). owned false: c did not
// own it, or it was not live.
func (s *Session) ownerLeave(c *Conn, prompting bool) (owned, kept bool) {
	s.mu.Lock()
	if s.owner.Load() != c || !s.live() {
		s.mu.Unlock()
		return false, false
	}
	if s.members.Load() != nil {
		s.owner.Store(nil)
		s.mu.Unlock()
		return true, true
	}
	e := s.endingLocked(endClientLeft, c)
	s.mu.Unlock()
	if e != nil {
		e.running = e.running || prompting
	}
	e.run()
	return true, false
}

// moveOwner makes to the owner if from still owns the session and it is
// not lost: a take-over. A turn that ended while detached is forgotten.
func (s *Session) moveOwner(from, to *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owner.Load() != from || !s.live() {
		return false
	}
	s.owner.Store(to)
	s.turn.Taken()
	return true
}

// addRef records that one more connection refers to the session (its
// owner, or a lost session's last owner until it closes it); the first
// takes the tenant's session slot.
func (s *Session) addRef() {
	s.mu.Lock()
	s.refs++
	first := s.refs == 1
	s.mu.Unlock()
	if first {
		s.ten.added(s.side.ag.metrics, 1)
	}
}

// dropRef records that a connection no longer refers to the session; the
// last gives the tenant's session slot back. One more than were added is a
// bug: logged, counted, and ignored.
func (s *Session) dropRef(log *slog.Logger) {
	s.mu.Lock()
	ok := s.refs > 0
	if ok {
		s.refs--
	}
	last := ok && s.refs == 0
	s.mu.Unlock()
	switch {
	case !ok:
		s.side.ag.metrics.DoubleReleases.WithLabelValues("session_holder").Inc()
		log.Error("a session was let go by more connections than held it; ignored", "session", s.GatewayID)
	case last:
		s.ten.added(s.side.ag.metrics, -1)
	}
}

// addSession registers a session the agent now serves for c after a load
// or resume (newSession); cwd is its working directory as the agent got
// it; it holds slot, committed now. Another connection that held the same
// agent session loses it, and is told: the newest load wins (the load has
// passed access.Decide). A create goes through addCreated, which never
// replaces a holder.
func (l *procSide) addSession(c *Conn, id sessionid.Opened, gwID, cwd string, slot *pool.Lease) *Session {
	c.relay.owners.Note(c.scope, id.Agent, id.Subject) // for session/list
	s := newSession(l, c, id, gwID, cwd, slot)
	slot.Commit()
	l.mu.Lock()
	old := l.putSessionLocked(id.Agent, s)
	l.mu.Unlock()
	if old != nil {
		old.end(endReplaced, c) // its members watched the session this load replaces
	}
	return s
}

// addCreated registers the session sid the agent answered a create
// (session/new, fork) with, for c, taking the hold's process slot. A create
// never adopts a session the gateway knows: one live on this process (any
// tenant's), or on another process of the agent for c's tenant (any
// tenant's where tenants share processes), or one recorded as made by
// another subject (access.Owners). Then nothing is registered, nobody is
// disturbed, and known says which it was.
func (l *procSide) addCreated(c *Conn, sid, cwd string, h *hold) (s *Session, known string) {
	if known := l.knownElsewhere(c, sid); known != "" {
		return nil, known
	}
	id := sessionid.Opened{Agent: sid, Subject: c.subject}
	l.mu.Lock()
	if held, _ := l.session([]byte(sid)); held != nil {
		l.mu.Unlock()
		return nil, "live"
	}
	s = newSession(l, c, id, "", cwd, h.takeSlot())
	l.putSessionLocked(sid, s)
	l.mu.Unlock()
	s.slot.Commit()
	c.relay.owners.Note(c.scope, sid, c.subject) // for session/list
	return s, ""
}

// knownElsewhere says why sid, an agent session this process names as new
// (a create's answer, a subagent's child), is one the gateway already
// knows beyond this process ("": it is not): recorded as made by another
// subject than c's, or live on another process of the agent for c's tenant
// (any tenant's where tenants share processes).
func (l *procSide) knownElsewhere(c *Conn, sid string) string {
	if owner := c.relay.owners.Of(c.scope, sid); owner != "" && owner != c.subject {
		return "made by another subject"
	}
	for _, other := range l.ag.sideList() {
		if other == l {
			continue
		}
		if held, _ := other.session([]byte(sid)); held != nil && (!l.ag.isolate || held.ten.name == c.ten.name) {
			return "live on another process"
		}
	}
	return ""
}

// removeSession forgets s (it has ended) and reports whether it was still
// the process's session of its ID (not replaced by a newer load of the same
// agent session, which the agent must keep).
func (l *procSide) removeSession(s *Session) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deleteSessionLocked(s)
}

// truncate shortens s to n bytes for a log line, marking the cut.
func truncate(s string, n int) string { return logx.Truncate(s, n) }

// sessionKey names the agent's session sid the same on every connection,
// replica and restart, without showing sid (observe.Session.Key): 128 bits
// of SHA-256 over the agent's name and sid, in hex.
func sessionKey(agent, sid string) string {
	h := sha256.New()
	h.Write([]byte(agent))
	h.Write([]byte{0})
	h.Write([]byte(sid))
	return hex.EncodeToString(h.Sum(nil)[:16])
}
