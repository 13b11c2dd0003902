package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

// The resume suite checks that sessions outlive connections: a connection
// whose socket ends without a clean close by the client detaches for
// sessions.detach_timeout, keeping its sessions, running turns and pending
// agent requests; the client resumes it exactly (GET
// /acp?resume=<token>&received=<n>), or another connection of the tenant
// takes one of its sessions over with session/load. A clean close (1000)
// ends everything at once, as before.

// resumeConfig is the common part of the suite's gateways: one agent
// process, and a short shutdown grace so that a failed test that leaves a
// detached turn running does not hold the gateway's exit.
const resumeConfig = "shutdown_grace: 3s\npool: {min_idle: 1, max_processes: 1}\n"

// --- a client connection that survives its sockets ---

// rconn is one client connection of the gateway across its sockets. It
// counts the messages it received (every one but _acpgate/resumed, across
// sockets) and keeps the text frames it sent, so that it can resume exactly.
// Only the test's goroutine may use it.
type rconn struct {
	*acpclient.Resumable // on socket c

	t      *testing.T
	g      *gateway
	header http.Header  // credentials, sent on every socket
	c      *client      // the current socket
	tcp    *net.TCPConn // its TCP connection
	connID string       // Acp-Connection-Id of the first socket
	token  string       // result._meta.acpgate.resumeToken of initialize
	resets int
}

// dialTCP is dialWith for path with the "acp" subprotocol, and also returns
// the socket's TCP connection, so that the test can reset it.
func dialTCP(t *testing.T, addr, path string, header http.Header) (*client, *net.TCPConn, *http.Response, error) {
	t.Helper()
	c, resp, err := acpclient.DialClient(t, "ws://"+addr+path, header, []string{"acp"})
	if err != nil {
		return nil, nil, resp, err
	}
	if c.TCP == nil {
		t.Fatalf("the WebSocket does not run on a *net.TCPConn")
	}
	return &client{c}, c.TCP, resp, nil
}

// newRconn opens the first socket of a connection.
func newRconn(t *testing.T, g *gateway, header http.Header) *rconn {
	t.Helper()
	return newRconnVia(t, g, g.Addr, header)
}

// newRconnVia opens the first socket of a connection through addr (a relay
// to the gateway); resumes go to the gateway directly.
func newRconnVia(t *testing.T, g *gateway, addr string, header http.Header) *rconn {
	t.Helper()
	c, tcp, resp, err := dialTCP(t, addr, "/acp", header)
	if err != nil {
		t.Fatalf("dial: %v (%s)", err, respText(resp))
	}
	if c.ConnID == "" {
		t.Fatalf("the 101 response has no Acp-Connection-Id")
	}
	r := &rconn{t: t, g: g, header: header, c: c, tcp: tcp, connID: c.ConnID}
	r.Resumable = acpclient.NewResumable(t, "", func() *acpclient.Conn { return r.c.Conn })
	return r
}

// initialize initializes the connection and takes its resume token.
// slowTurn prompts the demo agent's slow turn ("slow please") in sid and
// reads until n of its ticks have come; it returns the prompt's request id
// and the ticker that checks them.
func (r *rconn) slowTurn(sid string, n int) (int, *ticker) {
	r.t.Helper()
	id := r.Request("session/prompt", textPrompt(sid, "slow please"))
	k := &ticker{t: r.t, sid: sid}
	for k.ticks < n {
		k.handle(r.Next("the slow turn", turn))
	}
	return id, k
}

// plain returns the current socket as an ordinary client whose request ids
// go on from the connection's.
func (r *rconn) plain() *client {
	r.c.NextID = r.NextID
	return r.c
}

func (r *rconn) initialize() {
	r.t.Helper()
	id := r.Request("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": fsBoth.caps(),
		"clientInfo":         map[string]string{"name": "e2e-resume", "version": "0"},
	})
	m := r.Await("initialize", id, 30*time.Second, nil)
	if m.Error != nil {
		r.t.Fatalf("initialize: %s", m.Raw)
	}
	if r.token = acpclient.ResumeToken(m); r.token == "" {
		r.t.Fatalf("the initialize result has no _meta.acpgate.resumeToken: %s", m.Raw)
	}
}

