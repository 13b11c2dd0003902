package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// auditRecord is one line of the audit trail as the test reads it.
type auditRecord struct {
	Event, Tenant, Subject, Agent, Conn, Session string
	Fields                                       map[string]any
	line                                         string
}

// readTrail reads the audit trail at path.
func readTrail(t *testing.T, path string) []auditRecord {
	t.Helper()
	b := mustRead(t, path)
	var out []auditRecord
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var all map[string]any
		if err := json.Unmarshal(sc.Bytes(), &all); err != nil {
			t.Fatalf("an audit line is not JSON: %v: %s", err, sc.Text())
		}
		str := func(k string) string { s, _ := all[k].(string); return s }
		out = append(out, auditRecord{Event: str("event"), Tenant: str("tenant"), Subject: str("subject"), Agent: str("agent"),
			Conn: str("conn"), Session: str("session"), Fields: all, line: sc.Text()})
	}
	return out
}

// verifyTrail runs acpgate audit verify on files and returns its exit
// code and output.
func verifyTrail(t *testing.T, files ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"audit", "verify"}, files...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("audit verify: %v", err)
	}
	return code, string(out)
}

// TestAuditTrail: a tenant's connection with a refused attempt before it,
// a permission, a write the gateway's stand-in makes and a prompt leaves
// every event in the audit file, under the token's derived subject, with
// no prompt text, file content or token; acpgate audit verify passes the
// file and finds a changed, a removed and an inserted line.
func TestAuditTrail(t *testing.T) {
	e := newIsoEnv(t)
	trail := filepath.Join(t.TempDir(), "audit.jsonl")
	g := startGateway(t, gwOpts{config: e.config(e.keyFile, nil) + fmt.Sprintf("audit: {file: %q}\n", trail)})
	token := e.tokens["acme"]
	sum := sha256.Sum256([]byte(token))
	subject := "token:" + hex.EncodeToString(sum[:8])

	refused(t, g, "/acp", bearer("not-a-token"), []string{"acp"}, 401, "invalid_token", "not-a-token")
	c, resp, err := dialWith(t, g, "/acp", bearer(token), []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v (%s)", err, respText(resp))
	}
	c.Initialize("e2e", false) // no file access: the gateway stands in
	sid := c.newSession(vroot)
	const secret = "s3cret-content-never-audited"
	pid := c.Request("session/prompt", textPrompt(sid, "write out.txt "+secret))
	msgs := readUntil(t, c, "the permission request", turn, isMethod("session/request_permission"))
	c.Respond(msgs[len(msgs)-1].ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
	if r := stopReason(t, c.Await(pid, turn, func(rpcMsg) {})); r != "end_turn" {
		t.Fatalf("the write turn ended %q", r)
	}
	const said = "a prompt text that stays out of the trail"
	promptOK(t, c, sid, said)
	if m := c.Call("session/close", map[string]string{"sessionId": sid}, turn); m.Error != nil {
		t.Fatalf("session/close: %s", m.Raw)
	}
	c.Close()
	g.WaitLog(t, "connection closed", "conn", c.ConnID, 10*time.Second) // closed by the client, not by the drain
	g.Stop(syscall.SIGTERM)                                             // flushes the trail

	recs := readTrail(t, trail)
	want := []string{"gateway.started", "auth.failed", "connection.opened", "session.created", "prompt.started", "permission.requested",
		"permission.resolved", "fs.written", "prompt.ended", "prompt.started", "prompt.ended", "session.closed", "connection.closed",
		"gateway.stopped"}
	var got []string
	for i, r := range recs {
		got = append(got, r.Event)
		if r.Fields["seq"] != float64(i+1) {
			t.Errorf("line %d has seq %v: %s", i+1, r.Fields["seq"], r.line)
		}
		if r.Event == "auth.failed" || strings.HasPrefix(r.Event, "gateway.") {
			continue
		}
		if r.Tenant != "acme" || r.Subject != subject || r.Agent == "" || r.Conn != c.ConnID {
			t.Errorf("%s: tenant %q subject %q agent %q conn %q; want acme, %s, an agent, %s", r.Event, r.Tenant, r.Subject, r.Agent, r.Conn, subject, c.ConnID)
		}
		if strings.HasPrefix(r.Event, "session.") || strings.HasPrefix(r.Event, "prompt.") || strings.HasPrefix(r.Event, "permission.") || r.Event == "fs.written" {
			if r.Session != sid {
				t.Errorf("%s names session %q, want the client's %q", r.Event, r.Session, sid)
			}
		}
		for _, s := range []string{secret, said, token} {
			if strings.Contains(r.line, s) {
				t.Errorf("%s carries %q: %s", r.Event, s, r.line)
			}
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events:\n got %v\nwant %v\n%s", got, want, mustRead(t, trail))
	}
	for _, r := range recs {
		switch r.Event {
		case "auth.failed":
			if r.Fields["reason"] != "invalid_token" || r.Subject != "" {
				t.Errorf("auth.failed: %s", r.line)
			}
		case "session.created":
			if r.Fields["cwd"] != vroot {
				t.Errorf("session.created: the cwd is not as the tenant sees it: %s", r.line)
			}
		case "permission.resolved":
			if r.Fields["by"] != "client" || r.Fields["optionId"] != "allow" {
				t.Errorf("permission.resolved: %s", r.line)
			}
		case "fs.written":
			if r.Fields["path"] != vroot+"/out.txt" || r.Fields["by"] != "gateway" || r.Fields["bytes"] != float64(len(secret)) {
				t.Errorf("fs.written: %s", r.line)
			}
		case "prompt.ended":
			if r.Fields["stop_reason"] != "end_turn" {
				t.Errorf("prompt.ended: %s", r.line)
			}
		case "connection.closed":
			if r.Fields["transport"] != "websocket" || r.Fields["close_code"] != float64(1000) {
				t.Errorf("connection.closed: %s", r.line)
			}
		}
	}

	if code, out := verifyTrail(t, trail); code != 0 || !strings.Contains(out, fmt.Sprint(len(recs))) {
		t.Fatalf("audit verify of the intact trail: exit %d: %s", code, out)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(mustRead(t, trail)), "\n"), "\n")
	tamper := func(name string, edit func([]string) []string, wantLine int) {
		t.Helper()
		path := filepath.Join(t.TempDir(), name+".jsonl")
		if err := os.WriteFile(path, []byte(strings.Join(edit(append([]string(nil), lines...)), "")), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out := verifyTrail(t, path)
		if code == 0 || !strings.Contains(out, fmt.Sprintf("%s: line %d:", path, wantLine)) {
			t.Errorf("audit verify of a trail with a %s line: exit %d, want non-zero naming line %d: %s", name, code, wantLine, out)
		}
	}
	tamper("changed", func(l []string) []string {
		l[4] = strings.Replace(l[4], `"acme"`, `"globex"`, 1)
		return l
	}, 6) // the line after the changed one no longer chains to it
	tamper("removed", func(l []string) []string { return append(l[:4], l[5:]...) }, 5)
	tamper("inserted", func(l []string) []string {
		return append(l[:4], append([]string{l[3]}, l[4:]...)...)
	}, 5)
}

// verifyTrailArgs runs acpgate audit verify with args and returns its exit
// code and output.
func verifyTrailArgs(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(binPath, append([]string{"audit", "verify"}, args...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatalf("audit verify: %v", err)
	}
	return 0, string(out)
}

// TestAuditAttachReloadRefusals: a second client of the owner's subject
// attaching and detaching leaves session.attached and session.detached
// (tenant, subject, conn, clientId, readOnly, history); a SIGHUP reload
// leaves config.reloaded naming the tenant that changed and no token
// hash; a flood of refused tokens on /acp does not suppress admin.denied,
// and what it held back is written as auth.failed.suppressed; every line
// is numbered and the trail verifies.
func TestAuditAttachReloadRefusals(t *testing.T) {
	e := newIsoEnv(t)
	dir := t.TempDir()
	trail := filepath.Join(dir, "audit.jsonl")
	const adminTok = "audit-admin-token"
	extra := fmt.Sprintf("audit: {file: %q}\nobservability: {metrics_listen: 127.0.0.1:0}\nadmin:\n  tokens_sha256: [%q]\n",
		trail, hexSHA256(adminTok))
	g := startGateway(t, gwOpts{config: e.config(e.keyFile, nil) + extra})
	cfgPath := g.Cmd.Args[slices.Index(g.Cmd.Args, "--config")+1]
	token := e.tokens["acme"]
	subject := "token:" + hexSHA256(token)[:16]

	owner := dialToken(t, g, token)
	sid := owner.newSession(vroot)
	watcher := dialToken(t, g, token)
	_, joined := mustAttach(t, watcher, sid, "watcher", false)
	if m := watcher.Call("session/detach", map[string]string{"sessionId": sid}, turn); m.Error != nil {
		t.Fatalf("session/detach: %s", m.Raw)
	}

	// A reload: globex gets a second token.
	second := "globex-second-" + hexSHA256(token)[:8]
	cfg := strings.Replace(e.config(e.keyFile, nil), fmt.Sprintf("[%q]", hexSHA256(e.tokens["globex"])),
		fmt.Sprintf("[%q, %q]", hexSHA256(e.tokens["globex"]), hexSHA256(second)), 1) + extra
	writeFile(t, cfgPath, []byte(cfg))
	n := g.CountLogs("configuration reloaded", "", "")
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.waitMoreLogs(t, "configuration reloaded", n, 20*time.Second)

	// An auth.failed flood, then guesses at the admin token.
	const flood = 300
	for range flood {
		if resp, _ := httpDo(t, g, http.MethodGet, "/acp", "not-a-token", "", nil); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a bad token on /acp: %d", resp.StatusCode)
		}
	}
	for range 3 {
		if got := adminDo(t, http.MethodGet, "http://"+g.MetricsAddr()+"/v1/admin/sessions", "guess", nil); got != http.StatusUnauthorized {
			t.Fatalf("a guessed admin token: %d", got)
		}
	}
	owner.Close()
	watcher.Close()
	g.Stop(syscall.SIGTERM)

	recs := readTrail(t, trail)
	count := map[string]int{}
	var attached, detached, reloaded []auditRecord
	suppressed := 0
	for _, r := range recs {
		count[r.Event]++
		switch r.Event {
		case "session.attached":
			attached = append(attached, r)
		case "session.detached":
			detached = append(detached, r)
		case "config.reloaded":
			reloaded = append(reloaded, r)
		case "auth.failed.suppressed":
			suppressed += int(r.Fields["count"].(float64))
		}
		if strings.Contains(r.line, hexSHA256(second)) || strings.Contains(r.line, hexSHA256(token)) {
			t.Errorf("a token hash in the trail: %s", r.line)
		}
	}
	for _, r := range append(attached, detached...) {
		if r.Tenant != "acme" || r.Subject != subject || r.Conn != watcher.ConnID || r.Session != sid ||
			r.Fields["clientId"] != joined.ClientID || r.Fields["readOnly"] != false {
			t.Errorf("%s: %s; want acme, %s, conn %s, clientId %s (the gateway's), not read-only", r.Event, r.line, subject, watcher.ConnID, joined.ClientID)
		}
	}
	if len(attached) != 1 || len(detached) != 1 || attached[0].Fields["history"] != "full" {
		t.Errorf("session.attached %v, session.detached %v; want one each, history full", attached, detached)
	}
	if len(reloaded) != 1 || fmt.Sprint(reloaded[0].Fields["changed"]) != "[tenants]" ||
		fmt.Sprint(reloaded[0].Fields["tenants_changed"]) != "[globex]" {
		t.Errorf("config.reloaded: %v; want one, tenants changed: globex", reloaded)
	}
	if count["admin.denied"] != 3 {
		t.Errorf("%d admin.denied after an auth.failed flood, want 3", count["admin.denied"])
	}
	if suppressed == 0 || count["auth.failed"]+suppressed != flood {
		t.Errorf("%d auth.failed written, %d suppressed; want some held back and %d in all", count["auth.failed"], suppressed, flood)
	}
	if code, out := verifyTrail(t, trail); code != 0 {
		t.Errorf("audit verify: exit %d: %s", code, out)
	}
}

// TestAuditKeyedTrail: with audit.hmac_key_file every line carries a MAC;
// the forged re-chained trail (line k edited, every later prev recomputed
// by someone without the key) passes verify without the key but fails it
// with --key, naming line k. A gateway killed without closing its trail
// leaves a gap at its next start, which verify reports (exit 3) unless
// --allow-gaps.
func TestAuditKeyedTrail(t *testing.T) {
	e := newIsoEnv(t)
	dir := t.TempDir()
	trail, keyFile := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.key")
	if err := os.WriteFile(keyFile, []byte(harness.RandomHex(t, 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := e.config(e.keyFile, nil) + fmt.Sprintf("audit: {file: %q, hmac_key_file: %q}\n", trail, keyFile)
	g := startGateway(t, gwOpts{config: config})
	c := dialToken(t, g, e.tokens["acme"])
	sid := c.newSession(vroot)
	promptOK(t, c, sid, "hello")
	c.Close()
	g.WaitLog(t, "connection closed", "conn", c.ConnID, 10*time.Second)
	g.Stop(syscall.SIGTERM)

	if code, out := verifyTrailArgs(t, "--key", keyFile, trail); code != 0 || !strings.Contains(out, "every MAC checked") {
		t.Fatalf("audit verify --key of the trail: exit %d: %s", code, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(mustRead(t, trail)), "\n"), "\n")
	k := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"event":"session.created"`) }) + 1
	if k == 0 {
		t.Fatalf("no session.created line:\n%s", strings.Join(lines, "\n"))
	}
	forged := append([]string(nil), lines...)
	forged[k-1] = strings.Replace(forged[k-1], `"tenant":"acme"`, `"tenant":"globex"`, 1)
	for i := k; i < len(forged); i++ {
		sum := sha256.Sum256([]byte(forged[i-1]))
		j := strings.Index(forged[i], `"prev":"`) + len(`"prev":"`)
		forged[i] = forged[i][:j] + hex.EncodeToString(sum[:]) + forged[i][j+64:]
	}
	path := filepath.Join(dir, "forged.jsonl")
	writeFile(t, path, []byte(strings.Join(forged, "\n")+"\n"))
	if code, out := verifyTrailArgs(t, path); code != 4 || !strings.Contains(out, "MACs not checked") {
		t.Errorf("audit verify without the key of the forged trail: exit %d, want 4: %s", code, out)
	}
	code, out := verifyTrailArgs(t, "--key", keyFile, path)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("%s: line %d: MAC does not match", path, k)) {
		t.Errorf("audit verify --key of the forged re-chained trail: exit %d, want 1 naming line %d: %s", code, k, out)
	}

	// Killed: no gateway.stopped; the next start writes a gap.
	g = startGateway(t, gwOpts{config: config})
	waitReady(t, g, 60*time.Second)
	g.Stop(syscall.SIGKILL)
	g = startGateway(t, gwOpts{config: config})
	waitReady(t, g, 60*time.Second)
	g.Stop(syscall.SIGTERM)
	code, out = verifyTrailArgs(t, "--key", keyFile, trail)
	if code != 3 || !strings.Contains(out, "gap: an unknown number of events lost (unclean_shutdown)") {
		t.Errorf("audit verify after a kill: exit %d, want 3 reporting the gap: %s", code, out)
	}
	if code, out := verifyTrailArgs(t, "--key", keyFile, "--allow-gaps", trail); code != 0 {
		t.Errorf("audit verify --allow-gaps after a kill: exit %d: %s", code, out)
	}
}
