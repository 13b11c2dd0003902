package proxy

import (
	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Cluster is what the relay asks of the cluster it is one replica of
// (Config.Cluster; nil: this gateway alone).
type Cluster interface {
	// Elsewhere names the live replica, other than this one, that holds the
	// session clients name gwID, of tenant and agent ("": none known).
	Elsewhere(tenant, agent, gwID string) string
	// Ended reports whether an administrator ended the session gwID, on
	// any replica, before any restart.
	Ended(gwID string) bool
}

// Session statuses (session/status, unstable).
const (
	statusOpen  = "open"  // live: in an agent process's memory
	statusSaved = "saved" // the gateway issued it; a load starts it
)

// handleStatus answers session/status for a session the gateway issued,
// from its own table and, in a cluster, the owner registry: "open" when
// it is live here or on another replica, "saved" when its ID opens for
// this client but it is live nowhere (a load starts it, if its agent kept
// it), -32002 when an administrator ended it or its parent. It has no side
// effect, as the method requires; an ID that does not open for this client
// (forged, another tenant's or agent's, or another subject's the tenant's
// sharing hides) gets -32002 as an unknown one does. (A function, not a
// method: clientReader has all the methods the size rule allows.)
func handleStatus(cr *clientReader, m *jsonrpc.Message) {
	if m.Kind != jsonrpc.KindRequest {
		return
	}
	c := cr.c
	f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1)
	gwID, isStr := "", false
	if ok {
		gwID, isStr = m.String(f)
	}
	if !isStr {
		c.replyError(m.ID, jsonrpc.CodeInvalidParams, "params.sessionId must be a string", nil)
		return
	}
	if _, _, ok := cr.open(m, gwID, access.List); !ok {
		return // answered: unknown to this client
	}
	if c.relay.endedByAdminAnywhere(gwID) { // it, or its parent: no load starts it again
		cr.endedByAdmin(m, gwID)
		return
	}
	status := statusSaved
	if s := c.relay.findSession(gwID); s != nil && s.live() {
		status = statusOpen
	} else if cl := c.relay.cluster; cl != nil && cl.Elsewhere(c.ten.name, c.ag.name, gwID) != "" {
		status = statusOpen
	}
	c.Deliver(jsonrpc.AppendResult(nil, m.ID, []byte(`{"status":"`+status+`"}`)))
}

// endedByAdminAnywhere reports whether an administrator ended gwID here
// (since this process started) or, in a cluster, on any replica.
func (r *Relay) endedByAdminAnywhere(gwID string) bool {
	return r.adminEnded.Has(gwID) || r.cluster != nil && r.cluster.Ended(gwID)
}
