package config

import (
	"slices"
	"strings"
	"testing"
)

// policy.meta.allow layers like every policy key: the top level, an
// agent's over it, a tenant's over those; absent keeps the layer below.
// MetaWarnings names each tenant and agent whose list lets claudeCode
// through.
func TestMetaAllowLayersAndWarns(t *testing.T) {
	root, root2 := t.TempDir(), t.TempDir()
	cfg := mustParse(t, `
policy:
  meta: {allow: ["foo"]}
agents:
  a:
    policy: {meta: {allow: ["zed.dev/*"]}}
  b: {}
default_agent: a
sandbox: {mode: off}
tenants:
  - name: acme
    tokens_sha256: ["`+strings.Repeat("ab", 32)+`"]
    root: `+root+`
    policy: {meta: {allow: ["claude*"]}}
  - name: beta
    tokens_sha256: ["`+strings.Repeat("cd", 32)+`"]
    root: `+root2+`
    agents: [b]
`)
	for _, c := range []struct {
		who  string
		got  []string
		want []string
	}{
		{"global", cfg.GlobalPolicy().Meta.Allow, []string{"foo"}},
		{"agent a", cfg.AgentPolicy("a").Meta.Allow, []string{"zed.dev/*"}},
		{"agent b", cfg.AgentPolicy("b").Meta.Allow, []string{"foo"}},
		{"acme with a", cfg.TenantAgentPolicy(&cfg.Tenants[0], "a").Meta.Allow, []string{"claude*"}},
		{"beta with a", cfg.TenantAgentPolicy(&cfg.Tenants[1], "a").Meta.Allow, []string{"zed.dev/*"}},
		{"beta with b", cfg.TenantAgentPolicy(&cfg.Tenants[1], "b").Meta.Allow, []string{"foo"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %q, want %q", c.who, c.got, c.want)
		}
	}
	if p := cfg.TenantAgentPolicy(&cfg.Tenants[1], "b").Meta; !p.Allows([]byte("foo")) || p.Allows([]byte("claudeCode")) || !p.Allows([]byte("traceparent")) {
		t.Errorf("beta with b: %q", p.Allow)
	}
	// acme may use both agents; beta only b, whose list is safe.
	ws := cfg.MetaWarnings()
	if len(ws) != 2 || !strings.HasPrefix(ws[0], `tenant "acme" with agent "a": policy.meta.allow lets _meta.claudeCode through ("claude*")`) ||
		!strings.HasPrefix(ws[1], `tenant "acme" with agent "b"`) || !strings.Contains(ws[0], "executableArgs") {
		t.Errorf("warnings: %q", ws)
	}
	// Without tenants: per agent.
	ws = mustParse(t, "sandbox: {mode: off}\npolicy: {meta: {allow: [\"*\"]}}\n").MetaWarnings()
	if len(ws) != 1 || !strings.HasPrefix(ws[0], `agent "default": policy.meta.allow lets _meta.claudeCode through ("*")`) {
		t.Errorf("warnings without tenants: %q", ws)
	}
	if ws := mustParse(t, "sandbox: {mode: off}\n").MetaWarnings(); len(ws) != 0 {
		t.Errorf("default: %q", ws)
	}
	ps := problems(t, "policy: {meta: {allow: [\"\"]}}\n")
	if len(ps) == 0 || !strings.Contains(ps[0].String(), "meta.allow") {
		t.Errorf("problems = %v", ps)
	}
}
