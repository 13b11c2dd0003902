// Package auth authenticates acpgate's clients: WebSocket upgrades to /acp
// and the ticket endpoint POST /v1/tickets.
//
// A client proves who it is with exactly one credential carrier:
//
//   - Authorization: Bearer <token> (non-browser tools);
//   - a Sec-WebSocket-Protocol entry "acp.bearer.<token>" next to "acp"
//     (browsers, which cannot set headers on a WebSocket);
//   - the query parameter ticket=<ticket>, a short-lived one-time ticket
//     obtained from POST /v1/tickets with a bearer token.
//
// A bearer token is a tenant's static API token (configured as the hex
// SHA-256 of the token) or, when JWTs are configured, a JWT whose tenant
// claim names a configured tenant. Before any credential is looked at, a
// request that carries an Origin header must come from an allowed origin or
// from the gateway's own origin (cross-site WebSocket hijacking defence).
//
// Tokens and tickets never appear in logs, errors or responses.
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
	"sync"
	"sync/atomic"
	"time"
)

// TenantTokens is a tenant's static API tokens, stored as hex SHA-256 hashes
// (64 hex digits each, e.g. the output of `printf %s "$TOKEN" | sha256sum`).
// A tenant may have no static tokens (JWT-only tenants).
type TenantTokens struct {
	Name         string
	TokensSHA256 []string
}

// JWTConfig enables JWT bearer tokens. At least one key source is required.
// With JWKS (file and/or URL) only asymmetric algorithms are accepted
// (RS*, PS*, ES*, EdDSA), each only with a key of its own type; with an
// HS256 secret only HS256. With both, HS256 tokens are checked against the
// secret only and never against a JWKS key.
type JWTConfig struct {
	// Issuer and Audience are required: the token's iss must equal Issuer and
	// its aud must contain Audience.
	Issuer, Audience string
	// JWKSFile is a JWK Set read once by New. JWKSURL is fetched by New (a
	// failure is an error) and refreshed every JWKSRefreshInterval, and on a
	// token with an unknown kid (at most once every 5 minutes). It must be
	// https unless its host is a loopback address or InsecureJWKSURL is set.
	// HS256SecretFile holds the raw HS256 secret (surrounding whitespace is
	// trimmed; at least 32 bytes).
	JWKSFile, JWKSURL, HS256SecretFile string
	// TenantClaim is the claim naming the tenant (default "tenant"). Its value
	// must be a string naming a configured tenant.
	TenantClaim string
	// JWKSRefreshInterval defaults to one hour.
	JWKSRefreshInterval time.Duration
	// Leeway for exp and nbf; default 30s.
	Leeway time.Duration
	// InsecureJWKSURL permits a plain-http JWKSURL on a non-loopback host.
	InsecureJWKSURL bool
}

// Config configures an Authenticator.
type Config struct {
	Tenants []TenantTokens
	// AllowedOrigins are the cross-origin browser origins permitted besides
	// the gateway's own: exact origins ("https://ide.example.com",
	// "http://localhost:3000") or a wildcard leftmost label
	// ("https://*.example.com": any subdomain at any depth, not the apex).
	// Scheme and host compare case-insensitively; the port must match
	// exactly (a missing port is the scheme's default).
	AllowedOrigins []string
	JWT            *JWTConfig    // nil: no JWTs
	TicketTTL      time.Duration // default 30s, at most 60s
	// MaxTickets caps the ticket table (default 100000). When it is full of
	// unexpired tickets, IssueTicket refuses with 503.
	MaxTickets int
	// Clock is the time source (default time.Now); tests inject a fake.
	Clock func() time.Time
	// OnFailure, if set, is called with every refused request and the
	// request (upgrades and ticket requests alike), for metrics.
	OnFailure func(r *http.Request, reason string)
}

