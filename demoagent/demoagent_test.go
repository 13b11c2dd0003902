package demoagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitTimeout = 3 * time.Second

// wireMsg is a message from the agent, as the test client sees it.
type wireMsg struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error,omitempty"`

	raw string
}

// update is the params of a session/update notification.
type update struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		SessionUpdate string `json:"sessionUpdate"`
		Content       json.RawMessage
		ToolCallID    string `json:"toolCallId"`
		Title         string `json:"title"`
		Kind          string `json:"kind"`
		Status        string `json:"status"`
		UpdatedAt     string `json:"updatedAt"`
		Locations     []struct {
			Path string `json:"path"`
		} `json:"locations"`
		Entries []struct {
			Content  string `json:"content"`
			Priority string `json:"priority"`
			Status   string `json:"status"`
		} `json:"entries"`
	} `json:"update"`
}

// text is the text of a chunk update's content block.
func (u update) text() string {
	var b struct{ Text string }
	_ = json.Unmarshal(u.Update.Content, &b)
	return b.Text
}

// client is a minimal JSON-RPC client driving one Run over io.Pipe pairs.
type client struct {
	t      *testing.T
	in     *io.PipeWriter
	msgs   chan wireMsg
	cancel context.CancelFunc
	nextID int

	runDone chan struct{}
	runErr  error
}

func startAgent(t *testing.T, stateDir string) *client {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	c := &client{t: t, in: inW, msgs: make(chan wireMsg, 10000), cancel: cancel, runDone: make(chan struct{})}

	go func() {
		defer close(c.runDone)
		c.runErr = Run(ctx, inR, outW, Options{StateDir: stateDir, ChunkDelay: -1, Name: "test-agent", Version: "1.2.3"})
		outW.Close()
	}()
	go func() {
		defer close(c.msgs)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m wireMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m.Method = "!undecodable"
			}
			m.raw = sc.Text()
			c.msgs <- m
		}
	}()

	t.Cleanup(func() {
		c.in.Close() // EOF for the agent
		cancel()
		deadline := time.After(waitTimeout)
		for done := false; !done; {
			select {
			case _, ok := <-c.msgs:
				done = !ok
			case <-deadline:
				t.Fatal("agent did not stop after its input was closed")
			}
		}
		<-c.runDone
	})
	return c
}

func (c *client) sendRaw(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatalf("write to agent: %v", err)
	}
}

func (c *client) send(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(string(b))
}

func (c *client) request(method string, params any) int {
	c.t.Helper()
	c.nextID++
	c.send(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method, "params": params})
	return c.nextID
}

func (c *client) notify(method string, params any) {
	c.t.Helper()
	c.send(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

func (c *client) respond(id json.RawMessage, result any) {
	c.t.Helper()
	c.send(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func (c *client) next() wireMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok {
			c.t.Fatal("agent output closed")
		}
		if m.Method == "!undecodable" {
			c.t.Fatalf("agent wrote a line that is not JSON: %q", m.raw)
		}
		return m
	case <-time.After(waitTimeout):
		c.t.Fatal("timed out waiting for a message from the agent")
	}
	panic("unreachable")
}

// until reads messages up to the response to id. It returns the
// notifications it saw on the way. Requests from the agent go to answer,
// which must send the reply. A nil answer makes any such request fail the test.
func (c *client) until(id int, answer func(wireMsg)) ([]wireMsg, wireMsg) {
	c.t.Helper()
	var notes []wireMsg
	for {
		m := c.next()
		switch {
		case m.Method != "" && m.ID != nil:
			if answer == nil {
				c.t.Fatalf("unexpected request from the agent: %s", m.raw)
			}
			answer(m)
		case m.Method != "":
			notes = append(notes, m)
		case string(m.ID) == jsonInt(id):
			return notes, m
		default:
			c.t.Fatalf("unexpected response: %s", m.raw)
		}
	}
}

func (c *client) call(method string, params any) wireMsg {
	c.t.Helper()
	_, resp := c.until(c.request(method, params), nil)
	return resp
}

func jsonInt(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// startSession starts an agent on a new state directory, initializes it
// without fs capabilities and opens a session in /w.
func startSession(t *testing.T) (*client, string) {
	t.Helper()
	c := startAgent(t, t.TempDir())
	c.initialize(false, false)
	return c, c.newSession("/w")
}

func (c *client) initialize(read, write bool) wireMsg {
	c.t.Helper()
	resp := c.call("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": read, "writeTextFile": write}},
		"clientInfo":         map[string]string{"name": "test", "version": "0"},
	})
	mustResult(c.t, resp)
	return resp
}

