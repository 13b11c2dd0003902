package auth

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

const (
	defaultTenantClaim   = "tenant"
	defaultLeeway        = 30 * time.Second
	defaultJWKSRefresh   = time.Hour
	jwksHTTPTimeout      = 10 * time.Second
	jwksMaxBytes         = 1 << 20
	unknownKIDRefreshGap = 5 * time.Minute
	minHS256SecretBytes  = 32
	maxJWTBytes          = 16 << 10
)

// minJWKSRefresh is the shortest JWKS refresh interval (a variable for tests).
var minJWKSRefresh = time.Second

// asymmetricAlgs are the algorithms accepted with JWKS keys.
var asymmetricAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Key-selection failures, returned by the key function and found again with
// errors.Is in the joined error jwt returns.
var (
	errAlgNotAllowed = errors.New("alg not allowed")
	errUnknownKey    = errors.New("no key for this token")
	errCrit          = errors.New("crit header not supported")
)

type jwtVerifier struct {
	parser      *jwt.Parser
	allowed     []string
	secret      []byte         // HS256; nil if not configured
	keys        jwkset.Storage // JWKS (file and/or URL); nil if not configured
	tenantClaim string
	cancel      context.CancelFunc // ends the JWKS refresh goroutine
	transport   *http.Transport    // JWKS fetches; its idle connections are closed on close
}

func newJWTVerifier(cfg *JWTConfig, now func() time.Time, log *slog.Logger) (*jwtVerifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("auth: jwt: issuer and audience are both required")
	}
	if cfg.JWKSFile == "" && cfg.JWKSURL == "" && cfg.HS256SecretFile == "" {
		return nil, errors.New("auth: jwt: configure at least one of jwks_file, jwks_url, hs256_secret_file")
	}
	leeway := cfg.Leeway
	if leeway == 0 {
		leeway = defaultLeeway
	}
	if leeway < 0 || leeway > 5*time.Minute {
		return nil, fmt.Errorf("auth: jwt: leeway %v out of range (0 to 5m)", leeway)
	}
	v := &jwtVerifier{tenantClaim: cfg.TenantClaim, cancel: func() {}}
	if v.tenantClaim == "" {
		v.tenantClaim = defaultTenantClaim
	}
	if cfg.HS256SecretFile != "" {
		b, err := os.ReadFile(cfg.HS256SecretFile)
		if err != nil {
			return nil, fmt.Errorf("auth: jwt: hs256 secret file: %w", err)
		}
		b = bytes.TrimSpace(b)
		if len(b) < minHS256SecretBytes {
			return nil, fmt.Errorf("auth: jwt: hs256 secret file %s: the secret has %d bytes, at least %d are required",
				cfg.HS256SecretFile, len(b), minHS256SecretBytes)
		}
		v.secret = b
		v.allowed = append(v.allowed, "HS256")
	}
	if cfg.JWKSFile != "" || cfg.JWKSURL != "" {
		if err := v.loadJWKS(cfg, log); err != nil {
			v.close()
			return nil, err
		}
		v.allowed = append(v.allowed, asymmetricAlgs...)
	}
	v.parser = jwt.NewParser(
		jwt.WithValidMethods(v.allowed),
		jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(cfg.Audience),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(now),
	)
	return v, nil
}

func (v *jwtVerifier) loadJWKS(cfg *JWTConfig, log *slog.Logger) error {
	var given jwkset.Storage
	if cfg.JWKSFile != "" {
		raw, err := os.ReadFile(cfg.JWKSFile)
		if err != nil {
			return fmt.Errorf("auth: jwt: jwks file: %w", err)
		}
		given, err = parseJWKS(raw)
		if err != nil {
			return fmt.Errorf("auth: jwt: jwks file %s: %w", cfg.JWKSFile, err)
		}
		if n := usableKeyCount(given); n == 0 {
			return fmt.Errorf("auth: jwt: jwks file %s has no usable signature verification key (RSA >= 2048 bits, EC P-256/384/521, Ed25519)", cfg.JWKSFile)
		}
	}
	if cfg.JWKSURL == "" {
		v.keys = given
		return nil
	}
	u, err := url.Parse(cfg.JWKSURL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("auth: jwt: jwks url %q is not an http(s) URL", cfg.JWKSURL)
	}
	if u.Scheme == "http" && !cfg.InsecureJWKSURL && !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("auth: jwt: jwks url %s: keys fetched over plain http can be forged in transit; use https (or set insecure_jwks_url)", u.Redacted())
	}
	refresh := cfg.JWKSRefreshInterval
	if refresh == 0 {
		refresh = defaultJWKSRefresh
	}
	if refresh < minJWKSRefresh {
		return fmt.Errorf("auth: jwt: jwks refresh interval %v is below %v", refresh, minJWKSRefresh)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	v.transport = http.DefaultTransport.(*http.Transport).Clone()
	redacted := u.Redacted()
	noErrorFirst := false
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
		Client:      &http.Client{Transport: limitedTransport{v.transport}, Timeout: jwksHTTPTimeout},
		Given:       given,
		HTTPTimeout: jwksHTTPTimeout,
		// New fails when the first fetch fails.
		NoErrorReturnFirstHTTPReq: &noErrorFirst,
		// A token with an unknown kid triggers a refresh at most this often;
		// a request waits at most RateLimitWaitMax for it (a wait longer than
		// that fails at once), which also bounds that fetch.
		RateLimitWaitMax:  jwksHTTPTimeout,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(unknownKIDRefreshGap), 1),
		RefreshInterval:   refresh,
		RefreshErrorHandlerFunc: func(string) func(context.Context, error) {
			return func(_ context.Context, err error) {
				if ctx.Err() != nil {
					return // closing
				}
				log.Warn("JWKS refresh failed; keeping the previous keys", "url", redacted, "err", err)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("auth: jwt: jwks url %s: %w", redacted, err)
	}
	v.keys = kf.Storage()
	if usableKeyCount(v.keys) == 0 {
		return fmt.Errorf("auth: jwt: jwks url %s (with jwks file, if any) has no usable signature verification key", redacted)
	}
	return nil
}

