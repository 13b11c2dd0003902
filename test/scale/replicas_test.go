package scale

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// Issue #38, "Any replica serves any session": three replicas in cluster
// mode (one Redis as the owner registry, each its own cluster listener)
// behind an HAProxy that balances round robin with no affinity at all, as
// deploy/haproxy/haproxy.cfg does. Whatever replica a request lands on,
// the client is served as if it had reached the one holding its session
// or connection. See README.md.

// lease is each replica's cluster.lease: short, so that a SIGKILLed
// owner's sessions are free again soon.
const lease = 2 * time.Second

var ringNames = []string{"a", "b", "c"}

// ring is the cluster-mode deployment: the test/scale cluster (replicas,
// balancer, process watch) with three replicas, each with a configuration
// of its own, and the Redis they share.
type ring struct {
	*cluster
	redis      *redistest.Server
	adminToken string
	internal   map[string]string // cluster.listen, by replica
	faults     *faultProxy       // between the others and b's cluster.listen

	mu     sync.Mutex
	probes int // requests steerAway sent
}

// ringConfig is replica name's configuration: the cluster's, plus its
// cluster block and the admin API.
func (g *ring) ringConfig(keyFile, adminHash, tokenHash, name string) string {
	advertise := "http://" + g.internal[name]
	if name == "b" {
		advertise = "http://" + g.faults.addr()
	}
	return fmt.Sprintf(`session_key_file: %q
shutdown_delay: %s
shutdown_grace: %s
agent:
  command: [%q, demo-agent, --chunk-delay, %s]
  stop_grace: %s
pool: {min_idle: 1, max_processes: 4}
sandbox: {home: %q}
sessions: {detach_timeout: 2m}
admin:
  tokens_sha256: [%q]
# session/status is unstable.
policy: {unstable: true}
cluster:
  name: %s
  store: %s
  listen: %s
  advertise: %s
  lease: %s
tenants:
  - name: %s
    tokens_sha256: [%q]
    root: %q
`, keyFile, shutdownDelay, shutdownGrace, binPath, chunkDelay, agentStop, g.homes, adminHash,
		name, g.redis.URL(0), g.internal[name], advertise, lease, tenantName, tokenHash, g.root)
}