// Identity is an authenticated client. It never holds the credential.
type Identity struct {
	Tenant string
	// Method is how the client authenticated: MethodBearer, MethodSubprotocol,
	// MethodTicket or MethodJWT (a JWT in either bearer carrier).
	Method string
	// Subject is who the credential names, never empty: for a JWT "jwt:"
	// and its sub claim (a JWT without a non-empty string sub is refused);
	// for a static token "token:" and the first 16 hex digits of its
	// SHA-256 (the start of its tokens_sha256 entry, so it is stable across
	// restarts and reloads, and never the token). The prefixes keep the two
	// kinds apart: no JWT's sub can name a static token's subject. A ticket
	// carries the subject of the credential it was issued for.
	Subject string
}

// Subject prefixes, one per kind of credential.
const (
	// StaticTokenSubjectPrefix starts the subject of a static token.
	StaticTokenSubjectPrefix = "token:"
	// JWTSubjectPrefix starts the subject of a JWT, followed by its sub.
	JWTSubjectPrefix = "jwt:"
)

// tokenSubject is the subject of the static token whose SHA-256 is sum.
func tokenSubject(sum *[sha256.Size]byte) string {
	return StaticTokenSubjectPrefix + hex.EncodeToString(sum[:8])
}

// Identity methods.
const (
	MethodBearer      = "bearer"
	MethodSubprotocol = "subprotocol"
	MethodTicket      = "ticket"
	MethodJWT         = "jwt"
)

// SubprotocolTokenPrefix marks a Sec-WebSocket-Protocol entry carrying a
// bearer token: "acp.bearer.<token>".
const SubprotocolTokenPrefix = "acp.bearer."

// Reasons (Error.Reason), for metrics and logs.
const (
	ReasonMissingToken     = "missing_token"       // 401 no carrier at all
	ReasonMultipleTokens   = "multiple_tokens"     // 400 more than one carrier (or one carrier twice)
	ReasonInvalidToken     = "invalid_token"       // 401 unknown static token, malformed JWT, unknown ticket
	ReasonExpiredToken     = "expired_token"       // 401 JWT exp passed
	ReasonNotYetValid      = "token_not_yet_valid" // 401 JWT nbf in the future
	ReasonBadSignature     = "bad_signature"       // 401
	ReasonWrongAudience    = "wrong_audience"      // 401
	ReasonWrongIssuer      = "wrong_issuer"        // 401
	ReasonAlgNotAllowed    = "alg_not_allowed"     // 401 alg none, HS256 without a secret, alg/key-type mismatch...
	ReasonUnknownKey       = "unknown_key"         // 401 no JWKS key for the token's kid/alg
	ReasonUnknownTenant    = "unknown_tenant"      // 403 authentic credential naming no configured tenant
	ReasonMissingTenant    = "missing_tenant"      // 403 JWT without a string tenant claim
	ReasonMissingSubject   = "missing_subject"     // 401 JWT without a non-empty string sub claim
	ReasonOriginNotAllowed = "origin_not_allowed"  // 403
	ReasonTicketReused     = "ticket_reused"       // 401
	ReasonTicketExpired    = "ticket_expired"      // 401
	ReasonTicketsFull      = "ticket_capacity"     // 503 ticket table full
)

// Error is an authentication failure: the HTTP status (400, 401, 403, or 503
// for a full ticket table), a short machine reason for metrics (the Reason*
// constants) and a message for the client. Neither contains a credential.
type Error struct {
	Status          int
	Reason, Message string
}

func (e *Error) Error() string { return "authentication failed (" + e.Reason + "): " + e.Message }

func fail(status int, reason, msg string) *Error {
	return &Error{Status: status, Reason: reason, Message: msg}
}

func unauthorized(reason, msg string) *Error { return fail(http.StatusUnauthorized, reason, msg) }

// Authenticator checks credentials. It is safe for concurrent use.
type Authenticator struct {
	log       *slog.Logger
	onFailure func(r *http.Request, reason string)
	now       func() time.Time
	origins   []originPattern
	tenants   atomic.Pointer[tenantTable]
	jwt       *jwtVerifier // nil: no JWTs
	tickets   *ticketStore

	closeOnce sync.Once
}

