package config

import (
	"strings"
	"testing"
	"time"
)

// A named agent starts from the agent: block's settings (not its command)
// and the top-level pool, with its own keys laid over them; other agents
// keep the defaults, and nothing is shared between them.
func TestNamedAgentsInheritDefaults(t *testing.T) {
	cfg := mustParse(t, `
agent:
  stop_grace: 7s
  env: {SHARED: "1"}
pool:
  max_processes: 9
  min_idle: 2
agents:
  claude:
    command: ["npx", "claude-code-acp"]
    env: {ONLY_CLAUDE: "x"}
    pool: {max_processes: 3}
  codex:
    command: ["codex-acp"]
    init_timeout: 5s
default_agent: claude
`)
	list := cfg.AgentList()
	if len(list) != 2 || list[0].Name != "claude" || list[1].Name != "codex" {
		t.Fatalf("AgentList = %+v, want claude, codex", list)
	}
	claude, codex := list[0], list[1]
	if got := strings.Join(claude.Command, " "); got != "npx claude-code-acp" {
		t.Errorf("claude command = %q", got)
	}
	if claude.Pool.MaxProcesses != 3 || claude.Pool.MinIdle != 2 || claude.Pool.Isolation != "tenant" {
		t.Errorf("claude pool = %+v, want max_processes 3 over the top-level min_idle 2", claude.Pool)
	}
	if codex.Pool.MaxProcesses != 9 {
		t.Errorf("codex pool max_processes = %d, want the top-level 9", codex.Pool.MaxProcesses)
	}
	if claude.StopGrace.D() != 7*time.Second || codex.StopGrace.D() != 7*time.Second {
		t.Errorf("stop_grace = %v, %v, want agent:'s 7s for both", claude.StopGrace, codex.StopGrace)
	}
	if codex.InitTimeout.D() != 5*time.Second || claude.InitTimeout.D() != 60*time.Second {
		t.Errorf("init_timeout = %v (claude), %v (codex)", claude.InitTimeout, codex.InitTimeout)
	}
	if claude.Env["SHARED"] != "1" || claude.Env["ONLY_CLAUDE"] != "x" {
		t.Errorf("claude env = %v, want SHARED and ONLY_CLAUDE", claude.Env)
	}
	if _, leaked := codex.Env["ONLY_CLAUDE"]; leaked || cfg.Agent.Env["ONLY_CLAUDE"] != "" {
		t.Errorf("claude's env leaked: codex %v, agent: %v", codex.Env, cfg.Agent.Env)
	}
	if len(claude.InheritEnv) == 0 || claude.InheritEnv[0] != "PATH" {
		t.Errorf("inherit_env = %v, want the defaults", claude.InheritEnv)
	}
	if cfg.DefaultAgentOf() != "claude" {
		t.Errorf("DefaultAgentOf = %q", cfg.DefaultAgentOf())
	}
}

// The single agent: block is one agent named "default", served at /acp.
func TestSingleAgentIsDefault(t *testing.T) {
	cfg := mustParse(t, "agent:\n  command: [\"my-agent\"]\npool: {max_processes: 4}\n")
	list := cfg.AgentList()
	if len(list) != 1 || list[0].Name != DefaultAgentName || list[0].Command[0] != "my-agent" || list[0].Pool.MaxProcesses != 4 {
		t.Fatalf("AgentList = %+v", list)
	}
	if cfg.DefaultAgentOf() != DefaultAgentName {
		t.Errorf("DefaultAgentOf = %q", cfg.DefaultAgentOf())
	}
}

func TestAgentsProblems(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"no default with two", "agents:\n  a: {}\n  b: {}\n", "no default_agent"},
		{"unknown default", "agents:\n  a: {}\ndefault_agent: b\n", `default_agent: "b" is not a configured agent`},
		{"default of the single agent", "default_agent: claude\n", `"claude" is not a configured agent (agents: default)`},
		{"bad name", "agents:\n  \"a/b\": {}\n", `"a/b" is not an agent name`},
		{"dotted name", "agents:\n  a.b: {}\n", `"a.b" is not an agent name`},
		{"command in both", "agent:\n  command: [x]\nagents:\n  a: {}\n", "agent.command: is set and so is agents:"},
		{"bad pool", "agents:\n  a:\n    pool: {max_processes: 0, min_idle: 0}\n", "agents.a.pool.max_processes: must be at least 1"},
		{"bad isolation", "agents:\n  a:\n    pool: {isolation: nope}\n", `agents.a.pool.isolation: "nope" is not tenant or shared`},
		{"bad env", "agents:\n  a:\n    env: {\"A=B\": x}\n", `agents.a.env: "A=B" is not a valid environment variable name`},
		{"bad grace", "agents:\n  a:\n    stop_grace: 0s\n", "agents.a.stop_grace: must be positive"},
		{"bad cost total", "agents:\n  a:\n    usage: {cost_total: per_turn}\n", `agents.a.usage.cost_total: "per_turn" is not per_load or per_session`},
		{"bad agent cost total", "agent:\n  usage: {cost_total: session}\n", `agent.usage.cost_total: "session" is not per_load or per_session`},
		{"unknown key", "agents:\n  a:\n    comand: [x]\n", "field comand not found"},
		{"bad policy", "agents:\n  a:\n    policy: {mcp: {http_hosts: [\"\"]}}\n", "agents.a.policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := problems(t, tc.yaml)
			var all []string
			for _, p := range ps {
				all = append(all, p.String())
			}
			if !strings.Contains(strings.Join(all, "\n"), tc.want) {
				t.Errorf("problems:\n%s\nwant one containing %q", strings.Join(all, "\n"), tc.want)
			}
		})
	}
}

