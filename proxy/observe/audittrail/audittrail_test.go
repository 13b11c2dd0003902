package audittrail

import (
	"testing"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/observe"
)

// A client that attaches to a session and leaves it is in the trail: who
// (subject, conn), its clientId, whether read-only, and its history policy.
func TestAttachDetach(t *testing.T) {
	var m audit.Memory
	tr := New(&m, false)
	s := &observe.Session{ID: "sid", Tenant: "acme", Agent: "default"}
	who := observe.Client{Conn: "c2", Subject: "token:b"}
	tr.Observe(&observe.Event{Kind: observe.SessionAttached, Session: s, Client: who, ClientID: "web-1", ReadOnly: true, History: "full"})
	tr.Observe(&observe.Event{Kind: observe.SessionDetached, Session: s, Client: who, ClientID: "web-1", ReadOnly: true})
	evs := m.Events()
	if len(evs) != 2 || evs[0].Event != "session.attached" || evs[1].Event != "session.detached" {
		t.Fatalf("events %+v", evs)
	}
	for _, ev := range evs {
		if ev.Tenant != "acme" || ev.Session != "sid" || ev.Conn != "c2" || ev.Subject != "token:b" ||
			ev.Fields[0] != audit.F("clientId", "web-1") || ev.Fields[1] != audit.F("readOnly", true) {
			t.Errorf("%s: %+v", ev.Event, ev)
		}
	}
	if len(evs[0].Fields) != 3 || evs[0].Fields[2] != audit.F("history", "full") {
		t.Errorf("session.attached fields %v, want the history policy last", evs[0].Fields)
	}
}
