package scale

import (
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/gwlog"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// The cluster: two replicas of the gateway with one session key and one
// agent store (the tenant's sandbox home, where the demo agent keeps its
// sessions), behind an HAProxy with cookie affinity: replicas without a
// cluster: block (replicas_test.go runs them in cluster mode).

// Timings. The balancer checks /readyz every checkInter and takes a replica
// out at the first failure; shutdown_delay is well above that, so that a
// draining replica is out of the rotation before it stops accepting.
const (
	chunkDelay    = 30 * time.Millisecond // the demo agent's pause between 8-character chunks
	checkInter    = 200 * time.Millisecond
	shutdownDelay = 2 * time.Second
	shutdownGrace = 20 * time.Second
	agentStop     = 1 * time.Second // agent.stop_grace
)

const tenantName = "acme"

// cluster is everything one test runs.
type cluster struct {
	t        *testing.T
	dir      string
	root     string // the tenant's root: every session's cwd
	homes    string // sandbox.home, shared by the replicas
	token    string
	cfgPath  string
	replicas map[string]*replica // by HAProxy server name: "a", "b"
	lb       *balancer
	procs    *procWatch
}

func newCluster(t *testing.T, ctx context.Context) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, dir: dir, root: filepath.Join(dir, "work"), homes: filepath.Join(dir, "homes"),
		token: "scale-" + harness.RandomHex(t, 24), replicas: map[string]*replica{}}
	for _, d := range []string{c.root, filepath.Join(dir, "keys")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// One session key for both replicas, made as an operator makes it.
	key, err := exec.Command(binPath, "keygen").Output()
	if err != nil {
		t.Fatalf("acpgate keygen: %v", err)
	}
	keyFile := filepath.Join(dir, "keys", "session.key")
	harness.WriteFile(t, keyFile, string(key), 0o600)
	sum := sha256.Sum256([]byte(c.token))
	cfg := fmt.Sprintf(`session_key_file: %q
shutdown_delay: %s
shutdown_grace: %s
agent:
  command: [%q, demo-agent, --chunk-delay, %s]
  stop_grace: %s
pool: {min_idle: 1, max_processes: 4}
sandbox: {home: %q}
sessions: {detach_timeout: 2m}
tenants:
  - name: %s
    tokens_sha256: [%q]
    root: %q
`, keyFile, shutdownDelay, shutdownGrace, binPath, chunkDelay, agentStop, c.homes, tenantName, hex.EncodeToString(sum[:]), c.root)
	c.cfgPath = filepath.Join(dir, "acpgate.yaml")
	harness.WriteFile(t, c.cfgPath, cfg, 0o600)
	if out, err := exec.Command(binPath, "check-config", "--config", c.cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("acpgate check-config: %v\n%s", err, out)
	}

	c.procs = newProcWatch()
	t.Cleanup(c.procs.stop)
	for _, name := range []string{"a", "b"} {
		c.replicas[name] = &replica{c: c, name: name, addr: harness.FreeAddr(t)}
	}
	// Both replicas first, then the balancer, so that its first checks
	// find them ready (it would also wait for them: rise 2).
	var wg sync.WaitGroup
	for _, r := range c.replicas {
		wg.Add(1)
		go func() { defer wg.Done(); r.start(ctx) }()
	}
	wg.Wait()
	for _, r := range c.replicas {
		if r.cur() == nil {
			t.FailNow()
		}
	}
	c.lb = startBalancer(t, ctx, filepath.Join(dir, "haproxy"), c.replicas["a"].addr, c.replicas["b"].addr)
	for _, name := range []string{"a", "b"} {
		c.lb.waitStatus(t, ctx, name, "UP", 20*time.Second)
	}
	return c
}

// other is the name of the replica that is not name.
func other(name string) string {
	if name == "a" {
		return "b"
	}
	return "a"
}

// bearer is the tenant's credentials, plus an affinity cookie if set.
func (c *cluster) header(cookie string) http.Header {
	h := http.Header{"Authorization": {"Bearer " + c.token}}
	if cookie != "" {
		h.Set("Cookie", cookieName+"="+cookie)
	}
	return h
}

// whoServed names the replica whose log opened connection id ("" if
// none, "a+b" if both: a broken affinity).
func (c *cluster) whoServed(id string) string {
	var who []string
	for _, name := range slices.Sorted(maps.Keys(c.replicas)) {
		if c.replicas[name].openedConn(id) {
			who = append(who, name)
		}
	}
	return strings.Join(who, "+")
}

