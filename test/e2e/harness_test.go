// Package e2e drives the real acpgate binary, with real agent subprocesses,
// through a real WebSocket client.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/test/internal/gwlog"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "acpgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "acpgate")
	if bin := os.Getenv("ACPGATE_E2E_BIN"); bin != "" {
		// A prebuilt gateway (e.g. an older build to compare against):
		// no build.
		if binPath, err = filepath.Abs(bin); err != nil {
			fmt.Fprintln(os.Stderr, "ACPGATE_E2E_BIN:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "e2e: using the prebuilt gateway", binPath)
	} else {
		build := exec.Command("go", "build", "-race", "-o", binPath, "github.com/acpgate/acpgate/cmd/acpgate")
		if os.Getenv("ACPGATE_E2E_NORACE") != "" {
			build = exec.Command("go", "build", "-o", binPath, "github.com/acpgate/acpgate/cmd/acpgate")
		}
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build acpgate:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// gateway is one running acpgate process.
type gateway struct {
	t        *testing.T
	cmd      *exec.Cmd
	addr     string
	stateDir string
	done     chan struct{}
	exitErr  error

	mu   sync.Mutex
	logs []map[string]any
}

type gwOpts struct {
	config   string   // YAML; "" = flags only
	args     []string // extra flags
	stateDir string   // the demo agent's state dir; "" = a fresh one
	wrap     []string // argv prefix to run the binary under (e.g. unshare)
	env      []string // extra environment ("K=V")
}

func startGateway(t *testing.T, o gwOpts) *gateway {
	t.Helper()
	g := &gateway{t: t, stateDir: o.stateDir, done: make(chan struct{})}
	if g.stateDir == "" {
		g.stateDir = t.TempDir()
	}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}
	if o.config != "" {
		path := filepath.Join(t.TempDir(), "acpgate.yaml")
		if err := os.WriteFile(path, []byte(o.config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	args = append(args, o.args...)
	argv := append(append([]string(nil), o.wrap...), binPath)
	g.cmd = exec.Command(argv[0], append(argv[1:], args...)...)
	// With tenants the sandbox is on: each tenant's agents get a private
	// home under the state dir (which restart tests share), where the demo
	// agent keeps its sessions.
	g.cmd.Env = append(gatewayEnv(), "ACPGATE_DEMO_STATE_DIR="+g.stateDir, "ACPGATE_SANDBOX_HOME="+filepath.Join(g.stateDir, "homes"))
	g.cmd.Env = append(g.cmd.Env, o.env...)
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	go func() { // ends when the gateway's stderr closes
		gwlog.Read(stderr, func(rec map[string]any, _ []byte) {
			g.mu.Lock()
			g.logs = append(g.logs, rec)
			g.mu.Unlock()
			if addr, ok := rec["addr"].(string); ok && rec["msg"] == "listening" {
				select {
				case addrCh <- addr:
				default:
				}
			}
		})
		g.exitErr = g.cmd.Wait()
		close(g.done)
	}()
	// Registered before the wait, so that a gateway that never listens is
	// stopped too.
	t.Cleanup(func() {
		g.stop(syscall.SIGTERM)
		if g.exitErr != nil && g.cmd.ProcessState != nil && !g.cmd.ProcessState.Exited() {
			// killed by the test itself
		} else if g.exitErr != nil {
			t.Errorf("gateway exited with %v (66 = data race)", g.exitErr)
		}
		if n := g.countLogs("raw", "", ""); n > 0 && strings.Contains(g.logText(), "DATA RACE") {
			t.Errorf("the gateway reported a data race")
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.logText())
		}
	})
	select {
	case g.addr = <-addrCh:
	case <-g.done:
		t.Fatalf("gateway exited before listening: %v", g.exitErr)
	case <-time.After(20 * time.Second):
		t.Fatalf("gateway did not listen within 20 s")
	}
	return g
}

// gatewayEnv is the test's environment without the ACPGATE_E2E_* variables
// that steer the tests: the gateway reads ACPGATE_* as settings and warns
// about names it does not know.
func gatewayEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ACPGATE_E2E_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop signals the gateway and waits for it to exit (SIGKILL after 20 s).
func (g *gateway) stop(sig syscall.Signal) {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(sig)
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		g.t.Errorf("gateway did not exit within 20 s of %v", sig)
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

func (g *gateway) logText() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var b strings.Builder
	for _, r := range g.logs {
		j, _ := json.Marshal(r)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// countLogs counts log records with msg and, if set, key=value.
func (g *gateway) countLogs(msg, key, value string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.logs {
		if r["msg"] == msg && (key == "" || fmt.Sprint(r[key]) == value) {
			n++
		}
	}
	return n
}

func (g *gateway) waitLog(t *testing.T, msg, key, value string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for g.countLogs(msg, key, value) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no log %q %s=%s within %s", msg, key, value, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --- WebSocket client ---

type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

type rpcMsg struct {
	Raw    []byte
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

func (m rpcMsg) isResponseTo(id int) bool {
	return m.Method == "" && string(m.ID) == strconv.Itoa(id)
}

// param returns a string field of params.
func (m rpcMsg) param(key string) string {
	var p map[string]any
	_ = json.Unmarshal(m.Params, &p)
	s, _ := p[key].(string)
	return s
}

type client struct {
	t      *testing.T
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	in     chan rpcMsg
	connID string
	nextID int
	done   chan struct{}

	mu      sync.Mutex
	readErr error
}

func dial(t *testing.T, g *gateway) *client {
	t.Helper()
	c, _, err := dialWith(t, g, "/acp", nil, []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return c
}

// dialWith opens a WebSocket to path with extra request headers and the
// given subprotocols (joined with "," into one Sec-WebSocket-Protocol
// header). On success it returns a client and the 101 response; when the
// handshake is refused it returns the HTTP response (its body holds at
// least the first 1 KiB) and the error. Connections are never kept alive
// for reuse, so a refused handshake leaves nothing behind.
func dialWith(t *testing.T, g *gateway, path string, header http.Header, protos []string) (*client, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ws, resp, err := websocket.Dial(dctx, "ws://"+g.addr+path, &websocket.DialOptions{
		HTTPClient:   hc,
		HTTPHeader:   header,
		Subprotocols: protos,
	})
	if err != nil {
		cancel()
		return nil, resp, err
	}
	ws.SetReadLimit(64 << 20)
	c := &client{t: t, ws: ws, ctx: ctx, cancel: cancel, in: make(chan rpcMsg, 100000), connID: resp.Header.Get("Acp-Connection-Id"), done: make(chan struct{})}
	go readMessages(ctx, ws, c.in, c.done, func(err error) {
		c.mu.Lock()
		c.readErr = err
		c.mu.Unlock()
	}, func(m *rpcMsg, err error) bool {
		t.Errorf("gateway sent invalid JSON: %v: %s", err, m.Raw)
		return false
	})
	t.Cleanup(c.close)
	return c, resp, nil
}

// readMessages reads JSON-RPC messages from ws into in until the connection
// or ctx ends, then records why with setErr and closes in and done. A frame
// that is not JSON goes to bad (with Raw set), which says whether to pass it on.
func readMessages(ctx context.Context, ws *websocket.Conn, in chan<- rpcMsg, done chan<- struct{},
	setErr func(error), bad func(*rpcMsg, error) bool) {
	defer close(done)
	defer close(in)
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			setErr(err)
			return
		}
		var m rpcMsg
		if err := json.Unmarshal(b, &m); err != nil {
			m = rpcMsg{Raw: b}
			if !bad(&m, err) {
				continue
			}
		}
		m.Raw = b
		select {
		case in <- m:
		case <-ctx.Done():
			return
		}
	}
}

func (c *client) close() {
	_ = c.ws.Close(websocket.StatusNormalClosure, "")
	c.cancel()
	<-c.done
}

// kill drops the TCP connection without a close handshake.
func (c *client) kill() {
	_ = c.ws.CloseNow()
	c.cancel()
	<-c.done
}

func (c *client) sendRaw(s string) {
	c.t.Helper()
	if err := c.ws.Write(c.ctx, websocket.MessageText, []byte(s)); err != nil {
		c.t.Fatalf("write: %v", err)
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

// request sends a request and returns its id.
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

// next returns the next message, failing the test after timeout.
func (c *client) next(timeout time.Duration) rpcMsg {
	c.t.Helper()
	select {
	case m, ok := <-c.in:
		if !ok {
			c.t.Fatalf("connection closed: %v", c.err())
		}
		return m
	case <-time.After(timeout):
		c.t.Fatalf("no message within %s", timeout)
	}
	return rpcMsg{}
}

func (c *client) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// await reads until the response to id, passing every other message to
// other (which may be nil).
func (c *client) await(id int, timeout time.Duration, other func(rpcMsg)) rpcMsg {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			c.t.Fatalf("no response to request %d within %s", id, timeout)
		}
		m := c.next(left)
		if m.isResponseTo(id) {
			return m
		}
		if other != nil {
			other(m)
		} else if m.Method != "session/update" {
			c.t.Fatalf("unexpected message while waiting for %d: %s", id, m.Raw)
		}
	}
}

func (c *client) call(method string, params any, timeout time.Duration) rpcMsg {
	c.t.Helper()
	return c.await(c.request(method, params), timeout, nil)
}

func (c *client) initialize() map[string]any {
	c.t.Helper()
	m := c.call("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": true, "writeTextFile": true}},
		"clientInfo":         map[string]string{"name": "e2e", "version": "0"},
	}, 30*time.Second)
	if m.Error != nil {
		c.t.Fatalf("initialize: %+v", m.Error)
	}
	var res map[string]any
	_ = json.Unmarshal(m.Result, &res)
	return res
}

func (c *client) newSession(cwd string) string {
	c.t.Helper()
	m := c.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}, 30*time.Second)
	if m.Error != nil {
		c.t.Fatalf("session/new: %+v", m.Error)
	}
	var res struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(m.Result, &res)
	if res.SessionID == "" {
		c.t.Fatalf("session/new without sessionId: %s", m.Raw)
	}
	return res.SessionID
}

func textPrompt(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": text}}}
}

// update is the part of a session/update the tests look at.
type update struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		Kind    string          `json:"sessionUpdate"`
		Content json.RawMessage `json:"content"` // a block, or a list for tool calls
	} `json:"update"`
}