func (r *rconn) newSession(cwd string) string {
	r.t.Helper()
	m := r.Await("session/new", r.Request("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}), 30*time.Second, nil)
	sid := m.NewSessionID()
	if sid == "" {
		r.t.Fatalf("session/new: %s", m.Raw)
	}
	return sid
}

// newSessionAgentID opens a session and returns its ID and the agent's own
// ID for it (the demo agent's state file).
func (r *rconn) newSessionAgentID(cwd string) (sid, agentID string) {
	r.t.Helper()
	before := stateFiles(r.t, r.g.stateDir)
	sid = r.newSession(cwd)
	for id := range stateFiles(r.t, r.g.stateDir) {
		if _, old := before[id]; !old {
			agentID = id
		}
	}
	if agentID == "" {
		r.t.Fatalf("no new session in the agent's state dir")
	}
	return sid, agentID
}

// reset drops the socket with a TCP RST and no close frame, as a network
// loss does.
func (r *rconn) reset() {
	r.t.Helper()
	if err := r.c.Reset(); err != nil {
		r.t.Fatalf("reset the TCP connection: %v", err)
	}
	r.resets++
}

// turnTally collects one session's streamed text from session/update
// messages and counts the session_info_update that ends a demo agent turn.
type turnTally struct {
	sid   string
	text  strings.Builder
	infos int
}

// add takes m, which must be a session/update of the session (what says
// what was expected otherwise).
func (tt *turnTally) add(t *testing.T, m rpcMsg, what string) {
	t.Helper()
	if m.Method != "session/update" {
		t.Fatalf("%s: %.500s", what, m.Raw)
	}
	u := parseUpdate(t, m)
	if u.SessionID != tt.sid {
		t.Fatalf("update for another session: %.500s", m.Raw)
	}
	switch u.Update.Kind {
	case "agent_message_chunk":
		tt.text.WriteString(u.text())
	case "session_info_update":
		tt.infos++
	}
}

var resumePath = acpclient.ResumePath

// resume opens a new socket for the connection, having received n
// messages. It checks the 101 and the _acpgate/resumed notification, re-sends
// the frames the gateway had not received, and returns the gateway's count.
func (r *rconn) resume(n int) int {
	r.t.Helper()
	c, tcp, resp, err := dialTCP(r.t, r.g.Addr, resumePath(r.token, strconv.Itoa(n)), r.header)
	if err != nil {
		r.t.Fatalf("resume with received=%d (%d frames sent): refused: %v (%s)", n, len(r.Frames), err, respText(resp))
	}
	if c.ConnID != r.connID {
		r.t.Errorf("the resumed socket's Acp-Connection-Id is %q, the connection's %q", c.ConnID, r.connID)
	}
	r.c, r.tcp = c, tcp
	return r.Resumed(c.Conn)
}

// resumeRefusal dials a resume and returns the refusal's status and body;
// an upgrade fails the test.
func resumeRefusal(t *testing.T, g *gateway, header http.Header, path string) (int, string) {
	t.Helper()
	c, resp, err := dialWith(t, g, path, header, []string{"acp"})
	if err == nil {
		var first string
		select {
		case m := <-c.In:
			first = string(m.Raw)
		case <-time.After(time.Second):
		}
		c.Close()
		t.Fatalf("GET %.120s was upgraded (first message %.300s); want 404 resume_refused before the upgrade", path, first)
	}
	if resp == nil {
		t.Fatalf("GET %.120s: no HTTP response: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// wantResumeRefused asserts a resume is refused with 404 and the JSON body
// {"error":"resume_refused","message":...}, and returns the body.
func wantResumeRefused(t *testing.T, g *gateway, header http.Header, path, why string) string {
	t.Helper()
	status, body := resumeRefusal(t, g, header, path)
	var e struct{ Error, Message string }
	if status != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error != "resume_refused" || e.Message == "" {
		t.Fatalf("resume with %s: %d %s; want 404 {\"error\":\"resume_refused\",\"message\":...}", why, status, body)
	}
	return body
}

// --- observations ---

// storedHistory is the demo agent's stored history of session agentID.
func storedHistory(t *testing.T, g *gateway, agentID string) []historyItem {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.stateDir, agentID+".json"))
	if err != nil {
		t.Fatalf("the agent's state file of %s: %v", agentID, err)
	}
	var f struct {
		History []historyItem `json:"history"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("the agent's state file of %s: %v", agentID, err)
	}
	return f.History
}

type historyItem struct {
	Role string `json:"role"`
	Text string `json:"text"`
}

// agentReplies counts the agent entries of a stored history: the demo
// agent stores a turn's reply when the turn has ended, however it ended.
func agentReplies(h []historyItem) (n int, last string) {
	for _, e := range h {
		if e.Role == "agent" {
			n++
			last = e.Text
		}
	}
	return n, last
}

// waitTurnStored polls the agent's state file until it holds want agent
// replies, and returns when that was seen and the last reply.
func waitTurnStored(t *testing.T, g *gateway, agentID string, want int, timeout time.Duration) (time.Time, string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, last := agentReplies(storedHistory(t, g, agentID))
		if n >= want {
			return time.Now(), last
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's turn did not end within %s (its state file holds %d replies)", timeout, n)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// metricWith sums the samples of name whose labels contain label ("" = all)
// and says whether there was one.
func metricWith(t *testing.T, g *gateway, name, label string) (float64, bool) {
	t.Helper()
	var sum float64
	found := false
	for k, v := range g.metrics(t) {
		if k == name && label == "" || strings.HasPrefix(k, name+"{") && strings.Contains(k, label) {
			sum += v
			found = true
		}
	}
	return sum, found
}

// waitMetric polls until ok(value of name{label}) holds.
func waitMetric(t *testing.T, g *gateway, name, label, want string, timeout time.Duration, ok func(float64) bool) float64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, found := metricWith(t, g, name, label)
		if found && ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%s is %g (exposed: %v) after %s; want %s:\n%s", name, label, v, found, timeout, want, metricLines(t, g, "acpgate_"))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// waitDetached waits until n connections are detached.
func waitDetached(t *testing.T, g *gateway, n int) {
	t.Helper()
	waitMetric(t, g, "acpgate_connections_detached", "", strconv.Itoa(n), 5*time.Second, func(v float64) bool { return v == float64(n) })
}

// resetDetached resets r's socket and waits until the gateway counts one
// more detached connection than before (connections whose sessions were
// taken over may still be detached).
func (r *rconn) resetDetached() {
	r.t.Helper()
	before, _ := metricWith(r.t, r.g, "acpgate_connections_detached", "")
	r.reset()
	waitMetric(r.t, r.g, "acpgate_connections_detached", "", fmt.Sprintf("> %g", before), 5*time.Second, func(v float64) bool { return v > before })
}

// echoText is a prompt text of about n bytes without demo agent keywords.
func echoText(n int) string {
	var b strings.Builder
	for i := 1; b.Len() < n; i++ {
		fmt.Fprintf(&b, "resume check %04d ", i)
	}
	return strings.TrimSpace(b.String())
}

// ticker checks a slow turn's "tick N " chunks: in order, none missing,
// none repeated, across sockets.
type ticker struct {
	t     *testing.T
	sid   string
	ticks int
	infos int
}

func (k *ticker) handle(m rpcMsg) {
	k.t.Helper()
	if m.Method != "session/update" {
		k.t.Fatalf("unexpected message during the slow turn: %.500s", m.Raw)
	}
	u := parseUpdate(k.t, m)
	if u.SessionID != k.sid {
		k.t.Fatalf("update for another session: %.500s", m.Raw)
	}
	switch u.Update.Kind {
	case "agent_message_chunk":
		k.ticks++
		if want := fmt.Sprintf("tick %d ", k.ticks); u.text() != want {
			k.t.Fatalf("chunk %q, want %q (a chunk was lost or repeated)", u.text(), want)
		}
	case "session_info_update":
		k.infos++
	}
}

// ---------------------------------------------------------------------------

// TestResumeAfterTCPReset: a streamed turn runs on; its socket is reset
// (TCP RST, no close frame) after a few chunks; the client resumes with the
// number of messages it received. It gets _acpgate/resumed first, then the
// rest of the turn with no chunk lost or repeated, then the prompt's
// response with its original id.
func TestResumeAfterTCPReset(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := startGateway(t, gwOpts{config: resumeConfig})
	r := newRconn(t, g, nil)
	r.initialize()
	sid := r.newSession(t.TempDir())

	// About 300 chunks of 8 characters, 15 ms apart: 4-5 s of streaming.
	text := echoText(2400)
	want := "You said: " + text
	id := r.Request("session/prompt", textPrompt(sid, text))
	tally := &turnTally{sid: sid}
	onUpdate := func(m rpcMsg) { t.Helper(); tally.add(t, m, "unexpected message during the turn") }
	for chunks := 0; chunks < 10; chunks++ {
		m := r.Next("the streamed turn before the reset", left(t, ctx, turn, "the turn's first chunks"))
		if m.IsResponseTo(id) {
			t.Fatalf("the turn ended after %d chunks: %s", chunks, m.Raw)
		}
		onUpdate(m)
	}
	sent, n := len(r.Frames), r.Got
	r.reset()
	// The agent streams on while no socket is there.
	time.Sleep(500 * time.Millisecond)
	m := r.resume(n)
	if m != sent {
		t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d, all answered before the reset", m, sent)
	}
	resp := r.Await("the prompt after the resume", id, left(t, ctx, turn, "the rest of the turn"), onUpdate)
	if got := tally.text.String(); got != want {
		t.Fatalf("the streamed text across the reset is not the prompt's echo: %s", harness.Diverge(got, want))
	}
	if r := stopReason(t, resp); r != "end_turn" {
		t.Fatalf("stopReason %q, want end_turn: %s", r, resp.Raw)
	}
	if tally.infos != 1 {
		t.Errorf("%d session_info_update messages, want 1", tally.infos)
	}
	// Exactly once: nothing more comes.
	quiet(t, r.c, 300*time.Millisecond)
	t.Logf("resumed after %d messages (%d chunks before the reset); the gateway had %d of the client's %d messages", n, 10, m, sent)

	// The resumed connection is an ordinary one.
	c := r.plain()
	echoTurn(t, c, sid, "after the resume", left(t, ctx, turn, "a prompt after the resume"))
	closeClean(t, c)
}

// TestResumeResendsUnreadClientMessages: the gateway's received count
// covers every text frame the client sent, notifications included; a
// request sent just before the socket is reset is answered exactly once,
// whether the gateway had read it (its answer is replayed) or not (the
// client re-sends it after _acpgate/resumed).
func TestResumeResendsUnreadClientMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := startGateway(t, gwOpts{config: resumeConfig + hostilePolicy})
	r := newRconn(t, g, nil)
	r.initialize()
	sid := r.newSession(t.TempDir())
	// A notification (there is no turn to cancel) and a request.
	r.Notify("session/cancel", map[string]string{"sessionId": sid})
	echo := func(nonce string) rpcMsg {
		return r.Await("_demo/echo", r.Request("_demo/echo", map[string]string{"nonce": nonce}), left(t, ctx, turn, "an echo"), nil)
	}
	if m := echo("before"); m.Error != nil || string(m.Result) != `{"nonce":"before"}` {
		t.Fatalf("echo: %s", m.Raw)
	}
	sent, n := len(r.Frames), r.Got
	r.reset()
	if m := r.resume(n); m != sent {
		t.Fatalf("_acpgate/resumed says the gateway received %d messages; the client sent %d (initialize, session/new, a notification, an echo), all before the reset", m, sent)
	}

	// Requests sent right before a reset.
	resent := 0
	for round := range 6 {
		nonce := fmt.Sprintf("round-%d", round)
		id := r.Request("_demo/echo", map[string]string{"nonce": nonce})
		answered := len(r.Frames) - 1 // every frame before this one was answered
		sent, n := len(r.Frames), r.Got
		r.reset()
		m := r.resume(n)
		if m < answered || m > sent {
			t.Fatalf("round %d: _acpgate/resumed says the gateway received %d messages; %d had been answered and %d sent", round, m, answered, sent)
		}
		if m < sent {
			resent++
		}
		a := r.Await(fmt.Sprintf("round %d: the echo sent before the reset", round), id, left(t, ctx, turn, "the echo"), nil)
		if a.Error != nil && strings.Contains(a.Error.Message, "already in flight") && m < sent {
			t.Fatalf("GATEWAY BUG (exactly-once): round %d: %s\n_acpgate/resumed said the gateway had received %d of the client's %d messages, "+
				"so the client re-sent the last one; but the gateway had read it on the old socket too and was handling it", round, a.Raw, m, sent)
		}
		if a.Error != nil || string(a.Result) != mustJSON(t, map[string]string{"nonce": nonce}) {
			t.Fatalf("round %d: %s", round, a.Raw)
		}
		// Exactly one answer.
		select {
		case dup, ok := <-r.c.In:
			if !ok {
				t.Fatalf("round %d: %s", round, closedText(r.c))
			}
			if dup.IsResponseTo(id) && m < sent {
				t.Fatalf("GATEWAY BUG (exactly-once): request %d was answered twice: %s\n"+
					"_acpgate/resumed said the gateway had received %d of the client's %d messages, so the client re-sent the last one, "+
					"yet the gateway also handled the copy it had read on the old socket (see \"connection resumed\" gateway_received=%d, "+
					"and the old socket's msgs_in in its \"connection closed\" record): a frame read but not yet counted when the resume "+
					"takes its count is handled after the count was reported", id, dup.Raw, m, sent, m)
			}
			t.Fatalf("round %d: unexpected message after the answer: %.500s", round, dup.Raw)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Logf("6 requests sent right before a reset: %d re-sent after _acpgate/resumed, %d read by the gateway in time", resent, 6-resent)

	// A request lost in flight: the client counts it as sent, the gateway
	// never got it. The gateway's count says so, and the client re-sends it.
	for round := range 2 {
		nonce := fmt.Sprintf("lost-%d", round)
		r.NextID++
		id := r.NextID
		r.Frames = append(r.Frames, mustJSON(t, map[string]any{"jsonrpc": "2.0", "id": id, "method": "_demo/echo", "params": map[string]string{"nonce": nonce}}))
		sent, n := len(r.Frames), r.Got
		r.reset()
		if m := r.resume(n); m != sent-1 {
			t.Fatalf("lost request %d: _acpgate/resumed says the gateway received %d messages; it got %d of the %d the client counts as sent", round, m, sent-1, sent)
		}
		a := r.Await(fmt.Sprintf("the lost request %d, re-sent", round), id, left(t, ctx, turn, "the echo"), nil)
		if a.Error != nil || string(a.Result) != mustJSON(t, map[string]string{"nonce": nonce}) {
			t.Fatalf("lost request %d: %s", round, a.Raw)
		}
		quiet(t, r.c, 200*time.Millisecond)
	}
	c := r.plain()
	echoTurn(t, c, sid, "after nine resumes", left(t, ctx, turn, "a prompt after the resumes"))
	closeClean(t, c)
}

// promptUntilPermission starts a "permission" turn on r and reads until the
// agent's session/request_permission, which it returns.
func promptUntilPermission(t *testing.T, r *rconn, sid string) (prompt int, perm rpcMsg) {
	t.Helper()
	prompt = r.Request("session/prompt", textPrompt(sid, "ask my permission"))
	for {
		m := r.Next("the permission turn", turn)
		switch {
		case m.Method == "session/request_permission":
			if m.Param("sessionId") != sid {
				t.Fatalf("permission request for another session: %s", m.Raw)
			}
			return prompt, m
		case m.IsResponseTo(prompt):
			t.Fatalf("the prompt ended before asking for permission: %s", m.Raw)
		case m.Method != "session/update":
			t.Fatalf("unexpected message: %.500s", m.Raw)
		}
	}
}

// loadMeta is the _meta.acpgate of a session/load result the gateway
// answered itself.
type loadMeta struct {
	Turn       string `json:"turn"`
	StopReason string `json:"stopReason"`
}

// takeOver connects a plain client, initializes it and sends session/load
// for sid. It returns the client, the load's answer and what came before it.
func takeOver(t *testing.T, g *gateway, header http.Header, sid, cwd string) (*client, rpcMsg, []rpcMsg) {
	t.Helper()
	b, resp, err := dialWith(t, g, "/acp", header, []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v (%s)", err, respText(resp))
	}
	initializeAs(t, b, fsBoth, 30*time.Second)
	var before []rpcMsg
	id := b.Request("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}})
	m := waitFor(t, b, "session/load of the detached connection's session", id, turn, func(m rpcMsg) { before = append(before, m) })
	if m.Error != nil {
		t.Fatalf("session/load of the detached connection's session: %s", m.Raw)
	}
	return b, m, before
}

// gatewayMeta parses result._meta.acpgate of a load answered by the
// gateway; ok is false when there is none.
func gatewayMeta(m rpcMsg) (loadMeta, bool) {
	var res struct {
		Meta struct {
			Acpgate *loadMeta `json:"acpgate"`
		} `json:"_meta"`
	}
	if json.Unmarshal(m.Result, &res) != nil || res.Meta.Acpgate == nil {
		return loadMeta{}, false
	}
	return *res.Meta.Acpgate, true
}

// toolUpdate is the part of a tool call update the tests look at.
func toolUpdate(m rpcMsg) (kind, id, status string) {
	var u struct {
		Update struct {
			Kind       string `json:"sessionUpdate"`
			ToolCallID string `json:"toolCallId"`
			Status     string `json:"status"`
		} `json:"update"`
	}
	_ = json.Unmarshal(m.Params, &u)
	return u.Update.Kind, u.Update.ToolCallID, u.Update.Status
}

// takeOverRunningPermission: A's "permission" turn waits on A's answer when
// A's socket is reset; B loads the session and gets the turn running, the
// permission request again with B's own id, answers it, and gets the tool
// call completed and _acpgate/turn_ended.
func takeOverRunningPermission(t *testing.T, g *gateway, header http.Header, cwd string) {
	t.Helper()
	a := newRconn(t, g, header)
	a.initialize()
	sid := a.newSession(cwd)
	_, permA := promptUntilPermission(t, a, sid)
	var pa struct {
		ToolCall struct {
			ToolCallID string `json:"toolCallId"`
		} `json:"toolCall"`
	}
	_ = json.Unmarshal(permA.Params, &pa)
	a.resetDetached()

	b, load, before := takeOver(t, g, header, sid, cwd)
	if len(before) > 0 {
		t.Errorf("%d messages came before the load's answer, the first: %.500s", len(before), before[0].Raw)
	}
	if meta, ok := gatewayMeta(load); !ok || meta.Turn != "running" {
		t.Fatalf("session/load of a session whose turn runs: %s; want the result {\"_meta\":{\"acpgate\":{\"turn\":\"running\"}}}", load.Raw)
	}
	var permB *rpcMsg
	var reply strings.Builder
	completed := false
	deadline := time.Now().Add(turn)
read:
	for {
		m := b.Next(time.Until(deadline))
		switch m.Method {
		case "session/update":
			u := parseUpdate(t, m)
			if u.SessionID != sid {
				t.Fatalf("update for another session: %.500s", m.Raw)
			}
			if permB == nil {
				continue // buffered since the detach
			}
			kind, id, status := toolUpdate(m)
			if kind == "tool_call_update" && id == pa.ToolCall.ToolCallID && status == "completed" {
				completed = true
			}
			if kind == "agent_message_chunk" {
				reply.WriteString(u.text())
			}
		case "session/request_permission":
			if permB != nil {
				t.Fatalf("a second permission request: %s", m.Raw)
			}
			var pb struct {
				SessionID string `json:"sessionId"`
				ToolCall  struct {
					ToolCallID string `json:"toolCallId"`
				} `json:"toolCall"`
			}
			if json.Unmarshal(m.Params, &pb) != nil || pb.SessionID != sid || pb.ToolCall.ToolCallID != pa.ToolCall.ToolCallID || len(m.ID) == 0 {
				t.Fatalf("the re-sent permission request %s does not match A's %s", m.Raw, permA.Raw)
			}
			t.Logf("A's permission request had id %s, B's has id %s", permA.ID, m.ID)
			permB = &m
			b.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
		case "_acpgate/turn_ended":
			if permB == nil {
				t.Fatalf("the turn ended before the permission request reached B: %s", m.Raw)
			}
			var p struct{ SessionID, StopReason string }
			if len(m.ID) != 0 || json.Unmarshal(m.Params, &p) != nil || p.SessionID != sid || p.StopReason != "end_turn" {
				t.Fatalf("%s; want the notification _acpgate/turn_ended {\"sessionId\":%q,\"stopReason\":\"end_turn\"}", m.Raw, sid)
			}
			break read
		default:
			t.Fatalf("unexpected message after the take-over: %.500s", m.Raw)
		}
	}
	if !completed {
		t.Errorf("no tool_call_update %s completed reached B before the turn ended", pa.ToolCall.ToolCallID)
	}
	if reply.String() != "Permission granted (allow)." {
		t.Errorf("the agent replied %q, want \"Permission granted (allow).\"", reply.String())
	}
	quiet(t, b, 200*time.Millisecond)
	echoTurn(t, b, sid, "B owns the session now", turn)
	closeClean(t, b)
}

// TestTakeoverAnswersPendingPermission: see takeOverRunningPermission.
func TestTakeoverAnswersPendingPermission(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	takeOverRunningPermission(t, g, nil, t.TempDir())
}

// takeOverEnded: A's echo turn ends while A is detached; B's session/load is
// answered by the gateway with the turn ended, then B gets the updates of
// the turn sent since the detach.
func takeOverEnded(t *testing.T, g *gateway, cwd string) {
	t.Helper()
	a := newRconn(t, g, nil)
	a.initialize()
	sid, agentID := a.newSessionAgentID(cwd)
	text := echoText(400) // 50 chunks, about 0.75 s
	want := "You said: " + text
	id := a.Request("session/prompt", textPrompt(sid, text))
	if m := a.Next("the echo turn", turn); m.IsResponseTo(id) || m.Method != "session/update" {
		t.Fatalf("want the turn streaming: %s", m.Raw)
	}
	a.resetDetached()
	waitTurnStored(t, g, agentID, 1, turn)
	// The agent stores the reply just before it sends the turn's last
	// update and the prompt's response: let the gateway have them.
	time.Sleep(300 * time.Millisecond)
	b, load, before := takeOver(t, g, nil, sid, cwd)
	if len(before) > 0 {
		t.Errorf("%d messages came before the load's answer, the first: %.500s", len(before), before[0].Raw)
	}
	if meta, ok := gatewayMeta(load); !ok || meta.Turn != "ended" || meta.StopReason != "end_turn" {
		t.Fatalf("session/load of a session whose turn ended while detached: %s; want the result {\"_meta\":{\"acpgate\":{\"turn\":\"ended\",\"stopReason\":\"end_turn\"}}}", load.Raw)
	}
	tally := &turnTally{sid: sid}
	for tally.infos == 0 {
		tally.add(t, b.Next(5*time.Second), "after the load; want the turn's updates since the detach")
	}
	if tail := tally.text.String(); tail == "" || !strings.HasSuffix(want, tail) {
		t.Errorf("the updates since the detach carry %q; want a non-empty end of %q", tail, want)
	}
	select {
	case m := <-b.In:
		t.Errorf("after the buffered updates: %.500s (no turn runs, so no _acpgate/turn_ended)", m.Raw)
	case <-time.After(300 * time.Millisecond):
	}
	// A's connection had nothing left (its only session taken over, no
	// request in flight): it ended at once, so its token is refused and it
	// no longer counts as detached.
	wantResumeRefused(t, g, a.header, resumePath(a.token, strconv.Itoa(a.Got)), "the token of a connection emptied by a take-over")
	waitMetric(t, g, "acpgate_connections_detached", "", "0", 5*time.Second, func(v float64) bool { return v == 0 })
	echoTurn(t, b, sid, "B owns the session now", turn)
	closeClean(t, b)
}

// takeOverIdle: A detaches with no turn running; B's session/load goes to
// the agent, which replays the history.
func takeOverIdle(t *testing.T, g *gateway, cwd string) {
	t.Helper()
	a := newRconn(t, g, nil)
	a.initialize()
	sid := a.newSession(cwd)
	onUpdate, _ := collectText(t, sid)
	m := a.Await("an echo turn", a.Request("session/prompt", textPrompt(sid, "an idle detach")), turn, onUpdate)
	if stopReason(t, m) != "end_turn" {
		t.Fatalf("echo turn: %s", m.Raw)
	}
	a.resetDetached()
	b, load, before := takeOver(t, g, nil, sid, cwd)
	if meta, ok := gatewayMeta(load); ok {
		t.Fatalf("session/load of an idle detached session was answered by the gateway (%+v): %s; want the agent's answer", meta, load.Raw)
	}
	if replay := updatesText(t, before, ""); !strings.Contains(replay, "You said: an idle detach") {
		t.Errorf("the agent's load replayed %q; want the history with \"You said: an idle detach\"", replay)
	}
	echoTurn(t, b, sid, "B owns the session now", turn)
	closeClean(t, b)
}

// TestTakeoverTurnEndedWhileDetached: see takeOverEnded.
func TestTakeoverTurnEndedWhileDetached(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	takeOverEnded(t, g, t.TempDir())
}

// TestTakeoverIdleGoesToAgent: see takeOverIdle.
func TestTakeoverIdleGoesToAgent(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	takeOverIdle(t, g, t.TempDir())
}

// TestDetachTimeoutCancels: with detach_timeout 2s, a slow turn whose
// socket was reset runs on for about 2 s, then is cancelled on the agent;
// the token is refused from then on.
func TestDetachTimeoutCancels(t *testing.T) {
	const timeout = 2 * time.Second
	g := startGateway(t, gwOpts{config: resumeConfig + "sessions: {detach_timeout: 2s}\n"})
	cwd := t.TempDir()
	r := newRconn(t, g, nil)
	r.initialize()
	sid, agentID := r.newSessionAgentID(cwd)
	r.slowTurn(sid, 3)
	n := r.Got
	r.reset()
	resetAt := time.Now()
	waitDetached(t, g, 1)

	// Half-way through the detach timeout the turn still runs.
	time.Sleep(time.Until(resetAt.Add(timeout / 2)))
	if n, last := agentReplies(storedHistory(t, g, agentID)); n > 0 {
		t.Fatalf("the turn ended %s after the reset, within detach_timeout (%s): the agent stored %q", time.Since(resetAt).Round(time.Millisecond), timeout, last)
	}
	endedAt, reply := waitTurnStored(t, g, agentID, 1, 10*time.Second)
	took := endedAt.Sub(resetAt)
	ticks := strings.Count(reply, "tick ")
	t.Logf("the turn ended %s after the reset, with %d ticks", took.Round(time.Millisecond), ticks)
	if took < timeout*3/4 || took > timeout+3*time.Second {
		t.Errorf("the turn ended %s after the reset; want about detach_timeout (%s)", took.Round(time.Millisecond), timeout)
	}
	if ticks >= 600 {
		t.Errorf("the turn ran to its end (%d ticks) instead of being cancelled", ticks)
	}
	// It ran on while detached: well past the 3 ticks the client saw.
	if ticks < 3+int(timeout/(100*time.Millisecond))/2 {
		t.Errorf("the turn stopped after %d ticks; it should have run on for about %s after the reset", ticks, timeout)
	}
	waitDetached(t, g, 0)
	wantResumeRefused(t, g, nil, resumePath(r.token, strconv.Itoa(n)), "the token of a connection whose detach timeout passed")

	// The session was freed: another connection loads and prompts it.
	b := dial(t, g)
	initializeAs(t, b, fsBoth, 30*time.Second)
	m := b.Await(b.Request("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}}), turn, func(rpcMsg) {})
	if m.Error != nil {
		t.Fatalf("session/load after the detach timeout: %s", m.Raw)
	}
	if meta, ok := gatewayMeta(m); ok {
		t.Errorf("session/load after the detach timeout was answered by the gateway (%+v): %s", meta, m.Raw)
	}
	echoTurn(t, b, sid, "after the detach timeout", turn)
	closeClean(t, b)
}

// TestCleanCloseCancelsAtOnce: a client that closes with 1000 ends its
// connection at once, as before: the running turn is cancelled and the
// token is refused.
func TestCleanCloseCancelsAtOnce(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	r := newRconn(t, g, nil)
	r.initialize()
	sid, agentID := r.newSessionAgentID(t.TempDir())
	r.slowTurn(sid, 3)
	n := r.Got
	closeErr := r.c.WS.Close(websocket.StatusNormalClosure, "")
	closedAt := time.Now()
	r.c.Kill() // waits for the reader
	if closeErr != nil {
		t.Errorf("close with 1000: %v (%s)", closeErr, closedText(r.c))
	}
	// The close frame is echoed as it is read; the gateway ends the
	// connection right after, and logs it: a resume sent in between would
	// still find it (a loaded machine showed that window once).
	g.WaitLog(t, "connection closed", "conn", r.connID, 5*time.Second)
	wantResumeRefused(t, g, nil, resumePath(r.token, strconv.Itoa(n)), "the token of a connection the client closed with 1000")
	endedAt, reply := waitTurnStored(t, g, agentID, 1, 10*time.Second)
	if d := endedAt.Sub(closedAt); d > 1500*time.Millisecond {
		t.Errorf("the turn ended %s after the close; want at once (the detach timeout is 5 min)", d.Round(time.Millisecond))
	}
	t.Logf("the turn ended %s after the close, with %d ticks", endedAt.Sub(closedAt).Round(time.Millisecond), strings.Count(reply, "tick "))
	if v, found := metricWith(t, g, "acpgate_connections_detached", ""); !found || v != 0 {
		t.Errorf("acpgate_connections_detached is %g (exposed: %v) after a clean close; want 0", v, found)
	}
}

// TestResumeSupersedesOpenSocket: a resume while the old socket is still
// open closes the old one with 1008; the new one carries on exactly.
func TestResumeSupersedesOpenSocket(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	r := newRconn(t, g, nil)
	r.initialize()
	sid := r.newSession(t.TempDir())
	id, k := r.slowTurn(sid, 5)
	old, sent := r.c, len(r.Frames)
	if m := r.resume(r.Got); m != sent {
		t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
	}
	st, _ := closedWith(t, old, 10*time.Second)
	if st != websocket.StatusPolicyViolation {
		t.Errorf("the superseded socket: %s; want close 1008", closedText(old))
	}
	for before := k.ticks; k.ticks < before+5; {
		k.handle(r.Next("the slow turn on the new socket", turn))
	}
	r.Notify("session/cancel", map[string]string{"sessionId": sid})
	m := r.Await("the cancelled prompt", id, turn, k.handle)
	if s := stopReason(t, m); s != "cancelled" {
		t.Fatalf("stopReason %q, want cancelled: %s", s, m.Raw)
	}
	if k.infos != 1 {
		t.Errorf("%d session_info_update messages, want 1", k.infos)
	}
	c := r.plain()
	echoTurn(t, c, sid, "on the new socket", turn)
	closeClean(t, c)
}

// TestSlowReaderDoesNotDelayBystander: with a single agent process, client
// A asks for many large answers and never reads them; client B's echo turns
// on the same process stay fast all along: the agent's output is never held
// up by A.
//
// A's requests must be small, or B's prompts would queue behind them on the
// agent's stdin: A sends session/load of a session whose stored history is
// one large user message, which the demo agent replays whole, so that each
// small request makes the agent write a large update for A.
func TestSlowReaderDoesNotDelayBystander(t *testing.T) {
	const (
		limit   = 250 * time.Millisecond
		stalled = 2 * time.Second // what a turn held up behind A would take, at least
		loads   = 60
		history = 256 << 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := startGateway(t, gwOpts{config: resumeConfig + "limits: {messages_per_second: 0}\n"})
	waitReady(t, g, 30*time.Second)
	cwd := t.TempDir()

	// The large session: a "slow" prompt of 256 kB, cancelled at once.
	setup := dial(t, g)
	initializeAs(t, setup, fsBoth, 30*time.Second)
	big := openSession(t, setup, cwd, turn)
	pid := setup.Request("session/prompt", textPrompt(big, "slow "+strings.Repeat("x", history)))
	if m := setup.Next(turn); m.Method != "session/update" {
		t.Fatalf("want the slow turn running: %.300s", m.Raw)
	}
	setup.Notify("session/cancel", map[string]string{"sessionId": big})
	if r := stopReason(t, waitFor(t, setup, "the large prompt", pid, turn, func(rpcMsg) {})); r != "cancelled" {
		t.Fatalf("the large prompt: stopReason %q", r)
	}
	closeClean(t, setup)

	b := dial(t, g)
	initializeAs(t, b, fsBoth, 30*time.Second)
	sid := openSession(t, b, cwd, turn)
	echoTurn(t, b, sid, "warm up", turn)

	// A: initializes, reads the answer, then asks for the large session's
	// history over and over and never reads again.
	ws, write := dialRawInit(t, ctx, g, 16<<20)
	defer ws.CloseNow()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, init, err := ws.Read(rctx)
	rcancel()
	if err != nil || !strings.Contains(string(init), `"result"`) {
		t.Fatalf("A's initialize: %v %.300s", err, init)
	}
	var (
		sentA   int
		errA    error
		stopA   = make(chan struct{})
		writerA = make(chan struct{})
	)
	go func() {
		defer close(writerA)
		for i := 1; i <= loads; i++ {
			select {
			case <-stopA:
				return
			case <-time.After(40 * time.Millisecond):
			}
			if err := write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session/load","params":{"sessionId":%q,"cwd":%q,"mcpServers":[]}}`, i, big, cwd)); err != nil {
				errA = err
				return
			}
			sentA = i
		}
	}()
	stopWriter := func() {
		select {
		case <-stopA:
		default:
			close(stopA)
		}
		ws.CloseNow() // unblocks a write the gateway does not read
		<-writerA
	}
	defer stopWriter()

	// B runs echo turns while A asks, and for 2 s after A's last request
	// (at least 20 turns, at most 20 s in all).
	var took []time.Duration
	var writerDoneAt time.Time
	measureStart := time.Now()
	for i := 0; ; i++ {
		select {
		case <-writerA:
			if writerDoneAt.IsZero() {
				writerDoneAt = time.Now()
			}
		default:
		}
		if len(took) >= 20 && (!writerDoneAt.IsZero() && time.Since(writerDoneAt) > 2*time.Second || time.Since(measureStart) > 20*time.Second) {
			break
		}
		start := time.Now()
		echoTurn(t, b, sid, fmt.Sprintf("B %03d", i), left(t, ctx, 5*time.Second, "B's echo turn"))
		took = append(took, time.Since(start))
	}
	writerDone := !writerDoneAt.IsZero()
	// A reads at last: every load was answered, nothing was dropped.
	answered := 0
	if writerDone && errA == nil {
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		for answered < sentA {
			_, frame, err := ws.Read(rctx)
			if err != nil {
				t.Errorf("A, reading at last, got %d of %d answers to its loads, then: %v", answered, sentA, err)
				break
			}
			var m rpcMsg
			if json.Unmarshal(frame, &m) == nil && m.Method == "" && len(m.ID) > 0 {
				if m.Error != nil {
					t.Errorf("A's load was refused: %.300s", frame)
				}
				answered++
			}
		}
		rcancel()
	}
	stopWriter()
	sorted := append([]time.Duration(nil), took...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	slowest, median := sorted[len(sorted)-1], sorted[len(sorted)/2]
	t.Logf("A asked %d times for %d kB it did not read (writer finished: %v, error: %v; %d answers read at the end); B ran %d echo turns: median %s, slowest %s",
		sentA, history>>10, writerDone, errA, answered, len(took), median.Round(time.Millisecond), slowest.Round(time.Millisecond))
	if sentA < loads/2 {
		t.Errorf("A could send only %d of %d requests (%v)", sentA, loads, errA)
	}
	// Held up by A, B's turns would wait for A to read, that is until the
	// end: seconds, every one of them. A busy machine's scheduler stalls a
	// few turns by a few hundred milliseconds; those are not A's doing.
	slow := 0
	for i, d := range took {
		if d > limit {
			slow++
		}
		if d > stalled {
			t.Errorf("B's echo turn %d took %s; want < %s while A does not read", i, d.Round(time.Millisecond), stalled)
		}
	}
	if median > limit || slow > len(took)/10 {
		t.Errorf("B's echo turns: median %s, %d of %d over %s; want a median under it and at most a tenth over", median.Round(time.Millisecond), slow, len(took), limit)
	}
	if pids := g.agentPIDs(); len(pids) != 1 {
		t.Errorf("agent processes %v; want the one both clients share", pids)
	}
	closeClean(t, b)
}

// TestResumeMetrics: after a detach, a resume, a refused resume and one
// take-over of each kind, /metrics exposes the resume families with those
// counts.
func TestResumeMetrics(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	cwd := t.TempDir()

	// The gauges are there from the start (the counters once counted).
	for _, name := range []string{"acpgate_connections_detached", "acpgate_replay_buffer_bytes"} {
		if v, found := metricWith(t, g, name, ""); !found || v != 0 {
			t.Errorf("on a fresh gateway %s is %g (exposed: %v); want 0", name, v, found)
		}
	}

	t.Run("detach and resume", func(t *testing.T) {
		r := newRconn(t, g, nil)
		r.initialize()
		r.newSession(cwd)
		n := r.Got
		r.reset()
		waitDetached(t, g, 1)
		if v, _ := metricWith(t, g, "acpgate_replay_buffer_bytes", ""); v <= 0 {
			t.Errorf("acpgate_replay_buffer_bytes is %g while a connection that received %d messages is detached; want > 0", v, n)
		}
		wantResumeRefused(t, g, nil, resumePath(flip(r.token), strconv.Itoa(n)), "a forged token")
		r.resume(n)
		waitDetached(t, g, 0)
		closeClean(t, r.c)
	})
	t.Run("take-over, turn running", func(t *testing.T) { takeOverRunningPermission(t, g, nil, cwd) })
	t.Run("take-over, turn ended", func(t *testing.T) { takeOverEnded(t, g, cwd) })
	t.Run("take-over, idle", func(t *testing.T) { takeOverIdle(t, g, cwd) })

	want := []struct {
		name, label string
		min         float64
	}{
		{"acpgate_resumes_total", `result="ok"`, 1},
		{"acpgate_resumes_total", `result="refused"`, 2}, // the forged token, and the token of the connection the ended take-over emptied
		{"acpgate_takeovers_total", `turn="running"`, 1},
		{"acpgate_takeovers_total", `turn="ended"`, 1},
		{"acpgate_takeovers_total", `turn="idle"`, 1},
	}
	for _, w := range want {
		v, found := metricWith(t, g, w.name, w.label)
		if !found || v != w.min {
			t.Errorf("%s{%s} is %g (exposed: %v); want %g", w.name, w.label, v, found, w.min)
		}
	}
	if v, found := metricWith(t, g, "acpgate_connections_detached", ""); !found || v < 0 || v > 3 {
		t.Errorf("acpgate_connections_detached is %g (exposed: %v); want between 0 and 3 (the connections whose sessions were taken over)", v, found)
	}
	if v, found := metricWith(t, g, "acpgate_replay_buffer_bytes", ""); !found || v < 0 || v > 3*8388608 {
		t.Errorf("acpgate_replay_buffer_bytes is %g (exposed: %v)", v, found)
	}
	families := metricsText(t, g)
	for _, f := range []string{
		"# TYPE acpgate_connections_detached gauge",
		"# TYPE acpgate_resumes_total counter",
		"# TYPE acpgate_takeovers_total counter",
		"# TYPE acpgate_replay_buffer_bytes gauge",
	} {
		if !strings.Contains(families, f) {
			t.Errorf("/metrics lacks %q", f)
		}
	}
	t.Logf("\n%s", metricLines(t, g, "acpgate_"))
}

// metricsText is the raw /metrics page.
func metricsText(t *testing.T, g *gateway) string {
	t.Helper()
	_, body, err := metricscrape.Get(g.Addr)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("GET /metrics: %v", err)
	}
	return body
}

