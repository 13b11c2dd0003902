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
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/test/internal/gwlog"
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
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("%s (%s=1, so this is a failure)", msg, requireEnv)
		}
		t.Skipf("%s; skipping (set %s=1 to make this a failure)", msg, requireEnv)
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		missing("browser: %s is missing (apt-get install -y chromium)", chromiumPath)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("browser: node is not on PATH")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "playwright-core", "package.json")); err != nil {
		missing("browser: test/browser/node_modules/playwright-core is missing (cd test/browser && npm ci)")
	}
	return node
}

// binary builds ./cmd/acpgate once into a temp dir.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "acpgate-browser-bin-")
		if err != nil {
			buildErr = err
			return
		}
		gateBin = filepath.Join(dir, "acpgate")
		cmd := exec.Command("go", "build", "-o", gateBin, "./cmd/acpgate")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/acpgate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return gateBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	if gateBin != "" {
		os.RemoveAll(filepath.Dir(gateBin))
	}
	os.Exit(code)
}

// ---------------------------------------------------------------------------
// Gateway process

type gateway struct {
	t      *testing.T
	bin    string
	config string
	env    []string
	addr   string // host:port it listens on

	cmd  *exec.Cmd
	done chan struct{}
	log  *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startGateway runs `acpgate serve --config FILE --log-format json` and
// waits for its "listening" log line, then for /readyz. listen, if set,
// overrides the config's address (used to restart on the same port).
func startGateway(t *testing.T, bin, config string, env []string, log *lockedBuffer, listen string) *gateway {
	t.Helper()
	g := launchGateway(t, bin, config, env, log, listen)
	waitReady(t, "http://"+g.addr)
	return g
}

// launchGateway is startGateway without the wait for /readyz, for a
// gateway with an agent that never becomes ready.
func launchGateway(t *testing.T, bin, config string, env []string, log *lockedBuffer, listen string) *gateway {
	t.Helper()
	g := &gateway{t: t, bin: bin, config: config, env: env, log: log, done: make(chan struct{})}
	args := []string{"serve", "--config", config, "--log-format", "json"}
	if listen != "" {
		args = append(args, "--listen", listen)
	}
	g.cmd = exec.Command(bin, args...)
	// With tenants the sandbox is on: agents' private homes go to a
	// temporary directory.
	g.cmd.Env = append(append(os.Environ(), "ACPGATE_SANDBOX_HOME="+filepath.Join(t.TempDir(), "homes")), env...)
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	go func() {
		defer close(g.done)
		gwlog.Read(stderr, func(rec map[string]any, line []byte) {
			fmt.Fprintf(log, "%s\n", line)
			if addr, ok := rec["addr"].(string); ok && rec["msg"] == "listening" {
				select {
				case addrCh <- addr:
				default:
				}
			}
		})
		_ = g.cmd.Wait()
	}()
	select {
	case g.addr = <-addrCh:
	case <-g.done:
		t.Fatalf("the gateway exited before listening:\n%s", log)
	case <-time.After(startLimit):
		g.kill()
		t.Fatalf("no \"listening\" line from the gateway within %v:\n%s", startLimit, log)
	}
	return g
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
func (g *gateway) stop() {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(stopLimit):
		g.t.Errorf("the gateway did not stop within %v of SIGTERM", stopLimit)
		g.kill()
		<-g.done
	}
}

// crash kills the gateway alone with SIGKILL, as a crash or a network cut
// would end its connections; its agents' supervisors clean up after it.
func (g *gateway) crash() {
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.done
}

func (g *gateway) kill() {
	_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
}

// ---------------------------------------------------------------------------
// Tests

// TestBrowserClient: the demo agent without authentication. Restarts keep
// the port, the session key and the demo agent's state dir, so a session
// survives them and the page can load it again after reconnecting.
func TestBrowserClient(t *testing.T) {
	node := requirePrereqs(t)
	bin := binary(t)
	dir := t.TempDir()

	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile := filepath.Join(dir, "session.key")
	writeFile(t, keyFile, hex.EncodeToString(key)+"\n", 0o600)
	config := filepath.Join(dir, "acpgate.yaml")
	writeFile(t, config, fmt.Sprintf("listen: 127.0.0.1:0\nshutdown_grace: 2s\nsession_key_file: %s\n", keyFile), 0o644)
	env := []string{"ACPGATE_DEMO_STATE_DIR=" + filepath.Join(dir, "state")}

	log := &lockedBuffer{}
	gw := startGateway(t, bin, config, env, log, "")
	defer func() { gw.stop() }()
	addr := gw.addr

	// The script stops the gateway (SIGTERM: a restart, 1001) or kills it
	// (SIGKILL: a dropped connection, 1006), checks that the page keeps
	// retrying, then has it started again on the same address.
	var actions []string
	runScript(t, node, "http://"+addr+"/", "main", nil, func(action string) error {
		actions = append(actions, action)
		switch action {
		case "stop":
			gw.stop()
		case "kill":
			gw.crash()
		case "start":
			fmt.Fprintf(log, "--- start again on %s ---\n", addr)
			gw = startGateway(t, bin, config, env, log, addr)
		default:
			return fmt.Errorf("unknown harness action %q", action)
		}
		return nil
	}, log)
	gw.stop()
	saveLog(t, "client-gateway.log", log)
	if got, want := strings.Join(actions, ","), "stop,start,kill,start"; got != want {
		t.Errorf("harness actions %q, want %q", got, want)
	}
}

// TestBrowserTenantToken: a gateway with one tenant. The browser is refused
// without a token and with a bad one, and connects with the good one (sent
// in the WebSocket subprotocol list) and with a one-time ticket.
func TestBrowserTenantToken(t *testing.T) {
	node := requirePrereqs(t)
	bin := binary(t)
	dir := t.TempDir()
	const good = "good-token"
	config := tenantConfig(t, dir, good, "")
	env := []string{"ACPGATE_DEMO_STATE_DIR=" + filepath.Join(dir, "state")}

	log := &lockedBuffer{}
	gw := startGateway(t, bin, config, env, log, "")
	defer gw.stop()

	runScript(t, node, "http://"+gw.addr+"/", "tenant", []string{"ACPGATE_GOOD_TOKEN=" + good}, nil, log)

	gw.stop()
	saveLog(t, "tenant-gateway.log", log)
	for _, secret := range []string{good, "bad-token"} {
		if strings.Contains(log.String(), secret) {
			t.Errorf("the gateway log contains the token %q", secret)
		}
	}
}

// runScript runs e2e.mjs and relays its "@@harness ACTION" requests to
// onAction, answering "ok" on its stdin.
func runScript(t *testing.T, node, url, scenario string, env []string, onAction func(string) error, gwLog *lockedBuffer) {
	t.Helper()
	outDir, err := filepath.Abs(filepath.Join("..", "out", "browser"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "e2e.mjs", url, scenario)
	cmd.Env = append(append(os.Environ(), "ACPGATE_BROWSER_OUT="+outDir, "ACPGATE_CHROMIUM="+chromiumPath), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// On timeout, kill node and the browser it started.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var actionErr error
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		action, ok := strings.CutPrefix(line, "@@harness ")
		if !ok {
			t.Log(line)
			continue
		}
		t.Logf("harness: %s", action)
		reply := "ok"
		if onAction == nil {
			actionErr = errors.New("this scenario takes no harness actions")
		} else if err := onAction(action); err != nil {
			actionErr = err
		}
		if actionErr != nil {
			reply = "error"
		}
		if _, err := io.WriteString(stdin, reply+"\n"); err != nil {
			t.Errorf("writing to the script: %v", err)
		}
	}
	_ = stdin.Close()
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Errorf("e2e.mjs %s did not finish within %v", scenario, scriptLimit)
	}
	if actionErr != nil {
		t.Errorf("harness action: %v", actionErr)
	}
	if err != nil || t.Failed() {
		t.Errorf("e2e.mjs %s: %v after %v\n--- script stderr ---\n%s\n--- gateway log ---\n%s",
			scenario, err, time.Since(start).Round(time.Millisecond), stderr.String(), tail(gwLog.String(), 60))
		return
	}
	t.Logf("e2e.mjs %s passed in %v; screenshots in %s", scenario, time.Since(start).Round(time.Millisecond), outDir)
}

// saveLog keeps the gateway's log next to the screenshots.
func saveLog(t *testing.T, name string, log *lockedBuffer) {
	path := filepath.Join("..", "out", "browser", name)
	if err := os.WriteFile(path, []byte(log.String()), 0o644); err != nil {
		t.Logf("saving the gateway log: %v", err)
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("… %d earlier lines", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
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
	config := filepath.Join(dir, "acpgate.yaml")
	writeFile(t, config, fmt.Sprintf(`listen: 127.0.0.1:0
shutdown_grace: 2s
%stenants:
  - name: t1
    tokens_sha256: [%q]
    root: %q
    virtual_root: /workspace
`, extra, hex.EncodeToString(sum[:]), root), 0o644)
	return config
}
