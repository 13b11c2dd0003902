package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/acpgate/acpgate/internal/syncbuf"
)

const (
	testIss = "https://idp.example.com/"
	testAud = "acpgate"
)

type testKeys struct {
	rsa, rsa2, rsaOther *rsa.PrivateKey
	ec, ec384           *ecdsa.PrivateKey
	ed                  ed25519.PrivateKey
}

var keys = sync.OnceValue(func() testKeys {
	var k testKeys
	var err error
	for _, p := range []**rsa.PrivateKey{&k.rsa, &k.rsa2, &k.rsaOther} {
		if *p, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	}
	if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	if k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		panic(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	return k
})

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(pub *rsa.PublicKey, kid, alg string) map[string]any {
	m := map[string]any{"kty": "RSA", "kid": kid, "use": "sig",
		"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
	if alg != "" {
		m["alg"] = alg
	}
	return m
}

func ecJWK(pub *ecdsa.PublicKey, kid string) map[string]any {
	e, err := pub.ECDH()
	if err != nil {
		panic(err)
	}
	b := e.Bytes()[1:] // 0x04 || X || Y
	crv := map[int]string{32: "P-256", 48: "P-384"}[len(b)/2]
	return map[string]any{"kty": "EC", "kid": kid, "crv": crv, "x": b64(b[:len(b)/2]), "y": b64(b[len(b)/2:])}
}

func edJWK(pub ed25519.PublicKey, kid string) map[string]any {
	return map[string]any{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pub)}
}

func jwksJSON(ks ...map[string]any) []byte {
	b, err := json.Marshal(map[string]any{"keys": ks})
	if err != nil {
		panic(err)
	}
	return b
}

// defaultJWKS: rsa1 (RS256), rsa-any (no alg: RS*/PS*), ec1 (P-256),
// ec384, ed1.
func defaultJWKS() []byte {
	k := keys()
	return jwksJSON(
		rsaJWK(&k.rsa.PublicKey, "rsa1", "RS256"),
		rsaJWK(&k.rsa2.PublicKey, "rsa-any", ""),
		ecJWK(&k.ec.PublicKey, "ec1"),
		ecJWK(&k.ec384.PublicKey, "ec384"),
		edJWK(k.ed.Public().(ed25519.PublicKey), "ed1"),
	)
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func claims(now time.Time, tenant string) jwt.MapClaims {
	c := jwt.MapClaims{
		"iss": testIss, "aud": testAud, "sub": "user-1",
		"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(),
	}
	if tenant != "" {
		c["tenant"] = tenant
	}
	return c
}

func sign(t *testing.T, m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func jwksAuth(t *testing.T, clock *fakeClock, mod func(*JWTConfig)) *Authenticator {
	t.Helper()
	jc := &JWTConfig{Issuer: testIss, Audience: testAud, JWKSFile: writeFile(t, "jwks.json", defaultJWKS())}
	if mod != nil {
		mod(jc)
	}
	return newAuth(t, Config{JWT: jc, Clock: clock.Now})
}

func TestJWTValid(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	a := jwksAuth(t, clock, nil)
	now := clock.Now()
	for name, tok := range map[string]string{
		"RS256":           sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha")),
		"RS256 no kid":    sign(t, jwt.SigningMethodRS256, k.rsa, "", claims(now, "alpha")),
		"PS256 no alg":    sign(t, jwt.SigningMethodPS256, k.rsa2, "rsa-any", claims(now, "alpha")),
		"RS512 no alg":    sign(t, jwt.SigningMethodRS512, k.rsa2, "rsa-any", claims(now, "alpha")),
		"ES256":           sign(t, jwt.SigningMethodES256, k.ec, "ec1", claims(now, "alpha")),
		"ES256 no kid":    sign(t, jwt.SigningMethodES256, k.ec, "", claims(now, "alpha")),
		"ES384":           sign(t, jwt.SigningMethodES384, k.ec384, "ec384", claims(now, "alpha")),
		"EdDSA":           sign(t, jwt.SigningMethodEdDSA, k.ed, "ed1", claims(now, "alpha")),
		"aud array":       sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "aud", []string{"other", testAud})),
		"exp in leeway":   sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "exp", now.Add(-20*time.Second).Unix())),
		"nbf in leeway":   sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "nbf", now.Add(20*time.Second).Unix())),
		"nbf in the past": sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "nbf", now.Add(-time.Minute).Unix())),
	} {
		t.Run(name, func(t *testing.T) {
			id, err := a.Upgrade(wsReq("/acp", bearer(tok)))
			wantOK(t, id, err, "alpha", MethodJWT)
			if id.Subject != "jwt:user-1" {
				t.Fatalf("subject %q", id.Subject)
			}
		})
	}
	// In the subprotocol carrier, and for tickets.
	tok := sign(t, jwt.SigningMethodES256, k.ec, "ec1", claims(now, "gamma"))
	id, err := a.Upgrade(wsReq("/acp", proto("acp, acp.bearer."+tok)))
	wantOK(t, id, err, "gamma", MethodJWT)
	id, err = a.Bearer(wsReq("/v1/tickets", bearer(tok)))
	wantOK(t, id, err, "gamma", MethodJWT)
	// Static tokens keep working next to JWTs.
	id, err = a.Upgrade(wsReq("/acp", bearer(tokBeta)))
	wantOK(t, id, err, "beta", MethodBearer)
}

