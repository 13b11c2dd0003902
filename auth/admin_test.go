package auth

import (
	"net/http"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

const tokAdmin = "admin-static-token-0123456789abcdef0123"

// Administrators are told from tenants (403) and from strangers (401).
func TestAdminCheck(t *testing.T) {
	clock := newFakeClock()
	now := clock.Now()
	secret := []byte("0123456789abcdef0123456789abcdef-hs256")
	path := writeFile(t, "secret", secret)
	tenants := newAuth(t, Config{Clock: clock.Now, JWT: &JWTConfig{Issuer: testIss, Audience: testAud, HS256SecretFile: path}})
	a, err := NewAdmins(AdminConfig{TokensSHA256: []string{sha(tokAdmin)}, JWTClaim: "acpgate_admin", JWTValue: "true"}, tenants, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.Check(wsReq("/v1/admin/sessions", bearer(tokAdmin)))
	if err != nil || id.Tenant != "" || id.Subject != "token:"+sha(tokAdmin)[:16] || strings.Contains(id.Subject, tokAdmin) {
		t.Fatalf("admin token: %+v, %v", id, err)
	}
	adminJWT := withClaim(withClaim(claims(now, "alpha"), "acpgate_admin", true), "sub", "ops@example.com")
	id, err = a.Check(wsReq("/v1/admin/sessions", bearer(sign(t, jwt.SigningMethodHS256, secret, "", adminJWT))))
	if err != nil || id.Subject != "jwt:ops@example.com" || id.Method != MethodJWT {
		t.Fatalf("admin JWT: %+v, %v", id, err)
	}
	// An admin JWT whose sub is the admin token's subject is not that token.
	mimic := withClaim(withClaim(claims(now, ""), "acpgate_admin", true), "sub", "token:"+sha(tokAdmin)[:16])
	id, err = a.Check(wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "", mimic))))
	if err != nil || id.Subject != "jwt:token:"+sha(tokAdmin)[:16] {
		t.Fatalf("admin JWT with the admin token's subject as sub: %+v, %v", id, err)
	}
	listJWT := withClaim(claims(now, ""), "acpgate_admin", []any{"x", "true"})
	if _, err := a.Check(wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "", listJWT)))); err != nil {
		t.Fatalf("admin JWT with a list claim: %v", err)
	}
	for name, c := range map[string]struct {
		req    *http.Request
		status int
		reason string
	}{
		"none":         {wsReq("/"), http.StatusUnauthorized, ReasonMissingToken},
		"forged":       {wsReq("/", bearer("not-a-token")), http.StatusUnauthorized, ReasonInvalidToken},
		"tenant token": {wsReq("/", bearer(tokAlpha)), http.StatusForbidden, ReasonNotAdmin},
		"tenant JWT":   {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "", claims(now, "alpha")))), http.StatusForbidden, ReasonNotAdmin},
		"claim false": {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "",
			withClaim(claims(now, "alpha"), "acpgate_admin", false)))), http.StatusForbidden, ReasonNotAdmin},
		"forged JWT": {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-another"), "",
			withClaim(claims(now, "alpha"), "acpgate_admin", true)))), http.StatusUnauthorized, ReasonBadSignature},
		"two": {wsReq("/", bearer(tokAdmin), bearer(tokAdmin)), http.StatusBadRequest, ReasonMultipleTokens},
		"admin JWT without sub": {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "",
			without(withClaim(claims(now, "alpha"), "acpgate_admin", true), "sub")))), http.StatusUnauthorized, ReasonMissingSubject},
		"admin JWT with an empty sub": {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "",
			withClaim(withClaim(claims(now, "alpha"), "acpgate_admin", true), "sub", "")))), http.StatusUnauthorized, ReasonMissingSubject},
		"admin JWT with a numeric sub": {wsReq("/", bearer(sign(t, jwt.SigningMethodHS256, secret, "",
			withClaim(withClaim(claims(now, "alpha"), "acpgate_admin", true), "sub", 7)))), http.StatusUnauthorized, ReasonMissingSubject},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.Check(c.req)
			wantErr(t, err, c.status, c.reason)
		})
	}
	if err := a.UpdateTokens([]string{"xyz"}); err == nil {
		t.Fatal("a bad hash was taken")
	}
	if err := a.UpdateTokens(nil); err != nil {
		t.Fatal(err)
	}
	_, err = a.Check(wsReq("/", bearer(tokAdmin)))
	wantErr(t, err, http.StatusUnauthorized, ReasonInvalidToken)
}

// Without tenants every credential but an administrator's is unknown.
func TestAdminCheckWithoutTenants(t *testing.T) {
	a, err := NewAdmins(AdminConfig{TokensSHA256: []string{sha(tokAdmin)}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(wsReq("/", bearer(tokAdmin))); err != nil {
		t.Fatal(err)
	}
	_, err = a.Check(wsReq("/", bearer(tokAlpha)))
	wantErr(t, err, http.StatusUnauthorized, ReasonInvalidToken)
	if _, err := NewAdmins(AdminConfig{JWTClaim: "admin", JWTValue: "true"}, nil, nil); err == nil {
		t.Fatal("an admin JWT claim without JWTs was taken")
	}
}
