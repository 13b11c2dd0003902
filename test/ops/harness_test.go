// Package ops tests acpgate the way it is operated: scraped by a real
// Prometheus, checked by promtool, drained by SIGTERM, reloaded by SIGHUP,
// and deployed with the files in deploy/ (which it checks against the real
// binary).
package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
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
	if binPath, err = harness.Build(dir, true, "-ldflags", "-X main.version=v0.0.0-ops"); err != nil {
		fmt.Fprintln(os.Stderr, "build acpgate:", err)
		os.Exit(1)
	}
	harness.Main(m, func() { os.RemoveAll(dir) })
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
	*harness.Gateway
	cfgPath string
}

type gwOpts struct {
	config     string   // YAML written to a file and passed with --config; "" = none
	configPath string   // an existing file to pass with --config instead
	env        []string // extra environment, e.g. ACPGATE_* settings
}

func startGateway(t *testing.T, o gwOpts) *gateway {
	t.Helper()
	g := &gateway{}
	args := []string{binPath, "serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}
	if o.config != "" {
		g.cfgPath = filepath.Join(t.TempDir(), "acpgate.yaml")
		writeFile(t, g.cfgPath, o.config)
		args = append(args, "--config", g.cfgPath)
	} else if o.configPath != "" {
		g.cfgPath = o.configPath
		args = append(args, "--config", g.cfgPath)
	}
	// With tenants the sandbox is on: agents' private homes go to a
	// temporary directory too.
	env := append(append(os.Environ(), "ACPGATE_DEMO_STATE_DIR="+t.TempDir(), "ACPGATE_SANDBOX_HOME="+filepath.Join(t.TempDir(), "homes")), o.env...)
	g.Gateway = harness.Start(t, harness.Options{Argv: args, Env: env, Listen: 30 * time.Second, Stop: 30 * time.Second})
	g.waitReady(t)
	return g
}

func (g *gateway) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := httpGet("http://" + g.Addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 30 s (%d, %v)", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metrics returns the text of /metrics (on metrics_listen if set).
func (g *gateway) metrics(t *testing.T) string {
	t.Helper()
	addr := g.Addr
	if m := g.MetricsAddr(); m != "" {
		addr = m
	}
	code, body, err := metricscrape.Get(addr)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
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
	ln := harness.Listen(t)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// --- a WebSocket ACP client ---

type rpcMsg = acpclient.Msg

type client struct{ *acpclient.Client }

// dial opens /acp with the "acp" subprotocol and, if token is set, a
// bearer token. A refused handshake returns the HTTP response.
func dial(t *testing.T, addr, token string) (*client, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	c, resp, err := acpclient.DialClient(t, "ws://"+addr+"/acp", h, []string{"acp"})
	if err != nil {
		return nil, resp, err
	}
	return &client{c}, resp, nil
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

func (c *client) initialize() {
	c.T.Helper()
	c.Initialize("ops-test", false)
}

// dialSession connects to addr without a token, initializes and opens a
// session in a new temporary directory.
func dialSession(t *testing.T, addr string) (*client, string) {
	t.Helper()
	c := mustDial(t, addr, "")
	c.initialize()
	return c, c.NewSession(t.TempDir())
}

var promptParams = acpclient.TextPrompt

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

func stopReason(t testing.TB, m rpcMsg) string {
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
	c.T.Helper()
	var b strings.Builder
	m := c.Await(c.Request("session/prompt", promptParams(sid, text)), 60*time.Second, func(m rpcMsg) {
		if s, ok := chunkText(m); ok {
			b.WriteString(s)
		}
	})
	return stopReason(c.T, m), b.String()
}

// --- processes ---

// errRefused reports whether a dial failed because nothing listens.
func errRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}
