package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/acpgate/acpgate/gateway"
	"github.com/acpgate/acpgate/gateway/config"
	testharness "github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// procCPU is a process's user+system CPU time so far, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procStatus reads one "Key: value kB" line of /proc/<pid>/status, in bytes
// for kB values.
func procStatus(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		v, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		return n, nil
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

func procRSS(pid int) (int64, error) { return procStatus(pid, "VmRSS") }

// descendants lists every process below pid.
func descendants(pid int) []int {
	var out []int
	for c := range proctree.Subtree(proctree.Table(), pid) {
		out = append(out, c)
	}
	return out
}

// agentPIDs lists the load agents running below pid (not their
// supervisors).
func (h *harness) agentPIDs(pid int) []int {
	var out []int
	for _, p := range descendants(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(argv) == 2 && argv[0] == h.exe && argv[1] == "agent" {
			out = append(out, p)
		}
	}
	return out
}

// cpuOf sums the CPU time of processes; ones that have gone count as 0.
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if d, err := procCPU(p); err == nil {
			sum += d
		}
	}
	return sum
}

// selfCPU is this process's CPU time (all threads), from getrusage.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// raiseNoFile lifts RLIMIT_NOFILE as far as allowed: to want (soft and hard)
// as root, else the soft limit to the hard one. Children inherit it.
func raiseNoFile(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	try := syscall.Rlimit{Cur: want, Max: max(want, lim.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &try); err == nil {
		return want, nil
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Cur, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// children tracks the processes the harness started, so that a timeout can
// stop them all.
var children struct {
	mu   sync.Mutex
	cmds map[*exec.Cmd]struct{}
}

// child is a load client the harness runs: it reports JSON lines on its
// stdout and ends when its stdin closes.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	dec   *json.Decoder
	errb  *testharness.SyncBuffer
}

// startChild runs the harness binary with args as a child (killed with
// the harness).
func (h *harness) startChild(args ...string) (*child, error) {
	errb := &testharness.SyncBuffer{Max: 64 << 10}
	cmd, stdin, stdout, err := startPiped(append([]string{h.exe}, args...), errb)
	if err != nil {
		return nil, err
	}
	trackChild(cmd)
	return &child{cmd: cmd, stdin: stdin, dec: json.NewDecoder(stdout), errb: errb}, nil
}

// decode reads the child's next JSON line, for at most timeout (then the
// child is killed).
func (ch *child) decode(v any, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- ch.dec.Decode(v) }() // ends with the child's stdout
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = ch.cmd.Process.Kill()
		return fmt.Errorf("no answer from the client within %s", timeout)
	}
}

// finish closes the child's stdin and waits for it to exit, killing it
// after wait.
func (ch *child) finish(wait time.Duration) {
	_ = ch.stdin.Close()
	done := make(chan struct{})
	go func() { _ = ch.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		_ = ch.cmd.Process.Kill()
		<-done
	}
	untrackChild(ch.cmd)
}

func trackChild(c *exec.Cmd) {
	children.mu.Lock()
	defer children.mu.Unlock()
	if children.cmds == nil {
		children.cmds = map[*exec.Cmd]struct{}{}
	}
	children.cmds[c] = struct{}{}
}

func untrackChild(c *exec.Cmd) {
	children.mu.Lock()
	defer children.mu.Unlock()
	delete(children.cmds, c)
}

func killChildren() {
	children.mu.Lock()
	defer children.mu.Unlock()
	for c := range children.cmds {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
}

// server is a WebSocket server the harness started: the acpgate binary or
// websocketd.
type server struct {
	name    string
	cmd     *exec.Cmd
	addr    string
	url     string
	logPath string
	done    chan struct{}
	waitErr error
}

func (s *server) Pid() int { return s.cmd.Process.Pid }

// logTail is the end of the server's log, for error messages.
func (s *server) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop sends SIGTERM and waits (SIGKILL after 20 s).
func (s *server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	untrackChild(s.cmd)
}

func startServer(name string, argv []string, dir string, port int) (*server, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, port))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	trackChild(cmd)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s := &server{name: name, cmd: cmd, addr: addr, url: "ws://" + addr + "/acp", logPath: logPath, done: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.done) }()
	return s, nil
}

// waitHTTP polls url until it answers 200, for at most timeout.
func (s *server) waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("%s exited (%v) before it was ready:\n%s", s.name, s.waitErr, s.logTail())
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s not ready within %s:\n%s", s.name, url, timeout, s.logTail())
}

// waitTCP waits until the server accepts TCP connections.
func (s *server) waitTCP(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("%s exited (%v) before it listened:\n%s", s.name, s.waitErr, s.logTail())
		default:
		}
		if c, err := net.DialTimeout("tcp", s.addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s did not listen on %s within %s:\n%s", s.name, s.addr, timeout, s.logTail())
}

