package e2e

// Issue #36, finding 10 and the points open since 531cbc0: audit keys are
// ordered, operations stay off the public port, failed admin calls are
// audited, queued prompts are bounded per tenant.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// remacLine makes a keyed trail line's MAC again under key, as someone
// holding key can: kid and mac replaced, a key change's mac_old dropped.
func remacLine(line string, key []byte) string {
	body := line[:strings.Index(line, `,"kid":"`)] + `,"kid":"` + audit.KeyID(key) + `"`
	m := hmac.New(sha256.New, key)
	m.Write([]byte(body))
	return body + `,"mac":"` + hex.EncodeToString(m.Sum(nil)) + `"}`
}

// rechainFrom recomputes the prev of lines[from] from the line before it.
func rechainFrom(lines []string, from int) {
	sum := sha256.Sum256([]byte(lines[from-1]))
	j := strings.Index(lines[from], `"prev":"`) + len(`"prev":"`)
	lines[from] = lines[from][:j] + hex.EncodeToString(sum[:]) + lines[from][j+64:]
}

// TestAuditKeyRotationRetiresOldKey (finding 10): the audit key is
// rotated by a SIGHUP. The trail says so in an audit.key_changed line
// MACed under both keys, and verify passes it with both keys. Someone
// holding the retired key (a leaked key is why one rotates) then rewrites
// a line written after the rotation, MACs it and every later line under
// the old key and re-chains them: verify with both keys fails at that
// line, naming the line that retired the key. Without --key a keyed trail
// is not verified: exit 4.
func TestAuditKeyRotationRetiresOldKey(t *testing.T) {
	e := newIsoEnv(t)
	dir := t.TempDir()
	trail, keyFile := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.key")
	oldFile, newFile := filepath.Join(dir, "old.key"), filepath.Join(dir, "new.key")
	oldHex, newHex := harness.RandomHex(t, 32), harness.RandomHex(t, 32)
	for _, f := range []struct{ path, hex string }{{keyFile, oldHex}, {oldFile, oldHex}, {newFile, newHex}} {
		if err := os.WriteFile(f.path, []byte(f.hex+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	oldKey, _ := hex.DecodeString(oldHex)
	newKid := audit.KeyID(mustHex(t, newHex))

	config := e.config(e.keyFile, nil) + fmt.Sprintf("audit: {file: %q, hmac_key_file: %q}\n", trail, keyFile)
	g := startGateway(t, gwOpts{config: config})
	c := dialToken(t, g, e.tokens["acme"])
	promptOK(t, c, c.newSession(vroot), "before the rotation")

	if err := os.WriteFile(keyFile, []byte(newHex+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.WaitLog(t, "audit key read again", "kid", newKid, 20*time.Second)
	promptOK(t, c, c.newSession(vroot), "after the rotation")
	c.Close()
	g.WaitLog(t, "connection closed", "conn", c.ConnID, 10*time.Second)
	g.Stop(syscall.SIGTERM)

	if code, out := verifyTrailArgs(t, "--key", oldFile, "--key", newFile, trail); code != 0 {
		t.Fatalf("audit verify with both keys: exit %d: %s", code, out)
	}
	if code, out := verifyTrailArgs(t, trail); code != 4 || !strings.Contains(out, "lines carry a MAC that was not checked") {
		t.Errorf("audit verify of the keyed trail without --key: exit %d, want 4 saying how many lines went unchecked: %s", code, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(mustRead(t, trail)), "\n"), "\n")
	first := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"kid":"`+newKid+`"`) })
	if first < 0 {
		t.Fatalf("no line under the new key:\n%s", strings.Join(lines, "\n"))
	}
	// The line the forger wants changed: the second session's creation,
	// written after the rotation.
	k := first + 1 + slices.IndexFunc(lines[first+1:], func(l string) bool { return strings.Contains(l, `"event":"session.created"`) })
	if k == first {
		t.Fatalf("no session.created line after the rotation:\n%s", strings.Join(lines, "\n"))
	}
	forged := append([]string(nil), lines...)
	forged[k] = strings.Replace(forged[k], `"tenant":"acme"`, `"tenant":"globex"`, 1)
	for i := k; i < len(forged); i++ {
		rechainFrom(forged, i)
		forged[i] = remacLine(forged[i], oldKey)
	}
	path := filepath.Join(dir, "forged.jsonl")
	writeFile(t, path, []byte(strings.Join(forged, "\n")+"\n"))
	code, out := verifyTrailArgs(t, "--key", oldFile, "--key", newFile, path)
	want := fmt.Sprintf("%s: line %d: MAC under key %s, which %s line %d replaced", path, k+1, audit.KeyID(oldKey), path, first+1)
	if code != 1 || !strings.Contains(out, want) {
		t.Errorf("audit verify of the trail forged under the retired key: exit %d, want 1 with %q: %s", code, want, out)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// opsGateway runs a gateway listening on listen with tenant acme and an
// admin token (authentication on: a non-loopback listener needs it), and
// extra YAML; it returns the gateway and its main listener's address as
// reached over loopback.
func opsGateway(t *testing.T, listen, extra string) (*gateway, string) {
	t.Helper()
	cfg := fmt.Sprintf("%stenants:\n  - name: acme\n    tokens_sha256: [%q]\n    root: %q\nadmin:\n  tokens_sha256: [%q]\n%s",
		resumeConfig, hexSHA256(acmeTok), t.TempDir(), hexSHA256(adminTok), extra)
	g := startGateway(t, gwOpts{config: cfg, args: []string{"--listen", listen}})
	_, port, err := net.SplitHostPort(g.Addr)
	if err != nil {
		t.Fatalf("listening address %q: %v", g.Addr, err)
	}
	return g, net.JoinHostPort("127.0.0.1", port)
}

// opsGet calls addr's path with the admin token and returns the status
// and body.
func opsGet(t *testing.T, method, addr, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminTok)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestOpsOffPublicListener (open since 531cbc0): a main listener bound to
// every interface (0.0.0.0: not a loopback address; the test reaches it
// over 127.0.0.1) without observability.metrics_listen does not serve
// /metrics nor the admin API, even to the admin's token: each path, with
// any method, gets what an unknown path gets (404), while the ACP routes
// and probes answer. With observability.ops_on_main_listener: true it
// serves them, and warns at startup; on a loopback listener they are
// served as before.
func TestOpsOffPublicListener(t *testing.T) {
	opsCalls := []struct{ method, path string }{
		{http.MethodGet, "/metrics"}, {http.MethodGet, "/v1/admin/sessions"}, {http.MethodGet, "/v1/admin/connections"},
		{http.MethodGet, "/v1/admin/budgets"}, {http.MethodDelete, "/v1/admin/connections/x"},
		{http.MethodPost, "/v1/admin/sessions"}, {http.MethodGet, "/v1/admin/../admin/sessions"},
	}
	t.Run("public", func(t *testing.T) {
		g, addr := opsGateway(t, "0.0.0.0:0", "")
		unknownCode, unknownBody := opsGet(t, http.MethodGet, addr, "/no-such-path")
		if unknownCode != http.StatusNotFound {
			t.Fatalf("an unknown path: %d, want 404", unknownCode)
		}
		for _, c := range opsCalls {
			code, body := opsGet(t, c.method, addr, c.path)
			if code != unknownCode || body != unknownBody {
				t.Errorf("%s %s on the public main listener: %d %q, want %d %q as an unknown path", c.method, c.path, code, body, unknownCode, unknownBody)
			}
		}
		if code, _ := opsGet(t, http.MethodGet, addr, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz: %d", code)
		}
		if code, _ := opsGet(t, http.MethodGet, addr, "/v1/agents"); code == http.StatusNotFound {
			t.Errorf("/v1/agents: %d", code)
		}
		c := dialToken(t, g, acmeTok) // the ACP route answers
		c.Close()
		if g.CountLogs("/metrics and the admin API are not served on the main listener, which is not a loopback address; "+
			"observability.metrics_listen serves them", "", "") != 1 {
			t.Error("no log line says the operations surface is not served")
		}
	})
	t.Run("opted in", func(t *testing.T) {
		g, addr := opsGateway(t, "0.0.0.0:0", "observability:\n  ops_on_main_listener: true\n")
		if code, body := opsGet(t, http.MethodGet, addr, "/metrics"); code != http.StatusOK || !strings.Contains(body, "acpgate_build_info") {
			t.Errorf("/metrics with ops_on_main_listener: %d", code)
		}
		if code, _ := opsGet(t, http.MethodGet, addr, "/v1/admin/sessions"); code != http.StatusOK {
			t.Errorf("/v1/admin/sessions with ops_on_main_listener: %d", code)
		}
		found := false
		for _, r := range g.Logs() {
			found = found || r["level"] == "WARN" && strings.HasPrefix(fmt.Sprint(r["msg"]), "/metrics and the admin API are served on the main listener, which is not a loopback address")
		}
		if !found {
			t.Error("no startup WARN for ops_on_main_listener on a public listener")
		}
	})
	t.Run("loopback", func(t *testing.T) {
		_, addr := opsGateway(t, "127.0.0.1:0", "")
		if code, _ := opsGet(t, http.MethodGet, addr, "/metrics"); code != http.StatusOK {
			t.Errorf("/metrics on a loopback main listener: %d", code)
		}
		if code, _ := opsGet(t, http.MethodGet, addr, "/v1/admin/sessions"); code != http.StatusOK {
			t.Errorf("/v1/admin/sessions on a loopback main listener: %d", code)
		}
	})
}

// TestAuditAdminFailures (open since 531cbc0): an administrator's calls
// that fail are in the audit trail as admin.failed, with the method, the
// path (bounded, never its query), the status and the admin's subject: an
// unknown session or connection (404), a call the API does not have
// (404), a method a path lacks (404). A refused credential stays
// admin.denied. A flood of failing calls from one address is throttled:
// what is held back is counted in admin.failed.suppressed, nothing lost
// silently.
func TestAuditAdminFailures(t *testing.T) {
	e := newIsoEnv(t)
	trail := filepath.Join(t.TempDir(), "audit.jsonl")
	extra := fmt.Sprintf("audit: {file: %q}\nobservability: {metrics_listen: 127.0.0.1:0}\nadmin:\n  tokens_sha256: [%q]\n",
		trail, hexSHA256(adminTok))
	g := startGateway(t, gwOpts{config: e.config(e.keyFile, nil) + extra})
	ops := "http://" + g.MetricsAddr()
	long := "/v1/admin/" + strings.Repeat("x", 1000)
	calls := []struct {
		method, path string
		want         int
	}{
		{http.MethodDelete, "/v1/admin/sessions/no-such-session", http.StatusNotFound},
		{http.MethodDelete, "/v1/admin/connections/no-such-conn", http.StatusNotFound},
		{http.MethodGet, "/v1/admin/no-such-call?token=secret-in-query", http.StatusNotFound},
		{http.MethodPost, "/v1/admin/sessions", http.StatusNotFound},
		{http.MethodGet, long, http.StatusNotFound},
	}
	for _, c := range calls {
		if got := adminDo(t, c.method, ops+c.path, adminTok, nil); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, got, c.want)
		}
	}
	if got := adminDo(t, http.MethodGet, ops+"/v1/admin/no-such-call", "", nil); got != http.StatusUnauthorized {
		t.Errorf("an anonymous unknown call: %d, want 401", got)
	}
	const flood = 60
	for range flood {
		adminDo(t, http.MethodDelete, ops+"/v1/admin/sessions/flood", adminTok, nil)
	}
	g.Stop(syscall.SIGTERM)

	recs := readTrail(t, trail)
	var failed []auditRecord
	var suppressed int
	denied := 0
	for _, r := range recs {
		switch r.Event {
		case "admin.failed":
			failed = append(failed, r)
		case "admin.failed.suppressed":
			n, _ := r.Fields["count"].(float64)
			suppressed += int(n)
		case "admin.denied":
			denied++
		}
		if strings.Contains(r.line, "secret-in-query") {
			t.Errorf("a query string reached the trail: %s", r.line)
		}
	}
	if len(failed) < len(calls) {
		t.Fatalf("%d admin.failed lines, want at least %d:\n%s", len(failed), len(calls), mustRead(t, trail))
	}
	for i, c := range calls {
		r := failed[i]
		path, _, _ := strings.Cut(c.path, "?")
		if len(path) > 256 {
			path = path[:256] + "…"
		}
		if r.Fields["method"] != c.method || r.Fields["path"] != path || r.Fields["status"] != float64(c.want) ||
			r.Subject == "" || r.Subject != failed[0].Subject || r.Fields["remote"] == nil {
			t.Errorf("call %d (%s %s): %s", i, c.method, c.path, r.line)
		}
	}
	if denied != 1 {
		t.Errorf("%d admin.denied lines, want 1 (the anonymous call)", denied)
	}
	// The flood: each failing call is written or counted as suppressed.
	if got := len(failed) - len(calls); got+suppressed != flood || suppressed == 0 {
		t.Errorf("flood of %d failing calls: %d admin.failed written, %d suppressed; want all counted, some suppressed", flood, got, suppressed)
	}
}

// promptsToAgent counts the session/prompt requests relayed to agents.
func promptsToAgent(t *testing.T, g *gateway) int {
	t.Helper()
	n := 0.0
	for k, v := range g.metrics(t) {
		if strings.HasPrefix(k, "acpgate_messages_total{") && strings.Contains(k, `direction="client_to_agent"`) &&
			strings.Contains(k, `method="session/prompt"`) {
			n += v
		}
	}
	return int(n)
}

// waitQueued waits until acpgate_prompts_queued is n.
func waitQueued(t *testing.T, g *gateway, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := g.metrics(t)["acpgate_prompts_queued"]
		if int(v) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("acpgate_prompts_queued is %v after 15 s, want %d", v, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// busySession opens a session with token's connection, starts a turn of
// up to 60 s in it (the demo agent's "slow": a tick every 100 ms), and
// returns the session once the prompt reached the
// agent (the before-th prompt to reach one).
func busySession(t *testing.T, g *gateway, token string, before int) (*client, string) {
	t.Helper()
	owner := dialToken(t, g, token)
	sid := owner.newSession(vroot)
	owner.Request("session/prompt", textPrompt(sid, "slow"))
	deadline := time.Now().Add(15 * time.Second)
	for promptsToAgent(t, g) < before+1 {
		if time.Now().After(deadline) {
			t.Fatal("the owner's prompt did not reach the agent within 15 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return owner, sid
}

// TestQueuedPromptsTenantBound (open since 531cbc0): prompts waiting for
// another client's turn are bounded per tenant too, over all its
// connections. Three connections of acme, attached to a session whose
// owner's turn runs, each send two prompts of 1 MiB: each connection
// holds 2 MiB (its own bound is 64 MiB), the session 6 prompts and 6 MiB
// (its bounds are 8 and 32 MiB), but acme's bound, set here to 5.5 MiB
// (limits.tenant_queued_prompt_bytes; default 256 MiB), takes five: the
// sixth gets -32006 naming it. Globex's prompts still wait meanwhile: one
// tenant at its bound does not hold up another.
func TestQueuedPromptsTenantBound(t *testing.T) {
	const tenantBound = 5<<20 + 512<<10
	e := newIsoEnv(t)
	// The bound set through the environment, as an operator may (an
	// acpgate without the setting warns of the name and runs on).
	config := e.config(e.keyFile, nil) + "limits: {messages_per_second: 1000, message_burst: 1000}\n"
	g := startGateway(t, gwOpts{config: config, env: []string{fmt.Sprintf("ACPGATE_LIMITS_TENANT_QUEUED_PROMPT_BYTES=%d", tenantBound)}})
	_, sid := busySession(t, g, e.tokens["acme"], 0)
	_, gsid := busySession(t, g, e.tokens["globex"], 1)

	big := strings.Repeat("x", 1<<20)
	var conns []*client
	for i := range 3 {
		c := dialToken(t, g, e.tokens["acme"])
		if _, res := tryAttach(t, c, attachParams(sid, fmt.Sprintf("acme-%d", i), false)); res.Error != nil ||
			!strings.Contains(string(res.Result), `"turn":"running"`) {
			t.Fatalf("acme connection %d: session/attach: %s, want a running turn", i, res.Raw)
		}
		conns = append(conns, c)
	}
	queued := 0
	var last int
	for i, c := range conns {
		for k := range 2 {
			id := c.Request("session/prompt", textPrompt(sid, big))
			if i == 2 && k == 1 {
				last = id
				break
			}
			queued++
			waitQueued(t, g, queued)
		}
	}
	m := conns[2].Await(last, 15*time.Second, nil)
	if m.Error == nil || m.Error.Code != -32006 || !strings.Contains(m.Error.Message, `tenant "acme"`) ||
		!strings.Contains(m.Error.Message, fmt.Sprintf("%d bytes", tenantBound)) {
		t.Fatalf("acme's sixth prompt of 1 MiB: %s, want -32006 naming the tenant's bound of %d bytes", m.Raw, tenantBound)
	}

	// Globex, another tenant: its prompts wait as before.
	gc := dialToken(t, g, e.tokens["globex"])
	if _, res := tryAttach(t, gc, attachParams(gsid, "globex-1", false)); res.Error != nil {
		t.Fatalf("globex: session/attach: %s", res.Raw)
	}
	for range 2 {
		gc.Request("session/prompt", textPrompt(gsid, big))
		queued++
		waitQueued(t, g, queued)
	}
	if n := promptsToAgent(t, g); n != 2 {
		t.Errorf("%d prompts reached the agent, want only the two owners'", n)
	}
}