func withClaim(c jwt.MapClaims, k string, v any) jwt.MapClaims {
	c[k] = v
	return c
}

func without(c jwt.MapClaims, k string) jwt.MapClaims {
	delete(c, k)
	return c
}

func TestJWTRejected(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	a := jwksAuth(t, clock, nil)
	now := clock.Now()
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: must(x509.MarshalPKIXPublicKey(&k.rsa.PublicKey))})
	good := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha"))
	parts := strings.Split(good, ".")
	otherPayload := strings.Split(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "beta")), ".")[1]
	embedded := jwt.NewWithClaims(jwt.SigningMethodRS256, claims(now, "alpha"))
	embedded.Header["kid"] = "rsa1"
	embedded.Header["jwk"] = rsaJWK(&k.rsaOther.PublicKey, "rsa1", "RS256")
	embedded.Header["jku"] = "https://evil.example.net/jwks.json"
	crit := jwt.NewWithClaims(jwt.SigningMethodRS256, claims(now, "alpha"))
	crit.Header["kid"] = "rsa1"
	crit.Header["crit"] = []string{"exp"}
	numericKid := jwt.NewWithClaims(jwt.SigningMethodRS256, claims(now, "alpha"))
	numericKid.Header["kid"] = 7

	cases := []struct {
		name   string
		tok    string
		status int
		reason string
	}{
		{"expired", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "exp", now.Add(-time.Minute).Unix())), 401, ReasonExpiredToken},
		{"nbf in future", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "nbf", now.Add(5*time.Minute).Unix())), 401, ReasonNotYetValid},
		{"no exp", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, "alpha"), "exp")), 401, ReasonInvalidToken},
		{"wrong iss", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "iss", "https://evil.example.net/")), 401, ReasonWrongIssuer},
		{"no iss", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, "alpha"), "iss")), 401, ReasonWrongIssuer},
		{"wrong aud", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "aud", "other")), 401, ReasonWrongAudience},
		{"no aud", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, "alpha"), "aud")), 401, ReasonWrongAudience},
		{"bad signature (other key)", sign(t, jwt.SigningMethodRS256, k.rsaOther, "rsa1", claims(now, "alpha")), 401, ReasonBadSignature},
		{"bad signature (other key, no kid)", sign(t, jwt.SigningMethodRS256, k.rsaOther, "", claims(now, "alpha")), 401, ReasonBadSignature},
		{"tampered payload", parts[0] + "." + otherPayload + "." + parts[2], 401, ReasonBadSignature},
		{"bad signature beats expiry", sign(t, jwt.SigningMethodRS256, k.rsaOther, "rsa1", withClaim(claims(now, "alpha"), "exp", now.Add(-time.Hour).Unix())), 401, ReasonBadSignature},
		{"embedded jwk/jku ignored", must(embedded.SignedString(k.rsaOther)), 401, ReasonBadSignature},
		{"alg none", must(jwt.NewWithClaims(jwt.SigningMethodNone, claims(now, "alpha")).SignedString(jwt.UnsafeAllowNoneSignatureType)), 401, ReasonAlgNotAllowed},
		{"alg none, kid", noneWithKid(t, claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"unknown alg", unknownAlg(parts), 401, ReasonAlgNotAllowed},
		{"HS256 with JWKS only", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("k", 32)), "", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"HS256 signed with the RSA public key PEM", sign(t, jwt.SigningMethodHS256, rsaPEM, "rsa1", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"ES256 with an RSA kid", sign(t, jwt.SigningMethodES256, k.ec, "rsa1", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"RS256 with an EC kid", sign(t, jwt.SigningMethodRS256, k.rsa, "ec1", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"PS256 with an RS256-only key", sign(t, jwt.SigningMethodPS256, k.rsa, "rsa1", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"ES256 with the P-384 kid", sign(t, jwt.SigningMethodES256, k.ec, "ec384", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"EdDSA with an EC kid", sign(t, jwt.SigningMethodEdDSA, k.ed, "ec1", claims(now, "alpha")), 401, ReasonAlgNotAllowed},
		{"unknown kid", sign(t, jwt.SigningMethodRS256, k.rsa, "nope", claims(now, "alpha")), 401, ReasonUnknownKey},
		{"non-string kid", must(numericKid.SignedString(k.rsa)), 401, ReasonUnknownKey},
		{"crit header", must(crit.SignedString(k.rsa)), 401, ReasonInvalidToken},
		{"malformed", "aaa.bbb.ccc", 401, ReasonInvalidToken},
		{"garbage segments", "..", 401, ReasonInvalidToken},
		{"too long", parts[0] + "." + strings.Repeat("A", maxJWTBytes) + "." + parts[2], 401, ReasonInvalidToken},
		{"unknown tenant", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "delta")), 403, ReasonUnknownTenant},
		{"missing tenant", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "")), 403, ReasonMissingTenant},
		{"empty tenant", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, ""), "tenant", "")), 403, ReasonMissingTenant},
		{"non-string tenant", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, ""), "tenant", []string{"alpha"})), 403, ReasonMissingTenant},
		{"no sub", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, "alpha"), "sub")), 401, ReasonMissingSubject},
		{"empty sub", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "sub", "")), 401, ReasonMissingSubject},
		{"numeric sub", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "sub", 42)), 401, ReasonMissingSubject},
		{"null sub", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "sub", nil)), 401, ReasonMissingSubject},
		{"list sub", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "sub", []string{"user-1"})), 401, ReasonMissingSubject},
		{"no sub, no tenant", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, ""), "sub")), 401, ReasonMissingSubject},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := a.Upgrade(wsReq("/acp", bearer(c.tok)))
			e := wantErr(t, err, c.status, c.reason)
			if strings.Contains(e.Error(), c.tok) {
				t.Fatal("token in error")
			}
			_, err = a.Upgrade(wsReq("/acp", proto("acp, acp.bearer."+c.tok)))
			wantErr(t, err, c.status, c.reason)
		})
	}
}

