// Package ops tests acpgate the way it is operated: scraped by a real
// Prometheus, checked by promtool, drained by SIGTERM, reloaded by SIGHUP,
// and deployed with the files in deploy/ (which it checks against the real
// binary).
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
)

var binPath string

// repoRoot is the repository, two levels up from test/ops.
var repoRoot = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}()

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "acpgate-ops-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "acpgate")
	args := []string{"build", "-race", "-o", binPath, "-ldflags", "-X main.version=v0.0.0-ops", "github.com/acpgate/acpgate/cmd/acpgate"}
	if os.Getenv("ACPGATE_E2E_NORACE") != "" {
		args = append(args[:1], args[2:]...)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build acpgate:", err)
		os.Exit(1)
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

// requireTool returns the path of a program the test needs. Missing, the
// test is skipped, unless ACPGATE_REQUIRE_OPS=1 (CI), where it fails.
func requireTool(t *testing.T, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("ACPGATE_REQUIRE_OPS") == "1" {
			t.Fatalf("%s is missing (ACPGATE_REQUIRE_OPS=1): %v", path, err)
		}
		t.Skipf("%s is missing: %v (install the Debian package prometheus)", path, err)
	}
	return path
}

// --- the gateway process ---

type gateway struct {
	t           *testing.T
	cmd         *exec.Cmd
	addr        string // main listener
	metricsAddr string // observability.metrics_listen, if set
	cfgPath     string
	done        chan struct{}
	exitCode    int

	mu   sync.Mutex
	logs []map[string]any
}

type gwOpts struct {
	config     string   // YAML written to a file and passed with --config; "" = none
	configPath string   // an existing file to pass with --config instead
	env        []string // extra environment, e.g. ACPGATE_* settings
}

func startGateway(t *testing.T, o gwOpts) *gateway {
	t.Helper()
	g := &gateway{t: t, done: make(chan struct{}), exitCode: -1}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}
	if o.config != "" {
		g.cfgPath = filepath.Join(t.TempDir(), "acpgate.yaml")
		writeFile(t, g.cfgPath, o.config)
		args = append(args, "--config", g.cfgPath)
	} else if o.configPath != "" {
		g.cfgPath = o.configPath
		args = append(args, "--config", g.cfgPath)
	}
	g.cmd = exec.Command(binPath, args...)
	// With tenants the sandbox is on: agents' private homes go to a
	// temporary directory too.
	g.cmd.Env = append(append(os.Environ(), "ACPGATE_DEMO_STATE_DIR="+t.TempDir(), "ACPGATE_SANDBOX_HOME="+filepath.Join(t.TempDir(), "homes")), o.env...)
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
			if rec["msg"] == "serving metrics" {
				g.metricsAddr, _ = rec["addr"].(string)
			}
			g.mu.Unlock()
			if addr, ok := rec["addr"].(string); ok && rec["msg"] == "listening" {
				select {
				case addrCh <- addr:
				default:
				}
			}
		})
		_ = g.cmd.Wait()
		g.exitCode = g.cmd.ProcessState.ExitCode()
		close(g.done)
	}()
	select {
	case g.addr = <-addrCh:
	case <-g.done:
		t.Fatalf("gateway exited (%d) before listening:\n%s", g.exitCode, g.logText())
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		t.Fatalf("gateway did not listen within 30 s:\n%s", g.logText())
	}
	t.Cleanup(func() {
		g.stop(syscall.SIGTERM, 30*time.Second)
		if strings.Contains(g.logText(), "DATA RACE") {
			t.Errorf("the gateway reported a data race")
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.logText())
		}
	})
	g.waitReady(t)
	return g
}

