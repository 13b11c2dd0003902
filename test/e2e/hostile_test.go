package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// The hostile suite throws malformed, oversized, out-of-order and abusive
// input at the gateway from every side: the WebSocket transport, JSON-RPC
// framing, ACP semantics, authentication, tenancy, paths, timeouts and
// limits, and a misbehaving agent (test/fakeagent). Every case asserts the
// exact error or close code, and then that bystanders were unaffected: each
// gateway keeps one or more bystander clients connected through the whole
// run, on the same agent process where the pool has one (max_processes: 1),
// and each of them completes an echo round trip and a prompt after every
// case and must have received nothing in between.

// hostilePolicy lets clients call the echo and fault extension methods
// (the gateway's policy refuses "_" methods unless listed).
const hostilePolicy = "policy: {extensions: {allow: [\"_demo/*\", \"_fake/*\"]}}\n"

// --- the fake agent ---

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

// fakeAgentBin builds test/fakeagent once, in the run's build directory
// (which TestMain removes at the end), never next to a prebuilt gateway
// (ACPGATE_E2E_BIN), whose directory may be shared.
func fakeAgentBin(t *testing.T) string {
	t.Helper()
	fakeOnce.Do(func() {
		fakePath = filepath.Join(buildDir, "fakeagent")
		fakeErr = harness.BuildFakeAgent(fakePath)
	})
	if fakeErr != nil {
		t.Fatal(fakeErr)
	}
	return fakePath
}

// fakeAgentConfig is the agent section of a gateway running the fake agent.
func fakeAgentConfig(t *testing.T, mode string) string {
	return fmt.Sprintf("agent: {command: [%q], env: {FAKE_MODE: %q}, stop_grace: 1s}\n", fakeAgentBin(t), mode)
}

// agentProcs lists the agent processes (not their supervisors) below the
// gateway whose command line contains substr.
func (g *gateway) agentProcs(substr string) []int {
	var pids []int
	for pid, cmd := range proctree.Descendants(g.Cmd.Process.Pid) {
		if strings.Contains(cmd, substr) && !strings.Contains(cmd, "supervise") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// --- bystanders ---

// bystander is a client that must not notice anything a hostile case does.
type bystander struct {
	name string
	c    *client
	sid  string
	n    int
}

func newBystander(t *testing.T, name string, c *client, cwd string) *bystander {
	t.Helper()
	b := &bystander{name: name, c: c, sid: c.newSession(cwd)}
	b.check(t)
	return b
}

// check asserts that nothing reached the bystander since its last check and
// that it still completes an echo round trip and a prompt turn.
func (b *bystander) check(t *testing.T) {
	t.Helper()
	b.c.T = t // the client reports to the running (sub)test
	select {
	case m, ok := <-b.c.In:
		if !ok {
			t.Fatalf("bystander %s: connection closed: %v", b.name, b.c.Err())
		}
		t.Errorf("bystander %s received a message nobody asked for: %.300s", b.name, m.Raw)
	default:
	}
	b.n++
	nonce := fmt.Sprintf("%s-%d-%d", b.name, b.n, time.Now().UnixNano())
	m := b.c.Call("_demo/echo", map[string]any{"nonce": nonce}, turn)
	var res struct {
		Nonce string `json:"nonce"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Nonce != nonce {
		t.Fatalf("bystander %s: echo round trip: %s", b.name, m.Raw)
	}
	text := fmt.Sprintf("%s is still here (%d)", b.name, b.n)
	onUpdate, got := collectText(t, b.sid)
	m = b.c.Await(b.c.Request("session/prompt", textPrompt(b.sid, text)), turn, onUpdate)
	if r := stopReason(t, m); r != "end_turn" {
		t.Fatalf("bystander %s: stopReason %q", b.name, r)
	}
	if got.String() != "You said: "+text {
		t.Fatalf("bystander %s: streamed %q, want %q", b.name, got.String(), "You said: "+text)
	}
}

// hostile runs one named case, then checks every bystander.
func hostile(t *testing.T, name string, bys []*bystander, f func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		f(t)
		for _, b := range bys {
			b.check(t)
		}
	})
}

// --- assertions ---

// wantError asserts that m is an error response with code and raw id, whose
// message contains substr.
func wantError(t *testing.T, m rpcMsg, code int, id, substr string) {
	t.Helper()
	if m.Method != "" || m.Error == nil || m.Error.Code != code || string(m.ID) != id || !strings.Contains(m.Error.Message, substr) {
		t.Fatalf("got %.500s\nwant error %d with id %s and a message containing %q", m.Raw, code, id, substr)
	}
}

// echoOK asserts the connection still works: an echo round trip, with
// nothing else arriving first.
func echoOK(t *testing.T, c *client) {
	t.Helper()
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	m := c.Call("_demo/echo", map[string]any{"still": nonce}, turn)
	var res struct {
		Still string `json:"still"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Still != nonce {
		t.Fatalf("the connection no longer works after the case: %s", m.Raw)
	}
}

// quiet asserts that c receives nothing within d.
func quiet(t *testing.T, c *client, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-c.In:
		if !ok {
			t.Fatalf("connection closed: %v", c.Err())
		}
		t.Fatalf("unexpected message: %.300s", m.Raw)
	case <-time.After(d):
	}
}

// closedWith waits until the gateway closes c and returns the close status
// and the messages that arrived before.
func closedWith(t *testing.T, c *client, timeout time.Duration) (websocket.StatusCode, []rpcMsg) {
	t.Helper()
	var msgs []rpcMsg
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-c.In:
			if !ok {
				return websocket.CloseStatus(c.Err()), msgs
			}
			msgs = append(msgs, m)
		case <-deadline:
			t.Fatalf("the gateway did not close the connection within %s", timeout)
		}
	}
}

