package proxy

import (
	"encoding/json"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/fsstandin"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// The audit trail's events about a connection (policy.denied; the gateway
// records connections and authentication). A session's events reach the
// trail through its observers (events.go, package observe/audittrail).

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

// clientFsDone records what c's client did for the agent's file request
// in, which it answered with m (a result).
func (in *inReq) clientFsDone(c *Conn, m *jsonrpc.Message) {
	if !c.ag.obs.Wants(observe.FileServed) {
		return // nobody watches files: the request and its content are not decoded
	}
	msg := in.message()
	var req struct {
		Params fsstandin.Params `json:"params"`
	}
	_ = json.Unmarshal(msg, &req)
	n := 0
	if in.method == acp.FsWrite {
		if req.Params.Content != nil {
			n = len(*req.Params.Content)
		}
	} else {
		n = acp.ReadContentLen(m.Payload)
	}
	c.fileServed(in.sess, in.method, req.Params.Path, n, "client")
}

// standInDone records what the file stand-in did for c's session: path as
// the agent sent it (mapped back to the tenant's view here), n the bytes
// of content it read or wrote.
func (c *Conn) standInDone(sess *Session, method, path string, n int) {
	if mapper := c.ten.mapper.Load(); mapper != nil {
		if p, ok := mapper.ToClient(path); ok {
			path = p
		}
	}
	c.fileServed(sess, method, path, n, "gateway")
}