func (c *client) newSession(cwd string) string {
	c.t.Helper()
	resp := c.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	var r struct{ SessionID string }
	decode(c.t, mustResult(c.t, resp), &r)
	return r.SessionID
}

func (c *client) prompt(sessionID, text string) int {
	c.t.Helper()
	return c.request("session/prompt", map[string]any{
		"sessionId": sessionID,
		"prompt":    []any{map[string]string{"type": "text", "text": text}},
	})
}

func mustResult(t *testing.T, m wireMsg) json.RawMessage {
	t.Helper()
	if m.Error != nil || m.Result == nil {
		t.Fatalf("want a result, got %s", m.raw)
	}
	return m.Result
}

func mustError(t *testing.T, m wireMsg, code int) {
	t.Helper()
	if m.Error == nil || m.Error.Code != code {
		t.Fatalf("want error %d, got %s", code, m.raw)
	}
	if m.Result != nil {
		t.Fatalf("error response carries a result: %s", m.raw)
	}
}

func decode(t *testing.T, raw json.RawMessage, v any) {
	t.Helper()
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}

func stopReason(t *testing.T, m wireMsg) string {
	t.Helper()
	var r struct{ StopReason string }
	decode(t, mustResult(t, m), &r)
	return r.StopReason
}

// wantStop checks the stopReason of prompt response m.
func wantStop(t *testing.T, m wireMsg, want string) {
	t.Helper()
	if got := stopReason(t, m); got != want {
		t.Errorf("stopReason = %q", got)
	}
}

func updates(t *testing.T, notes []wireMsg) []update {
	t.Helper()
	var out []update
	for _, n := range notes {
		if n.Method != "session/update" {
			t.Fatalf("unexpected notification: %s", n.raw)
		}
		var u update
		decode(t, n.Params, &u)
		out = append(out, u)
	}
	return out
}

// text concatenates the chunks of the given kind.
func text(us []update, kind string) string {
	var b strings.Builder
	for _, u := range us {
		if u.Update.SessionUpdate == kind {
			b.WriteString(u.text())
		}
	}
	return b.String()
}

func find(us []update, kind string) []update {
	var out []update
	for _, u := range us {
		if u.Update.SessionUpdate == kind {
			out = append(out, u)
		}
	}
	return out
}

// ---- tests ----

func TestInitialize(t *testing.T) {
	c := startAgent(t, t.TempDir())
	resp := c.call("initialize", map[string]any{"protocolVersion": 7, "clientCapabilities": map[string]any{}})
	want := `{"protocolVersion":1,"agentCapabilities":{"loadSession":true,` +
		`"promptCapabilities":{"image":false,"audio":false,"embeddedContext":true},` +
		`"mcpCapabilities":{"http":true,"sse":false},` +
		`"sessionCapabilities":{"list":{},"close":{},"resume":{},"additionalDirectories":{}}},` +
		`"authMethods":[],"agentInfo":{"name":"test-agent","version":"1.2.3"}}`
	if got := string(mustResult(t, resp)); got != want {
		t.Errorf("initialize result\n got %s\nwant %s", got, want)
	}
	if !strings.HasPrefix(resp.raw, `{"jsonrpc":"2.0","id":1,`) {
		t.Errorf("response envelope: %s", resp.raw)
	}
}

func TestNotInitialized(t *testing.T) {
	c := startAgent(t, t.TempDir())
	c.notify("session/cancel", map[string]string{"sessionId": "x"}) // ignored, no answer
	resp := c.call("session/new", map[string]any{"cwd": "/w", "mcpServers": []any{}})
	mustError(t, resp, codeInvalidRequest)
	if resp.Error.Message != "not initialized" {
		t.Errorf("message = %q", resp.Error.Message)
	}
	c.initialize(false, false)
	c.newSession("/w")
}

