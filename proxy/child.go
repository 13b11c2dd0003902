package proxy

import (
	"slices"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/sessionid"
)

// Child sessions (ACP subagents: stable in v2, v1 unstable with
// clientCapabilities.subagents). An agent announces a child with
// session/update {sessionId: PARENT, update: {sessionUpdate:
// "subagent_update", sessionId: CHILD, …}} before any of the child's own
// traffic. The gateway makes the child a session of the parent's client:
// the same connection, tenant and subject (sealed in its ID, so the
// sharing rules treat it as the parent and another tenant cannot open it),
// in the process's session table so that the child's own notifications and
// requests route like any session's, and in the connection's index so
// that the client's messages naming it are opened. It ends with its parent
// (endParentEnded); the agent ends its children itself. Its messages go
// with its parent's: on the parent's stream (streamID), to the parent's
// attached clients too, into the parent's history (root).
//
// Every session ID inside an update (the child's, senderSessionId,
// recipientSessionId, background[].sessionId) is sealed on the way out:
// an ID of a session the client holds becomes the ID it knows; any other
// becomes "" (an agent's own session ID never reaches a client).

// childEdits seals the session IDs inside m, an update of s about to go to
// c (kind: its sessionUpdate), appending the edits; a subagent_update
// makes its child.
func (r *agentReader) childEdits(m *jsonrpc.Message, s *Session, c *Conn, kind []byte, edits []jsonrpc.Edit) []jsonrpc.Edit {
	if !acp.CarriesSessionIDs(kind) {
		return edits
	}
	ids := &r.idMsg
	if r.ids.Scan(m.Raw, ids, func(*jsonrpc.Message) *jsonrpc.Spec { return acp.SpecChildSessions }) != nil {
		return edits // it scanned once already
	}
	for _, f := range ids.Fields {
		if f.Kind != jsonrpc.FieldTag || f.Label != acp.LabelChildSessionID {
			continue
		}
		repl := []byte(`""`)
		if sid, ok := ids.String(f); ok && sid != "" {
			if k := r.l.sessionFor(s, c, sid, string(kind) == "subagent_update"); k != nil {
				repl = k.quotedID
			}
		}
		edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: repl})
	}
	return edits
}

// sessionFor is the session of the agent's ID sid as c, the client of s,
// may see it: s itself, another live session c holds, or (create) a new
// child of s. nil: none c may see.
func (l *procSide) sessionFor(s *Session, c *Conn, sid string, create bool) *Session {
	if sid == s.AgentID {
		return s
	}
	if k, _ := l.session([]byte(sid)); k != nil {
		if k.live() && k.Owner() == c && c != nil {
			return k
		}
		return nil // another client's: never named to this one
	}
	if !create || c == nil {
		return nil
	}
	return l.addChild(s, c, sid)
}

// addChild makes sid a child session of parent, held by c (its owner).
// nil: the parent has ended, or sid was taken meanwhile.
func (l *procSide) addChild(parent *Session, c *Conn, sid string) *Session {
	// A child is made as a create is: never of a session the gateway
	// knows (an agent told to announce another's session as its child).
	if known := l.knownElsewhere(c, sid); known != "" {
		c.log.Warn("a subagent's child names a session the gateway knows; not routed", "parent", parent.GatewayID, "known", known)
		return nil
	}
	k := newSession(l, c, sessionid.Opened{Agent: sid, Subject: parent.subject}, "", parent.cwd, nil)
	k.parent = parent
	l.mu.Lock()
	if cur, _ := l.session([]byte(sid)); cur != nil || l.dead {
		l.mu.Unlock()
		return nil
	}
	l.putSessionLocked(sid, k)
	l.mu.Unlock()
	parent.mu.Lock()
	live := parent.live()
	if live {
		parent.children = append(parent.children, k)
	}
	parent.mu.Unlock()
	if !live {
		l.removeSession(k)
		return nil
	}
	c.index(k)
	for _, m := range parent.root().clientList() { // the clients attached to it hold its children too
		m.conn.index(k)
	}
	c.log.Debug("subagent session opened", "session", k.GatewayID, "parent", parent.GatewayID)
	return k
}

// descendants is the child sessions of s, theirs, and so on.
func (s *Session) descendants() []*Session {
	var out []*Session
	for _, k := range s.childList() {
		out = append(append(out, k), k.descendants()...)
	}
	return out
}

// A client attached to a session (session/attach) holds its children too,
// those there at the attach (joinChildren) and those made later
// (addChild): its messages naming a child route to it, as its owner's do,
// with the rights it has on the parent (readOnlyWrite asks the root's
// membership). It lets them go when it leaves the parent (leaveChildren).

// joinChildren makes c, a client attaching to s, hold s's children.
func (c *Conn) joinChildren(s *Session) {
	for _, k := range s.descendants() {
		c.index(k)
	}
}

// leaveChildren lets go of s's children c held as a client of s.
func (c *Conn) leaveChildren(s *Session) {
	for _, k := range s.descendants() {
		if k.Owner() != c {
			c.forget(k)
		}
	}
}

// childList is the child sessions of s.
func (s *Session) childList() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.children)
}

// forgetChild takes k, a child of s that has ended, out of s's children:
// the agent announces children as it likes, and a long-lived parent would
// otherwise keep every one it ever had (and hand ended ones to attaching
// clients).
func (s *Session) forgetChild(k *Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.children = slices.DeleteFunc(s.children, func(c *Session) bool { return c == k })
}

// takeChildren takes the child sessions of s (it is ending).
func (s *Session) takeChildren() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.children
	s.children = nil
	return k
}

// root is the session s's messages fan out with: its root parent (s
// itself for a session a client made).
func (s *Session) root() *Session {
	for s.parent != nil {
		s = s.parent
	}
	return s
}

// streamID is the session a message about s travels with, for a transport
// that routes by session (a Streamable HTTP session stream) and for a
// take-over: its root parent's ID, so that a child's messages reach the
// client on its parent's stream (a client opens none for a child).
func (s *Session) streamID() string { return s.root().GatewayID }

// routesChildren reports whether c takes child sessions: a v2 client
// always, a v1 client that offered clientCapabilities.subagents. Another
// never receives a subagent_update (nor, without its child, the child's
// messages).
func (c *Conn) routesChildren() bool {
	p := c.profile()
	return p.Version >= 2 || p.Subagents
}