// waitServed waits until a replica has logged the opening of connection id
// (the log is read asynchronously) and returns which.
func (c *cluster) waitServed(t *testing.T, id string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if who := c.whoServed(id); who != "" || time.Now().After(deadline) {
			return who
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --- a replica ---

// replica is one gateway of the cluster, at a fixed address, across its
// restarts.
type replica struct {
	c    *cluster
	name string
	addr string
	cfg  string // its own configuration file ("": the cluster's)

	mu    sync.Mutex
	procs []*gwProc // every process it ran, the current one last
}

// gwProc is one run of a replica.
type gwProc struct {
	r       *replica
	gen     int
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error

	mu       sync.Mutex
	logs     []map[string]any
	raw      strings.Builder
	draining bool // sent SIGTERM
}

func (r *replica) cur() *gwProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.procs) == 0 {
		return nil
	}
	return r.procs[len(r.procs)-1]
}

// start runs the replica (again) on its address and waits until it is
// ready. On failure it marks the test failed and returns with cur() nil or
// exited (start may run on another goroutine than the test's).
func (r *replica) start(ctx context.Context) {
	t := r.c.t
	r.mu.Lock()
	p := &gwProc{r: r, gen: len(r.procs) + 1, done: make(chan struct{})}
	r.mu.Unlock()
	cfg := r.cfg
	if cfg == "" {
		cfg = r.c.cfgPath
	}
	p.cmd = exec.Command(binPath, "serve", "--config", cfg, "--listen", r.addr, "--log-format", "json", "--log-level", "debug")
	p.cmd.Env = gatewayEnv()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Error(err)
		return
	}
	if err := p.cmd.Start(); err != nil {
		t.Errorf("start replica %s: %v", r.name, err)
		return
	}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	r.c.procs.watch(p.cmd.Process.Pid)
	listening := make(chan struct{}, 1)
	go func() { // ends when the gateway's stderr closes
		gwlog.Read(stderr, func(rec map[string]any, line []byte) {
			p.mu.Lock()
			p.logs = append(p.logs, rec)
			p.raw.Write(line)
			p.raw.WriteByte('\n')
			p.mu.Unlock()
			if rec["msg"] == "listening" {
				select {
				case listening <- struct{}{}:
				default:
				}
			}
		})
		p.exitErr = p.cmd.Wait()
		close(p.done)
	}()
	// Registered now, so that a replica that never gets ready is stopped too.
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 30*time.Second)
		if t.Failed() {
			t.Logf("replica %s (run %d) log:\n%s", r.name, p.gen, p.logText())
		}
	})
	select {
	case <-listening:
	case <-p.done:
		t.Errorf("replica %s exited before listening: %v\n%s", r.name, p.exitErr, p.logText())
		return
	case <-time.After(30 * time.Second):
		t.Errorf("replica %s did not listen within 30 s\n%s", r.name, p.logText())
		return
	case <-ctx.Done():
		t.Errorf("replica %s: %v", r.name, ctx.Err())
		return
	}
	// Ready: its pool has an initialized agent process.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := r.get("/readyz")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Errorf("replica %s not ready within 30 s (last /readyz %d)", r.name, code)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatewayEnv is the test's environment without the variables that steer
// the tests.
func gatewayEnv() []string {
	return harness.EnvWithout("ACPGATE_")
}

// get fetches path from the replica directly (not through the balancer).
func (r *replica) get(path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+path, nil)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric sums the samples of name whose labels contain every one of
// labels, read from the replica's /metrics.
func (r *replica) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	code, body := r.get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("replica %s /metrics: %d %.200s", r.name, code, body)
	}
	return metricscrape.Sum(body, name, labels...)
}

