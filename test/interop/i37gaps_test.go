//go:build unix

package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Gaps left in issue #37's v2 work: retries across a gateway resume.

// v2Counts counts, in the session/update params of a run, the ticks, the
// agent's "idempotencyKey KEY" chunks (one per turn it ran for a key) and
// the idle updates of session sid.
func v2Counts(t *testing.T, updates []json.RawMessage, sid, key string) (ticks, keyed, idles int) {
	t.Helper()
	for _, raw := range updates {
		var u struct {
			SessionID string `json:"sessionId"`
			Update    struct {
				SessionUpdate string `json:"sessionUpdate"`
				State         string `json:"state"`
				Content       struct{ Text string }
			} `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		if u.SessionID != sid {
			continue
		}
		switch {
		case u.Update.SessionUpdate == "state_update" && u.Update.State == "idle":
			idles++
		case u.Update.SessionUpdate == "agent_message_chunk" && u.Update.Content.Text == "idempotencyKey "+key:
			keyed++
		case u.Update.SessionUpdate == "agent_message_chunk" && strings.HasPrefix(u.Update.Content.Text, "tick "):
			ticks++
		}
	}
	return ticks, keyed, idles
}

// A v2 prompt's idempotencyKey reaches the agent as sent, and a prompt
// re-sent after a gateway resume keeps its key, so it runs once: the client
// sends a prompt with a key and its socket drops before the
// acknowledgement; it resumes the connection (?resume=) and sends the
// prompt again with the same key. The agent (v2-agent.mjs, which reads the
// key from the raw line and dedupes by it) ran one turn: the resumed client
// gets its three ticks, the key's chunk and the idle update once each.
func TestV2IdempotencyKeyAcrossResume(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	for _, c := range []struct {
		name  string
		delay time.Duration // before the resume
	}{{"mid-turn", 0}, {"after-the-turn", time.Second}} {
		t.Run(c.name, func(t *testing.T) { idempotentRetry(t, e, c.delay) })
	}
}

// idempotentRetry is TestV2IdempotencyKeyAcrossResume's run: the client
// resumes delay after the drop.
func idempotentRetry(t *testing.T, e *v2Env, delay time.Duration) {
	a := dialTenant(t, e.g, e.tokens["ide"])
	m := a.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep)
	var init struct {
		Meta struct {
			Acpgate struct {
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	a.mustResult(m, &init)
	if init.Meta.Acpgate.ResumeToken == "" {
		t.Fatalf("no _meta.acpgate.resumeToken in the initialize result: %s", m.raw)
	}
	var sess struct{ SessionID string }
	a.mustResult(a.call("session/new", map[string]any{"cwd": e.roots["ide"], "mcpServers": []any{}}, attachStep), &sess)
	sid := sess.SessionID
	// Another client of the session hears of each turn: prompt_received
	// and turn_complete once a turn.
	o := dialTenant(t, e.g, e.tokens["ide"])
	defer o.close()
	o.mustResult(o.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "o", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	o.mustResult(o.call("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none", "clientId": "o",
		"clientInfo": map[string]any{"name": "o", "version": "1"}}, attachStep), &struct{}{})
	key := "retry-" + e.h.mark + "-" + t.Name()
	prompt := func(id int, key, text string) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": map[string]any{"sessionId": sid,
			"idempotencyKey": key, "prompt": []any{map[string]any{"type": "text", "text": text}}}}
	}
	start := time.Now()
	a.send(prompt(3, key, "long 5"))
	_ = a.ws.CloseNow() // no close frame, before the acknowledgement: the connection is kept for a resume
	a.cancel()
	<-a.stopped
	if n := a.count(func(m peerMsg) bool { return string(m.ID) == "3" }); n != 0 {
		t.Logf("the acknowledgement arrived before the drop (%d): the retry is still a retry", n)
	}

	time.Sleep(delay)
	q := "?resume=" + url.QueryEscape(init.Meta.Acpgate.ResumeToken) + "&received=2"
	b := dialURL(t, e.g.url()+q, "acp", "acp.bearer."+e.tokens["ide"])
	defer b.close()
	b.waitMsg(0, "_acpgate/resumed", 10*time.Second, func(m peerMsg) bool { return m.Method == "_acpgate/resumed" })
	sent := time.Now()
	b.send(prompt(4, key, "long 5"))
	isIdle := func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == sid && u.Update.State == "idle"
	}
	idle, _ := b.waitMsg(0, "the idle update", 10*time.Second, isIdle)
	ackAt, ack := b.waitMsg(0, "the answer to the re-sent prompt", 10*time.Second, func(m peerMsg) bool { return m.Method == "" && string(m.ID) == "4" })
	if len(ack.Error) > 0 {
		t.Fatalf("the re-sent prompt: %s", ack.raw)
	}
	t.Logf("re-sent %v after the first; answered as message %d, the turn's idle is message %d", sent.Sub(start), ackAt, idle)
	// The session is free: the next prompt (another key) runs at once.
	b.send(prompt(5, key+"-next", "ticks 2"))
	b.waitMsg(0, "the answer to the next prompt", 10*time.Second, func(m peerMsg) bool { return m.Method == "" && string(m.ID) == "5" })
	b.waitMsg(max(idle, ackAt)+1, "the next prompt's idle update", 5*time.Second, isIdle)
	ticks, keyed, idles := v2Counts(t, b.updatesSince(0), sid, key)
	if ticks != 5+2 || keyed != 1 || idles != 2 {
		t.Errorf("the resumed client got %d ticks, %d %q chunks, %d idle updates; want 7, 1, 2 (the keyed prompt ran once, then the next one)\n%s",
			ticks, keyed, "idempotencyKey "+key, idles, b.dump())
	}
	first, _ := o.waitMsg(0, "the keyed turn's idle update", 5*time.Second, isIdle)
	o.waitMsg(first+1, "the next prompt's idle update", 5*time.Second, isIdle)
	time.Sleep(300 * time.Millisecond) // a third turn_complete would be out by now
	received, complete := o.count(isUpdate("prompt_received")), o.count(isUpdate("turn_complete"))
	if received != 2 || complete != 2 {
		t.Errorf("the other client heard %d prompt_received and %d turn_complete; want 2 each (the keyed turn, the next one)\n%s", received, complete, o.dump())
	}
}

// A session/resume's replayFrom cursor the gateway does not understand (an
// agent's own, not {type:"start"}) reaches the agent byte for byte:
// spacing, escapes, a number's spelling and a path-like string as the
// client wrote them. v2-agent.mjs reads the raw line and sends back the
// cursor's bytes as it read them.
func TestV2UnknownReplayFromVerbatim(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, sid := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	b := dialTenant(t, e.g, e.tokens["ide"])
	defer b.close()
	b.mustResult(b.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	cursor := `{"type":"agent-cursor",  "cursor":"op\u00e9 \"q\" ` + e.roots["ide"] + `/x","n":1.50e0,"l":[1, {"a":"}"}]}`
	line := `{"jsonrpc":"2.0","id":7,"method":"session/resume","params":{"sessionId":` + strconv.Quote(sid) + `,"cwd":` + strconv.Quote(e.roots["ide"]) +
		`,"replayFrom" :` + cursor + ` ,"mcpServers":[]}}`
	from := b.count(func(peerMsg) bool { return true })
	if err := b.ws.Write(b.ctx, websocket.MessageText, []byte(line)); err != nil {
		t.Fatal(err)
	}
	_, res := b.waitMsg(from, "the resume's answer", 10*time.Second, func(m peerMsg) bool { return m.Method == "" && string(m.ID) == "7" })
	if len(res.Error) > 0 {
		t.Fatalf("session/resume: %s", res.raw)
	}
	var got string
	for _, raw := range b.updatesSince(from) {
		var u struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
				Content       struct{ Text string }
			} `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		if u.Update.SessionUpdate == "agent_message_chunk" && strings.HasPrefix(u.Update.Content.Text, "replayFrom ") {
			got = strings.TrimPrefix(u.Update.Content.Text, "replayFrom ")
		}
	}
	if got != cursor {
		t.Errorf("the agent read replayFrom as\n%s\nwant the bytes sent\n%s\n%s", got, cursor, b.dump())
	}
}

// attachV2 is a second v2 client of the subject of token, attached to sid
// with historyPolicy policy (read-only if asked).
func (e *v2Env) attachV2(t *testing.T, token, sid, policy string, readOnly bool) *peer {
	t.Helper()
	p := dialTenant(t, e.g, token)
	p.mustResult(p.call("initialize", map[string]any{"protocolVersion": 2, "info": map[string]any{"name": "m", "version": "0"}, "capabilities": map[string]any{}}, attachStep), &struct{}{})
	params := map[string]any{"sessionId": sid, "historyPolicy": policy, "clientInfo": map[string]any{"name": "m", "version": "1"}}
	if readOnly {
		params["_meta"] = map[string]any{"acpgate": map[string]any{"readOnly": true}}
	}
	p.mustResult(p.call("session/attach", params, attachStep), &struct{}{})
	return p
}

// errCode is the JSON-RPC error code of m (0: none).
func errCode(t *testing.T, m peerMsg) int {
	t.Helper()
	if len(m.Error) == 0 {
		return 0
	}
	var e struct{ Code int }
	mustUnmarshal(t, m.Error, &e)
	return e.Code
}

// A client attached to a v2 parent gets its child sessions, those the
// agent makes after the attach and those it made before: its own requests
// naming a child work (session/status answers "open"), within its rights
// (a read-only member's prompt to the child is refused read-only, -32007,
// as on the parent), and an attach's history replay ends with a
// replay_complete for the parent and one for each child, after the
// child's replayed updates. At 99b340a (and before the fix) a member's
// request naming a child was -32002, and the replay had no child's
// replay_complete.
func TestV2AttachedMemberGetsChildren(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	a, parent := e.v2Peer(t, e.tokens["ide"], e.roots["ide"])
	defer a.close()
	b := e.attachV2(t, e.tokens["ide"], parent, "none", false) // before the child
	defer b.close()
	ro := e.attachV2(t, e.tokens["ide"], parent, "none", true)
	defer ro.close()
	a.mustResult(a.call("session/prompt", map[string]any{"sessionId": parent, "prompt": []any{map[string]any{"type": "text", "text": "subagent"}}}, attachStep), &struct{}{})
	isParentIdle := func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == parent && u.Update.State == "idle"
	}
	a.waitMsg(0, "the parent's idle update", 10*time.Second, isParentIdle)
	child := checkChild(t, true, parent, a.updatesSince(0), a.dump)
	b.waitMsg(0, "the parent's idle update", 10*time.Second, isParentIdle)

	status := func(p *peer, who string) {
		t.Helper()
		m := p.call("session/status", map[string]any{"sessionId": child}, attachStep)
		var st struct{ Status string }
		if len(m.Error) > 0 || json.Unmarshal(m.Result, &st) != nil || st.Status != "open" {
			t.Errorf("%s: session/status of the child: %s, want status open", who, m.raw)
		}
	}
	status(b, "a member attached before the child")
	m := ro.call("session/prompt", map[string]any{"sessionId": child, "prompt": []any{map[string]any{"type": "text", "text": "hello"}}}, attachStep)
	if code := errCode(t, m); code != -32007 {
		t.Errorf("a read-only member's prompt to the child: %s, want the read-only error -32007", m.raw)
	}

	// A member attached after the child: it gets the child too, and its
	// replay ends with each session's replay_complete.
	d := e.attachV2(t, e.tokens["ide"], parent, "full", false)
	defer d.close()
	var order []string // "update:<session>" and "complete:<session>" in order
	for _, raw := range d.updatesSince(0) {
		var u struct {
			SessionID string `json:"sessionId"`
			Update    struct {
				SessionUpdate string `json:"sessionUpdate"`
			} `json:"update"`
		}
		mustUnmarshal(t, raw, &u)
		who := map[string]string{parent: "parent", child: "child"}[u.SessionID]
		if u.Update.SessionUpdate == "replay_complete" {
			order = append(order, "complete:"+who)
		} else if who == "child" && (len(order) == 0 || order[len(order)-1] != "update:child") {
			order = append(order, "update:child")
		}
	}
	want := []string{"update:child", "complete:parent", "complete:child"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Errorf("the full attach's replay: %v, want %v (the child's updates, then each session's replay_complete)\n%s", order, want, d.dump())
	}
	status(d, "a member attached after the child")
}

