package proxy

import (
	"encoding/json"
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
)

// An owner that asks for them at initialize (_meta.acpgate.multiClient)
// hears who joins its session, what they prompt (prompt_received, not the
// plain owner's user_message_chunks), how their turns end and who answered
// a permission request; its initialize result names it. A plain owner
// hears none of it.
func TestOwnerHearsMultiClientUpdates(t *testing.T) {
	for _, aware := range []bool{true, false} {
		r := testPool(t, "demo", nil)
		owner, peerC := newTestConn(t, r, "owner"), newTestConn(t, r, "peer")
		meta := ``
		if aware {
			meta = `,"_meta":{"acpgate":{"multiClient":true}}`
		}
		owner.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{},"clientInfo":{"name":"ide","version":"1"}` + meta + `}}`)
		init := owner.await(`"init"`, nil)
		var ir struct {
			Meta struct {
				Acpgate struct{ ClientID string } `json:"acpgate"`
			} `json:"_meta"`
		}
		if err := json.Unmarshal(init.Result, &ir); err != nil || (ir.Meta.Acpgate.ClientID != "") != aware {
			t.Fatalf("aware %v: initialize result %s", aware, init.raw)
		}
		peerC.init(`{}`)
		sid := owner.newSession("1")
		if res := peerC.attach("2", sid, `,"clientInfo":{"name":"phone","version":"1"}`); res.Error != nil {
			t.Fatalf("attach: %s", res.raw)
		}
		peerC.prompt("3", sid, "permission")
		var before []update
		ownerReq := owner.untilMethod(acp.RequestPermission, &before)
		peerC.untilMethod(acp.RequestPermission, nil)
		owner.send(`{"jsonrpc":"2.0","id":` + string(ownerReq.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
		peerC.await("3", nil)
		seen := map[string]int{}
		for _, u := range before {
			seen[u.SessionUpdate]++
		}
		var resolvedBy string
		for seen["turn_complete"] == 0 {
			m := owner.next()
			u := m.update()
			seen[u.SessionUpdate]++
			if u.SessionUpdate == "permission_resolved" && u.ResolvedBy != nil {
				resolvedBy = u.ResolvedBy.ClientID
			}
			if !aware && u.SessionUpdate == "agent_message_chunk" {
				break // a plain owner gets no turn_complete: the turn's last update will do
			}
		}
		if aware {
			if seen["client_connected"] != 1 || seen["prompt_received"] != 1 || seen["user_message_chunk"] != 0 || resolvedBy != ir.Meta.Acpgate.ClientID {
				t.Errorf("an aware owner heard %v, resolved by %q (itself: %q)", seen, resolvedBy, ir.Meta.Acpgate.ClientID)
			}
		} else if seen["client_connected"]+seen["prompt_received"]+seen["permission_resolved"] != 0 || seen["user_message_chunk"] == 0 {
			t.Errorf("a plain owner heard %v", seen)
		}
	}
}