func TestDefaultPromptStreamsEcho(t *testing.T) {
	dir := t.TempDir()
	c := startAgent(t, dir)
	c.initialize(false, false)
	sid := c.newSession("/workspace")
	if !sessionIDPattern.MatchString(sid) {
		t.Fatalf("session id %q", sid)
	}

	notes, resp := c.until(c.prompt(sid, "hello"), nil)
	wantStop(t, resp, "end_turn")
	us := updates(t, notes)
	chunks := find(us, "agent_message_chunk")
	if got := text(us, "agent_message_chunk"); got != "You said: hello" {
		t.Errorf("reply = %q", got)
	}
	if len(chunks) < 2 {
		t.Errorf("reply came in %d chunk(s), want it streamed", len(chunks))
	}
	for _, ch := range chunks {
		if n := utf8.RuneCountInString(ch.text()); n > chunkRunes {
			t.Errorf("chunk %q has %d characters", ch.text(), n)
		}
		if ch.SessionID != sid {
			t.Errorf("chunk for session %q", ch.SessionID)
		}
	}
	if us[0].Update.SessionUpdate != "agent_message_chunk" {
		t.Errorf("first update is %q", us[0].Update.SessionUpdate)
	}
	info := find(us, "session_info_update")
	if len(info) != 1 || info[0].Update.Title != "hello" || info[0].Update.UpdatedAt == "" {
		t.Errorf("session_info_update = %+v", info)
	}

	// The session file holds the history.
	data, err := os.ReadFile(filepath.Join(dir, sid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var f sessionFile
	decode(t, data, &f)
	want := []historyEntry{{"user", "hello"}, {"agent", "You said: hello"}}
	if f.Cwd != "/workspace" || f.Title != "hello" || len(f.History) != 2 || f.History[0] != want[0] || f.History[1] != want[1] {
		t.Errorf("session file = %s", data)
	}
	if _, err := time.Parse(time.RFC3339, f.UpdatedAt); err != nil {
		t.Errorf("updatedAt: %v", err)
	}
}

func TestReadPrompt(t *testing.T) {
	t.Run("success", func(t *testing.T) {
		c := startAgent(t, t.TempDir())
		c.initialize(true, false)
		sid := c.newSession("/workspace")
		var asked bool
		notes, resp := c.until(c.prompt(sid, "Please read /workspace/notes.txt."), func(m wireMsg) {
			if m.Method != "fs/read_text_file" {
				t.Fatalf("unexpected request %s", m.raw)
			}
			var p struct{ SessionID, Path string }
			decode(t, m.Params, &p)
			if p.SessionID != sid || p.Path != "/workspace/notes.txt" {
				t.Errorf("fs/read_text_file params %s", m.Params)
			}
			asked = true
			c.respond(m.ID, map[string]string{"content": "first line\nsecond line\n"})
		})
		if !asked {
			t.Fatal("agent did not call fs/read_text_file")
		}
		wantStop(t, resp, "end_turn")
		us := updates(t, notes)
		calls := find(us, "tool_call")
		if len(calls) != 1 {
			t.Fatalf("tool_call updates: %d", len(calls))
		}
		tc := calls[0].Update
		if tc.Kind != "read" || tc.Status != "pending" || tc.Title != "Read /workspace/notes.txt" ||
			tc.ToolCallID != "call_1" || len(tc.Locations) != 1 || tc.Locations[0].Path != "/workspace/notes.txt" {
			t.Errorf("tool_call = %+v", tc)
		}
		tcu := find(us, "tool_call_update")
		if len(tcu) == 0 || tcu[len(tcu)-1].Update.Status != "completed" {
			t.Errorf("tool_call_update = %+v", tcu)
		}
		reply := text(us, "agent_message_chunk")
		for _, want := range []string{`"first line"`, "23 bytes", "2 lines"} {
			if !strings.Contains(reply, want) {
				t.Errorf("reply %q lacks %q", reply, want)
			}
		}
	})

	t.Run("client error", func(t *testing.T) {
		c := startAgent(t, t.TempDir())
		c.initialize(true, false)
		sid := c.newSession("/workspace")
		notes, resp := c.until(c.prompt(sid, "read notes.txt"), func(m wireMsg) {
			var p struct{ Path string }
			decode(t, m.Params, &p)
			if p.Path != "/workspace/notes.txt" {
				t.Errorf("relative path resolved to %q", p.Path)
			}
			c.send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32002, "message": "no such file"}})
		})
		wantStop(t, resp, "end_turn")
		us := updates(t, notes)
		tcu := find(us, "tool_call_update")
		if len(tcu) == 0 || tcu[len(tcu)-1].Update.Status != "failed" {
			t.Errorf("tool_call_update = %+v", tcu)
		}
		if reply := text(us, "agent_message_chunk"); !strings.Contains(reply, "no such file") {
			t.Errorf("reply %q lacks the error", reply)
		}
	})

	t.Run("no capability", func(t *testing.T) {
		c := startAgent(t, t.TempDir())
		c.initialize(false, false)
		sid := c.newSession("/workspace")
		notes, resp := c.until(c.prompt(sid, "read /workspace/notes.txt"), nil)
		wantStop(t, resp, "end_turn")
		if reply := text(updates(t, notes), "agent_message_chunk"); !strings.Contains(reply, "does not allow file reads") {
			t.Errorf("reply = %q", reply)
		}
	})
}

