package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/acpclient"
)

// The subject suite is the acceptance test of issue #30, item 1: a session
// belongs to the subject that made it, for every method. One tenant, acme,
// has two static tokens: Alice's and Bob's, two subjects. Alice makes a
// session S; Bob lists, loads, resumes, takes over, attaches, deletes and
// closes it, under each sharing policy (same_subject, the default; tenant;
// tenant with read_only_for_others), over WebSocket and over Streamable
// HTTP. The agent is test/fakeagent with FAKE_MODE=sessions (load with a
// replay, resume, list, close, delete, and a turn that waits for a
// permission). Each row is numbered as in the spec.

const (
	subjWait  = 5 * time.Second        // bounds each wait of the suite
	subjQuiet = 300 * time.Millisecond // how long nothing must come
)

// subjPeer is one client connection of the suite, over either transport.
type subjPeer interface {
	// request sends a request and returns its id.
	request(method string, params map[string]any) int
	// respond answers req, a request of the agent's about a session.
	respond(req rpcMsg, result any)
	// recv returns the next message, or false after timeout.
	recv(timeout time.Duration) (rpcMsg, bool)
}

// subjWS is a subjPeer over one WebSocket.
type subjWS struct{ *client }

func (c subjWS) request(method string, params map[string]any) int { return c.Request(method, params) }
func (c subjWS) respond(req rpcMsg, result any)                   { c.Respond(req.ID, result) }
func (c subjWS) recv(timeout time.Duration) (rpcMsg, bool) {
	return recvConn(c.T, c.Conn, timeout, nil)
}

// recvConn reads conn's next message within timeout (false: none came);
// its end fails the test. got, if set, counts what was received.
func recvConn(t testing.TB, conn *acpclient.Conn, timeout time.Duration, got *int) (rpcMsg, bool) {
	t.Helper()
	select {
	case m, ok := <-conn.In:
		if !ok {
			t.Fatalf("the connection ended: %v", conn.Err())
		}
		if got != nil {
			*got++
		}
		return m, true
	case <-time.After(timeout):
		return rpcMsg{}, false
	}
}

// subjResumable is a subjPeer over a connection that survives its sockets:
// Alice's in the take-over rows.
type subjResumable struct{ *rconn }

func (r subjResumable) request(method string, params map[string]any) int {
	return r.Request(method, params)
}
func (r subjResumable) respond(req rpcMsg, result any) { r.Respond(req.ID, result) }
func (r subjResumable) recv(timeout time.Duration) (rpcMsg, bool) {
	return recvConn(r.t, r.c.Conn, timeout, &r.Got)
}

// subjHTTP is a subjPeer over Streamable HTTP: it listens to a session's
// event stream from the first message naming the session, and merges its
// streams.
type subjHTTP struct {
	*httpTraceClient
	streams map[string]bool
}

func (c *subjHTTP) request(method string, params map[string]any) int {
	c.t.Helper()
	if sid, ok := params["sessionId"].(string); ok && !c.streams[sid] {
		c.streams[sid] = true
		c.listen(sid)
	}
	return c.httpTraceClient.request(method, params, "")
}

func (c *subjHTTP) respond(req rpcMsg, result any) {
	c.t.Helper()
	c.post(acpclient.Response(req.ID, result), map[string]string{"Acp-Session-Id": req.Param("sessionId")})
}

// subjTransports dial an initialized connection with a bearer token.
var subjTransports = []struct {
	name string
	dial func(t *testing.T, g *gateway, token string) subjPeer
}{
	{"websocket", func(t *testing.T, g *gateway, token string) subjPeer { return subjWS{dialToken(t, g, token)} }},
	{"http", func(t *testing.T, g *gateway, token string) subjPeer {
		return &subjHTTP{httpTraceClient: dialHTTPClient(t, g, token), streams: map[string]bool{}}
	}},
}

// subjEnv is one row's gateway, tokens and transport.
type subjEnv struct {
	g          *gateway
	alice, bob string
	dial       func(t *testing.T, g *gateway, token string) subjPeer
}

