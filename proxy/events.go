package proxy

import (
	"encoding/json"
	"time"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/audittrail"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/usage"
)

// What watches a session (metrics, the audit trail, tracing) and what
// decides for it hear of it here, and only here: the session and its turn
// turn what happens into an observe.Event for the agent's observers (built
// in AddAgent: the relay's metrics, then Config.Observers, the audit trail
// and tracing), and ask its deciders (Config.Deciders). Routing code calls
// the functions of this file (a session's through s.events()); it never
// builds an event nor moves a session metric itself (lint_test checks the
// first; metrics.Agent derives the session gauges from the events).

// observers is what watches the agent's sessions: the relay's metrics
// first, then the configured observers, the audit trail and the turns'
// spans (each when it is on).
func (r *Relay) observers(ag *agent, extra []observe.Observer) *observe.Set {
	os := append([]observe.Observer{ag.metrics}, extra...)
	if r.audit != nil {
		os = append(os, audittrail.New(r.audit, r.prompts))
	}
	if r.tracer != nil {
		os = append(os, tracing.New(r.tracer))
	}
	return observe.NewSet(os...)
}

// client is c as observers see it (nil: the gateway).
func (c *Conn) client() observe.Client {
	if c == nil {
		return observe.Client{}
	}
	return observe.Client{Conn: c.id, Subject: c.subject}
}

// sessionEvents is a session as its observers know it: what happens to it
// is told through its methods, and only they (and the few below about no
// session, or about a request) build an observe.Event. A value:
// s.events() costs nothing.
type sessionEvents struct{ s *Session }

// events is how s tells its observers what happens to it.
func (s *Session) events() sessionEvents { return sessionEvents{s} }

// emit gives e, an event of s, to its agent's observers.
func (ev sessionEvents) emit(e *observe.Event) {
	e.Session = ev.s.info
	ev.s.side.ag.obs.Observe(e)
}

// sessionEvent says what happened to the session (observe.SessionCreated,
// Loaded, Closed, Lost): c is the client that did it, nil when the gateway
// did (its last client gone). reason says why it closed or was lost (""
// when a client asked).
func (ev sessionEvents) sessionEvent(c *Conn, what observe.Kind, reason string) {
	ev.emit(&observe.Event{Kind: what, Client: c.client(), Reason: reason})
}

// curTurn is the session's turn in flight as observers know it (nil:
// none).
func (s *Session) curTurn() *observe.Turn {
	if s == nil {
		return nil
	}
	return s.turn.Cur.Load()
}

// refusePrompt asks the deciders whether a prompt of c (blocks, or its
// params) may go to the agent or wait for its turn; a refusal is the error
// c gets.
func (c *Conn) refusePrompt(s *Session, blocks []json.RawMessage, params []byte) *observe.Refusal {
	if !c.ag.dec.DecidesPrompts() {
		return nil
	}
	e := &observe.Event{Kind: observe.TurnStarted, Session: s.info, Client: c.client(), Prompt: blocks, Params: params}
	return c.ag.dec.Prompt(e)
}

// turnStarted makes req, a prompt going to the agent now, its session's
// turn: its time, cost and span count from here. blocks: the prompt's, if
// read already (nil: observers read params).
func (ev sessionEvents) turnStarted(req *outReq, blocks []json.RawMessage, params []byte) {
	s := ev.s
	t := &observe.Turn{Start: time.Now(), Span: req.span}
	req.oturn = t
	s.turn.Cur.Store(t)
	s.turn.FirstUpdate.Store(t.Start.UnixNano())
	s.meter.TurnStarted()
	req.began.Store(t.Start.UnixNano())
	ev.emit(&observe.Event{Kind: observe.TurnStarted, Client: req.conn.client(), Turn: t, Prompt: blocks, Params: params})
}

// usageRejected says an agent's usage report counted nothing, and why;
// e is the caller's event to reuse (nil: a new one).
func (ev sessionEvents) usageRejected(e *observe.Event, reason string) {
	s := ev.s
	if e == nil {
		e = &observe.Event{}
	}
	*e = observe.Event{Kind: observe.UsageRejected, Session: s.info, Reason: reason}
	s.side.ag.obs.Observe(e)
}

// costReported says the agent reported its cumulative cost total of unit
// (a live report, b), an increase of inc as the session's meter counted
// it; e is the caller's event, reused.
func (ev sessionEvents) costReported(e *observe.Event, unit string, inc, total float64, b usage.Budgeted) {
	s := ev.s
	*e = observe.Event{Kind: observe.CostReported, Session: s.info, Turn: s.curTurn(), Currency: s.ten.currencies.Of(unit), Unit: unit,
		Amount: inc, Total: total, First: b.First, From: b.From}
	s.side.ag.obs.Observe(e)
}

// tokensReported says what a prompt's late answer reported using, after
// the gateway had ended its turn.
func (ev sessionEvents) tokensReported(tokens map[string]int64) {
	ev.emit(&observe.Event{Kind: observe.TokensReported, Tokens: tokens})
}

// updated is a session/update of s from its agent (kind: its
// sessionUpdate tag): a usage_update's cost is metered, and observers hear
// of the update. e is the reader's own event, reused.
func (ev sessionEvents) updated(m *jsonrpc.Message, kind []byte, e *observe.Event) {
	s := ev.s
	if string(kind) == "usage_update" {
		ev.meterCost(m, e)
	}
	*e = observe.Event{Kind: observe.Update, Session: s.info, Turn: s.curTurn(), UpdateKind: kind, Params: m.Payload}
	if t := s.turn.FirstUpdate.Load(); t != 0 && s.turn.FirstUpdate.CompareAndSwap(t, 0) {
		e.First, e.Duration = true, time.Since(time.Unix(0, t))
	}
	s.side.ag.obs.Observe(e)
}

