package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/internal/syncbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	gwHost     = "gw.example.com"
	tokAlpha   = "alpha-static-token-0123456789abcdef"
	tokAlpha2  = "alpha-second-token-fedcba9876543210"
	tokBeta    = "beta-static-token-00112233445566778899"
	remoteAddr = "203.0.113.7:40000"
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func baseTenants() []TenantTokens {
	return []TenantTokens{
		{Name: "alpha", TokensSHA256: []string{sha(tokAlpha), sha(tokAlpha2)}},
		{Name: "beta", TokensSHA256: []string{sha(tokBeta)}},
		{Name: "gamma"}, // JWT-only
	}
}

// fakeClock is an injectable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newLogger(buf *syncbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newAuth(t *testing.T, cfg Config) *Authenticator {
	t.Helper()
	if cfg.Tenants == nil {
		cfg.Tenants = baseTenants()
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(a.Close)
	return a
}

// hdr is a request header line.
type hdr struct{ k, v string }

func wsReq(target string, hs ...hdr) *http.Request {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.Host = gwHost
	r.RemoteAddr = remoteAddr
	for _, h := range hs {
		r.Header.Add(h.k, h.v)
	}
	return r
}

func bearer(tok string) hdr { return hdr{"Authorization", "Bearer " + tok} }
func proto(v string) hdr    { return hdr{"Sec-WebSocket-Protocol", v} }
func originH(v string) hdr  { return hdr{"Origin", v} }

func wantOK(t *testing.T, id Identity, err error, tenant, method string) {
	t.Helper()
	if err != nil {
		t.Fatalf("want success, got %v", err)
	}
	if id.Tenant != tenant || id.Method != method {
		t.Fatalf("identity = %+v, want tenant %q method %q", id, tenant, method)
	}
}

func wantErr(t *testing.T, err error, status int, reason string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error %d %s, got %v", status, reason, err)
	}
	if e.Status != status || e.Reason != reason {
		t.Fatalf("got %d %s (%s), want %d %s", e.Status, e.Reason, e.Message, status, reason)
	}
	if e.Message == "" {
		t.Fatalf("empty message for %s", reason)
	}
	return e
}