// A JWT's subject is "jwt:" and its sub, so it never equals a static
// token's subject, whatever its sub says; a JWT without a non-empty string
// sub names nobody and is refused (401), counted and logged like every
// refusal, rather than given the one subject all such tokens would share.
func TestJWTSubject(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	var reasons []string
	buf := &syncbuf.Buffer{}
	a, err := New(Config{Tenants: baseTenants(), Clock: clock.Now,
		JWT:       &JWTConfig{Issuer: testIss, Audience: testAud, JWKSFile: writeFile(t, "jwks.json", defaultJWKS())},
		OnFailure: func(_ *http.Request, reason string) { reasons = append(reasons, reason) }}, newLogger(buf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	now := clock.Now()

	static, err := a.Upgrade(wsReq("/acp", bearer(tokAlpha)))
	wantOK(t, static, err, "alpha", MethodBearer)
	if static.Subject != "token:"+sha(tokAlpha)[:16] {
		t.Fatalf("static token subject %q", static.Subject)
	}
	// A JWT of the same tenant whose sub is the static token's subject.
	mimic := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, "alpha"), "sub", static.Subject))
	id, err := a.Upgrade(wsReq("/acp", bearer(mimic)))
	wantOK(t, id, err, "alpha", MethodJWT)
	if id.Subject == static.Subject || id.Subject != "jwt:"+static.Subject {
		t.Fatalf("a JWT with sub %q has subject %q (the static token's is %q)", static.Subject, id.Subject, static.Subject)
	}
	// So does a ticket issued for it.
	w, body := serve(t, a.TicketsHandler(), postReq(bearer(mimic)))
	if w.Code != http.StatusCreated {
		t.Fatalf("POST /v1/tickets: %d %+v", w.Code, body)
	}
	if id, err := a.Upgrade(wsReq("/acp?ticket=" + body.Ticket)); err != nil || id.Subject != "jwt:"+static.Subject {
		t.Fatalf("ticket of the JWT: %+v, %v", id, err)
	}

	// Without a sub: 401 with a message naming the claim, on every path.
	reasons = nil
	nosub := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", without(claims(now, "alpha"), "sub"))
	_, err = a.Upgrade(wsReq("/acp", bearer(nosub)))
	if e := wantErr(t, err, http.StatusUnauthorized, ReasonMissingSubject); !strings.Contains(e.Message, "subject (sub)") {
		t.Fatalf("message %q does not name the sub claim", e.Message)
	}
	_, err = a.Bearer(wsReq("/v1/tickets", bearer(nosub)))
	wantErr(t, err, http.StatusUnauthorized, ReasonMissingSubject)
	w, _ = serve(t, a.TicketsHandler(), postReq(bearer(nosub)))
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), ReasonMissingSubject) {
		t.Fatalf("POST /v1/tickets without a sub: %d %s", w.Code, w.Body)
	}
	if len(reasons) != 3 || reasons[0] != ReasonMissingSubject || reasons[2] != ReasonMissingSubject {
		t.Fatalf("failures reported: %v, want %s three times", reasons, ReasonMissingSubject)
	}
	if log := buf.String(); !strings.Contains(log, "reason="+ReasonMissingSubject) || strings.Contains(log, nosub) || strings.Contains(log, tokAlpha) {
		t.Fatalf("log:\n%s", log)
	}
}