// --- more ways to lose a socket ---

// blackhole is a TCP relay to the gateway that can go silent, as a network
// that drops everything does: once frozen, nothing passes either way, not
// even a FIN or a RST.
type blackhole struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln := harness.Listen(t)
	b := &blackhole{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, in, out)
			b.mu.Unlock()
			b.wg.Add(2)
			go b.pipe(in, out)
			go b.pipe(out, in)
		}
	}()
	t.Cleanup(b.close)
	return b
}

// pipe copies src to dst until src ends, dropping everything once frozen.
func (b *blackhole) pipe(src, dst net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.frozen.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			if !b.frozen.Load() {
				_ = dst.(*net.TCPConn).CloseWrite()
			}
			return
		}
	}
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// TestResumeAfterPingTimeout: the network goes silent (no FIN, no RST);
// the gateway's ping goes unanswered and the connection detaches. What the
// gateway wrote into the dead socket meanwhile is replayed on the resume.
func TestResumeAfterPingTimeout(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig + "websocket: {ping_interval: 1s, ping_timeout: 1s}\n"})
	bh := newBlackhole(t, g.Addr)
	r := newRconnVia(t, g, bh.ln.Addr().String(), nil)
	r.initialize()
	sid := r.newSession(t.TempDir())
	id, k := r.slowTurn(sid, 5)
	sent, n := len(r.Frames), r.Got
	before, _ := metricWith(t, g, "acpgate_connections_detached", "")
	bh.frozen.Store(true)
	frozenAt := time.Now()
	r.c.Kill() // the client gives up on its socket; nothing reaches the gateway
	waitMetric(t, g, "acpgate_connections_detached", "", fmt.Sprintf("> %g", before), 10*time.Second, func(v float64) bool { return v > before })
	t.Logf("detached %s after the network went silent", time.Since(frozenAt).Round(time.Millisecond))
	if m := r.resume(n); m != sent {
		t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
	}
	// The ticks of the silent seconds, then live ones, in order.
	for k.ticks < 50 {
		k.handle(r.Next("the slow turn after the resume", turn))
	}
	r.Notify("session/cancel", map[string]string{"sessionId": sid})
	if m := r.Await("the cancelled prompt", id, turn, k.handle); stopReason(t, m) != "cancelled" {
		t.Fatalf("the prompt: %s; want stopReason cancelled", m.Raw)
	}
	c := r.plain()
	closeClean(t, c)
}