const (
	defaultTicketTTL  = 30 * time.Second
	maxTicketTTL      = 60 * time.Second
	defaultMaxTickets = 100_000
)

// New validates cfg and builds an Authenticator. Bad token hashes, bad
// origins, missing or unreadable key files, an unreachable or unusable JWKS
// URL and out-of-range TTLs are errors. Close releases it.
func New(cfg Config, log *slog.Logger) (*Authenticator, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	onFailure := cfg.OnFailure
	if onFailure == nil {
		onFailure = func(*http.Request, string) {}
	}
	now := cfg.Clock
	if now == nil {
		now = time.Now
	}
	var errs []error
	table, err := newTenantTable(cfg.Tenants)
	if err != nil {
		errs = append(errs, err)
	}
	origins, err := parseOrigins(cfg.AllowedOrigins)
	if err != nil {
		errs = append(errs, err)
	}
	ttl := cfg.TicketTTL
	switch {
	case ttl == 0:
		ttl = defaultTicketTTL
	case ttl < time.Second || ttl > maxTicketTTL:
		errs = append(errs, fmt.Errorf("auth: ticket TTL %v out of range (1s to %v)", ttl, maxTicketTTL))
	}
	maxTickets := cfg.MaxTickets
	switch {
	case maxTickets == 0:
		maxTickets = defaultMaxTickets
	case maxTickets < 0:
		errs = append(errs, fmt.Errorf("auth: max tickets %d is negative", maxTickets))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	a := &Authenticator{
		log:       log,
		onFailure: onFailure,
		now:       now,
		origins:   origins,
		tickets:   newTicketStore(ttl, maxTickets),
	}
	a.tenants.Store(table)
	if cfg.JWT != nil {
		v, err := newJWTVerifier(cfg.JWT, now, log)
		if err != nil {
			return nil, err
		}
		a.jwt = v
	}
	return a, nil
}

// Close stops the JWKS refresh goroutine (it ends as soon as it sees the
// cancellation, aborting a fetch in flight) and closes idle JWKS
// connections. Idempotent.
func (a *Authenticator) Close() {
	a.closeOnce.Do(func() {
		if a.jwt != nil {
			a.jwt.close()
		}
	})
}

// UpdateTenants atomically replaces the tenant table (config reload). On
// error the old table stays. Outstanding tickets of a removed tenant stop
// working; JWTs naming it are refused.
func (a *Authenticator) UpdateTenants(tenants []TenantTokens) error {
	t, err := ParseTenants(tenants)
	if err != nil {
		return err
	}
	a.SetTenants(t)
	return nil
}

// Tenants is a checked tenant table, ready to swap in (SetTenants): a
// reload builds it before it changes anything.
type Tenants struct{ t *tenantTable }

// ParseTenants checks and builds a tenant table.
func ParseTenants(tenants []TenantTokens) (*Tenants, error) {
	t, err := newTenantTable(tenants)
	if err != nil {
		return nil, err
	}
	return &Tenants{t: t}, nil
}

// SetTenants swaps in a table ParseTenants built, as UpdateTenants does.
func (a *Authenticator) SetTenants(t *Tenants) { a.tenants.Store(t.t) }

// tenantTable is immutable once built.
type tenantTable struct {
	names  map[string]struct{}
	hashes []tokenHash
}

type tokenHash struct {
	sum    [sha256.Size]byte
	tenant string
}

func newTenantTable(tenants []TenantTokens) (*tenantTable, error) {
	t := &tenantTable{names: map[string]struct{}{}}
	var errs []error
	seen := map[[sha256.Size]byte]string{}
	if len(tenants) == 0 {
		errs = append(errs, errors.New("auth: no tenants configured"))
	}
	for i, tt := range tenants {
		name := tt.Name
		if strings.TrimSpace(name) == "" || name != strings.TrimSpace(name) {
			errs = append(errs, fmt.Errorf("auth: tenant %d: name %q is empty or has surrounding whitespace", i, name))
			continue
		}
		if _, dup := t.names[name]; dup {
			errs = append(errs, fmt.Errorf("auth: tenant %q configured twice", name))
			continue
		}
		t.names[name] = struct{}{}
		for j, h := range tt.TokensSHA256 {
			var sum [sha256.Size]byte
			b, err := hex.DecodeString(strings.TrimSpace(h))
			if err != nil || len(b) != sha256.Size {
				errs = append(errs, fmt.Errorf("auth: tenant %q: token hash %d is not 64 hex digits (a SHA-256)", name, j))
				continue
			}
			copy(sum[:], b)
			if other, dup := seen[sum]; dup {
				errs = append(errs, fmt.Errorf("auth: tenant %q: token hash %d is also configured for tenant %q", name, j, other))
				continue
			}
			seen[sum] = name
			t.hashes = append(t.hashes, tokenHash{sum: sum, tenant: name})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

func (t *tenantTable) has(name string) bool {
	_, ok := t.names[name]
	return ok
}

// lookup finds the tenant and subject of a static token. It hashes the
// token and compares the hash with every stored hash in constant time,
// without stopping at a match, so the time taken says nothing about which
// entry (if any) matched.
func (t *tenantTable) lookup(token string) (tenant, subject string, ok bool) {
	sum := sha256.Sum256([]byte(token))
	found, idx := 0, 0
	for i := range t.hashes {
		eq := subtle.ConstantTimeCompare(sum[:], t.hashes[i].sum[:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
		found |= eq
	}
	if found == 0 {
		return "", "", false
	}
	return t.hashes[idx].tenant, tokenSubject(&sum), true
}

// carrier is one presented credential.
type carrier struct {
	method string // MethodBearer, MethodSubprotocol or MethodTicket
	value  string
}

// Upgrade authenticates a WebSocket upgrade request to /acp: the origin
// policy first, then exactly one credential carrier (Authorization: Bearer,
// a "acp.bearer.<token>" subprotocol entry, or ?ticket=). A ticket is
// consumed by a successful call. Failures are *Error and are logged at info
// with the reason and remote address.
func (a *Authenticator) Upgrade(r *http.Request) (Identity, error) {
	id, err := a.upgrade(r)
	if err != nil {
		a.logFailure(r, err)
		return Identity{}, err
	}
	a.log.Debug("authenticated", "tenant", id.Tenant, "method", id.Method, "remote", r.RemoteAddr)
	return id, nil
}

func (a *Authenticator) upgrade(r *http.Request) (Identity, *Error) {
	if err := a.checkOrigin(r); err != nil {
		return Identity{}, err
	}
	bearers, ignored := bearerTokens(r.Header)
	var cs []carrier
	for _, b := range bearers {
		cs = append(cs, carrier{MethodBearer, b})
	}
	for _, t := range subprotocolTokens(r.Header) {
		cs = append(cs, carrier{MethodSubprotocol, t})
	}
	if r.URL != nil {
		for _, t := range r.URL.Query()["ticket"] {
			cs = append(cs, carrier{MethodTicket, t})
		}
	}
	switch len(cs) {
	case 0:
		return Identity{}, missingToken(ignored, true)
	case 1:
	default:
		return Identity{}, fail(http.StatusBadRequest, ReasonMultipleTokens,
			"present exactly one credential: an Authorization: Bearer header, an acp.bearer.* subprotocol entry, or a ticket query parameter")
	}
	c := cs[0]
	if c.method == MethodTicket {
		return a.redeemTicket(c.value)
	}
	return a.checkBearer(r, c.value, c.method)
}

// Bearer authenticates a plain HTTP request (POST /v1/tickets) from its
// Authorization header only; the origin policy applies too.
func (a *Authenticator) Bearer(r *http.Request) (Identity, error) {
	id, err := a.bearer(r)
	if err != nil {
		a.logFailure(r, err)
		return Identity{}, err
	}
	return id, nil
}

func (a *Authenticator) bearer(r *http.Request) (Identity, *Error) {
	if err := a.checkOrigin(r); err != nil {
		return Identity{}, err
	}
	bearers, ignored := bearerTokens(r.Header)
	switch len(bearers) {
	case 0:
		return Identity{}, missingToken(ignored, false)
	case 1:
		return a.checkBearer(r, bearers[0], MethodBearer)
	default:
		return Identity{}, fail(http.StatusBadRequest, ReasonMultipleTokens, "present exactly one Authorization: Bearer header")
	}
}

func missingToken(ignoredScheme, websocket bool) *Error {
	msg := "authentication required: send Authorization: Bearer <token>"
	if websocket {
		msg += `, offer the subprotocols "acp" and "acp.bearer.<token>", or add ?ticket=<ticket> from POST /v1/tickets`
	}
	if ignoredScheme {
		msg += " (an Authorization header with a scheme other than Bearer was ignored)"
	}
	return unauthorized(ReasonMissingToken, msg)
}

// checkBearer authenticates a bearer token from either carrier: a static
// token, else (when configured) a JWT.
func (a *Authenticator) checkBearer(r *http.Request, token, method string) (Identity, *Error) {
	if token == "" {
		return Identity{}, unauthorized(ReasonInvalidToken, "the bearer token is empty")
	}
	tenants := a.tenants.Load()
	if tenant, subject, ok := tenants.lookup(token); ok {
		return Identity{Tenant: tenant, Method: method, Subject: subject}, nil
	}
	if a.jwt != nil && strings.Count(token, ".") == 2 {
		tenant, sub, err := a.jwt.verify(r, token, tenants)
		if err != nil {
			return Identity{}, err
		}
		return Identity{Tenant: tenant, Method: MethodJWT, Subject: sub}, nil
	}
	return Identity{}, unauthorized(ReasonInvalidToken, "the bearer token is not valid")
}

// bearerTokens returns the tokens of the Authorization headers using the
// Bearer scheme; ignored reports an Authorization header with another scheme
// (e.g. Basic credentials a browser adds for a proxy in front), which is not
// a carrier.
func bearerTokens(h http.Header) (tokens []string, ignored bool) {
	for _, v := range h.Values("Authorization") {
		v = strings.TrimSpace(v)
		scheme, rest, _ := strings.Cut(v, " ")
		if !strings.EqualFold(scheme, "Bearer") {
			ignored = true
			continue
		}
		tokens = append(tokens, strings.TrimSpace(rest))
	}
	return tokens, ignored
}

func subprotocolEntries(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func isTokenProtocol(p string) bool {
	return len(p) >= len(SubprotocolTokenPrefix) && strings.EqualFold(p[:len(SubprotocolTokenPrefix)], SubprotocolTokenPrefix)
}

func subprotocolTokens(h http.Header) []string {
	var out []string
	for _, p := range subprotocolEntries(h) {
		if isTokenProtocol(p) {
			out = append(out, p[len(SubprotocolTokenPrefix):])
		}
	}
	return out
}

// StripTokenProtocols returns the request's offered subprotocols, in order,
// without any acp.bearer.* entry. The gateway must only ever select "acp":
// a token-carrying entry is never echoed back.
func StripTokenProtocols(r *http.Request) []string {
	var out []string
	for _, p := range subprotocolEntries(r.Header) {
		if !isTokenProtocol(p) {
			out = append(out, p)
		}
	}
	return out
}

func (a *Authenticator) logFailure(r *http.Request, err error) {
	var e *Error
	if errors.As(err, &e) {
		a.log.Info("authentication failed", "reason", e.Reason, "remote", r.RemoteAddr)
		a.onFailure(r, e.Reason)
	}
}
