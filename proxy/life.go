package proxy

import (
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/turn"
)

// A session's life is one state, moved forward only, under Session.mu:
//
//	live ──► closing ──► ended      (an administrator's EndSession)
//	live ──────────────► ended      (closed, replaced, failed to load, left by its clients)
//	live ──────────────► lost       (its agent process died)
//
// Whatever ends it calls Session.end with the cause (or, where the decision
// that it ends is made under the session's lock, takes an ending there and
// runs it after unlocking). The transition happens once; the teardown it
// returns runs once, off every lock, and the cause alone decides which of
// its steps apply.
type lifeStage uint32

const (
	stageLive    lifeStage = iota // served: its clients may use it
	stageClosing                  // an administrator is ending it: what names it is refused
	stageLost                     // its agent process died; its clients still name it until they close it
	stageEnded                    // over, for every client
)

// endCause is why a session's life ended.
type endCause uint8

const (
	endClosed         endCause = iota // the agent answered a client's session/close or session/delete
	endReplaced                       // another client loaded the same agent session (the newest load wins)
	endLoadFailed                     // the load or resume that routed it here ended without success
	endClientLeft                     // its owner, its only client, left (the connection ended or detached)
	endLastClientLeft                 // its last attached client left after its owner had
	endAdmin                          // an administrator ended it (Relay.EndSession)
	endAgentExited                    // its agent process died: the session is lost
	endRefused                        // its model is outside the tenant's allow-list, and no switch (package models)
	endParentEnded                    // a child session whose parent ended (child.go)
)

// endSteps is what an end does, by cause.
type endSteps struct {
	forget   bool         // every client forgets the session (the one that caused a replacement keeps its index entry)
	notice   string       // every client but the one that caused it is told it ended, and why (methodSessionEnded), and gives up the agent's requests
	queued   string       // prompts waiting for a turn are refused with this ("": none are)
	onAgent  bool         // the agent is told: a running turn cancelled, the session closed where it can be
	event    observe.Kind // the session event observers hear (0: none)
	reason   string       // its reason field
	keepSeen bool         // the clients still name it (lost): they forget it when they close it
}

var endTable = [...]endSteps{
	endClosed:         {forget: true, queued: "the session was closed", event: observe.SessionClosed},
	endReplaced:       {forget: true, notice: "loaded by another client", queued: "the session was loaded again by another client"},
	endLoadFailed:     {forget: true, queued: "the session failed to load"},
	endClientLeft:     {queued: "the session has ended", onAgent: true, event: observe.SessionClosed, reason: "client_left"},
	endLastClientLeft: {queued: "the session has ended", onAgent: true, event: observe.SessionClosed, reason: "last_client_left"},
	endAdmin:          {forget: true, notice: "ended by an administrator", queued: "the session was ended by an administrator", onAgent: true, event: observe.SessionClosed, reason: "ended_by_admin"},
	endAgentExited:    {keepSeen: true, event: observe.SessionLost, reason: "agent_exited"},
	endRefused:        {forget: true, queued: "the session was refused", onAgent: true, event: observe.SessionClosed, reason: "model_not_allowed"},
	endParentEnded:    {forget: true, queued: "its parent session has ended"},
}

// ending is a session's teardown, decided under its lock and run once
// after it is released.
type ending struct {
	s       *Session
	cause   endCause
	by      *Conn // the client that caused it (nil: the gateway)
	owner   *Conn // the owner it had
	members []*member
	slot    *pool.Lease
	queued  []turn.Queued[*outReq]
	running bool // a turn was in flight: the agent is asked to cancel it
}

// stage is where the session is in its life.
func (s *Session) stage() lifeStage { return lifeStage(s.life.Load()) }

// live reports whether the session is served (not closing, lost or ended).
func (s *Session) live() bool { return s.stage() == stageLive }

// isLost reports whether the session's agent process died.
func (s *Session) isLost() bool { return s.stage() == stageLost }

