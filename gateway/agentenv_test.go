package gateway

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/syncbuf"
)

// credsConfig has tenants acme (its key from a file, over the agent's own
// value) and globex (from the gateway's environment), and agent env that
// both share.
func credsConfig(t *testing.T) (*config.Config, string) {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "acme.key")
	if err := os.WriteFile(key, []byte("acme-secret-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GLOBEX_KEY_SOURCE", "globex-secret")
	cfg := config.Default()
	cfg.Sandbox.Home = t.TempDir()
	cfg.Agent.Env = map[string]string{"API_KEY": "agent-default", "SHARED": "1"}
	cfg.Agent.InheritEnv = []string{"PATH", "GLOBEX_ONLY"}
	cfg.Tenants = []config.Tenant{
		{Name: "acme", Root: t.TempDir(), AgentEnv: map[string]config.AgentEnvSource{"API_KEY": {File: key}}},
		{Name: "globex", Root: t.TempDir(), AgentEnv: map[string]config.AgentEnvSource{"GLOBEX_ONLY": {Env: "GLOBEX_KEY_SOURCE"}}},
		{Name: "initech", Root: t.TempDir()},
	}
	return cfg, key
}

// Each tenant's process gets its own credentials over the agent's env
// (and over an inherited variable of the same name), and no other
// tenant's; a process of no tenant gets none.
func TestLaunchTenantCredentials(t *testing.T) {
	cfg, _ := credsConfig(t)
	creds, err := newAgentCreds(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GLOBEX_ONLY", "inherited")
	l := &launcher{log: slog.New(slog.DiscardHandler), creds: creds}
	l.cfg.Store(cfg)
	env := func(tenant string) []string {
		t.Helper()
		launch, err := l.launch(config.DefaultAgentName, "", tenant)
		if err != nil {
			t.Fatal(err)
		}
		return launch.Env
	}
	for tenant, c := range map[string]struct{ want, not []string }{
		"acme":    {want: []string{"API_KEY=acme-secret-1", "SHARED=1", "GLOBEX_ONLY=inherited"}, not: []string{"globex-secret", "agent-default"}},
		"globex":  {want: []string{"API_KEY=agent-default", "GLOBEX_ONLY=globex-secret"}, not: []string{"acme-secret", "inherited"}},
		"initech": {want: []string{"API_KEY=agent-default", "GLOBEX_ONLY=inherited"}, not: []string{"acme-secret", "globex-secret"}},
		"":        {want: []string{"API_KEY=agent-default"}, not: []string{"acme-secret", "globex-secret"}},
	} {
		got := env(tenant)
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("tenant %q: environment lacks %s: %v", tenant, w, got)
			}
		}
		all := strings.Join(got, "\n")
		for _, n := range c.not {
			if strings.Contains(all, n) {
				t.Errorf("tenant %q: environment holds %q: %v", tenant, n, got)
			}
		}
		seen := map[string]bool{}
		for _, kv := range got {
			k, _, _ := strings.Cut(kv, "=")
			if seen[k] {
				t.Errorf("tenant %q: %s set twice: %v", tenant, k, got)
			}
			seen[k] = true
		}
	}
}

// A reload re-reads the credentials: a changed file is a change of its
// tenant's; an unreadable one keeps the value read before and is logged
// without it; a new variable that cannot be read refuses the reload.
func TestAgentCredsReload(t *testing.T) {
	cfg, key := credsConfig(t)
	var logs syncbuf.Buffer
	creds, err := newAgentCreds(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if next, changed, err := creds.read(cfg); err != nil || len(changed) != 0 || next["acme"]["API_KEY"] != "acme-secret-1" {
		t.Fatalf("unchanged: %v, %v", changed, err)
	}

	if err := os.WriteFile(key, []byte("acme-secret-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	next, changed, err := creds.read(cfg)
	if err != nil || !slices.Equal(changed, []string{"acme"}) || next["acme"]["API_KEY"] != "acme-secret-2" {
		t.Fatalf("rotated: %v, %v", changed, err)
	}
	creds.set(next)
	if got := creds.of("acme")["API_KEY"]; got != "acme-secret-2" {
		t.Errorf("after set: %q", got)
	}

	// Replaced by a symbolic link: refused, the old value kept.
	other := filepath.Join(filepath.Dir(key), "elsewhere")
	if err := os.WriteFile(other, []byte("acme-secret-3-via-link\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, key); err != nil {
		t.Fatal(err)
	}
	next, changed, err = creds.read(cfg)
	if err != nil || len(changed) != 0 || next["acme"]["API_KEY"] != "acme-secret-2" {
		t.Fatalf("symlink: %v, %v, kept %v", changed, err, next["acme"]["API_KEY"] == "acme-secret-2")
	}
	if !strings.Contains(logs.String(), "agent credential not re-read") || !strings.Contains(logs.String(), "symbolic link") {
		t.Errorf("the refused file is not logged:\n%s", logs.String())
	}
	for _, v := range []string{"acme-secret", "globex-secret"} {
		if strings.Contains(logs.String(), v) {
			t.Errorf("the log shows a value:\n%s", logs.String())
		}
	}

	// A variable never read: the reload is refused, its error names it
	// without a value.
	cfg.Tenants[2].AgentEnv = map[string]config.AgentEnvSource{"NEW": {File: filepath.Join(filepath.Dir(key), "missing")}}
	if _, _, err := creds.read(cfg); err == nil || !strings.Contains(err.Error(), `tenant "initech" agent_env NEW`) {
		t.Errorf("a new unreadable variable: %v", err)
	}
	// Taking a tenant's credentials away is a change of its.
	cfg.Tenants[2].AgentEnv = nil
	cfg.Tenants[1].AgentEnv = nil
	if _, changed, err := creds.read(cfg); err != nil || !slices.Equal(changed, []string{"globex"}) {
		t.Errorf("removed: %v, %v", changed, err)
	}
}

// A credential two reloads replaced is still one the redactor gets: an
// agent started before the first still holds it in its environment.
func TestAgentCredsKeepRetired(t *testing.T) {
	c := &agentCreds{vals: map[string]map[string]string{"acme": {"KEY": "old-secret-1"}}}
	c.set(map[string]map[string]string{"acme": {"KEY": "new-secret-2"}})
	c.set(map[string]map[string]string{"acme": {"KEY": "new-secret-3"}})
	var values []string
	for _, vars := range c.all() {
		for _, v := range vars {
			values = append(values, v)
		}
	}
	for _, want := range []string{"old-secret-1", "new-secret-2", "new-secret-3"} {
		if !slices.Contains(values, want) {
			t.Errorf("all() = %q lacks %q", values, want)
		}
	}
	if got := c.of("acme")["KEY"]; got != "new-secret-3" {
		t.Errorf("acme's credential %q, want the newest", got)
	}
}
