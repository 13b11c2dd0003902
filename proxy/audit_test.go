package proxy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/acp"
)

// recorder keeps the audit events the relay records.
type recorder struct{ audit.Memory }

// of returns the events of the given kinds, in order, with their fields as
// a map.
func (r *recorder) of(kinds ...string) []auditLine {
	var out []auditLine
	for _, ev := range r.Events(kinds...) {
		l := auditLine{Event: ev, f: map[string]any{}}
		for _, f := range ev.Fields {
			l.f[f.Key] = f.Value
		}
		out = append(out, l)
	}
	return out
}

type auditLine struct {
	audit.Event
	f map[string]any
}

// waitEvents waits until r holds n events of kinds.
func (r *recorder) waitEvents(t *testing.T, n int, kinds ...string) []auditLine {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if evs := r.of(kinds...); len(evs) >= n || time.Now().After(deadline) {
			if len(evs) < n {
				t.Fatalf("%d %v events, want %d: %+v", len(evs), kinds, n, evs)
			}
			return evs
		}
	}
}

func (tc *testConn) sessionIn(id, cwd string) string {
	tc.t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/new","params":{"cwd":"` + cwd + `","mcpServers":[]}}`)
	m := tc.await(id, nil)
	var r struct {
		SessionID string `json:"sessionId"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &r) != nil {
		tc.t.Fatalf("session/new: %s", m.raw)
	}
	return r.SessionID
}

// The relay records a session's life, its permission requests and how
// they were settled, and the files read and written for it, by the
// client or by the gateway's stand-in: paths and sizes, never contents.
func TestAuditEvents(t *testing.T) {
	rec := &recorder{}
	r := testPool(t, "demo", nil, func(c *Config) { c.Audit = rec })
	dir := t.TempDir()
	standIn := newTestConn(t, r, "stand-in") // offers no file access
	standIn.init(`{}`)
	sid := standIn.sessionIn("1", dir)
	created := rec.waitEvents(t, 1, "session.created")[0]
	if created.Session != sid || created.Conn != "stand-in" || created.f["cwd"] != dir {
		t.Fatalf("session.created: %+v", created)
	}

	const secret = "the-file-content-never-audited"
	path := filepath.Join(dir, "out.txt")
	standIn.prompt("2", sid, "write "+path+" "+secret)
	req := standIn.untilMethod(acp.RequestPermission, nil)
	standIn.send(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
	if m := standIn.await("2", nil); m.Error != nil {
		t.Fatalf("the write turn: %s", m.raw)
	}
	asked := rec.waitEvents(t, 1, "permission.requested")[0]
	if asked.Session != sid || asked.f["toolCallId"] == "" || asked.f["kind"] != "edit" {
		t.Fatalf("permission.requested: %+v", asked)
	}
	if opts := fmt.Sprint(asked.f["options"]); !strings.Contains(opts, "allow") || !strings.Contains(opts, "reject") {
		t.Fatalf("permission.requested options: %s", opts)
	}
	settled := rec.waitEvents(t, 1, "permission.resolved")[0]
	if settled.f["by"] != "client" || settled.f["outcome"] != "selected" || settled.f["optionId"] != "allow" ||
		settled.Conn != "stand-in" || settled.f["toolCallId"] != asked.f["toolCallId"] {
		t.Fatalf("permission.resolved: %+v", settled)
	}
	written := rec.waitEvents(t, 1, "fs.written")[0]
	content, _ := os.ReadFile(path)
	if written.f["path"] != path || written.f["by"] != "gateway" || written.f["bytes"] != len(content) || len(content) == 0 {
		t.Fatalf("fs.written: %+v (the file has %d bytes)", written, len(content))
	}

	// A client with file access reads for the agent itself.
	reader := newTestConn(t, r, "reader")
	reader.init(fsCaps)
	sid2 := reader.sessionIn("1", dir)
	reader.prompt("2", sid2, "read "+path)
	fsReq := reader.untilMethod(acp.FsRead, nil)
	reader.send(`{"jsonrpc":"2.0","id":` + string(fsReq.ID) + `,"result":{"content":"twelve bytes"}}`)
	if m := reader.await("2", nil); m.Error != nil {
		t.Fatalf("the read turn: %s", m.raw)
	}
	read := rec.waitEvents(t, 1, "fs.read")[0]
	if read.f["path"] != path || read.f["by"] != "client" || read.f["bytes"] != 12 || read.Conn != "reader" || read.Session != sid2 {
		t.Fatalf("fs.read: %+v", read)
	}

	reader.send(`{"jsonrpc":"2.0","id":3,"method":"session/close","params":{"sessionId":"` + sid2 + `"}}`)
	if m := reader.await("3", nil); m.Error != nil {
		t.Fatalf("session/close: %s", m.raw)
	}
	closed := rec.waitEvents(t, 1, "session.closed")[0]
	if closed.Session != sid2 || closed.Conn != "reader" || closed.f["reason"] != nil {
		t.Fatalf("session.closed: %+v", closed)
	}
	for _, ev := range rec.of("session.created", "session.closed", "permission.requested", "permission.resolved", "fs.read", "fs.written") {
		if b, _ := json.Marshal(ev.Fields); strings.Contains(string(b), secret) || strings.Contains(string(b), "twelve bytes") {
			t.Fatalf("%s carries a file's content: %s", ev.Event.Event, b)
		}
	}
}

// A permission request whose only client leaves is settled by the gateway
// (cancelled), and the trail says so, without a subject or a connection.
func TestAuditPermissionSettledByDisconnect(t *testing.T) {
	rec := &recorder{}
	r := testPool(t, "demo", nil, func(c *Config) { c.Audit = rec })
	c := newTestConn(t, r, "leaver")
	c.init(`{}`)
	sid := c.newSession("1")
	c.prompt("2", sid, "permission")
	c.untilMethod(acp.RequestPermission, nil)
	c.c.Close()
	ev := rec.waitEvents(t, 1, "permission.resolved")[0]
	if ev.f["by"] != "disconnect" || ev.f["outcome"] != "cancelled" || ev.Conn != "" || ev.Session != sid {
		t.Fatalf("permission.resolved: %+v", ev)
	}
}

// A flood of refused messages writes at most 20 policy.denied events a
// second for one connection; the next one written says how many were left
// out.
func TestAuditDeniedIsBounded(t *testing.T) {
	rec := &recorder{}
	r := testPool(t, "demo", nil, func(c *Config) { c.Audit = rec })
	c := newTestConn(t, r, "flood")
	c.init(`{}`)
	refused := func(id int) {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_nope/x","params":{}}`, id))
		if m := c.await(fmt.Sprint(id), nil); m.Error == nil {
			t.Fatalf("_nope/x was not refused: %s", m.raw)
		}
	}
	start := time.Now()
	for i := range 60 {
		refused(10 + i)
	}
	refill := int(20*time.Since(start).Seconds()) + 1
	if n := len(rec.of("policy.denied")); n < 20 || n > 20+refill {
		t.Fatalf("%d policy.denied events for 60 refusals in %s; want the burst of 20 and at most %d refilled", n, time.Since(start), refill)
	}
	time.Sleep(200 * time.Millisecond)
	refused(100)
	evs := rec.of("policy.denied")
	if last := evs[len(evs)-1]; last.f["suppressed"] == nil || last.f["suppressed"].(int64) != int64(61-len(evs)) {
		t.Fatalf("the event after the flood: %+v; want suppressed %d (61 refusals, %d events)", last, 61-len(evs), len(evs))
	}
}