// waitMoreLogs waits until more than before records with msg exist.
func (g *gateway) waitMoreLogs(t *testing.T, msg string, before int, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if n := g.CountLogs(msg, "", ""); n > before {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new log record %q within %s", msg, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func nested(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

// ---------------------------------------------------------------------------
// Transport, JSON-RPC and ACP against the demo agent: one agent process for
// everybody.

// hostileFrames are single text frames sent by an initialized client that
// holds the session {SID}. {VICTIM} is the agent-side session ID of another
// connection's session. Each must be answered with exactly one error and
// leave the connection working.
var hostileFrames = []struct {
	name, frame string
	code        int
	id          string // the raw id of the answer
	msg         string // a substring of the error message
}{
	{"transport/text frame that is not UTF-8", "\xff\xfe\xfd", -32700, "null", "parse error"},
	{"transport/invalid UTF-8 inside a JSON string", "{\"jsonrpc\":\"2.0\",\"id\":101,\"method\":\"_demo/echo\",\"params\":{\"k\":\"\xc3\x28\"}}", -32700, "null", "parse error"},
	{"transport/empty frame", "", -32700, "null", "empty message"},
	{"transport/whitespace-only frame", " \t\r\n  ", -32700, "null", "empty message"},
	{"json-rpc/null", "null", -32600, "null", "must be a JSON object"},
	{"json-rpc/number", "42", -32600, "null", "must be a JSON object"},
	{"json-rpc/string", `"initialize"`, -32600, "null", "must be a JSON object"},
	{"json-rpc/boolean", "true", -32600, "null", "must be a JSON object"},
	{"json-rpc/batch array", `[{"jsonrpc":"2.0","id":102,"method":"_demo/echo","params":{}}]`, -32600, "null", "batch"},
	{"json-rpc/empty array", `[]`, -32600, "null", "batch"},
	{"json-rpc/10,000-level nesting inside params", `{"jsonrpc":"2.0","id":103,"method":"_demo/echo","params":{"deep":` + nested(10_000) + `}}`, -32700, "null", "max depth"},
	{"json-rpc/duplicate id", `{"jsonrpc":"2.0","id":104,"id":105,"method":"_demo/echo","params":{}}`, -32700, "null", "duplicate"},
	{"json-rpc/duplicate method", `{"jsonrpc":"2.0","id":106,"method":"_demo/echo","method":"session/new","params":{}}`, -32700, "null", "duplicate"},
	{"json-rpc/duplicate sessionId inside params", `{"jsonrpc":"2.0","id":107,"method":"session/prompt","params":{"sessionId":"{SID}","sessionId":"{VICTIM}","prompt":[]}}`, -32700, "null", "duplicate"},
	{"json-rpc/duplicate sessionId, one spelled with an escape", `{"jsonrpc":"2.0","id":108,"method":"session/prompt","params":{"sessionId":"{SID}","\u0073essionId":"{VICTIM}","prompt":[]}}`, -32700, "null", "duplicate"},
	{"json-rpc/escaped sessionId member name is read as sessionId", `{"jsonrpc":"2.0","id":109,"method":"session/prompt","\u0070arams":{"\u0073essionId":"{VICTIM}","prompt":[]}}`, -32002, "109", "session not found"},
	{"json-rpc/id of 300 bytes", `{"jsonrpc":"2.0","id":"` + strings.Repeat("i", 298) + `","method":"_demo/echo","params":{}}`, -32600, "null", "ids are limited to 256 bytes"},
	{"json-rpc/id of 257 bytes", `{"jsonrpc":"2.0","id":"` + strings.Repeat("i", 255) + `","method":"_demo/echo","params":{}}`, -32600, "null", "ids are limited to 256 bytes"},
	{"json-rpc/method name of 300 bytes", `{"jsonrpc":"2.0","id":110,"method":"_` + strings.Repeat("m", 299) + `","params":{}}`, -32600, "null", "method names to 256"},
	{"json-rpc/id as object", `{"jsonrpc":"2.0","id":{"n":1},"method":"_demo/echo","params":{}}`, -32600, "null", `"id" must be`},
	{"json-rpc/id as array", `{"jsonrpc":"2.0","id":[1],"method":"_demo/echo","params":{}}`, -32600, "null", `"id" must be`},
	{"json-rpc/id as boolean", `{"jsonrpc":"2.0","id":true,"method":"_demo/echo","params":{}}`, -32600, "null", `"id" must be`},
	{"json-rpc/jsonrpc 1.0", `{"jsonrpc":"1.0","id":111,"method":"_demo/echo","params":{}}`, -32600, "111", `"jsonrpc" must be "2.0"`},
	{"json-rpc/jsonrpc as a number", `{"jsonrpc":2.0,"id":112,"method":"_demo/echo","params":{}}`, -32600, "112", `"jsonrpc" must be "2.0"`},
	{"json-rpc/missing jsonrpc", `{"id":113,"method":"_demo/echo","params":{}}`, -32600, "113", `missing "jsonrpc"`},
	{"json-rpc/both result and error", `{"jsonrpc":"2.0","id":114,"result":{},"error":{"code":1,"message":"x"}}`, -32600, "114", "one of params, result or error"},
	{"json-rpc/params as a string", `{"jsonrpc":"2.0","id":115,"method":"_demo/echo","params":"hello"}`, -32600, "115", `"params" must be an object or an array`},
	{"json-rpc/params as a number", `{"jsonrpc":"2.0","id":116,"method":"session/prompt","params":7}`, -32600, "116", `"params" must be an object or an array`},
	{"acp/session/prompt with prompt not an array", `{"jsonrpc":"2.0","id":117,"method":"session/prompt","params":{"sessionId":"{SID}","prompt":"hello"}}`, -32602, "117", "prompt"},
	{"acp/unknown session", `{"jsonrpc":"2.0","id":118,"method":"session/prompt","params":{"sessionId":"no-such-session","prompt":[]}}`, -32002, "118", "session not found"},
	{"acp/sessionId of 5,000 characters", `{"jsonrpc":"2.0","id":119,"method":"session/prompt","params":{"sessionId":"` + strings.Repeat("s", 5000) + `","prompt":[]}}`, -32002, "119", "session not found"},
	{"acp/another connection's agent-side session ID", `{"jsonrpc":"2.0","id":120,"method":"session/prompt","params":{"sessionId":"{VICTIM}","prompt":[{"type":"text","text":"hijack"}]}}`, -32002, "120", "session not found"},
	{"acp/$/cancel_request as a request without requestId", `{"jsonrpc":"2.0","id":121,"method":"$/cancel_request","params":{}}`, -32602, "121", "requestId"},
}

func TestHostileDemoAgent(t *testing.T) {
	const limit = 65536
	g := startGateway(t, gwOpts{config: fmt.Sprintf(`pool: {min_idle: 1, max_processes: 1, max_sessions_per_process: 512}
limits: {max_message_bytes: %d, send_queue_messages: 64, send_queue_bytes: 262144, messages_per_second: 0}
websocket: {write_timeout: 20s}
`, limit) + hostilePolicy})
	cwd := t.TempDir()
	by := newBystander(t, "bystander", dialInit(t, g), cwd)
	bys := []*bystander{by}
	agents := g.agentPIDs()
	if len(agents) != 1 {
		t.Fatalf("want one agent process, have %v", agents)
	}
	// victim is another connection with a session on the same process; its
	// agent-side ID is what a hijacker would need.
	victim := dialInit(t, g)
	_, victimAgentSID, _ := newSessionAgentID(t, g, victim, cwd)

	// hostileClient is a fresh initialized client with its own session.
	hostileClient := func(t *testing.T) (*client, string) {
		t.Helper()
		return dialSession(t, g, cwd)
	}

	for _, fc := range hostileFrames {
		hostile(t, fc.name, bys, func(t *testing.T) {
			c, sid := hostileClient(t)
			frame := strings.NewReplacer("{SID}", sid, "{VICTIM}", victimAgentSID).Replace(fc.frame)
			c.SendRaw(frame)
			wantError(t, c.Next(turn), fc.code, fc.id, fc.msg)
			echoOK(t, c) // exactly one answer, and the connection lives on
			quiet(t, victim, 0)
		})
	}

	hostile(t, "transport/binary frame with invalid UTF-8", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		if err := c.WS.Write(c.Ctx(), websocket.MessageBinary, []byte("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"_demo/echo\",\"params\":\"\xff\"}\n")); err != nil {
			t.Fatal(err)
		}
		wantError(t, c.Next(turn), -32700, "null", "invalid UTF-8")
		echoOK(t, c)
	})

	hostile(t, "transport/a frame of many newline-delimited messages, some bad", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		frame := `{"jsonrpc":"2.0","id":"a","method":"_demo/echo","params":{"n":1}}` + "\n" +
			`{"jsonrpc":"2.0","id":"a","method":"_demo/echo","params":{"n":2}}` + "\n" + // a duplicate id, still in flight or not
			"not json\n" +
			`{"jsonrpc":"2.0","id":"b","method":"_demo/echo","params":{"n":3}}` + "\n"
		if err := c.WS.Write(c.Ctx(), websocket.MessageBinary, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		var parse, ok int
		for range 4 {
			m := c.Next(turn)
			switch {
			case m.Error != nil && m.Error.Code == -32700:
				parse++
			case m.Error == nil && (string(m.ID) == `"a"` || string(m.ID) == `"b"`):
				ok++
			case m.Error != nil && string(m.ID) == `"a"`: // the duplicate, refused while the first is in flight
				ok++
			default:
				t.Errorf("unexpected answer %s", m.Raw)
			}
		}
		if parse != 1 || ok != 3 {
			t.Errorf("%d parse errors and %d answers, want 1 and 3: every message answered as if it had come alone", parse, ok)
		}
		echoOK(t, c)
	})

	hostile(t, "json-rpc/1,000-level nesting inside an extension method's params is relayed intact", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		params := `{"deep":` + nested(1000) + `}`
		c.SendRaw(`{"jsonrpc":"2.0","id":"deep","method":"_demo/echo","params":` + params + `}`)
		m := c.Next(turn)
		if string(m.ID) != `"deep"` || m.Error != nil || string(m.Result) != params {
			t.Fatalf("echo of 1,000 nested arrays: %.300s", m.Raw)
		}
		echoOK(t, c)
	})

	hostile(t, "json-rpc/escaped member names \\u0069d and \\u0070arams are id and params", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		c.SendRaw(`{"jsonrpc":"2.0","\u0069d":"esc","\u006dethod":"_demo/echo","\u0070arams":{"k":"v"}}`)
		m := c.Next(turn)
		if string(m.ID) != `"esc"` || m.Error != nil || string(m.Result) != `{"k":"v"}` {
			t.Fatalf("got %s, want the echo of {\"k\":\"v\"} for id \"esc\"", m.Raw)
		}
		echoOK(t, c)
	})

	hostile(t, "json-rpc/id of exactly 256 bytes is accepted", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		id := `"` + strings.Repeat("i", 254) + `"`
		c.SendRaw(`{"jsonrpc":"2.0","id":` + id + `,"method":"_demo/echo","params":{"ok":1}}`)
		m := c.Next(turn)
		if string(m.ID) != id || m.Error != nil || string(m.Result) != `{"ok":1}` {
			t.Fatalf("got %.400s", m.Raw)
		}
	})

	hostile(t, "json-rpc/duplicate in-flight request id", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		c.SendRaw(`{"jsonrpc":"2.0","id":"dup","method":"session/prompt","params":` + mustJSON(t, textPrompt(sid, "slow please")) + `}`)
		if m := c.Next(turn); m.Method != "session/update" {
			t.Fatalf("want the prompt running, got %s", m.Raw)
		}
		c.SendRaw(`{"jsonrpc":"2.0","id":"dup","method":"_demo/echo","params":{}}`)
		var got *rpcMsg
		for got == nil {
			if m := c.Next(turn); m.Method == "" {
				got = &m
			}
		}
		wantError(t, *got, -32600, `"dup"`, "already in flight")
		c.Notify("session/cancel", map[string]string{"sessionId": sid})
		for {
			m := c.Next(turn)
			if string(m.ID) == `"dup"` {
				if r := stopReason(t, m); r != "cancelled" {
					t.Fatalf("the original prompt: stopReason %q", r)
				}
				break
			}
		}
		echoOK(t, c)
	})

	hostile(t, "json-rpc/response to an id the gateway never sent is dropped", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		before := g.CountLogs("client answered a request id the gateway never sent; dropped", "", "")
		for _, id := range []string{`1`, `987654321`, `"never"`, `-5`, `null`} {
			c.SendRaw(`{"jsonrpc":"2.0","id":` + id + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
		}
		c.SendRaw(`{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"stray"}}`)
		g.waitMoreLogs(t, "client answered a request id the gateway never sent; dropped", before+5, 5*time.Second)
		echoOK(t, c) // nothing was answered, the connection lives
		quiet(t, victim, 0)
	})

	hostile(t, "json-rpc/response sent twice", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		before := g.CountLogs("client answered a request id the gateway never sent; dropped", "", "")
		answers := 0
		onUpdate, text := collectText(t, sid)
		m := c.Await(c.Request("session/prompt", textPrompt(sid, "ask my permission")), turn, func(m rpcMsg) {
			if m.Method == "session/request_permission" {
				answers++
				allow := map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}}
				c.Respond(m.ID, allow)
				c.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "reject"}})
				return
			}
			onUpdate(m)
		})
		if r := stopReason(t, m); r != "end_turn" || answers != 1 {
			t.Fatalf("stopReason %q after %d permission requests", r, answers)
		}
		if !strings.Contains(text.String(), "Permission granted (allow)") {
			t.Fatalf("the first answer must win: %q", text.String())
		}
		g.waitMoreLogs(t, "client answered a request id the gateway never sent; dropped", before, 5*time.Second)
		echoOK(t, c)
	})

	hostile(t, "acp/request before initialize", bys, func(t *testing.T) {
		c := dial(t, g)
		for i, method := range []string{"session/new", "_demo/echo", "session/prompt", "session/list"} {
			c.SendRaw(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{"cwd":%q,"mcpServers":[]}}`, 200+i, method, cwd))
			wantError(t, c.Next(turn), -32600, strconv.Itoa(200+i), "the first request must be initialize")
		}
		c.Notify("session/cancel", map[string]string{"sessionId": "x"}) // a notification gets no answer
		c.initialize()
		echoOK(t, c)
	})

	hostile(t, "acp/second initialize", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		c.SendRaw(`{"jsonrpc":"2.0","id":"again","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
		wantError(t, c.Next(turn), -32600, `"again"`, "already initialized")
		if got := promptOK(t, c, sid, "after a second initialize"); got != "You said: after a second initialize" {
			t.Fatalf("prompt after a second initialize: %q", got)
		}
	})

	hostile(t, "acp/initialize with protocolVersion as a string", bys, func(t *testing.T) {
		c := dial(t, g)
		c.SendRaw(`{"jsonrpc":"2.0","id":"v","method":"initialize","params":{"protocolVersion":"1","clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true}}}}`)
		wantError(t, c.Next(turn), -32602, `"v"`, "protocolVersion must be an integer")
		c.SendRaw(`{"jsonrpc":"2.0","id":"v2","method":"initialize","params":"1"}`)
		wantError(t, c.Next(turn), -32600, `"v2"`, `"params" must be an object`)
		c.initialize() // the connection is not spoiled
		echoOK(t, c)
	})

	hostile(t, "acp/$/cancel_request notification for an unknown id", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		id := c.Request("session/prompt", textPrompt(sid, "slow please"))
		ticks := 0
		for ticks < 2 {
			if m := c.Next(turn); m.Method == "session/update" && parseUpdate(t, m).Update.Kind == "agent_message_chunk" {
				ticks++
			}
		}
		for _, rid := range []string{`424242`, `"nope"`, `null`, `{"a":1}`, strconv.Itoa(id + 1)} {
			c.SendRaw(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":` + rid + `}}`)
		}
		// The running prompt is not cancelled: it keeps ticking.
		for ticks < 5 {
			m := c.Next(turn)
			if m.IsResponseTo(id) {
				t.Fatalf("a cancel for another id ended the prompt: %s", m.Raw)
			}
			if m.Method != "session/update" {
				t.Fatalf("unexpected answer to a notification: %s", m.Raw)
			}
			ticks++
		}
		c.Notify("session/cancel", map[string]string{"sessionId": sid})
		if r := stopReason(t, c.Await(id, turn, func(rpcMsg) {})); r != "cancelled" {
			t.Fatalf("stopReason %q", r)
		}
		echoOK(t, c)
	})

	hostile(t, "acp/$/cancel_request as a request cancels and is answered", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		id := c.Request("session/prompt", textPrompt(sid, "slow please"))
		if m := c.Next(turn); m.Method != "session/update" {
			t.Fatalf("want the prompt running: %s", m.Raw)
		}
		c.SendRaw(fmt.Sprintf(`{"jsonrpc":"2.0","id":"cr","method":"$/cancel_request","params":{"requestId":%d}}`, id))
		var cancelAnswer, promptAnswer *rpcMsg
		for cancelAnswer == nil || promptAnswer == nil {
			m := c.Next(turn)
			switch {
			case string(m.ID) == `"cr"`:
				if cancelAnswer != nil {
					t.Fatalf("two answers to $/cancel_request: %s", m.Raw)
				}
				cancelAnswer = &m
			case m.IsResponseTo(id):
				promptAnswer = &m
			}
		}
		if cancelAnswer.Error != nil || string(cancelAnswer.Result) != "null" {
			t.Fatalf("$/cancel_request answer: %s", cancelAnswer.Raw)
		}
		if r := stopReason(t, *promptAnswer); r != "cancelled" {
			t.Fatalf("stopReason %q", r)
		}
		echoOK(t, c)
	})

	// JSON-RPC: every request gets a response. A $/cancel_request sent as a
	// request for a request that is not (or no longer) in flight is a
	// request too.
	hostile(t, "acp/$/cancel_request as a request for an unknown id must be answered", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		c.SendRaw(`{"jsonrpc":"2.0","id":"cr-unknown","method":"$/cancel_request","params":{"requestId":424242}}`)
		select {
		case m := <-c.In:
			if string(m.ID) != `"cr-unknown"` || m.Method != "" {
				t.Fatalf("unexpected message: %s", m.Raw)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("GATEWAY BUG: the request {\"id\":\"cr-unknown\",\"method\":\"$/cancel_request\",\"params\":{\"requestId\":424242}} " +
				"got no response within 3 s (proxy/conn.go forwardCancelRequest returns without answering when the requestId is not in flight)")
		}
		echoOK(t, c)
	})

	hostile(t, "acp/session/cancel for another connection's session has no effect", bys, func(t *testing.T) {
		v := dialInit(t, g)
		vsid, vagent, _ := newSessionAgentID(t, g, v, cwd)
		id := v.Request("session/prompt", textPrompt(vsid, "slow please"))
		if m := v.Next(turn); m.Method != "session/update" {
			t.Fatalf("want the victim's prompt running: %s", m.Raw)
		}
		c, _ := hostileClient(t)
		for _, s := range []string{vsid, vagent, flip(vsid)} {
			c.Notify("session/cancel", map[string]string{"sessionId": s})
		}
		echoOK(t, c) // the notifications were handled
		for ticks := 0; ticks < 5; ticks++ {
			m := v.Next(turn)
			if m.IsResponseTo(id) {
				t.Fatalf("another connection's session/cancel ended the victim's prompt: %s", m.Raw)
			}
		}
		v.Notify("session/cancel", map[string]string{"sessionId": vsid})
		if r := stopReason(t, v.Await(id, turn, func(rpcMsg) {})); r != "cancelled" {
			t.Fatalf("the victim's own cancel: %q", r)
		}
	})

	// Go's encoding/json matches object keys case-insensitively, so a Go
	// agent (the demo agent among them) reads "SESSIONID" as sessionId;
	// the gateway only translates the exact name. The case-variant key
	// carries a raw agent session ID past the gateway's translation.
	hostile(t, "json-rpc/case-variant sessionId key must not reach another connection's session", bys, func(t *testing.T) {
		c, sid := hostileClient(t)
		frame := `{"jsonrpc":"2.0","id":"cv","method":"session/prompt","params":{"sessionId":"` + sid + `","SESSIONID":"` + victimAgentSID +
			`","prompt":[{"type":"text","text":"injected by another connection"}]}}`
		c.SendRaw(frame)
		var answer rpcMsg
		for answer.Raw == nil {
			if m := c.Next(turn); m.Method == "" {
				answer = m
			}
		}
		t.Logf("the hostile client's answer: %s", answer.Raw)
		select {
		case m := <-victim.In:
			var rest []string
			for more := true; more; {
				select {
				case x := <-victim.In:
					rest = append(rest, string(x.Raw))
				case <-time.After(500 * time.Millisecond):
					more = false
				}
			}
			t.Errorf("GATEWAY BUG (parser differential): the frame\n  %s\nwas relayed with the raw agent session ID of another connection's session, and that session ran the prompt; the victim received:\n  %s\n  %s",
				frame, m.Raw, strings.Join(rest, "\n  "))
		case <-time.After(time.Second):
		}
		echoOK(t, c)
	})

	// --- limits on this gateway ---

	hostile(t, "limits/message of exactly max_message_bytes is accepted", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		head, tail := `{"jsonrpc":"2.0","id":"max","method":"_demo/echo","params":{"pad":"`, `"}}`
		frame := head + strings.Repeat("p", limit-len(head)-len(tail)) + tail
		if len(frame) != limit {
			t.Fatalf("frame of %d bytes", len(frame))
		}
		c.SendRaw(frame)
		m := c.Next(turn)
		var res struct {
			Pad string `json:"pad"`
		}
		if string(m.ID) != `"max"` || m.Error != nil || json.Unmarshal(m.Result, &res) != nil || len(res.Pad) != limit-len(head)-len(tail) {
			t.Fatalf("a frame of exactly the limit: %.300s", m.Raw)
		}
		echoOK(t, c)
	})

	hostile(t, "limits/message over max_message_bytes closes with 1009", bys, func(t *testing.T) {
		c, _ := hostileClient(t)
		head, tail := `{"jsonrpc":"2.0","id":"over","method":"_demo/echo","params":{"pad":"`, `"}}`
		frame := head + strings.Repeat("p", limit+1-len(head)-len(tail)) + tail
		_ = c.WS.Write(c.Ctx(), websocket.MessageText, []byte(frame))
		st, msgs := closedWith(t, c, turn)
		if st != websocket.StatusMessageTooBig || len(msgs) != 0 {
			t.Fatalf("a frame of limit+1 bytes: close status %v (%v), messages %d; want 1009 and none", st, c.Err(), len(msgs))
		}
		quiet(t, victim, 0)
	})

	hostile(t, "limits/slow reader is closed with 1008", bys, func(t *testing.T) {
		// A client that never reads while its agent answers: the gateway
		// must drop it (1008) instead of buffering without bound or
		// stalling the agent for everybody else.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ws, write := dialRawInit(t, ctx, g, 1<<20)
		defer ws.CloseNow()
		before := g.CountLogs("closing slow client", "", "")
		pad := strings.Repeat("s", 60_000)
		sent := 0
		start := time.Now()
		for g.CountLogs("closing slow client", "", "") == before {
			if sent >= 2000 || time.Since(start) > 40*time.Second {
				t.Fatalf("no slow-client close after %d echo requests of 60 kB in %s", sent, time.Since(start).Round(time.Millisecond))
			}
			if err := write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{"pad":%q}}`, sent+1, pad)); err != nil {
				break // the gateway may have closed already
			}
			sent++
		}
		g.waitMoreLogs(t, "closing slow client", before, 10*time.Second)
		// Now read what is in flight: the connection ends with 1008.
		var st websocket.StatusCode = -1
		for i := 0; i < 5000; i++ {
			if _, _, err := ws.Read(ctx); err != nil {
				st = websocket.CloseStatus(err)
				if st == -1 {
					t.Fatalf("the connection ended without a close frame: %v", err)
				}
				break
			}
		}
		if st != websocket.StatusPolicyViolation {
			t.Fatalf("close status %v, want 1008", st)
		}
		t.Logf("closed with 1008 after %d echo requests of 60 kB", sent)
	})

	t.Run("the agent process survived every case", func(t *testing.T) {
		if now := g.agentPIDs(); len(now) != 1 || now[0] != agents[0] {
			t.Fatalf("agent processes %v, before %v", now, agents)
		}
		by.check(t)
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// A misbehaving agent (test/fakeagent), shared by the hostile client and the
// bystander: one agent process.

func TestHostileFakeAgent(t *testing.T) {
	const limit = 65536
	g := startGateway(t, gwOpts{config: fakeAgentConfig(t, "") + fmt.Sprintf(`pool: {min_idle: 1, max_processes: 1, max_sessions_per_process: 512}
limits: {max_message_bytes: %d, max_pending_requests: 256, messages_per_second: 0}
timeouts: {request: 1s}
`, limit) + hostilePolicy})
	cwd := t.TempDir()
	by := newBystander(t, "bystander", dialInit(t, g), cwd)
	bys := []*bystander{by}
	agents := g.agentProcs("fakeagent")
	if len(agents) != 1 {
		t.Fatalf("want one fake agent process, have %v", agents)
	}
	hostileClient := func(t *testing.T) *client {
		t.Helper()
		return dialInit(t, g)
	}

	hostile(t, "agent/hang: the request gets the timeout error", bys, func(t *testing.T) {
		c := hostileClient(t)
		before := g.CountLogs("agent did not answer in time; answered for it", "", "")
		start := time.Now()
		id := c.Request("_fake/hang", map[string]any{})
		// While the agent sits on the request, it serves everybody else.
		by.check(t)
		m := c.Await(id, 10*time.Second, nil)
		wantError(t, m, -32603, strconv.Itoa(id), "the agent did not answer _fake/hang within")
		// The answer is due 1-2 s after the request (the pool checks every
		// second); the bystander's check above may delay reading it.
		if d := time.Since(start); d < time.Second || d > 10*time.Second {
			t.Errorf("the timeout error came after %s; timeouts.request is 1s", d)
		}
		g.waitMoreLogs(t, "agent did not answer in time; answered for it", before, 5*time.Second)
		echoOK(t, c)
	})

	hostile(t, "limits/300 requests beyond max_pending_requests get -32006", bys, func(t *testing.T) {
		c := hostileClient(t)
		const n, maxPending = 300, 256
		start := time.Now()
		for i := 0; i < n; i++ {
			c.Request("_fake/hang", map[string]any{"i": i})
		}
		burst := time.Since(start)
		busy, timedOut := 0, 0
		seen := map[string]int{}
		for len(seen) < n {
			m := c.Next(15 * time.Second)
			seen[string(m.ID)]++
			switch {
			case m.Error != nil && m.Error.Code == -32006 && strings.Contains(m.Error.Message, "too many requests in flight: at most 256"):
				busy++
			case m.Error != nil && m.Error.Code == -32603 && strings.Contains(m.Error.Message, "did not answer _fake/hang"):
				timedOut++
			default:
				t.Fatalf("unexpected answer: %.300s", m.Raw)
			}
		}
		for id, k := range seen {
			if k != 1 {
				t.Errorf("request %s answered %d times", id, k)
			}
		}
		if burst < 800*time.Millisecond {
			// All 300 were sent before the first could time out.
			if busy != n-maxPending || timedOut != maxPending {
				t.Fatalf("%d refused with -32006 and %d timed out; want %d and %d", busy, timedOut, n-maxPending, maxPending)
			}
		} else if busy == 0 {
			t.Fatalf("sending took %s and nothing was refused with -32006", burst)
		}
		echoOK(t, c) // the slots are free again
	})

	// dropped calls method on a fresh client: the agent misbehaves on the
	// way, and the call must still be answered with result. Then each
	// message of more is logged more than n times beyond its count before
	// the call, and the client still works.
	dropped := func(t *testing.T, method string, params map[string]any, result string, more map[string]int) {
		t.Helper()
		c := hostileClient(t)
		before := map[string]int{}
		for msg := range more {
			before[msg] = g.CountLogs(msg, "", "")
		}
		m := c.Call(method, params, turn)
		if m.Error != nil || string(m.Result) != result {
			t.Fatalf("%s: answer %s, want the result %s", method, m.Raw, result)
		}
		for msg, n := range more {
			g.waitMoreLogs(t, msg, before[msg]+n, 5*time.Second)
		}
		echoOK(t, c) // and, after _fake/double, no second answer arrived first
	}

	hostile(t, "agent/writes garbage lines", bys, func(t *testing.T) {
		// Nine lines are not JSON-RPC; two are valid but for nobody.
		dropped(t, "_fake/garbage", map[string]any{}, `{"ok":true}`, map[string]int{
			"agent wrote an invalid message; skipped":                 8,
			"agent request has no recipient; answered by the gateway": 0,
		})
	})

	hostile(t, "agent/writes a line over the limit", bys, func(t *testing.T) {
		dropped(t, "_fake/huge-line", map[string]any{"bytes": 4 * limit}, `{"ok":true}`, map[string]int{
			"agent sent a line over the message limit; skipped": 0,
		})
	})

	hostile(t, "agent/answers with a line over the limit: the request gets the timeout error", bys, func(t *testing.T) {
		c := hostileClient(t)
		before := g.CountLogs("agent sent a line over the message limit; skipped", "", "")
		id := c.Request("_fake/huge-answer", map[string]any{"bytes": 2 * limit})
		wantError(t, c.Await(id, 10*time.Second, nil), -32603, strconv.Itoa(id), "the agent did not answer _fake/huge-answer within")
		g.waitMoreLogs(t, "agent sent a line over the message limit; skipped", before, 5*time.Second)
		echoOK(t, c)
	})

	hostile(t, "agent/answers twice", bys, func(t *testing.T) {
		// The first answer counts; the second is dropped.
		dropped(t, "_fake/double", map[string]any{}, `{"n":1}`, map[string]int{
			"agent answered an id the gateway never sent or already answered; dropped": 0,
		})
	})

	hostile(t, "agent/answers ids it was never sent", bys, func(t *testing.T) {
		// "nope", null, -1, 1.5, 10^23 are not ids the gateway issues;
		// 999999999 is one it has not issued yet.
		dropped(t, "_fake/unknown-id", map[string]any{}, `{"ok":true}`, map[string]int{
			"agent answered an id the gateway never sent; dropped":                     4,
			"agent answered an id the gateway never sent or already answered; dropped": 0,
		})
	})

	hostile(t, "agent/two requests with one id: the second is refused", bys, func(t *testing.T) {
		c := hostileClient(t)
		sid := c.newSession(cwd)
		before := g.CountLogs("agent reused the id of a request still in flight; refused", "", "")
		asked := 0
		m := c.Await(c.Request("session/prompt", textPrompt(sid, "duplicate request ids")), turn, func(m rpcMsg) {
			if m.Method == "session/request_permission" {
				asked++
				// Answer only once the gateway has seen the second request:
				// answered, the first would no longer be in flight and its id
				// would be free to reuse.
				g.waitMoreLogs(t, "agent reused the id of a request still in flight; refused", before, 5*time.Second)
				c.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
			}
		})
		if r := stopReason(t, m); r != "end_turn" || asked != 1 {
			t.Fatalf("stopReason %q after %d permission requests, want end_turn after 1", r, asked)
		}
		echoOK(t, c)
	})

	hostile(t, "agent/floods stderr", bys, func(t *testing.T) {
		c := hostileClient(t)
		const lines = 20000
		m := c.Call("_fake/stderr-flood", map[string]any{"lines": lines}, turn)
		if m.Error != nil || string(m.Result) != fmt.Sprintf(`{"lines":%d}`, lines) {
			t.Fatalf("answer: %s", m.Raw)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(g.agentLines("stderr flood line")) == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		logged := len(g.agentLines("stderr flood line"))
		if logged == 0 {
			t.Fatalf("the agent's stderr was not logged at all")
		}
		if logged > 1000 {
			t.Errorf("%d of %d stderr lines were logged: the log is not rate-limited", logged, lines)
		}
		t.Logf("%d of %d stderr lines logged", logged, lines)
		echoOK(t, c)
	})

	t.Run("the agent process survived every case", func(t *testing.T) {
		if now := g.agentProcs("fakeagent"); len(now) != 1 || now[0] != agents[0] {
			t.Fatalf("fake agent processes %v, before %v", now, agents)
		}
		by.check(t)
	})

	// Agents that cannot start: the client gets a clear error at once, the
	// connection stays usable, and readiness says so.
	for _, tc := range []struct{ mode, name, why string }{
		{"exit-before-init", "agent/exits before initialize", "exit status 3"},
		{"init-error", "agent/answers initialize with an error", "fakeagent refuses to initialize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, gwOpts{config: fakeAgentConfig(t, tc.mode) + "pool: {min_idle: 1, max_processes: 1, acquire_timeout: 20s}\n"})
			g.WaitLog(t, "agent failed to start", "", "", 15*time.Second)
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			get := func(path string) (int, string) {
				resp, err := hc.Get("http://" + g.Addr + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no agent ready") {
				t.Errorf("/readyz: %d %q, want 503 no agent ready", code, body)
			}
			if code, _ := get("/healthz"); code != http.StatusOK {
				t.Errorf("/healthz: %d, want 200 (the gateway itself is alive)", code)
			}
			for _, c := range []*client{dial(t, g), dial(t, g)} {
				start := time.Now()
				m := c.Call("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, turn)
				wantError(t, m, -32603, strconv.Itoa(c.NextID), "no agent available")
				t.Logf("initialize answered after %s: %s", time.Since(start).Round(time.Millisecond), m.Raw)
				// The client is told the agent fails to start, without host
				// details; the reason itself goes to the gateway's log.
				if !strings.Contains(m.Error.Message, "failing to start") {
					t.Errorf("the error does not say the agent fails: %q", m.Error.Message)
				}
				if !strings.Contains(g.LogText(), tc.why) {
					t.Errorf("the gateway log does not say why (%q)", tc.why)
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("the error took %s (acquire_timeout is 20s): want it at once", d)
				}
				// The connection lives and says the same again.
				m = c.Call("session/new", map[string]any{"cwd": "/tmp", "mcpServers": []any{}}, turn)
				wantError(t, m, -32600, strconv.Itoa(c.NextID), "not initialized")
			}
			if tc.mode == "exit-before-init" {
				if lines := g.agentLines("exiting before initialize"); len(lines) == 0 && !strings.Contains(g.LogText(), "exiting before initialize") {
					t.Errorf("the agent's last words are not in the gateway log")
				}
			}
			if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
				t.Errorf("/readyz turned ready: %d", code)
			}
			hc.CloseIdleConnections()
		})
	}
}

// ---------------------------------------------------------------------------
// Rate limits, handshake and idle timeouts.

func TestHostileTimeouts(t *testing.T) {
	g := startGateway(t, gwOpts{config: `pool: {min_idle: 1, max_processes: 1}
timeouts: {handshake: 1s, idle: 2s}
limits: {messages_per_second: 5, message_burst: 10}
` + hostilePolicy})
	cwd := t.TempDir()
	// The bystander streams a slow prompt through all cases, so that the
	// idle timeout has no reason to close it, and makes a round trip after
	// each case.
	sb := &streamer{c: dial(t, g)}
	sb.c.initialize()
	sb.sid = sb.c.newSession(cwd)
	sb.start(t)
	defer sb.stop(t)
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			f(t)
			sb.check(t)
		})
	}

	run("limits/burst over messages_per_second gets -32006, session/cancel still passes", func(t *testing.T) {
		c, sid := dialSession(t, g, cwd)
		pid := c.Request("session/prompt", textPrompt(sid, "slow please"))
		// 3 of the 10 tokens are spent; 20 more requests at once.
		first := c.NextID + 1
		burstStart := time.Now()
		for i := 0; i < 20; i++ {
			c.Request("_demo/echo", map[string]any{"i": i})
		}
		// The bucket holds 10 and refills 5 a second while the burst is
		// being sent.
		maxOK := 10 + int(5*time.Since(burstStart).Seconds()) + 1
		ok, limited := 0, 0
		for got := 0; got < 20; {
			m := c.Next(turn)
			if m.Method == "session/update" {
				continue
			}
			id, _ := strconv.Atoi(string(m.ID))
			if id < first || id >= first+20 {
				t.Fatalf("unexpected message: %s", m.Raw)
			}
			got++
			switch {
			case m.Error == nil:
				ok++
			case m.Error.Code == -32006 && strings.Contains(m.Error.Message, "rate limit: at most 5 messages per second"):
				limited++
			default:
				t.Fatalf("unexpected answer: %s", m.Raw)
			}
		}
		if ok > maxOK || limited == 0 {
			t.Fatalf("%d answered, %d refused with -32006: want at most %d answered", ok, limited, maxOK)
		}
		t.Logf("%d of 20 answered, %d refused with -32006", ok, limited)
		// The bucket is empty, yet the cancellation passes.
		c.Notify("session/cancel", map[string]string{"sessionId": sid})
		if r := stopReason(t, c.Await(pid, 5*time.Second, func(rpcMsg) {})); r != "cancelled" {
			t.Fatalf("stopReason %q: session/cancel did not pass the rate limit", r)
		}
		time.Sleep(1500 * time.Millisecond) // refill
		echoOK(t, c)
	})

	run("timeouts/no initialize within the handshake timeout closes with 1008", func(t *testing.T) {
		c := dial(t, g)
		start := time.Now()
		st, msgs := closedWith(t, c, 10*time.Second)
		if st != websocket.StatusPolicyViolation || len(msgs) != 0 {
			t.Fatalf("close status %v (%v) after %d messages, want 1008", st, c.Err(), len(msgs))
		}
		if d := time.Since(start); d < 900*time.Millisecond || d > 5*time.Second {
			t.Errorf("closed after %s; timeouts.handshake is 1s", d)
		}
	})

	run("timeouts/other requests do not stop the handshake timeout", func(t *testing.T) {
		c := dial(t, g)
		start := time.Now()
		// Requests other than initialize for the first 600 ms: each is
		// refused, none counts as the handshake.
		for i := 1; time.Since(start) < 600*time.Millisecond; i++ {
			c.SendRaw(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`, i, cwd))
			wantError(t, c.Next(turn), -32600, strconv.Itoa(i), "must be initialize")
			time.Sleep(150 * time.Millisecond)
		}
		st, msgs := closedWith(t, c, 10*time.Second)
		if st != websocket.StatusPolicyViolation || len(msgs) != 0 {
			t.Fatalf("close status %v (%v) after %d more messages, want 1008", st, c.Err(), len(msgs))
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("closed after %s", d)
		}
	})

	run("timeouts/idle closes with 1001, but not while a prompt runs", func(t *testing.T) {
		idle := dialInit(t, g)
		idleSince := time.Now()
		busy, sid := dialSession(t, g, cwd)
		pid := busy.Request("session/prompt", textPrompt(sid, "ask my permission"))
		var perm rpcMsg
		for perm.Raw == nil {
			if m := busy.Next(turn); m.Method == "session/request_permission" {
				perm = m
			}
		}
		// The agent waits on the client: no message either way for twice
		// the idle timeout, but a prompt is running.
		st, _ := closedWith(t, idle, 10*time.Second)
		if st != websocket.StatusGoingAway {
			t.Fatalf("idle connection: close status %v (%v), want 1001", st, idle.Err())
		}
		if d := time.Since(idleSince); d < 1500*time.Millisecond {
			t.Errorf("idle connection closed after %s; timeouts.idle is 2s", d)
		}
		time.Sleep(2500 * time.Millisecond)
		if busy.Err() != nil {
			t.Fatalf("the connection was closed while its prompt ran: %v", busy.Err())
		}
		busy.Respond(perm.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
		if r := stopReason(t, busy.Await(pid, turn, func(rpcMsg) {})); r != "end_turn" {
			t.Fatalf("stopReason %q", r)
		}
		// Once the turn is over, it idles out too.
		st, _ = closedWith(t, busy, 10*time.Second)
		if st != websocket.StatusGoingAway {
			t.Fatalf("after the prompt: close status %v (%v), want 1001", st, busy.Err())
		}
	})
}