// answerPermission returns an answer func that picks the given outcome for
// session/request_permission and records fs/write_text_file calls.
func answerPermission(t *testing.T, c *client, outcome map[string]string, writes *[]map[string]string) func(wireMsg) {
	return func(m wireMsg) {
		switch m.Method {
		case "session/request_permission":
			var p struct {
				ToolCall struct {
					ToolCallID, Kind, Status string
					Locations                []struct{ Path string }
				}
				Options []struct{ OptionID, Name, Kind string }
			}
			decode(t, m.Params, &p)
			if p.ToolCall.Kind == "edit" && (len(p.ToolCall.Locations) != 1 || !strings.HasPrefix(p.ToolCall.Locations[0].Path, "/")) {
				t.Errorf("a write's permission request names no location (the path a rule matches): %s", m.Params)
			}
			if p.ToolCall.ToolCallID == "" || p.ToolCall.Status != "pending" || len(p.Options) != 2 ||
				p.Options[0].OptionID != "allow" || p.Options[0].Kind != "allow_once" ||
				p.Options[1].OptionID != "reject" || p.Options[1].Kind != "reject_once" {
				t.Errorf("request_permission params %s", m.Params)
			}
			c.respond(m.ID, map[string]any{"outcome": outcome})
		case "fs/write_text_file":
			var p map[string]string
			decode(t, m.Params, &p)
			*writes = append(*writes, p)
			c.respond(m.ID, map[string]any{})
		default:
			t.Fatalf("unexpected request %s", m.raw)
		}
	}
}

func TestWritePrompt(t *testing.T) {
	allow := map[string]string{"outcome": "selected", "optionId": "allow"}
	reject := map[string]string{"outcome": "selected", "optionId": "reject"}
	cancelled := map[string]string{"outcome": "cancelled"}

	tests := []struct {
		name       string
		outcome    map[string]string
		wantStop   string
		wantReply  string
		wantStatus string
		wantWrites int
	}{
		{"allow", allow, "end_turn", "Wrote 11 bytes to /workspace/out.txt.", "completed", 1},
		{"reject", reject, "end_turn", "Permission denied.", "failed", 0},
		{"cancelled", cancelled, "cancelled", "", "failed", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startAgent(t, t.TempDir())
			c.initialize(true, true)
			sid := c.newSession("/workspace")
			var writes []map[string]string
			notes, resp := c.until(c.prompt(sid, "write /workspace/out.txt hello world"), answerPermission(t, c, tt.outcome, &writes))
			if got := stopReason(t, resp); got != tt.wantStop {
				t.Errorf("stopReason = %q, want %q", got, tt.wantStop)
			}
			if len(writes) != tt.wantWrites {
				t.Fatalf("fs/write_text_file calls: %v", writes)
			}
			if len(writes) == 1 && (writes[0]["path"] != "/workspace/out.txt" || writes[0]["content"] != "hello world" || writes[0]["sessionId"] != sid) {
				t.Errorf("fs/write_text_file params %v", writes[0])
			}
			us := updates(t, notes)
			if got := text(us, "agent_message_chunk"); got != tt.wantReply {
				t.Errorf("reply = %q, want %q", got, tt.wantReply)
			}
			calls := find(us, "tool_call")
			if len(calls) != 1 || calls[0].Update.Kind != "edit" || !strings.Contains(string(calls[0].Update.Content), `"type":"diff"`) {
				t.Errorf("tool_call = %+v", calls)
			}
			tcu := find(us, "tool_call_update")
			if len(tcu) == 0 || tcu[len(tcu)-1].Update.Status != tt.wantStatus {
				t.Errorf("last tool_call_update = %+v, want status %q", tcu, tt.wantStatus)
			}
		})
	}
}