// waitMetric polls until ok(the metric) holds and returns its value.
func (r *replica) waitMetric(t *testing.T, timeout time.Duration, want string, ok func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := r.metric(t, name, labels...)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s: %s%v is %g after %s; want %s", r.name, name, labels, v, timeout, want)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// openedConn says whether any run of the replica logged the opening of
// connection id.
func (r *replica) openedConn(id string) bool {
	r.mu.Lock()
	procs := append([]*gwProc(nil), r.procs...)
	r.mu.Unlock()
	for _, p := range procs {
		if p.countLogs("connection opened", "conn", id) > 0 {
			return true
		}
	}
	return false
}

// agentPIDs lists the demo agent processes below the replica's current
// process, and their supervisors.
func (p *gwProc) agentPIDs() map[int]string {
	out := map[int]string{}
	for pid, cmd := range proctree.Descendants(p.cmd.Process.Pid) {
		if strings.Contains(cmd, "demo-agent") {
			out[pid] = cmd
		}
	}
	return out
}

func (p *gwProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// sigterm starts the process's drain.
func (p *gwProc) sigterm() error {
	p.mu.Lock()
	p.draining = true
	p.mu.Unlock()
	return p.cmd.Process.Signal(syscall.SIGTERM)
}

// stop signals the process and waits for it to exit, with SIGKILL after
// timeout. A process already draining is not sent SIGTERM again (a second
// one stops it at once).
func (p *gwProc) stop(sig syscall.Signal, timeout time.Duration) {
	if p.exited() {
		return
	}
	p.mu.Lock()
	draining := p.draining
	p.mu.Unlock()
	if sig != syscall.SIGTERM || !draining {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.r.c.t.Errorf("replica %s did not exit within %s of %v", p.r.name, timeout, sig)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exitCode is the process's exit status (-1 for a signal).
func (p *gwProc) exitCode() int {
	var ee *exec.ExitError
	if errors.As(p.exitErr, &ee) {
		return ee.ExitCode()
	}
	if p.exitErr != nil {
		return -2
	}
	return 0
}

func (p *gwProc) countLogs(msg, key, value string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.logs {
		if r["msg"] == msg && (key == "" || fmt.Sprint(r[key]) == value) {
			n++
		}
	}
	return n
}

func (p *gwProc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.raw.String()
	if len(s) > 200_000 {
		s = "…" + s[len(s)-200_000:]
	}
	return s
}

// --- the balancer ---

// cookieName is the affinity cookie HAProxy inserts (ingress-nginx:
// session-cookie-name).
const cookieName = "ACPGATE_AFFINITY"

// balancer is one HAProxy process in the foreground.
type balancer struct {
	t         *testing.T
	cmd       *exec.Cmd
	addr      string // the frontend
	statsAddr string
	cfg       string
	done      chan struct{}

	mu  sync.Mutex
	log []string // its stdout and stderr: traffic log lines and warnings
}

// haproxyConfig is what replicas without a cluster: block need (as
// ingress-nginx's cookie affinity gives them): round robin, cookie
// affinity (inserted by the balancer, not the gateway), readiness checks on
// /readyz, retries and redispatch on a connection failure, hour-long
// timeouts for WebSockets and event streams.
func haproxyConfig(front, stats, a, b string) string {
	return fmt.Sprintf(`global
    log stdout format raw local0 info
    maxconn 4096

defaults
    mode http
    log global
    option dontlognull
    # Traffic log: which server took each request; X-Scale-Client names
    # the test's client. logasap: a WebSocket or an event stream is
    # logged when its response starts, not when it ends.
    option logasap
    log-format "scale server=%%s status=%%ST method=%%HM path=%%HP client=%%[capture.req.hdr(0)] retries=%%rc term=%%tsc"
    # No "option http-no-delay" (which a deployment serving event streams
    # through HAProxy wants, for latency): HAProxy then forwards partial
    # bodies with MSG_MORE and the kernel may hold an event's last bytes
    # for up to 200 ms. A drain must deliver a turn's last answer anyway.
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 10s
    timeout http-keep-alive 10s
    timeout check 1s
    # proxy-next-upstream: a connection refused or reset is retried, the
    # last time on another server (redispatch), even against the cookie.
    retries 3
    option redispatch

frontend acp
    bind %s
    capture request header X-Scale-Client len 64
    default_backend acpgate

backend acpgate
    balance roundrobin
    # affinity: cookie, the replica's name in it; indirect: a client that
    # has a valid one gets no new Set-Cookie; nocache: never cached.
    cookie %s insert indirect nocache httponly
    # readinessProbe: a draining replica (SIGTERM) answers 503 and is out
    # at the first failed check; a restarted one is in after two good ones.
    option httpchk GET /readyz
    http-check expect status 200
    default-server check inter %dms fall 1 rise 2
    server a %s cookie a
    server b %s cookie b

listen stats
    bind %s
    no log
    stats enable
    stats uri /
`, front, cookieName, checkInter.Milliseconds(), a, b, stats)
}

func startBalancer(t *testing.T, ctx context.Context, dir, a, b string) *balancer {
	t.Helper()
	return startBalancerWith(t, ctx, dir, func(front, stats string) string { return haproxyConfig(front, stats, a, b) })
}

// startBalancerWith runs HAProxy with the configuration config writes for
// a frontend and a stats listener.
func startBalancerWith(t *testing.T, ctx context.Context, dir string, config func(front, stats string) string) *balancer {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lb := &balancer{t: t, addr: harness.FreeAddr(t), statsAddr: harness.FreeAddr(t), cfg: filepath.Join(dir, "haproxy.cfg"), done: make(chan struct{})}
	text := config(lb.addr, lb.statsAddr)
	harness.WriteFile(t, lb.cfg, text, 0o600)
	if out, err := exec.Command(haproxyBin, "-c", "-f", lb.cfg).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	// -db: foreground, no daemon; stopped by the test.
	lb.cmd = exec.Command(haproxyBin, "-db", "-f", lb.cfg)
	lb.cmd.Dir = dir
	out, err := lb.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	lb.cmd.Stderr = lb.cmd.Stdout
	if err := lb.cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	go func() { // ends when haproxy exits
		buf := make([]byte, 0, 64<<10)
		var line []byte
		for {
			n, err := out.Read(buf[:cap(buf)])
			for _, c := range buf[:n] {
				if c == '\n' {
					lb.mu.Lock()
					lb.log = append(lb.log, string(line))
					lb.mu.Unlock()
					line = line[:0]
				} else {
					line = append(line, c)
				}
			}
			if err != nil {
				break
			}
		}
		_ = lb.cmd.Wait()
		close(lb.done)
	}()
	t.Cleanup(func() {
		_ = lb.cmd.Process.Signal(syscall.SIGTERM) // hard stop: every client is gone by now
		select {
		case <-lb.done:
		case <-time.After(3 * time.Second):
			_ = lb.cmd.Process.Kill()
			<-lb.done
		}
		if t.Failed() {
			t.Logf("haproxy config:\n%s\nhaproxy log:\n%s", text, strings.Join(lb.lines(""), "\n"))
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", lb.addr, time.Second); err == nil {
			c.Close()
			return lb
		}
		select {
		case <-lb.done:
			t.Fatalf("haproxy exited:\n%s", strings.Join(lb.lines(""), "\n"))
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy does not listen on %s:\n%s", lb.addr, strings.Join(lb.lines(""), "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lines returns the balancer's log lines containing s.
func (lb *balancer) lines(s string) []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var out []string
	for _, l := range lb.log {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// trafficLine is one request in the balancer's traffic log.
type trafficLine struct {
	server, status, method, path, client, retries, term string
}

// traffic returns the traffic log lines of client (its X-Scale-Client).
func (lb *balancer) traffic(client string) []trafficLine {
	var out []trafficLine
	for _, l := range lb.lines("scale server=") {
		var tl trafficLine
		fields := map[string]*string{"server": &tl.server, "status": &tl.status, "method": &tl.method,
			"path": &tl.path, "client": &tl.client, "retries": &tl.retries, "term": &tl.term}
		for f := range strings.FieldsSeq(l[strings.Index(l, "scale server="):]) {
			k, v, _ := strings.Cut(f, "=")
			if p, ok := fields[k]; ok {
				*p = v
			}
		}
		if tl.client == client {
			out = append(out, tl)
		}
	}
	return out
}

// status returns a server's state as the balancer sees it (UP, DOWN, ...).
func (lb *balancer) status(t *testing.T, server string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lb.statsAddr+"/;csv", nil)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("haproxy stats: %v", err)
	}
	defer resp.Body.Close()
	r := csv.NewReader(resp.Body)
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil || len(recs) == 0 {
		t.Fatalf("haproxy stats: %v", err)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[strings.TrimPrefix(strings.TrimSpace(h), "# ")] = i
	}
	for _, rec := range recs[1:] {
		if len(rec) > col["status"] && rec[col["pxname"]] == "acpgate" && rec[col["svname"]] == server {
			return rec[col["status"]]
		}
	}
	t.Fatalf("haproxy stats: no server %q", server)
	return ""
}

// waitStatus waits until the balancer sees server in state want (a prefix:
// "UP" also matches "UP 1/2") and returns how long that took.
func (lb *balancer) waitStatus(t *testing.T, ctx context.Context, server, want string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		st := lb.status(t, server)
		if st == want {
			return time.Since(start)
		}
		if time.Since(start) > timeout || ctx.Err() != nil {
			t.Fatalf("haproxy sees server %s as %q after %s; want %q", server, st, timeout, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --- processes ---

// procWatch samples the process tree below every replica process it was
// told of, so that the test knows every agent process and supervisor the
// replicas ever ran, including those a SIGKILLed replica orphaned.
type procWatch struct {
	mu    sync.Mutex
	roots map[int]bool
	seen  map[int]string // pid -> command line
	quit  chan struct{}
	done  chan struct{}
}

func newProcWatch() *procWatch {
	w := &procWatch{roots: map[int]bool{}, seen: map[int]string{}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			w.sample()
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *procWatch) watch(pid int) {
	w.mu.Lock()
	w.roots[pid] = true
	w.mu.Unlock()
	w.sample()
}

func (w *procWatch) sample() {
	w.mu.Lock()
	defer w.mu.Unlock()
	table := proctree.Table()
	for root := range w.roots {
		for pid, p := range proctree.Subtree(table, root) {
			if p.State != "Z" && strings.Contains(p.Cmd, "demo-agent") {
				w.seen[pid] = p.Cmd
			}
		}
	}
}

func (w *procWatch) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}

// alive lists the agent processes and supervisors ever seen that still
// run (a zombie does not).
func (w *procWatch) alive() (seen int, left []string) {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, cmd := range w.seen {
		// A pid reused by an unrelated process does not count.
		if proctree.Alive(pid) && proctree.Cmdline(pid) == cmd {
			left = append(left, fmt.Sprintf("%d %s", pid, cmd))
		}
	}
	return len(w.seen), left
}
