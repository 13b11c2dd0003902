package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
)

// withAdmin adds the admin token "admintok" to a tenant's configuration.
func withAdmin(t *testing.T, more func(*config.Config)) func(*config.Config) {
	tenant := withTenant(t)
	sum := sha256.Sum256([]byte("admintok"))
	return func(c *config.Config) {
		tenant(c)
		c.Admin.TokensSHA256 = []string{hex.EncodeToString(sum[:])}
		if more != nil {
			more(c)
		}
	}
}

// adminCall sends an admin API request to base with token ("" = none)
// and decodes the JSON answer into out (if not nil).
func adminCall(t *testing.T, hc *http.Client, method, url, token string, out any) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, body)
		}
	}
	return resp.StatusCode, resp.Header
}

func TestAdminAPI(t *testing.T) {
	ts := startServer(t, withAdmin(t, nil))
	rec := &audit.Memory{}
	ts.s.audit.rec = rec
	base := "http://" + ts.addr + "/v1/admin/"
	c := ts.dial("acp", "acp.bearer.tok")
	c.initialize()
	sid := adminSessionIn(c, ts.s.config().Tenants[0].Root)

	for name, tok := range map[string]string{"none": "", "forged": "forged", "tenant": "tok"} {
		want := http.StatusUnauthorized
		if name == "tenant" {
			want = http.StatusForbidden
		}
		for _, path := range []string{"sessions", "connections"} {
			if code, h := adminCall(t, ts.http, http.MethodGet, base+path, tok, nil); code != want ||
				code == http.StatusUnauthorized && h.Get("WWW-Authenticate") == "" {
				t.Fatalf("%s credential on %s: %d", name, path, code)
			}
		}
		if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"sessions/"+sid, tok, nil); code != want {
			t.Fatalf("%s credential ending a session: %d", name, code)
		}
	}
	if n := len(rec.Events("admin.denied")); n != 9 {
		t.Fatalf("%d admin.denied events, want 9", n)
	}

	var conns struct{ Connections []adminConn }
	if code, _ := adminCall(t, ts.http, http.MethodGet, base+"connections", "admintok", &conns); code != http.StatusOK ||
		len(conns.Connections) != 1 {
		t.Fatalf("connections: %d %+v", code, conns)
	}
	cn := conns.Connections[0]
	if cn.Tenant != "acme" || cn.Transport != "websocket" || !strings.HasPrefix(cn.Remote, "127.0.0.1:") || cn.State != "attached" ||
		len(cn.Sessions) != 1 || cn.Sessions[0] != sid || !strings.HasPrefix(cn.Subject, "token:") || cn.Opened.IsZero() {
		t.Fatalf("connection: %+v", cn)
	}
	var sessions struct{ Sessions []adminSession }
	adminCall(t, ts.http, http.MethodGet, base+"sessions?tenant=acme", "admintok", &sessions)
	if len(sessions.Sessions) != 1 || sessions.Sessions[0].ID != sid || sessions.Sessions[0].State != "idle" || sessions.Sessions[0].Clients != 1 {
		t.Fatalf("sessions: %+v", sessions)
	}
	adminCall(t, ts.http, http.MethodGet, base+"sessions?tenant=other", "admintok", &sessions)
	if len(sessions.Sessions) != 0 {
		t.Fatalf("another tenant's sessions: %+v", sessions)
	}

	if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"sessions/"+sid, "admintok", nil); code != http.StatusOK {
		t.Fatalf("ending the session: %d", code)
	}
	if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"sessions/"+sid, "admintok", nil); code != http.StatusNotFound {
		t.Fatalf("ending it again: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m, err := c.read(ctx); err != nil || m.Method != "_acpgate/session_ended" {
		t.Fatalf("the client was told: %s, %v", m.Raw, err)
	}
	if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"connections/nope", "admintok", nil); code != http.StatusNotFound {
		t.Fatalf("closing an unknown connection: %d", code)
	}
	if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"connections/"+cn.ID, "admintok", nil); code != http.StatusOK {
		t.Fatalf("closing the connection: %d", code)
	}
	_, err := c.read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || ce.Reason != adminCloseReason {
		t.Fatalf("the client's socket: %v", err)
	}
	for _, name := range []string{"admin.connections.listed", "admin.sessions.listed", "admin.session.ended", "admin.connection.closed"} {
		evs := rec.Events(name)
		if len(evs) == 0 || evs[0].Subject != "token:"+hex.EncodeToString(sha256sum("admintok")[:8]) {
			t.Fatalf("%s: %+v", name, evs)
		}
	}
	if ev := rec.Events("admin.session.ended")[0]; ev.Session != sid || ev.Tenant != "acme" {
		t.Fatalf("admin.session.ended: %+v", ev)
	}
}

