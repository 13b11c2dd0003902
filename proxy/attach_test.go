package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// update is a session/update's update object.
type update struct {
	SessionUpdate string          `json:"sessionUpdate"`
	Content       json.RawMessage `json:"content"`
	ToolCallID    string          `json:"toolCallId"`
	Outcome       json.RawMessage `json:"outcome"`
	StopReason    string          `json:"stopReason"`
	ResolvedBy    *peer           `json:"resolvedBy"`
	SentBy        *peer           `json:"sentBy"`
	Prompt        json.RawMessage `json:"prompt"`
}

func (m msg) update() update {
	var p struct {
		Update update `json:"update"`
	}
	_ = json.Unmarshal(m.Params, &p)
	return p.Update
}

func (tc *testConn) attach(id, sid, extra string) msg {
	tc.t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/attach","params":{"sessionId":"` + sid + `"` + extra + `}}`)
	return tc.await(id, nil)
}

func (tc *testConn) prompt(id, sid, text string) {
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[{"type":"text","text":"` + text + `"}]}}`)
}

// untilMethod reads messages until one with method arrives (returned) and
// collects the session updates on the way.
func (tc *testConn) untilMethod(method string, seen *[]update) msg {
	tc.t.Helper()
	for {
		m := tc.next()
		if m.Method == method {
			return m
		}
		if m.Method == mSessionUpdate && seen != nil {
			*seen = append(*seen, m.update())
		}
	}
}

// Two clients on one session: the attached one gets the history, the
// permission request goes to both, the first answer wins (the owner's copy
// withdrawn with $/cancel_request, the member told with permission_resolved),
// the member hears the turn end, and the owner's clean close leaves the
// session running for the member.
func TestAttachSharesOneSession(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, peerC := newTestConn(t, r, "owner"), newTestConn(t, r, "peer")
	owner.init(`{}`)
	peerC.init(`{}`)
	sid := owner.newSession("1")
	owner.prompt("2", sid, "hello there")
	owner.await("2", nil)

	res := peerC.attach("3", sid, `,"clientInfo":{"name":"phone","version":"1"}`)
	if res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	var ar struct {
		ClientID         string `json:"clientId"`
		ConnectedClients []peer `json:"connectedClients"`
		HistoryPolicy    string `json:"historyPolicy"`
	}
	if err := json.Unmarshal(res.Result, &ar); err != nil || ar.ClientID == "" || len(ar.ConnectedClients) != 2 || ar.HistoryPolicy != "full" {
		t.Fatalf("attach result: %s", res.raw)
	}

	owner.prompt("4", sid, "permission")
	ownerReq := owner.untilMethod(mRequestPerm, nil)
	var peerUpdates []update
	peerReq := peerC.untilMethod(mRequestPerm, &peerUpdates)
	if len(peerUpdates) == 0 || peerUpdates[0].SessionUpdate != "prompt_received" {
		t.Fatalf("the member did not see the prompt first: %+v", peerUpdates)
	}
	peerC.send(`{"jsonrpc":"2.0","id":` + string(peerReq.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	cancel := owner.untilMethod(mCancelRequest, nil)
	if !strings.Contains(string(cancel.Params), `"requestId":`+string(ownerReq.ID)) {
		t.Fatalf("the owner's copy was withdrawn with %s, want its id %s", cancel.raw, ownerReq.ID)
	}
	var resolved, complete *update
	for resolved == nil || complete == nil {
		m := peerC.next()
		u := m.update()
		switch u.SessionUpdate {
		case "permission_resolved":
			resolved = &u
		case "turn_complete":
			complete = &u
		}
	}
	if resolved.ResolvedBy == nil || resolved.ResolvedBy.Name != "phone" || !strings.Contains(string(resolved.Outcome), "allow") {
		t.Fatalf("permission_resolved: %+v", resolved)
	}
	if got := owner.await("4", nil); !strings.Contains(string(got.Result), "end_turn") {
		t.Fatalf("the owner's turn: %s", got.raw)
	}

	owner.c.Close()
	peerC.prompt("5", sid, "still here")
	if got := peerC.await("5", nil); got.Error != nil {
		t.Fatalf("the member's prompt after the owner left: %s", got.raw)
	}
}

// A read-only member gets the session's messages but may not write, nor is
// it asked for permissions.
func TestReadOnlyAttachRefusesWrites(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, ro := newTestConn(t, r, "owner"), newTestConn(t, r, "ro")
	owner.init(`{}`)
	ro.init(`{}`)
	sid := owner.newSession("1")
	if res := ro.attach("2", sid, `,"_meta":{"acpgate":{"readOnly":true}}`); res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	for i, req := range []string{
		`"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[]}`,
		`"method":"session/set_mode","params":{"sessionId":"` + sid + `","modeId":"x"}`,
		`"method":"session/close","params":{"sessionId":"` + sid + `"}`,
	} {
		id := string(rune('3' + i))
		ro.send(`{"jsonrpc":"2.0","id":` + id + `,` + req + `}`)
		if got := ro.await(id, nil); got.Error == nil || got.Error.Code != codeReadOnly {
			t.Fatalf("read-only %s: %s, want error %d", req, got.raw, codeReadOnly)
		}
	}
	if res := ro.attach("9", "nonexistent", ""); res.Error == nil || res.Error.Code != -32002 {
		t.Fatalf("attach to an unknown session: %s", res.raw)
	}
}
