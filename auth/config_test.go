package auth

import (
	"crypto/ecdh"
	"crypto/rand"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/acpgate/acpgate/internal/syncbuf"
)

func TestNewErrors(t *testing.T) {
	k := keys()
	okTenants := baseTenants()
	jwksFile := writeFile(t, "jwks.json", defaultJWKS())
	x25519, _ := ecdh.X25519().GenerateKey(rand.Reader)
	srv := newJWKSServer(t, defaultJWKS())
	down := newJWKSServer(t, nil)
	down.fail.Store(true)
	closed := newJWKSServer(t, nil)
	closedURL := closed.URL
	closed.Close()
	empty := newJWKSServer(t, []byte(`{"keys":[]}`))
	jc := func(mod func(*JWTConfig)) *JWTConfig {
		c := &JWTConfig{Issuer: testIss, Audience: testAud, JWKSFile: jwksFile}
		mod(c)
		return c
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no tenants", Config{}, "no tenants"},
		{"bad hex", Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{strings.Repeat("zz", 32)}}}}, "64 hex digits"},
		{"short hash", Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{"abcd"}}}}, "64 hex digits"},
		{"plain token instead of hash", Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{tokAlpha}}}}, "64 hex digits"},
		{"empty name", Config{Tenants: []TenantTokens{{Name: ""}}}, "name"},
		{"padded name", Config{Tenants: []TenantTokens{{Name: " a"}}}, "name"},
		{"duplicate tenant", Config{Tenants: []TenantTokens{{Name: "a"}, {Name: "a"}}}, "twice"},
		{"shared hash", Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{sha("x")}}, {Name: "b", TokensSHA256: []string{sha("x")}}}}, "also configured"},
		{"ttl too long", Config{Tenants: okTenants, TicketTTL: 61 * time.Second}, "ticket TTL"},
		{"ttl negative", Config{Tenants: okTenants, TicketTTL: -time.Second}, "ticket TTL"},
		{"max tickets negative", Config{Tenants: okTenants, MaxTickets: -1}, "max tickets"},
		{"origin star", Config{Tenants: okTenants, AllowedOrigins: []string{"*"}}, "not supported"},
		{"origin null", Config{Tenants: okTenants, AllowedOrigins: []string{"null"}}, "not supported"},
		{"origin with path", Config{Tenants: okTenants, AllowedOrigins: []string{"https://ide.example.com/"}}, "scheme://host"},
		{"origin without scheme", Config{Tenants: okTenants, AllowedOrigins: []string{"ide.example.com"}}, "scheme://host"},
		{"origin bad port", Config{Tenants: okTenants, AllowedOrigins: []string{"https://ide.example.com:http"}}, "scheme://host"},
		{"wildcard over a TLD", Config{Tenants: okTenants, AllowedOrigins: []string{"https://*.com"}}, "two labels"},
		{"wildcard inside", Config{Tenants: okTenants, AllowedOrigins: []string{"https://ide.*.example.com"}}, "leftmost"},
		{"wildcard partial", Config{Tenants: okTenants, AllowedOrigins: []string{"https://ide*.example.com"}}, "leftmost"},
		{"jwt no issuer", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.Issuer = "" })}, "issuer and audience"},
		{"jwt no audience", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.Audience = "" })}, "issuer and audience"},
		{"jwt no key source", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSFile = "" })}, "at least one"},
		{"jwks file missing", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSFile = filepath.Join(t.TempDir(), "none.json") })}, "no such file"},
		{"jwks file not json", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSFile = writeFile(t, "x.json", []byte("{keys")) })}, "not a JWK Set"},
		{"jwks file bad key", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) {
			c.JWKSFile = writeFile(t, "x.json", []byte(`{"keys":[{"kty":"RSA","kid":"a","n":"!!","e":"AQAB"}]}`))
		})}, "key 0"},
		{"jwks file empty", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSFile = writeFile(t, "x.json", []byte(`{"keys":[]}`)) })}, "no usable"},
		{"jwks file without signing keys", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) {
			enc := rsaJWK(&k.rsa.PublicKey, "enc", "")
			enc["use"] = "enc"
			c.JWKSFile = writeFile(t, "x.json", jwksJSON(enc,
				map[string]any{"kty": "oct", "kid": "o", "k": b64([]byte(strings.Repeat("k", 32)))},
				map[string]any{"kty": "OKP", "crv": "X25519", "kid": "x", "x": b64(x25519.PublicKey().Bytes())}))
		})}, "no usable"},
		{"hs256 secret missing", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.HS256SecretFile = filepath.Join(t.TempDir(), "nope") })}, "no such file"},
		{"hs256 secret short", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) {
			c.HS256SecretFile = writeFile(t, "s", []byte("  "+strings.Repeat("s", 31)+"\n\n"))
		})}, "31 bytes"},
		{"leeway", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.Leeway = time.Hour })}, "leeway"},
		{"jwks url not http", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSURL = "ftp://idp.example.com/jwks" })}, "http(s) URL"},
		{"jwks url plain http", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSURL = "http://idp.example.com/jwks" })}, "use https"},
		{"jwks url unreachable", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSURL = closedURL })}, "jwks url"},
		{"jwks url 500", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSURL = down.URL })}, "jwks url"},
		{"jwks url empty set", Config{Tenants: okTenants, JWT: &JWTConfig{Issuer: testIss, Audience: testAud, JWKSURL: empty.URL}}, "no usable"},
		{"jwks refresh too fast", Config{Tenants: okTenants, JWT: jc(func(c *JWTConfig) { c.JWKSURL = srv.URL; c.JWKSRefreshInterval = time.Millisecond })}, "refresh interval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := New(c.cfg, nil)
			if err == nil {
				a.Close()
				t.Fatalf("New accepted the config")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
			if strings.Contains(err.Error(), tokAlpha) {
				t.Fatal("token in error")
			}
		})
	}
	// Several problems are all reported.
	_, err := New(Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{"x"}}}, AllowedOrigins: []string{"*"}, TicketTTL: time.Hour}, nil)
	if err == nil || !strings.Contains(err.Error(), "hex") || !strings.Contains(err.Error(), "origin") || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("joined error: %v", err)
	}
}