// TestResumeAfterNonNormalClose: a client close with any code but 1000
// detaches the connection: it resumes.
func TestResumeAfterNonNormalClose(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	cwd := t.TempDir()
	for _, code := range []websocket.StatusCode{websocket.StatusGoingAway, websocket.StatusInternalError, 4000} {
		t.Run(fmt.Sprintf("close %d", int(code)), func(t *testing.T) {
			r := newRconn(t, g, nil)
			r.initialize()
			sid := r.newSession(cwd)
			sent, n := len(r.Frames), r.Got
			before, _ := metricWith(t, g, "acpgate_connections_detached", "")
			_ = r.c.CloseWith(code, "the client goes")
			waitMetric(t, g, "acpgate_connections_detached", "", fmt.Sprintf("> %g", before), 5*time.Second, func(v float64) bool { return v > before })
			if m := r.resume(n); m != sent {
				t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
			}
			c := r.plain()
			echoTurn(t, c, sid, "back after a close "+strconv.Itoa(int(code)), turn)
			closeClean(t, c)
		})
	}
}

// TestResumeAnswersPendingPermission: the agent's permission request is
// pending when the socket is reset; the client resumes claiming it never got
// it: the request comes again, with its original id, and the client's answer
// completes the turn.
func TestResumeAnswersPendingPermission(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	r := newRconn(t, g, nil)
	r.initialize()
	sid := r.newSession(t.TempDir())
	pid, perm := promptUntilPermission(t, r, sid)
	sent, n := len(r.Frames), r.Got
	r.resetDetached()
	if m := r.resume(n - 1); m != sent {
		t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
	}
	again := r.Next("the replayed permission request", 5*time.Second)
	if !bytes.Equal(again.Raw, perm.Raw) {
		t.Fatalf("the first replayed message is\n  %s\nwant the permission request as first sent\n  %s", again.Raw, perm.Raw)
	}
	r.Respond(again.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
	var reply strings.Builder
	completed := false
	m := r.Await("the prompt after the answer", pid, turn, func(m rpcMsg) {
		if m.Method != "session/update" {
			t.Fatalf("unexpected message: %.500s", m.Raw)
		}
		if kind, _, status := toolUpdate(m); kind == "tool_call_update" && status == "completed" {
			completed = true
		}
		if u := parseUpdate(t, m); u.Update.Kind == "agent_message_chunk" {
			reply.WriteString(u.text())
		}
	})
	if stopReason(t, m) != "end_turn" || !completed || reply.String() != "Permission granted (allow)." {
		t.Fatalf("the prompt ended %s, tool call completed: %v, reply %q; want end_turn, true, \"Permission granted (allow).\"", m.Raw, completed, reply.String())
	}
	c := r.plain()
	closeClean(t, c)
}

// TestDetachTimeoutZero: detach_timeout 0 is the old behaviour: a reset
// ends the connection at once, the turn is cancelled, and there is nothing
// to resume.
func TestDetachTimeoutZero(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig + "sessions: {detach_timeout: 0s}\n"})
	c, tcp, resp, err := dialTCP(t, g.Addr, "/acp", nil)
	if err != nil {
		t.Fatalf("dial: %v (%s)", err, respText(resp))
	}
	id := c.Request("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": fsBoth.caps()})
	init := waitFor(t, c, "initialize", id, 30*time.Second, nil)

	before := stateFiles(t, g.stateDir)
	sid := c.newSession(t.TempDir())
	var agentID string
	for id := range stateFiles(t, g.stateDir) {
		if _, old := before[id]; !old {
			agentID = id
		}
	}
	c.Request("session/prompt", textPrompt(sid, "slow please"))
	k := &ticker{t: t, sid: sid}
	for k.ticks < 3 {
		k.handle(c.Next(turn))
	}
	_ = tcp.SetLinger(0)
	_ = tcp.Close()
	resetAt := time.Now()
	endedAt, _ := waitTurnStored(t, g, agentID, 1, 10*time.Second)
	if d := endedAt.Sub(resetAt); d > 1500*time.Millisecond {
		t.Errorf("the turn ended %s after the reset; with detach_timeout 0 it ends at once", d.Round(time.Millisecond))
	}
	if v, _ := metricWith(t, g, "acpgate_connections_detached", ""); v != 0 {
		t.Errorf("acpgate_connections_detached is %g with detach_timeout 0", v)
	}
	if tok := acpclient.ResumeToken(init); tok != "" {
		wantResumeRefused(t, g, nil, resumePath(tok, "3"), "the token of a connection that could not detach")
	} else {
		t.Logf("with detach_timeout 0 the initialize result has no resume token: %s", init.Raw)
	}
}