func TestPermissionPrompt(t *testing.T) {
	for option, want := range map[string]string{"allow": "Permission granted (allow).", "reject": "Permission denied (reject)."} {
		t.Run(option, func(t *testing.T) {
			c, sid := startSession(t)
			notes, resp := c.until(c.prompt(sid, "ask me for permission"),
				answerPermission(t, c, map[string]string{"outcome": "selected", "optionId": option}, nil))
			wantStop(t, resp, "end_turn")
			us := updates(t, notes)
			if got := text(us, "agent_message_chunk"); got != want {
				t.Errorf("reply = %q, want %q", got, want)
			}
			if calls := find(us, "tool_call"); len(calls) != 1 || calls[0].Update.Kind != "execute" || calls[0].Update.Title != "Run a harmless command" {
				t.Errorf("tool_call = %+v", calls)
			}
		})
	}
}

func TestOtherKeywords(t *testing.T) {
	c, sid := startSession(t)

	t.Run("plan", func(t *testing.T) {
		notes, resp := c.until(c.prompt(sid, "make a plan"), nil)
		wantStop(t, resp, "end_turn")
		plans := find(updates(t, notes), "plan")
		if len(plans) != 4 {
			t.Fatalf("got %d plan updates, want 4", len(plans))
		}
		for i, p := range plans {
			if len(p.Update.Entries) != 3 {
				t.Fatalf("plan %d has %d entries", i, len(p.Update.Entries))
			}
			for j, e := range p.Update.Entries {
				want := "pending"
				if j < i {
					want = "completed"
				}
				if e.Status != want || e.Priority != "medium" || e.Content == "" {
					t.Errorf("plan %d entry %d = %+v, want status %s", i, j, e, want)
				}
			}
		}
	})

	t.Run("think", func(t *testing.T) {
		notes, _ := c.until(c.prompt(sid, "think about it"), nil)
		us := updates(t, notes)
		if len(find(us, "agent_thought_chunk")) < 2 {
			t.Errorf("want a few thought chunks, got %+v", us)
		}
		if us[0].Update.SessionUpdate != "agent_thought_chunk" || text(us, "agent_message_chunk") == "" {
			t.Errorf("want thoughts before the reply: %+v", us)
		}
	})

	t.Run("markdown", func(t *testing.T) {
		notes, _ := c.until(c.prompt(sid, "show me some markdown"), nil)
		reply := text(updates(t, notes), "agent_message_chunk")
		for _, want := range []string{"# ", "\n- ", "```", "**"} {
			if !strings.Contains(reply, want) {
				t.Errorf("markdown reply lacks %q: %q", want, reply)
			}
		}
	})

	t.Run("embedded resources", func(t *testing.T) {
		id := c.request("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{
			map[string]string{"type": "text", "text": "look at "},
			map[string]string{"type": "resource_link", "uri": "file:///w/a.go", "name": "a.go"},
			map[string]any{"type": "resource", "resource": map[string]string{"uri": "file:///w/b.go", "text": "package b"}},
		}})
		notes, _ := c.until(id, nil)
		want := "You said: look at  (attached: file:///w/a.go, file:///w/b.go)"
		if got := text(updates(t, notes), "agent_message_chunk"); got != want {
			t.Errorf("reply = %q, want %q", got, want)
		}
	})

	t.Run("image refused", func(t *testing.T) {
		resp := c.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{
			map[string]string{"type": "image", "data": "AAAA", "mimeType": "image/png"},
		}})
		mustError(t, resp, codeInvalidParams)
	})
}

// waitChunk reads notifications until an agent_message_chunk arrives.
func waitChunk(t *testing.T, c *client) {
	t.Helper()
	for {
		m := c.next()
		if m.Method != "session/update" {
			t.Fatalf("unexpected message %s", m.raw)
		}
		var u update
		decode(t, m.Params, &u)
		if u.Update.SessionUpdate == "agent_message_chunk" {
			return
		}
	}
}