func noneWithKid(t *testing.T, c jwt.MapClaims) string {
	tok := jwt.NewWithClaims(jwt.SigningMethodNone, c)
	tok.Header["kid"] = "rsa1"
	return must(tok.SignedString(jwt.UnsafeAllowNoneSignatureType))
}

func unknownAlg(parts []string) string {
	return b64([]byte(`{"alg":"XX999","kid":"rsa1"}`)) + "." + parts[1] + "." + parts[2]
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestJWTTenantClaim(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	a := jwksAuth(t, clock, func(c *JWTConfig) { c.TenantClaim = "org" })
	now := clock.Now()
	id, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", withClaim(claims(now, ""), "org", "beta")))))
	wantOK(t, id, err, "beta", MethodJWT)
	_, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "beta")))))
	e := wantErr(t, err, 403, ReasonMissingTenant)
	if !strings.Contains(e.Message, `"org"`) {
		t.Fatalf("message should name the claim: %q", e.Message)
	}
}

func TestJWTNotConfigured(t *testing.T) {
	k := keys()
	a := newAuth(t, Config{})
	_, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(time.Now(), "alpha")))))
	wantErr(t, err, 401, ReasonInvalidToken)
}

func TestHS256Secret(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	now := clock.Now()
	secret := []byte("0123456789abcdef0123456789abcdef-hs256")
	path := writeFile(t, "secret", append(append([]byte("  \n"), secret...), "\n"...))
	a := newAuth(t, Config{Clock: clock.Now, JWT: &JWTConfig{Issuer: testIss, Audience: testAud, HS256SecretFile: path}})

	id, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodHS256, secret, "", claims(now, "alpha")))))
	wantOK(t, id, err, "alpha", MethodJWT)
	for name, c := range map[string]struct {
		tok    string
		reason string
	}{
		"wrong secret": {sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-another"), "", claims(now, "alpha")), ReasonBadSignature},
		"untrimmed":    {sign(t, jwt.SigningMethodHS256, append(secret, '\n'), "", claims(now, "alpha")), ReasonBadSignature},
		"HS384":        {sign(t, jwt.SigningMethodHS384, secret, "", claims(now, "alpha")), ReasonAlgNotAllowed},
		"HS512":        {sign(t, jwt.SigningMethodHS512, secret, "", claims(now, "alpha")), ReasonAlgNotAllowed},
		"RS256":        {sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha")), ReasonAlgNotAllowed},
		"none":         {must(jwt.NewWithClaims(jwt.SigningMethodNone, claims(now, "alpha")).SignedString(jwt.UnsafeAllowNoneSignatureType)), ReasonAlgNotAllowed},
		"expired":      {sign(t, jwt.SigningMethodHS256, secret, "", withClaim(claims(now, "alpha"), "exp", now.Add(-time.Hour).Unix())), ReasonExpiredToken},
		"wrong aud":    {sign(t, jwt.SigningMethodHS256, secret, "", withClaim(claims(now, "alpha"), "aud", "x")), ReasonWrongAudience},
	} {
		_, err := a.Upgrade(wsReq("/acp", bearer(c.tok)))
		if e, ok := err.(*Error); !ok || e.Reason != c.reason {
			t.Errorf("%s: got %v, want %s", name, err, c.reason)
		}
	}
}

// With both a JWKS and an HS256 secret, an HS256 token signed with the RSA
// public key is checked against the secret only.
func TestHSRSConfusionWithBoth(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	now := clock.Now()
	secret := []byte(strings.Repeat("s", 40))
	a := jwksAuth(t, clock, func(c *JWTConfig) { c.HS256SecretFile = writeFile(t, "secret", secret) })
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: must(x509.MarshalPKIXPublicKey(&k.rsa.PublicKey))})
	rsaDER := x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)
	for _, key := range [][]byte{rsaPEM, rsaDER} {
		_, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodHS256, key, "rsa1", claims(now, "alpha")))))
		wantErr(t, err, 401, ReasonBadSignature)
	}
	id, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodHS256, secret, "rsa1", claims(now, "alpha")))))
	wantOK(t, id, err, "alpha", MethodJWT)
	id, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha")))))
	wantOK(t, id, err, "alpha", MethodJWT)
}