// streamer is a bystander that keeps a slow prompt streaming: the demo
// agent's "tick N " chunks, which must arrive in order with none missing.
type streamer struct {
	c      *client
	sid    string
	prompt int
	ticks  int
}

func (s *streamer) start(t *testing.T) {
	t.Helper()
	s.c.T = t
	s.prompt = s.c.Request("session/prompt", textPrompt(s.sid, "slow please"))
	s.ticks = 0
}

// handle checks one message of the stream (ticks in order, for its own
// session); it returns false when m is the answer that ends the prompt.
func (s *streamer) handle(t *testing.T, m rpcMsg) bool {
	t.Helper()
	if m.IsResponseTo(s.prompt) {
		return false
	}
	if m.Method != "session/update" {
		t.Fatalf("streaming bystander: unexpected message %s", m.Raw)
	}
	u := parseUpdate(t, m)
	if u.SessionID != s.sid {
		t.Fatalf("streaming bystander: update for another session: %s", m.Raw)
	}
	if u.Update.Kind == "agent_message_chunk" {
		s.ticks++
		if want := fmt.Sprintf("tick %d ", s.ticks); u.text() != want {
			t.Fatalf("streaming bystander: chunk %q, want %q", u.text(), want)
		}
	}
	return true
}

// check asserts the stream goes on and an echo round trip works meanwhile.
func (s *streamer) check(t *testing.T) {
	t.Helper()
	s.c.T = t
	before := s.ticks
	id := s.c.Request("_demo/echo", map[string]any{"alive": true})
	for {
		m := s.c.Next(turn)
		if m.IsResponseTo(id) {
			if m.Error != nil {
				t.Fatalf("streaming bystander: echo: %s", m.Raw)
			}
			break
		}
		if !s.handle(t, m) {
			t.Fatalf("streaming bystander: the prompt ended: %s", m.Raw)
		}
	}
	for s.ticks < before+2 {
		if !s.handle(t, s.c.Next(turn)) {
			t.Fatalf("streaming bystander: the prompt ended")
		}
	}
}

