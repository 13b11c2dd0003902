package proxy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/multiclient"
	dto "github.com/prometheus/client_model/go"
)

// update is a session/update's update object.
type update struct {
	SessionUpdate string            `json:"sessionUpdate"`
	Content       json.RawMessage   `json:"content"`
	ToolCallID    string            `json:"toolCallId"`
	Outcome       json.RawMessage   `json:"outcome"`
	StopReason    string            `json:"stopReason"`
	ResolvedBy    *multiclient.Peer `json:"resolvedBy"`
	SentBy        *multiclient.Peer `json:"sentBy"`
	Prompt        json.RawMessage   `json:"prompt"`
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

// sharedSession is a session an owner created and a second client attached
// to (extra: more attach params); r is a relay on the demo agent.
func sharedSession(t *testing.T, r *Relay, extra string) (owner, peerC *testConn, sid string) {
	t.Helper()
	owner, peerC = newTestConn(t, r, "owner"), newTestConn(t, r, "peer")
	owner.init(`{}`)
	peerC.init(`{}`)
	sid = owner.newSession("1")
	if res := peerC.attach("2", sid, extra); res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	return owner, peerC, sid
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
		if m.Method == acp.SessionUpdate && seen != nil {
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
		ClientID         string             `json:"clientId"`
		ConnectedClients []multiclient.Peer `json:"connectedClients"`
		HistoryPolicy    string             `json:"historyPolicy"`
	}
	if err := json.Unmarshal(res.Result, &ar); err != nil || ar.ClientID == "" || len(ar.ConnectedClients) != 2 || ar.HistoryPolicy != "full" {
		t.Fatalf("attach result: %s", res.raw)
	}

	owner.prompt("4", sid, "permission")
	ownerReq := owner.untilMethod(acp.RequestPermission, nil)
	var peerUpdates []update
	peerReq := peerC.untilMethod(acp.RequestPermission, &peerUpdates)
	if len(peerUpdates) == 0 || peerUpdates[0].SessionUpdate != "prompt_received" {
		t.Fatalf("the member did not see the prompt first: %+v", peerUpdates)
	}
	peerC.send(`{"jsonrpc":"2.0","id":` + string(peerReq.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	cancel := owner.untilMethod(acp.CancelRequest, nil)
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
	if complete.StopReason != "end_turn" {
		t.Errorf("turn_complete: stopReason %q, want end_turn", complete.StopReason)
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
	_, ro, sid := sharedSession(t, testPool(t, "demo", nil), `,"_meta":{"acpgate":{"readOnly":true}}`)
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

// A member's prompt while the owner's turn runs waits for it, then runs;
// the owner, a plain client, sees it as user_message_chunk updates.
func TestPromptOfAnotherClientWaitsForTheTurn(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, peerC, sid := sharedSession(t, r, "")
	owner.prompt("3", sid, "slow")
	owner.untilMethod(acp.SessionUpdate, nil) // the turn runs
	peerC.prompt("4", sid, "after you")
	waitFor(t, "the member's prompt to wait", func() bool { return gaugeValue(r.metrics.PromptsQueued) == 1 })
	owner.send(`{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"` + sid + `"}}`)
	if got := owner.await("3", func(m msg) {
		if m.update().SessionUpdate == "user_message_chunk" {
			t.Fatal("the member's prompt was announced before the owner's turn ended")
		}
	}); !strings.Contains(string(got.Result), "cancelled") {
		t.Fatalf("the owner's turn: %s", got.raw)
	}
	for {
		m := owner.next()
		u := m.update()
		if u.SessionUpdate == "user_message_chunk" {
			if !strings.Contains(string(u.Content), "after you") {
				t.Fatalf("the owner saw the member's prompt as %s", u.Content)
			}
			break
		}
		if u.SessionUpdate == "prompt_received" {
			t.Fatal("a plain client got prompt_received")
		}
	}
	if got := peerC.await("4", nil); !strings.Contains(string(got.Result), "end_turn") {
		t.Fatalf("the member's queued prompt: %s", got.raw)
	}
}

// sessions.max_clients bounds a session's clients, its owner included.
func TestAttachRefusedWhenTheSessionIsFull(t *testing.T) {
	r := testPool(t, "demo", nil)
	r.resume.MaxClients = 2
	owner, b, c := newTestConn(t, r, "owner"), newTestConn(t, r, "b"), newTestConn(t, r, "c")
	owner.init(`{}`)
	b.init(`{}`)
	c.init(`{}`)
	sid := owner.newSession("1")
	if res := b.attach("2", sid, ""); res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	if res := c.attach("3", sid, ""); res.Error == nil || res.Error.Code != codeBusy || !strings.Contains(res.Error.Message, "max_clients") {
		t.Fatalf("a third client: %s, want error %d naming max_clients", res.raw, codeBusy)
	}
	b.send(`{"jsonrpc":"2.0","id":4,"method":"session/detach","params":{"sessionId":"` + sid + `"}}`)
	if got := b.await("4", nil); !strings.Contains(string(got.Result), `"detached"`) {
		t.Fatalf("detach: %s", got.raw)
	}
	if res := c.attach("5", sid, ""); res.Error != nil {
		t.Fatalf("attach after a detach: %s", res.raw)
	}
}

func gaugeValue(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}

// A client that declines (cancels, or answers with an error) a permission
// request others may answer settles nothing: the other client's answer
// still reaches the agent. A member attaching again (a reloaded page on a
// resumed connection) gets the result again, and is not added twice.
func TestDeclineSettlesNothingWhileOthersMayAnswer(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, peerC, sid := sharedSession(t, r, "")
	res := peerC.attach("3", sid, "")
	var again struct {
		ConnectedClients []multiclient.Peer `json:"connectedClients"`
	}
	if res.Error != nil || json.Unmarshal(res.Result, &again) != nil || len(again.ConnectedClients) != 2 {
		t.Fatalf("attach again: %s, want two clients", res.raw)
	}
	owner.prompt("4", sid, "permission")
	ownerReq := owner.untilMethod(acp.RequestPermission, nil)
	peerReq := peerC.untilMethod(acp.RequestPermission, nil)
	peerC.send(`{"jsonrpc":"2.0","id":` + string(peerReq.ID) + `,"result":{"outcome":{"outcome":"cancelled"}}}`)
	owner.send(`{"jsonrpc":"2.0","id":` + string(ownerReq.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	var text strings.Builder
	got := owner.await("4", func(m msg) {
		if u := m.update(); u.SessionUpdate == "agent_message_chunk" {
			var c struct {
				Text string `json:"text"`
			}
			_ = json.Unmarshal(u.Content, &c)
			text.WriteString(c.Text)
		}
	})
	if got.Error != nil || !strings.Contains(string(got.Result), "end_turn") {
		t.Fatalf("the turn: %s", got.raw)
	}
	if !strings.Contains(text.String(), "Permission granted") {
		t.Fatalf("the agent replied %q: the owner's allow did not settle the request", text.String())
	}
}

// What waits for a member still replaying its history is bounded: past
// maxBacklog it is dropped and the attach fails rather than grow.
func TestAttachBacklogIsBounded(t *testing.T) {
	m := &member{catching: true}
	msg := make([]byte, 64<<10)
	for range 2 * maxBacklog / len(msg) {
		m.send(nil, clone(msg), Facts{})
	}
	if !m.overrun || m.backlogB > maxBacklog || len(m.backlog)*len(msg) > maxBacklog {
		t.Fatalf("backlog %d bytes in %d messages, overrun %v; want at most %d and overrun", m.backlogB, len(m.backlog), m.overrun, maxBacklog)
	}
}

// What one connection's prompts waiting for other clients' turns may hold
// is bounded over all its sessions: past it a prompt is refused (-32006,
// naming the bound) and the prompts already waiting are untouched; once one
// of them leaves the queue to run, its bytes are free again.
func TestQueuedPromptsBoundedPerConnection(t *testing.T) {
	r := testPool(t, "demo", nil)
	member := newTestConn(t, r, "member")
	member.c.queuedBytes.Max = 1 << 20
	member.init(`{}`)
	var sids []string
	var perms []msg
	var owners []*testConn
	for i := range 2 {
		owner := newTestConn(t, r, fmt.Sprintf("owner%d", i))
		owner.init(`{}`)
		sid := owner.newSession("1")
		if res := member.attach(fmt.Sprint(10+i), sid, ""); res.Error != nil {
			t.Fatalf("attach: %s", res.raw)
		}
		owner.prompt("2", sid, "permission") // the turn waits for the owner's answer
		perms = append(perms, owner.untilMethod(acp.RequestPermission, nil))
		owners, sids = append(owners, owner), append(sids, sid)
	}
	big := strings.Repeat("x", 300<<10)
	for i := range 3 { // 900 KiB waiting, over two sessions
		member.prompt(fmt.Sprint(20+i), sids[i%2], big)
	}
	waiting := member.c.queuedBytes.Held()
	if waiting < 900<<10 || waiting > 1<<20 {
		t.Fatalf("the connection counts %d bytes waiting, want its three prompts'", waiting)
	}
	member.prompt("23", sids[1], big)
	refused := member.await("23", nil)
	if refused.Error == nil || refused.Error.Code != codeBusy || !strings.Contains(refused.Error.Message, "would pass 1 MiB") {
		t.Fatalf("the prompt past the connection's bound: %s", refused.raw)
	}
	if n := member.c.queuedBytes.Held(); n != waiting {
		t.Fatalf("after the refusal the connection counts %d bytes waiting, want %d", n, waiting)
	}
	// The first session's turn ends: a prompt that waited for it runs, and
	// its bytes are free for another.
	owners[0].send(`{"jsonrpc":"2.0","id":` + string(perms[0].ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	if m := owners[0].await("2", nil); m.Error != nil {
		t.Fatalf("the owner's turn: %s", m.raw)
	}
	waitFor(t, "a waiting prompt to run", func() bool { return member.c.queuedBytes.Held() < waiting })
	member.prompt("24", sids[1], big)
	if n := member.c.queuedBytes.Held(); n > 1<<20 || n < waiting {
		t.Fatalf("a prompt within the bound again: the connection counts %d bytes waiting", n)
	}
}

// The same bound over all of a tenant's connections together: two
// connections each well within their own bound pass the tenant's
// together, and the prompt past it is refused naming the tenant's bound;
// the connection that sent it keeps holding only what waits. What waits
// is counted in both, and given back to both when it runs.
func TestQueuedPromptsBoundedPerTenant(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner := newTestConn(t, r, "owner")
	owner.init(`{}`)
	sid := owner.newSession("1")
	ten := owner.c.ten
	ten.queuedBytes.Max = 1 << 20
	var members []*testConn
	for i := range 2 {
		m := newTestConn(t, r, fmt.Sprintf("member%d", i))
		m.init(`{}`)
		if res := m.attach(fmt.Sprint(10+i), sid, ""); res.Error != nil {
			t.Fatalf("attach: %s", res.raw)
		}
		members = append(members, m)
	}
	if members[0].c.ten != ten || members[1].c.ten != ten {
		t.Fatal("the connections are not of one tenant")
	}
	owner.prompt("2", sid, "permission") // the turn waits for the owner's answer
	perm := owner.untilMethod(acp.RequestPermission, nil)
	big := strings.Repeat("x", 300<<10)
	members[0].prompt("20", sid, big)
	members[0].prompt("21", sid, big)
	members[1].prompt("22", sid, big)
	waitFor(t, "three prompts to wait", func() bool { return ten.queuedBytes.Held() >= 900<<10 })
	held1 := members[1].c.queuedBytes.Held()
	if sum := members[0].c.queuedBytes.Held() + held1; ten.queuedBytes.Held() != sum || held1 < 300<<10 {
		t.Fatalf("the tenant counts %d bytes waiting, its connections %d (member1 %d)", ten.queuedBytes.Held(), sum, held1)
	}
	members[1].prompt("23", sid, big)
	refused := members[1].await("23", nil)
	if refused.Error == nil || refused.Error.Code != codeBusy || !strings.Contains(refused.Error.Message, "would pass 1 MiB") ||
		!strings.Contains(refused.Error.Message, "over all its connections") {
		t.Fatalf("the prompt past the tenant's bound: %s", refused.raw)
	}
	if n := members[1].c.queuedBytes.Held(); n != held1 {
		t.Fatalf("after the tenant's refusal its connection counts %d bytes waiting, want %d", n, held1)
	}
	owner.send(`{"jsonrpc":"2.0","id":` + string(perm.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	if m := owner.await("2", nil); m.Error != nil {
		t.Fatalf("the owner's turn: %s", m.raw)
	}
	waitFor(t, "a waiting prompt to run", func() bool { return ten.queuedBytes.Held() < 900<<10 })
	// Given back to the tenant and its connection alike (two steps: the
	// counts agree once both are done).
	waitFor(t, "the tenant's count to agree with its connections'", func() bool {
		return ten.queuedBytes.Held() == members[0].c.queuedBytes.Held()+members[1].c.queuedBytes.Held()
	})
}

// A drain that runs out of grace cancels the turn running, and refuses the
// prompts waiting for it (never sent) with an error that says so, instead
// of answering them "cancelled" as if they had run.
func TestCancelPromptsRefusesWaitingPrompts(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, member, sid := sharedSession(t, r, "")
	owner.prompt("3", sid, "permission") // runs until the owner answers, or a cancel
	owner.untilMethod(acp.RequestPermission, nil)
	member.prompt("4", sid, "hello") // waits for the owner's turn
	waitFor(t, "the member's prompt to wait", func() bool { return member.c.queuedBytes.Held() > 0 })
	r.CancelPrompts("", 2*time.Second)
	m := member.await("4", nil)
	if m.Error == nil || !strings.Contains(m.Error.Message, "shutting down") {
		t.Fatalf("the waiting prompt: %s; want an error saying the gateway is shutting down", m.raw)
	}
	if m := owner.await("3", nil); m.Error != nil || !strings.Contains(string(m.Result), `"cancelled"`) {
		t.Fatalf("the running prompt: %s; want stopReason cancelled", m.raw)
	}
}