// A symmetric ("oct") key in a JWKS is never used.
func TestJWKSOctKeyIgnored(t *testing.T) {
	k := keys()
	clock := newFakeClock()
	octSecret := []byte(strings.Repeat("o", 32))
	set := jwksJSON(rsaJWK(&k.rsa.PublicKey, "rsa1", "RS256"),
		map[string]any{"kty": "oct", "kid": "oct1", "k": b64(octSecret), "alg": "HS256"})
	a := newAuth(t, Config{Clock: clock.Now, JWT: &JWTConfig{Issuer: testIss, Audience: testAud, JWKSFile: writeFile(t, "j.json", set)}})
	_, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodHS256, octSecret, "oct1", claims(clock.Now(), "alpha")))))
	wantErr(t, err, 401, ReasonAlgNotAllowed)
	_, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "oct1", claims(clock.Now(), "alpha")))))
	wantErr(t, err, 401, ReasonAlgNotAllowed)
}

// jwksServer serves a JWK Set that the test can swap, counting requests.
type jwksServer struct {
	*httptest.Server
	body atomic.Pointer[[]byte]
	hits atomic.Int64
	fail atomic.Bool
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	s := &jwksServer{}
	s.body.Store(&body)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.hits.Add(1)
		if s.fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*s.body.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(body []byte) { s.body.Store(&body) }

func TestJWKSURL(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, jwksJSON(rsaJWK(&k.rsa.PublicKey, "rsa1", "RS256"), ecJWK(&k.ec.PublicKey, "ec1")))
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("test server on %s", srv.URL)
	}
	buf := &syncbuf.Buffer{}
	a, err := New(Config{Tenants: baseTenants(), JWT: &JWTConfig{Issuer: testIss, Audience: testAud, JWKSURL: srv.URL}}, newLogger(buf))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	now := time.Now()
	id, err := a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha")))))
	wantOK(t, id, err, "alpha", MethodJWT)
	id, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodES256, k.ec, "ec1", claims(now, "beta")))))
	wantOK(t, id, err, "beta", MethodJWT)

	// Key rotation: a token with a new kid makes the gateway refetch at once.
	srv.set(jwksJSON(rsaJWK(&k.rsa.PublicKey, "rsa1", "RS256"), rsaJWK(&k.rsa2.PublicKey, "rsa2", "RS256")))
	before := srv.hits.Load()
	id, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa2, "rsa2", claims(now, "alpha")))))
	wantOK(t, id, err, "alpha", MethodJWT)
	if srv.hits.Load() != before+1 {
		t.Fatalf("hits %d -> %d, want one refetch", before, srv.hits.Load())
	}
	// ... but not again right away: unknown kids are rate-limited.
	start := time.Now()
	_, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodRS256, k.rsa2, "rsa3", claims(now, "alpha")))))
	wantErr(t, err, 401, ReasonUnknownKey)
	if srv.hits.Load() != before+1 || time.Since(start) > 2*time.Second {
		t.Fatalf("unknown kid refetched again (hits %d) or waited %v", srv.hits.Load(), time.Since(start))
	}
	// Revoked keys go with the refresh: ec1 is gone.
	_, err = a.Upgrade(wsReq("/acp", bearer(sign(t, jwt.SigningMethodES256, k.ec, "ec1", claims(now, "beta")))))
	wantErr(t, err, 401, ReasonUnknownKey)
	if strings.Contains(buf.String(), "level=WARN") || strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("unexpected log:\n%s", buf.String())
	}
}

