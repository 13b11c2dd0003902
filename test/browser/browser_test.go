//go:build unix

// Package browser tests acpgate's web client (web/static) in a real browser:
// Debian's chromium, driven by playwright-core from e2e.mjs. The Go side
// builds the real binary, starts gateways (the built-in demo agent; a second
// one with a tenant and a token), runs `node e2e.mjs <url> <scenario>` and
// stops the gateways with SIGTERM.
//
// Prerequisites (see README.md): /usr/bin/chromium (apt-get install -y
// chromium) and test/browser/node_modules (npm ci). Without them the tests
// skip, unless ACPGATE_REQUIRE_BROWSER=1, which makes that a failure.
// Screenshots are written to test/out/browser/.
package browser

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/chromium"
	"github.com/acpgate/acpgate/test/internal/harness"
)

const (
	requireEnv   = "ACPGATE_REQUIRE_BROWSER" // "1": missing prerequisites fail instead of skipping
	chromiumPath = "/usr/bin/chromium"

	scriptLimit = 4 * time.Minute  // one run of e2e.mjs, then its process group is killed
	startLimit  = 30 * time.Second // gateway start until its "listening" line
	stopLimit   = 20 * time.Second // SIGTERM until exit, then SIGKILL
)

var (
	buildOnce sync.Once
	gateBin   string
	buildErr  error
)

// requirePrereqs skips (or fails, with ACPGATE_REQUIRE_BROWSER=1) when the
// browser, node or the npm packages are missing. It returns node's path.
func requirePrereqs(t *testing.T) string {
	t.Helper()
	return chromium.Require(t, "node_modules", requireEnv)
}

// binary builds ./cmd/acpgate once into a temp dir, or is ACPGATE_E2E_BIN
// (harness.Prebuilt: an older build, its own web page embedded, to see a
// test fail against it).
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if gateBin, buildErr = harness.Prebuilt(); buildErr != nil || gateBin != "" {
			return
		}
		dir, err := os.MkdirTemp("", "acpgate-browser-bin-")
		if err != nil {
			buildErr = err
			return
		}
		gateBin, buildErr = harness.Build(dir, false)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return gateBin
}

func TestMain(m *testing.M) {
	harness.Main(m, func() {
		if prebuilt, _ := harness.Prebuilt(); gateBin != "" && gateBin != prebuilt {
			os.RemoveAll(filepath.Dir(gateBin))
		}
	})
}

// ---------------------------------------------------------------------------
// Gateway process

type gateway struct{ *harness.Gateway }

// rig is what each test starts from: node, the gateway binary, a temporary
// directory, the environment that keeps the demo agent's state in
// dir/state, and the buffer the gateways it starts log to.
type rig struct {
	node, bin, dir string
	env            []string
	log            *harness.SyncBuffer
}

// newRig checks the prerequisites (requirePrereqs) and builds the binary.
func newRig(t *testing.T) *rig {
	t.Helper()
	node := requirePrereqs(t)
	bin := binary(t)
	dir := t.TempDir()
	return &rig{node: node, bin: bin, dir: dir, env: []string{"ACPGATE_DEMO_STATE_DIR=" + filepath.Join(dir, "state")}, log: &harness.SyncBuffer{}}
}

// start runs `acpgate serve --config FILE --log-format json` and waits for
// its "listening" log line, then for /readyz. listen, if set, overrides the
// config's address (used to restart on the same port).
func (r *rig) start(t *testing.T, config, listen string) *gateway {
	t.Helper()
	g := r.launch(t, config, listen)
	waitReady(t, "http://"+g.Addr)
	return g
}

// launch is start without the wait for /readyz, for a gateway with an
// agent that never becomes ready.
func (r *rig) launch(t *testing.T, config, listen string) *gateway {
	t.Helper()
	args := []string{r.bin, "serve", "--config", config, "--log-format", "json"}
	if listen != "" {
		args = append(args, "--listen", listen)
	}
	// With tenants the sandbox is on: agents' private homes go to a
	// temporary directory.
	env := append(append(os.Environ(), "ACPGATE_SANDBOX_HOME="+filepath.Join(t.TempDir(), "homes")), r.env...)
	return &gateway{harness.Start(t, harness.Options{Argv: args, Env: env, Setpgid: true, Listen: startLimit, Stop: stopLimit, Log: r.log})}
}

// waitReady polls /readyz until the pool has an initialized agent.
func waitReady(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(startLimit)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s/readyz did not answer 200 within %v", base, startLimit)
}

// stop sends SIGTERM and waits; SIGKILL to the process group after stopLimit.
func (g *gateway) stop() { g.Stop(syscall.SIGTERM) }

// crash kills the gateway alone with SIGKILL, as a crash or a network cut
// would end its connections; its agents' supervisors clean up after it.
func (g *gateway) crash() {
	_ = g.Cmd.Process.Signal(syscall.SIGKILL)
	<-g.Done()
}

// ---------------------------------------------------------------------------
// Tests

