package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
		"acpgate_audit_dropped_total 0", "acpgate_audit_write_errors_total 0"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(rec.Body.String(), "acpgate_audit"))
		}
	}
	if n, err := audit.Verify([]string{path + ".1", path}, io.Discard); err != nil || n != 2 {
		t.Fatalf("Verify: %d lines, %v; want 2 intact", n, err)
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