// adminSessionIn makes a session with cwd root.
func adminSessionIn(c *wsClient, root string) string {
	c.t.Helper()
	var r struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(c.mustCall("session/new", map[string]any{"cwd": root, "mcpServers": []any{}}), &r); err != nil {
		c.t.Fatal(err)
	}
	return r.SessionID
}

func sha256sum(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// With an operations listener the admin API is served there only; without
// admin settings it is not served at all.
func TestAdminAPIPlacement(t *testing.T) {
	ts := startServer(t, withAdmin(t, func(c *config.Config) { c.Observability.MetricsListen = "127.0.0.1:0" }))
	if code, _ := adminCall(t, ts.http, http.MethodGet, "http://"+ts.addr+"/v1/admin/sessions", "admintok", nil); code == http.StatusOK {
		t.Fatal("the main listener serves the admin API beside an operations listener")
	}
	ops := httptest.NewServer(ts.s.OpsHandler())
	defer ops.Close()
	if code, _ := adminCall(t, ops.Client(), http.MethodGet, ops.URL+"/v1/admin/sessions", "admintok", nil); code != http.StatusOK {
		t.Fatalf("the operations listener: %d", code)
	}
	if code, _ := adminCall(t, ops.Client(), http.MethodGet, ops.URL+"/v1/admin/sessions", "tok", nil); code != http.StatusForbidden {
		t.Fatalf("a tenant token on the operations listener: %d", code)
	}

	plain := startServer(t, withTenant(t))
	if code, _ := adminCall(t, plain.http, http.MethodGet, "http://"+plain.addr+"/v1/admin/sessions", "admintok", nil); code != http.StatusNotFound {
		t.Fatalf("without admin settings: %d", code)
	}
}

// A reload may change the admin tokens, not turn the API on or off.
func TestAdminTokensReload(t *testing.T) {
	ts := startServer(t, withAdmin(t, nil))
	cur := ts.s.config()
	next := *cur
	sum := sha256.Sum256([]byte("newtok"))
	next.Admin.TokensSHA256 = []string{hex.EncodeToString(sum[:])}
	if err := ts.s.Reload(&next); err != nil {
		t.Fatal(err)
	}
	base := "http://" + ts.addr + "/v1/admin/sessions"
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "admintok", nil); code != http.StatusUnauthorized {
		t.Fatalf("the old token after the reload: %d", code)
	}
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "newtok", nil); code != http.StatusOK {
		t.Fatalf("the new token after the reload: %d", code)
	}
	off := *ts.s.config()
	off.Admin = config.Admin{}
	if err := ts.s.Reload(&off); err == nil || !strings.Contains(err.Error(), "admin API") {
		t.Fatalf("turning the admin API off: %v", err)
	}
}

// An administrator closes a Streamable HTTP connection: its streams end and
// it is gone. Without tenants only the admin token is known.
func TestAdminClosesHTTPConnection(t *testing.T) {
	sum := sha256.Sum256([]byte("admintok"))
	ts := startServer(t, func(c *config.Config) { c.Admin.TokensSHA256 = []string{hex.EncodeToString(sum[:])} })
	base := "http://" + ts.addr + "/v1/admin/connections"
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "tok", nil); code != http.StatusUnauthorized {
		t.Fatalf("an unknown token without tenants: %d", code)
	}
	c := openHTTP(t, ts)
	events, stop, _ := c.sse("", "")
	defer stop()
	var conns struct{ Connections []adminConn }
	adminCall(t, ts.http, http.MethodGet, base, "admintok", &conns)
	if len(conns.Connections) != 1 || conns.Connections[0].ID != c.conn || conns.Connections[0].Transport != "http" ||
		!strings.HasPrefix(conns.Connections[0].Remote, "127.0.0.1:") {
		t.Fatalf("connections: %+v", conns)
	}
	if code, _ := adminCall(t, ts.http, http.MethodDelete, base+"/"+c.conn, "admintok", nil); code != http.StatusOK {
		t.Fatalf("closing it: %d", code)
	}
	deadline := time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-events:
		case <-deadline:
			t.Fatal("the event stream did not end")
		}
	}
	if st, _ := c.post(nil, `{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}`); st != http.StatusNotFound {
		t.Fatalf("a POST after the close: %d", st)
	}
	waitMetrics(t, ts, "the close counted as the administrator's",
		`acpgate_connections_total{agent="default",reason="admin_closed",tenant="default",transport="http"} 1`)
}