func (s *streamer) stop(t *testing.T) {
	t.Helper()
	s.c.T = t
	s.c.Notify("session/cancel", map[string]string{"sessionId": s.sid})
	for {
		m := s.c.Next(turn)
		if !s.handle(t, m) {
			if r := stopReason(t, m); r != "cancelled" {
				t.Fatalf("streaming bystander: stopReason %q", r)
			}
			return
		}
	}
}

// ---------------------------------------------------------------------------
// Authentication, tenancy and paths: two tenants, a bystander in each.

func TestHostileTenants(t *testing.T) {
	env := newIsoEnv(t)
	g := startGateway(t, gwOpts{config: env.config(env.keyFile, nil) + hostilePolicy})
	acmeTok, globexTok := env.tokens["acme"], env.tokens["globex"]
	acme := newBystander(t, "acme", dialToken(t, g, acmeTok), vroot)
	globex := newBystander(t, "globex", dialToken(t, g, globexTok), vroot)
	bys := []*bystander{acme, globex}
	if err := os.Symlink(env.roots["globex"], filepath.Join(env.roots["acme"], "escape")); err != nil {
		t.Fatal(err)
	}

	hostile(t, "auth/no token: 401", bys, func(t *testing.T) {
		refused(t, g, "/acp", nil, []string{"acp"}, 401, "missing_token")
	})
	hostile(t, "auth/bad token: 401", bys, func(t *testing.T) {
		bad := acmeTok[:len(acmeTok)-1] + "x"
		refused(t, g, "/acp", bearer(bad), []string{"acp"}, 401, "invalid_token", bad)
		refused(t, g, "/acp", bearer(""), []string{"acp"}, 401, "invalid_token")
		refused(t, g, "/acp", bearer(strings.Repeat("A", 8192)), []string{"acp"}, 401, "invalid_token")
	})
	hostile(t, "auth/token in the query string is not a carrier: 401", bys, func(t *testing.T) {
		for _, name := range []string{"token", "access_token", "bearer", "authorization", "api_key", "acp.bearer"} {
			refused(t, g, "/acp?"+name+"="+acmeTok, nil, []string{"acp"}, 401, "missing_token", acmeTok)
		}
	})
	hostile(t, "auth/a bearer token passed as ?ticket= is not a ticket: 401", bys, func(t *testing.T) {
		refused(t, g, "/acp?ticket="+acmeTok, nil, []string{"acp"}, 401, "invalid_token", acmeTok)
	})
	hostile(t, "auth/disallowed origin: 403", bys, func(t *testing.T) {
		h := bearer(acmeTok)
		h.Set("Origin", "http://evil.example")
		refused(t, g, "/acp", h, []string{"acp"}, 403, "origin_not_allowed", acmeTok)
		h.Set("Origin", "null")
		refused(t, g, "/acp", h, []string{"acp"}, 403, "origin_not_allowed", acmeTok)
	})

	hostile(t, "tenancy/another tenant's session ID: -32002", bys, func(t *testing.T) {
		c := dialToken(t, g, globexTok)
		m := c.Call("session/prompt", textPrompt(acme.sid, "hijack"), turn)
		wantError(t, m, -32002, strconv.Itoa(c.NextID), "session not found")
		m = c.Call("session/load", map[string]any{"sessionId": acme.sid, "cwd": vroot, "mcpServers": []any{}}, turn)
		wantError(t, m, -32002, strconv.Itoa(c.NextID), "session not found")
		c.Notify("session/cancel", map[string]string{"sessionId": acme.sid})
		echoOK(t, c)
	})

	hostile(t, "tenancy/case-variant sessionId must not yield a loadable ID for another tenant's session", bys, func(t *testing.T) {
		// The raw agent-side ID of acme's bystander session, smuggled by
		// globex past the gateway as "SESSIONID" (Go agents read it as
		// sessionId). Tenants never share an agent process, so globex's
		// agent does not know the session, and answers -32002 naming it:
		// that answer must not hand globex a gateway ID that opens acme's
		// session.
		c := dialToken(t, g, globexTok)
		own, ownAgent, _ := newSessionAgentID(t, g, c, vroot)
		var acmeAgent string
		for id, cwd := range stateFiles(t, g.stateDir) {
			if cwd == env.real["acme"] && id != ownAgent {
				acmeAgent = id
			}
		}
		if acmeAgent == "" {
			t.Fatalf("no acme session in the agent's state dir")
		}
		frame := `{"jsonrpc":"2.0","id":"cv","method":"session/prompt","params":{"sessionId":"` + own + `","SESSIONID":"` + acmeAgent +
			`","prompt":[{"type":"text","text":"injected"}]}}`
		c.SendRaw(frame)
		var answer rpcMsg
		for answer.Raw == nil {
			if m := c.Next(turn); m.Method == "" {
				answer = m
			}
		}
		if strings.Contains(string(answer.Raw), acmeAgent) {
			t.Errorf("the answer names acme's agent-side session ID: %s", answer.Raw)
		}
		var data struct {
			SessionID string `json:"sessionId"`
		}
		if answer.Error != nil {
			_ = json.Unmarshal(answer.Error.Data, &data)
		}
		if data.SessionID != "" && data.SessionID != own {
			// A gateway ID the client was never given: try it.
			var replay strings.Builder
			m := c.Await(c.Request("session/load", map[string]any{"sessionId": data.SessionID, "cwd": vroot, "mcpServers": []any{}}), turn, func(m rpcMsg) {
				replay.WriteString(parseUpdate(t, m).text())
			})
			if m.Error == nil || strings.Contains(replay.String(), acme.name) {
				t.Errorf("GATEWAY BUG (cross-tenant): globex sent\n  %s\nand got\n  %s\nwhose data.sessionId is acme's session sealed for globex; "+
					"session/load of it answered %s and replayed acme's history: %q", frame, answer.Raw, m.Raw, replay.String())
			}
		}
		echoOK(t, c)
	})

	paths := []struct {
		name   string
		params func(c *client, sid string) (string, map[string]any)
		msg    []string
	}{
		{"paths/cwd with a NUL byte", func(*client, string) (string, map[string]any) {
			return "session/new", map[string]any{"cwd": vroot + "/a\x00b", "mcpServers": []any{}}
		}, []string{"params.cwd", "NUL"}},
		{"paths/%00 in a file URI", func(_ *client, sid string) (string, map[string]any) {
			return "session/prompt", map[string]any{"sessionId": sid, "prompt": []any{
				map[string]any{"type": "text", "text": "look"},
				map[string]any{"type": "resource_link", "uri": "file:///workspace/notes.txt%00.png", "name": "x"},
			}}
		}, []string{"params.prompt", "uri"}},
		{"paths/.. out of the workspace", func(*client, string) (string, map[string]any) {
			return "session/new", map[string]any{"cwd": vroot + "/sub/../../etc", "mcpServers": []any{}}
		}, []string{"params.cwd", "outside the workspace"}},
		{"paths/symlink out of the tenant root", func(*client, string) (string, map[string]any) {
			return "session/new", map[string]any{"cwd": vroot + "/escape", "mcpServers": []any{}}
		}, []string{"params.cwd", "symbolic link"}},
		{"paths/file URI through a symlink", func(_ *client, sid string) (string, map[string]any) {
			return "session/prompt", map[string]any{"sessionId": sid, "prompt": []any{
				map[string]any{"type": "resource_link", "uri": "file:///workspace/escape/secret.txt", "name": "x"},
			}}
		}, []string{"params.prompt", "symbolic link"}},
	}
	for _, p := range paths {
		hostile(t, p.name, bys, func(t *testing.T) {
			c := dialToken(t, g, acmeTok)
			sid := c.newSession(vroot)
			before := len(stateFiles(t, g.stateDir))
			method, params := p.params(c, sid)
			m := c.Call(method, params, turn)
			wantError(t, m, -32602, strconv.Itoa(c.NextID), p.msg[0])
			for _, s := range p.msg[1:] {
				if !strings.Contains(m.Error.Message, s) {
					t.Errorf("message %q does not say %q", m.Error.Message, s)
				}
			}
			for _, host := range []string{env.real["acme"], env.real["globex"]} {
				if strings.Contains(m.Error.Message, host) {
					t.Errorf("the error names a host path: %q", m.Error.Message)
				}
			}
			if n := len(stateFiles(t, g.stateDir)); n != before {
				t.Errorf("the agent created a session anyway")
			}
			if got := promptOK(t, c, sid, "after the refusal"); got != "You said: after the refusal" {
				t.Errorf("prompt after the refusal: %q", got)
			}
		})
	}

	t.Run("no credential in the log", func(t *testing.T) {
		logs := g.LogText()
		for _, s := range []string{acmeTok, globexTok} {
			if strings.Contains(logs, s) {
				t.Errorf("a token appears in the gateway log: %.12s…", s)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Resume: a refused resume is refused before the upgrade with 404 and one
// body, whatever the reason (no oracle), and disturbs nobody: the
// connection the token names still resumes for its own client.

func TestHostileResume(t *testing.T) {
	env := newIsoEnv(t)
	g := startGateway(t, gwOpts{config: env.config(env.keyFile, nil) + hostilePolicy + "shutdown_grace: 3s\n"})
	acmeTok, globexTok := env.tokens["acme"], env.tokens["globex"]
	acme := newBystander(t, "acme", dialToken(t, g, acmeTok), vroot)
	globex := newBystander(t, "globex", dialToken(t, g, globexTok), vroot)
	bys := []*bystander{acme, globex}

	// The victim: an acme connection with a session, detached by a TCP
	// reset after it received everything the gateway sent it.
	victim := newRconn(t, g, bearer(acmeTok))
	victim.initialize()
	vsid := victim.newSession(vroot)
	quiet(t, victim.c, 300*time.Millisecond)
	n := victim.Got
	victim.resetDetached()

	// A connection the client ended with 1000.
	ended := newRconn(t, g, bearer(acmeTok))
	ended.initialize()
	endedN := ended.Got
	closeClean(t, ended.c)

	var (
		firstBody string
		refusals  int
	)
	// refuse asserts that the resume is refused like every other one.
	refuse := func(t *testing.T, header http.Header, token, received, why string) {
		t.Helper()
		body := wantResumeRefused(t, g, header, resumePath(token, received), why)
		refusals++
		if firstBody == "" {
			firstBody = body
		} else if body != firstBody {
			t.Errorf("resume with %s: body %s differs from an earlier refusal's %s: the refusal tells why", why, body, firstBody)
		}
		if strings.Contains(body, token) && len(token) >= 8 {
			t.Errorf("resume with %s: the refusal echoes the token: %s", why, body)
		}
	}
	recv := strconv.Itoa(n)

	hostile(t, "resume/forged token", bys, func(t *testing.T) {
		refuse(t, bearer(acmeTok), flip(victim.token), recv, "the victim's token with one character changed")
		refuse(t, bearer(acmeTok), harness.RandomHex(t, len(victim.token)/2+1)[:len(victim.token)], recv, "a random token of the right length")
		refuse(t, bearer(acmeTok), victim.token[:len(victim.token)-1], recv, "the victim's token less its last character")
		refuse(t, bearer(acmeTok), victim.token+"A", recv, "the victim's token with a character appended")
		refuse(t, bearer(acmeTok), strings.ToUpper(victim.token), recv, "the victim's token in upper case")
	})
	hostile(t, "resume/token of a connection closed with 1000", bys, func(t *testing.T) {
		refuse(t, bearer(acmeTok), ended.token, strconv.Itoa(endedN), "the token of a connection its client closed")
		refuse(t, bearer(acmeTok), ended.token, "0", "the token of a connection its client closed, received=0")
	})
	hostile(t, "resume/another tenant's token", bys, func(t *testing.T) {
		refuse(t, bearer(globexTok), victim.token, recv, "acme's token with globex's credentials")
	})
	hostile(t, "resume/oversized token", bys, func(t *testing.T) {
		refuse(t, bearer(acmeTok), strings.Repeat("A", 10<<10), recv, "a token of 10 KB")
		refuse(t, bearer(acmeTok), victim.token+strings.Repeat("A", 10<<10), recv, "the victim's token followed by 10 KB")
	})
	for _, bad := range []string{"abc", "-1", "99999999999999999999", "1.5", strconv.Itoa(n + 1), strconv.Itoa(n + 1000)} {
		hostile(t, "resume/received="+bad, bys, func(t *testing.T) {
			refuse(t, bearer(acmeTok), victim.token, bad, fmt.Sprintf("received=%s (the gateway sent %d messages)", bad, n))
		})
	}

	hostile(t, "resume/another tenant loads the detached session", bys, func(t *testing.T) {
		c := dialToken(t, g, globexTok)
		for _, method := range []string{"session/load", "session/resume"} {
			m := c.Call(method, map[string]any{"sessionId": vsid, "cwd": vroot, "mcpServers": []any{}}, turn)
			wantError(t, m, -32002, strconv.Itoa(c.NextID), "session not found")
		}
		echoOK(t, c)
	})

	t.Run("the refusals are counted", func(t *testing.T) {
		if v, found := metricWith(t, g, "acpgate_resumes_total", `result="refused"`); !found || v < float64(refusals) {
			t.Errorf("acpgate_resumes_total{result=\"refused\"} is %g (exposed: %v) after %d refusals", v, found, refusals)
		}
		if v, _ := metricWith(t, g, "acpgate_resumes_total", `result="ok"`); v != 0 {
			t.Errorf("acpgate_resumes_total{result=\"ok\"} is %g: a hostile resume was accepted", v)
		}
	})

	// None of it disturbed the victim: it resumes exactly and carries on.
	t.Run("the victim resumes", func(t *testing.T) {
		victim.t = t
		if m := victim.resume(n); m != len(victim.Frames) {
			t.Errorf("_acpgate/resumed says the gateway received %d messages; the victim sent %d", m, len(victim.Frames))
		}
		quiet(t, victim.c, 200*time.Millisecond)
		c := victim.c
		c.NextID = victim.NextID
		if got := promptOK(t, c, vsid, "the victim is back"); got != "You said: the victim is back" {
			t.Fatalf("the victim's prompt after the resume: %q", got)
		}
		closed := g.CountLogs("connection closed", "conn", c.ConnID)
		closeClean(t, c)
		// Its token dies with it, once the gateway has handled the close
		// (the close handshake completes before that).
		for deadline := time.Now().Add(5 * time.Second); g.CountLogs("connection closed", "conn", c.ConnID) == closed; {
			if time.Now().After(deadline) {
				t.Fatalf("the gateway did not log the close of %s", c.ConnID)
			}
			time.Sleep(10 * time.Millisecond)
		}
		refuse(t, bearer(acmeTok), victim.token, "0", "the token of the victim, which then closed with 1000")
	})
	for _, b := range bys {
		b.check(t)
	}
}
