package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// The attach suite runs several clients on one live session (session/attach,
// ACP RFD #533) against the real binary and the demo agent: the replay of a
// turn in flight, the first answer to a permission request winning, prompts
// seen by every client, the owner leaving, read-only clients, who may attach,
// sessions.max_clients, a slow client beside fast ones, and attach over
// Streamable HTTP.

// attPeer is a client as the others see it.
type attPeer struct {
	ClientID string `json:"clientId"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	ReadOnly bool   `json:"readOnly"`
}

// attUpdate is the part of a session/update the attach tests look at.
type attUpdate struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		Kind       string          `json:"sessionUpdate"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"toolCallId"`
		Outcome    json.RawMessage `json:"outcome"`
		ResolvedBy *attPeer        `json:"resolvedBy"`
		SentBy     *attPeer        `json:"sentBy"`
		Client     *attPeer        `json:"client"`
		Prompt     json.RawMessage `json:"prompt"`
		StopReason string          `json:"stopReason"`
	} `json:"update"`
}

func (u attUpdate) text() string {
	var c struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(u.Update.Content, &c)
	return c.Text
}

// attUpd parses m as a session/update ("" kind for anything else).
func attUpd(m rpcMsg) attUpdate {
	var u attUpdate
	if m.Method == "session/update" {
		_ = json.Unmarshal(m.Params, &u)
	}
	return u
}

// rfdKinds are the updates only attached clients may get.
var rfdKinds = map[string]bool{"prompt_received": true, "turn_complete": true, "permission_resolved": true,
	"client_connected": true, "client_disconnected": true}

// attachResult is a session/attach result.
type attachResult struct {
	SessionID        string    `json:"sessionId"`
	ClientID         string    `json:"clientId"`
	ConnectedClients []attPeer `json:"connectedClients"`
	HistoryPolicy    string    `json:"historyPolicy"`
	ReadOnly         bool      `json:"readOnly"`
	Meta             struct {
		Acpgate struct {
			Replayed       int    `json:"replayed"`
			HistoryTrimmed bool   `json:"historyTrimmed"`
			Turn           string `json:"turn"`
		} `json:"acpgate"`
	} `json:"_meta"`
}

// attachParams is session/attach's params for a client named name
// (version "1.0"), asking for clientId name+"-1", which the gateway does not
// give: it mints every client's own (issue #30 item 6).
func attachParams(sid, name string, readOnly bool) map[string]any {
	p := map[string]any{"sessionId": sid, "historyPolicy": "full", "clientId": name + "-1",
		"clientInfo": map[string]string{"name": name, "version": "1.0"}}
	if readOnly {
		p["_meta"] = map[string]any{"acpgate": map[string]any{"readOnly": true}}
	}
	return p
}

// tryAttach sends session/attach and returns what arrived before its
// answer (the replay), and the answer.
func tryAttach(t *testing.T, c *client, params map[string]any) ([]rpcMsg, rpcMsg) {
	t.Helper()
	var before []rpcMsg
	res := c.Await(c.Request("session/attach", params), turn, func(m rpcMsg) { before = append(before, m) })
	return before, res
}

// mustAttach attaches c to sid as name and returns the replay and the
// result; every message of the replay must be a session/update of sid.
func mustAttach(t *testing.T, c *client, sid, name string, readOnly bool) ([]rpcMsg, attachResult) {
	t.Helper()
	replay, m := tryAttach(t, c, attachParams(sid, name, readOnly))
	if m.Error != nil {
		t.Fatalf("%s: session/attach: %s", name, m.Raw)
	}
	var r attachResult
	if err := json.Unmarshal(m.Result, &r); err != nil {
		t.Fatalf("%s: attach result: %v: %s", name, err, m.Raw)
	}
	if r.SessionID != sid || r.ClientID == "" || r.ClientID == name+"-1" || r.HistoryPolicy != "full" || r.ReadOnly != readOnly {
		t.Fatalf("%s: attach result %s", name, m.Raw)
	}
	for _, u := range replay {
		if u.Method != "session/update" || attUpd(u).SessionID != sid {
			t.Fatalf("%s: before the attach result: %s", name, u.Raw)
		}
	}
	if r.Meta.Acpgate.Replayed != len(replay) {
		t.Fatalf("%s: the result says %d replayed, %d came", name, r.Meta.Acpgate.Replayed, len(replay))
	}
	return replay, r
}

// readUntil reads c's messages until stop says so and returns them all
// (the last one is the one stop accepted).
func readUntil(t *testing.T, c *client, what string, timeout time.Duration, stop func(rpcMsg) bool) []rpcMsg {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got []rpcMsg
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("no %s within %s; got %d messages", what, timeout, len(got))
		}
		m := c.Next(left)
		got = append(got, m)
		if stop(m) {
			return got
		}
	}
}

func isMethod(method string) func(rpcMsg) bool {
	return func(m rpcMsg) bool { return m.Method == method }
}

func isUpdate(kind string) func(rpcMsg) bool {
	return func(m rpcMsg) bool { return attUpd(m).Update.Kind == kind }
}

var tickRE = regexp.MustCompile(`^tick (\d+) $`)

// tickOf is the number of a "tick N " chunk of the demo agent's slow turn.
func tickOf(m rpcMsg) (int, bool) {
	u := attUpd(m)
	if u.Update.Kind != "agent_message_chunk" {
		return 0, false
	}
	sm := tickRE.FindStringSubmatch(u.text())
	if sm == nil {
		return 0, false
	}
	n, _ := strconv.Atoi(sm[1])
	return n, true
}

// tickAtLeast accepts a "tick N " chunk with N >= n.
func tickAtLeast(n int) func(rpcMsg) bool {
	return func(m rpcMsg) bool { k, ok := tickOf(m); return ok && k >= n }
}

// ticksUnanswered reads c's messages until a "tick N " chunk with N >= n;
// a response to id on the way is fatal (failure says what it means).
func ticksUnanswered(t *testing.T, c *client, id, n int, failure string) []rpcMsg {
	t.Helper()
	return readUntil(t, c, "more ticks", turn, func(m rpcMsg) bool {
		if m.IsResponseTo(id) {
			t.Fatalf("%s: %s", failure, m.Raw)
		}
		return tickAtLeast(n)(m)
	})
}

// slowTurnAttached starts a gateway, an owner with a new session, another
// client attached to it as name, and a slow prompt of the owner's (pid); it
// returns once the attached client has seen tick 2.
func slowTurnAttached(t *testing.T, name string, readOnly bool) (g *gateway, owner, c *client, sid string, pid int) {
	t.Helper()
	g = startGateway(t, gwOpts{})
	owner = dialInit(t, g)
	sid = owner.newSession(t.TempDir())
	c = dialInit(t, g)
	mustAttach(t, c, sid, name, readOnly)

	pid = owner.Request("session/prompt", textPrompt(sid, "slow please"))
	readUntil(t, c, "tick 2", turn, tickAtLeast(2))
	return g, owner, c, sid, pid
}

// phoneAndScreen starts a gateway and an owner with a new session, and
// attaches two more clients to it, "phone" (a, whose clientId is phone)
// and "screen" (b).
func phoneAndScreen(t *testing.T) (g *gateway, owner, a, b *client, sid, phone string) {
	t.Helper()
	g = startGateway(t, gwOpts{})
	owner = dialInit(t, g)
	sid = owner.newSession(t.TempDir())
	a, b = dialInit(t, g), dialInit(t, g)
	_, r := mustAttach(t, a, sid, "phone", false)
	mustAttach(t, b, sid, "screen", false)
	return g, owner, a, b, sid, r.ClientID
}

func ticksIn(msgs []rpcMsg) []int {
	var out []int
	for _, m := range msgs {
		if n, ok := tickOf(m); ok {
			out = append(out, n)
		}
	}
	return out
}

// consecutive fails unless ticks is from, from+1, … (nothing lost or
// repeated).
func consecutive(t *testing.T, who string, ticks []int, from int) {
	t.Helper()
	for i, n := range ticks {
		if n != from+i {
			t.Fatalf("%s: ticks %v: want %d, %d, … without a gap or a repeat", who, ticks, from, from+1)
		}
	}
}

// plainOnly fails if a plain client (not attached) got one of the RFD's
// updates or a message of another session.
func plainOnly(t *testing.T, who, sid string, msgs []rpcMsg) {
	t.Helper()
	for _, m := range msgs {
		u := attUpd(m)
		if rfdKinds[u.Update.Kind] || m.Method == "session/update" && u.SessionID != sid {
			t.Fatalf("%s, a plain client, got %s", who, m.Raw)
		}
	}
}

func responseTo(id int) func(rpcMsg) bool {
	return func(m rpcMsg) bool { return m.IsResponseTo(id) }
}

// agentText concatenates the agent_message_chunk texts of msgs.
func agentText(msgs []rpcMsg) string {
	var b strings.Builder
	for _, m := range msgs {
		if u := attUpd(m); u.Update.Kind == "agent_message_chunk" {
			b.WriteString(u.text())
		}
	}
	return b.String()
}

func wantCode(t *testing.T, what string, m rpcMsg, code int, substr string) {
	t.Helper()
	if m.Error == nil || m.Error.Code != code || !strings.Contains(m.Error.Message, substr) {
		t.Fatalf("%s: %s, want error %d containing %q", what, m.Raw, code, substr)
	}
}

func jsonEq(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

var allow = map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}}

// ---------------------------------------------------------------------------

// TestAttachReplayMidTurn: a plain owner streams a slow turn; two clients
// attach while it runs. Each gets the history (the prompt, ticks 1..k),
// then the result (turn "running"), then the live ticks from k+1: nothing
// lost or repeated. All three see the same ticks, and the attached ones
// hear the turn end.
func TestAttachReplayMidTurn(t *testing.T) {
	g := startGateway(t, gwOpts{})
	owner := dialInit(t, g)
	sid := owner.newSession(t.TempDir())
	const prompt = "a slow one please"
	pid := owner.Request("session/prompt", textPrompt(sid, prompt))
	ownerMsgs := readUntil(t, owner, "tick 3", turn, tickAtLeast(3))

	// attachMidTurn attaches a new client as name and checks the replay,
	// the result and the first live ticks; it returns the client and the
	// ticks it got, and keeps its clientId in ids.
	ids := map[string]string{}
	attachMidTurn := func(name string, clients int) (*client, []rpcMsg) {
		t.Helper()
		c := dialInit(t, g)
		replay, res := mustAttach(t, c, sid, name, false)
		ids[name] = res.ClientID
		if res.Meta.Acpgate.Turn != "running" || res.Meta.Acpgate.HistoryTrimmed {
			t.Fatalf("%s: attach result %+v, want turn running, history not trimmed", name, res)
		}
		if len(res.ConnectedClients) != clients || res.ConnectedClients[0].Name != "e2e" || res.ConnectedClients[clients-1].ClientID != res.ClientID {
			t.Fatalf("%s: connectedClients %+v", name, res.ConnectedClients)
		}
		if u := attUpd(replay[0]); u.Update.Kind != "user_message_chunk" || u.text() != prompt {
			t.Fatalf("%s: the replay starts with %s, want the prompt", name, replay[0].Raw)
		}
		ticks := ticksIn(replay)
		if len(ticks) < 3 {
			t.Fatalf("%s: replayed ticks %v, want at least 1..3", name, ticks)
		}
		consecutive(t, name+"'s replay", ticks, 1)
		k := ticks[len(ticks)-1]
		live := readUntil(t, c, "live ticks", turn, tickAtLeast(k+3))
		consecutive(t, name+" across the replay and live", append(ticks, ticksIn(live)...), 1)
		t.Logf("%s: %d replayed (ticks 1..%d), then live from %d", name, len(replay), k, k+1)
		return c, append(replay, live...)
	}
	a, aMsgs := attachMidTurn("phone", 2)
	b, bMsgs := attachMidTurn("screen", 3)

	owner.Notify("session/cancel", map[string]string{"sessionId": sid})
	more := readUntil(t, owner, "the prompt's answer", turn, responseTo(pid))
	ownerMsgs = append(ownerMsgs, more...)
	if r := stopReason(t, more[len(more)-1]); r != "cancelled" {
		t.Fatalf("stopReason %q", r)
	}
	plainOnly(t, "the owner", sid, ownerMsgs)
	ownerTicks := ticksIn(ownerMsgs)
	consecutive(t, "the owner", ownerTicks, 1)
	for _, m := range []struct {
		name string
		c    *client
		msgs []rpcMsg
	}{{"phone", a, aMsgs}, {"screen", b, bMsgs}} {
		rest := readUntil(t, m.c, "turn_complete", turn, isUpdate("turn_complete"))
		if u := attUpd(rest[len(rest)-1]); u.Update.StopReason != "cancelled" {
			t.Fatalf("%s: %s", m.name, rest[len(rest)-1].Raw)
		}
		all := append(m.msgs, rest...)
		ticks := ticksIn(all)
		consecutive(t, m.name, ticks, 1)
		if len(ticks) != len(ownerTicks) {
			t.Fatalf("%s got ticks 1..%d, the owner 1..%d", m.name, len(ticks), len(ownerTicks))
		}
		if m.name == "phone" {
			var joined bool
			for _, x := range all {
				if u := attUpd(x); u.Update.Kind == "client_connected" && u.Update.Client != nil && u.Update.Client.ClientID == ids["screen"] {
					joined = true
				}
			}
			if !joined {
				t.Fatal("phone was not told that screen attached (client_connected)")
			}
		}
	}
}

// TestAttachFirstAnswerWins: the owner's turn asks a permission; the owner
// and the two attached writers get it, the read-only client not; an
// attached client answers first; the owner's copy is withdrawn with
// $/cancel_request naming its own id, the other attached gets
// $/cancel_request and permission_resolved; the agent gets one answer.
func TestAttachFirstAnswerWins(t *testing.T) {
	g := startGateway(t, gwOpts{config: policyAllowDemo})
	owner := dialInit(t, g)
	sid := owner.newSession(t.TempDir())
	a, b, ro := dialInit(t, g), dialInit(t, g), dialInit(t, g)
	_, phone := mustAttach(t, a, sid, "phone", false)
	mustAttach(t, b, sid, "screen", false)
	mustAttach(t, ro, sid, "watch", true)

	pid := owner.Request("session/prompt", textPrompt(sid, "permission please"))
	ownerMsgs := readUntil(t, owner, "the owner's permission request", turn, isMethod("session/request_permission"))
	ownerReq := ownerMsgs[len(ownerMsgs)-1]
	aMsgs := readUntil(t, a, "phone's permission request", turn, isMethod("session/request_permission"))
	aReq := aMsgs[len(aMsgs)-1]
	bMsgs := readUntil(t, b, "screen's permission request", turn, isMethod("session/request_permission"))
	bReq := bMsgs[len(bMsgs)-1]
	toolCall := func(m rpcMsg) string {
		var p struct {
			ToolCall struct {
				ToolCallID string `json:"toolCallId"`
			} `json:"toolCall"`
		}
		_ = json.Unmarshal(m.Params, &p)
		return p.ToolCall.ToolCallID
	}
	tc := toolCall(ownerReq)
	if tc == "" || toolCall(aReq) != tc || toolCall(bReq) != tc || aReq.Param("sessionId") != sid || bReq.Param("sessionId") != sid {
		t.Fatalf("the copies differ:\n%s\n%s\n%s", ownerReq.Raw, aReq.Raw, bReq.Raw)
	}

	a.Respond(aReq.ID, allow)
	cancelOf := func(who string, msgs []rpcMsg, id json.RawMessage) {
		t.Helper()
		for _, m := range msgs {
			if m.Method == "$/cancel_request" {
				var p struct {
					RequestID json.RawMessage `json:"requestId"`
				}
				_ = json.Unmarshal(m.Params, &p)
				if string(p.RequestID) != string(id) {
					t.Fatalf("%s: %s, want the id it was sent, %s", who, m.Raw, id)
				}
				return
			}
		}
		t.Fatalf("%s: no $/cancel_request", who)
	}
	more := readUntil(t, owner, "$/cancel_request", turn, isMethod("$/cancel_request"))
	cancelOf("the owner", more, ownerReq.ID)
	ownerMsgs = append(ownerMsgs, more...)
	// The withdrawn clients answer late: the agent must not see it.
	owner.Respond(ownerReq.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "reject"}})

	more = readUntil(t, b, "permission_resolved", turn, isUpdate("permission_resolved"))
	cancelOf("screen", more, bReq.ID)
	b.Respond(bReq.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "reject"}})
	resolved := attUpd(more[len(more)-1]).Update
	if resolved.ToolCallID != tc || !jsonEq(resolved.Outcome, []byte(`{"outcome":"selected","optionId":"allow"}`)) ||
		resolved.ResolvedBy == nil || *resolved.ResolvedBy != (attPeer{ClientID: phone.ClientID, Name: "phone", Version: "1.0"}) {
		t.Fatalf("screen's permission_resolved: %s", more[len(more)-1].Raw)
	}

	more = readUntil(t, owner, "the prompt's answer", turn, responseTo(pid))
	ownerMsgs = append(ownerMsgs, more...)
	if r := stopReason(t, more[len(more)-1]); r != "end_turn" {
		t.Fatalf("stopReason %q", r)
	}
	if text := agentText(ownerMsgs); !strings.Contains(text, "Permission granted (allow)") {
		t.Fatalf("the owner's turn said %q", text)
	}
	plainOnly(t, "the owner", sid, ownerMsgs)

	for _, c := range []struct {
		name string
		c    *client
	}{{"phone", a}, {"screen", b}, {"watch", ro}} {
		msgs := readUntil(t, c.c, "turn_complete", turn, isUpdate("turn_complete"))
		var sawResolved bool
		for _, m := range msgs {
			switch {
			case c.name == "watch" && m.Method == "session/request_permission":
				t.Fatalf("the read-only client was asked: %s", m.Raw)
			case c.name == "phone" && m.Method == "$/cancel_request":
				t.Fatalf("the client that answered had its copy withdrawn: %s", m.Raw)
			case attUpd(m).Update.Kind == "permission_resolved":
				sawResolved = true
			}
		}
		if !sawResolved && c.name != "screen" {
			t.Fatalf("%s got no permission_resolved", c.name)
		}
		if !strings.Contains(agentText(msgs), "Permission granted (allow)") {
			t.Fatalf("%s did not see the turn's reply: %q", c.name, agentText(msgs))
		}
	}
	// The late answers have reached the gateway (an echo after them came
	// back); the agent got the one answer, and none of them.
	echoOK(t, owner)
	echoOK(t, b)
	time.Sleep(300 * time.Millisecond)
	if l := g.agentLines("not pending"); len(l) > 0 {
		t.Fatalf("the agent got more than one answer: %q", l)
	}
	if v, _ := metricValue(g.metrics(t), "acpgate_permission_resolutions_total", `outcome="selected"`); v != 1 {
		t.Errorf(`acpgate_permission_resolutions_total{outcome="selected"} = %v, want 1`, v)
	}
}

// TestAttachPromptsSeenByAll: an attached client prompts; the plain owner
// sees the prompt as user_message_chunks (ACP v1), the other attached as
// prompt_received with sentBy; when the turn ends the attached clients
// other than the prompter get turn_complete.
func TestAttachPromptsSeenByAll(t *testing.T) {
	_, owner, a, b, sid, phone := phoneAndScreen(t)
	readUntil(t, a, "client_connected", turn, isUpdate("client_connected")) // screen

	const prompt = "hello from the phone"
	var aMsgs []rpcMsg
	res := a.Await(a.Request("session/prompt", textPrompt(sid, prompt)), turn, func(m rpcMsg) { aMsgs = append(aMsgs, m) })
	if r := stopReason(t, res); r != "end_turn" {
		t.Fatalf("stopReason %q", r)
	}
	if got := agentText(aMsgs); got != "You said: "+prompt {
		t.Fatalf("the prompter's reply %q", got)
	}
	for _, m := range aMsgs {
		if k := attUpd(m).Update.Kind; k == "prompt_received" || k == "user_message_chunk" || m.Method != "session/update" {
			t.Fatalf("the prompter got %s", m.Raw)
		}
	}

	ownerMsgs := readUntil(t, owner, "the turn's end", turn, isUpdate("session_info_update"))
	plainOnly(t, "the owner", sid, ownerMsgs)
	if u := attUpd(ownerMsgs[0]); u.Update.Kind != "user_message_chunk" || u.text() != prompt {
		t.Fatalf("the owner saw first %s, want the prompt as a user_message_chunk", ownerMsgs[0].Raw)
	}
	if got := agentText(ownerMsgs); got != "You said: "+prompt {
		t.Fatalf("the owner saw the reply %q", got)
	}

	bMsgs := readUntil(t, b, "turn_complete", turn, isUpdate("turn_complete"))
	first := attUpd(bMsgs[0]).Update
	if first.Kind != "prompt_received" || first.SentBy == nil || *first.SentBy != (attPeer{ClientID: phone, Name: "phone", Version: "1.0"}) ||
		!jsonEq(first.Prompt, []byte(`[{"type":"text","text":"`+prompt+`"}]`)) {
		t.Fatalf("screen saw first %s, want prompt_received sent by phone", bMsgs[0].Raw)
	}
	if u := attUpd(bMsgs[len(bMsgs)-1]).Update; u.StopReason != "end_turn" {
		t.Fatalf("screen's turn_complete: %s", bMsgs[len(bMsgs)-1].Raw)
	}
	if got := agentText(bMsgs); got != "You said: "+prompt {
		t.Fatalf("screen saw the reply %q", got)
	}
	// The prompter and the plain owner get no turn_complete.
	quiet(t, a, 300*time.Millisecond)
	quiet(t, owner, 0)
}

// TestAttachOwnerLeaves: the owner's clean close (1000) leaves the session
// running for the attached clients; when the last of them detaches the
// session is gone.
func TestAttachOwnerLeaves(t *testing.T) {
	g, owner, a, b, sid, phone := phoneAndScreen(t)
	readUntil(t, a, "client_connected", turn, isUpdate("client_connected"))

	owner.Close()
	for _, c := range []*client{a, b} {
		msgs := readUntil(t, c, "client_disconnected", turn, isUpdate("client_disconnected"))
		if who := attUpd(msgs[len(msgs)-1]).Update.Client; who == nil || who.Name != "e2e" {
			t.Fatalf("client_disconnected: %s, want the owner", msgs[len(msgs)-1].Raw)
		}
	}
	if got := promptOK(t, a, sid, "still there?"); got != "You said: still there?" {
		t.Fatalf("phone's turn after the owner left: %q", got)
	}
	readUntil(t, b, "turn_complete", turn, isUpdate("turn_complete"))
	if got := promptOK(t, b, sid, "me too"); got != "You said: me too" {
		t.Fatalf("screen's turn after the owner left: %q", got)
	}
	readUntil(t, a, "turn_complete", turn, isUpdate("turn_complete"))

	detach := func(c *client, name string) {
		t.Helper()
		m := c.Call("session/detach", map[string]string{"sessionId": sid}, turn)
		if m.Error != nil || !jsonEq(m.Result, []byte(`{"sessionId":"`+sid+`","status":"detached"}`)) {
			t.Fatalf("%s: session/detach: %s", name, m.Raw)
		}
	}
	detach(a, "phone")
	msgs := readUntil(t, b, "client_disconnected", turn, isUpdate("client_disconnected"))
	if who := attUpd(msgs[len(msgs)-1]).Update.Client; who == nil || who.ClientID != phone {
		t.Fatalf("client_disconnected: %s, want phone", msgs[len(msgs)-1].Raw)
	}
	if m := a.Call("session/prompt", textPrompt(sid, "after detach"), turn); m.Error == nil || m.Error.Code != -32002 {
		t.Fatalf("a prompt after detaching: %s, want -32002", m.Raw)
	}
	detach(b, "screen")
	_, m := tryAttach(t, dialInit(t, g), attachParams(sid, "late", false))
	wantCode(t, "an attach after the last client detached", m, -32002, "session not found")
	_, m = tryAttach(t, a, attachParams(sid, "phone", false))
	wantCode(t, "attaching again after the last client detached", m, -32002, "session not found")
}

// TestAttachReadOnly: a read-only client gets the session's updates but
// every write is refused with -32007 (a notification is dropped: the turn
// goes on), and it is never asked for a permission.
func TestAttachReadOnly(t *testing.T) {
	_, owner, ro, sid, pid := slowTurnAttached(t, "watch", true)
	ro.Notify("session/cancel", map[string]string{"sessionId": sid})
	var roMsgs []rpcMsg
	for _, req := range []struct {
		method string
		params map[string]any
	}{
		{"session/prompt", textPrompt(sid, "let me steer")},
		{"session/set_mode", map[string]any{"sessionId": sid, "modeId": "code"}},
		{"session/set_config_option", map[string]any{"sessionId": sid, "configId": "model", "value": "x"}},
		{"session/set_model", map[string]any{"sessionId": sid, "modelId": "x"}},
		{"session/close", map[string]any{"sessionId": sid}},
		{"session/load", map[string]any{"sessionId": sid, "cwd": "/tmp", "mcpServers": []any{}}},
		{"session/resume", map[string]any{"sessionId": sid, "cwd": "/tmp", "mcpServers": []any{}}},
	} {
		// Each is checked (not fatal), so that one wrong answer does not
		// hide the others.
		m := ro.Await(ro.Request(req.method, req.params), turn, func(m rpcMsg) { roMsgs = append(roMsgs, m) })
		if want := "read-only attach: " + req.method + " is not allowed"; m.Error == nil || m.Error.Code != -32007 || m.Error.Message != want {
			t.Errorf("read-only %s: %s, want error -32007 %q (docs/protocol.md, \"Read-only clients\")", req.method, m.Raw, want)
		}
	}
	// The turn was not cancelled: it still streams, unanswered.
	ownerMsgs := ticksUnanswered(t, owner, pid, 2+8, "the owner's turn ended after the read-only client's session/cancel")
	plainOnly(t, "the owner", sid, ownerMsgs)
	owner.Notify("session/cancel", map[string]string{"sessionId": sid})
	if r := stopReason(t, owner.Await(pid, turn, nil)); r != "cancelled" {
		t.Fatalf("stopReason %q", r)
	}
	readUntil(t, ro, "turn_complete", turn, isUpdate("turn_complete"))

	// A permission request goes to the owner only; the read-only client
	// hears how it was resolved.
	pid = owner.Request("session/prompt", textPrompt(sid, "permission please"))
	ownerMsgs = readUntil(t, owner, "the permission request", turn, isMethod("session/request_permission"))
	owner.Respond(ownerMsgs[len(ownerMsgs)-1].ID, allow)
	if r := stopReason(t, owner.Await(pid, turn, nil)); r != "end_turn" {
		t.Fatalf("stopReason %q", r)
	}
	roMsgs = append(roMsgs, readUntil(t, ro, "turn_complete", turn, isUpdate("turn_complete"))...)
	var resolved bool
	for _, m := range roMsgs {
		if m.Method == "session/request_permission" {
			t.Fatalf("the read-only client was asked: %s", m.Raw)
		}
		if u := attUpd(m).Update; u.Kind == "permission_resolved" {
			resolved = u.ResolvedBy != nil && u.ResolvedBy.Name == "e2e"
		}
	}
	if !resolved {
		t.Fatal("the read-only client got no permission_resolved by the owner")
	}
	// It may still leave.
	if m := ro.Call("session/detach", map[string]string{"sessionId": sid}, turn); m.Error != nil {
		t.Fatalf("read-only session/detach: %s", m.Raw)
	}
}

// sharingTenant is a tenant of the sharing gateway: two static tokens (two
// subjects) and its sharing: YAML ("" = the default).
type sharingTenant struct {
	name, sharing string
	tokens        [2]string
}

// sharingGateway starts a gateway with the given tenants.
func sharingGateway(t *testing.T, tenants []*sharingTenant) *gateway {
	t.Helper()
	return sharingGatewayWith(t, tenants, "")
}

// sharingGatewayWith starts a gateway with the given tenants and the
// top-level YAML extra (agent, pool, policy …).
func sharingGatewayWith(t *testing.T, tenants []*sharingTenant, extra string) *gateway {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "session.key")
	writeFile(t, key, []byte(harness.RandomHex(t, 32)+"\n"))
	var b strings.Builder
	fmt.Fprintf(&b, "%ssession_key_file: %q\ntenants:\n", extra, key)
	for _, tn := range tenants {
		root := filepath.Join(dir, tn.name)
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		var sums []string
		for i := range tn.tokens {
			tn.tokens[i] = tn.name + "-" + harness.RandomHex(t, 24)
			sum := sha256.Sum256([]byte(tn.tokens[i]))
			sums = append(sums, strconv.Quote(hex.EncodeToString(sum[:])))
		}
		fmt.Fprintf(&b, "  - name: %s\n    tokens_sha256: [%s]\n    root: %q\n    virtual_root: %s\n",
			tn.name, strings.Join(sums, ", "), root, vroot)
		if tn.sharing != "" {
			fmt.Fprintf(&b, "    sharing: %s\n", tn.sharing)
		}
	}
	return startGateway(t, gwOpts{config: b.String()})
}

// hasAttachCap reports whether an initialize result offers session/attach.
func hasAttachCap(init map[string]any) bool {
	caps, _ := init["agentCapabilities"].(map[string]any)
	sc, _ := caps["sessionCapabilities"].(map[string]any)
	_, ok := sc["attach"]
	return ok
}

// TestAttachWhoMay: the sharing policy decides who may attach: the same
// subject by default, any subject of the tenant with attach: tenant
// (read-only with read_only_for_others), nobody with attach: off. Another
// tenant's attach fails exactly as an unknown session's does.
func TestAttachWhoMay(t *testing.T) {
	acme := &sharingTenant{name: "acme"}
	team := &sharingTenant{name: "team", sharing: "{attach: tenant}"}
	watch := &sharingTenant{name: "watch", sharing: "{attach: tenant, read_only_for_others: true}"}
	closed := &sharingTenant{name: "closed", sharing: "{attach: off}"}
	g := sharingGateway(t, []*sharingTenant{acme, team, watch, closed})

	dialAs := func(token string) (*client, map[string]any) {
		t.Helper()
		c, resp, err := dialWith(t, g, "/acp", bearer(token), []string{"acp"})
		if err != nil {
			t.Fatalf("dial: %v (%s)", err, respText(resp))
		}
		return c, c.initialize()
	}
	// session opens a session as the tenant's first subject.
	session := func(tn *sharingTenant) (*client, string) {
		t.Helper()
		c, init := dialAs(tn.tokens[0])
		if has := hasAttachCap(init); has == (tn == closed) {
			t.Fatalf("%s: initialize offers attach: %v: %v", tn.name, has, init["agentCapabilities"])
		}
		return c, c.newSession(vroot)
	}

	t.Run("same_subject: the same token attaches, another subject is refused", func(t *testing.T) {
		_, sid := session(acme)
		same, _ := dialAs(acme.tokens[0])
		mustAttach(t, same, sid, "same", false)
		// Refused as an unknown session is: its ID tells another subject
		// nothing (test/e2e/subject_test.go has the other methods).
		other, _ := dialAs(acme.tokens[1])
		_, m := tryAttach(t, other, attachParams(sid, "other", false))
		_, unknown := tryAttach(t, other, attachParams(flip(sid), "other", false))
		wantCode(t, "another subject under same_subject", m, -32002, "session not found")
		shape, _ := errorShape(t, m)
		if unknownShape, _ := errorShape(t, unknown); shape != unknownShape {
			t.Errorf("another subject's session: %s\nan unknown one: %s", m.Raw, unknown.Raw)
		}
	})
	t.Run("attach: tenant lets another subject attach", func(t *testing.T) {
		_, sid := session(team)
		other, _ := dialAs(team.tokens[1])
		mustAttach(t, other, sid, "other", false)
		if got := promptOK(t, other, sid, "from another subject"); got != "You said: from another subject" {
			t.Fatalf("its turn: %q", got)
		}
	})
	t.Run("read_only_for_others: another subject attaches read-only", func(t *testing.T) {
		_, sid := session(watch)
		other2, _ := dialAs(watch.tokens[1])
		_, m := tryAttach(t, other2, attachParams(sid, "other2", false)) // not asked for: forced
		var r attachResult
		if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || !r.ReadOnly {
			t.Fatalf("another subject's attach under read_only_for_others: %s, want readOnly true", m.Raw)
		}
		wantCode(t, "its prompt", other2.Call("session/prompt", textPrompt(sid, "steer"), turn), -32007, "read-only")
		same, _ := dialAs(watch.tokens[0])
		mustAttach(t, same, sid, "same", false) // the same subject writes
	})
	t.Run("attach: off refuses even the same subject", func(t *testing.T) {
		_, sid := session(closed)
		same, _ := dialAs(closed.tokens[0])
		_, m := tryAttach(t, same, attachParams(sid, "same", false))
		wantCode(t, "attach: off", m, -32003, "not authorised to attach")
	})
	t.Run("another tenant's session: exactly as an unknown one", func(t *testing.T) {
		_, sid := session(acme)
		intruder, _ := dialAs(team.tokens[0]) // team allows attach: tenant, which must not matter
		_, theirs := tryAttach(t, intruder, attachParams(sid, "intruder", false))
		_, unknown := tryAttach(t, intruder, attachParams(flip(sid), "intruder", false))
		_, garbage := tryAttach(t, intruder, attachParams("no-such-session", "intruder", false))
		shape, got := errorShape(t, theirs)
		if got != sid {
			t.Errorf("data.sessionId %q, want the ID sent", got)
		}
		for _, u := range []struct {
			m  rpcMsg
			id string
		}{{unknown, flip(sid)}, {garbage, "no-such-session"}} {
			s, got := errorShape(t, u.m)
			if s != shape || got != u.id {
				t.Errorf("another tenant's session: %s\nan unknown one: %s", theirs.Raw, u.m.Raw)
			}
		}
		wantCode(t, "another tenant's session", theirs, -32002, "session not found")
	})
	t.Run("metrics", func(t *testing.T) {
		m := g.metrics(t)
		for result, least := range map[string]float64{"ok": 4, "refused": 1, "not_found": 5} {
			if v, _ := metricValue(m, "acpgate_session_attaches_total", `result="`+result+`"`); v < least {
				t.Errorf(`acpgate_session_attaches_total{result=%q} = %v, want at least %v`, result, v, least)
			}
		}
		if v, ok := m["acpgate_attached_clients"]; !ok || v < 4 {
			t.Errorf("acpgate_attached_clients = %v (%v), want at least 4", v, ok)
		}
	})
}

// TestAttachMaxClients: sessions.max_clients counts the owner; the next
// attach is refused with -32006 until a client leaves.
func TestAttachMaxClients(t *testing.T) {
	g := startGateway(t, gwOpts{config: "sessions: {max_clients: 2}\n"})
	owner := dialInit(t, g)
	sid := owner.newSession(t.TempDir())
	a, b := dialInit(t, g), dialInit(t, g)
	mustAttach(t, a, sid, "phone", false)
	_, m := tryAttach(t, b, attachParams(sid, "screen", false))
	wantCode(t, "the third client", m, -32006, "max_clients")
	if m := a.Call("session/detach", map[string]string{"sessionId": sid}, turn); m.Error != nil {
		t.Fatalf("detach: %s", m.Raw)
	}
	mustAttach(t, b, sid, "screen", false)
}

// TestAttachSlowClient: an attached client that stops reading while the
// owner streams a long turn is cut off (1008); the owner's turn, and a
// fast attached client's, go on as fast as without it.
func TestAttachSlowClient(t *testing.T) {
	g := startGateway(t, gwOpts{config: fmt.Sprintf("agent: {command: [%q, demo-agent, \"--chunk-delay=-1ns\"]}\n", binPath) +
		"websocket: {write_timeout: 60s}\n"})
	owner := dialInit(t, g)
	sid := owner.newSession(t.TempDir())
	// A reply of 40,000 chunks, each a session/update of ~200 bytes: some
	// 8 MB, more than a socket's buffers hold.
	text := strings.Repeat("abcdefg ", 40000)
	run := func(what string, others ...*client) time.Duration {
		t.Helper()
		start := time.Now()
		var n int
		m := owner.Await(owner.Request("session/prompt", textPrompt(sid, text)), 2*time.Minute, func(m rpcMsg) {
			if attUpd(m).Update.Kind == "agent_message_chunk" {
				n++
			}
		})
		d := time.Since(start)
		if r := stopReason(t, m); r != "end_turn" || n < len(text)/8 {
			t.Fatalf("%s: stopReason %q after %d chunks", what, r, n)
		}
		for _, c := range others {
			msgs := readUntil(t, c, "turn_complete", 2*time.Minute, isUpdate("turn_complete"))
			if got := agentText(msgs); got != "You said: "+text {
				t.Fatalf("%s: the fast attached client got %d bytes of the reply, want %d", what, len(got), len("You said: "+text))
			}
		}
		t.Logf("%s: the owner's turn of %d chunks took %s", what, n, d.Round(time.Millisecond))
		return d
	}
	alone := run("alone")

	fast := dialInit(t, g)
	mustAttach(t, fast, sid, "fast", false)
	// The slow client: a raw WebSocket that reads its initialize answer and
	// the attach (replay and result), then never reads again.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+g.Addr+"/acp", &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, Subprotocols: []string{"acp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(64 << 20)
	call := func(id int, method string, params any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
		if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("the slow client's %s: %v", method, err)
			}
			var m rpcMsg
			if json.Unmarshal(b, &m) == nil && m.IsResponseTo(id) {
				if m.Error != nil {
					t.Fatalf("the slow client's %s: %s", method, b)
				}
				return
			}
		}
	}
	call(1, "initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}})
	call(2, "session/attach", attachParams(sid, "slow", false))
	readUntil(t, fast, "client_connected", turn, isUpdate("client_connected"))

	before := g.CountLogs("closing slow client", "", "")
	shared := run("with a slow attached client", fast)
	if g.CountLogs("closing slow client", "", "") == before {
		t.Fatal("the slow client was not cut off")
	}
	if limit := 3*alone + 10*time.Second; shared > limit {
		t.Fatalf("the owner's turn took %s beside a slow client, %s alone", shared, alone)
	}
	// What the slow client finds when it reads again: the rest of what
	// was sent, then a close 1008.
	st := websocket.StatusCode(-1)
	for range 1_000_000 {
		if _, _, err := ws.Read(ctx); err != nil {
			st = websocket.CloseStatus(err)
			break
		}
	}
	if st != websocket.StatusPolicyViolation {
		t.Fatalf("the slow client's connection ended with %v, want 1008", st)
	}
	// The session goes on for the others.
	if got := promptOK(t, owner, sid, "and after that client"); got != "You said: and after that client" {
		t.Fatalf("the owner's next turn: %q", got)
	}
}

// TestAttachOverHTTP: a Streamable HTTP client attaches to a WebSocket
// owner's session: the replay, the result and the live updates arrive on
// the session's event stream, and it answers a permission request there.
func TestAttachOverHTTP(t *testing.T) {
	e := newIsoEnv(t)
	g := startGateway(t, gwOpts{config: e.config(e.keyFile, nil)})
	owner := dialToken(t, g, e.tokens["acme"])
	sid := owner.newSession(vroot)
	if got := promptOK(t, owner, sid, "remember this"); got != "You said: remember this" {
		t.Fatalf("the owner's first turn: %q", got)
	}

	hp := &httpPeer{t: t, g: g, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}, token: e.tokens["acme"]}
	hp.initialize()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, events := hp.stream(ctx, sid)
	if resp.StatusCode != 200 {
		t.Fatalf("the session's event stream: %d", resp.StatusCode)
	}
	post := func(body string) {
		t.Helper()
		if resp, b := hp.req(http.MethodPost, body, map[string]string{"Acp-Session-Id": sid}); resp.StatusCode != 202 {
			t.Fatalf("POST %s: %d %q", body, resp.StatusCode, b)
		}
	}
	next := func(what string) rpcMsg {
		t.Helper()
		select {
		case d, ok := <-events:
			if !ok {
				t.Fatalf("the event stream ended before %s", what)
			}
			var m rpcMsg
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatalf("event %q: %v", d, err)
			}
			m.Raw = []byte(d)
			return m
		case <-time.After(turn):
			t.Fatalf("no %s on the event stream within %s", what, turn)
		}
		return rpcMsg{}
	}
	until := func(what string, stop func(rpcMsg) bool) []rpcMsg {
		t.Helper()
		var got []rpcMsg
		for {
			m := next(what)
			got = append(got, m)
			if stop(m) {
				return got
			}
		}
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "att", "method": "session/attach", "params": attachParams(sid, "web", false)})
	post(string(b))
	replay := until("the attach result", func(m rpcMsg) bool { return string(m.ID) == `"att"` })
	res := replay[len(replay)-1]
	replay = replay[:len(replay)-1]
	var r attachResult
	if res.Error != nil || json.Unmarshal(res.Result, &r) != nil || r.ClientID == "" || r.ClientID == "web-1" || r.Meta.Acpgate.Replayed != len(replay) || r.Meta.Acpgate.Turn != "idle" {
		t.Fatalf("attach over HTTP: %s after %d replayed", res.Raw, len(replay))
	}
	if u := attUpd(replay[0]); u.Update.Kind != "user_message_chunk" || u.text() != "remember this" || agentText(replay) != "You said: remember this" {
		t.Fatalf("the replay over HTTP: %d messages, first %s, text %q", len(replay), replay[0].Raw, agentText(replay))
	}

	pid := owner.Request("session/prompt", textPrompt(sid, "permission please"))
	live := until("the permission request", isMethod("session/request_permission"))
	if u := attUpd(live[0]).Update; u.Kind != "prompt_received" || u.SentBy == nil || u.SentBy.Name != "e2e" {
		t.Fatalf("live over HTTP: first %s, want prompt_received from the owner", live[0].Raw)
	}
	req := live[len(live)-1]
	b, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": allow})
	post(string(b))
	ownerMsgs := readUntil(t, owner, "the prompt's answer", turn, responseTo(pid))
	if r := stopReason(t, ownerMsgs[len(ownerMsgs)-1]); r != "end_turn" || !strings.Contains(agentText(ownerMsgs), "Permission granted (allow)") {
		t.Fatalf("the owner's turn: %q %q", r, agentText(ownerMsgs))
	}
	var withdrawn bool
	for _, m := range ownerMsgs {
		withdrawn = withdrawn || m.Method == "$/cancel_request"
	}
	if !withdrawn {
		t.Fatal("the owner's copy was not withdrawn when the HTTP client answered")
	}
	live = until("turn_complete", isUpdate("turn_complete"))
	var resolved bool
	for _, m := range live {
		if u := attUpd(m).Update; u.Kind == "permission_resolved" && u.ResolvedBy != nil && u.ResolvedBy.ClientID == r.ClientID {
			resolved = true
		}
	}
	if !resolved || !strings.Contains(agentText(live), "Permission granted (allow)") {
		t.Fatalf("the HTTP client's live updates: resolved %v, text %q", resolved, agentText(live))
	}
}

// TestAttachLeavingDoesNotSettle: a client that answers its copy of a
// permission request with an error, or leaves, settles nothing for the
// others; a client attaching while the request is pending gets it
// re-issued with an id of its own, and may be the one to answer.
func TestAttachLeavingDoesNotSettle(t *testing.T) {
	g, owner, a, b, sid, _ := phoneAndScreen(t)

	pid := owner.Request("session/prompt", textPrompt(sid, "permission please"))
	ownerMsgs := readUntil(t, owner, "the permission request", turn, isMethod("session/request_permission"))
	aMsgs := readUntil(t, a, "phone's permission request", turn, isMethod("session/request_permission"))
	readUntil(t, b, "screen's permission request", turn, isMethod("session/request_permission"))
	// phone refuses to answer (an error: a page that cannot show it);
	// screen goes away.
	a.Send(map[string]any{"jsonrpc": "2.0", "id": aMsgs[len(aMsgs)-1].ID, "error": map[string]any{"code": -32603, "message": "cannot show it"}})
	b.Close()
	readUntil(t, a, "client_disconnected", turn, isUpdate("client_disconnected"))

	late := dialInit(t, g)
	replay, res := mustAttach(t, late, sid, "late", false)
	if res.Meta.Acpgate.Turn != "running" {
		t.Fatalf("attach while the permission is pending: turn %q", res.Meta.Acpgate.Turn)
	}
	var sawCall bool
	for _, m := range replay {
		sawCall = sawCall || attUpd(m).Update.Kind == "tool_call"
	}
	if !sawCall {
		t.Fatal("the replay has no tool_call the permission request is about")
	}
	reissued := late.Next(turn)
	if reissued.Method != "session/request_permission" || reissued.Param("sessionId") != sid {
		t.Fatalf("after the attach result: %s, want the pending permission request", reissued.Raw)
	}
	late.Respond(reissued.ID, allow)

	more := readUntil(t, owner, "the prompt's answer", turn, responseTo(pid))
	ownerMsgs = append(ownerMsgs, more...)
	if r := stopReason(t, more[len(more)-1]); r != "end_turn" || !strings.Contains(agentText(ownerMsgs), "Permission granted (allow)") {
		t.Fatalf("the owner's turn: %q %q", r, agentText(ownerMsgs))
	}
	var withdrawn int
	for _, m := range ownerMsgs {
		if m.Method == "$/cancel_request" {
			withdrawn++
		}
	}
	if withdrawn != 1 {
		t.Fatalf("the owner's copy was withdrawn %d times, want once (when late answered)", withdrawn)
	}
	msgs := readUntil(t, a, "turn_complete", turn, isUpdate("turn_complete"))
	for _, m := range msgs {
		if u := attUpd(m).Update; u.Kind == "permission_resolved" {
			if u.ResolvedBy == nil || u.ResolvedBy.ClientID != res.ClientID {
				t.Fatalf("phone's permission_resolved: %s, want resolved by late", m.Raw)
			}
			return
		}
	}
	t.Fatal("phone got no permission_resolved")
}

// TestAttachQueuedPrompt: a prompt of an attached client while the owner's
// turn runs waits for it; the owner sees it only once it goes to the agent.
func TestAttachQueuedPrompt(t *testing.T) {
	g, owner, a, sid, pid := slowTurnAttached(t, "phone", false)
	qid := a.Request("session/prompt", textPrompt(sid, "my turn next"))
	ticksUnanswered(t, a, qid, 8, "the queued prompt was answered while the owner's turn ran")
	if v, _ := g.metrics(t)["acpgate_prompts_queued"]; v != 1 {
		t.Errorf("acpgate_prompts_queued = %v while one waits, want 1", v)
	}
	owner.Notify("session/cancel", map[string]string{"sessionId": sid})
	ownerMsgs := readUntil(t, owner, "the owner's answer", turn, responseTo(pid))
	if r := stopReason(t, ownerMsgs[len(ownerMsgs)-1]); r != "cancelled" {
		t.Fatalf("the owner's stopReason %q", r)
	}
	for _, m := range ownerMsgs {
		if u := attUpd(m); u.Update.Kind == "user_message_chunk" {
			t.Fatalf("the owner saw the queued prompt before its own turn ended: %s", m.Raw)
		}
	}
	var aMsgs []rpcMsg
	res := a.Await(qid, turn, func(m rpcMsg) { aMsgs = append(aMsgs, m) })
	if r := stopReason(t, res); r != "end_turn" || !strings.HasSuffix(agentText(aMsgs), "You said: my turn next") {
		t.Fatalf("the queued prompt: %q %q", r, agentText(aMsgs))
	}
	more := readUntil(t, owner, "the queued prompt's turn", turn, isUpdate("session_info_update"))
	if u := attUpd(more[0]); u.Update.Kind != "user_message_chunk" || u.text() != "my turn next" {
		t.Fatalf("the owner saw first %s, want the queued prompt", more[0].Raw)
	}
	if got := agentText(more); got != "You said: my turn next" {
		t.Fatalf("the owner saw %q", got)
	}
	plainOnly(t, "the owner", sid, append(ownerMsgs, more...))
}