// TestResumeReplayBufferOverflow: with replay_buffer_bytes 64 KiB, a resume from a
// point the buffer no longer holds is refused (and harms nothing), and a
// detached connection whose buffer overflows ends at once: its turn is
// cancelled long before the detach timeout, and its token is refused.
func TestResumeReplayBufferOverflow(t *testing.T) {
	const buffer = 64 << 10
	g := startGateway(t, gwOpts{config: resumeConfig + fmt.Sprintf("sessions: {replay_buffer_bytes: %d}\n", buffer) + hostilePolicy})
	r := newRconn(t, g, nil)
	r.initialize()
	sid, agentID := r.newSessionAgentID(t.TempDir())
	// 90 kB of answers: the first messages fall out of the buffer.
	for i := range 3 {
		pad := strings.Repeat(strconv.Itoa(i), 30<<10)
		m := r.Await("_demo/echo", r.Request("_demo/echo", map[string]string{"pad": pad}), turn, nil)
		if m.Error != nil {
			t.Fatalf("echo: %.300s", m.Raw)
		}
	}
	sent, n := len(r.Frames), r.Got
	r.resetDetached()
	wantResumeRefused(t, g, nil, resumePath(r.token, "0"), "received=0, whose messages the buffer no longer holds")
	wantResumeRefused(t, g, nil, resumePath(r.token, "1"), "received=1, whose messages the buffer no longer holds")
	if m := r.resume(n); m != sent {
		t.Errorf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
	}
	quiet(t, r.c, 200*time.Millisecond)

	// A turn that streams about 200 kB while detached.
	text := echoText(8000)
	r.Request("session/prompt", textPrompt(sid, text))
	for i := 0; i < 5; i++ {
		if m := r.Next("the echo turn", turn); m.Method != "session/update" {
			t.Fatalf("want the turn streaming: %.300s", m.Raw)
		}
	}
	n = r.Got
	r.resetDetached()
	resetAt := time.Now()
	endedAt, reply := waitTurnStored(t, g, agentID, 1, 20*time.Second)
	t.Logf("the turn ended %s after the reset, having streamed %d of %d characters", endedAt.Sub(resetAt).Round(time.Millisecond), len(reply), len("You said: "+text))
	if len(reply) >= len("You said: "+text) {
		t.Fatalf("the turn ran to its end (%s after the reset): the replay buffer's overflow did not end the connection", endedAt.Sub(resetAt).Round(time.Millisecond))
	}
	waitDetached(t, g, 0)
	wantResumeRefused(t, g, nil, resumePath(r.token, strconv.Itoa(n)), "the token of a connection whose replay buffer overflowed")
}