// gwConfig is what a scenario sets in the gateway's configuration.
type gwConfig struct {
	minIdle, maxProcs, perProc int
	queueMsgs, queueBytes      int
	noRateLimit                bool // limits.messages_per_second: 0 (capacity runs)
	noResume                   bool // sessions.detach_timeout: 0 (no replay buffer)
	// sessions.history_bytes and sessions.max_clients (issue #22); unset
	// (false, 0) leaves the gateway's defaults.
	historySet   bool
	historyBytes int
	maxClients   int
	audit        bool   // audit: {file: a new file under the harness's tmp}
	traceTo      string // observability.tracing.endpoint ("" = tracing off)
	extra        string // more top-level YAML, appended as it is
}

// auditFiles numbers the audit files of the gateways a run starts.
var auditFiles atomic.Int64

// gatewayYAML is the configuration file the gateway runs with: the load
// agent, loopback only, and the extension method allowed by the policy.
// Keys the binary does not know (see probeConfig) are left out.
func (h *harness) gatewayYAML(o gwConfig, listen string) string {
	if o.queueMsgs == 0 {
		o.queueMsgs = 4096
	}
	if o.queueBytes == 0 {
		o.queueBytes = 64 << 20
	}
	var b strings.Builder
	fmt.Fprintf(&b, `listen: %s
agent:
  command: [%q, "agent"]
  stop_grace: 2s
pool:
  min_idle: %d
  max_processes: %d
  max_sessions_per_process: %d
limits:
  send_queue_messages: %d
  send_queue_bytes: %d
`, listen, h.exe, o.minIdle, o.maxProcs, o.perProc, o.queueMsgs, o.queueBytes)
	if o.noRateLimit && !h.noRateKey {
		b.WriteString("  messages_per_second: 0\n")
	}
	var sessions []string
	if o.noResume {
		sessions = append(sessions, "detach_timeout: 0s")
	}
	if o.historySet {
		sessions = append(sessions, fmt.Sprintf("history_bytes: %d", o.historyBytes))
	}
	if o.maxClients > 0 {
		sessions = append(sessions, fmt.Sprintf("max_clients: %d", o.maxClients))
	}
	if len(sessions) > 0 {
		b.WriteString("sessions: {" + strings.Join(sessions, ", ") + "}\n")
	}
	if o.traceTo != "" {
		fmt.Fprintf(&b, "observability: {tracing: {endpoint: %q}}\n", o.traceTo)
	}
	if o.audit {
		fmt.Fprintf(&b, "audit: {file: %q}\n", filepath.Join(h.tmp, fmt.Sprintf("audit-%d.jsonl", auditFiles.Add(1))))
	}
	b.WriteString("log: {level: warn}\n")
	if !h.noPolicyKey {
		b.WriteString("policy:\n  extensions: {allow: [\"_load/*\"]}\n")
	}
	b.WriteString(o.extra)
	return b.String()
}

// probeConfig asks the binary (check-config) which of the optional keys
// it accepts: limits.messages_per_second (rate limits) and
// policy.extensions.allow. Without the policy key the demo agent's method
// name, _demo/echo, is used for round trips.
func (h *harness) probeConfig() []string {
	var notes []string
	check := func() (bool, string) {
		path := filepath.Join(h.tmp, "probe.yaml")
		if err := os.WriteFile(path, []byte(h.gatewayYAML(gwConfig{minIdle: 1, maxProcs: 1, perProc: 1, noRateLimit: true}, "127.0.0.1:0")), 0o600); err != nil {
			return false, err.Error()
		}
		out, err := exec.Command(h.gatewayBin, "check-config", "--config", path).CombinedOutput()
		return err == nil, string(out)
	}
	ok, out := check()
	if !ok && strings.Contains(out, "messages_per_second") {
		h.noRateKey = true
		notes = append(notes, "the gateway has no limits.messages_per_second: capacity runs use its defaults")
		ok, out = check()
	}
	if !ok && strings.Contains(out, "policy") {
		h.noPolicyKey = true
		h.echo = echoMethodDemo
		notes = append(notes, "the gateway rejects policy.extensions.allow: round trips use "+echoMethodDemo)
		ok, out = check()
	}
	if !ok {
		notes = append(notes, "check-config rejects the harness's configuration: "+strings.TrimSpace(out))
	}
	return notes
}

// startGateway runs the acpgate binary with o; ready waits for /readyz (an
// initialized agent), otherwise only /healthz.
func (h *harness) startGateway(o gwConfig, ready bool) (*server, error) {
	return h.startGatewayBin(h.gatewayBin, o, ready)
}

