package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
)

// The gateway opens audit.file, hands the relay its recorder, counts what
// it writes, reopens it on request and flushes it on shutdown; a reload
// may not change it.
func TestAuditTrail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	ts := startServer(t, func(c *config.Config) { c.Audit = config.Audit{File: path, IncludePrompts: true} })
	if !ts.s.audit.on() {
		t.Fatal("no audit recorder")
	}
	ts.s.audit.record(audit.Event{Event: "test.one", Tenant: "acme"})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := ts.s.ReopenAudit(); err != nil {
		t.Fatal(err)
	}
	ts.s.audit.record(audit.Event{Event: "test.two"})
	next := *ts.s.config()
	next.Audit.File = path + ".other"
	if err := ts.s.Reload(&next); err == nil || !strings.Contains(err.Error(), "audit settings need a restart") {
		t.Errorf("an audit.file change was not refused: %v", err)
	}
	ts.shutdown()
	rec := httptest.NewRecorder()
	ts.s.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`acpgate_audit_events_total{event="test.one"} 1`, `acpgate_audit_events_total{event="test.two"} 1`,
		`acpgate_audit_events_total{event="gateway.started"} 1`, "acpgate_audit_dropped_total 0", "acpgate_audit_write_errors_total 0"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(rec.Body.String(), "acpgate_audit"))
		}
	}
	if rep, err := audit.Verify([]string{path + ".1", path}, nil); err != nil || rep.Lines != 4 || rep.Head != "" || len(rep.Gaps) != 0 {
		t.Fatalf("Verify: %+v, %v; want 4 lines intact (started, two events, stopped)", rep, err)
	}
	first := readTrailLines(t, path+".1")[0]
	if !strings.Contains(first, `"event":"gateway.started"`) || !strings.Contains(first, `"version":"test"`) {
		t.Errorf("the first line is not gateway.started with the version: %s", first)
	}
}

// readTrailLines reads a trail file's lines.
func readTrailLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// trailEvents decodes a trail file's lines of the given kind.
func trailEvents(t *testing.T, path, kind string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range readTrailLines(t, path) {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if v["event"] == kind {
			out = append(out, v)
		}
	}
	return out
}

// writeKey writes a hex key of 32 bytes b to path, mode 0600.
func writeKey(t *testing.T, path string, b byte) []byte {
	t.Helper()
	key := bytes.Repeat([]byte{b}, 32)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return key
}

// audit.hmac_key_file keys every line; SIGHUP's ReopenAudit reads the key
// again, and the lines after it name the new key; a reload writes
// config.reloaded naming what changed, never a token hash; verify needs
// both keys.
func TestAuditKeyAndReload(t *testing.T) {
	dir := t.TempDir()
	path, keyFile := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.key")
	key1 := writeKey(t, keyFile, 1)
	ts := startServer(t, func(c *config.Config) {
		withTenant(t)(c)
		c.Audit = config.Audit{File: path, HMACKeyFile: keyFile}
	})
	ts.s.audit.record(audit.Event{Event: "test.one"})
	key2 := writeKey(t, keyFile, 2)
	if err := ts.s.ReopenAudit(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ts.s.ReopenAudit(); err != nil { // the key is refused, the one in use kept
		t.Fatal(err)
	}
	if !strings.Contains(ts.logs.String(), "audit key not reloaded") {
		t.Error("a refused key was not logged")
	}
	next := *ts.s.config()
	next.Tenants = slices.Clone(next.Tenants)
	sum := sha256.Sum256([]byte("tok2"))
	next.Tenants[0].TokensSHA256 = append(slices.Clone(next.Tenants[0].TokensSHA256), hex.EncodeToString(sum[:]))
	if err := os.Chmod(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.s.Reload(&next); err != nil {
		t.Fatal(err)
	}
	ts.shutdown()

	lines := readTrailLines(t, path)
	if !strings.Contains(lines[0], `"kid":"`+audit.KeyID(key1)+`"`) || !strings.Contains(lines[len(lines)-1], `"kid":"`+audit.KeyID(key2)+`"`) {
		t.Errorf("first line %s\nlast line %s\nwant the first under key 1, the last under key 2", lines[0], lines[len(lines)-1])
	}
	if strings.Contains(strings.Join(lines, ""), hex.EncodeToString(key1)) || strings.Contains(strings.Join(lines, ""), hex.EncodeToString(sum[:])) {
		t.Error("a key or a token hash is in the trail")
	}
	reloaded := trailEvents(t, path, "config.reloaded")
	if len(reloaded) != 1 || fmt.Sprint(reloaded[0]["changed"]) != "[tenants]" || fmt.Sprint(reloaded[0]["tenants_changed"]) != "[acme]" {
		t.Errorf("config.reloaded: %v; want tenants changed, acme", reloaded)
	}
	if rep, err := audit.Verify([]string{path}, [][]byte{key1, key2}); err != nil || rep.MACs != len(lines) {
		t.Errorf("Verify with both keys: %+v, %v", rep, err)
	}
	if _, err := audit.Verify([]string{path}, [][]byte{key1}); err == nil {
		t.Error("Verify with the old key only passed lines of the new")
	}
}

// A flood of refused credentials on /acp from one address does not
// suppress admin.denied (each kind has its own throttle); what the flood
// held back is written as auth.failed.suppressed by the time the trail
// closes.
func TestAdminDeniedApartFromAuthFailed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	ts := startServer(t, withAdmin(t, func(c *config.Config) { c.Audit.File = path }))
	const flood = 300
	for range flood {
		req, err := http.NewRequest(http.MethodGet, "http://"+ts.addr+"/acp", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer not-a-token")
		resp, err := ts.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a bad token on /acp: %d", resp.StatusCode)
		}
	}
	for range 3 {
		if code, _ := adminCall(t, ts.http, http.MethodGet, "http://"+ts.addr+"/v1/admin/sessions", "guess", nil); code != http.StatusUnauthorized {
			t.Fatalf("a guessed admin token: %d", code)
		}
	}
	ts.shutdown()
	if n := len(trailEvents(t, path, "admin.denied")); n != 3 {
		t.Errorf("%d admin.denied lines after an auth.failed flood, want 3", n)
	}
	failed, suppressed := trailEvents(t, path, "auth.failed"), trailEvents(t, path, "auth.failed.suppressed")
	held := 0.0
	for _, s := range suppressed {
		held += s["count"].(float64)
		if r, _ := s["remote"].(string); !strings.HasPrefix(r, "127.0.0.1:") {
			t.Errorf("auth.failed.suppressed without the remote: %v", s)
		}
	}
	if len(failed) == flood || len(failed)+int(held) != flood {
		t.Errorf("%d auth.failed written and %v suppressed; want some held back, and %d in all", len(failed), held, flood)
	}
}

// A full disk (/dev/full): the gateway starts, serves prompts and counts
// the audit trail's failed writes.
func TestAuditFullDisk(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	ts := startServer(t, func(c *config.Config) { c.Audit.File = "/dev/full" })
	c := ts.dial()
	c.initialize()
	sid := c.newSession()
	for range 3 {
		ts.s.audit.record(audit.Event{Event: "test.full"})
		if text := c.prompt(sid, "hello"); text == "" {
			t.Fatal("prompt: no reply")
		}
	}
	waitFor(t, 5*time.Second, "a counted write error", func() bool {
		_, body := ts.get("/metrics")
		return !strings.Contains(body, "acpgate_audit_write_errors_total 0") && strings.Contains(body, "acpgate_audit_write_errors_total")
	})
	if !strings.Contains(ts.logs.String(), "audit trail write failed") {
		t.Errorf("the write error was not logged")
	}
}
