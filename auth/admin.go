package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
)

// AdminConfig says who may use the admin API.
type AdminConfig struct {
	// TokensSHA256 are the hex SHA-256 hashes of the administrators'
	// static tokens.
	TokensSHA256 []string
	// JWTClaim and JWTValue: a JWT the tenants' Authenticator accepts whose
	// claim JWTClaim is JWTValue (a string, or a boolean or number written
	// so), or a list holding it, is an administrator's. "": none.
	JWTClaim, JWTValue string
}

// ReasonNotAdmin: a valid credential that is not an administrator's (403).
const ReasonNotAdmin = "not_admin"

// Admins checks the credentials of admin API requests. It is safe for
// concurrent use.
type Admins struct {
	log          *slog.Logger
	hashes       atomic.Pointer[[][sha256.Size]byte]
	claim, value string
	tenants      *Authenticator // nil: no tenant credentials, no JWTs
}

// NewAdmins builds the admin API's check. tenants (nil: none) tells a
// tenant's credential (403) from none (401) and validates JWTs.
func NewAdmins(cfg AdminConfig, tenants *Authenticator, log *slog.Logger) (*Admins, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.JWTClaim != "" && (tenants == nil || tenants.jwt == nil) {
		return nil, errors.New("auth: an admin JWT claim needs JWTs configured")
	}
	a := &Admins{log: log, claim: cfg.JWTClaim, value: cfg.JWTValue, tenants: tenants}
	if err := a.UpdateTokens(cfg.TokensSHA256); err != nil {
		return nil, err
	}
	return a, nil
}

// UpdateTokens replaces the administrators' token hashes (config reload).
// On error the old ones stay.
func (a *Admins) UpdateTokens(hashes []string) error {
	t, err := ParseAdminTokens(hashes)
	if err != nil {
		return err
	}
	a.SetTokens(t)
	return nil
}

// AdminTokens are administrators' token hashes, checked and ready to swap
// in (SetTokens): a reload builds them before it changes anything.
type AdminTokens struct{ sums [][sha256.Size]byte }

// ParseAdminTokens checks and decodes administrators' token hashes.
func ParseAdminTokens(hashes []string) (*AdminTokens, error) {
	sums := make([][sha256.Size]byte, 0, len(hashes))
	for i, h := range hashes {
		b, err := hex.DecodeString(strings.TrimSpace(h))
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("auth: admin token hash %d is not 64 hex digits (a SHA-256)", i)
		}
		sums = append(sums, [sha256.Size]byte(b))
	}
	return &AdminTokens{sums: sums}, nil
}

// SetTokens swaps in hashes ParseAdminTokens decoded, as UpdateTokens does.
func (a *Admins) SetTokens(t *AdminTokens) { a.hashes.Store(&t.sums) }

// Check authenticates an admin API request by its Authorization: Bearer
// header: an administrator's static token, or a JWT carrying the admin
// claim. A tenant's credential is refused with 403, none or an unknown
// one with 401 (*Error). The Identity has no tenant; its Subject names the
// administrator (never the token).
func (a *Admins) Check(r *http.Request) (Identity, error) {
	id, err := a.check(r)
	if err != nil {
		a.log.Info("admin API: refused", "reason", err.Reason, "remote", r.RemoteAddr)
		return Identity{}, err
	}
	return id, nil
}

func (a *Admins) check(r *http.Request) (Identity, *Error) {
	bearers, ignored := bearerTokens(r.Header)
	switch {
	case len(bearers) == 0:
		return Identity{}, missingToken(ignored, false)
	case len(bearers) > 1:
		return Identity{}, fail(http.StatusBadRequest, ReasonMultipleTokens, "present exactly one Authorization: Bearer header")
	case bearers[0] == "":
		return Identity{}, unauthorized(ReasonInvalidToken, "the bearer token is empty")
	}
	token := bearers[0]
	sum := sha256.Sum256([]byte(token))
	found := 0
	for _, h := range *a.hashes.Load() {
		found |= subtle.ConstantTimeCompare(sum[:], h[:])
	}
	if found == 1 {
		return Identity{Method: MethodBearer, Subject: tokenSubject(&sum)}, nil
	}
	notAdmin := fail(http.StatusForbidden, ReasonNotAdmin, "this credential is not an administrator's")
	if a.tenants == nil {
		return Identity{}, unauthorized(ReasonInvalidToken, "the bearer token is not valid")
	}
	if _, _, ok := a.tenants.tenants.Load().lookup(token); ok {
		return Identity{}, notAdmin
	}
	if a.tenants.jwt == nil || strings.Count(token, ".") != 2 {
		return Identity{}, unauthorized(ReasonInvalidToken, "the bearer token is not valid")
	}
	claims, err := a.tenants.jwt.claims(r, token)
	if err != nil {
		return Identity{}, err
	}
	sub, err := jwtSubject(claims) // as for tenants: no sub, no identity (401)
	if err != nil {
		return Identity{}, err
	}
	if a.claim == "" || !claimHolds(claims[a.claim], a.value) {
		return Identity{}, notAdmin
	}
	return Identity{Method: MethodJWT, Subject: sub}, nil
}

// claimHolds reports whether a claim's value is want: a string, a boolean
// or number written as want, or a list holding one.
func claimHolds(v any, want string) bool {
	switch v := v.(type) {
	case string:
		return v == want
	case bool, float64:
		return fmt.Sprint(v) == want
	case []any:
		for _, e := range v {
			if claimHolds(e, want) {
				return true
			}
		}
	}
	return false
}
