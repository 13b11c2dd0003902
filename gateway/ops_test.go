package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/gateway/config"
)

// withTenant configures one tenant with token "tok".
func withTenant(t *testing.T) func(*config.Config) {
	root := t.TempDir()
	sum := sha256.Sum256([]byte("tok"))
	return func(c *config.Config) {
		c.Tenants = []config.Tenant{{Name: "acme", TokensSHA256: []string{hex.EncodeToString(sum[:])}, Root: root}}
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
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].MaxSessions = 7
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("a tenant change was refused: %v", err)
	}
	_, body := ts.get("/metrics")
	if !strings.Contains(body, `acpgate_config_reloads_total{result="failure"} 2`) ||
		!strings.Contains(body, `acpgate_config_reloads_total{result="success"} 1`) {
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
