package proxy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/pool"
)

// procSide is the relay's side of one agent process: the routes of the
// messages that cross it. The pool calls it (pool.Handler) with the lines
// the agent writes, once a second to expire what waited too long, and once
// when the process has exited.
type procSide struct {
	// Static after construction.
	p       *pool.Process
	ag      *agent
	fsSlots chan struct{} // file requests the gateway serves in a client's place, in flight

	// Owned by the process's read goroutine (Line).
	reader *agentReader

	// sessions maps the agent's own session IDs to the live sessions: a
	// copy-on-write map, so the reader finds a session without a lock.
	// Written under mu.
	sessions atomic.Pointer[map[string]*Session]
	// loose are the agent's requests about no session waiting for a
	// client (request-scoped elicitation); a session's are its own
	// (Session.inbound). Closed when the process exits.
	loose inflight.Set[*inReq]

	mu        sync.Mutex
	pending   map[int64]*outReq // client→agent requests in flight, by agent-side id
	answering int               // prompt answers taken from pending, not yet delivered to their client
	dead      bool              // the process has exited: nothing more is tracked
	// late are the prompts whose turns the gateway ended without the
	// agent's answer (timed out, cancelled in its place), by agent-side
	// id: an answer that comes after still counts its usage. The oldest
	// of lateOrder are forgotten past maxLate.
	late      map[int64]*Session
	lateOrder []int64
}

// maxLate bounds the late prompt answers a process's side waits for.
const maxLate = 256

// newSide makes the side of a process the agent's pool has just created.
func (ag *agent) newSide(p *pool.Process) pool.Handler {
	l := &procSide{p: p, ag: ag, fsSlots: make(chan struct{}, maxFsStandIn),
		pending: map[int64]*outReq{}}
	empty := map[string]*Session{}
	l.sessions.Store(&empty)
	l.reader = newAgentReader(l)
	ag.mu.Lock()
	ag.sides[p] = l
	ag.mu.Unlock()
	return l
}

func (l *procSide) String() string { return l.p.String() }

// Line routes one line the agent wrote (pool.Handler).
func (l *procSide) Line(line []byte) { l.reader.handle(line) }

// Tick expires the requests that waited too long either way (pool.Handler).
func (l *procSide) Tick(now time.Time) {
	l.expireRequests(now, l.ag.timeouts.Request, l.ag.timeouts.Prompt)
	l.expireInbound(now, l.ag.timeouts.ClientRequest)
}

// Exited fails every route through the process (pool.Handler).
func (l *procSide) Exited(reason error) {
	l.failRoutes(reason)
	l.ag.mu.Lock()
	delete(l.ag.sides, l.p)
	l.ag.mu.Unlock()
}

// session finds the live session of the agent's session ID sid.
func (l *procSide) session(sid []byte) (s *Session, count int) {
	m := *l.sessions.Load()
	return m[string(sid)], len(m) // no allocation for a map index
}

// putSessionLocked publishes the session map with sid → s and returns the
// session it replaced (l.mu held).
func (l *procSide) putSessionLocked(sid string, s *Session) (replaced *Session) {
	cur := *l.sessions.Load()
	next := maps.Clone(cur)
	next[sid] = s
	l.sessions.Store(&next)
	return cur[sid]
}

// deleteSessionLocked publishes the session map without s, if s is still
// the session of its ID (l.mu held).
func (l *procSide) deleteSessionLocked(s *Session) bool {
	cur := *l.sessions.Load()
	if cur[s.AgentID] != s {
		return false
	}
	next := maps.Clone(cur)
	delete(next, s.AgentID)
	l.sessions.Store(&next)
	return true
}

// track registers a client request the process is about to receive and
// assigns its agent-side id; false once the process has exited.
func (l *procSide) track(r *outReq) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return false
	}
	r.agentID, r.side = l.p.NextID(), l
	l.pending[r.agentID] = r
	return true
}

// untrack removes r if it is still in flight, nobody to be answered; false
// if someone else took it (answered, expired, or failed by the agent's
// death).
func (l *procSide) untrack(r *outReq) bool { return l.remove(r, false) }

// take removes r if it is still in flight, for the gateway to answer it
// (outReq.fail); false if someone else took it. A client's prompt counts
// as running until that answer is queued.
func (l *procSide) take(r *outReq) bool { return l.remove(r, true) }

func (l *procSide) remove(r *outReq, answer bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending[r.agentID] != r {
		return false
	}
	delete(l.pending, r.agentID)
	if answer {
		l.answeringLocked(r)
	}
	return true
}

// answeringLocked counts r, a request taken for the gateway to answer, as
// running until its answer is queued if it is a client's prompt (l.mu
// held).
func (l *procSide) answeringLocked(r *outReq) {
	if r.method == acp.SessionPrompt && r.conn != nil && r.sess != nil {
		r.answering = true
		l.answering++
	}
}

// isPending reports whether r is still in flight (not answered, expired
// or failed).
func (l *procSide) isPending(r *outReq) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending[r.agentID] == r
}

// restart sets r's start to now: a prompt that waited for another client's
// turn is timed from when it goes to the agent.
func (l *procSide) restart(r *outReq) {
	l.mu.Lock()
	r.start = time.Now()
	l.mu.Unlock()
}