// A tenant's agents list must name configured agents; MayUse follows it.
func TestTenantAgents(t *testing.T) {
	root := t.TempDir()
	base := "agents:\n  a: {}\n  b: {}\ndefault_agent: a\nsandbox: {mode: off}\ntenants:\n  - name: acme\n    tokens_sha256: [\"" +
		strings.Repeat("ab", 32) + "\"]\n    root: " + root + "\n"
	cfg := mustParse(t, base+"    agents: [b]\n")
	ten := &cfg.Tenants[0]
	if ten.MayUse("a") || !ten.MayUse("b") {
		t.Errorf("MayUse a=%v b=%v, want only b", ten.MayUse("a"), ten.MayUse("b"))
	}
	cfg = mustParse(t, base)
	if !cfg.Tenants[0].MayUse("a") || !cfg.Tenants[0].MayUse("b") {
		t.Error("a tenant without agents: may not use every agent")
	}
	ps := problems(t, base+"    agents: [c]\n")
	if !strings.Contains(ps[0].String(), `tenants[0].agents: "c" is not a configured agent (agents: a, b)`) {
		t.Errorf("problems = %v", ps)
	}
}

// An agent's policy keys lie over the global policy; a tenant's own keys
// lie over those and win.
func TestAgentPolicyLayers(t *testing.T) {
	root := t.TempDir()
	cfg := mustParse(t, `
policy:
  session: {load: true, list: true}
agents:
  a:
    policy: {session: {load: false, list: false}}
  b: {}
default_agent: a
sandbox: {mode: off}
tenants:
  - name: acme
    tokens_sha256: ["`+strings.Repeat("ab", 32)+`"]
    root: `+root+`
    policy: {session: {list: true}}
`)
	if p := cfg.AgentPolicy("a"); p.Session.Load || p.Session.List {
		t.Errorf("agent a policy: load %v list %v, want both off", p.Session.Load, p.Session.List)
	}
	if p := cfg.AgentPolicy("b"); !p.Session.Load {
		t.Error("agent b lost the global session.load")
	}
	p := cfg.TenantAgentPolicy(&cfg.Tenants[0], "a")
	if p.Session.Load || !p.Session.List {
		t.Errorf("tenant with agent a: load %v list %v, want load off (agent) and list on (tenant)", p.Session.Load, p.Session.List)
	}
}

