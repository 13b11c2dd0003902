//go:build unix

// Package interop checks acpgate against third-party ACP software: the
// official TypeScript SDK's WebSocket client (sdk-client.mjs) and real
// agents (@zed-industries/claude-code-acp, @zed-industries/codex-acp), whose
// answers through the gateway are compared with their answers over stdio
// (probe.mjs).
//
// The Node packages are pinned in package.json / package-lock.json. Install
// them with `cd test/interop && npm ci`. Without them the tests skip, unless
// ACPGATE_REQUIRE_INTEROP=1 is set (as in CI), which makes that a failure.
// No network access and no credentials are needed.
package interop

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	testharness "github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

const (
	requireEnv = "ACPGATE_REQUIRE_INTEROP" // "1": missing Node or node_modules fails instead of skipping
	verboseEnv = "ACPGATE_INTEROP_VERBOSE" // "1": always log the gateway's full log
	markEnv    = "ACPGATE_INTEROP_MARK"    // set in every child's environment to find leftovers

	// Bounds. Normal runs take a few seconds, but on a loaded machine Node
	// takes seconds to start and claude-code-acp's session/new up to ~20s.
	runLimit      = 60 * time.Second // one run of a Node script (then its process group is killed)
	scriptTimeout = 50 * time.Second // the script's own --timeout, so it can report and clean up first
	readyLimit    = 60 * time.Second // gateway start until its pool has an initialized agent
)

var (
	interopDir string // absolute path of test/interop
	repoRoot   string
	gatewayBin string // built once by TestMain, or ACPGATE_E2E_BIN
	binDir     string // TestMain's, for binaries tests build
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	interopDir = wd
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))

	binDir, err = os.MkdirTemp("", "acpgate-interop-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	start := time.Now()
	// ACPGATE_E2E_BIN: a gateway built beforehand (an older one, to show a
	// test fails there), as the e2e tests take it.
	if gatewayBin, err = testharness.Prebuilt(); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	} else if gatewayBin == "" {
		if gatewayBin, err = testharness.Build(binDir, false); err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
	}
	if testing.Verbose() {
		fmt.Printf("interop: gateway %s, ready in %v\n", gatewayBin, time.Since(start).Round(time.Millisecond))
	}

	code := m.Run()
	if code == 0 {
		// Every exec.Cmd is waited for; nothing of ours may still run.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "interop: goroutine leak:", err)
			code = 1
		}
	}
	return code
}

// ---------------------------------------------------------------------------
// Prerequisites

var (
	nodeOnce sync.Once
	nodeBin  string
	nodeErr  error
)

// requireNode returns the path of a node (>= 20) binary and checks that each
// of the given paths exists under test/interop/node_modules. When something
// is missing the test skips, or fails if ACPGATE_REQUIRE_INTEROP=1.
func requireNode(t *testing.T, modulePaths ...string) string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		testharness.Missing(t, fmt.Sprintf(format, args...), requireEnv)
	}
	nodeOnce.Do(func() { nodeBin, nodeErr = testharness.Node() })
	if nodeErr != nil {
		missing("interop: no usable node: %v", nodeErr)
	}
	if _, err := os.Stat(filepath.Join(interopDir, "node_modules")); err != nil {
		missing("interop: test/interop/node_modules is missing (run `cd test/interop && npm ci`)")
	}
	for _, p := range modulePaths {
		full := filepath.Join(interopDir, "node_modules", filepath.FromSlash(p))
		if _, err := os.Stat(full); err != nil {
			missing("interop: %s is not installed (run `cd test/interop && npm ci`)", filepath.Join("test/interop/node_modules", p))
		}
	}
	return nodeBin
}

// ---------------------------------------------------------------------------
// Harness: temp dirs, child environments, leftover-process check

type harness struct {
	t    *testing.T
	base string
	mark string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t}
	var b [6]byte
	_, _ = rand.Read(b[:])
	h.mark = t.Name() + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])

	// Temp dirs go under <repo>/test/out (git-ignored), not under /tmp:
	// codex-acp refuses to set up its helpers when HOME is in the temp dir.
	outDir := filepath.Join(repoRoot, "test", "out")
	if err := os.MkdirAll(outDir, 0o755); err == nil {
		h.base, err = os.MkdirTemp(outDir, "interop-"+t.Name()+"-")
		if err != nil {
			h.base = ""
		}
	}
	if h.base == "" {
		h.base = t.TempDir()
		t.Logf("cannot create a dir under %s; using %s", outDir, h.base)
	} else {
		base := h.base
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("kept %s for inspection", base)
				return
			}
			if err := os.RemoveAll(base); err != nil {
				t.Logf("remove %s: %v", base, err)
			}
		})
	}
	// Registered after the dir removal, so it runs before it (and after
	// every process-stopping cleanup registered later).
	t.Cleanup(h.checkLeftovers)
	return h
}