// TestBrowserClient: the demo agent without authentication. Restarts keep
// the port, the session key and the demo agent's state dir, so a session
// survives them and the page can load it again after reconnecting.
func TestBrowserClient(t *testing.T) {
	r := newRig(t)

	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile := filepath.Join(r.dir, "session.key")
	harness.WriteFile(t, keyFile, hex.EncodeToString(key)+"\n", 0o600)
	config := writeConfig(t, r.dir, fmt.Sprintf("session_key_file: %s\n", keyFile))

	gw := r.start(t, config, "")
	defer func() { gw.stop() }()
	addr := gw.Addr

	// The script stops the gateway (SIGTERM: a restart, 1001) or kills it
	// (SIGKILL: a dropped connection, 1006), checks that the page keeps
	// retrying, then has it started again on the same address.
	var actions []string
	r.runScript(t, "http://"+addr+"/", "main", nil, func(action string) error {
		actions = append(actions, action)
		switch action {
		case "stop":
			gw.stop()
		case "kill":
			gw.crash()
		case "start":
			fmt.Fprintf(r.log, "--- start again on %s ---\n", addr)
			gw = r.start(t, config, addr)
		default:
			return fmt.Errorf("unknown harness action %q", action)
		}
		return nil
	})
	gw.stop()
	r.saveLog(t, "client-gateway.log")
	if got, want := strings.Join(actions, ","), "stop,start,kill,start"; got != want {
		t.Errorf("harness actions %q, want %q", got, want)
	}
}

// TestBrowserTenantToken: a gateway with one tenant. The browser is refused
// without a token and with a bad one, and connects with the good one (sent
// in the WebSocket subprotocol list) and with a one-time ticket.
func TestBrowserTenantToken(t *testing.T) {
	r := newRig(t)
	const good = "good-token"
	config := tenantConfig(t, r.dir, good, "")
	gw := r.start(t, config, "")
	defer gw.stop()

	r.runScript(t, "http://"+gw.Addr+"/", "tenant", []string{"ACPGATE_GOOD_TOKEN=" + good}, nil)

	gw.stop()
	r.saveLog(t, "tenant-gateway.log")
	for _, secret := range []string{good, "bad-token"} {
		if strings.Contains(r.log.String(), secret) {
			t.Errorf("the gateway log contains the token %q", secret)
		}
	}
}

// runScript runs e2e.mjs and relays its "@@harness ACTION" requests to
// onAction, answering "ok" on its stdin.
func (r *rig) runScript(t *testing.T, url, scenario string, env []string, onAction func(string) error) {
	t.Helper()
	outDir, err := filepath.Abs(filepath.Join("..", "out", "browser"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptLimit)
	defer cancel()
	res := chromium.Run(t, ctx, chromium.Script{Node: r.node, Args: []string{"e2e.mjs", url, scenario}, Env: env, OutDir: outDir, OnAction: onAction})
	if ctx.Err() != nil {
		t.Errorf("e2e.mjs %s did not finish within %v", scenario, scriptLimit)
	}
	if res.ActionErr != nil {
		t.Errorf("harness action: %v", res.ActionErr)
	}
	if res.Err != nil || t.Failed() {
		t.Errorf("e2e.mjs %s: %v after %v\n--- script stderr ---\n%s\n--- gateway log ---\n%s",
			scenario, res.Err, res.Took, res.Stderr, tail(r.log.String(), 60))
		return
	}
	t.Logf("e2e.mjs %s passed in %v; screenshots in %s", scenario, res.Took, outDir)
}

// saveLog keeps the gateway's log next to the screenshots.
// scenario runs one scenario of e2e.mjs (env: more of its environment)
// against a gateway of its own on config, and keeps the gateway's log as
// <scenario>-gateway.log.
func (r *rig) scenario(t *testing.T, config, name string, env []string) {
	t.Helper()
	gw := r.start(t, config, "")
	defer gw.stop()
	r.runScript(t, "http://"+gw.Addr+"/", name, env, nil)
	gw.stop()
	r.saveLog(t, name+"-gateway.log")
}

func (r *rig) saveLog(t *testing.T, name string) {
	path := filepath.Join("..", "out", "browser", name)
	if err := os.WriteFile(path, []byte(r.log.String()), 0o644); err != nil {
		t.Logf("saving the gateway log: %v", err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… %d earlier lines", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// writeConfig writes dir/acpgate.yaml: a gateway on a free port of
// 127.0.0.1 with a 2 s shutdown grace, then extra YAML. It returns the file.
func writeConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	config := filepath.Join(dir, "acpgate.yaml")
	harness.WriteFile(t, config, "listen: 127.0.0.1:0\nshutdown_grace: 2s\n"+extra, 0o644)
	return config
}

// tenantConfig writes dir/acpgate.yaml: a gateway with one tenant, t1, whose
// token is token and whose root (dir/t1, created) clients see as
// /workspace, with extra YAML before the tenants. It returns the file.
func tenantConfig(t *testing.T, dir, token, extra string) string {
	t.Helper()
	root := filepath.Join(dir, "t1")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	return writeConfig(t, dir, fmt.Sprintf(`%stenants:
  - name: t1
    tokens_sha256: [%q]
    root: %q
    virtual_root: /workspace
`, extra, hex.EncodeToString(sum[:]), root))
}