// stop signals the gateway and waits for it to exit (SIGKILL after wait).
func (g *gateway) stop(sig syscall.Signal, wait time.Duration) {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(sig)
	select {
	case <-g.done:
	case <-time.After(wait):
		g.t.Errorf("gateway did not exit within %s of %v", wait, sig)
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

func (g *gateway) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := httpGet("http://" + g.addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 30 s (%d, %v)", code, err)
		}
		time.Sleep(50 * time.Millisecond)
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

func (g *gateway) countLogs(msg string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.logs {
		if r["msg"] == msg {
			n++
		}
	}
	return n
}

// waitLogs waits until msg has been logged n times.
func (g *gateway) waitLogs(t *testing.T, msg string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for g.countLogs(msg) < n {
		if time.Now().After(deadline) {
			t.Fatalf("log %q not seen %d times within %s", msg, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metrics returns the text of /metrics (on metrics_listen if set).
func (g *gateway) metrics(t *testing.T) string {
	t.Helper()
	addr := g.addr
	g.mu.Lock()
	if g.metricsAddr != "" {
		addr = g.metricsAddr
	}
	g.mu.Unlock()
	code, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
}

// sample returns the value of the sample line "name{labels} value" (labels
// as written by client_golang, e.g. `result="failure"`), or -1.
func sample(metrics, name, labels string) float64 {
	prefix := name + " "
	if labels != "" {
		prefix = name + "{" + labels + "} "
	}
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

var plainHTTP = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func httpGet(url string) (int, string, error) {
	resp, err := plainHTTP.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// --- a WebSocket ACP client ---

type rpcMsg struct {
	Raw    []byte          `json:"-"`
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type client struct {
	t      *testing.T
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	in     chan rpcMsg
	done   chan struct{}
	nextID int

	mu      sync.Mutex
	readErr error
}

// dial opens /acp with the "acp" subprotocol and, if token is set, a
// bearer token. A refused handshake returns the HTTP response.
func dial(t *testing.T, addr, token string) (*client, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, resp, err := websocket.Dial(dctx, "ws://"+addr+"/acp", &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		HTTPHeader:   h,
		Subprotocols: []string{"acp"},
	})
	if err != nil {
		cancel()
		return nil, resp, err
	}
	ws.SetReadLimit(64 << 20)
	c := &client{t: t, ws: ws, ctx: ctx, cancel: cancel, in: make(chan rpcMsg, 10000), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.in)
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				c.mu.Lock()
				c.readErr = err
				c.mu.Unlock()
				return
			}
			var m rpcMsg
			if err := json.Unmarshal(b, &m); err != nil {
				t.Errorf("invalid JSON from the gateway: %v: %s", err, b)
				continue
			}
			m.Raw = b
			select {
			case c.in <- m:
			case <-ctx.Done(): // closed while nobody reads: end, so close() does not wait forever
				return
			}
		}
	}()
	t.Cleanup(c.close)
	return c, resp, nil
}

func mustDial(t *testing.T, addr, token string) *client {
	t.Helper()
	c, resp, err := dial(t, addr, token)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP %d)", addr, err, status)
	}
	return c
}

func (c *client) close() {
	_ = c.ws.Close(websocket.StatusNormalClosure, "")
	c.cancel()
	<-c.done
}

func (c *client) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// closeStatus waits for the connection to end and returns its close code.
func (c *client) closeStatus(timeout time.Duration) websocket.StatusCode {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-c.in:
			if !ok {
				return websocket.CloseStatus(c.err())
			}
		case <-deadline:
			c.t.Fatalf("connection still open after %s", timeout)
		}
	}
}

func (c *client) request(method string, params any) int {
	c.t.Helper()
	c.nextID++
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method, "params": params})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.ws.Write(c.ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("write %s: %v", method, err)
	}
	return c.nextID
}

// await reads until the response to id, passing every other message to
// other (session/update notifications only, when other is nil).
func (c *client) await(id int, timeout time.Duration, other func(rpcMsg)) rpcMsg {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-c.in:
			if !ok {
				c.t.Fatalf("connection closed while waiting for response %d: %v", id, c.err())
			}
			if m.Method == "" && string(m.ID) == strconv.Itoa(id) {
				return m
			}
			if other != nil {
				other(m)
			} else if m.Method != "session/update" {
				c.t.Fatalf("unexpected message while waiting for %d: %s", id, m.Raw)
			}
		case <-deadline:
			c.t.Fatalf("no response to request %d within %s", id, timeout)
		}
	}
}

func (c *client) call(method string, params any) rpcMsg {
	c.t.Helper()
	m := c.await(c.request(method, params), 30*time.Second, nil)
	if m.Error != nil {
		c.t.Fatalf("%s: error %d %s", method, m.Error.Code, m.Error.Message)
	}
	return m
}

func (c *client) initialize() {
	c.t.Helper()
	c.call("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": false, "writeTextFile": false}},
		"clientInfo":         map[string]string{"name": "ops-test", "version": "0"},
	})
}

func (c *client) newSession(cwd string) string {
	c.t.Helper()
	m := c.call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	var res struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(m.Result, &res)
	if res.SessionID == "" {
		c.t.Fatalf("session/new without sessionId: %s", m.Raw)
	}
	return res.SessionID
}

func promptParams(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": text}}}
}

// chunkText returns the text of an agent_message_chunk update, or "".
func chunkText(m rpcMsg) (string, bool) {
	if m.Method != "session/update" {
		return "", false
	}
	var p struct {
		Update struct {
			Kind    string `json:"sessionUpdate"`
			Content struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"update"`
	}
	if json.Unmarshal(m.Params, &p) != nil || p.Update.Kind != "agent_message_chunk" {
		return "", false
	}
	return p.Update.Content.Text, true
}

func stopReason(t *testing.T, m rpcMsg) string {
	t.Helper()
	if m.Error != nil {
		t.Fatalf("prompt failed: %d %s", m.Error.Code, m.Error.Message)
	}
	var r struct {
		StopReason string `json:"stopReason"`
	}
	_ = json.Unmarshal(m.Result, &r)
	return r.StopReason
}

// prompt runs one turn and returns its stop reason and streamed text.
func (c *client) prompt(sid, text string) (string, string) {
	c.t.Helper()
	var b strings.Builder
	m := c.await(c.request("session/prompt", promptParams(sid, text)), 60*time.Second, func(m rpcMsg) {
		if s, ok := chunkText(m); ok {
			b.WriteString(s)
		}
	})
	return stopReason(c.t, m), b.String()
}

// --- processes ---

// errRefused reports whether a dial failed because nothing listens.
func errRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}