func (v *jwtVerifier) close() {
	v.cancel()
	if v.transport != nil {
		v.transport.CloseIdleConnections()
	}
}

// limitedTransport caps JWKS response bodies.
type limitedTransport struct{ rt http.RoundTripper }

func (t limitedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(r)
	if err == nil {
		resp.Body = limitedBody{io.LimitReader(resp.Body, jwksMaxBytes), resp.Body}
	}
	return resp, err
}

type limitedBody struct {
	io.Reader
	io.Closer
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// parseJWKS reads a JWK Set, skipping key types jwkset does not support
// (as the URL storage does); any other bad key is an error.
func parseJWKS(raw []byte) (jwkset.Storage, error) {
	var set jwkset.JWKSMarshal
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, fmt.Errorf("not a JWK Set: %w", err)
	}
	store := jwkset.NewMemoryStorage()
	for i, m := range set.Keys {
		k, err := jwkset.NewJWKFromMarshal(m, jwkset.JWKMarshalOptions{Private: true}, jwkset.JWKValidateOptions{})
		if errors.Is(err, jwkset.ErrUnsupportedKey) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if err := store.KeyWrite(context.Background(), k); err != nil {
			return nil, err
		}
	}
	return store, nil
}

func usableKeyCount(s jwkset.Storage) int {
	all, err := s.KeyReadAll(context.Background())
	if err != nil {
		return 0
	}
	n := 0
	for _, k := range all {
		for _, alg := range asymmetricAlgs {
			if _, ok := usableKey(k, alg); ok {
				n++
				break
			}
		}
	}
	return n
}

// usableKey returns k's public key if it may verify a token signed with
// alg: its use (if any) is "sig", its key_ops (if any) include "verify", its
// alg (if any) is alg, and its key type fits alg.
func usableKey(k jwkset.JWK, alg string) (any, bool) {
	m := k.Marshal()
	if m.USE != "" && m.USE != jwkset.UseSig {
		return nil, false
	}
	if len(m.KEYOPS) > 0 && !slices.Contains(m.KEYOPS, jwkset.KeyOpsVerify) {
		return nil, false
	}
	if m.ALG != "" && m.ALG.String() != alg {
		return nil, false
	}
	key := k.Key()
	if pk, ok := key.(interface{ Public() crypto.PublicKey }); ok {
		key = pk.Public()
	}
	return key, keyFitsAlg(key, alg)
}

// keyFitsAlg pins each algorithm to its key type (and curve).
func keyFitsAlg(key any, alg string) bool {
	switch alg {
	case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512":
		k, ok := key.(*rsa.PublicKey)
		return ok && k.N.BitLen() >= 2048
	case "ES256", "ES384", "ES512":
		k, ok := key.(*ecdsa.PublicKey)
		if !ok {
			return false
		}
		want := map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}[alg]
		return k.Curve == want
	case "EdDSA":
		_, ok := key.(ed25519.PublicKey)
		return ok
	}
	return false
}

// keyFunc picks the verification key for a token whose alg the parser has
// already checked against the allowed list.
func (v *jwtVerifier) keyFunc(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		if _, ok := t.Header["crit"]; ok {
			return nil, errCrit
		}
		alg := t.Method.Alg()
		if alg == "HS256" {
			if v.secret == nil {
				return nil, errAlgNotAllowed
			}
			return v.secret, nil
		}
		if v.keys == nil || !slices.Contains(asymmetricAlgs, alg) {
			return nil, errAlgNotAllowed
		}
		if kidv, ok := t.Header["kid"]; ok {
			kid, ok := kidv.(string)
			if !ok {
				return nil, errUnknownKey
			}
			k, err := v.keys.KeyRead(ctx, kid) // may refresh the JWKS URL (rate-limited)
			if err != nil {
				return nil, errUnknownKey
			}
			key, ok := usableKey(k, alg)
			if !ok {
				return nil, errAlgNotAllowed
			}
			return key, nil
		}
		all, err := v.keys.KeyReadAll(ctx)
		if err != nil {
			return nil, errUnknownKey
		}
		var set jwt.VerificationKeySet
		for _, k := range all {
			if key, ok := usableKey(k, alg); ok {
				set.Keys = append(set.Keys, key)
			}
		}
		if len(set.Keys) == 0 {
			return nil, errUnknownKey
		}
		return set, nil
	}
}

