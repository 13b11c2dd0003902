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

// A permission request a standing rule settled names the rule beside by
// "policy"; one a client answered has no rule field.
func TestPermissionResolvedRule(t *testing.T) {
	var m audit.Memory
	tr := New(&m, false)
	s := &observe.Session{ID: "sid", Tenant: "acme", Agent: "default"}
	msg := []byte(`{"params":{"toolCall":{"toolCallId":"t1","title":"Read","kind":"read"}}}`)
	tr.Observe(&observe.Event{Kind: observe.PermissionResolved, Session: s, Msg: msg, By: "policy",
		Rule: `permissions[0] {kind: "read", decide: allow}`, Outcome: []byte(`{"outcome":"selected","optionId":"allow"}`)})
	tr.Observe(&observe.Event{Kind: observe.PermissionResolved, Session: s, Msg: msg, By: "client",
		Outcome: []byte(`{"outcome":"selected","optionId":"allow"}`)})
	evs := m.Events()
	if len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
	want := []audit.Field{audit.F("toolCallId", "t1"), audit.F("outcome", "selected"), audit.F("optionId", "allow"),
		audit.F("by", "policy"), audit.F("rule", `permissions[0] {kind: "read", decide: allow}`)}
	if len(evs[0].Fields) != len(want) {
		t.Fatalf("fields %v, want %v", evs[0].Fields, want)
	}
	for i := range want {
		if evs[0].Fields[i] != want[i] {
			t.Errorf("field %d = %v, want %v", i, evs[0].Fields[i], want[i])
		}
	}
	for _, f := range evs[1].Fields {
		if f.Key == "rule" {
			t.Errorf("a client's answer has a rule field: %v", evs[1].Fields)
		}
	}
}
