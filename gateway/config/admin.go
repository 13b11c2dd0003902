package config

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Admin says who may use the admin API (/v1/admin/...), served on the
// operations listener (observability.metrics_listen) when one is set,
// else on the main one. Unset: no admin API.
type Admin struct {
	// TokensSHA256 are the hex SHA-256 hashes of the administrators'
	// tokens.
	TokensSHA256 []string `yaml:"tokens_sha256"`
	// JWTClaim makes a JWT (auth.jwt) carrying the claim an
	// administrator's.
	JWTClaim *AdminClaim `yaml:"jwt_claim"`
}

// AdminClaim is a JWT claim and the value that makes an administrator (a
// list claim holding it does too).
type AdminClaim struct {
	// Claim is the JWT claim's name; Value the value that makes an
	// administrator.
	Claim string `yaml:"claim"`
	Value string `yaml:"value"`
}

// Enabled reports whether the admin API is served.
func (a *Admin) Enabled() bool { return len(a.TokensSHA256) > 0 || a.JWTClaim != nil }

func (c *Config) validateAdmin(add addFunc) {
	for i, h := range c.Admin.TokensSHA256 {
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			add("admin.tokens_sha256", "entry %d (%q) is not a hex SHA-256 (64 hex characters)", i, truncate(h, 16))
		}
	}
	for i, h := range c.Admin.TokensSHA256 {
		for _, t := range c.Tenants {
			for _, th := range t.TokensSHA256 {
				if strings.EqualFold(th, h) { // one token, however its hex is written
					add("admin.tokens_sha256", "entry %d is also a token of tenant %q", i, t.Name)
				}
			}
		}
	}
	if j := c.Admin.JWTClaim; j != nil {
		if j.Claim == "" || j.Value == "" {
			add("admin.jwt_claim", "needs claim and value")
		}
		if c.Auth.JWT == nil || len(c.Tenants) == 0 {
			add("admin.jwt_claim", "needs auth.jwt (and tenants) to validate JWTs")
		}
	}
}