func (h *harness) startGatewayBin(bin string, o gwConfig, ready bool) (*server, error) {
	var lastErr error
	for range 3 { // a free port can be taken by someone else meanwhile
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfgPath := filepath.Join(h.tmp, fmt.Sprintf("gateway-%d.yaml", port))
		if err := os.WriteFile(cfgPath, []byte(h.gatewayYAML(o, fmt.Sprintf("127.0.0.1:%d", port))), 0o600); err != nil {
			return nil, err
		}
		s, err := startServer("acpgate", []string{bin, "serve", "--config", cfgPath}, h.tmp, port)
		if err != nil {
			return nil, err
		}
		path := "/healthz"
		if ready {
			path = "/readyz"
		}
		if lastErr = s.waitHTTP("http://"+s.addr+path, 30*time.Second); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	return nil, lastErr
}

// startWebsocketd runs the load agent behind websocketd (one agent process
// per connection, one WebSocket text message per line).
func (h *harness) startWebsocketd() (*server, error) {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := startServer("websocketd", []string{h.websocketd, "--port", strconv.Itoa(port), "--address", "127.0.0.1",
			"--loglevel", "error", h.exe, "agent"}, h.tmp, port)
		if err != nil {
			return nil, err
		}
		if lastErr = s.waitTCP(10 * time.Second); lastErr == nil {
			s.url = "ws://" + s.addr + "/"
			return s, nil
		}
		s.stop()
	}
	return nil, lastErr
}

// inProcGateway is a gateway served by this process (gateway.New + Serve),
// for what only the process itself can see: goroutines, CPU profiles.
type inProcGateway struct {
	srv  *gateway.Server
	ln   net.Listener
	url  string
	done chan error
}

func (h *harness) startInProcGateway(o gwConfig) (*inProcGateway, error) {
	cfg, err := config.Parse("load.yaml", []byte(h.gatewayYAML(o, "127.0.0.1:0")))
	if err != nil {
		return nil, err
	}
	var supervisor func(time.Duration) []string
	if h.gatewayBin != "" { // as the binary runs agents
		supervisor = func(grace time.Duration) []string {
			return []string{h.gatewayBin, "supervise", "--grace", grace.String(), "--"}
		}
	}
	srv, err := gateway.New(gateway.Options{
		Config:     cfg,
		DemoAgent:  cfg.Agent.Command,
		Supervisor: supervisor,
		Version:    "load",
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return nil, err
	}
	g := &inProcGateway{srv: srv, ln: ln, url: "ws://" + ln.Addr().String() + "/acp", done: make(chan error, 1)}
	go func() { g.done <- srv.Serve(ln) }()
	if o.minIdle > 0 {
		deadline := time.Now().Add(30 * time.Second)
		for !srv.Relay().Pool().Ready() {
			if time.Now().After(deadline) {
				g.stop()
				return nil, errors.New("in-process gateway: no agent ready within 30 s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return g, nil
}

func (g *inProcGateway) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	select {
	case <-g.done:
	case <-ctx.Done():
	}
}

// machineInfo describes where the figures were taken.
type machineInfo struct {
	CPUs       int    `json:"nproc"`
	CPUModel   string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	Websocketd string `json:"websocketd,omitempty"`
	Commit     string `json:"commit,omitempty"`
	NoFile     uint64 `json:"rlimit_nofile"`
}

func describeMachine() machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	return m
}

// loadSample is the machine's busy and steal time and this process's CPU
// time including its reaped children's (and theirs, when they reaped
// theirs).
type loadSample struct {
	at               time.Time
	busy, irq, steal time.Duration
	self             time.Duration
}

// background is the CPU that other processes used over a period, in cores.
type background struct {
	Seconds      float64 `json:"seconds"`
	ForeignCores float64 `json:"foreign_cores"` // user+system time of other processes
	IRQCores     float64 `json:"irq_cores"`     // interrupts and softirqs (mostly loopback networking)
	StealCores   float64 `json:"steal_cores"`   // taken by the hypervisor
}

func sampleLoad() loadSample {
	s := loadSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal
		if len(f) >= 9 && f[0] == "cpu" {
			v := make([]int64, 9)
			for i := 1; i < 9; i++ {
				v[i], _ = strconv.ParseInt(f[i], 10, 64)
			}
			// Interrupt time is left out: loopback networking runs in
			// softirq on behalf of the processes measured, and the kernel
			// does not charge it to them.
			s.busy = time.Duration(v[1]+v[2]+v[3]) * clockTick
			s.irq = time.Duration(v[6]+v[7]) * clockTick
			s.steal = time.Duration(v[8]) * clockTick
		}
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) >= 15 {
				var sum int64
				for _, x := range f[11:15] { // utime stime cutime cstime
					n, _ := strconv.ParseInt(x, 10, 64)
					sum += n
				}
				s.self = time.Duration(sum) * clockTick
			}
		}
	}
	return s
}

func (s loadSample) since(s0 loadSample) background {
	wall := s.at.Sub(s0.at).Seconds()
	if wall <= 0 {
		return background{}
	}
	foreign := (s.busy - s0.busy - (s.self - s0.self)).Seconds()
	return background{Seconds: wall, ForeignCores: max(foreign, 0) / wall,
		IRQCores: (s.irq - s0.irq).Seconds() / wall, StealCores: (s.steal - s0.steal).Seconds() / wall}
}
