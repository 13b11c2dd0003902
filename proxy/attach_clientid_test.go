package proxy

import (
	"encoding/json"
	"testing"

	"github.com/acpgate/acpgate/proxy/multiclient"
)

// attached is what the client-ID test reads of an attach result.
type attached struct {
	ClientID         string             `json:"clientId"`
	ConnectedClients []multiclient.Peer `json:"connectedClients"`
}

// nextPresence reads tc's messages up to the next client_connected or
// client_disconnected update, and returns its kind and client.
func (tc *testConn) nextPresence() (kind string, who multiclient.Peer) {
	tc.t.Helper()
	for {
		var p struct {
			Update struct {
				SessionUpdate string           `json:"sessionUpdate"`
				Client        multiclient.Peer `json:"client"`
			} `json:"update"`
		}
		_ = json.Unmarshal(tc.next().Params, &p)
		if k := p.Update.SessionUpdate; k == "client_connected" || k == "client_disconnected" {
			return k, p.Update.Client
		}
	}
}

// The gateway gives every client of a session its clientId (issue #30 item
// 6): two clients asking for the same one, with the same clientInfo, get
// two; a client asking for the owner's gets another; presence,
// prompt_received and a detach name each by its own.
func TestAttachClientIDsAreTheGateways(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, a, b, c := newTestConn(t, r, "owner"), newTestConn(t, r, "a"), newTestConn(t, r, "b"), newTestConn(t, r, "c")
	for _, tc := range []*testConn{owner, a, b, c} {
		tc.init(`{}`)
	}
	sid := owner.newSession("1")
	const same = `,"historyPolicy":"none","clientId":"phone-1","clientInfo":{"name":"phone","version":"1"}`
	attach := func(tc *testConn, id, extra string) attached {
		t.Helper()
		res := tc.attach(id, sid, extra)
		var r attached
		if res.Error != nil || json.Unmarshal(res.Result, &r) != nil || r.ClientID == "" {
			t.Fatalf("attach: %s", res.raw)
		}
		return r
	}
	ra := attach(a, "2", same)
	rb := attach(b, "2", same)
	if ra.ClientID == "phone-1" || rb.ClientID == "phone-1" || ra.ClientID == rb.ClientID {
		t.Fatalf("clients asking for clientId phone-1 got %q and %q, want two the gateway minted", ra.ClientID, rb.ClientID)
	}
	if len(rb.ConnectedClients) != 3 {
		t.Fatalf("b's connectedClients: %+v, want the owner, a and b", rb.ConnectedClients)
	}
	ownerID := rb.ConnectedClients[0].ClientID
	ids := map[string]bool{}
	for _, p := range rb.ConnectedClients {
		ids[p.ClientID] = true
	}
	if len(ids) != 3 || !ids[ra.ClientID] || !ids[rb.ClientID] || ownerID == "" {
		t.Fatalf("b's connectedClients: %+v, want three distinct IDs, a's %q and b's %q among them", rb.ConnectedClients, ra.ClientID, rb.ClientID)
	}
	if kind, who := a.nextPresence(); kind != "client_connected" || who.ClientID != rb.ClientID {
		t.Fatalf("a was told %s of %+v, want client_connected of b (%s)", kind, who, rb.ClientID)
	}

	// Asking for the owner's ID, or a's, gets neither.
	rc := attach(c, "2", `,"historyPolicy":"none","clientId":"`+ownerID+`"`)
	if ids[rc.ClientID] {
		t.Fatalf("c asked for the owner's clientId %q and got %q, an ID the session has", ownerID, rc.ClientID)
	}
	for _, tc := range []*testConn{a, b} {
		if kind, who := tc.nextPresence(); kind != "client_connected" || who.ClientID != rc.ClientID {
			t.Fatalf("%s was told %s of %+v, want client_connected of c (%s)", tc.c.id, kind, who, rc.ClientID)
		}
	}
	// A second attach on a's connection keeps its ID.
	if again := attach(a, "3", `,"historyPolicy":"none","clientId":"`+rb.ClientID+`"`); again.ClientID != ra.ClientID {
		t.Fatalf("a attached again and got %q, want its own %q", again.ClientID, ra.ClientID)
	}

	// b's prompt is b's for a; b's detach removes b only.
	b.prompt("4", sid, "hello from b")
	var sentBy *multiclient.Peer
	for sentBy == nil {
		if u := a.next().update(); u.SessionUpdate == "prompt_received" {
			sentBy = u.SentBy
			if sentBy == nil {
				t.Fatal("prompt_received without sentBy")
			}
		}
	}
	if sentBy.ClientID != rb.ClientID {
		t.Fatalf("a saw b's prompt sent by %+v, want b (%s)", *sentBy, rb.ClientID)
	}
	b.await("4", nil)
	b.send(`{"jsonrpc":"2.0","id":5,"method":"session/detach","params":{"sessionId":"` + sid + `"}}`)
	b.await("5", nil)
	if kind, who := a.nextPresence(); kind != "client_disconnected" || who.ClientID != rb.ClientID {
		t.Fatalf("after b's detach a was told %s of %+v, want client_disconnected of b (%s)", kind, who, rb.ClientID)
	}
}