func TestSlowPromptCancel(t *testing.T) {
	dir := t.TempDir()
	c := startAgent(t, dir)
	c.initialize(false, false)
	sid := c.newSession("/w")
	id := c.prompt(sid, "be slow please")
	waitChunk(t, c)
	c.notify("session/cancel", map[string]string{"sessionId": sid})
	_, resp := c.until(id, nil)
	wantStop(t, resp, "cancelled")

	// The partial reply is in the history, and the session takes new prompts.
	f, err := store{dir: dir}.load(sid)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.History) != 2 || !strings.HasPrefix(f.History[1].Text, "tick 1 ") {
		t.Errorf("history = %+v", f.History)
	}
	_, resp = c.until(c.prompt(sid, "hi"), nil)
	if got := stopReason(t, resp); got != "end_turn" {
		t.Errorf("stopReason after cancel = %q", got)
	}
}

func TestCancelRequestForPrompt(t *testing.T) {
	c, sid := startSession(t)
	id := c.prompt(sid, "a long story")
	waitChunk(t, c)
	c.notify("$/cancel_request", map[string]int{"requestId": id})
	_, resp := c.until(id, nil)
	wantStop(t, resp, "cancelled")
}

func TestCancelWhileWaitingForClient(t *testing.T) {
	c, sid := startSession(t)
	id := c.prompt(sid, "permission please")

	var req wireMsg
	for req.Method != "session/request_permission" {
		req = c.next()
	}
	c.notify("session/cancel", map[string]string{"sessionId": sid})

	sawCancel := false
	for {
		m := c.next()
		if m.Method == "$/cancel_request" {
			var p struct{ RequestID json.RawMessage }
			decode(t, m.Params, &p)
			if string(p.RequestID) != string(req.ID) {
				t.Errorf("$/cancel_request for %s, want %s", p.RequestID, req.ID)
			}
			sawCancel = true
			continue
		}
		if m.Method == "" {
			if string(m.ID) != jsonInt(id) {
				t.Fatalf("unexpected response %s", m.raw)
			}
			wantStop(t, m, "cancelled")
			break
		}
	}
	if !sawCancel {
		t.Error("agent did not send $/cancel_request for its pending request")
	}

	// The late answer is ignored, and the session is free again.
	c.respond(req.ID, map[string]any{"outcome": map[string]string{"outcome": "cancelled"}})
	_, resp := c.until(c.prompt(sid, "hello"), nil)
	wantStop(t, resp, "end_turn")
}

func TestPromptWhileRunning(t *testing.T) {
	c, sid := startSession(t)
	first := c.prompt(sid, "slow")
	waitChunk(t, c)

	second := c.prompt(sid, "hello")
	for {
		m := c.next()
		if m.Method == "" {
			if string(m.ID) != jsonInt(second) {
				t.Fatalf("unexpected response %s", m.raw)
			}
			mustError(t, m, codeInvalidRequest)
			if m.Error.Message != "a prompt is already running" {
				t.Errorf("message = %q", m.Error.Message)
			}
			break
		}
	}
	c.notify("session/cancel", map[string]string{"sessionId": sid})
	_, resp := c.until(first, nil)
	wantStop(t, resp, "cancelled")
}

