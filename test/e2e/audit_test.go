package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
	want := []string{"auth.failed", "connection.opened", "session.created", "prompt.started", "permission.requested",
		"permission.resolved", "fs.written", "prompt.ended", "prompt.started", "prompt.ended", "session.closed", "connection.closed"}
	var got []string
	for _, r := range recs {
		got = append(got, r.Event)
		if r.Event == "auth.failed" {
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