// fireAndForget sends a request of the gateway's own whose answer nobody
// waits for.
func (l *procSide) fireAndForget(method string, params []byte) {
	l.mu.Lock()
	if l.dead {
		l.mu.Unlock()
		return
	}
	id := l.p.NextID()
	l.pending[id] = &outReq{agentID: id, side: l, method: method, start: time.Now()}
	l.mu.Unlock()
	l.p.SendCtrl(append(jsonrpc.AppendRequest(nil, strconv.AppendInt(nil, id, 10), method, params), '\n'))
}

// answerForClient answers an agent→client request in the client's place:
// a permission request is cancelled, anything else gets error code.
func (l *procSide) answerForClient(agentID []byte, method string, code int, why string) {
	var out []byte
	if method == acp.RequestPermission {
		out = jsonrpc.AppendResult(nil, agentID, []byte(`{"outcome":{"outcome":"cancelled"}}`))
	} else {
		out = jsonrpc.AppendError(nil, agentID, code, why, nil)
	}
	l.p.SendCtrl(append(out, '\n'))
}

// failRoutes answers every request still in flight through the dead
// process, marks its sessions lost and settles the agent's requests
// waiting for a client (agent_exited: nothing is sent to the agent).
func (l *procSide) failRoutes(reason error) {
	inbound := l.inbound() // before its sessions end: a lost session forgets them
	l.loose.Close()
	l.mu.Lock()
	l.dead = true
	pending := l.pending
	l.pending = map[int64]*outReq{}
	for _, r := range pending {
		l.answeringLocked(r)
	}
	sessions := *l.sessions.Load()
	empty := map[string]*Session{}
	l.sessions.Store(&empty)
	l.mu.Unlock()
	for _, s := range sessions {
		s.end(endAgentExited, nil)
	}
	msg := fmt.Sprintf("the agent process exited (%v) before answering", reason)
	for _, r := range pending {
		if r.conn != nil {
			r.failWith(jsonrpc.CodeInternalError, msg, nil)
		}
	}
	for _, in := range inbound {
		st := inPlace(byAgentExited, jsonrpc.CodeInternalError, "the agent process exited")
		st.silent = true
		in.settle(st)
	}
}

// expireRequests answers the client requests an agent has sat on too long.
func (l *procSide) expireRequests(now time.Time, reqTimeout, promptTimeout time.Duration) {
	var expired []*outReq
	l.mu.Lock()
	for id, r := range l.pending {
		limit := reqTimeout
		if r.method == acp.SessionPrompt {
			limit = promptTimeout
		}
		if limit <= 0 || now.Sub(r.start) < limit {
			continue
		}
		delete(l.pending, id)
		l.answeringLocked(r)
		l.expectLateLocked(r)
		expired = append(expired, r)
	}
	l.mu.Unlock()
	for _, r := range expired {
		l.ag.metrics.AgentProtocolErrors.WithLabelValues("request_timeout").Inc()
		if r.conn == nil {
			continue // the gateway's own fire-and-forget request
		}
		tracing.WithTrace(l.p.Log(), r.span).Warn("agent did not answer in time; answered for it", "method", r.method, "waited", now.Sub(r.start).Round(time.Millisecond))
		if r.method == acp.SessionPrompt && r.sess != nil && (!r.sess.shared() || r.sess.turn.IsRunning(r)) {
			// Not for a prompt still waiting: the turn running is another's.
			l.p.Notify(acp.SessionCancel, acp.SessionIDObject(r.sess.AgentID))
		}
		r.failWith(jsonrpc.CodeInternalError,
			fmt.Sprintf("the agent did not answer %s within %s", r.method, now.Sub(r.start).Round(time.Second)), nil)
	}
}

// runningPrompts appends the client prompts in flight through the process
// and counts the prompt answers taken but not yet delivered.
func (l *procSide) runningPrompts(running []*outReq) ([]*outReq, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, req := range l.pending {
		if req.method == acp.SessionPrompt && req.conn != nil && req.sess != nil {
			running = append(running, req)
		}
	}
	return running, l.answering
}

// expectLateLocked notes r, a prompt whose turn the gateway is ending
// without the agent's answer: the answer may still come, and its usage
// counts (agentReader.lateAnswer). Called with l.mu held.
func (l *procSide) expectLateLocked(r *outReq) {
	if r.method != acp.SessionPrompt || r.sess == nil || r.conn == nil || r.began.Load() == 0 {
		return // not a turn that ran
	}
	if l.late == nil {
		l.late = map[int64]*Session{}
	}
	if len(l.lateOrder) >= maxLate {
		delete(l.late, l.lateOrder[0])
		l.lateOrder = l.lateOrder[1:]
	}
	l.late[r.agentID] = r.sess
	l.lateOrder = append(l.lateOrder, r.agentID)
}

// expectLate is expectLateLocked for a prompt already taken.
func (l *procSide) expectLate(r *outReq) {
	l.mu.Lock()
	l.expectLateLocked(r)
	l.mu.Unlock()
}

// takeLate is the session of the late prompt answered by id, if the side
// waits for it (its answer counts once).
func (l *procSide) takeLate(id int64) *Session {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.late[id]
	if s != nil {
		delete(l.late, id)
		if i := slices.Index(l.lateOrder, id); i >= 0 {
			l.lateOrder = slices.Delete(l.lateOrder, i, i+1)
		}
	}
	return s
}