func TestCloseCancelsPrompt(t *testing.T) {
	c, sid := startSession(t)
	id := c.prompt(sid, "slow")
	waitChunk(t, c)

	closeID := c.request("session/close", map[string]string{"sessionId": sid})
	_, resp := c.until(id, nil) // the prompt answers first
	wantStop(t, resp, "cancelled")
	_, resp = c.until(closeID, nil)
	if got := string(mustResult(t, resp)); got != "{}" {
		t.Errorf("close result = %s", got)
	}
	mustError(t, c.call("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{}}), codeResourceMissing)
	// The file stays, so the session can be resumed.
	mustResult(t, c.call("session/resume", map[string]any{"sessionId": sid, "cwd": "/w"}))
}

func TestLoadInNewRun(t *testing.T) {
	dir := t.TempDir()
	c1 := startAgent(t, dir)
	c1.initialize(false, false)
	sid := c1.newSession("/w")
	c1.until(c1.prompt(sid, "hello"), nil)
	c1.until(c1.prompt(sid, "second"), nil)
	c1.in.Close()
	<-c1.runDone
	if c1.runErr != nil {
		t.Fatalf("first Run: %v", c1.runErr)
	}

	c2 := startAgent(t, dir)
	c2.initialize(false, false)
	notes, resp := c2.until(c2.request("session/load", map[string]any{"sessionId": sid, "cwd": "/w", "mcpServers": []any{}}), nil)
	if got := string(mustResult(t, resp)); got != "{}" {
		t.Errorf("load result = %s", got)
	}
	want := []struct{ kind, text string }{
		{"user_message_chunk", "hello"},
		{"agent_message_chunk", "You said: hello"},
		{"user_message_chunk", "second"},
		{"agent_message_chunk", "You said: second"},
	}
	us := updates(t, notes)
	if len(us) != len(want) {
		t.Fatalf("replayed %d updates, want %d: %+v", len(us), len(want), us)
	}
	for i, w := range want {
		if us[i].SessionID != sid || us[i].Update.SessionUpdate != w.kind || us[i].text() != w.text {
			t.Errorf("replay[%d] = %s %q, want %s %q", i, us[i].Update.SessionUpdate, us[i].text(), w.kind, w.text)
		}
	}

	// The loaded session takes prompts, and resume does not replay.
	_, resp = c2.until(c2.prompt(sid, "third"), nil)
	wantStop(t, resp, "end_turn")
	c3 := startAgent(t, dir)
	c3.initialize(false, false)
	notes, resp = c3.until(c3.request("session/resume", map[string]any{"sessionId": sid, "cwd": "/w"}), nil)
	mustResult(t, resp)
	if len(notes) != 0 {
		t.Errorf("resume sent %d notifications", len(notes))
	}
	_, resp = c3.until(c3.prompt(sid, "fourth"), nil)
	wantStop(t, resp, "end_turn")
}

func TestListSessions(t *testing.T) {
	c := startAgent(t, t.TempDir())
	c.initialize(false, false)
	a := c.newSession("/a")
	time.Sleep(2 * time.Millisecond)
	b := c.newSession("/b")
	time.Sleep(2 * time.Millisecond)
	a2 := c.newSession("/a")
	time.Sleep(2 * time.Millisecond)
	c.until(c.prompt(a, "first session prompt, more than forty characters in all"), nil)

	type info struct{ SessionID, Cwd, Title, UpdatedAt string }
	list := func(params any) []info {
		t.Helper()
		var r struct {
			Sessions   []info
			NextCursor *string
		}
		decode(t, mustResult(t, c.call("session/list", params)), &r)
		if r.NextCursor != nil {
			t.Errorf("nextCursor = %q", *r.NextCursor)
		}
		return r.Sessions
	}
	ids := func(l []info) []string {
		var out []string
		for _, s := range l {
			out = append(out, s.SessionID)
		}
		return out
	}

	all := list(map[string]any{})
	if got, want := strings.Join(ids(all), ","), strings.Join([]string{a, a2, b}, ","); got != want {
		t.Errorf("list = %s, want %s (newest first)", got, want)
	}
	if all[0].Title != "first session prompt, more than forty ch" || all[0].Cwd != "/a" || all[0].UpdatedAt == "" {
		t.Errorf("first entry = %+v", all[0])
	}
	if got, want := strings.Join(ids(list(map[string]any{"cwd": "/a"})), ","), a+","+a2; got != want {
		t.Errorf("list cwd=/a = %s, want %s", got, want)
	}
	if l := list(map[string]any{"cwd": "/nowhere"}); len(l) != 0 {
		t.Errorf("list cwd=/nowhere = %+v", l)
	}
	if l := list(nil); len(l) != 3 {
		t.Errorf("list without params = %d sessions", len(l))
	}
}

func TestUnknownSession(t *testing.T) {
	c := startAgent(t, t.TempDir())
	c.initialize(false, false)
	for _, id := range []string{"demo-0000000000000000", "../../etc/passwd"} {
		for _, method := range []string{"session/prompt", "session/load", "session/resume", "session/close"} {
			resp := c.call(method, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}, "prompt": []any{}})
			mustError(t, resp, codeResourceMissing)
			var data struct{ SessionID string }
			decode(t, resp.Error.Data, &data)
			if resp.Error.Message != "session not found" || data.SessionID != id {
				t.Errorf("%s: error = %s", method, resp.raw)
			}
		}
	}
	c.notify("session/cancel", map[string]string{"sessionId": "demo-0000000000000000"})
	mustResult(t, c.call("_demo/echo", nil)) // no response came for the notification
}