func (e *subjEnv) aliceConn(t *testing.T) subjPeer { return e.dial(t, e.g, e.alice) }
func (e *subjEnv) bobConn(t *testing.T) subjPeer   { return e.dial(t, e.g, e.bob) }

// --- reading ---

// subjAwait reads p until the answer to id, giving every other message to
// other; with other nil, anything but a session/update fails the test.
func subjAwait(t *testing.T, p subjPeer, what string, id int, other func(rpcMsg)) rpcMsg {
	t.Helper()
	deadline := time.Now().Add(subjWait)
	for {
		m, ok := p.recv(time.Until(deadline))
		if !ok {
			t.Fatalf("%s: no answer within %s", what, subjWait)
		}
		answer, unexpected := acpclient.AwaitStep(m, id, other)
		if answer {
			return m
		}
		if unexpected {
			t.Fatalf("%s: unexpected message while waiting for the answer: %.500s", what, m.Raw)
		}
	}
}

// subjCall sends a request and returns its answer and what came before it.
func subjCall(t *testing.T, p subjPeer, what, method string, params map[string]any) (rpcMsg, []rpcMsg) {
	t.Helper()
	var before []rpcMsg
	m := subjAwait(t, p, what, p.request(method, params), func(m rpcMsg) { before = append(before, m) })
	return m, before
}

// subjUntil reads p until stop accepts a message, and returns them all.
func subjUntil(t *testing.T, p subjPeer, what string, stop func(rpcMsg) bool) []rpcMsg {
	t.Helper()
	deadline := time.Now().Add(subjWait)
	var got []rpcMsg
	for {
		m, ok := p.recv(time.Until(deadline))
		if !ok {
			t.Fatalf("no %s within %s; got %d messages", what, subjWait, len(got))
		}
		got = append(got, m)
		if stop(m) {
			return got
		}
	}
}

// subjFind returns the first message stop accepts: among seen (what p
// received already), or read from p. Over HTTP a load's answer (on the
// connection's stream) and the session's messages (on its own) come in
// either order.
func subjFind(t *testing.T, p subjPeer, what string, seen []rpcMsg, stop func(rpcMsg) bool) rpcMsg {
	t.Helper()
	if i := slices.IndexFunc(seen, stop); i >= 0 {
		return seen[i]
	}
	got := subjUntil(t, p, what, stop)
	return got[len(got)-1]
}

// subjDrain returns what p receives within d.
func subjDrain(p subjPeer, d time.Duration) []rpcMsg {
	var got []rpcMsg
	deadline := time.Now().Add(d)
	for {
		m, ok := p.recv(max(time.Until(deadline), 0))
		if !ok {
			return got
		}
		got = append(got, m)
	}
}

// sessionEnded is the params of an _acpgate/session_ended notification;
// ok is false for any other message.
func sessionEnded(m rpcMsg) (sid, reason string, ok bool) {
	if m.Method != "_acpgate/session_ended" {
		return "", "", false
	}
	var p struct {
		SessionID string `json:"sessionId"`
		Reason    string `json:"reason"`
	}
	_ = json.Unmarshal(m.Params, &p)
	return p.SessionID, p.Reason, true
}

// noneOf fails if msgs hold a message of one of the methods.
func noneOf(t *testing.T, who string, msgs []rpcMsg, methods ...string) {
	t.Helper()
	for _, m := range msgs {
		if slices.Contains(methods, m.Method) {
			t.Fatalf("%s received %.500s", who, m.Raw)
		}
	}
}

// --- steps ---

