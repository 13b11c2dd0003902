// Package scale runs replicas of the real acpgate binary behind a real
// HAProxy. TestScaleOut: two replicas without a cluster: block, behind
// round robin with cookie affinity, readiness checks on /readyz, retries
// and redispatch; it checks what such a deployment promises: clients spread
// over the replicas, a dropped WebSocket resumes on its replica, a rolling
// restart loses no turn and no client, a replica killed outright loses no
// session, and no agent process outlives its replica. TestReplicas
// (replicas_test.go): three replicas in cluster mode behind round robin
// with no affinity, any of them serving any session. See README.md here and
// docs/operations.md, "Scaling out".
package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// requireEnv "1" makes a missing haproxy, node or SDK a failure instead of
// a skip (test/run.sh sets it).
const requireEnv = "ACPGATE_REQUIRE_SCALE"

var (
	binPath    string // the gateway under test
	buildDir   string // where it was built ("" for ACPGATE_E2E_BIN)
	haproxyBin string
	nodeBin    string
	sdkDir     = filepath.Join("..", "interop", "node_modules", "@agentclientprotocol", "sdk")
)

func TestMain(m *testing.M) {
	harness.Main(m, func() {
		if buildDir != "" {
			os.RemoveAll(buildDir)
		}
	})
}

// requireTools finds haproxy, node (>= 20) and the SDK test/interop
// installs, skipping the test when one is missing (failing with
// ACPGATE_REQUIRE_SCALE=1).
func requireTools(t *testing.T) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		harness.Missing(t, fmt.Sprintf(format, args...), requireEnv)
	}
	var err error
	if haproxyBin, err = exec.LookPath("haproxy"); err != nil {
		// Debian installs it in /usr/sbin, which a user's PATH may lack.
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
			missing("haproxy is missing (install the Debian package haproxy): %v", err)
		}
		haproxyBin = "/usr/sbin/haproxy"
	}
	if nodeBin, err = harness.Node(); err != nil {
		missing("node is missing or unusable (install the Debian package nodejs, >= 20): %v", err)
	}
	for _, f := range []string{"dist/v1/stable/acp.js", "dist/transports/http-stream.js"} {
		if _, err := os.Stat(filepath.Join(sdkDir, f)); err != nil {
			missing("the ACP SDK is not installed in test/interop (run `cd test/interop && npm ci`): %v", err)
		}
	}
}