func TestNewDefaultsAndUppercaseHex(t *testing.T) {
	a := newAuth(t, Config{Tenants: []TenantTokens{{Name: "a", TokensSHA256: []string{strings.ToUpper(sha(tokAlpha))}}}})
	id, err := a.Upgrade(wsReq("/acp", bearer(tokAlpha)))
	wantOK(t, id, err, "a", MethodBearer)
	if a.tickets.ttl != 30*time.Second || a.tickets.max != 100_000 {
		t.Fatalf("defaults: ttl %v max %d", a.tickets.ttl, a.tickets.max)
	}
}

// No log line, error or response ever carries a credential.
func TestNoCredentialInLogs(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	now := clock.Now()
	buf := &syncbuf.Buffer{}
	a, err := New(Config{Tenants: baseTenants(), Clock: clock.Now, JWT: &JWTConfig{Issuer: testIss, Audience: testAud,
		JWKSFile: writeFile(t, "jwks.json", defaultJWKS())}}, newLogger(buf))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	goodJWT := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha"))
	expiredJWT := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "exp", now.Add(-time.Hour).Unix()))
	forged := sign(t, jwt.SigningMethodRS256, k.rsaOther, "rsa1", claims(now, "alpha"))
	unknownTenant := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "delta"))
	wrongStatic := "wrong-static-token-4242424242"
	secrets := []string{tokAlpha, tokBeta, goodJWT, expiredJWT, forged, unknownTenant, wrongStatic}

	var errs []error
	call := func(r *http.Request) {
		if _, err := a.Upgrade(r); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range []string{tokAlpha, goodJWT, expiredJWT, forged, unknownTenant, wrongStatic} {
		call(wsReq("/acp", bearer(s)))
		call(wsReq("/acp", proto("acp, acp.bearer."+s)))
		call(wsReq("/acp", bearer(s), proto("acp.bearer."+s)))
		call(wsReq("/acp", bearer(s), originH("https://evil.example.net")))
	}
	h := a.TicketsHandler()
	for _, s := range []string{tokBeta, wrongStatic, goodJWT} {
		w, body := serve(t, h, postReq(bearer(s)))
		if w.Code == http.StatusCreated {
			secrets = append(secrets, body.Ticket)
			call(wsReq("/acp?ticket=" + body.Ticket))
			call(wsReq("/acp?ticket=" + body.Ticket)) // reused
		} else {
			for _, sec := range secrets {
				if strings.Contains(w.Body.String(), sec) {
					t.Fatal("credential in response body")
				}
			}
		}
	}
	tk, _, _ := a.IssueTicket(Identity{Tenant: "alpha"})
	secrets = append(secrets, tk)
	clock.Advance(time.Minute)
	call(wsReq("/acp?ticket=" + tk)) // expired

	out := buf.String()
	if !strings.Contains(out, "reason=invalid_token") || !strings.Contains(out, "reason=ticket_reused") ||
		!strings.Contains(out, "reason=origin_not_allowed") || !strings.Contains(out, "remote="+remoteAddr) ||
		!strings.Contains(out, "level=INFO msg=\"authentication failed\"") {
		t.Fatalf("failures are not logged as expected:\n%s", out)
	}
	if len(errs) < 10 {
		t.Fatalf("only %d failures", len(errs))
	}
	for _, sec := range secrets {
		for _, frag := range []string{sec, sec[:16], sec[len(sec)-16:]} {
			if strings.Contains(out, frag) {
				t.Fatalf("log contains a credential fragment %q:\n%s", frag, out)
			}
			for _, e := range errs {
				if strings.Contains(e.Error(), frag) {
					t.Fatalf("error contains a credential: %v", e)
				}
			}
		}
	}
}