// promptWorks prompts text in sid on p: the turn must end with end_turn
// after the reply "You said: <text>", and p must receive nothing but the
// session's updates meanwhile, nor an _acpgate/session_ended soon after.
func promptWorks(t *testing.T, p subjPeer, who, sid, text string) {
	t.Helper()
	onUpdate, got := collectText(t, sid)
	m := subjAwait(t, p, who+"'s prompt in S", p.request("session/prompt", textPrompt(sid, text)), func(m rpcMsg) {
		if _, _, ended := sessionEnded(m); ended {
			t.Fatalf("%s was told the session ended: %s", who, m.Raw)
		}
		onUpdate(m)
	})
	if m.Error != nil {
		t.Fatalf("%s's prompt in S: %s; want it to succeed", who, m.Raw)
	}
	if r := stopReason(t, m); r != "end_turn" || got.String() != "You said: "+text {
		t.Fatalf("%s's prompt in S ended %q with the reply %q; want end_turn, %q", who, r, got.String(), "You said: "+text)
	}
	noneOf(t, who, subjDrain(p, subjQuiet), "_acpgate/session_ended")
}

// aliceSession is row 1: Alice's connection makes S, and a prompt in it
// works.
func (e *subjEnv) aliceSession(t *testing.T) (subjPeer, string) {
	t.Helper()
	a := e.aliceConn(t)
	m, _ := subjCall(t, a, "Alice's session/new", "session/new", map[string]any{"cwd": vroot, "mcpServers": []any{}})
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("Alice's session/new: %s", m.Raw)
	}
	promptWorks(t, a, "Alice", sid, "hello from alice")
	return a, sid
}

// subjParams is the params of method naming sid, as Bob sends them.
func subjParams(method, sid string) map[string]any {
	switch method {
	case "session/load", "session/resume":
		return map[string]any{"sessionId": sid, "cwd": vroot, "mcpServers": []any{}}
	case "session/attach":
		return attachParams(sid, "bob", false)
	}
	return map[string]any{"sessionId": sid}
}

// wantErrorCode fails unless m is an error with code.
func wantErrorCode(t *testing.T, what string, m rpcMsg, code int) {
	t.Helper()
	if m.Error == nil || m.Error.Code != code {
		t.Fatalf("%s: %.500s; want error %d", what, m.Raw, code)
	}
}