// turnEnded counts the end of req's turn once, answered with stop and
// usage (PromptResponse.usage, nil: none): its time, its tokens and cost.
func (req *outReq) turnEnded(stop string, usage []byte) {
	began := req.began.Swap(0)
	if began == 0 {
		return
	}
	s := req.sess
	e := &observe.Event{Kind: observe.TurnEnded, Client: req.conn.client(), Turn: req.oturn, StopReason: stop,
		Duration: time.Since(time.Unix(0, began))}
	if usage != nil {
		e.Tokens = s.events().turnTokens(usage)
		s.meter.NoteTokens(e.Tokens)
	}
	e.Cost = s.meter.TurnCost()
	s.turn.Cur.CompareAndSwap(req.oturn, nil)
	s.events().emit(e)
}

// permissionRequested says that msg, the agent's permission request as c
// is sent it (its paths as the tenant sees them), went to the clients.
func (ev sessionEvents) permissionRequested(c *Conn, msg []byte) {
	s := ev.s
	ev.emit(&observe.Event{Kind: observe.PermissionRequested, Client: c.client(), Turn: s.curTurn(), Msg: msg})
}

// permissionDecided asks the deciders about view, an agent's permission
// request of s as its clients would see it: ok, one decided, and observers
// hear it was asked (before how it was settled).
func (ev sessionEvents) permissionDecided(view []byte) (observe.Decision, bool) {
	s := ev.s
	asked := &observe.Event{Kind: observe.PermissionRequested, Session: s.info, Turn: s.curTurn(), Msg: view}
	d, ok := s.side.ag.dec.Permission(asked)
	if ok {
		ev.emit(asked)
	}
	return d, ok
}

// permissionResolved says how in, a permission request of a session,
// was settled (st; msg is the request as its clients were sent it): by
// the client that answered ("client"), a decider, or the gateway in the
// clients' place (see byTimeout and the others).
func (in *inReq) permissionResolved(st settlement, msg []byte) {
	s := in.sess
	s.events().emit(&observe.Event{Kind: observe.PermissionResolved, Client: st.client.client(), Turn: s.curTurn(), Msg: msg,
		By: st.by, Rule: st.rule, Outcome: st.outcome})
}

// permissionRefused says that an agent's permission request (raw, as the
// agent sent it) was refused by the tenant's policy before any client saw
// it.
func (ev sessionEvents) permissionRefused(raw []byte) {
	ev.emit(&observe.Event{Kind: observe.PermissionResolved, Msg: raw, By: "policy", Outcome: []byte(`{"outcome":"refused"}`)})
}

// memberJoined says c joined s as mem (session/attach answered), with
// the history policy it asked for: counted as an attach and an attached
// client (metrics.Agent), and audited.
func (ev sessionEvents) memberJoined(c *Conn, mem *member, history string) {
	ev.emit(&observe.Event{Kind: observe.SessionAttached, Client: c.client(), ClientID: mem.id, ReadOnly: mem.readOnly, History: history})
}

// memberLeft says c's part in s as mem, a member memberJoined told of, has
// ended: it detached, its connection ended, its re-attach failed, or the
// session ended.
func (ev sessionEvents) memberLeft(c *Conn, mem *member) {
	ev.emit(&observe.Event{Kind: observe.SessionDetached, Client: c.client(), ClientID: mem.id, ReadOnly: mem.readOnly})
}

// attachRefused says an attach of c's failed (result: not_found, refused,
// full or invalid); s is the session it named, if it is live here.
func (c *Conn) attachRefused(s *Session, result string) {
	e := &observe.Event{Kind: observe.AttachRefused, Client: c.client(), Reason: result}
	if s == nil {
		e.Session = &observe.Session{Tenant: c.tenant, Label: c.ten.label, Agent: c.ag.name}
		c.ag.obs.Observe(e)
		return
	}
	s.events().emit(e)
}

// takenOver says c took s over from a detached connection, finding its
// turn running, ended or idle.
func (ev sessionEvents) takenOver(c *Conn, turn string) {
	ev.emit(&observe.Event{Kind: observe.TakenOver, Client: c.client(), Reason: turn})
}

// promptsQueued says n prompts of s began (n > 0) or stopped (n < 0)
// waiting for another client's turn.
func (ev sessionEvents) promptsQueued(n int) {
	if n != 0 {
		ev.emit(&observe.Event{Kind: observe.PromptsQueued, Count: n})
	}
}

// fileServed says what was read or written for the agent of c's session
// (sess may be nil): path as the tenant sees it, n bytes of content, by
// "client" or "gateway" (the stand-in).
func (c *Conn) fileServed(sess *Session, method, path string, n int, by string) {
	e := &observe.Event{Kind: observe.FileServed, Client: c.client(), Method: method, Path: path, Bytes: n, By: by}
	if sess == nil {
		e.Session = &observe.Session{Tenant: c.tenant, Label: c.ten.label, Agent: c.ag.name}
		c.ag.obs.Observe(e)
		return
	}
	sess.events().emit(e)
}