// TestResumeReplayBufferHoldsSmallMessages: with the default replay buffer
// (8 MiB), a connection detached while its turn streams about 100 kB stays
// resumable, even while another client moves large messages through the
// gateway at the same time.
func TestResumeReplayBufferHoldsSmallMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := startGateway(t, gwOpts{config: resumeConfig + "limits: {messages_per_second: 0}\n" + hostilePolicy})
	r := newRconn(t, g, nil)
	r.initialize()
	sid, agentID := r.newSessionAgentID(t.TempDir())

	// Another client echoes 200 kB messages all along.
	p, err := wsDial(g.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := p.initialize(); err != nil {
		t.Fatal(err)
	}
	var (
		pumped  atomic.Int64
		pumpErr error
		stop    = make(chan struct{})
		pumping = make(chan struct{})
	)
	go func() {
		defer close(pumping)
		pad := strings.Repeat("p", 200<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := p.Call("_demo/echo", map[string]string{"pad": pad}, 20*time.Second)
			if err == nil && m.Error != nil {
				err = fmt.Errorf("echo: %.300s", m.Raw)
			}
			if err != nil {
				pumpErr = err
				return
			}
			pumped.Add(1)
		}
	}()
	stopPump := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-pumping
	}
	defer stopPump()

	// About 500 chunks of some 200 bytes: 7-8 s of streaming.
	text := echoText(4000)
	want := "You said: " + text
	id := r.Request("session/prompt", textPrompt(sid, text))
	var got strings.Builder
	onUpdate := func(m rpcMsg) {
		t.Helper()
		if m.Method != "session/update" {
			t.Fatalf("unexpected message during the turn: %.500s", m.Raw)
		}
		if u := parseUpdate(t, m); u.Update.Kind == "agent_message_chunk" {
			got.WriteString(u.text())
		}
	}
	for i := 0; i < 5; i++ {
		onUpdate(r.Next("the streamed turn", turn))
	}
	n := r.Got
	r.resetDetached()
	resetAt := time.Now()
	endedAt, _ := waitTurnStored(t, g, agentID, 1, left(t, ctx, 30*time.Second, "the turn's end"))
	stopPump()
	t.Logf("the turn ended %s after the reset; meanwhile the other client echoed %d messages of 200 kB (%v); acpgate_replay_buffer_bytes %s",
		endedAt.Sub(resetAt).Round(time.Millisecond), pumped.Load(), pumpErr, metricLines(t, g, "acpgate_replay_buffer_bytes"))
	if pumpErr != nil {
		t.Errorf("the other client: %v", pumpErr)
	}
	status, body := 0, ""
	c, tcp, resp, err := dialTCP(t, g.Addr, resumePath(r.token, strconv.Itoa(n)), nil)
	if err != nil {
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			status, body = resp.StatusCode, string(b)
		}
		var overflowed []string
		for _, l := range strings.Split(g.LogText(), "\n") {
			if strings.Contains(l, "replay buffer full") {
				overflowed = append(overflowed, l)
			}
		}
		t.Fatalf("GATEWAY BUG: the resume after a turn of %d chunks of some 200 bytes (~%d kB in all) was refused (%d %s); the gateway logged:\n  %s\n"+
			"proxy/outbox.go keep() counts cap() of a pooled buffer (jsonrpc.GetBuffer may hand out up to 256 kB for a 200-byte message), so the 8 MiB budget can fill with a few dozen small messages",
			len(want)/8, len(want)/8*200>>10, status, body, strings.Join(overflowed, "\n  "))
	}
	_ = tcp
	r.c = c
	first := r.c.Next(5 * time.Second)
	if first.Method != "_acpgate/resumed" {
		t.Fatalf("first message %.300s", first.Raw)
	}
	m := r.Await("the prompt after the resume", id, turn, onUpdate)
	if got.String() != want {
		t.Fatalf("the streamed text across the reset is not the prompt's echo: %s", harness.Diverge(got.String(), want))
	}
	if stopReason(t, m) != "end_turn" {
		t.Fatalf("the prompt: %s", m.Raw)
	}
	c.NextID = r.NextID
	closeClean(t, c)
}