// listed returns the session IDs p's session/list lists.
func listed(t *testing.T, p subjPeer, who string) []string {
	t.Helper()
	m, _ := subjCall(t, p, who+"'s session/list", "session/list", map[string]any{})
	var res struct {
		Sessions []map[string]any `json:"sessions"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil {
		t.Fatalf("%s's session/list: %.500s", who, m.Raw)
	}
	return listedIDs(res.Sessions)
}

// resultMeta is what the suite reads of a result: readOnly, and
// _meta.acpgate.readOnly.
type resultMeta struct {
	ReadOnly bool `json:"readOnly"`
	Meta     struct {
		Acpgate struct {
			ReadOnly bool `json:"readOnly"`
		} `json:"acpgate"`
	} `json:"_meta"`
}

func parseResultMeta(t *testing.T, what string, m rpcMsg) resultMeta {
	t.Helper()
	var r resultMeta
	if m.Error != nil || json.Unmarshal(m.Result, &r) != nil {
		t.Fatalf("%s: %.500s; want it to succeed", what, m.Raw)
	}
	return r
}

// replayed fails unless p receives the history of sid (session/update
// notifications whose agent text holds Alice's first reply): among before,
// what came before the answer, or soon after it (over HTTP the answer and
// the session's updates may come on different streams, in either order).
// It returns what p received after the answer.
func replayed(t *testing.T, p subjPeer, who, sid string, before []rpcMsg) []rpcMsg {
	t.Helper()
	const want = "You said: hello from alice"
	has := func(msgs []rpcMsg) bool {
		var updates []rpcMsg
		for _, m := range msgs {
			if m.Method == "session/update" && attUpd(m).SessionID == sid {
				updates = append(updates, m)
			}
		}
		return strings.Contains(agentText(updates), want)
	}
	if has(before) {
		return nil
	}
	var after []rpcMsg
	deadline := time.Now().Add(subjWait)
	for !has(after) {
		m, ok := p.recv(time.Until(deadline))
		if !ok {
			t.Fatalf("%s got no replay of S's history (%q) within %s; before the answer: %d messages, after it: %d", who, want, subjWait, len(before), len(after))
		}
		after = append(after, m)
	}
	return after
}

// bobRefused is a row where Bob's method naming S gets the error code from
// the gateway, and S goes on for Alice undisturbed: her next prompt
// works, and she is never told the session ended.
func bobRefused(method string, code int) func(*testing.T, *subjEnv) {
	return func(t *testing.T, e *subjEnv) {
		a, sid := e.aliceSession(t)
		bob := e.bobConn(t)
		m, _ := subjCall(t, bob, "Bob's "+method+" of S", method, subjParams(method, sid))
		wantErrorCode(t, "Bob's "+method+" of Alice's session", m, code)
		promptWorks(t, a, "Alice", sid, "still mine after "+method)
	}
}

// bobAttaches is a row where Bob's session/attach of S succeeds, read-only
// or not.
func bobAttaches(readOnly bool) func(*testing.T, *subjEnv) {
	return func(t *testing.T, e *subjEnv) {
		_, sid := e.aliceSession(t)
		m, _ := subjCall(t, e.bobConn(t), "Bob's session/attach of S", "session/attach", subjParams("session/attach", sid))
		if r := parseResultMeta(t, "Bob's session/attach of Alice's session", m); r.ReadOnly != readOnly {
			t.Fatalf("Bob's session/attach of Alice's session: %s; want readOnly %v", m.Raw, readOnly)
		}
	}
}

// bobLists is a row where Bob's session/list lists S, or does not.
func bobLists(want bool) func(*testing.T, *subjEnv) {
	return func(t *testing.T, e *subjEnv) {
		a, sid := e.aliceSession(t)
		if got := listed(t, e.bobConn(t), "Bob"); slices.Contains(got, sid) != want {
			t.Fatalf("Bob's session/list lists %q; Alice's session %q listed: %v, want %v", got, sid, !want, want)
		}
		if !want {
			if got := listed(t, a, "Alice"); !slices.Contains(got, sid) {
				t.Fatalf("Alice's session/list lists %q, not her session %q", got, sid)
			}
		}
	}
}

// --- take-over of a detached session with a pending permission ---

// detachedAsking: Alice's resumable WebSocket connection makes S, starts a
// turn that asks her permission, and its socket drops (a TCP reset, no
// close) before she answers. HTTP connections do not detach, so Alice is
// on a WebSocket whatever Bob's transport.
func (e *subjEnv) detachedAsking(t *testing.T) (a subjResumable, sid string, prompt int, perm rpcMsg) {
	t.Helper()
	r := newRconn(t, e.g, bearer(e.alice))
	r.initialize()
	sid = r.newSession(vroot)
	prompt, perm = promptUntilPermission(t, r, sid)
	r.resetDetached()
	return subjResumable{r}, sid, prompt, perm
}

// bobTakesOver is Bob's session/load of S on a new connection, and its
// answer and what came before it.
func (e *subjEnv) bobTakesOver(t *testing.T, sid string) (subjPeer, rpcMsg, []rpcMsg) {
	t.Helper()
	bob := e.bobConn(t)
	m, before := subjCall(t, bob, "Bob's session/load of S", "session/load", subjParams("session/load", sid))
	return bob, m, before
}

// aliceResumesAndAllows: Alice resumes her connection, answers the
// permission request, and her turn ends with end_turn; she is never told
// the session ended.
func aliceResumesAndAllows(t *testing.T, a subjResumable, sid string, prompt int, perm rpcMsg) {
	t.Helper()
	a.resume(a.Got)
	a.respond(perm, allow)
	m := subjAwait(t, a, "Alice's turn after her answer", prompt, func(m rpcMsg) {
		if m.Method != "session/update" || attUpd(m).SessionID != sid {
			t.Fatalf("Alice, waiting for her turn to end: %.500s", m.Raw)
		}
	})
	if m.Error != nil || stopReason(t, m) != "end_turn" {
		t.Fatalf("Alice's turn: %s; want stopReason end_turn", m.Raw)
	}
	noneOf(t, "Alice", subjDrain(a, subjQuiet), "_acpgate/session_ended")
}

// row8: same_subject: Bob's load of S, held by Alice's detached connection
// with a pending permission, is refused; Bob is never asked; Alice resumes
// and finishes her turn.
func row8(t *testing.T, e *subjEnv) {
	a, sid, prompt, perm := e.detachedAsking(t)
	bob, m, before := e.bobTakesOver(t, sid)
	wantErrorCode(t, "Bob's session/load of Alice's detached session", m, -32002)
	noneOf(t, "Bob", append(before, subjDrain(bob, subjQuiet)...), "session/request_permission")
	aliceResumesAndAllows(t, a, sid, prompt, perm)
	noneOf(t, "Bob", subjDrain(bob, 0), "session/request_permission")
}

// row12: tenant: Bob takes S over: he gets the pending permission request
// (an id of his own), answers it, and the turn ends; Alice, resuming, is
// told the session ended.
func row12(t *testing.T, e *subjEnv) {
	a, sid, _, perm := e.detachedAsking(t)
	bob, m, before := e.bobTakesOver(t, sid)
	if m.Error != nil {
		t.Fatalf("Bob's session/load of Alice's detached session: %s; want it to succeed", m.Raw)
	}
	req := subjFind(t, bob, "the pending permission request", before, isMethod("session/request_permission"))
	if req.Param("sessionId") != sid || len(req.ID) == 0 {
		t.Fatalf("Bob's permission request %s; want one about S (Alice's was %s)", req.Raw, perm.Raw)
	}
	bob.respond(req, allow)
	ended := subjUntil(t, bob, "the end of the turn", isMethod("_acpgate/turn_ended"))
	var p struct{ SessionID, StopReason string }
	if err := json.Unmarshal(ended[len(ended)-1].Params, &p); err != nil || p.SessionID != sid || p.StopReason != "end_turn" {
		t.Fatalf("%s; want _acpgate/turn_ended {\"sessionId\":%q,\"stopReason\":\"end_turn\"}", ended[len(ended)-1].Raw, sid)
	}
	a.resume(a.Got)
	told := subjUntil(t, a, "_acpgate/session_ended for Alice", func(m rpcMsg) bool {
		if m.Method == "session/request_permission" {
			t.Fatalf("Alice, whose session Bob took over, was asked: %s", m.Raw)
		}
		got, _, ok := sessionEnded(m)
		return ok && got == sid
	})
	endedNotice(t, "Alice", sid, "", told[len(told)-1])
}

// row17: read_only_for_others: Bob's load of Alice's detached session is a
// read-only attach, never a take-over: he is never asked; Alice resumes and
// finishes her turn.
func row17(t *testing.T, e *subjEnv) {
	a, sid, prompt, perm := e.detachedAsking(t)
	bob, m, before := e.bobTakesOver(t, sid)
	if r := parseResultMeta(t, "Bob's session/load of Alice's detached session", m); !r.Meta.Acpgate.ReadOnly {
		t.Fatalf("Bob's session/load of Alice's detached session: %s; want _meta.acpgate.readOnly true", m.Raw)
	}
	noneOf(t, "Bob", append(before, subjDrain(bob, subjQuiet)...), "session/request_permission")
	aliceResumesAndAllows(t, a, sid, prompt, perm)
	noneOf(t, "Bob", subjDrain(bob, subjQuiet), "session/request_permission")
}

// endedNotice checks m, an _acpgate/session_ended that who received: a
// notification naming sid with a reason, which contains want (any
// reason: "").
func endedNotice(t *testing.T, who, sid, want string, m rpcMsg) {
	t.Helper()
	got, reason, ok := sessionEnded(m)
	if !ok || len(m.ID) != 0 || got != sid || reason == "" || !strings.Contains(strings.ToLower(reason), want) {
		t.Fatalf("%s got %s; want the notification _acpgate/session_ended {\"sessionId\":%q,\"reason\":…} with a reason containing %q", who, m.Raw, sid, want)
	}
}

// --- the loads that go to the agent ---

// row11: tenant: Bob's load of S succeeds with the agent's replay; Alice
// and a client of hers attached to S are told the session ended, and her
// next prompt in S gets -32002.
func row11(t *testing.T, e *subjEnv) {
	a, sid := e.aliceSession(t)
	third := e.aliceConn(t)
	m, _ := subjCall(t, third, "Alice's third connection attaches to S", "session/attach", attachParams(sid, "alice3", false))
	parseResultMeta(t, "Alice's third connection's session/attach", m)

	bob := e.bobConn(t)
	m, before := subjCall(t, bob, "Bob's session/load of S", "session/load", subjParams("session/load", sid))
	parseResultMeta(t, "Bob's session/load of Alice's session", m)
	replayed(t, bob, "Bob", sid, before)

	for _, c := range []struct {
		who string
		p   subjPeer
	}{{"Alice", a}, {"Alice's attached client", third}} {
		told := subjUntil(t, c.p, "_acpgate/session_ended for "+c.who, func(m rpcMsg) bool { _, _, ok := sessionEnded(m); return ok })
		endedNotice(t, c.who, sid, "load", told[len(told)-1]) // "loaded by another client"
	}
	m, _ = subjCall(t, a, "Alice's prompt in S after Bob's load", "session/prompt", textPrompt(sid, "is it still mine?"))
	wantErrorCode(t, "Alice's prompt in S after Bob loaded it", m, -32002)
}

// row16: read_only_for_others: Bob's load of S is a read-only attach: it
// succeeds saying so, with the history replayed; Alice is undisturbed and
// Bob sees her next turn; Bob's prompt gets -32007.
func row16(t *testing.T, e *subjEnv) {
	a, sid := e.aliceSession(t)
	bob := e.bobConn(t)
	m, before := subjCall(t, bob, "Bob's session/load of S", "session/load", subjParams("session/load", sid))
	if r := parseResultMeta(t, "Bob's session/load of Alice's session", m); !r.Meta.Acpgate.ReadOnly {
		t.Fatalf("Bob's session/load of Alice's session: %s; want _meta.acpgate.readOnly true", m.Raw)
	}
	noneOf(t, "Bob", replayed(t, bob, "Bob", sid, before), "session/request_permission", "_acpgate/session_ended")
	promptWorks(t, a, "Alice", sid, "second from alice")
	seen := subjUntil(t, bob, "Alice's second reply at Bob", func(m rpcMsg) bool {
		return strings.Contains(attUpd(m).text(), "You said: second from alice")
	})
	noneOf(t, "Bob", seen, "session/request_permission", "_acpgate/session_ended")
	m, _ = subjCall(t, bob, "Bob's prompt in S", "session/prompt", textPrompt(sid, "let me steer"))
	wantErrorCode(t, "Bob's prompt in the session he loaded read-only", m, -32007)
}

// row13: tenant: Bob's session/delete of S goes to the agent (which
// answers it with success).
func row13(t *testing.T, e *subjEnv) {
	_, sid := e.aliceSession(t)
	m, _ := subjCall(t, e.bobConn(t), "Bob's session/delete of S", "session/delete", subjParams("session/delete", sid))
	if m.Error != nil {
		t.Fatalf("Bob's session/delete of Alice's session: %s; want the agent's answer (success), not the gateway's refusal", m.Raw)
	}
}

// row5: same_subject: Bob's session/attach of S gets -32002, exactly as an
// unknown session's does (the refusal must not tell that S exists).
func row5(t *testing.T, e *subjEnv) {
	a, sid := e.aliceSession(t)
	bob := e.bobConn(t)
	theirs, _ := subjCall(t, bob, "Bob's session/attach of S", "session/attach", subjParams("session/attach", sid))
	wantErrorCode(t, "Bob's session/attach of Alice's session", theirs, -32002)
	unknown, _ := subjCall(t, bob, "Bob's session/attach of an unknown session", "session/attach", subjParams("session/attach", flip(sid)))
	shape, got := errorShape(t, theirs)
	if s, _ := errorShape(t, unknown); s != shape || got != sid {
		t.Fatalf("Bob's session/attach of Alice's session: %s\nof an unknown one: %s\nwant the same error (data.sessionId aside, which must be the ID sent)", theirs.Raw, unknown.Raw)
	}
	promptWorks(t, a, "Alice", sid, "still mine after session/attach")
}

// subjRow is one row of the spec: its number, what it checks, and the
// run.
type subjRow struct {
	n    int
	name string
	run  func(*testing.T, *subjEnv)
}

// TestSubject runs the spec's rows, under each sharing policy, over each
// transport, on a gateway of the policy's.
func TestSubject(t *testing.T) {
	sharings := []struct {
		name, yaml string
		rows       []subjRow
	}{
		{"same_subject", "", []subjRow{
			{1, "Alice makes S and prompts", func(t *testing.T, e *subjEnv) { e.aliceSession(t) }},
			{2, "Bob's list omits S, Alice's lists it", bobLists(false)},
			{3, "Bob's load: -32002, Alice undisturbed", bobRefused("session/load", -32002)},
			{4, "Bob's resume: -32002, Alice undisturbed", bobRefused("session/resume", -32002)},
			{5, "Bob's attach: -32002 as for an unknown session", row5},
			{6, "Bob's delete: -32002, Alice undisturbed", bobRefused("session/delete", -32002)},
			{7, "Bob's close: -32002, Alice undisturbed", bobRefused("session/close", -32002)},
			{8, "take-over with a pending permission: refused, Alice finishes", row8},
		}},
		{"tenant", "{attach: tenant}", []subjRow{
			{9, "Bob's list lists S", bobLists(true)},
			{10, "Bob's attach: ok, not read-only", bobAttaches(false)},
			{11, "Bob's load: ok with the replay, Alice and her attached client told", row11},
			{12, "take-over with a pending permission: Bob answers it, Alice told", row12},
			{13, "Bob's delete goes to the agent", row13},
		}},
		{"read_only_for_others", "{attach: tenant, read_only_for_others: true}", []subjRow{
			{14, "Bob's list lists S", bobLists(true)},
			{15, "Bob's attach: ok, read-only", bobAttaches(true)},
			{16, "Bob's load: a read-only attach, Alice undisturbed", row16},
			{17, "take-over with a pending permission: read-only, Alice finishes", row17},
			{18, "Bob's delete: -32007, Alice undisturbed", bobRefused("session/delete", -32007)},
		}},
	}
	for _, sh := range sharings {
		t.Run(sh.name, func(t *testing.T) {
			acme := &sharingTenant{name: "acme", sharing: sh.yaml}
			g := sharingGatewayWith(t, []*sharingTenant{acme}, subjConfig(t))
			for _, tr := range subjTransports {
				t.Run(tr.name, func(t *testing.T) {
					e := &subjEnv{g: g, alice: acme.tokens[0], bob: acme.tokens[1], dial: tr.dial}
					for _, row := range sh.rows {
						t.Run(fmt.Sprintf("%02d %s", row.n, row.name), func(t *testing.T) { row.run(t, e) })
					}
				})
			}
		})
	}
}

// subjConfig is the suite's gateway settings: one fake agent process that
// keeps sessions, a policy that allows every session method, and a short
// shutdown grace (a failed row may leave a turn waiting).
func subjConfig(t *testing.T) string {
	return fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: sessions}, stop_grace: 1s}\n", fakeAgentBin(t)) +
		"pool: {min_idle: 1, max_processes: 1}\nshutdown_grace: 3s\n" +
		"policy: {session: {load: true, resume: true, close: true, list: true, delete: true}}\n"
}