func (h *harness) mkdir(name string) string {
	h.t.Helper()
	d := filepath.Join(h.base, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		h.t.Fatal(err)
	}
	return d
}

// environ is the whole environment of every child: nothing of ours (no API
// keys, no config dirs) leaks into the agents, and HOME is a fresh dir.
func (h *harness) environ(home string) []string {
	path := os.Getenv("PATH")
	if nodeBin != "" {
		path = filepath.Dir(nodeBin) + string(os.PathListSeparator) + path
	}
	return []string{
		"PATH=" + path, "HOME=" + home, "LANG=C.UTF-8", markEnv + "=" + h.mark,
		// claude-code-acp: no feature-flag fetches, telemetry or update
		// checks. One run without these hung in session/new for 50s+ (its
		// feature-flag cache was never written), directly over stdio.
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
	}
}

// markedProcesses lists the processes whose environment carries this test's
// mark (Linux /proc only; elsewhere it finds nothing).
func (h *harness) markedProcesses() map[int]string {
	found := map[int]string{}
	for _, pid := range proctree.WithEnv(markEnv + "=" + h.mark) {
		if pid != os.Getpid() {
			found[pid] = proctree.Cmdline(pid)
		}
	}
	return found
}

// checkLeftovers fails the test if any process it started (or any of their
// descendants) is still running once everything was stopped, and kills them.
func (h *harness) checkLeftovers() {
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := h.markedProcesses()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var list []string
			for pid, cmd := range left {
				list = append(list, fmt.Sprintf("%d: %s", pid, cmd))
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			slices.Sort(list)
			h.t.Errorf("processes left running after the test (now killed):\n  %s", strings.Join(list, "\n  "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Gateway process

type gateway struct {
	*testharness.Gateway
	start time.Time
	logs  *lineLog

	stopOnce sync.Once
}

// lineLog keeps the gateway's output, a line at a time.
type lineLog struct {
	mu    sync.Mutex
	buf   []byte
	lines []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.lines)
	if len(l.buf) > 0 {
		out = append(out, string(l.buf))
	}
	return out
}

const allowAllPolicy = `policy:
  session: {load: true, resume: true, close: true, list: true, delete: true, fork: true, additional_directories: true}
  mcp: {stdio: true, http: true, sse: true}
  prompt: {image: true, audio: true, embedded_context: true}
  client: {fs_read: true, fs_write: true, terminal: true}
  agent_auth: true
  extensions: {allow: ["_*"]}
  unstable: true
`

// startGateway runs `acpgate serve` on 127.0.0.1:0 with the given agent
// command line ("" = the built-in demo agent) and waits until it listens.
func (h *harness) startGateway(t *testing.T, agentCmdline, home, dir string) *gateway {
	t.Helper()
	// Everything allowed: the gateway must then answer as the agent does.
	// (The default policy filters what the agent advertises; proxy/policy's
	// tests cover that against these agents' recorded answers.)
	return h.startGatewayWith(t, allowAllPolicy, agentCmdline, home, dir)
}

// startGatewayWith is startGateway with the given configuration file.
func (h *harness) startGatewayWith(t *testing.T, config, agentCmdline, home, dir string) *gateway {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "acpgate.interop.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "info", "--config", cfgPath}
	if agentCmdline != "" {
		args = append(args, "--agent", agentCmdline)
	}
	g := &gateway{start: time.Now(), logs: &lineLog{}}
	g.Gateway = testharness.Start(t, testharness.Options{Argv: append([]string{gatewayBin}, args...), Env: h.environ(home), Dir: dir,
		Setpgid: true, Stop: 30 * time.Second, Log: g.logs})
	t.Cleanup(func() { g.stop(t) })
	t.Logf("gateway pid %d listening on %s after %v (agent: %s)", g.Cmd.Process.Pid, g.Addr,
		time.Since(g.start).Round(time.Millisecond), orDefault(agentCmdline, "built-in demo agent"))
	return g
}

// startTenantGateway starts the built-in demo agent behind one tenant,
// named tenant, whose root is work and whose token (returned) is
// tokenPrefix and the harness's mark in hex; it waits until it is ready.
func (h *harness) startTenantGateway(t *testing.T, tenant, tokenPrefix, home, work string) (*gateway, string) {
	t.Helper()
	token := tokenPrefix + hex.EncodeToString([]byte(h.mark))
	sum := sha256.Sum256([]byte(token))
	cfg := allowAllPolicy + fmt.Sprintf("tenants:\n  - name: %s\n    root: %q\n    tokens_sha256: [%q]\nsandbox: {home: %q}\n",
		tenant, work, hex.EncodeToString(sum[:]), h.mkdir("homes"))
	g := h.startGatewayWith(t, cfg, "", home, work)
	g.waitReady(t, readyLimit)
	return g, token
}

func (g *gateway) url() string { return "ws://" + g.Addr + "/acp" }

// waitReady polls /readyz until the pool has an initialized agent.
func (g *gateway) waitReady(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 2 * time.Second}
	last := ""
	for time.Now().Before(deadline) {
		resp, err := client.Get("http://" + g.Addr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("gateway ready (agent initialized) %v after start", time.Since(g.start).Round(time.Millisecond))
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		select {
		case <-g.Done():
			t.Fatalf("gateway exited while waiting for /readyz: %v", g.ExitErr())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("gateway not ready within %v (last /readyz: %s)", within, last)
}

// stop sends SIGTERM, waits for the drain and checks the exit status. It
// runs once (from the test, and again as a no-op from the cleanup).
func (g *gateway) stop(t *testing.T) {
	g.stopOnce.Do(func() {
		start := time.Now()
		g.Stop(syscall.SIGTERM)
		if err := g.ExitErr(); err != nil {
			t.Errorf("gateway exit after SIGTERM: %v (want status 0)", err)
		} else {
			t.Logf("gateway drained and exited 0 in %v after SIGTERM", time.Since(start).Round(time.Millisecond))
		}
		g.report(t)
	})
}

// report logs the gateway's warnings and errors (always) and its whole log
// (when the test failed or ACPGATE_INTEROP_VERBOSE=1).
func (g *gateway) report(t *testing.T) {
	lines := g.logs.snapshot()
	if t.Failed() || os.Getenv(verboseEnv) == "1" {
		t.Logf("gateway log (%d lines):\n%s", len(lines), strings.Join(lines, "\n"))
		return
	}
	var notable []string
	for _, l := range lines {
		var rec struct{ Level string }
		if json.Unmarshal([]byte(l), &rec) != nil || rec.Level == "WARN" || rec.Level == "ERROR" {
			notable = append(notable, l)
		}
	}
	if len(notable) > 0 {
		t.Logf("gateway warnings/errors:\n%s", strings.Join(notable, "\n"))
	}
}

// ---------------------------------------------------------------------------
// Node scripts

// outLine is one JSON line printed by sdk-client.mjs or probe.mjs.
type outLine struct {
	Type      string          `json:"type"`
	Method    string          `json:"method"`
	Ms        float64         `json:"ms"`
	Message   json.RawMessage `json:"message"`
	Result    json.RawMessage `json:"result"`
	Params    json.RawMessage `json:"params"`
	Response  json.RawMessage `json:"response"`
	Error     json.RawMessage `json:"error"`
	SessionID string          `json:"sessionId"`
	Protocol  string          `json:"protocol"`
	PID       int             `json:"pid"`
	Stage     string          `json:"stage"`
	T         float64         `json:"t"`         // ms since the script started
	CleanupMs float64         `json:"cleanupMs"` // probe.mjs "done"
	raw       string
}

type nodeRun struct {
	lines    []outLine
	stderr   string
	err      error // from Wait; nil = exit 0
	timedOut bool
	took     time.Duration
}

// eachOutLine calls f with every non-empty line of r (trimmed, in raw)
// parsed as an outLine, and the error if it is not JSON.
func eachOutLine(r io.Reader, f func(l outLine, err error)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var l outLine
		err := json.Unmarshal([]byte(line), &l)
		l.raw = line
		f(l, err)
	}
}

func (r *nodeRun) find(typ, method string) []outLine {
	var out []outLine
	for _, l := range r.lines {
		if l.Type == typ && (method == "" || l.Method == method) {
			out = append(out, l)
		}
	}
	return out
}

func (r *nodeRun) dump() string {
	var b strings.Builder
	for _, l := range r.lines {
		b.WriteString(truncate(l.raw, 2000))
		b.WriteByte('\n')
	}
	if r.stderr != "" {
		b.WriteString("stderr:\n")
		b.WriteString(truncate(r.stderr, 8000))
	}
	return b.String()
}

// runNode runs `node <script> args...` in its own process group and waits
// for it, at most `limit`: then the group gets SIGTERM, 5s later SIGKILL.
func (h *harness) runNode(t *testing.T, home, dir string, limit time.Duration, script string, args ...string) *nodeRun {
	t.Helper()
	cmd := exec.Command(nodeBin, append([]string{filepath.Join(interopDir, script)}, args...)...)
	cmd.Dir = dir
	cmd.Env = h.environ(home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	r := &nodeRun{}
	select {
	case r.err = <-done:
	case <-time.After(limit):
		r.timedOut = true
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case r.err = <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			r.err = <-done
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // anything left in the group
	r.took = time.Since(start)
	r.stderr = stderr.String()
	eachOutLine(&stdout, func(l outLine, err error) {
		if err != nil {
			t.Errorf("%s printed a line that is not JSON: %q", script, truncate(l.raw, 500))
			return
		}
		r.lines = append(r.lines, l)
	})
	// The agent a stdio probe started runs in a group of its own; the probe
	// must have stopped it. (Killed orphans may take a moment to be reaped.)
	for _, l := range r.find("spawn", "") {
		if l.PID <= 0 {
			continue
		}
		for i := 0; i < 30 && syscall.Kill(-l.PID, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if syscall.Kill(-l.PID, 0) == nil {
			t.Errorf("%s left its agent's process group %d running; killing it", script, l.PID)
			_ = syscall.Kill(-l.PID, syscall.SIGKILL)
		}
	}
	if r.timedOut {
		t.Errorf("%s %s: no result within %v; killed\n%s", script, strings.Join(args, " "), limit, r.dump())
	}
	return r
}

// ---------------------------------------------------------------------------
// Test a: the SDK's WebSocket client against the demo agent

func TestSDKClientDemoAgent(t *testing.T) {
	requireNode(t, "@agentclientprotocol/sdk/package.json", "ws/package.json")
	h := newHarness(t)
	home, work, state := h.mkdir("home"), h.mkdir("work"), h.mkdir("demo-state")
	agent := shellJoin(gatewayBin, "demo-agent", "--chunk-delay", "-1ms", "--state-dir", state)
	g := h.startGateway(t, agent, home, work)
	g.waitReady(t, readyLimit)

	// runClient runs one prompt and checks what every prompt must satisfy.
	runClient := func(t *testing.T, prompt string) (r *nodeRun, sid, text string) {
		t.Helper()
		r = h.runNode(t, home, work, runLimit, "sdk-client.mjs",
			"--timeout", msString(scriptTimeout), g.url(), work, prompt)
		t.Logf("sdk-client %q: exit %v in %v, %d lines", prompt, errOrZero(r.err), r.took.Round(time.Millisecond), len(r.lines))
		if r.err != nil {
			t.Fatalf("sdk-client.mjs failed: %v\n%s", r.err, r.dump())
		}
		if r.stderr != "" {
			t.Logf("sdk-client stderr:\n%s", truncate(r.stderr, 4000))
		}

		inits := r.find("initialize", "")
		if len(inits) != 1 {
			t.Fatalf("want 1 initialize line, got %d\n%s", len(inits), r.dump())
		}
		var init struct {
			ProtocolVersion int `json:"protocolVersion"`
			AgentInfo       struct {
				Name string `json:"name"`
			} `json:"agentInfo"`
		}
		mustUnmarshal(t, inits[0].Result, &init)
		if init.ProtocolVersion != 1 || init.AgentInfo.Name != "acpgate-demo-agent" {
			t.Errorf("initialize result: protocolVersion %d, agentInfo.name %q; want 1, acpgate-demo-agent\n%s",
				init.ProtocolVersion, init.AgentInfo.Name, inits[0].raw)
		}

		news := r.find("session/new", "")
		if len(news) != 1 || news[0].SessionID == "" {
			t.Fatalf("want 1 session/new line with a sessionId\n%s", r.dump())
		}
		sid = news[0].SessionID
		if strings.HasPrefix(sid, "demo-") {
			t.Errorf("client saw the agent's own session id %q; the gateway must issue its own", sid)
		}

		var chunks []string
		for i, u := range r.find("session/update", "") {
			var p struct {
				SessionID string `json:"sessionId"`
				Update    struct {
					SessionUpdate string          `json:"sessionUpdate"`
					Content       json.RawMessage `json:"content"`
				} `json:"update"`
			}
			mustUnmarshal(t, u.Params, &p)
			if p.SessionID != sid {
				t.Errorf("session/update #%d has sessionId %q, want the client's %q", i, p.SessionID, sid)
			}
			if p.Update.SessionUpdate == "agent_message_chunk" {
				var c struct{ Type, Text string }
				mustUnmarshal(t, p.Update.Content, &c)
				chunks = append(chunks, c.Text)
			}
		}
		text = strings.Join(chunks, "")

		prompts := r.find("session/prompt", "")
		if len(prompts) != 1 {
			t.Fatalf("want 1 session/prompt line, got %d\n%s", len(prompts), r.dump())
		}
		if i, j := slices.IndexFunc(r.lines, func(l outLine) bool { return l.Type == "session/prompt" }), len(r.lines)-1; i != j {
			t.Errorf("the prompt result is line %d of %d; nothing may follow it\n%s", i+1, j+1, r.dump())
		}
		var res struct{ StopReason string }
		mustUnmarshal(t, prompts[0].Result, &res)
		if res.StopReason != "end_turn" {
			t.Errorf("stopReason = %q, want end_turn", res.StopReason)
		}
		t.Logf("session %s: %d updates, %d chunks, stopReason %s", sid, len(r.find("session/update", "")), len(chunks), res.StopReason)
		return r, sid, text
	}

	var clientSIDs []string

	t.Run("hello", func(t *testing.T) {
		r, sid, text := runClient(t, "hello")
		clientSIDs = append(clientSIDs, sid)
		if text != "You said: hello" {
			t.Errorf("agent_message_chunk texts = %q, want %q\n%s", text, "You said: hello", r.dump())
		}
		if reqs := r.find("request", ""); len(reqs) != 0 {
			t.Errorf("unexpected agent->client requests:\n%s", r.dump())
		}
	})

	t.Run("read", func(t *testing.T) {
		file := filepath.Join(work, "notes.txt")
		content := "first line\nsecond line\n"
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		r, sid, text := runClient(t, "read "+file)
		clientSIDs = append(clientSIDs, sid)
		reqs := r.find("request", "")
		if len(reqs) != 1 || reqs[0].Method != "fs/read_text_file" {
			t.Fatalf("want exactly one agent->client request, fs/read_text_file\n%s", r.dump())
		}
		var p struct{ SessionID, Path string }
		mustUnmarshal(t, reqs[0].Params, &p)
		if p.Path != file {
			t.Errorf("fs/read_text_file path = %q, want %q", p.Path, file)
		}
		if p.SessionID != sid {
			t.Errorf("fs/read_text_file sessionId = %q, want the client's %q", p.SessionID, sid)
		}
		var resp struct{ Content *string }
		if len(reqs[0].Error) > 0 {
			t.Fatalf("the client's fs/read_text_file handler failed: %s", reqs[0].Error)
		}
		mustUnmarshal(t, reqs[0].Response, &resp)
		if resp.Content == nil || *resp.Content != content {
			t.Errorf("the client answered fs/read_text_file with %s, want content %q", reqs[0].Response, content)
		}
		want := fmt.Sprintf("I read %s (23 bytes, 2 lines). The first line is: \"first line\"", file)
		if text != want {
			t.Errorf("agent reply = %q\nwant          %q", text, want)
		}
	})

	g.stop(t)

	// The agent's own ids are the names of its session files.
	ents, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	var agentSIDs []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && strings.HasPrefix(id, "demo-") {
			agentSIDs = append(agentSIDs, id)
		}
	}
	if len(agentSIDs) != len(clientSIDs) {
		t.Errorf("demo agent stored %d sessions %v; the client made %d", len(agentSIDs), agentSIDs, len(clientSIDs))
	}
	for _, sid := range clientSIDs {
		if slices.Contains(agentSIDs, sid) {
			t.Errorf("client session id %q is one of the agent's own ids %v", sid, agentSIDs)
		}
	}
	t.Logf("agent session ids %v were seen by the client as %v", agentSIDs, clientSIDs)
}

// ---------------------------------------------------------------------------
// Test b: real agents, directly over stdio versus through the gateway

func TestClaudeCodeACP(t *testing.T) {
	node := requireNode(t, "ws/package.json", "@zed-industries/claude-code-acp/dist/index.js")
	argv := []string{node, filepath.Join(interopDir, "node_modules", "@zed-industries", "claude-code-acp", "dist", "index.js")}
	direct, viaGW := compareWithGateway(t, argv, 1500*time.Millisecond)
	dNew, gNew := sessionNew(t, direct), sessionNew(t, viaGW)
	if dNew.Error != nil || gNew.Error != nil {
		t.Fatalf("session/new failed: directly %s, through the gateway %s", dNew.raw, gNew.raw)
	}
	dSID, gSID := dNew.Result["sessionId"], gNew.Result["sessionId"]
	dStr, _ := dSID.(string)
	gStr, _ := gSID.(string)
	if dStr == "" || gStr == "" {
		t.Fatalf("session/new without a sessionId: directly %v, through the gateway %v", dSID, gSID)
	}
	if gStr == dStr {
		t.Errorf("gateway session id %q equals the agent's", gStr)
	}
	uuidRe := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	if uuidRe.MatchString(dStr) && uuidRe.MatchString(gStr) {
		t.Errorf("gateway session id %q has the agent's id format (a UUID): not sealed?", gStr)
	}
	t.Logf("session ids: agent %s, gateway %s", dStr, gStr)

	// Apart from the id, the result must be the agent's.
	dRest, gRest := without(dNew.Result, "sessionId"), without(gNew.Result, "sessionId")
	t.Logf("session/new result keys: directly %v, through the gateway %v", sortedKeys(dNew.Result), sortedKeys(gNew.Result))
	if !slices.Equal(sortedKeys(dRest), sortedKeys(gRest)) {
		t.Errorf("session/new result keys differ: directly %v, through the gateway %v", sortedKeys(dNew.Result), sortedKeys(gNew.Result))
	}
	for k, dv := range dRest {
		if gv, ok := gRest[k]; ok && !reflect.DeepEqual(dv, gv) {
			t.Errorf("session/new result %q differs:\ndirectly:            %s\nthrough the gateway: %s", k, mustJSON(dv), mustJSON(gv))
		}
	}

	// Notifications that followed session/new (available_commands_update)
	// must arrive through the gateway too, with the client's session id.
	dN, gN := sessionUpdates(t, direct), sessionUpdates(t, viaGW)
	t.Logf("session/update after session/new: directly %v, through the gateway %v", kinds(dN), kinds(gN))
	for _, n := range gN {
		if n.sessionID != gStr {
			t.Errorf("through the gateway, a %s update carries sessionId %q, want %q", n.kind, n.sessionID, gStr)
		}
	}
	for _, d := range dN {
		i := slices.IndexFunc(gN, func(g update) bool { return g.kind == d.kind })
		if i < 0 {
			t.Errorf("the agent sent a %s update after session/new; it did not come through the gateway", d.kind)
			continue
		}
		if !reflect.DeepEqual(d.update, gN[i].update) {
			t.Errorf("%s update differs:\ndirectly:            %s\nthrough the gateway: %s", d.kind, mustJSON(d.update), mustJSON(gN[i].update))
		}
	}
}

func TestCodexACP(t *testing.T) {
	osName := map[string]string{"linux": "linux", "darwin": "darwin", "windows": "win32"}[runtime.GOOS]
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if osName == "" || arch == "" {
		t.Skipf("codex-acp has no binary for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	pkg := "@zed-industries/codex-acp-" + osName + "-" + arch
	requireNode(t, "ws/package.json", "@zed-industries/codex-acp/package.json", pkg+"/bin/codex-acp")
	// The native binary, not the Node wrapper (which would add a process).
	argv := []string{filepath.Join(interopDir, "node_modules", filepath.FromSlash(pkg), "bin", "codex-acp")}
	direct, viaGW := compareWithGateway(t, argv, 0)
	if strings.Contains(direct.stderr, "temporary dir") {
		t.Logf("note: codex-acp still complains about a temporary dir:\n%s", truncate(direct.stderr, 2000))
	}
	dNew, gNew := sessionNew(t, direct), sessionNew(t, viaGW)
	t.Logf("session/new: directly %s; through the gateway %s", truncate(dNew.raw, 300), truncate(gNew.raw, 300))
	if dNew.Error == nil {
		t.Fatalf("codex-acp accepted session/new without credentials (%s); this test expects its authentication error", truncate(dNew.raw, 500))
	}
	if gNew.Error == nil {
		t.Fatalf("through the gateway session/new succeeded (%s); directly it failed with %s", truncate(gNew.raw, 500), mustJSON(dNew.Error))
	}
	if dNew.Error["code"] != gNew.Error["code"] || dNew.Error["message"] != gNew.Error["message"] {
		t.Errorf("session/new error differs: directly %s, through the gateway %s", mustJSON(dNew.Error), mustJSON(gNew.Error))
	} else if !reflect.DeepEqual(dNew.Error, gNew.Error) {
		t.Errorf("session/new error has the same code and message but other fields differ: directly %s, through the gateway %s",
			mustJSON(dNew.Error), mustJSON(gNew.Error))
	}
}

// compareWithGateway runs probe.mjs against the agent over stdio and through a
// gateway started on the same agent, and checks the common part: both
// answered initialize and session/new, the initialize results are the same
// JSON, and the WebSocket spoke subprotocol "acp". It returns both runs for
// the agent-specific checks.
func compareWithGateway(t *testing.T, agentArgv []string, linger time.Duration) (direct, viaGW *nodeRun) {
	h := newHarness(t)
	work := h.mkdir("work")
	probeArgs := []string{"--cwd", work, "--linger", msString(linger), "--timeout", msString(scriptTimeout)}

	// Directly over stdio, with a fresh HOME.
	homeD := h.mkdir("home-direct")
	args := append(append(slices.Clone(probeArgs), "--"), agentArgv...)
	direct = h.runNode(t, homeD, work, runLimit, "probe.mjs", args...)
	logProbe(t, "directly", direct)
	if direct.err != nil {
		t.Fatalf("probe.mjs over stdio failed: %v\n%s", direct.err, direct.dump())
	}

	// Through the gateway (its agents get their own fresh HOME).
	homeG := h.mkdir("home-gateway")
	g := h.startGateway(t, shellJoin(agentArgv...), homeG, work)
	g.waitReady(t, readyLimit)
	args = append(slices.Clone(probeArgs), g.url())
	viaGW = h.runNode(t, homeG, work, runLimit, "probe.mjs", args...)
	logProbe(t, "through the gateway", viaGW)
	checkReportedUsage(t, g, viaGW)
	g.stop(t)
	if viaGW.err != nil {
		t.Fatalf("probe.mjs through the gateway failed: %v\n%s", viaGW.err, viaGW.dump())
	}
	if open := viaGW.find("open", ""); len(open) != 1 || open[0].Protocol != "acp" {
		t.Errorf("WebSocket subprotocol: want \"acp\"\n%s", viaGW.dump())
	}

	dInit, gInit := response(t, direct, "initialize"), response(t, viaGW, "initialize")
	if dInit.Error != nil || gInit.Error != nil {
		t.Fatalf("initialize failed: directly %s, through the gateway %s", dInit.raw, gInit.raw)
	}
	// The gateway adds its own resume token under _meta.acpgate
	// (docs/protocol.md, "Resume after a drop"); everything else must be the agent's answer.
	if meta, _ := gInit.Result["_meta"].(map[string]any); meta != nil {
		ag, _ := meta["acpgate"].(map[string]any)
		if tok, _ := ag["resumeToken"].(string); len(tok) < 22 {
			t.Errorf("the gateway's initialize result lacks _meta.acpgate.resumeToken: %s", gInit.raw)
		}
		delete(meta, "acpgate")
		if len(meta) == 0 {
			delete(gInit.Result, "_meta")
		}
	} else {
		t.Errorf("the gateway's initialize result has no _meta.acpgate.resumeToken: %s", gInit.raw)
	}
	// It also offers session/attach (docs/protocol.md, "Several clients on one session").
	if !dropAttachCapability(gInit.Result) {
		t.Errorf("the gateway's initialize result lacks agentCapabilities.sessionCapabilities.attach: %s", gInit.raw)
	}
	if !reflect.DeepEqual(dInit.Result, gInit.Result) {
		t.Errorf("initialize results differ:\ndirectly:            %s\nthrough the gateway: %s", mustJSON(dInit.Result), mustJSON(gInit.Result))
	} else {
		t.Logf("initialize results are identical (%d bytes)", len(mustJSON(dInit.Result)))
	}
	for _, r := range []*nodeRun{direct, viaGW} {
		for _, typ := range []string{"request", "other", "nonjson", "close", "exit"} {
			for _, l := range r.find(typ, "") {
				t.Errorf("unexpected %s line from probe.mjs: %s", typ, truncate(l.raw, 1000))
			}
		}
	}
	return direct, viaGW
}

func logProbe(t *testing.T, how string, r *nodeRun) {
	t.Helper()
	var parts []string
	for _, l := range r.lines {
		switch l.Type {
		case "spawn", "open":
			parts = append(parts, fmt.Sprintf("%s at %vms", l.Type, l.T))
		case "response":
			parts = append(parts, fmt.Sprintf("%s took %vms", l.Method, l.Ms))
		case "done":
			parts = append(parts, fmt.Sprintf("done at %vms (cleanup %vms)", l.T, l.CleanupMs))
		}
	}
	t.Logf("probe %s: exit %v, wall %v; %s; %d notifications", how, errOrZero(r.err), r.took.Round(time.Millisecond),
		strings.Join(parts, ", "), len(r.find("notification", "")))
	if r.stderr != "" {
		t.Logf("probe %s stderr:\n%s", how, truncate(r.stderr, 3000))
	}
}

// rpcResponse is a decoded JSON-RPC response.
type rpcResponse struct {
	Result map[string]any `json:"result"`
	Error  map[string]any `json:"error"`
	raw    string
}

func response(t *testing.T, r *nodeRun, method string) rpcResponse {
	t.Helper()
	ls := r.find("response", method)
	if len(ls) != 1 {
		t.Fatalf("want one %s response, got %d\n%s", method, len(ls), r.dump())
	}
	var resp rpcResponse
	mustUnmarshal(t, ls[0].Message, &resp)
	resp.raw = string(ls[0].Message)
	if (resp.Result == nil) == (resp.Error == nil) {
		t.Fatalf("%s response has neither or both of result and error: %s", method, ls[0].Message)
	}
	return resp
}

func sessionNew(t *testing.T, r *nodeRun) rpcResponse {
	t.Helper()
	return response(t, r, "session/new")
}

type update struct {
	kind, sessionID string
	update          map[string]any
}

// sessionUpdates returns the session/update notifications of a probe run
// (for any session; sessionID is what each carried).
func sessionUpdates(t *testing.T, r *nodeRun) []update {
	t.Helper()
	var out []update
	for _, l := range r.find("notification", "") {
		var n struct {
			Method string `json:"method"`
			Params struct {
				SessionID string         `json:"sessionId"`
				Update    map[string]any `json:"update"`
			} `json:"params"`
		}
		mustUnmarshal(t, l.Message, &n)
		if n.Method != "session/update" {
			continue
		}
		kind, _ := n.Params.Update["sessionUpdate"].(string)
		out = append(out, update{kind: kind, sessionID: n.Params.SessionID, update: n.Params.Update})
	}
	return out
}

// ---------------------------------------------------------------------------
// Small helpers

// shellJoin quotes argv for acpgate's --agent flag (POSIX-shell-like words).
func shellJoin(argv ...string) string {
	safe := regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)
	q := make([]string, len(argv))
	for i, a := range argv {
		if safe.MatchString(a) {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

func mustUnmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if len(data) == 0 {
		t.Fatalf("missing JSON value (want %T)", v)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("decode %s: %v", truncate(string(data), 500), err)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(b)
}

func without(m map[string]any, key string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func kinds(us []update) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.kind
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("...(%d more bytes)", len(s)-n)
}

func msString(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func errOrZero(err error) any {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	return err
}
