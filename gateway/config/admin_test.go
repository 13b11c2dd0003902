package config

import (
	"strings"
	"testing"
)

const adminHash = "8d969eef6ecad3c29a3a629280e686cf0c3f5d5a86aff3ca12020c923adc6c92"

func TestAdminParses(t *testing.T) {
	cfg := mustParse(t, "admin:\n  tokens_sha256: ["+adminHash+"]\n")
	if !cfg.Admin.Enabled() || cfg.Admin.TokensSHA256[0] != adminHash || cfg.Admin.JWTClaim != nil {
		t.Fatalf("admin: %+v", cfg.Admin)
	}
	if cfg := mustParse(t, ""); cfg.Admin.Enabled() {
		t.Fatal("the admin API is on by default")
	}
}

func TestAdminProblems(t *testing.T) {
	for name, c := range map[string]struct{ data, msg string }{
		"short hash":         {"admin:\n  tokens_sha256: [abc]\n", "admin.tokens_sha256"},
		"not hex":            {"admin:\n  tokens_sha256: [" + strings.Repeat("g", 64) + "]\n", "not a hex SHA-256"},
		"claim without JWTs": {"admin:\n  jwt_claim: {claim: acpgate_admin, value: \"true\"}\n", "needs auth.jwt"},
		"claim without value": {"admin:\n  tokens_sha256: [" + adminHash + "]\n  jwt_claim: {claim: acpgate_admin}\n",
			"needs claim and value"},
	} {
		t.Run(name, func(t *testing.T) {
			ps := problems(t, c.data)
			if len(ps) == 0 || !strings.Contains(list(ps), c.msg) {
				t.Fatalf("want a problem about %q, got:\n%s", c.msg, list(ps))
			}
		})
	}
}

// An admin token that is also a tenant's is refused however its hex is
// cased.
func TestAdminTokenNotATenantsAnyCase(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	c := Default()
	c.Tenants = []Tenant{{Name: "acme", TokensSHA256: []string{sum}}}
	c.Admin.TokensSHA256 = []string{strings.ToUpper(sum)}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "also a token of tenant") {
		t.Fatalf("Validate: %v", err)
	}
}