// text returns the text of a content block update ("" for other shapes).
func (u update) text() string {
	var c struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(u.Update.Content, &c)
	return c.Text
}

func parseUpdate(t *testing.T, m rpcMsg) update {
	t.Helper()
	var u update
	if err := json.Unmarshal(m.Params, &u); err != nil {
		t.Fatalf("bad session/update: %v: %s", err, m.Raw)
	}
	return u
}

// collectText concatenates the text of agent_message_chunk updates for sid,
// failing on updates for any other session.
func collectText(t *testing.T, sid string, kinds ...string) (func(rpcMsg), *strings.Builder) {
	var b strings.Builder
	if len(kinds) == 0 {
		kinds = []string{"agent_message_chunk"}
	}
	return func(m rpcMsg) {
		t.Helper()
		if m.Method != "session/update" {
			t.Fatalf("unexpected message: %s", m.Raw)
		}
		u := parseUpdate(t, m)
		if u.SessionID != sid {
			t.Fatalf("update for session %q reached the client of %q: %s", u.SessionID, sid, m.Raw)
		}
		for _, k := range kinds {
			if u.Update.Kind == k {
				b.WriteString(u.text())
			}
		}
	}, &b
}

func stopReason(t *testing.T, m rpcMsg) string {
	t.Helper()
	if m.Error != nil {
		t.Fatalf("prompt failed: %+v", m.Error)
	}
	var r struct {
		StopReason string `json:"stopReason"`
	}
	_ = json.Unmarshal(m.Result, &r)
	return r.StopReason
}

// --- processes ---

// agentPIDs returns the demo agent processes (not their supervisors) below
// the gateway.
func (g *gateway) agentPIDs() []int {
	var pids []int
	for pid, cmd := range proctree.Descendants(g.cmd.Process.Pid) {
		if strings.Contains(cmd, "demo-agent") && !strings.Contains(cmd, "supervise") {
			pids = append(pids, pid)
		}
	}
	return pids
}