// verify checks a JWT and returns its tenant and subject.
func (v *jwtVerifier) verify(r *http.Request, token string, tenants *tenantTable) (tenant, subject string, _ *Error) {
	claims, jerr := v.claims(r, token)
	if jerr != nil {
		return "", "", jerr
	}
	subject, jerr = jwtSubject(claims)
	if jerr != nil {
		return "", "", jerr
	}
	tenant, ok := claims[v.tenantClaim].(string)
	if !ok || tenant == "" {
		return "", "", fail(http.StatusForbidden, ReasonMissingTenant,
			fmt.Sprintf("the token has no %q claim naming a tenant", v.tenantClaim))
	}
	if !tenants.has(tenant) {
		return "", "", fail(http.StatusForbidden, ReasonUnknownTenant, "the token's tenant is not configured on this gateway")
	}
	return tenant, subject, nil
}

// jwtSubject is the subject of a verified JWT: JWTSubjectPrefix and its
// sub claim. Without a non-empty string sub the token names nobody: it is
// refused (401) rather than given a subject every such token would share.
func jwtSubject(claims jwt.MapClaims) (string, *Error) {
	v, present := claims["sub"]
	sub, isString := v.(string)
	switch {
	case !present:
		return "", unauthorized(ReasonMissingSubject, "the token has no subject (sub): it must name its user")
	case !isString:
		return "", unauthorized(ReasonMissingSubject, "the token's subject (sub) is not a string")
	case sub == "":
		return "", unauthorized(ReasonMissingSubject, "the token's subject (sub) is empty")
	}
	return JWTSubjectPrefix + sub, nil
}

// claims checks a JWT (signature, issuer, audience, times) and returns
// its claims.
func (v *jwtVerifier) claims(r *http.Request, token string) (jwt.MapClaims, *Error) {
	if len(token) > maxJWTBytes {
		return nil, unauthorized(ReasonInvalidToken, "the token is too long")
	}
	claims := jwt.MapClaims{}
	tok, err := v.parser.ParseWithClaims(token, claims, v.keyFunc(r.Context()))
	if err != nil {
		return nil, v.jwtError(tok, claims, err)
	}
	return claims, nil
}

// jwtError maps a jwt/v5 error to an *Error. The library's own text is not
// passed on.
func (v *jwtVerifier) jwtError(tok *jwt.Token, claims jwt.MapClaims, err error) *Error {
	algAllowed := tok != nil && tok.Method != nil && slices.Contains(v.allowed, tok.Method.Alg())
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return unauthorized(ReasonInvalidToken, "the token is malformed")
	case errors.Is(err, errAlgNotAllowed):
		return unauthorized(ReasonAlgNotAllowed, "the token's signing algorithm does not fit the configured keys")
	case errors.Is(err, errUnknownKey):
		return unauthorized(ReasonUnknownKey, "no configured key matches the token (kid/alg)")
	case errors.Is(err, errCrit):
		return unauthorized(ReasonInvalidToken, "tokens with critical header parameters are not supported")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid) && !algAllowed,
		errors.Is(err, jwt.ErrTokenUnverifiable) && (tok == nil || tok.Method == nil):
		return unauthorized(ReasonAlgNotAllowed, "the token's signing algorithm is not accepted")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return unauthorized(ReasonBadSignature, "the token's signature is not valid")
	case errors.Is(err, jwt.ErrTokenExpired):
		return unauthorized(ReasonExpiredToken, "the token has expired")
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return unauthorized(ReasonNotYetValid, "the token is not valid yet (nbf)")
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return unauthorized(ReasonWrongIssuer, "the token's issuer (iss) is not accepted")
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return unauthorized(ReasonWrongAudience, "the token's audience (aud) does not include this gateway")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		// Which one: the library says so only in its text.
		if _, ok := claims["iss"]; !ok {
			return unauthorized(ReasonWrongIssuer, "the token has no issuer (iss)")
		}
		if _, ok := claims["aud"]; !ok {
			return unauthorized(ReasonWrongAudience, "the token has no audience (aud)")
		}
		if _, ok := claims["exp"]; !ok {
			return unauthorized(ReasonInvalidToken, "the token has no expiry (exp)")
		}
	}
	return unauthorized(ReasonInvalidToken, "the token is not valid")
}