// httpV2 is a raw Streamable HTTP client of the gateway for tenant's token.
type httpV2 struct {
	t     *testing.T
	base  string
	token string
	conn  string
}

// post POSTs body (one JSON-RPC message), with Acp-Session-Id sid if not
// "", and returns the status and body.
func (h *httpV2) post(body, sid string) (int, string, http.Header) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attachStep)
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.base, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+h.token)
	r.Header.Set("Content-Type", "application/json")
	if h.conn != "" {
		r.Header.Set("Acp-Connection-Id", h.conn)
	}
	if sid != "" {
		r.Header.Set("Acp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		h.t.Fatalf("POST %s: %v", h.base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// stream opens the connection's event stream (sid "") or a session's, and
// hands back its messages until ctx ends.
func (h *httpV2) stream(ctx context.Context, sid string) <-chan peerMsg {
	h.t.Helper()
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.base, nil)
	r.Header.Set("Authorization", "Bearer "+h.token)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Acp-Connection-Id", h.conn)
	if sid != "" {
		r.Header.Set("Acp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		h.t.Fatalf("GET %s (session %q): %v %v", h.base, sid, resp, err)
	}
	out := make(chan peerMsg, 1000)
	go func() { // ends with the body, which ends with ctx
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m peerMsg
				if json.Unmarshal([]byte(d), &m) == nil {
					m.raw = []byte(d)
					select {
					case out <- m:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out
}

// next is the next message of ch that matches pred, within d.
func next(t *testing.T, ch <-chan peerMsg, what string, d time.Duration, seen *[]peerMsg, pred func(peerMsg) bool) peerMsg {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("the stream ended waiting for %s", what)
			}
			*seen = append(*seen, m)
			if pred(m) {
				return m
			}
		case <-timer.C:
			t.Fatalf("no %s within %v", what, d)
		}
	}
}

// The idempotencyKey retry over Streamable HTTP: a prompt POSTed with a
// key and POSTed again with the same key (a client that lost the first
// answer) runs once: both answers carry the same messageId, the session's
// stream has the key's chunk, the ticks and the idle update once each, and
// a WebSocket client attached to the session hears one prompt_received and
// one turn_complete. At 99b340a it heard two of each.
func TestV2IdempotencyKeyRePOST(t *testing.T) {
	e := startV2Gateway(t, "", map[string]string{"ide": ""})
	h := &httpV2{t: t, base: "http://" + e.g.Addr + "/acp", token: e.tokens["ide"]}
	code, body, hdr := h.post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":2,"info":{"name":"h","version":"0"},"capabilities":{}}}`, "")
	if h.conn = hdr.Get("Acp-Connection-Id"); code != http.StatusOK || h.conn == "" {
		t.Fatalf("initialize over HTTP: %d %s", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	connStream := h.stream(ctx, "")
	if code, body, _ := h.post(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":`+strconv.Quote(e.roots["ide"])+`,"mcpServers":[]}}`, ""); code != http.StatusAccepted {
		t.Fatalf("session/new: %d %s", code, body)
	}
	var seen []peerMsg
	m := next(t, connStream, "session/new's answer", 10*time.Second, &seen, func(m peerMsg) bool { return string(m.ID) == "2" })
	var sess struct{ SessionID string }
	mustUnmarshal(t, m.Result, &sess)
	sid := sess.SessionID
	sessStream := h.stream(ctx, sid)
	o := e.attachV2(t, e.tokens["ide"], sid, "none", false)
	defer o.close()

	key := "re-post-" + e.h.mark
	prompt := func(id int) string {
		return `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"session/prompt","params":{"sessionId":` + strconv.Quote(sid) +
			`,"idempotencyKey":` + strconv.Quote(key) + `,"prompt":[{"type":"text","text":"ticks 3"}]}}`
	}
	for _, id := range []int{3, 4} {
		if code, body, _ := h.post(prompt(id), sid); code != http.StatusAccepted {
			t.Fatalf("POST prompt %d: %d %s", id, code, body)
		}
	}
	var got []peerMsg
	msgIDs := map[string]string{}
	for len(msgIDs) < 2 {
		m := next(t, sessStream, "the prompts' answers", 10*time.Second, &got, func(m peerMsg) bool { return m.Method == "" })
		var res struct{ MessageID string }
		mustUnmarshal(t, m.Result, &res)
		msgIDs[string(m.ID)] = res.MessageID
	}
	if msgIDs["3"] == "" || msgIDs["3"] != msgIDs["4"] {
		t.Errorf("the answers' messageIds: %v, want one, the same for both", msgIDs)
	}
	isIdle := func(m peerMsg) bool {
		var u v2Idle
		return m.Method == "session/update" && json.Unmarshal(m.Params, &u) == nil && u.SessionID == sid && u.Update.State == "idle"
	}
	if !slices.ContainsFunc(got, isIdle) {
		next(t, sessStream, "the idle update", 10*time.Second, &got, isIdle)
	}
	// A second turn (60 ms of ticks) would be over within this.
	deadline := time.After(time.Second)
	for done := false; !done; {
		select {
		case m, ok := <-sessStream:
			if ok {
				got = append(got, m)
			} else {
				done = true
			}
		case <-deadline:
			done = true
		}
	}
	var updates []json.RawMessage
	for _, m := range got {
		if m.Method == "session/update" {
			updates = append(updates, m.Params)
		}
	}
	ticks, keyed, idles := v2Counts(t, updates, sid, key)
	if ticks != 3 || keyed != 1 || idles != 1 {
		t.Errorf("the session's stream had %d ticks, %d key chunks, %d idle updates; want 3, 1, 1 (one turn)", ticks, keyed, idles)
	}
	received, complete := o.count(isUpdate("prompt_received")), o.count(isUpdate("turn_complete"))
	if received != 1 || complete != 1 {
		t.Errorf("the attached client heard %d prompt_received and %d turn_complete; want 1 each\n%s", received, complete, o.dump())
	}
}