func TestMalformedInput(t *testing.T) {
	c := startAgent(t, t.TempDir())
	c.sendRaw(`{"jsonrpc":"2.0","id":1,"method":`)
	m := c.next()
	mustError(t, m, codeParseError)
	if string(m.ID) != "null" {
		t.Errorf("parse error id = %s", m.ID)
	}
	c.sendRaw(`[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`)
	mustError(t, c.next(), codeInvalidRequest)
	c.sendRaw(`{"jsonrpc":"2.0","id":{},"method":"initialize"}`)
	mustError(t, c.next(), codeInvalidRequest)
	c.sendRaw("") // blank lines are skipped

	c.initialize(false, false)
	mustError(t, c.call("session/new", map[string]any{"cwd": "relative/dir", "mcpServers": []any{}}), codeInvalidParams)
	mustError(t, c.call("session/new", map[string]any{"cwd": "/w", "mcpServers": []any{map[string]string{"type": "sse", "name": "x", "url": "http://x"}}}), codeInvalidParams)
	mustError(t, c.call("session/prompt", nil), codeInvalidParams)
}

func TestMethods(t *testing.T) {
	c := startAgent(t, t.TempDir())
	c.initialize(false, false)

	resp := c.call("foo/bar", map[string]any{})
	mustError(t, resp, codeMethodNotFound)
	if resp.Error.Message != "method not found: foo/bar" {
		t.Errorf("message = %q", resp.Error.Message)
	}
	mustError(t, c.call("_vendor/thing", map[string]any{}), codeMethodNotFound)
	c.notify("foo/bar", map[string]any{}) // no response
	c.notify("_vendor/note", map[string]any{})

	params := `{"a":[1,2.5,{"b":null}],"s":"x\ny"}`
	c.sendRaw(`{"jsonrpc":"2.0","id":"echo-1","method":"_demo/echo","params":` + params + `}`)
	m := c.next()
	if string(m.ID) != `"echo-1"` || string(m.Result) != params {
		t.Errorf("_demo/echo = %s", m.raw)
	}
}

func TestRunStopsOnContextCancel(t *testing.T) {
	c, sid := startSession(t)
	c.prompt(sid, "slow")
	waitChunk(t, c)
	c.cancel()
	select {
	case <-c.runDone:
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after ctx was cancelled")
	}
	if !errors.Is(c.runErr, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", c.runErr)
	}
}

// TestRunStopsWhenBlocked cancels Run while its Write is stuck (the client
// does not read) and its Read cannot be interrupted (the reader has no Close).
func TestRunStopsWhenBlocked(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, struct{ io.Reader }{inR}, outW, Options{StateDir: t.TempDir(), ChunkDelay: -1})
	}()
	// The answer to this request cannot be written: nobody reads outR.
	if _, err := io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`+"\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return")
	}
	// Unblock the stuck calls, so their goroutines end before goleak looks.
	outR.Close()
	inW.Close()
}

func TestReadLineLimit(t *testing.T) {
	// A line over the limit is skipped, and reading goes on.
	const limit = 100
	input := strings.Repeat("x", limit) + "\n" + strings.Repeat("y", limit+1) + "\n{}\nlast"
	r := bufio.NewReaderSize(strings.NewReader(input), 16)
	if line, err := readLine(r, limit); err != nil || len(line) != limit {
		t.Fatalf("line at the limit: got %d bytes, %v", len(line), err)
	}
	if _, err := readLine(r, limit); !errors.Is(err, errLineTooLong) {
		t.Fatalf("err = %v, want errLineTooLong", err)
	}
	if line, err := readLine(r, limit); err != nil || string(line) != "{}" {
		t.Fatalf("got %q, %v", line, err)
	}
	if line, err := readLine(r, limit); !errors.Is(err, io.EOF) || string(line) != "last" {
		t.Fatalf("got %q, %v", line, err)
	}
}
