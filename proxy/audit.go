package proxy

import (
	"encoding/json"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// The audit trail's events about sessions, permissions, files and policy
// (package audit writes them; the gateway records connections and
// authentication). Every event names the ID the client sees, never the
// agent's, and never a prompt's or a file's contents (a prompt's text
// only with Config.AuditPrompts).

// event records one audit event about c (and sess, when it names one: the
// ID the client sees); nothing when the audit trail is off.
func (c *Conn) event(kind, sess string, fields ...audit.Field) {
	a := c.relay.audit
	if a == nil {
		return
	}
	a.Record(audit.Event{Event: kind, Tenant: c.tenant, Subject: c.subject, Agent: c.ag.name,
		Conn: c.id, Session: sess, Fields: fields})
}

// auditing reports whether the audit trail is on (a caller that must
// build an event's fields checks it first).
func (r *Relay) auditing() bool { return r.audit != nil }

// sessionEvent counts what happened to s (created, loaded, closed, lost)
// and records session.<what>: c is the client that did it, nil when the
// gateway did (its last client gone). reason says why it closed or was
// lost ("" when a client asked).
func (s *Session) sessionEvent(c *Conn, what, reason string) {
	s.ten.event(s.link.ag.metrics, what)
	if s.link.ag.audit == nil {
		return
	}
	fields := []audit.Field{audit.F("cwd", s.cwd)}
	if reason != "" {
		fields = append(fields, audit.F("reason", reason))
	}
	s.record(c, "session."+what, fields...)
}

// record records one audit event about s: c is the client it is about or
// that acted, nil when the gateway acted (no subject, no connection).
func (s *Session) record(c *Conn, kind string, fields ...audit.Field) {
	a := s.link.ag.audit
	if a == nil {
		return
	}
	ev := audit.Event{Event: kind, Tenant: s.ten.name, Agent: s.link.ag.name, Session: s.GatewayID, Fields: fields}
	if c != nil {
		ev.Subject, ev.Conn = c.subject, c.id
	}
	a.Record(ev)
}

// denied counts a refusal by the tenant's policy or limits and records
// policy.denied: at most 20 a second for one connection (a client that
// floods refused messages, or an agent refused notifications, must not
// crowd the trail's other events out); the next one written says how many
// were left out.
func (c *Conn) denied(reason, method string) {
	c.ten.denied(c.ag.metrics, reason)
	if c.relay.audit == nil {
		return
	}
	fields, ok := c.auditLim.Let([]audit.Field{audit.F("reason", reason), audit.F("method", method)})
	if !ok {
		return
	}
	c.event("policy.denied", "", fields...)
}

// permissionFacts is what the audit trail says of a permission request:
// the tool call, and the options offered (never their content).
type permissionFacts struct {
	Params struct {
		ToolCall struct {
			ToolCallID string `json:"toolCallId"`
			Title      string `json:"title"`
			Kind       string `json:"kind"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Name     string `json:"name"`
			Kind     string `json:"kind"`
		} `json:"options"`
	} `json:"params"`
}

// permissionRequested records permission.requested for msg, the agent's
// request as c is sent it (its paths as the tenant sees them).
func (c *Conn) permissionRequested(sess *Session, msg []byte) {
	if c.relay.audit == nil || sess == nil {
		return
	}
	var p permissionFacts
	_ = json.Unmarshal(msg, &p)
	opts := make([]map[string]string, 0, len(p.Params.Options))
	for _, o := range p.Params.Options {
		opts = append(opts, map[string]string{"optionId": o.OptionID, "name": o.Name, "kind": o.Kind})
	}
	tc := p.Params.ToolCall
	sess.record(c, "permission.requested", audit.F("toolCallId", tc.ToolCallID), audit.F("title", tc.Title),
		audit.F("kind", tc.Kind), audit.F("options", opts))
}

// permissionResolved records permission.resolved for in, a permission
// request: outcome is the RequestPermissionOutcome the agent got, by who
// settled it: "client" (c, the client that answered), or the gateway in
// the clients' place: "timeout", "policy", "disconnect", "admin" (an
// administrator ended the session).
func (in *inReq) permissionResolved(c *Conn, by string, outcome []byte) {
	if in.method != mRequestPerm || in.sess == nil || in.link.ag.audit == nil {
		return
	}
	in.link.mu.Lock()
	msg := in.msg
	in.link.mu.Unlock()
	var p permissionFacts
	_ = json.Unmarshal(msg, &p)
	var o struct {
		Outcome  string `json:"outcome"`
		OptionID string `json:"optionId"`
	}
	_ = json.Unmarshal(outcome, &o)
	fields := []audit.Field{audit.F("toolCallId", p.Params.ToolCall.ToolCallID), audit.F("outcome", o.Outcome)}
	if o.OptionID != "" {
		fields = append(fields, audit.F("optionId", o.OptionID))
	}
	fields = append(fields, audit.F("by", by))
	if by != "client" {
		c = nil
	}
	in.sess.record(c, "permission.resolved", fields...)
}

// fsEvent records fs.read or fs.written: path as the tenant sees it, the
// bytes read or written, and by whom: "client" or "gateway" (the
// stand-in). Never the contents.
func (c *Conn) fsEvent(sess *Session, method, path string, n int, by string) {
	if c.relay.audit == nil {
		return
	}
	kind := "fs.read"
	if method == mFsWrite {
		kind = "fs.written"
	}
	fields := []audit.Field{audit.F("path", path), audit.F("bytes", n), audit.F("by", by)}
	if sess == nil {
		c.event(kind, "", fields...)
		return
	}
	sess.record(c, kind, fields...)
}

// permissionRefused records permission.resolved for an agent's permission
// request (raw, as the agent sent it) that the tenant's policy refused
// before any client saw it.
func (s *Session) permissionRefused(raw []byte) {
	if s.link.ag.audit == nil {
		return
	}
	var p permissionFacts
	_ = json.Unmarshal(raw, &p)
	s.record(nil, "permission.resolved", audit.F("toolCallId", p.Params.ToolCall.ToolCallID),
		audit.F("outcome", "refused"), audit.F("by", "policy"))
}

// clientFsDone records what c's client did for the agent's file request
// in, which it answered with m (a result).
func (c *Conn) clientFsDone(in *inReq, m *jsonrpc.Message) {
	if c.relay.audit == nil {
		return
	}
	in.link.mu.Lock()
	msg := in.msg
	in.link.mu.Unlock()
	var req struct {
		Params fsParams `json:"params"`
	}
	_ = json.Unmarshal(msg, &req)
	n := 0
	if in.method == mFsWrite {
		if req.Params.Content != nil {
			n = len(*req.Params.Content)
		}
	} else {
		n = contentLen(m.Payload)
	}
	c.fsEvent(in.sess, in.method, req.Params.Path, n, "client")
}

// standInDone records what the file stand-in did for c's session: path as
// the agent sent it (mapped back to the tenant's view here), n the bytes
// of content it read or wrote.
func (c *Conn) standInDone(sess *Session, method, path string, n int) {
	if c.relay.audit == nil {
		return
	}
	if mapper := c.ten.mapper.Load(); mapper != nil {
		if p, ok := mapper.ToClient(path); ok {
			path = p
		}
	}
	c.fsEvent(sess, method, path, n, "gateway")
}

// contentLen is the length of the content of a fs/read_text_file result.
func contentLen(result []byte) int {
	var res struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(result, &res)
	return len(res.Content)
}
