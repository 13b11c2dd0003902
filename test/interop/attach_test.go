//go:build unix

package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestSDKOwnerWithAttachedClient: the official SDK 2.4.0 client
// (sdk-owner.mjs), unchanged, owns a session through the real gateway while
// another client (a raw WebSocket client here) is attached to it with
// session/attach (docs/protocol.md, "Several clients on one session"; issue #22):
//
//   - turn 1: the demo agent asks for permission; the SDK client's handler
//     waits 3 s. Meanwhile the other client attaches (the history replays
//     the prompt, the request is re-issued to it) and answers "allow"
//     first. The SDK client
//     gets $/cancel_request for its copy (the SDK aborts the handler's
//     signal; the handler answers anyway, late, and the gateway must drop
//     that answer), and its turn ends normally: end_turn, "Permission
//     granted (allow).";
//   - turn 2: the attached client sees the prompt and the permission
//     request live and does not answer; the SDK client answers after its wait,
//     the attached client's copy is withdrawn with $/cancel_request and it
//     is told who answered;
//   - the SDK client receives only ACP v1: none of the updates only attached
//     clients get (prompt_received, permission_resolved, turn_complete,
//     client_connected, client_disconnected), nothing the SDK logs as an
//     error, no user_message_chunk (it is the only one that prompts).
//
// The SDK client connects over WebSocket and, with the SDK's Streamable-HTTP
// client, over HTTP; the attached client always over WebSocket.
func TestSDKOwnerWithAttachedClient(t *testing.T) {
	requireNode(t, "@agentclientprotocol/sdk/package.json", "@agentclientprotocol/sdk/dist/transports/http-stream.js", "ws/package.json")
	h := newHarness(t)
	home, work, state := h.mkdir("home"), h.mkdir("work"), h.mkdir("demo-state")
	agent := shellJoin(gatewayBin, "demo-agent", "--chunk-delay", "-1ms", "--state-dir", state)
	// The SDK's WebSocket client closes its socket with a close frame
	// without a status code (1005), which the gateway takes for a clean
	// close: the attached clients hear at once that it left. Its
	// Streamable-HTTP client may end without a DELETE: then the connection
	// is kept until detach_timeout, which a short one keeps short.
	cfg := allowAllPolicy + "sessions:\n  detach_timeout: " + detachTimeout.String() + "\n"
	g := h.startGatewayWith(t, cfg, agent, home, work)
	g.waitReady(t, readyLimit)

	for _, tr := range []struct{ name, url string }{
		{"ws", g.url()},
		{"http", "http://" + g.Addr + "/acp"},
	} {
		t.Run(tr.name, func(t *testing.T) { attachScenario(t, h, g, home, work, tr.name, tr.url) })
	}

	g.stop(t)
	for _, l := range g.logs.snapshot() {
		var rec struct{ Level string }
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Level == "ERROR" {
			t.Errorf("gateway logged an error: %s", l)
		}
	}
}

const (
	ownerName       = "acpgate-interop-sdk-owner" // sdk-owner.mjs's clientInfo.name
	peerClientID    = "interop-peer"              // asked for in session/attach; the gateway gives its own
	permissionDelay = 3 * time.Second             // the SDK client's permission handler waits this long
	attachStep      = 20 * time.Second
	detachTimeout   = 3 * time.Second
)

// attachOnlyKinds are the session/update kinds only clients that called
// session/attach may get.
var attachOnlyKinds = []string{"prompt_received", "permission_resolved", "turn_complete", "client_connected", "client_disconnected"}