// buildGateway builds the gateway with the race detector, as test/e2e
// does (ACPGATE_E2E_NORACE: without; ACPGATE_E2E_BIN: a prebuilt one).
func buildGateway(t *testing.T) {
	t.Helper()
	if binPath != "" {
		return // built already
	}
	var err error
	if binPath, err = harness.Prebuilt(); err != nil || binPath != "" {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if buildDir, err = os.MkdirTemp("", "acpgate-scale-"); err != nil {
		t.Fatal(err)
	}
	if binPath, err = harness.Build(buildDir, true); err != nil {
		t.Fatalf("build acpgate: %v", err)
	}
}

// turnLimit bounds one short turn (initialize to answer) on a busy machine.
const turnLimit = 30 * time.Second

func TestScaleOut(t *testing.T) {
	requireTools(t)
	buildGateway(t)
	deadline := time.Now().Add(4 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-30*time.Second).Before(deadline) {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	c := newCluster(t, ctx)
	t.Logf("two replicas (%s, %s) behind haproxy %s, ready in %s", c.replicas["a"].addr, c.replicas["b"].addr, c.lb.addr, time.Since(start).Round(time.Millisecond))

	// Each subtest leaves both replicas running for the next, except d,
	// which kills one; e runs whatever happened before.
	ok := t.Run("a: fresh WebSocket and Streamable HTTP clients spread over both replicas", func(t *testing.T) { spread(t, ctx, c) })
	ok = ok && t.Run("b: a WebSocket dropped mid-turn resumes on its replica through the balancer", func(t *testing.T) { resumeThroughBalancer(t, ctx, c) })
	ok = ok && t.Run("c: rolling restart: the turn finishes, new clients go to the other replica, the restarted one gets traffic again", func(t *testing.T) { rollingRestart(t, ctx, c) })
	_ = ok && t.Run("d: SIGKILL: the resume is refused by the other replica, session/load continues there", func(t *testing.T) { killedReplica(t, ctx, c) })
	t.Run("e: no agent process of either replica is left", func(t *testing.T) { noAgentLeft(t, c) })
}

// --- a ---

func spread(t *testing.T, ctx context.Context, c *cluster) {
	wsBefore := map[string]float64{}
	for name, r := range c.replicas {
		wsBefore[name] = r.metric(t, "acpgate_connections_total", `transport="websocket"`)
	}
	landed := map[string]int{}
	for i := range 4 {
		name := fmt.Sprintf("a-ws-%d", i)
		cl := c.connect(t, name, "")
		if who := c.waitServed(t, cl.connID); who != cl.cookie {
			t.Fatalf("%s: the balancer's cookie says replica %q, the connection %s was opened on %q", name, cl.cookie, cl.connID, who)
		}
		cl.initialize()
		sid := cl.newSession()
		cl.turn(sid, fmt.Sprintf("turn %d of a fresh client", i), left(t, ctx, turnLimit))
		cl.closeClean()
		landed[cl.cookie]++
	}
	t.Logf("4 fresh WebSocket clients: %v", landed)
	if landed["a"] == 0 || landed["b"] == 0 {
		t.Fatalf("4 fresh WebSocket clients all landed on one replica: %v", landed)
	}
	// Each replica counts the connections it served and nothing else.
	for name, r := range c.replicas {
		want := wsBefore[name] + float64(landed[name])
		r.waitMetric(t, 10*time.Second, fmt.Sprint(want), func(v float64) bool { return v == want },
			"acpgate_connections_total", `transport="websocket"`)
	}

	// The SDK's Streamable-HTTP client keeps the balancer's cookie in its
	// MemoryAcpCookieStore: every POST and GET of a connection reaches
	// the replica that holds it.
	landedHTTP := map[string]int{}
	for i := range 2 {
		name := fmt.Sprintf("a-http-%d", i)
		prompt := fmt.Sprintf("turn %d over Streamable HTTP", i)
		landedHTTP[c.checkHTTPRun(t, c.runHTTPClient(t, ctx, name, prompt), name, prompt)]++
	}
	t.Logf("2 fresh Streamable-HTTP clients: %v", landedHTTP)
	if landedHTTP["a"] != 1 || landedHTTP["b"] != 1 {
		t.Fatalf("2 fresh Streamable-HTTP clients landed %v; want one on each replica (round robin)", landedHTTP)
	}

	// The control: without the cookie the same client breaks, its
	// requests spread over both replicas and the second one does not know
	// the connection.
	name := "a-http-nocookie"
	run := c.runHTTPClient(t, ctx, name, "turn without affinity", "--no-cookies")
	if run.err == nil {
		t.Fatalf("%s: the SDK without cookies succeeded through a round-robin balancer:\n%s", name, run.dump())
	}
	servers, got404 := map[string]bool{}, false
	for _, l := range run.find("http") {
		got404 = got404 || l.Status == http.StatusNotFound
	}
	for _, tl := range c.lb.waitTraffic(t, name, 2) {
		servers[tl.server] = true
	}
	if !got404 || !servers["a"] || !servers["b"] {
		t.Fatalf("%s: want requests on both replicas (servers %v) and a 404 for the unknown Acp-Connection-Id (got one: %v):\n%s", name, servers, got404, run.dump())
	}
}

// --- b ---

func resumeThroughBalancer(t *testing.T, ctx context.Context, c *cluster) {
	cl := c.connect(t, "b-ws", "")
	r, o := c.replicas[cl.cookie], c.replicas[other(cl.cookie)]
	if who := c.waitServed(t, cl.connID); who != cl.cookie {
		t.Fatalf("the balancer's cookie says replica %q, the connection was opened on %q", cl.cookie, who)
	}
	cl.initialize()
	sid := cl.newSession()
	okBefore := r.metric(t, "acpgate_resumes_total", `result="ok"`)
	otherBefore := o.metric(t, "acpgate_resumes_total")
	detachedBefore := r.metric(t, "acpgate_connections_detached")

	// About 100 chunks, chunkDelay apart: 3 s of streaming.
	text := echoText("resume", 800)
	want := "You said: " + text
	id := cl.Request("session/prompt", textPrompt(sid, text))
	tally := &turnTally{t: t, sid: sid}
	for tally.chunks < 10 {
		m := cl.Next("the turn before the drop", left(t, ctx, turnLimit))
		if m.IsResponseTo(id) {
			t.Fatalf("the turn ended after %d chunks: %s", tally.chunks, m.Raw)
		}
		tally.add(m)
	}
	sent, n := len(cl.Frames), cl.Got
	cl.s.reset(t)
	// The replica sees its socket end without a close frame: the
	// connection detaches and the turn runs on.
	r.waitMetric(t, 10*time.Second, fmt.Sprintf("> %g", detachedBefore), func(v float64) bool { return v > detachedBefore }, "acpgate_connections_detached")

	resp, m := cl.resume(n)
	if m != sent {
		t.Errorf("_acpgate/resumed says the replica received %d messages; the client sent %d, all answered before the drop", m, sent)
	}
	if set := affinity(resp); set != "" {
		t.Errorf("the resumed 101 sets the cookie again (%q): the client's cookie for %s should have been valid (insert indirect)", set, cl.cookie)
	}
	answer := cl.Await("the rest of the turn after the resume", id, left(t, ctx, turnLimit), tally.add)
	tally.check(answer, want)
	cl.quiet(300 * time.Millisecond)
	t.Logf("resumed on replica %s after %d messages (%d chunks); the turn arrived whole (%d chunks)", cl.cookie, n, 10, tally.chunks)

	r.waitMetric(t, 5*time.Second, fmt.Sprint(okBefore+1), func(v float64) bool { return v == okBefore+1 }, "acpgate_resumes_total", `result="ok"`)
	if v := o.metric(t, "acpgate_resumes_total"); v != otherBefore {
		t.Errorf("the other replica counted %g resumes, had %g: the resume went there too", v, otherBefore)
	}
	tl := c.lb.waitTraffic(t, "b-ws-resume", 1)
	if len(tl) != 1 || tl[0].server != cl.cookie || tl[0].status != "101" {
		t.Errorf("the balancer's log of the resume: %+v; want one 101 from server %s", tl, cl.cookie)
	}
	// The resumed connection carries on.
	cl.turn(sid, "a turn after the resume", left(t, ctx, turnLimit))
	cl.closeClean()
}

// quiet asserts nothing more arrives for d.
func (cl *acpClient) quiet(d time.Duration) {
	cl.t.Helper()
	select {
	case m, ok := <-cl.s.In:
		if ok {
			cl.t.Fatalf("%s: unexpected message after the turn (a duplicate?): %.300s", cl.name, m.Raw)
		}
	case <-time.After(d):
	}
}

// --- c ---

func rollingRestart(t *testing.T, ctx context.Context, c *cluster) {
	long := c.connect(t, "c-long", "")
	victim := long.cookie
	x, y := c.replicas[victim], c.replicas[other(victim)]
	xp := x.cur()
	long.initialize()
	sid := long.newSession()
	// About 250 chunks: 7.5 s of streaming at the least, well within
	// shutdown_grace, longer than the new clients below need.
	text := echoText("drain", 2000)
	want := "You said: " + text
	id := long.Request("session/prompt", textPrompt(sid, text))
	tally := &turnTally{t: t, sid: sid}
	for tally.chunks < 3 {
		tally.add(long.Next("the long turn", left(t, ctx, turnLimit)))
	}
	agents := xp.agentPIDs()
	if len(agents) == 0 {
		t.Fatalf("replica %s runs no agent process", victim)
	}
	// A Streamable-HTTP turn on the same replica (a client coming back
	// with its cookie), running when the drain starts. It starts later
	// and is as long: it ends last, and the drain ends the connections
	// right after its answer (the answer must not be overtaken by the end
	// of the connection's other stream).
	httpText := echoText("drain over http", 2000)
	httpWait := c.startHTTPClient(t, ctx, "c-long-http", httpText, "--cookie", cookieName+"="+victim)
	for deadline := time.Now().Add(left(t, ctx, turnLimit)); ; {
		tl := c.lb.traffic("c-long-http")
		if len(tl) >= 5 { // initialize, streams, session/new, the prompt
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Streamable-HTTP client did not start its turn: %+v", tl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)

	sigAt := time.Now()
	if err := xp.sigterm(); err != nil {
		t.Fatal(err)
	}
	// Not ready at once, while it still accepts (shutdown_delay).
	for {
		code, body := x.get("/readyz")
		if code == http.StatusServiceUnavailable {
			break
		}
		if code != http.StatusOK || time.Since(sigAt) > shutdownDelay {
			t.Fatalf("replica %s after SIGTERM: /readyz %d %q; want 503 within shutdown_delay (%s)", victim, code, body, shutdownDelay)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.lb.waitStatus(t, ctx, victim, "DOWN", shutdownDelay)
	out := time.Since(sigAt)
	t.Logf("replica %s: SIGTERM; the balancer took it out %s later (shutdown_delay %s, checks every %s)", victim, out.Round(time.Millisecond), shutdownDelay, checkInter)
	if out >= shutdownDelay {
		t.Fatalf("the balancer took replica %s out %s after SIGTERM, not within shutdown_delay (%s): clients could meet a closed listener", victim, out, shutdownDelay)
	}

	// New clients during the drain: all go to the other replica, all
	// complete a turn.
	if xp.exited() {
		t.Fatalf("replica %s exited before the new clients came: no drain to test", victim)
	}
	for i := range 3 {
		name := fmt.Sprintf("c-drain-ws-%d", i)
		cl := c.connect(t, name, "")
		if cl.cookie != y.name {
			t.Fatalf("%s: a new client during %s's drain got the cookie of %q", name, victim, cl.cookie)
		}
		if who := c.waitServed(t, cl.connID); who != y.name {
			t.Fatalf("%s: a new client during %s's drain was served by %q", name, victim, who)
		}
		cl.initialize()
		cl.turn(cl.newSession(), fmt.Sprintf("turn %d during a drain", i), left(t, ctx, turnLimit))
		cl.closeClean()
	}
	prompt := "a Streamable-HTTP turn during a drain"
	if got := c.checkHTTPRun(t, c.runHTTPClient(t, ctx, "c-drain-http", prompt), "c-drain-http", prompt); got != y.name {
		t.Fatalf("a new Streamable-HTTP client during %s's drain landed on %q", victim, got)
	}
	if xp.exited() {
		t.Fatalf("replica %s exited while the new clients ran (its turn should have kept it draining)", victim)
	}

	// The Streamable-HTTP turn finished too, on its event stream: every
	// request of it went to the draining replica. (Its DELETE, after the
	// turn, may find the replica out of the rotation: the balancer sends
	// it to the other one, which does not know the connection: 404. The
	// draining replica ends the connection itself.)
	hr := httpWait()
	if hr.err != nil {
		t.Fatalf("the Streamable-HTTP turn on draining replica %s failed:\n%s", victim, hr.dump())
	}
	if p := hr.find("session/prompt"); len(p) != 1 || p[0].Result.StopReason != "end_turn" || p[0].Text != "You said: "+httpText {
		t.Fatalf("the Streamable-HTTP turn on draining replica %s: %+v; want its whole echo and end_turn", victim, p)
	}
	for _, r := range hr.find("http") {
		if r.Method != http.MethodDelete && (r.Status/100 != 2 || r.SentCookie != cookieName+"="+victim) {
			t.Fatalf("the Streamable-HTTP client's request %+v: want a 2xx, sent with %s=%s", r, cookieName, victim)
		}
	}
	for _, tl := range c.lb.traffic("c-long-http") {
		if tl.method != http.MethodDelete && tl.server != victim {
			t.Fatalf("the balancer sent %s %s of the Streamable-HTTP client on %s to %s", tl.method, tl.path, victim, tl.server)
		}
		if tl.method == http.MethodDelete {
			t.Logf("the Streamable-HTTP client's DELETE after its turn: %s from %s", tl.status, tl.server)
		}
	}

	// The running turn finishes on its socket, whole, within the grace.
	answer := long.Await("the turn on the draining replica", id, left(t, ctx, shutdownGrace+10*time.Second), tally.add)
	tally.check(answer, want)
	if took := time.Since(sigAt); took > shutdownGrace {
		t.Errorf("the turn ended %s after SIGTERM, beyond shutdown_grace (%s)", took, shutdownGrace)
	}
	t.Logf("the turn on %s ended %s after SIGTERM (%d chunks)", victim, time.Since(sigAt).Round(time.Millisecond), tally.chunks)
	// Then the replica closes the socket: 1001, going away.
	select {
	case <-long.s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the socket on draining replica %s is still open 10 s after its last turn", victim)
	}
	for m := range long.s.In {
		t.Errorf("after the turn: %.300s", m.Raw)
	}
	if code := closeStatus(long.s.Err()); code != websocket.StatusGoingAway {
		t.Errorf("the draining replica's socket ended with %v (close code %d); want 1001", long.s.Err(), code)
	}
	select {
	case <-xp.done:
	case <-time.After(left(t, ctx, shutdownGrace)):
		t.Fatalf("replica %s did not exit after its drain", victim)
	}
	if code := xp.exitCode(); code != 0 {
		t.Fatalf("replica %s exited with %d after SIGTERM (%v); want 0", victim, code, xp.exitErr)
	}
	// Both turns were still running when shutdown_delay ended and the
	// drain proper began.
	if n := xp.countLogs("letting running prompts finish", "prompts", "2"); n != 1 {
		t.Errorf("replica %s did not log \"letting running prompts finish\" with prompts=2 (the WebSocket and the Streamable-HTTP turn)", victim)
	}
	waitGone(t, agents, 10*time.Second, "replica "+victim+"'s agent processes after its drain")

	// Back on the same port: the balancer takes it in again (rise 2) and
	// new clients land on it. (HAProxy's round robin lets a returning
	// server catch up on the turns it missed: the first few fresh clients
	// all go to it.)
	x.start(ctx)
	if p := x.cur(); p == xp || p.exited() {
		t.Fatalf("replica %s did not start again", victim)
	}
	c.lb.waitStatus(t, ctx, victim, "UP", 15*time.Second)
	landed := map[string]int{}
	for i := range 6 {
		name := fmt.Sprintf("c-after-ws-%d", i)
		cl := c.connect(t, name, "")
		if who := c.waitServed(t, cl.connID); who != cl.cookie {
			t.Fatalf("%s: cookie %q, connection opened on %q", name, cl.cookie, who)
		}
		cl.initialize()
		cl.turn(cl.newSession(), fmt.Sprintf("turn %d after the restart", i), left(t, ctx, turnLimit))
		cl.closeClean()
		landed[cl.cookie]++
	}
	t.Logf("6 fresh clients after %s's restart: %v", victim, landed)
	if landed[victim] == 0 {
		t.Fatalf("after the restart of %s, 6 fresh clients landed %v; none on the restarted replica", victim, landed)
	}
}

// --- d ---

func killedReplica(t *testing.T, ctx context.Context, c *cluster) {
	cl := c.connect(t, "d-ws", "")
	k, o := c.replicas[cl.cookie], c.replicas[other(cl.cookie)]
	kp := k.cur()
	cl.initialize()
	sid := cl.newSession()
	first := "the turn before the kill"
	cl.turn(sid, first, left(t, ctx, turnLimit))
	text := echoText("killed", 1600)
	id := cl.Request("session/prompt", textPrompt(sid, text))
	tally := &turnTally{t: t, sid: sid}
	for tally.chunks < 5 {
		m := cl.Next("the turn before the kill", left(t, ctx, turnLimit))
		if m.IsResponseTo(id) {
			t.Fatalf("the turn ended early: %s", m.Raw)
		}
		tally.add(m)
	}
	agents := kp.agentPIDs()
	if len(agents) == 0 {
		t.Fatalf("replica %s runs no agent process", k.name)
	}
	refusedBefore := o.metric(t, "acpgate_resumes_total", `result="refused"`, `reason="other_replica"`)

	if err := kp.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kp.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s still runs 10 s after SIGKILL", k.name)
	}
	// The balancer ends the client's socket with the replica's.
	select {
	case <-cl.s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the client's socket is still open 10 s after its replica was killed")
	}
	for m := range cl.s.In {
		cl.Got++
		if m.Method != "session/update" {
			t.Fatalf("before the socket ended: %.300s", m.Raw)
		}
	}

	// The client resumes at once, its cookie naming the dead replica: the
	// balancer sends it to the other one (a down server, or a refused
	// connection retried and redispatched), which cannot resume a
	// connection another process issued.
	h := c.header(k.name)
	h.Set("X-Scale-Client", "d-ws-resume")
	if s, resp, err := dialSocket(t, c.lb.addr, resumePath(cl.token, cl.Got), h); err == nil {
		s.Close()
		t.Fatalf("the resume of a connection of the killed replica was upgraded (by %q)", affinity(resp))
	} else {
		if resp == nil {
			t.Fatalf("the resume after the kill: no HTTP answer: %v", err)
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var body struct{ Error, Message string }
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal(raw, &body) != nil || body.Error != "resume_refused" || body.Message == "" {
			t.Fatalf("the resume after the kill: %v: %d %s; want 404 {\"error\":\"resume_refused\",...}", err, resp.StatusCode, raw)
		}
		if set := affinity(resp); set != o.name {
			t.Errorf("the refusal sets the affinity cookie %q; want %q, the replica that answered", set, o.name)
		}
	}
	o.waitMetric(t, 5*time.Second, fmt.Sprint(refusedBefore+1), func(v float64) bool { return v == refusedBefore+1 },
		"acpgate_resumes_total", `result="refused"`, `reason="other_replica"`)
	tl := c.lb.waitTraffic(t, "d-ws-resume", 1)
	if len(tl) != 1 || tl[0].server != o.name || tl[0].status != "404" {
		t.Fatalf("the balancer's log of the resume: %+v; want one 404 from server %s", tl, o.name)
	}
	t.Logf("the resume went to %s (balancer retries %s, termination %s)", tl[0].server, tl[0].retries, tl[0].term)

	// The killed replica's agents die with it (their supervisors' parent
	// death signal), so nothing writes the session any more.
	waitGone(t, agents, 10*time.Second, "replica "+k.name+"'s agent processes after SIGKILL")

	// A new connection with the cookie the refusal set loads the session
	// on the other replica: the ID opens there (the shared key) and the
	// agent finds the history (the shared store).
	nc := c.connect(t, "d-ws-load", o.name)
	if who := c.waitServed(t, nc.connID); who != o.name {
		t.Fatalf("the new connection was served by %q, want %s", who, o.name)
	}
	nc.initialize()
	var replay []update
	m := nc.Await("session/load", nc.Request("session/load", map[string]any{"sessionId": sid, "cwd": c.root, "mcpServers": []any{}}),
		left(t, ctx, turnLimit), func(m rpcMsg) {
			u := parseUpdate(t, m)
			if u.SessionID != sid {
				t.Fatalf("an update for another session: %s", m.Raw)
			}
			replay = append(replay, u)
		})
	if m.Error != nil || strings.Contains(string(m.Result), "acpgate") {
		t.Fatalf("session/load on %s of the killed replica's session: %s; want the agent's own answer", o.name, m.Raw)
	}
	// The demo agent replays its stored history: the first turn, the
	// prompt of the killed turn, and what it had streamed of its reply if
	// it stored that when its supervisor stopped it.
	want := []struct{ kind, text string }{
		{"user_message_chunk", first}, {"agent_message_chunk", "You said: " + first}, {"user_message_chunk", text},
	}
	if len(replay) < len(want) || len(replay) > len(want)+1 {
		t.Fatalf("session/load replayed %d updates: %+v; want %d or %d", len(replay), replay, len(want), len(want)+1)
	}
	for i, w := range want {
		if u := replay[i].Update; u.Kind != w.kind || u.Content.Text != w.text {
			t.Fatalf("replayed update %d: %s %q; want %s %q", i, u.Kind, u.Content.Text, w.kind, w.text)
		}
	}
	if len(replay) > len(want) {
		u := replay[len(want)].Update
		if u.Kind != "agent_message_chunk" || u.Content.Text == "" || !strings.HasPrefix("You said: "+text, u.Content.Text) {
			t.Fatalf("the killed turn's stored reply %s %q is not a start of its echo", u.Kind, u.Content.Text)
		}
		t.Logf("the killed turn's reply was stored up to %d of %d bytes", len(u.Content.Text), len("You said: "+text))
	} else {
		t.Logf("the killed turn's reply was not stored")
	}
	nc.turn(sid, "the conversation goes on elsewhere", left(t, ctx, turnLimit))
	nc.closeClean()
}

// --- e ---

func noAgentLeft(t *testing.T, c *cluster) {
	var wg sync.WaitGroup
	for _, r := range c.replicas {
		p := r.cur()
		if p == nil || p.exited() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(syscall.SIGTERM, shutdownDelay+shutdownGrace+10*time.Second)
			if code := p.exitCode(); code != 0 {
				t.Errorf("replica %s exited with %d after SIGTERM (%v)", r.name, code, p.exitErr)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for {
		seen, left := c.procs.alive()
		if len(left) == 0 {
			t.Logf("%d agent processes and supervisors ran; none is left", seen)
			// Two replicas, one restarted, each with min_idle 1: at least
			// an agent and its supervisor per run.
			if seen < 6 {
				t.Errorf("only %d agent processes and supervisors were seen: the watch missed some", seen)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent processes outlived their replicas: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits until none of pids runs.
func waitGone(t *testing.T, pids map[int]string, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for pid, cmd := range pids {
			if proctree.Alive(pid) && proctree.Cmdline(pid) == cmd {
				left = append(left, fmt.Sprintf("%d %s", pid, cmd))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still run %s later: %v", what, timeout, left)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// left is d, or what is left of the test's time if less.
func left(t *testing.T, ctx context.Context, d time.Duration) time.Duration {
	t.Helper()
	dl, _ := ctx.Deadline()
	rest := time.Until(dl)
	if rest <= 0 {
		t.Fatalf("the test ran out of time")
	}
	return min(d, rest)
}

// --- the SDK's Streamable-HTTP client ---

type httpLine struct {
	Type         string `json:"type"`
	Method       string `json:"method"`
	Status       int    `json:"status"`
	SentCookie   string `json:"sentCookie"`
	SetCookie    string `json:"setCookie"`
	ConnectionID string `json:"connectionId"`
	SessionID    string `json:"sessionId"`
	Text         string `json:"text"`
	Cookie       string `json:"cookie"`
	Result       struct {
		StopReason string `json:"stopReason"`
	} `json:"result"`
}

type httpRun struct {
	lines  []httpLine
	stdout string
	stderr string
	err    error
}

func (r *httpRun) find(typ string) []httpLine {
	var out []httpLine
	for _, l := range r.lines {
		if l.Type == typ {
			out = append(out, l)
		}
	}
	return out
}

func (r *httpRun) dump() string {
	return fmt.Sprintf("exit: %v\nstdout:\n%s\nstderr:\n%s", r.err, r.stdout, r.stderr)
}

// runHTTPClient runs http-client.mjs through the balancer. extra are more
// arguments (--no-cookies, --cookie).
func (c *cluster) runHTTPClient(t *testing.T, ctx context.Context, name, prompt string, extra ...string) *httpRun {
	t.Helper()
	return c.startHTTPClient(t, ctx, name, prompt, extra...)()
}

// startHTTPClient starts http-client.mjs and returns a function that waits
// for it (which any goroutine may call).
func (c *cluster) startHTTPClient(t *testing.T, ctx context.Context, name, prompt string, extra ...string) func() *httpRun {
	t.Helper()
	script, err := filepath.Abs("http-client.mjs")
	if err != nil {
		t.Fatal(err)
	}
	limit := left(t, ctx, 45*time.Second)
	args := []string{script, "--url", "http://" + c.lb.addr + "/acp", "--token", c.token, "--cwd", c.root,
		"--name", name, "--prompt", prompt, "--timeout", strconv.FormatInt((limit - 5*time.Second).Milliseconds(), 10)}
	cmd := exec.Command(nodeBin, append(args, extra...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "LANG=C.UTF-8"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }) // a test that failed before waiting
	return func() *httpRun {
		r := &httpRun{}
		select {
		case r.err = <-done:
		case <-time.After(limit):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			r.err = fmt.Errorf("killed after %s: %v", limit, <-done)
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything left in its group
		r.stdout, r.stderr = stdout.String(), stderr.String()
		for line := range strings.SplitSeq(r.stdout, "\n") {
			var l httpLine
			if json.Unmarshal([]byte(line), &l) == nil && l.Type != "" {
				r.lines = append(r.lines, l)
			}
		}
		return r
	}
}

// checkHTTPRun asserts a run completed its turn (the echo of prompt) with
// every request on the replica the balancer's first answer bound it to,
// and returns that replica.
func (c *cluster) checkHTTPRun(t *testing.T, run *httpRun, name, prompt string) string {
	t.Helper()
	if run.err != nil {
		t.Fatalf("%s: the SDK client failed:\n%s", name, run.dump())
	}
	p := run.find("session/prompt")
	if len(p) != 1 || p[0].Result.StopReason != "end_turn" || p[0].Text != "You said: "+prompt {
		t.Fatalf("%s: the turn: %+v; want the echo and end_turn\n%s", name, p, run.dump())
	}
	reqs := run.find("http")
	if len(reqs) < 4 {
		t.Fatalf("%s: %d HTTP requests; want initialize, streams, session/new, the prompt and DELETE\n%s", name, len(reqs), run.dump())
	}
	first := reqs[0]
	server, _ := strings.CutPrefix(strings.SplitN(first.SetCookie, ";", 2)[0], cookieName+"=")
	if first.Method != http.MethodPost || first.Status != http.StatusOK || first.SentCookie != "" || (server != "a" && server != "b") || first.ConnectionID == "" {
		t.Fatalf("%s: the first request %+v; want a POST answered 200 with a Set-Cookie %s=<replica> and an Acp-Connection-Id\n%s", name, first, cookieName, run.dump())
	}
	for i, r := range reqs[1:] {
		if r.SentCookie != cookieName+"="+server || r.Status/100 != 2 || r.ConnectionID != first.ConnectionID {
			t.Fatalf("%s: request %d %+v; want it sent with %s=%s for connection %s, and a 2xx\n%s", name, i+2, r, cookieName, server, first.ConnectionID, run.dump())
		}
	}
	if d := run.find("done"); len(d) != 1 || d[0].Cookie != cookieName+"="+server {
		t.Fatalf("%s: the SDK's cookie store ended with %+v; want %s=%s", name, d, cookieName, server)
	}
	// The balancer sent every request to that replica, and only that
	// replica opened the connection.
	for _, tl := range c.lb.waitTraffic(t, name, len(reqs)) {
		if tl.server != server {
			t.Fatalf("%s: the balancer sent %s %s to %s, not %s", name, tl.method, tl.path, tl.server, server)
		}
	}
	if who := c.waitServed(t, first.ConnectionID); who != server {
		t.Fatalf("%s: connection %s was opened on %q; the cookie says %s", name, first.ConnectionID, who, server)
	}
	return server
}

// waitTraffic waits until the balancer logged at least n requests of
// client and returns them.
func (lb *balancer) waitTraffic(t *testing.T, client string, n int) []trafficLine {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tl := lb.traffic(client)
		if len(tl) >= n {
			return tl
		}
		if time.Now().After(deadline) {
			t.Fatalf("the balancer logged %d requests of %s, want %d: %+v", len(tl), client, n, tl)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
