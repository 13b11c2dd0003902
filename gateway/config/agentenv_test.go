package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// agentEnvTenants is sandboxTenants with tenant a given agent_env (YAML
// flow mapping) and a credential file outside every sandbox path.
func agentEnvTenants(t *testing.T, agentEnv string) (yaml, dir, secret string) {
	t.Helper()
	yaml, dir = sandboxTenants(t, "session.key", "homes")
	secret = filepath.Join(dir, "a.key")
	if err := os.WriteFile(secret, []byte("sk-a-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml = strings.Replace(yaml, "{name: a,", "{name: a, agent_env: "+strings.ReplaceAll(agentEnv, "SECRET", secret)+",", 1)
	return yaml, dir, secret
}

func TestAgentEnvParses(t *testing.T) {
	y, _, secret := agentEnvTenants(t, "{ANTHROPIC_API_KEY: {file: SECRET}, OTHER: {env: GW_VAR}}")
	cfg := mustParse(t, y)
	got := cfg.Tenants[0].AgentEnv
	if got["ANTHROPIC_API_KEY"] != (AgentEnvSource{File: secret}) || got["OTHER"] != (AgentEnvSource{Env: "GW_VAR"}) {
		t.Errorf("agent_env = %+v", got)
	}
	if len(cfg.Tenants[1].AgentEnv) != 0 {
		t.Errorf("tenant b got agent_env %+v", cfg.Tenants[1].AgentEnv)
	}
}

func TestAgentEnvProblems(t *testing.T) {
	for name, c := range map[string]struct{ agentEnv, extra, want string }{
		"bad name":         {`{"A=B": {file: SECRET}}`, "", `"A=B" is not a valid environment variable name`},
		"HOME":             {"{HOME: {file: SECRET}}", "", "HOME is set by the gateway for every agent"},
		"TMPDIR":           {"{TMPDIR: {file: SECRET}}", "", "TMPDIR is set by the gateway"},
		"sandbox spec":     {"{ACPGATE_SUPERVISE_SANDBOX: {file: SECRET}}", "", "ACPGATE_* variables are the gateway's own"},
		"trace attributes": {"{OTEL_RESOURCE_ATTRIBUTES: {file: SECRET}}", "", "name the agent and tenant in traces"},
		"both sources":     {"{K: {file: SECRET, env: X}}", "", "agent_env.K: give exactly one of file: PATH or env: NAME"},
		"no source":        {"{K: {}}", "", "give exactly one of"},
		"relative file":    {"{K: {file: a.key}}", "", `file "a.key" must be an absolute path`},
		"bad env name":     {`{K: {env: "X=1"}}`, "", `env "X=1" is not a valid`},
		"unknown key":      {"{K: {path: SECRET}}", "", "field path not found"},
		"inherited source": {"{K: {env: PATH}}", "", `env PATH is in agent "default"'s inherit_env, so every tenant's agents would get it`},
		"shared isolation": {"{K: {file: SECRET}}", "pool: {isolation: shared}\n", "needs pool.isolation: tenant"},
		"named agent shared": {"{K: {file: SECRET}}", "agents: {x: {pool: {isolation: shared}}, y: {}}\ndefault_agent: y\n",
			`agent "x" has isolation: shared`},
		"sandbox off":  {"{K: {file: SECRET}}", "", "needs the sandbox"},
		"file in root": {"{K: {file: @ROOT@/a.key}}", "", "tenants[0].agent_env.K @ROOT@/a.key is readable by tenant \"a\"'s agents"},
	} {
		t.Run(name, func(t *testing.T) {
			y, dir, _ := agentEnvTenants(t, strings.ReplaceAll(c.agentEnv, "@ROOT@", "@DIR@/a"))
			y = strings.ReplaceAll(y, "@DIR@", dir)
			if strings.Contains(name, "shared") { // one tenant: two are refused shared isolation anyway
				y = oneTenant(y)
			}
			if name == "sandbox off" {
				y = strings.Replace(y, "sandbox: {", "sandbox: {mode: off, ", 1)
			}
			if name == "file in root" {
				if err := os.WriteFile(filepath.Join(dir, "a", "a.key"), []byte("v"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want := strings.ReplaceAll(c.want, "@ROOT@", filepath.Join(dir, "a"))
			var all []string
			for _, p := range problems(t, y+c.extra) {
				all = append(all, p.String())
			}
			if !strings.Contains(strings.Join(all, "\n"), want) {
				t.Errorf("problems lack %q:\n%s", want, strings.Join(all, "\n"))
			}
		})
	}
	// The tenant uses only agent y, of tenant isolation: another agent's
	// shared pool is no problem.
	y, _, _ := agentEnvTenants(t, "{K: {file: SECRET}}")
	y = strings.Replace(oneTenant(y), "{name: a,", "{name: a, agents: [y],", 1)
	mustParse(t, y+"agents: {x: {pool: {isolation: shared}}, y: {}}\ndefault_agent: y\n")
}

// oneTenant drops tenant b from agentEnvTenants' YAML.
func oneTenant(y string) string {
	var out []string
	for _, l := range strings.Split(y, "\n") {
		if !strings.Contains(l, "{name: b,") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestAgentEnvReadValue(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for data, want := range map[string]string{"value-01\n": "value-01", "value-02": "value-02", "value-03\r\n": "value-03", "multi\nline\n\n": "multi\nline\n"} {
		if got, err := (AgentEnvSource{File: write("f", data)}).ReadValue(); err != nil || got != want {
			t.Errorf("file %q: %q, %v; want %q", data, got, err, want)
		}
	}
	t.Setenv("AGENTENV_TEST_VAR", "from-env")
	if got, err := (AgentEnvSource{Env: "AGENTENV_TEST_VAR"}).ReadValue(); err != nil || got != "from-env" {
		t.Errorf("env: %q, %v", got, err)
	}

	const secret = "s3cr3t-never-shown"
	real := write("real", secret+"\n")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := write("unreadable", secret)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTENV_EMPTY", "")
	for name, c := range map[string]struct {
		src  AgentEnvSource
		want string
	}{
		"symlink":   {AgentEnvSource{File: link}, "is a symbolic link; refused"},
		"fifo":      {AgentEnvSource{File: fifo}, "is not a regular file"},
		"directory": {AgentEnvSource{File: dir}, "is not a regular file"},
		"missing":   {AgentEnvSource{File: filepath.Join(dir, "nope")}, "no such file"},
		"empty":     {AgentEnvSource{File: write("empty", "\n")}, "is empty"},
		"NUL":       {AgentEnvSource{File: write("nul", secret+"\x00x")}, "NUL byte"},
		"short":     {AgentEnvSource{File: write("short", "1234567\n")}, "shorter than 8 bytes"},
		"too big":   {AgentEnvSource{File: write("big", secret+strings.Repeat("x", 64<<10))}, "over 65536 bytes"},
		"unset env": {AgentEnvSource{Env: "AGENTENV_TEST_UNSET"}, "AGENTENV_TEST_UNSET is not set"},
		"empty env": {AgentEnvSource{Env: "AGENTENV_EMPTY"}, "is empty"},
	} {
		v, err := c.src.ReadValue()
		if err == nil || !strings.Contains(err.Error(), c.want) || v != "" {
			t.Errorf("%s: %q, %v; want an error saying %q", name, v, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
	if os.Geteuid() != 0 { // root reads a mode-0 file
		if _, err := (AgentEnvSource{File: unreadable}).ReadValue(); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("unreadable: %v", err)
		}
	}
}