// TestResumeSupersedeExactlyOnce: the client sends a burst of requests and
// at once resumes on a new socket while the old one is still open, so that
// some of the burst is still on its way through the old socket. Whatever
// _acpgate/resumed says the gateway received, the client re-sends the rest,
// and every request is answered exactly once.
func TestResumeSupersedeExactlyOnce(t *testing.T) {
	const burst = 50
	g := startGateway(t, gwOpts{config: resumeConfig + "limits: {messages_per_second: 0}\n" + hostilePolicy})
	for round := range 3 {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			r := newRconn(t, g, nil)
			r.initialize()
			first := r.NextID + 1
			pad := strings.Repeat("b", 2<<10)
			for i := range burst {
				r.Request("_demo/echo", map[string]any{"i": i, "pad": pad})
			}
			old, sent := r.c, len(r.Frames)
			m := r.resume(r.Got)
			if m > sent {
				t.Fatalf("_acpgate/resumed says the gateway received %d messages; the client sent %d", m, sent)
			}
			closedWith(t, old, 10*time.Second)
			answers := map[string]int{}
			var dups []string
			deadline := time.Now().Add(turn)
			for len(answers) < burst {
				a := r.Next("the burst's answers", time.Until(deadline))
				id, _ := strconv.Atoi(string(a.ID))
				if a.Method != "" || id < first || id >= first+burst {
					t.Fatalf("unexpected message: %.300s", a.Raw)
				}
				if answers[string(a.ID)]++; answers[string(a.ID)] > 1 {
					dups = append(dups, string(a.Raw))
				}
			}
			for more := true; more; {
				select {
				case a := <-r.c.In:
					if answers[string(a.ID)]++; answers[string(a.ID)] > 1 {
						dups = append(dups, string(a.Raw))
					}
				case <-time.After(500 * time.Millisecond):
					more = false
				}
			}
			t.Logf("the gateway had received %d of %d messages when the new socket took over; %d re-sent", m, sent, sent-m)
			if len(dups) > 0 {
				t.Fatalf("GATEWAY BUG (exactly-once): %d requests were answered twice, the first second answer: %.200s\n"+
					"_acpgate/resumed said the gateway had received %d of the client's %d messages, so the client re-sent the last %d; "+
					"yet the gateway also handled copies it had read from the superseded socket (frames read but not yet counted when "+
					"Attach took its count: compare gateway_received in \"connection resumed\" with msgs_in of the socket closed 1008)",
					len(dups), dups[0], m, sent, sent-m)
			}
			c := r.plain()
			closeClean(t, c)
		})
	}
}

