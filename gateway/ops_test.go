package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/gateway/config"
)

// withTenant configures one tenant with token "tok".
func withTenant(t *testing.T) func(*config.Config) {
	root := t.TempDir()
	sum := sha256.Sum256([]byte("tok"))
	return func(c *config.Config) {
		c.Tenants = []config.Tenant{{Name: "acme", TokensSHA256: []string{hex.EncodeToString(sum[:])}, Root: root}}
		// In-process gateways start agents without acpgate's supervisor,
		// which the sandbox needs; test/e2e covers the sandbox.
		c.Sandbox.Mode = "off"
	}
}

func TestReloadRefusesRestartOnlySettings(t *testing.T) {
	ts := startServer(t, withTenant(t))
	defer ts.shutdown()
	cur := ts.s.config()

	next := *cur
	next.Auth.AllowedOrigins = []string{"https://other.example"}
	if err := ts.s.Reload(&next); err == nil || !strings.Contains(err.Error(), "auth settings") {
		t.Fatalf("an auth change was not refused: %v", err)
	}
	next = *cur
	next.Pool.MaxProcesses++
	if err := ts.s.Reload(&next); err == nil {
		t.Fatal("a pool change was not refused")
	}
	next = *cur
	next.Sessions.MaxClients++
	if err := ts.s.Reload(&next); err == nil || !strings.Contains(err.Error(), "sessions settings need a restart") {
		t.Fatalf("a sessions.max_clients change was not refused: %v", err)
	}
	next = *cur
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].MaxSessions = 7
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("a tenant change was refused: %v", err)
	}
	// Sharing reloads, the top-level section and a tenant's.
	cur = ts.s.config()
	next = *cur
	attach, readOnly := config.SharingTenant, true
	next.Sharing = config.SharingYAML{Attach: &attach}
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].Sharing = config.SharingYAML{ReadOnlyForOthers: &readOnly}
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("a sharing change was refused: %v", err)
	}
	_, body := ts.get("/metrics")
	if !strings.Contains(body, `acpgate_config_reloads_total{result="failure"} 3`) ||
		!strings.Contains(body, `acpgate_config_reloads_total{result="success"} 2`) {
		t.Fatalf("reload counters:\n%s", grepLines(body, "acpgate_config_reloads_total"))
	}
}

func TestTicketRefusalsAreCounted(t *testing.T) {
	ts := startServer(t, withTenant(t))
	defer ts.shutdown()
	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+ts.addr+"/v1/tickets", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := ts.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("ticket request with %q: %d", auth, resp.StatusCode)
		}
	}
	_, body := ts.get("/metrics")
	if !strings.Contains(body, `acpgate_auth_failures_total{reason="missing_token"} 1`) ||
		!strings.Contains(body, `acpgate_auth_failures_total{reason="invalid_token"} 1`) {
		t.Fatalf("auth failure counters:\n%s", grepLines(body, "acpgate_auth_failures_total"))
	}
}

func TestShutdownDelayKeepsServingWhileNotReady(t *testing.T) {
	ts := startServer(t, func(c *config.Config) { c.ShutdownDelay = config.Duration(time.Second) })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		done <- ts.s.Shutdown(ctx)
	}()
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		code, body := ts.get("/readyz")
		if code == http.StatusServiceUnavailable && body == "draining\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz during shutdown_delay: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Still accepting: a client that arrives now is served.
	c := ts.dial("acp")
	c.initialize()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ts.shutdown()
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCloseLabels: each way a connection ends is counted under its own
// label, whatever close code it shares with another.
func TestCloseLabels(t *testing.T) {
	ts := startServer(t, func(cfg *config.Config) {
		cfg.Timeouts.Handshake = config.Duration(200 * time.Millisecond)
		cfg.Limits.MaxMessageBytes = 4096
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No initialize: closed with 1008, like a slow client, but a handshake timeout.
	c := ts.dial(Subprotocol)
	if _, err := c.read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("without initialize: %v, want 1008", err)
	}
	// A client that leaves with 1001 (a browser tab closing) is a client close.
	c = ts.dial(Subprotocol)
	c.initialize()
	_ = c.ws.Close(websocket.StatusGoingAway, "tab closed")
	// A message over the limit.
	c = ts.dial(Subprotocol)
	c.initialize()
	c.write(ctx, websocket.MessageText, []byte(strings.Repeat(" ", 5000)))
	if _, err := c.read(ctx); websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("over the limit: %v, want 1009", err)
	}
	want := []string{`reason="handshake_timeout",tenant="default",transport="websocket"} 1`, `reason="client_closed",tenant="default",transport="websocket"} 1`, `reason="message_too_big",tenant="default",transport="websocket"} 1`}
	all := func(body string) bool {
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	}
	_, body := ts.get("/metrics")
	for deadline := time.Now().Add(5 * time.Second); !all(body) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		_, body = ts.get("/metrics")
	}
	if !all(body) || strings.Contains(body, `reason="slow_client"`) || strings.Contains(body, `reason="shutdown"`) {
		t.Fatalf("close counters:\n%s", grepLines(body, "acpgate_connections_total"))
	}
}

// TestRefusedReloadChangesNothing: a reload the authenticator refuses (two
// tenants with one token) leaves the relay's tenants as they were too, and
// a settings change the gateway cannot apply live (the session keys) is
// refused rather than reported as reloaded.
func TestRefusedReloadChangesNothing(t *testing.T) {
	ts := startServer(t, withTenant(t))
	defer ts.shutdown()
	cur := ts.s.config()

	next := *cur
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].MaxSessions = 1
	next.Tenants = append(next.Tenants, config.Tenant{Name: "twin", TokensSHA256: cur.Tenants[0].TokensSHA256, Root: t.TempDir()})
	if err := ts.s.Reload(&next); err == nil {
		t.Fatal("two tenants with one token were accepted")
	}
	// acme's max_sessions is still unset: two sessions open.
	c := ts.dial(Subprotocol, "acp.bearer.tok")
	c.initialize()
	for i := range 2 {
		res := c.call("session/new", map[string]any{"cwd": cur.Tenants[0].Root, "mcpServers": []any{}})
		if res.Error != nil {
			t.Fatalf("session %d after the refused reload: %d %s", i+1, res.Error.Code, res.Error.Message)
		}
	}

	next = *cur
	keyFile := filepath.Join(t.TempDir(), "session.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	next.SessionKeyFile = keyFile
	if err := ts.s.Reload(&next); err == nil || !strings.Contains(err.Error(), "session_key_file settings need a restart") {
		t.Fatalf("a session key change: %v, want refused as needing a restart", err)
	}
}
