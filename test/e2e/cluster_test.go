package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/gateway/cluster"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// Two replicas (a, b) of one cluster: one Redis, one session key, tenant
// acme with two subjects (alice, bob; sharing: the same subject only) and
// an admin token. What one replica carries to the other acts as the
// client's own subject, and the holder decides as if the client were
// there: these tests try to get around that.
type clusterEnv struct {
	a, b            *gateway
	internal        map[string]string // replica → its internal listener
	cfgPath         string
	alice, bob, adm string
	root            string
	redis           *redistest.Server
}

func newClusterEnv(t *testing.T, extra ...string) *clusterEnv {
	t.Helper()
	e := &clusterEnv{redis: redistest.Start(t), internal: map[string]string{}}
	dir := t.TempDir()
	key := filepath.Join(dir, "session.key")
	writeFile(t, key, []byte(harness.RandomHex(t, 32)+"\n"))
	e.root = filepath.Join(dir, "acme")
	if err := os.Mkdir(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := func(tok string) string {
		s := sha256.Sum256([]byte(tok))
		return strconv.Quote(hex.EncodeToString(s[:]))
	}
	e.alice, e.bob, e.adm = "acme-"+harness.RandomHex(t, 24), "acme-"+harness.RandomHex(t, 24), "adm-"+harness.RandomHex(t, 24)
	base := subjConfig(t) + fmt.Sprintf("session_key_file: %q\nadmin: {tokens_sha256: [%s]}\n", key, sum(e.adm)) +
		fmt.Sprintf("tenants:\n  - name: acme\n    tokens_sha256: [%s, %s]\n    root: %q\n", sum(e.alice), sum(e.bob), e.root)
	base = strings.Replace(base, "policy: {session:", "policy: {unstable: true, session:", 1)
	// The agents' session store, shared by the replicas (as the sandbox's
	// home volume is in deploy/k8s).
	shared := filepath.Join(e.root, ".fake-sessions")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(base, "env: {FAKE_MODE: sessions}") {
		t.Fatal("subjConfig's agent line changed")
	}
	base = strings.Replace(base, "env: {FAKE_MODE: sessions}", fmt.Sprintf("env: {FAKE_MODE: sessions, FAKE_SESSIONS_DIR: %q}", shared), 1)
	base += strings.Join(extra, "")
	for _, name := range []string{"a", "b"} {
		e.internal[name] = harness.FreeAddr(t)
		cfg := base + fmt.Sprintf("cluster: {name: %s, store: %q, listen: %q, lease: 2s}\n", name, e.redis.URL(0), e.internal[name])
		if name == "a" {
			e.cfgPath = filepath.Join(dir, "a.yaml")
			writeFile(t, e.cfgPath, []byte(cfg))
		}
		g := startGateway(t, gwOpts{config: cfg})
		if name == "a" {
			e.a = g
		} else {
			e.b = g
		}
	}
	return e
}

// initMeta is _meta.acpgate of an initialize result.
func initMeta(init map[string]any) map[string]any {
	m, _ := init["_meta"].(map[string]any)
	a, _ := m["acpgate"].(map[string]any)
	return a
}

// clusterSession opens a session for token on g over a WebSocket.
func (e *clusterEnv) clusterSession(t *testing.T, g *gateway, token string) (*client, string, map[string]any) {
	t.Helper()
	c, resp, err := dialWith(t, g, "/acp", bearer(token), []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v (%s)", err, respText(resp))
	}
	init := c.initialize()
	return c, c.newSession(e.root), init
}

// The internal listener takes only what carries a valid envelope: none, a
// changed one or the same one again are refused; a client's own
// Acpgate-Cluster-* headers on the public listener change nothing.
func TestClusterEnvelopes(t *testing.T) {
	e := newClusterEnv(t)
	url := "http://" + e.internal["a"] + cluster.Prefix + "/admin/sessions"

	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unsigned request: %d, want 403", resp.StatusCode)
	}

	// An envelope signed with the cluster key, as replica b signs them.
	cfg, err := config.LoadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	key, err := cfg.ClusterKey()
	if err != nil {
		t.Fatal(err)
	}
	node, err := cluster.New(cluster.Config{Name: "b", Store: e.redis.URL(0), Advertise: "http://127.0.0.1:1", Key: key},
		slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	node.SignRequest(req, cluster.Envelope{Op: "admin_list", Subject: "admin:x", Reply: "admin"})
	send := func(what string, want int) {
		t.Helper()
		r2, _ := http.NewRequest(req.Method, req.URL.String(), nil)
		r2.Header = req.Header.Clone()
		resp, err := http.DefaultClient.Do(r2)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d %s, want %d", what, resp.StatusCode, body, want)
		}
	}
	send("a signed request", http.StatusOK)
	send("the same envelope again", http.StatusConflict)
	req.Header.Set("Acpgate-Cluster-Nonce", "fresh-nonce-"+harness.RandomHex(t, 8))
	send("the envelope with another nonce (its signature no longer holds)", http.StatusForbidden)
	req.Header.Set("Acpgate-Cluster-Tenant", "other")
	send("the envelope naming another tenant", http.StatusForbidden)

	// Bob, on the public listener, claiming alice's subject in cluster
	// headers, reaches nothing of alice's.
	h := &httpPeer{t: t, g: e.a, hc: &http.Client{}, token: e.alice}
	connID := h.initializeConn(t)
	post := func(g *gateway, token string, extra http.Header) int {
		r, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr+"/acp",
			strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":`+strconv.Quote(e.root)+`,"mcpServers":[]}}`))
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Acp-Connection-Id", connID)
		for k, v := range extra {
			r.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	forged := http.Header{"Acpgate-Cluster-Tenant": {"acme"}, "Acpgate-Cluster-Subject": {"x"}, "Acpgate-Cluster-From": {"a"}}
	for _, g := range []*gateway{e.a, e.b} {
		if code := post(g, e.bob, forged); code != http.StatusNotFound {
			t.Fatalf("bob posting to alice's connection (via %s) with forged cluster headers: %d, want 404", g.Addr, code)
		}
	}
	if code := post(e.b, e.alice, nil); code != http.StatusAccepted {
		t.Fatalf("alice posting to her connection through b: %d, want 202", code)
	}
}

// initializeConn opens a Streamable HTTP connection and returns its ID.
func (p *httpPeer) initializeConn(t *testing.T) string {
	t.Helper()
	r, _ := http.NewRequest(http.MethodPost, "http://"+p.g.Addr+"/acp",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`))
	r.Header.Set("Authorization", "Bearer "+p.token)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := p.hc.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("Acp-Connection-Id")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(id, "a.") {
		t.Fatalf("initialize on a: %d, connection %q (want a.<uuid>)", resp.StatusCode, id)
	}
	return id
}

// A session bridge acts as the client's own subject: the holder refuses
// bob's attach to alice's session as it would on its own listener, and
// lets alice attach and prompt through the other replica.
func TestClusterBridgeActsAsTheClient(t *testing.T) {
	e := newClusterEnv(t)
	_, sid, _ := e.clusterSession(t, e.a, e.alice)

	bob := dialToken(t, e.b, e.bob)
	m := bob.Call("session/attach", map[string]any{"sessionId": sid}, 10*time.Second)
	if m.Error == nil || m.Error.Code != -32002 {
		t.Fatalf("bob's attach to alice's session through b: %s, want -32002", m.Raw)
	}
	alice2 := dialToken(t, e.b, e.alice)
	m = alice2.Call("session/attach", map[string]any{"sessionId": sid}, 10*time.Second)
	if m.Error != nil || !strings.Contains(string(m.Raw), `"clientId"`) {
		t.Fatalf("alice's attach through b: %s", m.Raw)
	}
	id := alice2.Request("session/prompt", textPrompt(sid, "through b"))
	r := alice2.Await(id, 15*time.Second, nil)
	if r.Error != nil || !strings.Contains(string(r.Raw), "end_turn") {
		t.Fatalf("alice's prompt through b: %s", r.Raw)
	}
	if n := clusterMetric(t, e.b, `acpgate_cluster_forwarded_total{op="bridge"}`); n < 1 {
		t.Fatalf("b opened %v bridges, want at least 1", n)
	}
}

// A resume that reaches the other replica is carried to the holder, which
// decides it: bob cannot resume alice's connection with her token; alice
// can.
func TestClusterResumeActsAsTheClient(t *testing.T) {
	e := newClusterEnv(t)
	c, _, init := e.clusterSession(t, e.a, e.alice)
	token, _ := initMeta(init)["resumeToken"].(string)
	if !strings.HasPrefix(token, "a.") {
		t.Fatalf("resume token %q: want a.<random>", token)
	}
	c.WS.CloseNow()
	time.Sleep(200 * time.Millisecond)
	path := "/acp?resume=" + token + "&received=2"
	_, resp, err := dialWith(t, e.b, path, bearer(e.bob), []string{"acp"})
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound || !strings.Contains(respText(resp), "resume_refused") {
		t.Fatalf("bob resuming alice's connection through b: err %v, %s; want 404 resume_refused", err, respText(resp))
	}
	back, resp, err := dialWith(t, e.b, path, bearer(e.alice), []string{"acp"})
	if err != nil {
		t.Fatalf("alice resuming through b: %v (%s)", err, respText(resp))
	}
	if id := resp.Header.Get("Acp-Connection-Id"); !strings.HasPrefix(id, "a.") {
		t.Fatalf("resumed connection %q, want a's", id)
	}
	if m := back.Next(5 * time.Second); m.Method != "_acpgate/resumed" {
		t.Fatalf("first message after the resume: %s", m.Raw)
	}
}

// The holder's death is reported at once, naming it: an attach through
// the other replica gets -32002 with reason owner_gone.
func TestClusterOwnerGoneFast(t *testing.T) {
	e := newClusterEnv(t)
	_, sid, _ := e.clusterSession(t, e.a, e.alice)
	time.Sleep(300 * time.Millisecond) // the record is written
	e.a.Kill()
	alice2 := dialToken(t, e.b, e.alice)
	start := time.Now()
	m := alice2.Call("session/attach", map[string]any{"sessionId": sid}, 10*time.Second)
	var data struct{ Reason, Replica string }
	if m.Error != nil {
		_ = json.Unmarshal(m.Error.Data, &data)
	}
	if m.Error == nil || m.Error.Code != -32002 || data.Reason != "owner_gone" || data.Replica != "a" {
		t.Fatalf("attach to a dead replica's session: %s; want -32002 owner_gone naming a", m.Raw)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the refusal took %s", d)
	}
}

// clusterMetric is a sample of g's /metrics (-1: absent).
func clusterMetric(t *testing.T, g *gateway, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(sample+" ")); ok {
			f, _ := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			return f
		}
	}
	return -1
}

// Once a dead holder's lease has run out, a load on a live replica takes
// the session over (from the shared agent store) and its next prompt runs.
func TestClusterLoadTakesOverAfterLease(t *testing.T) {
	e := newClusterEnv(t)
	c, sid, _ := e.clusterSession(t, e.a, e.alice)
	if r := c.Await(c.Request("session/prompt", textPrompt(sid, "on a")), 15*time.Second, nil); r.Error != nil {
		t.Fatalf("prompt on a: %s", r.Raw)
	}
	e.a.Kill()
	time.Sleep(2500 * time.Millisecond) // the lease (2s)
	b := dialToken(t, e.b, e.alice)
	m := b.Call("session/load", map[string]any{"sessionId": sid, "cwd": e.root, "mcpServers": []any{}}, 15*time.Second)
	if m.Error != nil {
		t.Fatalf("load on b after a's lease: %s", m.Raw)
	}
	if r := b.Await(b.Request("session/prompt", textPrompt(sid, "on b")), 15*time.Second, nil); r.Error != nil {
		t.Fatalf("prompt on b: %s", r.Raw)
	}
}

// A draining replica hands nothing new to itself: a load, by a client
// still connected to it, of a session live nowhere is carried to a
// replica that stays, which loads it.
func TestClusterDrainingHandsLoadsOn(t *testing.T) {
	e := newClusterEnv(t, "shutdown_delay: 3s\n")
	c, sid, _ := e.clusterSession(t, e.b, e.alice)
	if r := c.Call("session/close", map[string]any{"sessionId": sid}, 10*time.Second); r.Error != nil {
		t.Fatalf("close on b: %s", r.Raw)
	}
	onA := dialToken(t, e.a, e.alice)
	if err := e.a.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a marks itself draining; shutdown_delay (3s) keeps its connections
	m := onA.Call("session/load", map[string]any{"sessionId": sid, "cwd": e.root, "mcpServers": []any{}}, 10*time.Second)
	if m.Error != nil {
		t.Fatalf("load on draining a: %s", m.Raw)
	}
	if n := clusterMetric(t, e.a, `acpgate_cluster_forwarded_total{op="bridge"}`); n < 1 {
		t.Fatalf("draining a opened %v bridges; want the load carried to b", n)
	}
	if r := onA.Await(onA.Request("session/prompt", textPrompt(sid, "through a, on b")), 15*time.Second, nil); r.Error != nil {
		t.Fatalf("prompt: %s", r.Raw)
	}
}

// The holder's permission request reaches a client attached through
// another replica under an ID of that replica's; its answer reaches the
// agent under the holder's own. When another client answers first, its
// $/cancel_request names the request as the client was sent it.
func TestClusterBridgePermission(t *testing.T) {
	e := newClusterEnv(t)
	owner, sid, _ := e.clusterSession(t, e.a, e.alice)
	member := dialToken(t, e.b, e.alice)
	if m := member.Call("session/attach", map[string]any{"sessionId": sid}, 10*time.Second); m.Error != nil {
		t.Fatalf("attach through b: %s", m.Raw)
	}
	ask := func(who *client) rpcMsg {
		t.Helper()
		for {
			m := who.Next(15 * time.Second)
			if m.Method == "session/request_permission" {
				return m
			}
		}
	}
	// The member answers.
	id := member.Request("session/prompt", textPrompt(sid, "permission, through b"))
	req := ask(member)
	if !strings.HasPrefix(string(req.ID), `"acpgate.bridge.a.`) {
		t.Fatalf("the member's copy has id %s; want b's own name for it", req.ID)
	}
	member.Respond(req.ID, map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": "allow"}})
	r := member.Await(id, 15*time.Second, nil)
	if r.Error != nil || !strings.Contains(string(r.Raw), "end_turn") {
		t.Fatalf("the prompt after the member's allow: %s", r.Raw)
	}
	// The owner's copy of that first request (withdrawn once the member
	// answered).
	if first := ask(owner); first.ID == nil {
		t.Fatal("the owner got no copy of the first request")
	}
	// The owner answers first: the member's copy is withdrawn by its name.
	id = owner.Request("session/prompt", textPrompt(sid, "permission, on a"))
	oreq := ask(owner)
	mreq := ask(member)
	owner.Respond(oreq.ID, map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": "allow"}})
	for {
		m := member.Next(15 * time.Second)
		if m.Method == "$/cancel_request" {
			if !strings.Contains(string(m.Raw), string(mreq.ID)) {
				t.Fatalf("the member's $/cancel_request %s does not name its copy %s", m.Raw, mreq.ID)
			}
			break
		}
	}
	if r := owner.Await(id, 15*time.Second, nil); r.Error != nil {
		t.Fatalf("the owner's prompt: %s", r.Raw)
	}
}

// An administrator ends a session held by another replica through any
// replica; the end is kept in the store, so every replica, one that never
// held the session included, refuses it as ended.
func TestClusterAdminEndKept(t *testing.T) {
	e := newClusterEnv(t)
	c, sid, _ := e.clusterSession(t, e.a, e.alice)
	req, _ := http.NewRequest(http.MethodDelete, "http://"+e.b.Addr+"/v1/admin/sessions/"+sid, nil)
	req.Header.Set("Authorization", "Bearer "+e.adm)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE through b of a's session: %d %s", resp.StatusCode, body)
	}
	for {
		m := c.Next(10 * time.Second)
		if m.Method == "_acpgate/session_ended" {
			break
		}
	}
	onB := dialToken(t, e.b, e.alice)
	load := func(when string) {
		t.Helper()
		m := onB.Call("session/load", map[string]any{"sessionId": sid, "cwd": e.root, "mcpServers": []any{}}, 10*time.Second)
		if m.Error == nil || !strings.Contains(m.Error.Message, "ended by an administrator") {
			t.Fatalf("load on b of the ended session %s: %s; want the administrator's end", when, m.Raw)
		}
	}
	load("at once")
	// The store restarts empty: a, which ended it, writes the end again
	// within a heartbeat (lease/3).
	e.redis.Kill()
	e.redis.Restart()
	time.Sleep(1500 * time.Millisecond)
	load("after the store restarted empty")
}

// What a holder sends over a bridge is kept in the client's own outbox: a
// client attached through b whose socket drops, and which resumes through
// a (carried to b), gets the turn that ran meanwhile, once.
func TestClusterBridgedClientResumes(t *testing.T) {
	e := newClusterEnv(t)
	owner, sid, _ := e.clusterSession(t, e.a, e.alice)
	member, resp, err := dialWith(t, e.b, "/acp", bearer(e.alice), []string{"acp"})
	if err != nil {
		t.Fatalf("dial b: %v (%s)", err, respText(resp))
	}
	token, _ := initMeta(member.initialize())["resumeToken"].(string)
	if !strings.HasPrefix(token, "b.") {
		t.Fatalf("resume token %q, want b's", token)
	}
	if m := member.Call("session/attach", map[string]any{"sessionId": sid, "historyPolicy": "none"}, 10*time.Second); m.Error != nil {
		t.Fatalf("attach through b: %s", m.Raw)
	}
	received := 2 // the initialize and attach answers
	member.WS.CloseNow()
	time.Sleep(200 * time.Millisecond)
	// A turn runs on a while the member is away.
	if r := owner.Await(owner.Request("session/prompt", textPrompt(sid, "while you were away")), 15*time.Second, nil); r.Error != nil {
		t.Fatalf("the owner's prompt: %s", r.Raw)
	}
	back, resp, err := dialWith(t, e.a, fmt.Sprintf("/acp?resume=%s&received=%d", token, received), bearer(e.alice), []string{"acp"})
	if err != nil {
		t.Fatalf("resume through a: %v (%s)", err, respText(resp))
	}
	if m := back.Next(5 * time.Second); m.Method != "_acpgate/resumed" {
		t.Fatalf("first after the resume: %s", m.Raw)
	}
	var text strings.Builder
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(text.String(), "while you were away"); {
		if time.Now().After(deadline) {
			t.Fatalf("the turn that ran while the member was away did not come back: %q", text.String())
		}
		m := back.Next(10 * time.Second)
		text.Write(m.Raw)
	}
}

// What a bridge carries is decided by the message's own fields, never by
// what its text mentions: a prompt to a session of the client's on b whose
// text names the bridged session (and a renamed request's ID) runs on b,
// and the holder of the bridged session hears nothing of it.
func TestClusterBridgeCarriesOnlyItsOwn(t *testing.T) {
	e := newClusterEnv(t)
	owner, bridged, _ := e.clusterSession(t, e.a, e.alice)
	c := dialToken(t, e.b, e.alice)
	if m := c.Call("session/attach", map[string]any{"sessionId": bridged, "historyPolicy": "none"}, 10*time.Second); m.Error != nil {
		t.Fatalf("attach through b: %s", m.Raw)
	}
	local := c.newSession(e.root)
	text := fmt.Sprintf(`please look at "sessionId":%q and answer "acpgate.bridge.a.1"`, bridged)
	r := c.Await(c.Request("session/prompt", textPrompt(local, text)), 15*time.Second, nil)
	if r.Error != nil || !strings.Contains(string(r.Raw), "end_turn") {
		t.Fatalf("the prompt to b's own session: %s", r.Raw)
	}
	if n := clusterMetric(t, e.b, `acpgate_cluster_forwarded_total{op="bridge"}`); n != 1 {
		t.Fatalf("b opened %v bridges; want the one the attach opened", n)
	}
	// The owner on a hears of no turn of the bridged session.
	var got int
	for {
		m, ok := recvConn(t, owner.Conn, 500*time.Millisecond, &got)
		if !ok {
			break
		}
		if strings.Contains(string(m.Raw), "please look at") {
			t.Fatalf("the holder's client got the text sent to b's own session: %s", m.Raw)
		}
	}
}