// TestTakeoverRunningSlowTurn: A's slow turn streams on while A is detached;
// B takes the session over with session/resume, gets the ticks since the
// detach and then the live ones, in order with none repeated, cancels the
// turn itself and is told with _acpgate/turn_ended.
func TestTakeoverRunningSlowTurn(t *testing.T) {
	g := startGateway(t, gwOpts{config: resumeConfig})
	cwd := t.TempDir()
	a := newRconn(t, g, nil)
	a.initialize()
	sid := a.newSession(cwd)
	a.Request("session/prompt", textPrompt(sid, "slow please"))
	ka := &ticker{t: t, sid: sid}
	for ka.ticks < 3 {
		ka.handle(a.Next("A's slow turn", turn))
	}
	a.resetDetached()
	time.Sleep(500 * time.Millisecond) // ticks while detached

	b := dial(t, g)
	initializeAs(t, b, fsBoth, 30*time.Second)
	var before []rpcMsg
	m := waitFor(t, b, "session/resume of the detached connection's session", b.Request("session/resume", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}}),
		turn, func(m rpcMsg) { before = append(before, m) })
	if len(before) > 0 {
		t.Errorf("%d messages came before the answer, the first: %.300s", len(before), before[0].Raw)
	}
	if meta, ok := gatewayMeta(m); m.Error != nil || !ok || meta.Turn != "running" {
		t.Fatalf("session/resume of a session whose turn runs: %s; want the result {\"_meta\":{\"acpgate\":{\"turn\":\"running\"}}}", m.Raw)
	}
	// The ticks: the first one B gets is any after A's third; from then on
	// consecutive.
	firstTick, last := 0, 0
	for last < firstTick+10 || firstTick == 0 {
		m := b.Next(turn)
		if m.Method != "session/update" {
			t.Fatalf("after the take-over: %.300s; want the turn's updates", m.Raw)
		}
		u := parseUpdate(t, m)
		if u.SessionID != sid || u.Update.Kind != "agent_message_chunk" {
			t.Fatalf("after the take-over: %.300s", m.Raw)
		}
		var n int
		if _, err := fmt.Sscanf(u.text(), "tick %d ", &n); err != nil {
			t.Fatalf("chunk %q", u.text())
		}
		switch {
		case firstTick == 0:
			if n <= 3 {
				t.Fatalf("B's first tick is %d; A had already got ticks 1-3 (and its socket was reset after them)", n)
			}
			firstTick = n
		case n != last+1:
			t.Fatalf("B got tick %d after tick %d: a tick was lost or repeated between the buffered and the live ones", n, last)
		}
		last = n
	}
	t.Logf("B's first tick was %d (A got 3 before its reset)", firstTick)
	b.Notify("session/cancel", map[string]string{"sessionId": sid})
	for {
		m := b.Next(turn)
		if m.Method == "session/update" {
			continue
		}
		var p struct{ SessionID, StopReason string }
		if m.Method != "_acpgate/turn_ended" || json.Unmarshal(m.Params, &p) != nil || p.SessionID != sid || p.StopReason != "cancelled" {
			t.Fatalf("after B's session/cancel: %.300s; want _acpgate/turn_ended {\"sessionId\":%q,\"stopReason\":\"cancelled\"}", m.Raw, sid)
		}
		break
	}
	echoTurn(t, b, sid, "B owns the session now", turn)
	closeClean(t, b)
}