func TestJWKSURLPeriodicRefreshAndClose(t *testing.T) {
	defer func(d time.Duration) { minJWKSRefresh = d }(minJWKSRefresh)
	minJWKSRefresh = 10 * time.Millisecond
	k := keys()
	srv := newJWKSServer(t, jwksJSON(rsaJWK(&k.rsa.PublicKey, "rsa1", "RS256")))
	buf := &syncbuf.Buffer{}
	a, err := New(Config{Tenants: baseTenants(), JWT: &JWTConfig{Issuer: testIss, Audience: testAud,
		JWKSURL: srv.URL, JWKSRefreshInterval: 50 * time.Millisecond}}, newLogger(buf))
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(time.Now(), "alpha"))
	id, err := a.Upgrade(wsReq("/acp", bearer(tok)))
	wantOK(t, id, err, "alpha", MethodJWT)

	// A failing refresh keeps the keys and logs a warning.
	srv.fail.Store(true)
	waitFor(t, func() bool { return strings.Contains(buf.String(), "JWKS refresh failed") })
	id, err = a.Upgrade(wsReq("/acp", bearer(tok)))
	wantOK(t, id, err, "alpha", MethodJWT)

	// The next good refresh replaces the set: rsa1 is revoked.
	srv.set(jwksJSON(rsaJWK(&k.rsa2.PublicKey, "rsa2", "RS256")))
	srv.fail.Store(false)
	waitFor(t, func() bool {
		_, err := a.Upgrade(wsReq("/acp", bearer(tok)))
		return err != nil
	})

	// Close stops the refresh goroutine (goleak checks it is gone too).
	a.Close()
	a.Close()
	time.Sleep(60 * time.Millisecond)
	hits := srv.hits.Load()
	time.Sleep(300 * time.Millisecond)
	if srv.hits.Load() != hits {
		t.Fatalf("JWKS still fetched after Close: %d -> %d", hits, srv.hits.Load())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJWKSURLAndFile(t *testing.T) {
	k := keys()
	srv := newJWKSServer(t, jwksJSON(rsaJWK(&k.rsa2.PublicKey, "rsa2", "RS256")))
	clock := newFakeClock()
	a := jwksAuth(t, clock, func(c *JWTConfig) { c.JWKSURL = srv.URL })
	now := clock.Now()
	for _, tok := range []string{
		sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(now, "alpha")),  // file
		sign(t, jwt.SigningMethodRS256, k.rsa2, "rsa2", claims(now, "alpha")), // URL
	} {
		id, err := a.Upgrade(wsReq("/acp", bearer(tok)))
		wantOK(t, id, err, "alpha", MethodJWT)
	}
}