func newRing(t *testing.T, ctx context.Context) *ring {
	t.Helper()
	dir := t.TempDir()
	g := &ring{
		cluster: &cluster{t: t, dir: dir, root: filepath.Join(dir, "work"), homes: filepath.Join(dir, "homes"),
			token: "ring-" + harness.RandomHex(t, 24), replicas: map[string]*replica{}},
		redis:      redistest.Start(t),
		adminToken: "ring-admin-" + harness.RandomHex(t, 24),
		internal:   map[string]string{},
	}
	for _, d := range []string{g.root, filepath.Join(dir, "keys")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	key, err := exec.Command(binPath, "keygen").Output()
	if err != nil {
		t.Fatalf("acpgate keygen: %v", err)
	}
	keyFile := filepath.Join(dir, "keys", "session.key")
	harness.WriteFile(t, keyFile, string(key), 0o600)
	hash := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	for _, name := range ringNames {
		g.internal[name] = harness.FreeAddr(t)
	}
	g.faults = startFaultProxy(t, g.internal["b"])
	for _, name := range ringNames {
		r := &replica{c: g.cluster, name: name, addr: harness.FreeAddr(t), cfg: filepath.Join(dir, "acpgate-"+name+".yaml")}
		harness.WriteFile(t, r.cfg, g.ringConfig(keyFile, hash(g.adminToken), hash(g.token), name), 0o600)
		if out, err := exec.Command(binPath, "check-config", "--config", r.cfg).CombinedOutput(); err != nil {
			t.Fatalf("acpgate check-config (replica %s): %v\n%s", name, err, out)
		}
		g.replicas[name] = r
	}
	g.procs = newProcWatch()
	t.Cleanup(g.procs.stop)
	var wg sync.WaitGroup
	for _, r := range g.replicas {
		wg.Add(1)
		go func() { defer wg.Done(); r.start(ctx) }()
	}
	wg.Wait()
	for _, r := range g.replicas {
		if p := r.cur(); p == nil || p.exited() {
			t.FailNow()
		}
	}
	servers := map[string]string{}
	for name, r := range g.replicas {
		servers[name] = r.addr
	}
	g.lb = startBalancerWith(t, ctx, filepath.Join(dir, "haproxy"), func(front, stats string) string {
		return roundRobinConfig(t, front, stats, servers)
	})
	for _, name := range ringNames {
		g.lb.waitStatus(t, ctx, name, "UP", 20*time.Second)
	}
	return g
}

// roundRobinConfig is deploy/haproxy/haproxy.cfg (round robin, no
// cookie, no stick table: nothing sends a client back where it was) with
// the test's addresses, its check interval and the traffic log
// haproxyConfig has (which server took each request, and for which
// client).
func roundRobinConfig(t *testing.T, front, stats string, servers map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "haproxy", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	edits := [][2]string{
		{"    bind :8080\n", "    bind " + front + "\n    capture request header X-Scale-Client len 64\n"},
		{"    option httplog\n", "    option logasap\n" +
			`    log-format "scale server=%s status=%ST method=%HM path=%HP client=%[capture.req.hdr(0)] retries=%rc term=%tsc"` + "\n"},
		{"    default-server check inter 2s fall 1 rise 2\n", fmt.Sprintf("    default-server check inter %dms fall 1 rise 2\n", checkInter.Milliseconds())},
		{"    bind 127.0.0.1:8404\n", "    bind " + stats + "\n"},
	}
	for i, name := range ringNames {
		edits = append(edits, [2]string{fmt.Sprintf("    server %s 10.0.0.%d:8080\n", name, 11+i), fmt.Sprintf("    server %s %s\n", name, servers[name])})
	}
	for _, e := range edits {
		if n := strings.Count(cfg, e[0]); n != 1 {
			t.Fatalf("deploy/haproxy/haproxy.cfg has the line %q %d times; the test edits it where it is once", strings.TrimSpace(e[0]), n)
		}
		cfg = strings.Replace(cfg, e[0], e[1], 1)
	}
	for _, affinity := range []string{"cookie", "stick", "balance source", "hash-type"} {
		for line := range strings.SplitSeq(cfg, "\n") {
			if l := strings.TrimSpace(line); !strings.HasPrefix(l, "#") && strings.Contains(l, affinity) {
				t.Fatalf("deploy/haproxy/haproxy.cfg has affinity (%q): %s", affinity, l)
			}
		}
	}
	return cfg
}

// ownerOf is the replica a cluster-mode connection ID or resume token
// names (<replica>.<rest>), "" if it names none.
func (g *ring) ownerOf(id string) string {
	name, _, ok := strings.Cut(id, ".")
	if _, known := g.replicas[name]; !ok || !known {
		return ""
	}
	return name
}

// dial opens a WebSocket to addr (a replica's or the balancer's) for a
// fresh connection and checks its ID names a replica.
func (g *ring) dial(t *testing.T, name, addr string) *acpClient {
	t.Helper()
	h := g.header("")
	h.Set("X-Scale-Client", name)
	s, resp, err := dialSocket(t, addr, "/acp", h)
	if err != nil {
		t.Fatalf("%s: dial %s: %v (%s)", name, addr, err, respText(resp))
	}
	cl := &acpClient{t: t, c: g.cluster, name: name, s: s, connID: resp.Header.Get("Acp-Connection-Id")}
	cl.Resumable = acpclient.NewResumable(t, name, func() *acpclient.Conn { return cl.s.Conn })
	if g.ownerOf(cl.connID) == "" {
		t.Fatalf("%s: Acp-Connection-Id %q does not name a replica (<replica>.<uuid>)", name, cl.connID)
	}
	return cl
}

// on opens a connection directly to replica name.
func (g *ring) on(t *testing.T, client, name string) *acpClient {
	t.Helper()
	cl := g.dial(t, client, g.replicas[name].addr)
	if o := g.ownerOf(cl.connID); o != name {
		t.Fatalf("%s: a connection opened on replica %s is named for %s (%s)", client, name, o, cl.connID)
	}
	return cl
}

// initMulti initializes asking for the multi-client updates (README,
// Several clients on one session) and returns the client's clientId.
func (cl *acpClient) initMulti() string {
	cl.t.Helper()
	m := cl.Await("initialize", cl.Request("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{},
		"clientInfo":         map[string]string{"name": "scale-" + cl.name, "version": "0"},
		"_meta":              map[string]any{"acpgate": map[string]any{"multiClient": true}},
	}), turnLimit, nil)
	var res struct {
		Meta struct {
			Acpgate struct {
				ClientID    string `json:"clientId"`
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Meta.Acpgate.ClientID == "" {
		cl.t.Fatalf("%s: initialize with multiClient: %s; want _meta.acpgate.clientId", cl.name, m.Raw)
	}
	cl.token = res.Meta.Acpgate.ResumeToken
	return res.Meta.Acpgate.ClientID
}

// sum adds up a metric over the replicas running now.
func (g *ring) sum(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	for _, n := range ringNames {
		if p := g.replicas[n].cur(); p != nil && !p.exited() {
			v += g.replicas[n].metric(t, name, labels...)
		}
	}
	return v
}

// steerAway sends requests through the balancer until one lands on
// replica owner: round robin then sends the next one elsewhere.
func (g *ring) steerAway(t *testing.T, owner string) {
	t.Helper()
	for range 2 * len(ringNames) {
		g.mu.Lock()
		g.probes++
		name := fmt.Sprintf("probe-%d", g.probes)
		g.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.lb.addr+"/healthz", nil)
		req.Header.Set("X-Scale-Client", name)
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			cancel()
			t.Fatalf("probe through the balancer: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if tl := g.lb.waitTraffic(t, name, 1); tl[0].server == owner {
			return
		}
	}
	t.Fatalf("%d requests through the balancer, none reached replica %s", 2*len(ringNames), owner)
}

func TestReplicas(t *testing.T) {
	requireTools(t)
	buildGateway(t)
	deadline := time.Now().Add(4 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-30*time.Second).Before(deadline) {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	g := newRing(t, ctx)
	t.Logf("three replicas in cluster mode (%s, %s, %s; redis %s) behind round-robin haproxy %s, ready in %s",
		g.replicas["a"].addr, g.replicas["b"].addr, g.replicas["c"].addr, g.redis.URL(0), g.lb.addr, time.Since(start).Round(time.Millisecond))

	// Each subtest makes its own connections and sessions. g and h stop
	// Redis and a replica; i stops the rest.
	t.Run("a: Streamable HTTP clients without cookies complete turns with permissions", func(t *testing.T) { ringHTTP(t, ctx, g) })
	t.Run("b: WebSockets reset mid-turn resume through the balancer, wherever it sends them", func(t *testing.T) { ringResume(t, ctx, g) })
	t.Run("c: a client on another replica attaches, gets the history, runs its own turn", func(t *testing.T) { ringAttach(t, ctx, g) })
	t.Run("d: session/list and session/status on every replica show the subject's sessions on all", func(t *testing.T) { ringList(t, ctx, g) })
	t.Run("e: the admin API on any replica lists and ends what every replica holds", func(t *testing.T) { ringAdmin(t, ctx, g) })
	t.Run("f: a prompt POSTed through a non-owner is executed once", func(t *testing.T) { ringOnce(t, ctx, g) })
	t.Run("g: Redis SIGKILLed and restarted", func(t *testing.T) { ringRedis(t, ctx, g) })
	t.Run("h: a SIGKILLed owner is named at once, its session loads elsewhere after the lease", func(t *testing.T) { ringKilled(t, ctx, g) })
	t.Run("i: no agent process of any replica is left", func(t *testing.T) { noAgentLeft(t, g.cluster) })
	t.Logf("TestReplicas took %s", time.Since(start).Round(time.Millisecond))
}

// --- a ---

func ringHTTP(t *testing.T, ctx context.Context, g *ring) {
	before := g.sum(t, "acpgate_cluster_forwarded_total", `op="http_post"`)
	const clients = 6
	waits := make([]func() *httpRun, clients)
	for i := range clients {
		waits[i] = g.startHTTPClient(t, ctx, fmt.Sprintf("a-http-%d", i), fmt.Sprintf("ask permission %d", i), "--no-cookies", "--permission", "allow")
	}
	spread, owners := 0, map[string]int{}
	for i, wait := range waits {
		name := fmt.Sprintf("a-http-%d", i)
		run := wait()
		if run.err != nil {
			t.Fatalf("%s: the SDK client without cookies failed:\n%s", name, run.dump())
		}
		if p := run.find("permission"); len(p) != 1 {
			t.Fatalf("%s: %d permission requests answered; want 1 (the demo agent's)\n%s", name, len(p), run.dump())
		}
		if p := run.find("session/prompt"); len(p) != 1 || p[0].Result.StopReason != "end_turn" || p[0].Text != "Permission granted (allow)." {
			t.Fatalf("%s: the turn: %+v; want \"Permission granted (allow).\" and end_turn\n%s", name, p, run.dump())
		}
		reqs := run.find("http")
		if len(reqs) < 5 {
			t.Fatalf("%s: %d HTTP requests; want initialize, streams, session/new, the prompt, the permission answer and DELETE\n%s", name, len(reqs), run.dump())
		}
		conn := reqs[0].ConnectionID
		owner := g.ownerOf(conn)
		if owner == "" {
			t.Fatalf("%s: Acp-Connection-Id %q names no replica\n%s", name, conn, run.dump())
		}
		for j, r := range reqs {
			if r.Status/100 != 2 || r.ConnectionID != conn || r.SentCookie != "" {
				t.Fatalf("%s: request %d %+v; want a 2xx for connection %s, sent without a cookie\n%s", name, j+1, r, conn, run.dump())
			}
		}
		servers := map[string]bool{}
		for _, tl := range g.lb.waitTraffic(t, name, len(reqs)) {
			servers[tl.server] = true
		}
		if len(servers) > 1 {
			spread++
		}
		// Only the owner opened the connection: the others carried its
		// requests there.
		if who := g.waitServed(t, conn); who != owner {
			t.Fatalf("%s: connection %s was opened on %q; its ID names %s", name, conn, who, owner)
		}
		owners[owner]++
	}
	fwd := g.sum(t, "acpgate_cluster_forwarded_total", `op="http_post"`) - before
	t.Logf("%d SDK clients without cookies completed their turns; connections held by %v; %d had requests on several replicas; %g POSTs forwarded", clients, owners, spread, fwd)
	if spread == 0 || fwd < 1 {
		t.Fatalf("no client's requests were spread over replicas (%d) or none was forwarded (%g): round robin did not test forwarding", spread, fwd)
	}
}

// --- b ---

func ringResume(t *testing.T, ctx context.Context, g *ring) {
	elsewhere := 0
	for i := range 3 {
		name := fmt.Sprintf("b-ws-%d", i)
		cl := g.dial(t, name, g.lb.addr)
		owner := g.ownerOf(cl.connID)
		r := g.replicas[owner]
		cl.initialize()
		if o := g.ownerOf(cl.token); o != owner {
			t.Fatalf("%s: the resume token names replica %q; the connection is %s's", name, o, owner)
		}
		sid := cl.newSession()
		text := echoText(fmt.Sprintf("resume %d", i), 500)
		id := cl.Request("session/prompt", textPrompt(sid, text))
		tally := &turnTally{t: t, sid: sid}
		for tally.chunks < 8 {
			m := cl.Next("the turn before the drop", left(t, ctx, turnLimit))
			if m.IsResponseTo(id) {
				t.Fatalf("%s: the turn ended after %d chunks: %s", name, tally.chunks, m.Raw)
			}
			tally.add(m)
		}
		detached := r.metric(t, "acpgate_connections_detached")
		okBefore := r.metric(t, "acpgate_resumes_total", `result="ok"`)
		fwdBefore := g.sum(t, "acpgate_cluster_forwarded_total", `op="resume"`)
		sent, n := len(cl.Frames), cl.Got
		cl.s.reset(t)
		r.waitMetric(t, 10*time.Second, fmt.Sprintf("> %g", detached), func(v float64) bool { return v > detached }, "acpgate_connections_detached")
		// Two of the three are sent to another replica for sure; the
		// last goes wherever round robin sends it.
		if i < 2 {
			g.steerAway(t, owner)
		}
		_, m := cl.resume(n)
		if m != sent {
			t.Errorf("%s: _acpgate/resumed says %d messages received; the client sent %d", name, m, sent)
		}
		answer := cl.Await("the rest of the turn after the resume", id, left(t, ctx, turnLimit), tally.add)
		tally.check(answer, "You said: "+text)
		cl.quiet(300 * time.Millisecond)
		tl := g.lb.waitTraffic(t, name+"-resume", 1)
		if len(tl) != 1 || tl[0].status != "101" {
			t.Fatalf("%s: the balancer's log of the resume: %+v; want one 101", name, tl)
		}
		landed := tl[0].server
		r.waitMetric(t, 5*time.Second, fmt.Sprint(okBefore+1), func(v float64) bool { return v == okBefore+1 }, "acpgate_resumes_total", `result="ok"`)
		wantFwd := fwdBefore
		if landed != owner {
			elsewhere++
			wantFwd++
		}
		if i < 2 && landed == owner {
			t.Fatalf("%s: steered away from %s, the resume landed on it", name, owner)
		}
		deadline := time.Now().Add(5 * time.Second)
		for g.sum(t, "acpgate_cluster_forwarded_total", `op="resume"`) != wantFwd {
			if time.Now().After(deadline) {
				t.Fatalf("%s: acpgate_cluster_forwarded_total{op=\"resume\"} is %g over the replicas; want %g (held by %s, landed on %s)",
					name, g.sum(t, "acpgate_cluster_forwarded_total", `op="resume"`), wantFwd, owner, landed)
			}
			time.Sleep(25 * time.Millisecond)
		}
		t.Logf("%s: held by %s, reset after %d messages, resumed through %s; the turn arrived whole (%d chunks)", name, owner, n, landed, tally.chunks)
		cl.turn(sid, "a turn after the resume", left(t, ctx, turnLimit))
		cl.closeClean()
	}
	if elsewhere < 2 {
		t.Fatalf("%d of 3 resumes reached another replica than the owner; want at least 2", elsewhere)
	}
}

// --- c ---

// anyUpdate is a session/update's fields the multi-client checks read.
type anyUpdate struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		Kind    string `json:"sessionUpdate"`
		Content struct {
			Text string `json:"text"`
		} `json:"content"`
		Prompt []struct {
			Text string `json:"text"`
		} `json:"prompt"`
		SentBy struct {
			ClientID string `json:"clientId"`
		} `json:"sentBy"`
		Client struct {
			ClientID string `json:"clientId"`
		} `json:"client"`
		StopReason string `json:"stopReason"`
	} `json:"update"`
}

func parseAny(t *testing.T, m rpcMsg) anyUpdate {
	t.Helper()
	var u anyUpdate
	if m.Method != "session/update" || json.Unmarshal(m.Params, &u) != nil {
		t.Fatalf("want a session/update: %.500s", m.Raw)
	}
	return u
}

func ringAttach(t *testing.T, ctx context.Context, g *ring) {
	x, y := "a", "b"
	c1 := g.on(t, "c-owner", x)
	id1 := c1.initMulti()
	sid := c1.newSession()
	text1 := "the owner's turn before the attach"
	c1.turn(sid, text1, left(t, ctx, turnLimit))

	c2 := g.on(t, "c-attacher", y)
	c2.initialize()
	bridged := g.replicas[y].metric(t, "acpgate_cluster_forwarded_total", `op="bridge"`)
	var user, agent strings.Builder
	m := c2.Await("session/attach", c2.Request("session/attach", map[string]any{
		"sessionId": sid, "historyPolicy": "full", "clientInfo": map[string]string{"name": "attacher", "version": "0"},
	}), left(t, ctx, turnLimit), func(m rpcMsg) {
		u := parseAny(t, m)
		if u.SessionID != sid {
			t.Fatalf("the replay names another session: %s", m.Raw)
		}
		switch u.Update.Kind {
		case "user_message_chunk":
			user.WriteString(u.Update.Content.Text)
		case "agent_message_chunk":
			agent.WriteString(u.Update.Content.Text)
		}
	})
	var res struct {
		ClientID         string `json:"clientId"`
		ConnectedClients []struct {
			ClientID string `json:"clientId"`
		} `json:"connectedClients"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || !strings.HasPrefix(res.ClientID, "c-") {
		t.Fatalf("session/attach on %s to a session live on %s: %s; want a result with a clientId", y, x, m.Raw)
	}
	owned := false
	for _, c := range res.ConnectedClients {
		owned = owned || c.ClientID == id1
	}
	if !owned {
		t.Errorf("the attach result's connectedClients %+v lacks the owner's clientId %s", res.ConnectedClients, id1)
	}
	if user.String() != text1 || agent.String() != "You said: "+text1 {
		t.Fatalf("the attach replayed user %q and agent %q; want the whole history: %q, %q", user.String(), agent.String(), text1, "You said: "+text1)
	}
	text2 := "the attached client's own turn"
	c2.turn(sid, text2, left(t, ctx, turnLimit))

	// The owner, on its own replica, sees the other client join and its
	// turn: prompt_received (sent by it) before the agent's reply, the
	// reply, turn_complete.
	var joined, received bool
	var reply strings.Builder
	for done := false; !done; {
		u := parseAny(t, c1.Next("the attached client's turn, seen by the owner", left(t, ctx, turnLimit)))
		switch u.Update.Kind {
		case "client_connected":
			joined = joined || u.Update.Client.ClientID == res.ClientID
		case "prompt_received":
			if u.Update.SentBy.ClientID != res.ClientID || len(u.Update.Prompt) != 1 || u.Update.Prompt[0].Text != text2 || reply.Len() > 0 {
				t.Fatalf("the owner's prompt_received: %+v; want the prompt %q sent by %s, before the reply", u.Update, text2, res.ClientID)
			}
			received = true
		case "agent_message_chunk":
			reply.WriteString(u.Update.Content.Text)
		case "turn_complete":
			if !received {
				continue // the end of a turn before the attached client's
			}
			if u.Update.StopReason != "end_turn" {
				t.Fatalf("the owner's turn_complete: %+v; want end_turn", u.Update)
			}
			done = true
		}
	}
	if !joined || !received || reply.String() != "You said: "+text2 {
		t.Fatalf("the owner saw client_connected %v, prompt_received %v, the reply %q; want both and %q", joined, received, reply.String(), "You said: "+text2)
	}
	if v := g.replicas[y].metric(t, "acpgate_cluster_forwarded_total", `op="bridge"`); v <= bridged {
		t.Errorf("replica %s's acpgate_cluster_forwarded_total{op=\"bridge\"} stayed %g: the attach was not bridged", y, v)
	}
	c2.closeClean()
	c1.closeClean()
}

// --- d ---

// listSessions pages through session/list and returns the IDs.
func (cl *acpClient) listSessions(ctx context.Context) map[string]bool {
	cl.t.Helper()
	out := map[string]bool{}
	var cursor any
	for range 50 {
		params := map[string]any{"cwd": cl.c.root}
		if cursor != nil {
			params["cursor"] = cursor
		}
		m := cl.Await("session/list", cl.Request("session/list", params), left(cl.t, ctx, turnLimit), nil)
		var res struct {
			Sessions []struct {
				SessionID string `json:"sessionId"`
			} `json:"sessions"`
			NextCursor *string `json:"nextCursor"`
		}
		if m.Error != nil || json.Unmarshal(m.Result, &res) != nil {
			cl.t.Fatalf("%s: session/list: %s", cl.name, m.Raw)
		}
		for _, s := range res.Sessions {
			out[s.SessionID] = true
		}
		if res.NextCursor == nil || *res.NextCursor == "" {
			return out
		}
		cursor = *res.NextCursor
	}
	cl.t.Fatalf("%s: session/list still has pages after 50", cl.name)
	return nil
}

// liveSessions opens a connection and a session on every replica.
func (g *ring) liveSessions(t *testing.T, tag string) (clients map[string]*acpClient, sids map[string]string) {
	t.Helper()
	clients, sids = map[string]*acpClient{}, map[string]string{}
	for _, name := range ringNames {
		cl := g.on(t, tag+"-"+name, name)
		cl.initialize()
		clients[name], sids[name] = cl, cl.newSession()
	}
	return clients, sids
}

// sessionStatus is session/status's answer ("" and the message for an
// error).
func (cl *acpClient) sessionStatus(ctx context.Context, sid string) (string, rpcMsg) {
	cl.t.Helper()
	m := cl.Await("session/status", cl.Request("session/status", map[string]any{"sessionId": sid}), left(cl.t, ctx, turnLimit), nil)
	var res struct {
		Status string `json:"status"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil {
		return "", m
	}
	return res.Status, m
}

func ringList(t *testing.T, ctx context.Context, g *ring) {
	makers, sids := g.liveSessions(t, "d-make")
	lists := map[string]*acpClient{}
	for _, name := range ringNames {
		cl := g.on(t, "d-list-"+name, name)
		cl.initialize()
		lists[name] = cl
		listed := cl.listSessions(ctx)
		for made, sid := range sids {
			if !listed[sid] {
				t.Errorf("session/list on replica %s lacks the session made on %s (%d listed)", name, made, len(listed))
			}
			if st, m := cl.sessionStatus(ctx, sid); st != "open" {
				t.Errorf("session/status on replica %s of the session live on %s: %s; want open", name, made, m.Raw)
			}
		}
	}
	// c's session ends with its only client: "saved" everywhere (its ID
	// opens; a load would start it again).
	makers["c"].closeClean()
	for _, name := range ringNames {
		for deadline := time.Now().Add(lease + time.Second); ; {
			st, m := lists[name].sessionStatus(ctx, sids["c"])
			if st == "saved" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("session/status on replica %s of c's session %s after it ended: %s; want saved", name, lease+time.Second, m.Raw)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, cl := range lists {
		cl.closeClean()
	}
}

// --- e ---

// admin calls the admin API on replica name directly.
func (g *ring) admin(t *testing.T, method, name, path string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+g.replicas[name].addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+g.adminToken)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("%s %s on replica %s: %v", method, path, name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// adminList is GET /v1/admin/<what> on replica name: every entry's
// replica, by its id.
func (g *ring) adminList(t *testing.T, name, what string) map[string]string {
	t.Helper()
	code, body := g.admin(t, http.MethodGet, name, "/v1/admin/"+what)
	var list map[string][]struct {
		ID      string `json:"id"`
		Replica string `json:"replica"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("GET /v1/admin/%s on replica %s: %d %.500s", what, name, code, body)
	}
	out := map[string]string{}
	for _, e := range list[what] {
		out[e.ID] = e.Replica
	}
	return out
}

func ringAdmin(t *testing.T, ctx context.Context, g *ring) {
	clients, sids := g.liveSessions(t, "e-admin")
	for _, name := range ringNames {
		sessions, conns := g.adminList(t, name, "sessions"), g.adminList(t, name, "connections")
		for held, sid := range sids {
			if got := sessions[sid]; got != held {
				t.Errorf("GET /v1/admin/sessions on replica %s: the session held by %s is listed with replica %q", name, held, got)
			}
			if got := conns[clients[held].connID]; got != held {
				t.Errorf("GET /v1/admin/connections on replica %s: the connection held by %s is listed with replica %q", name, held, got)
			}
		}
	}
	if t.Failed() {
		return
	}
	// Replica a ends b's session: b's client is told, and nobody lists
	// it any more.
	code, body := g.admin(t, http.MethodDelete, "a", "/v1/admin/sessions/"+sids["b"])
	if code != http.StatusOK {
		t.Fatalf("DELETE /v1/admin/sessions/<b's> on replica a: %d %s", code, body)
	}
	cb := clients["b"]
	for {
		m := cb.Next("_acpgate/session_ended after the admin end on another replica", left(t, ctx, 10*time.Second))
		if m.Method == "_acpgate/session_ended" {
			if m.Param("sessionId") != sids["b"] {
				t.Fatalf("_acpgate/session_ended for another session: %s", m.Raw)
			}
			break
		}
	}
	m := cb.Await("a prompt to the ended session", cb.Request("session/prompt", textPrompt(sids["b"], "after the end")), left(t, ctx, turnLimit), nil)
	if m.Error == nil || m.Error.Code != -32002 {
		t.Fatalf("a prompt to the session an administrator ended: %s; want -32002", m.Raw)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, still := g.adminList(t, "c", "sessions")[sids["b"]]; !still {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica c still lists the ended session 5 s after its end")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Replica a closes c's connection: its socket closes with 1008.
	cc := clients["c"]
	code, body = g.admin(t, http.MethodDelete, "a", "/v1/admin/connections/"+cc.connID)
	if code != http.StatusOK {
		t.Fatalf("DELETE /v1/admin/connections/<c's> on replica a: %d %s", code, body)
	}
	select {
	case <-cc.s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("replica c's connection is still open 10 s after replica a closed it")
	}
	if code := closeStatus(cc.s.Err()); code != websocket.StatusPolicyViolation {
		t.Errorf("the closed connection ended with %v (close code %d); want 1008", cc.s.Err(), code)
	}
	clients["a"].closeClean()
	cb.closeClean()
}

// --- f ---

// hpeer is a raw Streamable-HTTP client: every request goes to the
// replica it is given.
type hpeer struct {
	t    *testing.T
	g    *ring
	hc   *http.Client
	conn string // its Acp-Connection-Id, from the answer to initialize
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc
	msgs chan rpcMsg // what its event streams carried, in arrival order
}

func (g *ring) hpeer(t *testing.T) *hpeer {
	ctx, stop := context.WithCancel(context.Background())
	p := &hpeer{t: t, g: g, hc: &http.Client{}, ctx: ctx, stop: stop, msgs: make(chan rpcMsg, 10000)}
	t.Cleanup(func() { p.stop(); p.wg.Wait() })
	return p
}

// post sends body to replica name (for session, if not "") and returns
// the status and body.
func (p *hpeer) post(name, session, body string) (int, string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.g.replicas[name].addr+"/acp", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+p.g.token)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	if p.conn != "" {
		r.Header.Set("Acp-Connection-Id", p.conn)
	}
	if session != "" {
		r.Header.Set("Acp-Session-Id", session)
	}
	resp, err := p.hc.Do(r)
	if err != nil {
		p.t.Fatalf("POST /acp on %s: %v", name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if p.conn == "" {
		p.conn = resp.Header.Get("Acp-Connection-Id")
	}
	return resp.StatusCode, string(b)
}

// stream opens an event stream on replica name (session "" for the
// connection's) and passes its messages to p.msgs until p stops.
func (p *hpeer) stream(name, session string) {
	p.t.Helper()
	r, _ := http.NewRequestWithContext(p.ctx, http.MethodGet, "http://"+p.g.replicas[name].addr+"/acp", nil)
	r.Header.Set("Authorization", "Bearer "+p.g.token)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Acp-Connection-Id", p.conn)
	if session != "" {
		r.Header.Set("Acp-Session-Id", session)
	}
	resp, err := p.hc.Do(r)
	if err != nil {
		p.t.Fatalf("GET /acp on %s: %v", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p.t.Fatalf("GET /acp on %s (session %q): %d %s", name, session, resp.StatusCode, b)
	}
	p.wg.Add(1)
	go func() { // ends with the stream, or with p (which ends the request)
		defer p.wg.Done()
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			d, ok := strings.CutPrefix(sc.Text(), "data: ")
			var m rpcMsg
			if !ok || json.Unmarshal([]byte(d), &m) != nil {
				continue
			}
			m.Raw = []byte(d)
			select {
			case p.msgs <- m:
			case <-p.ctx.Done():
				return
			}
		}
	}()
}

// next is the next message of p's streams.
func (p *hpeer) next(what string, timeout time.Duration) rpcMsg {
	p.t.Helper()
	select {
	case m := <-p.msgs:
		return m
	case <-time.After(timeout):
		p.t.Fatalf("%s: nothing on the event streams within %s", what, timeout)
	}
	return rpcMsg{}
}

// agentPrompts counts the user messages text in the demo agent's stored
// sessions (the shared sandbox home): how often an agent executed it.
func (g *ring) agentPrompts(t *testing.T, text string) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(g.homes, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), text) {
			return nil
		}
		var f struct {
			History []struct{ Role, Text string } `json:"history"`
		}
		if json.Unmarshal(b, &f) == nil {
			for _, h := range f.History {
				if h.Role == "user" && h.Text == text {
					n++
				}
			}
		}
		return nil
	})
	return n
}

// httpSession opens a Streamable-HTTP connection on replica own, its
// connection's event stream there, and a session; the session's event
// stream on replica stream.
func (g *ring) httpSession(t *testing.T, ctx context.Context, own, stream string) (*hpeer, string) {
	t.Helper()
	p := g.hpeer(t)
	code, body := p.post(own, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	if code != http.StatusOK || g.ownerOf(p.conn) != own {
		t.Fatalf("initialize over HTTP on %s: %d %.300s (Acp-Connection-Id %q)", own, code, body, p.conn)
	}
	p.stream(own, "")
	newSession := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`, g.root)
	if code, body := p.post(own, "", newSession); code != http.StatusAccepted {
		t.Fatalf("session/new over HTTP: %d %.300s", code, body)
	}
	var sid string
	for sid == "" {
		if m := p.next("session/new", left(t, ctx, turnLimit)); m.IsResponseTo(2) {
			if sid = m.NewSessionID(); sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
		}
	}
	p.stream(stream, sid)
	return p, sid
}

// promptOnce POSTs a prompt for sid through replica via and checks that
// its client gets one answer, the whole echo, and nothing more; and that
// the agent executed it once. It returns how many POSTs via counted
// forwarded meanwhile.
func (g *ring) promptOnce(t *testing.T, ctx context.Context, p *hpeer, sid, via, text string) float64 {
	t.Helper()
	before := g.replicas[via].metric(t, "acpgate_cluster_forwarded_total", `op="http_post"`)
	prompt, _ := json.Marshal(acpclient.Request(3, "session/prompt", textPrompt(sid, text)))
	if code, body := p.post(via, sid, string(prompt)); code != http.StatusAccepted {
		t.Fatalf("session/prompt POSTed to non-owner %s: %d %.300s", via, code, body)
	}
	tally := &turnTally{t: t, sid: sid}
	var answer rpcMsg
	for answer.Raw == nil {
		m := p.next("the prompt's answer", left(t, ctx, turnLimit))
		switch {
		case m.IsResponseTo(3):
			answer = m
		case m.Method == "session/update":
			tally.add(m)
		}
	}
	tally.check(answer, "You said: "+text)
	// Nothing more: no second answer, no second echo.
	select {
	case m := <-p.msgs:
		t.Fatalf("after the answer (a second execution?): %.300s", m.Raw)
	case <-time.After(time.Second):
	}
	if n := g.agentPrompts(t, text); n != 1 {
		t.Fatalf("the agent's stored session has the prompt %d times; want exactly once", n)
	}
	return g.replicas[via].metric(t, "acpgate_cluster_forwarded_total", `op="http_post"`) - before
}

func ringOnce(t *testing.T, ctx context.Context, g *ring) {
	own, via := "b", "a"
	// The session's event stream through the non-owner too: carried from
	// the owner, as the prompt is.
	p, sid := g.httpSession(t, ctx, own, via)
	if fwd := g.promptOnce(t, ctx, p, sid, via, "executed once "+harness.RandomHex(t, 8)); fwd != 1 {
		t.Errorf("replica %s forwarded %g POSTs for one prompt; want 1", via, fwd)
	}

	// The hop fails after the owner got the POST (its answer is withheld
	// and the forwarder's connection reset): the forwarder sends it again,
	// the owner drops what it has seen, the client gets one answer and
	// the agent one prompt. (The stream stays on the owner: only the POST
	// crosses the proxy.)
	p, sid = g.httpSession(t, ctx, own, own)
	g.faults.arm()
	fwd := g.promptOnce(t, ctx, p, sid, via, "executed once despite a retry "+harness.RandomHex(t, 8))
	if cuts := g.faults.cutCount(); cuts != 1 {
		t.Fatalf("the proxy in front of %s cut %d hops; want the prompt's: the retry was not tested", own, cuts)
	}
	if fwd != 1 {
		t.Errorf("replica %s counted %g POSTs forwarded for one prompt sent twice over the hop; want 1 (delivered once)", via, fwd)
	}
	t.Logf("a POST whose hop was reset after delivery: retried, executed once")
}

// --- g ---

// storeRefusal checks an answer that could not be routed for want of
// the store: -32002, data.reason store_unavailable, naming the store.
func (g *ring) storeRefusal(t *testing.T, m rpcMsg, what string) {
	t.Helper()
	var data struct {
		Reason string `json:"reason"`
	}
	store := fmt.Sprintf("127.0.0.1:%d", g.redis.Port)
	if m.Error == nil || m.Error.Code != -32002 || json.Unmarshal(m.Error.Data, &data) != nil || data.Reason != "store_unavailable" || !strings.Contains(m.Error.Message, store) {
		t.Fatalf("%s with Redis down: %s; want success or -32002 with data.reason store_unavailable, naming %s", what, m.Raw, store)
	}
}

func ringRedis(t *testing.T, ctx context.Context, g *ring) {
	clients, sids := g.liveSessions(t, "g-held")
	// A turn on each, so that a later attach has history to replay.
	for _, name := range ringNames {
		clients[name].turn(sids[name], "before the store goes "+name, left(t, ctx, turnLimit))
	}
	g.redis.Kill()
	down := time.Now()

	// Every replica serves what it holds and new sessions.
	made := map[string]string{}
	fresh := map[string]*acpClient{}
	for _, name := range ringNames {
		clients[name].turn(sids[name], "while the store is down "+name, left(t, ctx, turnLimit))
		cl := g.on(t, "g-new-"+name, name)
		cl.initialize()
		made[name] = cl.newSession()
		cl.turn(made[name], "a new session while the store is down "+name, left(t, ctx, turnLimit))
		fresh[name] = cl
	}
	// A cross-replica attach is answered within 2 s: routed (the session
	// ID names its owner) or refused naming the store; never a hang.
	x := g.on(t, "g-cross", "b")
	x.initialize()
	sent := time.Now()
	m := x.Await("session/attach to a's session with Redis down", x.Request("session/attach", map[string]any{"sessionId": made["a"], "historyPolicy": "none"}),
		left(t, ctx, 5*time.Second), nil)
	took := time.Since(sent)
	if took > 2*time.Second {
		t.Errorf("a cross-replica attach with Redis down was answered after %s; want within 2 s", took.Round(time.Millisecond))
	}
	if m.Error != nil {
		g.storeRefusal(t, m, "session/attach")
		t.Logf("with Redis down a cross-replica attach was refused in %s: %s", took.Round(time.Millisecond), m.Error.Message)
	} else {
		t.Logf("with Redis down a cross-replica attach was routed by its ID in %s", took.Round(time.Millisecond))
		x.Await("session/detach", x.Request("session/detach", map[string]any{"sessionId": made["a"]}), left(t, ctx, turnLimit), nil)
	}
	t.Logf("Redis was down %s", time.Since(down).Round(time.Millisecond))

	// Back, empty: within a heartbeat the replicas have written every
	// record again: b attaches to the session a made during the outage
	// (its history), and c, which has not seen it, lists it.
	g.redis.Restart()
	back := time.Now()
	want := "You said: a new session while the store is down a"
	for {
		var agent strings.Builder
		m = x.Await("session/attach after Redis came back", x.Request("session/attach", map[string]any{"sessionId": made["a"], "historyPolicy": "full"}),
			left(t, ctx, turnLimit), func(m rpcMsg) {
				if u := parseAny(t, m); u.Update.Kind == "agent_message_chunk" {
					agent.WriteString(u.Update.Content.Text)
				}
			})
		if m.Error == nil {
			if agent.String() != want {
				t.Fatalf("session/attach from b to a's session after Redis came back replayed %q; want its history %q", agent.String(), want)
			}
			break
		}
		if time.Since(back) > lease+time.Second {
			t.Fatalf("session/attach from b to the session a made while Redis was down still fails %s after Redis came back (lease %s): %s",
				time.Since(back).Round(time.Millisecond), lease, m.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("b attached to a's session %s after Redis came back", time.Since(back).Round(time.Millisecond))
	// The sessions a made before the outage (their makers' records went
	// with Redis's data) and during it (never written) alike.
	y := g.on(t, "g-list", "c")
	y.initialize()
	for {
		listed := y.listSessions(ctx)
		if listed[made["a"]] && listed[sids["a"]] {
			break
		}
		if time.Since(back) > lease+time.Second {
			t.Errorf("session/list on c, %s after Redis came back (lease %s): the session a made before the outage listed: %v, the one a made during it: %v; want both (their makers written again)",
				time.Since(back).Round(time.Millisecond), lease, listed[sids["a"]], listed[made["a"]])
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.turn(made["a"], "a turn from b after the store came back", left(t, ctx, turnLimit))
	x.closeClean()
	y.closeClean()
	for _, name := range ringNames {
		clients[name].closeClean()
		fresh[name].closeClean()
	}
}

// --- h ---

// ownerGone checks a JSON-RPC refusal for a dead owner: -32002,
// data.reason owner_gone, naming the replica.
func ownerGone(t *testing.T, m rpcMsg, what, replica string) {
	t.Helper()
	var data struct {
		Reason string `json:"reason"`
	}
	if m.Error == nil || m.Error.Code != -32002 || json.Unmarshal(m.Error.Data, &data) != nil || data.Reason != "owner_gone" || !strings.Contains(m.Error.Message, "replica "+replica) {
		t.Fatalf("%s for a session of SIGKILLed replica %s: %s; want -32002 with data.reason owner_gone, naming replica %s", what, replica, m.Raw, replica)
	}
}

func ringKilled(t *testing.T, ctx context.Context, g *ring) {
	k, o := "c", "a"
	cl := g.on(t, "h-victim", k)
	cl.initialize()
	sid := cl.newSession()
	first := "the turn before the kill"
	cl.turn(sid, first, left(t, ctx, turnLimit))
	hp := g.hpeer(t)
	if code, body := hp.post(k, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`); code != http.StatusOK || g.ownerOf(hp.conn) != k {
		t.Fatalf("initialize over HTTP on %s: %d %.300s (%q)", k, code, body, hp.conn)
	}
	sv := g.on(t, "h-survivor", o)
	sv.initialize()

	kp := g.replicas[k].cur()
	agents := kp.agentPIDs()
	if err := kp.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kp.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s still runs 10 s after SIGKILL", k)
	}
	killed := time.Now()
	fast := func(what string, since time.Time) {
		t.Helper()
		if d := time.Since(since); d > time.Second {
			t.Errorf("%s for SIGKILLed replica %s answered after %s; want within 1 s", what, k, d.Round(time.Millisecond))
		}
	}

	// A request for its session through a survivor: refused at once,
	// naming the replica. So is its Streamable-HTTP connection, and its
	// WebSocket's resume.
	sent := time.Now()
	m := sv.Await("session/attach to the dead replica's session", sv.Request("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none"}), left(t, ctx, 5*time.Second), nil)
	fast("session/attach", sent)
	ownerGone(t, m, "session/attach", k)

	sent = time.Now()
	code, body := hp.post(o, "", fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`, g.root))
	fast("a POST", sent)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "held by replica "+k) {
		t.Fatalf("a POST for the dead replica's connection through %s: %d %.300s; want 503 naming replica %s", o, code, body, k)
	}

	sent = time.Now()
	h := g.header("")
	h.Set("X-Scale-Client", "h-resume")
	if s, resp, err := dialSocket(t, g.replicas[o].addr, resumePath(cl.token, cl.Got), h); err == nil {
		s.Close()
		t.Fatalf("the resume of the dead replica's connection was upgraded by %s", o)
	} else {
		fast("a resume", sent)
		raw := respText(resp)
		if resp == nil || resp.StatusCode != http.StatusNotFound || !strings.Contains(raw, "resume_refused") || !strings.Contains(raw, "owner_gone") {
			t.Fatalf("the resume of the dead replica's connection on %s: %v: %s; want 404 resume_refused, owner_gone", o, err, raw)
		}
	}
	waitGone(t, agents, 10*time.Second, "replica "+k+"'s agent processes after SIGKILL")

	// Once the lease has run out, the session loads on the survivor from
	// the shared store, and the conversation goes on.
	var replay []update
	for {
		replay = replay[:0]
		m := sv.Await("session/load", sv.Request("session/load", map[string]any{"sessionId": sid, "cwd": g.root, "mcpServers": []any{}}),
			left(t, ctx, turnLimit), func(m rpcMsg) { replay = append(replay, parseUpdate(t, m)) })
		if m.Error == nil {
			break
		}
		ownerGone(t, m, "session/load within the lease", k)
		if time.Since(killed) > lease+time.Second {
			t.Fatalf("session/load still refused %s after the SIGKILL (lease %s): %s", time.Since(killed).Round(time.Millisecond), lease, m.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the dead replica's session loaded on %s %s after the SIGKILL (lease %s)", o, time.Since(killed).Round(time.Millisecond), lease)
	var user, agent strings.Builder
	for _, u := range replay {
		switch u.Update.Kind {
		case "user_message_chunk":
			user.WriteString(u.Update.Content.Text)
		case "agent_message_chunk":
			agent.WriteString(u.Update.Content.Text)
		}
	}
	if user.String() != first || agent.String() != "You said: "+first {
		t.Fatalf("session/load replayed user %q, agent %q; want %q, %q", user.String(), agent.String(), first, "You said: "+first)
	}
	sv.turn(sid, "the conversation goes on elsewhere", left(t, ctx, turnLimit))
	sv.closeClean()
}