// Per-agent sandbox paths join the agent's processes' view, and only its.
func TestAgentSandboxPaths(t *testing.T) {
	root, extra := t.TempDir(), t.TempDir()
	cfg := mustParse(t, `
agents:
  a:
    sandbox: {read_only: [`+extra+`]}
  b: {}
default_agent: a
sandbox: {home: `+t.TempDir()+`}
tenants:
  - name: acme
    tokens_sha256: ["`+strings.Repeat("ab", 32)+`"]
    root: `+root+`
`)
	ro, _ := cfg.SandboxPaths(&cfg.Tenants[0], cfg.AgentNamed("a"))
	if !contains(ro, extra) {
		t.Errorf("agent a read-only %v lacks %s", ro, extra)
	}
	ro, _ = cfg.SandboxPaths(&cfg.Tenants[0], cfg.AgentNamed("b"))
	if contains(ro, extra) {
		t.Errorf("agent b read-only %v has agent a's %s", ro, extra)
	}
	ps := problems(t, "agents:\n  a:\n    sandbox: {read_only: [relative]}\nsandbox: {mode: required}\n")
	if !strings.Contains(ps[0].String(), `agents.a.sandbox.read_only: "relative" must be an absolute path`) {
		t.Errorf("problems = %v", ps)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// policy.models.allow layers like every policy key: the top level, an
// agent's over it, a tenant's over those; absent keeps the layer below,
// [] allows no model.
func TestModelAllowLayers(t *testing.T) {
	root, root2 := t.TempDir(), t.TempDir()
	cfg := mustParse(t, `
policy:
  models: {allow: ["claude-sonnet-*"]}
agents:
  a:
    policy: {models: {allow: ["claude-haiku-*"]}}
  b: {}
default_agent: a
sandbox: {mode: off}
tenants:
  - name: acme
    tokens_sha256: ["`+strings.Repeat("ab", 32)+`"]
    root: `+root+`
    policy: {models: {allow: []}}
  - name: beta
    tokens_sha256: ["`+strings.Repeat("cd", 32)+`"]
    root: `+root2+`
`)
	if got := cfg.GlobalPolicy().Models.Allow; len(got) != 1 || got[0] != "claude-sonnet-*" {
		t.Errorf("global: %q", got)
	}
	if got := cfg.AgentPolicy("a").Models.Allow; len(got) != 1 || got[0] != "claude-haiku-*" {
		t.Errorf("agent a: %q", got)
	}
	if got := cfg.AgentPolicy("b").Models.Allow; len(got) != 1 || got[0] != "claude-sonnet-*" {
		t.Errorf("agent b: %q", got)
	}
	if got := cfg.TenantAgentPolicy(&cfg.Tenants[0], "a").Models; got.Allow == nil || len(got.Allow) != 0 || got.Allows("claude-haiku-4") {
		t.Errorf("acme with a: %#v, want an empty list (no model)", got)
	}
	if got := cfg.TenantAgentPolicy(&cfg.Tenants[1], "a").Models.Allow; len(got) != 1 || got[0] != "claude-haiku-*" {
		t.Errorf("beta with a: %q", got)
	}
	if !mustParse(t, "sandbox: {mode: off}\n").GlobalPolicy().Models.Allows("any") {
		t.Error("no list: every model")
	}
	ps := problems(t, "policy: {models: {allow: [\"\"]}}\n")
	if len(ps) == 0 || !strings.Contains(ps[0].String(), "models.allow") {
		t.Errorf("problems = %v", ps)
	}
}

// policy.modes.allow layers as policy.models.allow does, and check-config
// refuses a bad pattern in it.
func TestModeAllowLayers(t *testing.T) {
	root := t.TempDir()
	cfg := mustParse(t, `
policy:
  modes: {allow: ["default", "plan"]}
agents:
  a:
    policy: {modes: {allow: ["default"]}}
  b: {}
default_agent: a
sandbox: {mode: off}
tenants:
  - name: acme
    tokens_sha256: ["`+strings.Repeat("ab", 32)+`"]
    root: `+root+`
    policy: {modes: {allow: []}}
`)
	if got := cfg.GlobalPolicy().Modes.Allow; strings.Join(got, ",") != "default,plan" {
		t.Errorf("global: %q", got)
	}
	if got := cfg.AgentPolicy("a").Modes.Allow; strings.Join(got, ",") != "default" {
		t.Errorf("agent a: %q", got)
	}
	if got := cfg.AgentPolicy("b").Modes; !got.Allows("plan") || got.Allows("bypassPermissions") {
		t.Errorf("agent b: %q", got.Allow)
	}
	if got := cfg.TenantAgentPolicy(&cfg.Tenants[0], "a").Modes; got.Allow == nil || got.Allows("default") {
		t.Errorf("acme with a: %#v, want an empty list (no mode)", got)
	}
	if !mustParse(t, "sandbox: {mode: off}\n").GlobalPolicy().Modes.Allows("bypassPermissions") {
		t.Error("no list: every mode")
	}
	if !strings.Contains(cfg.GlobalPolicy().Describe(), "modes:\n  allow:\n    - \"default\"\n    - \"plan\"\n") {
		t.Errorf("check-config's policy:\n%s", cfg.GlobalPolicy().Describe())
	}
	ps := problems(t, "policy: {modes: {allow: [\"\"]}}\n")
	if len(ps) == 0 || !strings.Contains(ps[0].String(), "modes.allow") {
		t.Errorf("problems = %v", ps)
	}
}

// usage.cost_total is per_load unless set; a named agent takes agent:'s
// and may set its own.
func TestAgentCostTotal(t *testing.T) {
	cfg := mustParse(t, `
agent:
  usage: {cost_total: per_session}
agents:
  a: {}
  b:
    usage: {cost_total: per_load}
default_agent: a
`)
	if got := cfg.AgentNamed("a").Usage.CostTotal; got != CostPerSession {
		t.Errorf("a: cost_total %q, want agent:'s %q", got, CostPerSession)
	}
	if got := cfg.AgentNamed("b").Usage.CostTotal; got != CostPerLoad {
		t.Errorf("b: cost_total %q, want its own %q", got, CostPerLoad)
	}
	if got := mustParse(t, "agent: {}\n").Agent.Usage.CostTotal; got != CostPerLoad {
		t.Errorf("default cost_total %q, want %q", got, CostPerLoad)
	}
}
