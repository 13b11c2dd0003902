package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/acpgate/acpgate/test/internal/proctree"
)

const turn = 20 * time.Second

func TestHandshake(t *testing.T) {
	g := startGateway(t, gwOpts{})
	c := dial(t, g)
	if id, err := uuid.Parse(c.ConnID); err != nil || id.Version() != 4 || id.String() != c.ConnID {
		t.Fatalf("101 response's Acp-Connection-Id %q is not a version 4 UUID in canonical form", c.ConnID)
	}
	if c.WS.Subprotocol() != "acp" {
		t.Fatalf("subprotocol %q, want acp", c.WS.Subprotocol())
	}
	// Anything before initialize is refused, and the connection lives on.
	m := c.Call("session/new", map[string]any{"cwd": "/tmp", "mcpServers": []any{}}, turn)
	if m.Error == nil || m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "initialize") {
		t.Fatalf("request before initialize: %s", m.Raw)
	}
	// The client asks for a version the agent does not speak: it gets the
	// agent's.
	m = c.Call("initialize", map[string]any{"protocolVersion": 7, "clientCapabilities": map[string]any{}}, turn)
	var res struct {
		ProtocolVersion int `json:"protocolVersion"`
		AgentInfo       struct {
			Name string `json:"name"`
		} `json:"agentInfo"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil || res.ProtocolVersion != 1 || res.AgentInfo.Name != "acpgate-demo-agent" {
		t.Fatalf("initialize result: %s", m.Raw)
	}
	m = c.Call("initialize", map[string]any{"protocolVersion": 1}, turn)
	if m.Error == nil || m.Error.Code != -32600 {
		t.Fatalf("second initialize: %s", m.Raw)
	}
}

func TestPromptTurnStreams(t *testing.T) {
	g := startGateway(t, gwOpts{})
	cwd := t.TempDir()
	c, sid := dialSession(t, g, cwd)
	if strings.HasPrefix(sid, "demo-") {
		t.Fatalf("the client sees the agent's own session ID %q", sid)
	}
	var chunks int
	onUpdate, text := collectText(t, sid)
	m := c.Await(c.Request("session/prompt", textPrompt(sid, "hello gateway, stream this back")), turn, func(m rpcMsg) {
		onUpdate(m)
		if parseUpdate(t, m).Update.Kind == "agent_message_chunk" {
			chunks++
		}
	})
	if r := stopReason(t, m); r != "end_turn" {
		t.Fatalf("stopReason %q", r)
	}
	if got, want := text.String(), "You said: hello gateway, stream this back"; got != want {
		t.Fatalf("streamed text %q, want %q", got, want)
	}
	if chunks < 3 {
		t.Fatalf("the reply came in %d chunks; want it streamed", chunks)
	}
}

func TestFsReadRequest(t *testing.T) {
	g := startGateway(t, gwOpts{})
	cwd := t.TempDir()
	c, sid := dialSession(t, g, cwd)
	path := filepath.Join(cwd, "notes.txt")
	var asked bool
	onUpdate, text := collectText(t, sid)
	m := c.Await(c.Request("session/prompt", textPrompt(sid, "read "+path)), turn, func(m rpcMsg) {
		if m.Method == "fs/read_text_file" {
			if m.Param("sessionId") != sid || m.Param("path") != path {
				t.Fatalf("fs/read_text_file names the wrong session or path: %s", m.Raw)
			}
			asked = true
			c.Respond(m.ID, map[string]string{"content": "the first line\nthe second line\n"})
			return
		}
		onUpdate(m)
	})
	if r := stopReason(t, m); r != "end_turn" || !asked {
		t.Fatalf("stopReason %q, asked %v", r, asked)
	}
	if !strings.Contains(text.String(), "the first line") {
		t.Fatalf("the agent did not use the file content: %q", text.String())
	}
}

func TestPermissionRequest(t *testing.T) {
	g := startGateway(t, gwOpts{})
	cwd := t.TempDir()
	c, sid := dialSession(t, g, cwd)
	for _, choice := range []string{"allow", "reject"} {
		t.Run(choice, func(t *testing.T) {
			path := filepath.Join(cwd, choice+".txt")
			var permitted, wrote bool
			onUpdate, text := collectText(t, sid)
			m := c.Await(c.Request("session/prompt", textPrompt(sid, "write "+path+" hello file")), turn, func(m rpcMsg) {
				switch m.Method {
				case "session/request_permission":
					if m.Param("sessionId") != sid {
						t.Fatalf("permission request for the wrong session: %s", m.Raw)
					}
					permitted = true
					c.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": choice}})
				case "fs/write_text_file":
					wrote = true
					if m.Param("path") != path || !strings.Contains(m.Param("content"), "hello file") {
						t.Fatalf("write request: %s", m.Raw)
					}
					c.Respond(m.ID, map[string]any{})
				default:
					onUpdate(m)
				}
			})
			if r := stopReason(t, m); r != "end_turn" || !permitted {
				t.Fatalf("stopReason %q, permission asked %v", r, permitted)
			}
			if choice == "allow" && (!wrote || !strings.Contains(text.String(), "Wrote")) {
				t.Fatalf("allowed, but wrote=%v reply=%q", wrote, text.String())
			}
			if choice == "reject" && (wrote || !strings.Contains(text.String(), "Permission denied")) {
				t.Fatalf("rejected, but wrote=%v reply=%q", wrote, text.String())
			}
		})
	}
}

func TestCancel(t *testing.T) {
	g := startGateway(t, gwOpts{})
	c, sid := dialSession(t, g, t.TempDir())
	id := c.Request("session/prompt", textPrompt(sid, "a slow one please"))
	ticks := 0
	var cancelledAt time.Time
	m := c.Await(id, turn, func(m rpcMsg) {
		if parseUpdate(t, m).Update.Kind == "agent_message_chunk" {
			ticks++
		}
		if ticks == 2 && cancelledAt.IsZero() {
			cancelledAt = time.Now()
			c.Notify("session/cancel", map[string]string{"sessionId": sid})
		}
	})
	if r := stopReason(t, m); r != "cancelled" {
		t.Fatalf("stopReason %q, want cancelled", r)
	}
	if d := time.Since(cancelledAt); d > 2*time.Second {
		t.Fatalf("cancel took %s", d)
	}
	// $/cancel_request on the prompt's request id works too: the gateway
	// translates the id.
	id = c.Request("session/prompt", textPrompt(sid, "another long one"))
	ticks = 0
	m = c.Await(id, turn, func(m rpcMsg) {
		ticks++
		if ticks == 2 {
			c.Notify("$/cancel_request", map[string]int{"requestId": id})
		}
	})
	if r := stopReason(t, m); r != "cancelled" {
		t.Fatalf("after $/cancel_request: stopReason %q", r)
	}
}

func TestSessionLoadReplaysHistory(t *testing.T) {
	g := startGateway(t, gwOpts{})
	cwd := t.TempDir()
	a, sid := dialSession(t, g, cwd)
	m := a.Call("session/prompt", textPrompt(sid, "remember me"), turn)
	if stopReason(t, m) != "end_turn" {
		t.Fatal(string(m.Raw))
	}
	a.Close()

	b := dialInit(t, g)
	// An ID that the gateway never issued is not found.
	m = b.Call("session/load", map[string]any{"sessionId": "bogus", "cwd": cwd, "mcpServers": []any{}}, turn)
	if m.Error == nil || m.Error.Code != -32002 {
		t.Fatalf("load of a bogus session: %s", m.Raw)
	}
	var kinds []string
	var replay strings.Builder
	m = b.Await(b.Request("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}}), turn, func(m rpcMsg) {
		u := parseUpdate(t, m)
		if u.SessionID != sid {
			t.Fatalf("replayed update names session %q, want %q", u.SessionID, sid)
		}
		kinds = append(kinds, u.Update.Kind)
		replay.WriteString(u.text())
	})
	if m.Error != nil {
		t.Fatalf("session/load: %s", m.Raw)
	}
	if len(kinds) == 0 || kinds[0] != "user_message_chunk" || !strings.Contains(replay.String(), "remember me") ||
		!strings.Contains(replay.String(), "You said: remember me") {
		t.Fatalf("replay before the response: kinds %v, text %q", kinds, replay.String())
	}
	// The loaded session is usable.
	m = b.Call("session/prompt", textPrompt(sid, "again"), turn)
	if stopReason(t, m) != "end_turn" {
		t.Fatal(string(m.Raw))
	}
}

func TestTwoClientsShareOneAgentWithoutCrossTalk(t *testing.T) {
	g := startGateway(t, gwOpts{config: "pool: {min_idle: 1, max_processes: 1, max_sessions_per_process: 8}\n"})
	clients := []*client{dial(t, g), dial(t, g)}
	sids := make([]string, 2)
	for i, c := range clients {
		c.initialize()
		sids[i] = c.newSession(t.TempDir())
	}
	if pids := g.agentPIDs(); len(pids) != 1 {
		t.Fatalf("want both clients on one agent process, have %v", pids)
	}
	// Client 1 cannot touch client 0's session.
	m := clients[1].Call("session/prompt", textPrompt(sids[0], "hijack"), turn)
	if m.Error == nil || m.Error.Code != -32002 {
		t.Fatalf("prompt on another client's session: %s", m.Raw)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 3; round++ {
				want := fmt.Sprintf("client %d round %d", i, round)
				id := c.Request("session/prompt", textPrompt(sids[i], want))
				var got strings.Builder
				for {
					m, ok := <-c.In
					if !ok {
						errs <- fmt.Errorf("client %d: connection closed", i)
						return
					}
					if m.IsResponseTo(id) {
						break
					}
					var u update
					_ = json.Unmarshal(m.Params, &u)
					if u.SessionID != sids[i] {
						errs <- fmt.Errorf("client %d got an update for %q: %s", i, u.SessionID, m.Raw)
						return
					}
					got.WriteString(u.text())
				}
				if got.String() != "You said: "+want {
					errs <- fmt.Errorf("client %d: %q", i, got.String())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A client that leaves does not take the process with it.
	pid := g.agentPIDs()
	clients[0].Close()
	c := dialInit(t, g)
	c.newSession(t.TempDir())
	if now := g.agentPIDs(); len(now) != 1 || now[0] != pid[0] {
		t.Fatalf("agent process changed after a client left: %v -> %v", pid, now)
	}
}

func TestAgentKilledMidPrompt(t *testing.T) {
	g := startGateway(t, gwOpts{config: "pool: {min_idle: 1, max_processes: 2}\n"})
	cwd := t.TempDir()
	c, sid := dialSession(t, g, cwd)
	other := dial(t, g) // a bystander with no session on the dying process
	other.initialize()

	id := c.Request("session/prompt", textPrompt(sid, "slow please"))
	var killedAt time.Time
	m := c.Await(id, turn, func(m rpcMsg) {
		if killedAt.IsZero() {
			pids := g.agentPIDs()
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			killedAt = time.Now()
		}
	})
	if m.Error == nil || !strings.Contains(m.Error.Message, "agent process exited") {
		t.Fatalf("in-flight prompt after the agent died: %s", m.Raw)
	}
	if d := time.Since(killedAt); d > time.Second {
		t.Fatalf("the error took %s, want under a second", d)
	}
	m = c.Call("session/prompt", textPrompt(sid, "hello?"), turn)
	if m.Error == nil || m.Error.Code != -32002 || !strings.Contains(m.Error.Message, "load the session again") {
		t.Fatalf("prompt on a session of a dead agent: %s", m.Raw)
	}
	// The kill may also have hit the pool's spare while it started; the
	// pool then backs off (100 ms, doubling) and says "try again
	// shortly", as a client is told to do.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m = c.Await(c.Request("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}}), turn, func(rpcMsg) {})
		if m.Error == nil || !strings.Contains(m.Error.Message, "try again shortly") || time.Now().After(deadline) {
			break
		}
	}
	if m.Error != nil {
		t.Fatalf("reload after the agent died: %s", m.Raw)
	}
	m = c.Call("session/prompt", textPrompt(sid, "back again"), turn)
	if stopReason(t, m) != "end_turn" {
		t.Fatalf("prompt after reload: %s", m.Raw)
	}
	other.newSession(t.TempDir()) // the bystander was unaffected
}

func TestClientKilledMidPermissionRequest(t *testing.T) {
	// The killed client's connection detaches; when no resume comes within
	// detach_timeout it ends, and its pending request is answered for it.
	g := startGateway(t, gwOpts{config: "pool: {min_idle: 1, max_processes: 1}\nsessions: {detach_timeout: 1s}\n"})
	cwd := t.TempDir()
	a, sid := dialSession(t, g, cwd)
	id := a.Request("session/prompt", textPrompt(sid, "ask my permission"))
	for {
		m := a.Next(turn)
		if m.Method == "session/request_permission" {
			break
		}
		if m.IsResponseTo(id) {
			t.Fatalf("prompt ended before asking: %s", m.Raw)
		}
	}
	a.Kill()
	// The gateway answers the permission request in the client's place
	// (cancelled), which ends the agent's turn.
	g.WaitLog(t, "answered an agent request for a disconnected client", "method", "session/request_permission", 10*time.Second)

	b := dialInit(t, g)
	m := b.Await(b.Request("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}}), turn, func(rpcMsg) {})
	if m.Error != nil {
		t.Fatalf("load: %s", m.Raw)
	}
	// Had the agent's turn been left waiting, this prompt would be refused
	// as "a prompt is already running".
	m = b.Call("session/prompt", textPrompt(sid, "hello"), turn)
	if stopReason(t, m) != "end_turn" {
		t.Fatalf("prompt after the other client died: %s", m.Raw)
	}
}

func TestMalformedInput(t *testing.T) {
	g := startGateway(t, gwOpts{})
	c, sid := dialSession(t, g, t.TempDir())
	cases := []struct {
		name, frame string
		code        int
		id          string
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":1,"method":`, -32700, "null"},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"_x\",\"params\":{\"a\":\"\xff\"}}", -32700, "null"},
		{"duplicate sessionId", `{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"` + sid + `","sessionId":"x","prompt":[]}}`, -32700, "null"},
		{"batch", `[{"jsonrpc":"2.0","id":4,"method":"session/list"}]`, -32600, "null"},
		{"not an object", `"hello"`, -32600, "null"},
		{"no method", `{"jsonrpc":"2.0","id":5}`, -32600, "5"},
		{"wrong version", `{"jsonrpc":"1.0","id":6,"method":"session/list"}`, -32600, "6"},
		{"unknown session", `{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"nope","prompt":[]}}`, -32002, "7"},
		{"sessionId not a string", `{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{"sessionId":42,"prompt":[]}}`, -32602, "8"},
		{"trailing data", `{"jsonrpc":"2.0","id":9,"method":"session/list"} {}`, -32700, "null"},
		// Escaped member names are the same names to every peer: the
		// session ID inside is translated (and so not found), never
		// forwarded raw.
		{"escaped params name", `{"jsonrpc":"2.0","id":11,"method":"session/prompt","\u0070arams":{"sessionId":"demo-0000000000000000","prompt":[]}}`, -32002, "11"},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"session/list"}`, -32600, "null"},
	}
	for _, tc := range cases {
		c.SendRaw(tc.frame)
		m := c.Next(turn)
		if m.Error == nil || m.Error.Code != tc.code || string(m.ID) != tc.id {
			t.Errorf("%s: got %s, want code %d id %s", tc.name, m.Raw, tc.code, tc.id)
		}
	}
	if err := c.WS.Write(c.Ctx(), websocket.MessageBinary, []byte(`{"jsonrpc":"2.0","id":10,"method":"session/list"}`)); err != nil {
		t.Fatal(err)
	}
	// A binary frame is taken as text (use-acp sends its ndjson that way).
	if m := c.Next(turn); m.Error != nil || string(m.ID) != "10" {
		t.Errorf("session/list in a binary frame: %s", m.Raw)
	}
	// The connection lives on.
	m := c.Call("session/prompt", textPrompt(sid, "still here"), turn)
	if stopReason(t, m) != "end_turn" {
		t.Fatal(string(m.Raw))
	}
}

func TestOversizedFrameClosesWith1009(t *testing.T) {
	g := startGateway(t, gwOpts{config: "limits: {max_message_bytes: 65536, send_queue_bytes: 1048576}\n"})
	c := dialInit(t, g)
	bystander := dialInit(t, g)
	big := `{"jsonrpc":"2.0","id":99,"method":"_x","params":{"pad":"` + strings.Repeat("a", 100000) + `"}}`
	_ = c.WS.Write(c.Ctx(), websocket.MessageText, []byte(big))
	for range c.In {
	}
	if st := websocket.CloseStatus(c.Err()); st != websocket.StatusMessageTooBig {
		t.Fatalf("close status %v (%v), want 1009", st, c.Err())
	}
	bystander.newSession(t.TempDir())
}

func TestNoAgentOutlivesGateway(t *testing.T) {
	// The test process adopts orphans so that what a dead gateway leaves
	// behind is seen (and reaped) here rather than by init.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, 36 /* PR_SET_CHILD_SUBREAPER */, 1, 0); errno != 0 {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	// An "agent" that ignores SIGTERM (so do its children) and leaves a
	// grandchild in its own session, outside the agent's process group. It
	// never answers initialize, so it only tests process cleanup.
	stubborn := `trap '' TERM; setsid sleep 600 & while :; do sleep 1; done`
	for _, tc := range []struct {
		name     string
		sig      syscall.Signal
		stubborn bool
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"SIGTERM stubborn agent", syscall.SIGTERM, true},
		{"SIGKILL stubborn agent", syscall.SIGKILL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := "pool: {min_idle: 2, max_processes: 3}\nagent: {stop_grace: 1s}\nshutdown_grace: 1s\n"
			if tc.stubborn {
				cfg = "pool: {min_idle: 2, max_processes: 3}\nshutdown_grace: 1s\n" +
					"agent: {stop_grace: 1s, command: [/bin/sh, -c, \"" + stubborn + "\"]}\n"
			}
			g := startGateway(t, gwOpts{config: cfg})
			if !tc.stubborn {
				c, sid := dialSession(t, g, t.TempDir())
				c.Request("session/prompt", textPrompt(sid, "slow"))
				c.Next(turn) // the prompt is running
			}
			var procs map[int]string
			deadline := time.Now().Add(10 * time.Second)
			for {
				procs = proctree.Descendants(g.Cmd.Process.Pid)
				n := 0
				for _, cmd := range procs {
					if strings.Contains(cmd, "supervise") {
						n++
					}
				}
				// Each supervisor and the agent it starts (a busy machine
				// may see a supervisor before its agent).
				if (n >= 2 && len(procs) >= 4 && (!tc.stubborn || countPrefix(procs, "sleep 600") >= 2)) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if len(procs) < 4 {
				t.Fatalf("want at least 2 supervised agents, have %v", procs)
			}
			if tc.stubborn && countPrefix(procs, "sleep 600") < 2 {
				t.Fatalf("the stubborn agent's grandchild is missing: %v", procs)
			}
			stopAndWaitGone(t, g, tc.sig, procs, 10*time.Second)
		})
	}
}

// countPrefix counts the processes whose command line starts with prefix.
func countPrefix(procs map[int]string, prefix string) int {
	n := 0
	for _, cmd := range procs {
		if strings.HasPrefix(cmd, prefix) {
			n++
		}
	}
	return n
}

// TestGatewayAsPID1: in a container the gateway is PID 1, so its agents'
// supervisors see parent PID 1. They must start all the same (they used to
// take that for a dead gateway and refuse).
func TestGatewayAsPID1(t *testing.T) {
	if err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").Run(); err != nil {
		t.Skipf("cannot make a PID namespace here (unshare: %v)", err)
	}
	g := startGateway(t, gwOpts{wrap: []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"}})
	// unshare ignores SIGTERM while it waits: stop the gateway itself (the
	// harness's cleanup then finds unshare exiting).
	t.Cleanup(func() {
		for pid, cmd := range proctree.Descendants(g.Cmd.Process.Pid) {
			if strings.Contains(cmd, " serve ") {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		select {
		case <-g.Done():
		case <-time.After(15 * time.Second):
			t.Error("the gateway did not stop on SIGTERM as PID 1")
		}
	})
	c, sid := dialSession(t, g, t.TempDir())
	if m := c.Call("session/prompt", textPrompt(sid, "hello from pid 1"), turn); stopReason(t, m) != "end_turn" {
		t.Fatalf("prompt: %s", m.Raw)
	}
}

// stopAndWaitGone signals the gateway, checks a SIGTERM exits 0, then waits
// up to timeout for every process of procs (pid → command) to be gone,
// reaping the orphans it adopted; what is left is killed and reported.
func stopAndWaitGone(t *testing.T, g *gateway, sig syscall.Signal, procs map[int]string, timeout time.Duration) {
	t.Helper()
	g.Stop(sig)
	if sig == syscall.SIGTERM {
		var ee interface{ ExitCode() int }
		if g.ExitErr() != nil && (!errors.As(g.ExitErr(), &ee) || ee.ExitCode() != 0) {
			t.Fatalf("gateway exit after SIGTERM: %v", g.ExitErr())
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for pid, cmd := range procs {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil) // reap adopted orphans
			if proctree.Alive(pid) {
				left = append(left, fmt.Sprintf("%d %s", pid, cmd))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for pid := range procs {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("processes outlived the gateway (%v): %v", sig, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