// closing marks the session as being ended by an administrator: false if
// it was not live (ended, lost, or another administrator got there first).
func (s *Session) closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stage() != stageLive {
		return false
	}
	s.life.Store(uint32(stageClosing))
	return true
}

// end ends the session for cause; by is the client that caused it (nil:
// the gateway). It reports whether this call ended it: only the first does.
func (s *Session) end(cause endCause, by *Conn) bool {
	s.mu.Lock()
	e := s.endingLocked(cause, by)
	s.mu.Unlock()
	if e == nil && by != nil && (cause == endClosed || cause == endLoadFailed) {
		// Ended (or being ended, or lost) already: the client that closed
		// it, or whose load failed, still lets go of it.
		by.forget(s)
	}
	e.run()
	return e != nil
}

// endingLocked moves the session to the end of its life and takes what the
// teardown gives back, or returns nil if it has ended already (s.mu held).
func (s *Session) endingLocked(cause endCause, by *Conn) *ending {
	st := s.stage()
	if st == stageEnded || st == stageLost || st == stageClosing && cause != endAdmin {
		if st == stageClosing && cause != endAgentExited {
			// The administrator's end runs the teardown; a client leaving
			// meanwhile only lets go of its part.
			if s.owner.Load() == by {
				s.owner.Store(nil)
			}
		}
		return nil
	}
	steps := endTable[cause]
	e := &ending{s: s, cause: cause, by: by, owner: s.owner.Load(), slot: s.slot}
	e.queued, e.running = s.turn.Ending(steps.queued != "" && !steps.keepSeen)
	s.slot = nil
	if steps.keepSeen {
		s.life.Store(uint32(stageLost))
		s.inbound.Close() // the agent's death answers them
		return e
	}
	s.life.Store(uint32(stageEnded))
	s.owner.Store(nil)
	if steps.forget {
		e.members = s.clientList()
		s.members.Store(nil)
	}
	return e
}

// run is the teardown: what the session held is given back, its clients
// let go of it, and the agent hears of it, as its cause says. A nil ending
// (the session had ended already) does nothing.
func (e *ending) run() {
	if e == nil {
		return
	}
	s, steps := e.s, endTable[e.cause]
	e.slot.Release()
	current := s.side.removeSession(s) // not for a replaced one: the newer load's session has its ID
	if current {
		s.owners.Note(s.scope, s.AgentID, s.subject) // its last use (sessions.owners_retention counts from it)
	}
	if s.history != nil { // let the history go
		s.fan.Lock()
		s.history.Release()
		s.fan.Unlock()
	}
	if steps.notice != "" {
		e.tell(steps.notice)
	}
	if steps.forget {
		if e.owner != nil && !(e.cause == endReplaced && e.owner == e.by) {
			e.owner.forget(s)
		}
		for _, m := range e.members {
			m.conn.forget(s)
			s.events().memberLeft(m.conn, m)
		}
	}
	s.failTurns(e.queued, steps.queued)
	why := steps.queued
	if why == "" {
		why = "its agent process exited"
	}
	s.failHeld(why)
	by := e.by
	if e.cause == endAgentExited {
		by = e.owner // its last owner is told it was lost
	}
	if steps.event != 0 && (by != nil || e.cause != endAgentExited) {
		s.events().sessionEvent(by, steps.event, steps.reason)
	}
	for _, k := range s.takeChildren() {
		k.end(endParentEnded, e.by)
	}
	if s.parent != nil { // a child that ends on its own leaves its parent's list
		s.parent.forgetChild(s)
	}
	if steps.onAgent && current && s.parent == nil { // a child is the agent's to end
		params := acp.SessionIDObject(s.AgentID)
		if e.running && e.cause != endAdmin { // EndSession has cancelled its turn already
			s.side.p.Notify(acp.SessionCancel, params)
		}
		if s.side.p.Init().Caps.Close { // advertised (v1 marker, v2 draft marker, or later v2 baseline)
			s.side.fireAndForget(acp.SessionClose, params)
		}
	}
}