func attachScenario(t *testing.T, h *harness, g *gateway, home, work, transport, url string) {
	peer := dialPeer(t, g)
	defer peer.close()
	init := peer.call("initialize", map[string]any{
		"protocolVersion": 1, "clientCapabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "interop-peer", "version": "1"},
	}, attachStep)
	var initRes struct {
		AgentCapabilities struct {
			SessionCapabilities map[string]json.RawMessage `json:"sessionCapabilities"`
		} `json:"agentCapabilities"`
	}
	peer.mustResult(init, &initRes)
	if _, ok := initRes.AgentCapabilities.SessionCapabilities["attach"]; !ok {
		t.Errorf("initialize result lacks agentCapabilities.sessionCapabilities.attach: %s", init.raw)
	}

	owner := h.startNode(t, home, work, "sdk-owner.mjs", "--timeout", msString(scriptTimeout), "--transport", transport,
		"--permission-delay", msString(permissionDelay), url, work, "permission please", "permission again")
	sid := owner.waitLine(t, "the SDK client's session/new", attachStep, func(l outLine) bool { return l.Type == "session/new" }).SessionID
	if sid == "" {
		t.Fatalf("sdk-owner.mjs printed no sessionId\n%s", owner.dump())
	}

	// Attach once the SDK client has the agent's permission request (its
	// handler now waits): the attached client gets it re-issued.
	ownerReq1 := owner.waitLine(t, "the SDK client's first permission request", attachStep, func(l outLine) bool {
		return l.Type == "request" && l.Method == "session/request_permission"
	})
	attachRes := peer.call("session/attach", map[string]any{
		"sessionId": sid, "historyPolicy": "full", "clientId": peerClientID,
		"clientInfo": map[string]any{"name": "interop-peer", "version": "1"},
	}, attachStep)
	var att struct {
		SessionID        string `json:"sessionId"`
		ClientID         string `json:"clientId"`
		ConnectedClients []struct {
			ClientID string `json:"clientId"`
			Name     string `json:"name"`
		} `json:"connectedClients"`
		Meta struct {
			Acpgate struct {
				Turn string `json:"turn"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	peer.mustResult(attachRes, &att)
	if att.SessionID != sid || att.ClientID == "" || att.ClientID == peerClientID || att.Meta.Acpgate.Turn != "running" {
		t.Errorf("attach result: sessionId %q clientId %q turn %q; want %q, one the gateway minted (not %q), running", att.SessionID, att.ClientID, att.Meta.Acpgate.Turn, sid, peerClientID)
	}
	var names []string
	ownerClientID := ""
	for _, c := range att.ConnectedClients {
		names = append(names, c.Name)
		if c.Name == ownerName {
			ownerClientID = c.ClientID
		}
	}
	if ownerClientID == "" || !slices.Contains(names, "interop-peer") {
		t.Errorf("attach result connectedClients %s: want the SDK client (%s) and this one", attachRes.raw, ownerName)
	}
	t.Logf("attached to %s: %s", sid, truncate(string(attachRes.raw), 600))
	// The history replayed before the result: the prompt, as ACP v1 has it.
	if _, m := peer.waitMsg(0, "the replayed prompt", 0, isUpdate("user_message_chunk")); m.index > attachRes.index ||
		!strings.Contains(string(m.Params), `"text":"permission please"`) {
		t.Errorf("the replay's first user_message_chunk %s comes after the attach result or is not the prompt", m.raw)
	}

	// Turn 1: the attached client answers first.
	isPermission := func(m peerMsg) bool { return m.Method == "session/request_permission" && m.ID != nil }
	_, perm1 := peer.waitMsg(attachRes.index+1, "the first permission request, re-issued", attachStep, isPermission)
	peer.checkSession(perm1, sid)
	peer.answerPermission(perm1, "allow_once")
	i, resolved1 := peer.waitMsg(perm1.index+1, "permission_resolved for turn 1", attachStep, isUpdate("permission_resolved"))
	checkResolved(t, resolved1, "allow", att.ClientID)
	_, done1 := peer.waitMsg(i+1, "turn_complete for turn 1", attachStep, isUpdate("turn_complete"))
	checkStop(t, done1)
	turn1 := owner.waitLine(t, "the SDK client's first turn", attachStep, func(l outLine) bool { return l.Type == "session/prompt" })
	checkTurn(t, turn1, "permission please")

	// Turn 2: the SDK client prompts again and answers its own request; the
	// attached client sees it all and its copy is withdrawn.
	i, prompt2 := peer.waitMsg(done1.index+1, "prompt_received for turn 2", attachStep, isUpdate("prompt_received"))
	var pr struct {
		Update struct {
			Prompt []struct{ Type, Text string } `json:"prompt"`
			SentBy struct {
				ClientID string `json:"clientId"`
				Name     string `json:"name"`
			} `json:"sentBy"`
		} `json:"update"`
	}
	peer.decode(prompt2.Params, &pr)
	if len(pr.Update.Prompt) != 1 || pr.Update.Prompt[0].Text != "permission again" || pr.Update.SentBy.Name != ownerName {
		t.Errorf("prompt_received for turn 2: %s; want the prompt \"permission again\" sent by %s", prompt2.raw, ownerName)
	}
	_, perm2 := peer.waitMsg(i+1, "the second permission request", attachStep, isPermission)
	peer.checkSession(perm2, sid)
	_, withdrawn := peer.waitMsg(perm2.index+1, "$/cancel_request for the second permission request", attachStep+permissionDelay, func(m peerMsg) bool {
		return m.Method == "$/cancel_request" && m.ID == nil && cancelledID(m.Params) == string(perm2.ID)
	})
	i, resolved2 := peer.waitMsg(perm2.index+1, "permission_resolved for turn 2", attachStep, isUpdate("permission_resolved"))
	checkResolved(t, resolved2, "allow", ownerClientID)
	if resolved2.index < withdrawn.index {
		t.Logf("note: permission_resolved came before $/cancel_request for turn 2")
	}
	_, done2 := peer.waitMsg(i+1, "turn_complete for turn 2", attachStep, isUpdate("turn_complete"))
	checkStop(t, done2)

	// The SDK client finishes (its late answer to turn 1 went out during
	// turn 2) and leaves; the session lives on for the attached client.
	exitErr := owner.wait(t, runLimit)
	t.Logf("sdk-owner.mjs (%s): exit %v, %d lines", transport, errOrZero(exitErr), len(owner.snapshot()))
	if exitErr != nil {
		t.Errorf("sdk-owner.mjs failed: %v\n%s", exitErr, owner.dump())
	}
	exited := time.Now()
	_, left := peer.waitMsg(done2.index+1, "client_disconnected for the SDK client", attachStep+detachTimeout, isUpdate("client_disconnected"))
	if !strings.Contains(string(left.Params), ownerName) {
		t.Errorf("client_disconnected names someone else: %s", left.raw)
	}
	took := time.Since(exited)
	t.Logf("client_disconnected for the SDK client %v after it exited (detach_timeout %v)", took.Round(time.Millisecond), detachTimeout)
	if transport == "ws" && took >= detachTimeout {
		t.Errorf("client_disconnected came %v after the SDK client's WebSocket closed: its close (1005) was taken for a drop", took)
	}
	det := peer.call("session/detach", map[string]any{"sessionId": sid}, attachStep)
	var detRes struct{ SessionID, Status string }
	peer.mustResult(det, &detRes)
	if detRes.SessionID != sid || detRes.Status != "detached" {
		t.Errorf("session/detach: %s", det.raw)
	}

	// The attached client was asked exactly twice.
	if n := peer.count(isPermission); n != 2 {
		t.Errorf("the attached client got %d permission requests, want 2\n%s", n, peer.dump())
	}

	checkOwner(t, owner, sid, ownerReq1)
	if t.Failed() {
		t.Logf("attached client's messages:\n%s", peer.dump())
	}
}

// checkOwner checks everything the SDK client printed.
func checkOwner(t *testing.T, owner *liveNode, sid string, req1 outLine) {
	t.Helper()
	lines := owner.snapshot()
	var (
		kinds    []string
		cancels  []outLine
		requests []outLine
		answers  []outLine
		turns    []outLine
	)
	for _, l := range lines {
		switch l.Type {
		case "error", "console":
			t.Errorf("sdk-owner.mjs: %s", l.raw)
		case "session/update":
			var p struct {
				SessionID string `json:"sessionId"`
			}
			mustUnmarshal(t, l.Params, &p)
			kind, _ := rpcMsg{Params: l.Params}.update()
			kinds = append(kinds, kind)
			if p.SessionID != sid {
				t.Errorf("the SDK client got an update for session %q, want %q: %s", p.SessionID, sid, l.raw)
			}
			if slices.Contains(attachOnlyKinds, kind) {
				t.Errorf("the SDK client (not attached) got the attach-only update %q: %s", kind, l.raw)
			}
			if kind == "user_message_chunk" {
				t.Errorf("the SDK client got its own prompt back as user_message_chunk: %s", l.raw)
			}
		case "notification":
			if l.Method != "$/cancel_request" {
				t.Errorf("the SDK client got an unexpected notification: %s", l.raw)
				continue
			}
			cancels = append(cancels, l)
		case "request":
			requests = append(requests, l)
		case "answer":
			answers = append(answers, l)
		case "session/prompt":
			turns = append(turns, l)
		}
	}
	var seq []string
	for _, l := range lines {
		switch l.Type {
		case "session/update", "console", "done":
		case "notification", "request", "answer":
			seq = append(seq, l.Type+" "+l.Method)
		default:
			seq = append(seq, l.Type)
		}
	}
	t.Logf("the SDK client's session/update kinds: %v", kinds)
	t.Logf("the SDK client's other lines: %v", seq)
	if owner.stderr() != "" {
		t.Errorf("sdk-owner.mjs wrote to stderr:\n%s", truncate(owner.stderr(), 4000))
	}
	if len(turns) != 2 {
		t.Errorf("the SDK client ended %d turns, want 2\n%s", len(turns), owner.dump())
	} else {
		checkTurn(t, turns[1], "permission again")
	}
	if len(requests) != 2 || requests[0].Method != "session/request_permission" || requests[1].Method != "session/request_permission" {
		t.Fatalf("the SDK client got %d requests, want 2 permission requests\n%s", len(requests), owner.dump())
	}
	id1 := lineField(t, req1, "requestId")
	id2 := lineField(t, requests[1], "requestId")

	// Its first copy was withdrawn, exactly once; its second was not.
	if len(cancels) != 1 || cancelledID(cancels[0].Params) != id1 {
		t.Errorf("the SDK client got $/cancel_request %d times, want once for its first permission request (id %s)\n%s", len(cancels), id1, owner.dump())
	}
	// The SDK applied it: the handler's signal was aborted (RequestCancelled).
	if len(answers) != 2 {
		t.Fatalf("the SDK client's handlers answered %d times, want 2\n%s", len(answers), owner.dump())
	}
	var a1, a2 struct {
		RequestID   json.RawMessage `json:"requestId"`
		Aborted     bool            `json:"aborted"`
		AbortReason struct {
			Code int `json:"code"`
		} `json:"abortReason"`
	}
	mustUnmarshal(t, []byte(answers[0].raw), &a1)
	mustUnmarshal(t, []byte(answers[1].raw), &a2)
	if string(a1.RequestID) != id1 || !a1.Aborted || a1.AbortReason.Code != -32800 {
		t.Errorf("the SDK client's first permission handler: %s; want id %s aborted with -32800 (request cancelled)", answers[0].raw, id1)
	}
	if string(a2.RequestID) != id2 || a2.Aborted {
		t.Errorf("the SDK client's second permission handler: %s; want id %s, not aborted", answers[1].raw, id2)
	}
	if i := slices.IndexFunc(lines, func(l outLine) bool { return l.Type == "done" }); i < 0 {
		t.Errorf("sdk-owner.mjs did not finish\n%s", owner.dump())
	}
}

func checkTurn(t *testing.T, l outLine, prompt string) {
	t.Helper()
	var p struct {
		Prompt string `json:"prompt"`
		Text   string `json:"text"`
		Result struct {
			StopReason string `json:"stopReason"`
		} `json:"result"`
	}
	mustUnmarshal(t, []byte(l.raw), &p)
	if p.Prompt != prompt || p.Result.StopReason != "end_turn" || p.Text != "Permission granted (allow)." {
		t.Errorf("the SDK client's turn %q: %s; want end_turn and \"Permission granted (allow).\"", prompt, l.raw)
	}
}

func checkResolved(t *testing.T, m peerMsg, optionID, by string) {
	t.Helper()
	var p struct {
		Update struct {
			ToolCallID string `json:"toolCallId"`
			Outcome    struct {
				Outcome  string `json:"outcome"`
				OptionID string `json:"optionId"`
			} `json:"outcome"`
			ResolvedBy struct {
				ClientID string `json:"clientId"`
			} `json:"resolvedBy"`
		} `json:"update"`
	}
	if err := json.Unmarshal(m.Params, &p); err != nil {
		t.Fatalf("permission_resolved: %v: %s", err, m.raw)
	}
	u := p.Update
	if u.ToolCallID == "" || u.Outcome.Outcome != "selected" || u.Outcome.OptionID != optionID || u.ResolvedBy.ClientID != by {
		t.Errorf("permission_resolved %s; want a toolCallId, outcome selected %q, resolvedBy %q", m.raw, optionID, by)
	}
}

func checkStop(t *testing.T, m peerMsg) {
	t.Helper()
	if !strings.Contains(string(m.Params), `"stopReason":"end_turn"`) {
		t.Errorf("turn_complete %s; want stopReason end_turn", m.raw)
	}
}

func isUpdate(kind string) func(peerMsg) bool {
	return func(m peerMsg) bool {
		if m.Method != "session/update" {
			return false
		}
		var p struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
			} `json:"update"`
		}
		return json.Unmarshal(m.Params, &p) == nil && p.Update.SessionUpdate == kind
	}
}

// dropAttachCapability removes agentCapabilities.sessionCapabilities.attach,
// which the gateway adds to the agent's initialize result, and says whether
// it was there as {}.
func dropAttachCapability(result map[string]any) bool {
	caps, _ := result["agentCapabilities"].(map[string]any)
	sc, _ := caps["sessionCapabilities"].(map[string]any)
	a, ok := sc["attach"].(map[string]any)
	if !ok || len(a) != 0 {
		return false
	}
	delete(sc, "attach")
	if len(sc) == 0 {
		delete(caps, "sessionCapabilities")
	}
	return true
}

// cancelledID is the requestId of $/cancel_request params, as JSON text.
func cancelledID(params json.RawMessage) string {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return ""
	}
	return string(p.RequestID)
}

// lineField is one field of a script's output line, as JSON text.
func lineField(t *testing.T, l outLine, key string) string {
	t.Helper()
	var m map[string]json.RawMessage
	mustUnmarshal(t, []byte(l.raw), &m)
	if len(m[key]) == 0 {
		t.Fatalf("no %q in %s", key, l.raw)
	}
	return string(m[key])
}

// ---------------------------------------------------------------------------
// A Node script whose output is read while it runs

type liveNode struct {
	script string
	cmd    *exec.Cmd
	errBuf bytes.Buffer // written by exec's copier until done

	mu      sync.Mutex
	lines   []outLine
	changed chan struct{} // closed when a line arrives or the script ends
	done    chan struct{}
	err     error
}

// startNode starts `node <script> args...` in its own process group; its
// stdout lines are collected as they come. The cleanup kills what is left.
func (h *harness) startNode(t *testing.T, home, dir, script string, args ...string) *liveNode {
	t.Helper()
	n := &liveNode{script: script, changed: make(chan struct{}), done: make(chan struct{})}
	n.cmd = exec.Command(nodeBin, append([]string{filepath.Join(interopDir, script)}, args...)...)
	n.cmd.Dir = dir
	n.cmd.Env = h.environ(home)
	n.cmd.Stderr = &n.errBuf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.cmd.WaitDelay = 5 * time.Second
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	go func() {
		eachOutLine(stdout, func(l outLine, err error) {
			if err != nil {
				l = outLine{Type: "not-json", raw: l.raw}
			}
			n.mu.Lock()
			n.lines = append(n.lines, l)
			close(n.changed)
			n.changed = make(chan struct{})
			n.mu.Unlock()
		})
		err := n.cmd.Wait()
		n.mu.Lock()
		n.err = err
		close(n.done)
		close(n.changed)
		n.changed = make(chan struct{})
		n.mu.Unlock()
	}()
	t.Cleanup(func() {
		select {
		case <-n.done:
		default:
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL) // anything left in the group
	})
	return n
}

func (n *liveNode) snapshot() []outLine {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.lines)
}

// stderr is what the script wrote to stderr; complete once it has ended.
func (n *liveNode) stderr() string {
	select {
	case <-n.done:
		return n.errBuf.String()
	default:
		return ""
	}
}

// waitLine returns the first line matching pred, waiting at most d.
func (n *liveNode) waitLine(t *testing.T, what string, d time.Duration, pred func(outLine) bool) outLine {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		n.mu.Lock()
		i := slices.IndexFunc(n.lines, pred)
		var l outLine
		if i >= 0 {
			l = n.lines[i]
		}
		changed, done := n.changed, n.done
		n.mu.Unlock()
		if i >= 0 {
			return l
		}
		select {
		case <-done:
			t.Fatalf("%s: %s ended (%v) without printing it\n%s", what, n.script, errOrZero(n.err), n.dump())
		default:
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("%s: not printed by %s within %v\n%s", what, n.script, d, n.dump())
		}
	}
}

// wait waits for the script to end, at most d (then its group is killed).
func (n *liveNode) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-n.done:
	case <-time.After(d):
		t.Errorf("%s: still running after %v; killed", n.script, d)
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

func (n *liveNode) dump() string {
	var b strings.Builder
	for _, l := range n.snapshot() {
		b.WriteString(truncate(l.raw, 2000))
		b.WriteByte('\n')
	}
	if s := n.stderr(); s != "" {
		b.WriteString("stderr:\n")
		b.WriteString(truncate(s, 8000))
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// A raw WebSocket client

type peerMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	raw    []byte
	index  int // its place among the messages received
}

type peer struct {
	t      *testing.T
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	nextID int

	mu      sync.Mutex
	msgs    []peerMsg
	changed chan struct{}
	readErr error
	stopped chan struct{}
}

func dialPeer(t *testing.T, g *gateway) *peer {
	t.Helper()
	return dialWith(t, g, "acp")
}

// dialWith is dialPeer offering the WebSocket subprotocols protos (a
// tenant's token rides in acp.bearer.<token>).
func dialWith(t *testing.T, g *gateway, protos ...string) *peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, attachStep)
	defer dcancel()
	ws, _, err := websocket.Dial(dctx, g.url(), &websocket.DialOptions{Subprotocols: protos})
	if err != nil {
		cancel()
		t.Fatalf("dial %s: %v", g.url(), err)
	}
	ws.SetReadLimit(64 << 20)
	p := &peer{t: t, ws: ws, ctx: ctx, cancel: cancel, nextID: 1, changed: make(chan struct{}), stopped: make(chan struct{})}
	go p.read()
	return p
}

func (p *peer) read() {
	defer close(p.stopped)
	for {
		_, data, err := p.ws.Read(p.ctx)
		p.mu.Lock()
		if err != nil {
			p.readErr = err
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
			return
		}
		var m peerMsg
		if json.Unmarshal(data, &m) != nil {
			m = peerMsg{Method: "<not JSON>"}
		}
		m.raw, m.index = data, len(p.msgs)
		p.msgs = append(p.msgs, m)
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
}

func (p *peer) close() {
	_ = p.ws.Close(websocket.StatusNormalClosure, "")
	p.cancel()
	<-p.stopped
}

func (p *peer) send(v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(p.ctx, attachStep)
	defer cancel()
	if err := p.ws.Write(ctx, websocket.MessageText, b); err != nil {
		p.t.Fatalf("write %s: %v", truncate(string(b), 300), err)
	}
}

// call sends a request and waits for its response.
func (p *peer) call(method string, params any, d time.Duration) peerMsg {
	p.t.Helper()
	id := p.nextID
	p.nextID++
	p.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	want := fmt.Sprint(id)
	_, m := p.waitMsg(0, "the response to "+method, d, func(m peerMsg) bool { return m.Method == "" && string(m.ID) == want })
	return m
}

func (p *peer) mustResult(m peerMsg, v any) {
	p.t.Helper()
	if len(m.Error) > 0 || len(m.Result) == 0 {
		p.t.Fatalf("want a result: %s", m.raw)
	}
	p.decode(m.Result, v)
}

func (p *peer) decode(data json.RawMessage, v any) {
	p.t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		p.t.Fatalf("decode %s: %v", truncate(string(data), 500), err)
	}
}

// waitMsg returns the first message from index `from` on that matches pred,
// waiting at most d.
func (p *peer) waitMsg(from int, what string, d time.Duration, pred func(peerMsg) bool) (int, peerMsg) {
	p.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		for i := from; i < len(p.msgs); i++ {
			if pred(p.msgs[i]) {
				m := p.msgs[i]
				p.mu.Unlock()
				return i, m
			}
		}
		changed, rerr := p.changed, p.readErr
		p.mu.Unlock()
		if rerr != nil {
			p.t.Fatalf("attached client: waiting for %s: connection ended: %v\n%s", what, rerr, p.dump())
		}
		select {
		case <-changed:
		case <-timer.C:
			p.t.Fatalf("attached client: no %s within %v\n%s", what, d, p.dump())
		}
	}
}

func (p *peer) count(pred func(peerMsg) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.msgs {
		if pred(m) {
			n++
		}
	}
	return n
}

func (p *peer) checkSession(m peerMsg, sid string) {
	p.t.Helper()
	var params struct{ SessionID string }
	p.decode(m.Params, &params)
	if params.SessionID != sid {
		p.t.Errorf("%s for session %q, want %q", m.Method, params.SessionID, sid)
	}
}

// answerPermission selects the request's option of the given kind.
func (p *peer) answerPermission(m peerMsg, kind string) {
	p.t.Helper()
	var params struct {
		Options []struct{ OptionID, Kind string } `json:"options"`
	}
	p.decode(m.Params, &params)
	i := slices.IndexFunc(params.Options, func(o struct{ OptionID, Kind string }) bool { return o.Kind == kind })
	if i < 0 {
		p.t.Fatalf("no %s option in %s", kind, m.raw)
	}
	p.send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{
		"outcome": map[string]any{"outcome": "selected", "optionId": params.Options[i].OptionID}}})
}

func (p *peer) dump() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, m := range p.msgs {
		b.WriteString(truncate(string(m.raw), 1500))
		b.WriteByte('\n')
	}
	return b.String()
}
