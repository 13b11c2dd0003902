// Package e2e drives the real acpgate binary, with real agent subprocesses,
// through a real WebSocket client.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

var (
	binPath  string
	buildDir string // the run's own directory for what it builds, removed at the end
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "acpgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	if binPath, err = harness.Prebuilt(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	} else if binPath != "" {
		fmt.Fprintln(os.Stderr, "e2e: using the prebuilt gateway", binPath)
	} else if binPath, err = harness.Build(dir, true); err != nil {
		fmt.Fprintln(os.Stderr, "build acpgate:", err)
		os.Exit(1)
	}
	harness.Main(m, func() { os.RemoveAll(dir) })
}

// gateway is one running acpgate process.
type gateway struct {
	*harness.Gateway
	stateDir string
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
	g := &gateway{stateDir: o.stateDir}
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
	argv := append(append(append([]string(nil), o.wrap...), binPath), args...)
	// With tenants the sandbox is on: each tenant's agents get a private
	// home under the state dir (which restart tests share), where the demo
	// agent keeps its sessions.
	env := append(gatewayEnv(), "ACPGATE_DEMO_STATE_DIR="+g.stateDir, "ACPGATE_SANDBOX_HOME="+filepath.Join(g.stateDir, "homes"))
	g.Gateway = harness.Start(t, harness.Options{Argv: argv, Env: append(env, o.env...), CheckExit: true})
	return g
}

// gatewayEnv is the test's environment without the ACPGATE_E2E_* variables
// that steer the tests: the gateway reads ACPGATE_* as settings and warns
// about names it does not know.
func gatewayEnv() []string {
	return harness.EnvWithout("ACPGATE_E2E_")
}

// --- WebSocket client ---

type rpcMsg = acpclient.Msg

// client is one WebSocket to the gateway, used by the test's goroutine.
type client struct{ *acpclient.Client }

func dial(t *testing.T, g *gateway) *client {
	t.Helper()
	c, _, err := dialWith(t, g, "/acp", nil, []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return c
}

// dialInit connects and initializes with the harness's capabilities (the
// pool's default profile, so that every client shares the one process).
func dialInit(t *testing.T, g *gateway) *client {
	t.Helper()
	c := dial(t, g)
	c.initialize()
	return c
}

// dialSession connects, initializes (dialInit) and opens a session in cwd.
func dialSession(t *testing.T, g *gateway, cwd string) (*client, string) {
	t.Helper()
	c := dialInit(t, g)
	return c, c.newSession(cwd)
}

// dialRawInit opens a bare WebSocket to /acp (no client reading it, a
// connection not kept alive), reading at most readLimit bytes a message,
// and sends initialize with both fs capabilities. It returns the socket
// (the caller closes it) and a function that writes a text frame.
func dialRawInit(t *testing.T, ctx context.Context, g *gateway, readLimit int64) (*websocket.Conn, func(string) error) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	ws, _, err := websocket.Dial(dctx, "ws://"+g.Addr+"/acp", &websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{"acp"}})
	dcancel()
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(readLimit)
	write := func(s string) error { return ws.Write(ctx, websocket.MessageText, []byte(s)) }
	if err := write(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true}}}}`); err != nil {
		ws.CloseNow()
		t.Fatal(err)
	}
	return ws, write
}

// dialWith opens a WebSocket to path with extra request headers and the
// given subprotocols (joined with "," into one Sec-WebSocket-Protocol
// header). On success it returns a client and the 101 response; when the
// handshake is refused it returns the HTTP response (its body holds at
// least the first 1 KiB) and the error. Connections are never kept alive
// for reuse, so a refused handshake leaves nothing behind.
func dialWith(t *testing.T, g *gateway, path string, header http.Header, protos []string) (*client, *http.Response, error) {
	t.Helper()
	c, resp, err := acpclient.DialClient(t, "ws://"+g.Addr+path, header, protos)
	if err != nil {
		return nil, resp, err
	}
	return &client{c}, resp, nil
}

func (c *client) initialize() map[string]any {
	c.T.Helper()
	return c.Initialize("e2e", true)
}

func (c *client) newSession(cwd string) string {
	c.T.Helper()
	return c.NewSession(cwd)
}

var textPrompt = acpclient.TextPrompt

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

// updatesText concatenates the text of the session/update messages among
// msgs, only those of kind (sessionUpdate) unless kind is "".
func updatesText(t *testing.T, msgs []rpcMsg, kind string) string {
	t.Helper()
	var b strings.Builder
	for _, m := range msgs {
		if m.Method == "session/update" {
			if u := parseUpdate(t, m); kind == "" || u.Update.Kind == kind {
				b.WriteString(u.text())
			}
		}
	}
	return b.String()
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
	for pid, cmd := range proctree.Descendants(g.Cmd.Process.Pid) {
		if strings.Contains(cmd, "demo-agent") && !strings.Contains(cmd, "supervise") {
			pids = append(pids, pid)
		}
	}
	return pids
}
