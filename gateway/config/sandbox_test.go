package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "512MiB": 512 << 20, "2GiB": 2 << 30, "64KiB": 64 << 10, "1GB": 1e9, "0": 0} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5GiB", "-1", "12 parsecs", "99999999999TiB"} {
		if _, err := ParseByteSize(in); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", in)
		}
	}
}

// sandboxTenants writes two tenants' roots and a session key in a fresh
// directory and returns the YAML for them, with the key and homes given.
func sandboxTenants(t *testing.T, key, homes string) (yaml, dir string) {
	t.Helper()
	dir = t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	keyPath := filepath.Join(dir, key)
	if err := os.WriteFile(keyPath, []byte(strings.Repeat("ab", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("0", 64)
	return fmt.Sprintf("session_key_file: %s\nsandbox: {home: %s}\ntenants:\n  - {name: a, root: %s, tokens_sha256: [%s]}\n  - {name: b, root: %s, tokens_sha256: [%s]}\n",
		keyPath, filepath.Join(dir, homes), filepath.Join(dir, "a"), sum, filepath.Join(dir, "b"), sum), dir
}

func TestSandboxModeDefaults(t *testing.T) {
	if m := mustParse(t, "").SandboxMode(); m != "off" {
		t.Errorf("without tenants: %q, want off", m)
	}
	y, _ := sandboxTenants(t, "session.key", "homes")
	if m := mustParse(t, y).SandboxMode(); m != "auto" {
		t.Errorf("with tenants: %q, want auto", m)
	}
	if m := mustParse(t, strings.Replace(y, "sandbox: {", "sandbox: {mode: off, ", 1)); m.SandboxMode() != "off" {
		t.Error("mode off not kept")
	}
}

func TestSandboxProblems(t *testing.T) {
	ok, dir := sandboxTenants(t, "session.key", "homes")
	mustParse(t, ok)
	for name, c := range map[string]struct{ yaml, want string }{
		"bad mode":             {strings.Replace(ok, "sandbox: {home:", "sandbox: {mode: maybe, home:", 1), `"maybe" is not auto, required or off`},
		"relative home":        {strings.Replace(ok, "sandbox: {home: "+dir+"/homes}", "sandbox: {home: homes}", 1), `sandbox.home: "homes" must be an absolute directory`},
		"shared, two tenants":  {ok + "pool: {isolation: shared}\n", "one agent process cannot be confined to two tenants' roots"},
		"agent.dir":            {ok + "agent: {dir: /srv}\n", "agent.dir: with the sandbox on"},
		"ports without rules":  {strings.Replace(ok, "sandbox: {home:", "sandbox: {network: {connect_tcp: [443]}, home:", 1), "only apply with restrict: true"},
		"port out of range":    {strings.Replace(ok, "sandbox: {home:", "sandbox: {network: {restrict: true, connect_tcp: [70000]}, home:", 1), "port 70000"},
		"tiny memory":          {strings.Replace(ok, "sandbox: {home:", "sandbox: {limits: {memory: 1MiB}, home:", 1), "too little"},
		"root user":            {strings.Replace(ok, "sandbox: {home:", "sandbox: {user: \"0\", home:", 1), "unprivileged account"},
		"key in a read_only":   {strings.Replace(ok, "sandbox: {home:", "sandbox: {read_only: ["+dir+"], home:", 1), "session_key_file " + dir + "/session.key is readable by"},
		"homes in a root":      {strings.Replace(ok, dir+"/homes}", dir+"/a/homes}", 1), "overlap"},
		"another's root, rw":   {strings.Replace(ok, "root: "+dir+"/a,", "root: "+dir+"/a, sandbox: {read_write: ["+dir+"/b]},", 1), "overlaps " + dir + "/b"},
		"homes in a read_only": {strings.Replace(ok, "sandbox: {home:", "sandbox: {read_only: ["+dir+"], home:", 1), "sandbox.home " + dir + "/homes lies inside " + dir},
	} {
		ps := problems(t, c.yaml)
		var all []string
		for _, p := range ps {
			all = append(all, p.String())
		}
		if !strings.Contains(strings.Join(all, "\n"), c.want) {
			t.Errorf("%s: problems lack %q:\n%s", name, c.want, strings.Join(all, "\n"))
		}
	}
	// The same configuration with the sandbox off is accepted.
	mustParse(t, strings.Replace(ok, "sandbox: {home:", "sandbox: {mode: off, read_only: ["+dir+"], home:", 1))
}

func TestSandboxPathsOfATenant(t *testing.T) {
	y, dir := sandboxTenants(t, "session.key", "homes")
	cfg := mustParse(t, y+"agent: {inherit_env: [PATH]}\n")
	ro, rw := cfg.SandboxPaths(&cfg.Tenants[0], nil)
	if !slices.Contains(ro, "/usr") || !slices.Contains(rw, filepath.Join(dir, "a")) || !slices.Contains(rw, filepath.Join(dir, "homes", "a")) {
		t.Errorf("tenant a: ro %v rw %v", ro, rw)
	}
	if slices.Contains(rw, filepath.Join(dir, "b")) || slices.Contains(ro, filepath.Join(dir, "b")) {
		t.Errorf("tenant a may use tenant b's root: ro %v rw %v", ro, rw)
	}
}

// TestTenantUsers: tenants[].sandbox.user overrides sandbox.user for its
// tenant; UserPerTenant holds only when every tenant has an account of its
// own, none sandbox.user's; two tenants with one uid are refused.
func TestTenantUsers(t *testing.T) {
	y, _ := sandboxTenants(t, "session.key", "homes")
	withUsers := func(global, a, b string) string {
		out := strings.Replace(y, "{name: a,", fmt.Sprintf("{name: a, sandbox: {user: %q},", a), 1)
		out = strings.Replace(out, "{name: b,", fmt.Sprintf("{name: b, sandbox: {user: %q},", b), 1)
		return strings.Replace(out, "sandbox: {home:", fmt.Sprintf("sandbox: {user: %q, home:", global), 1)
	}
	cfg := mustParse(t, withUsers("", "61001", "61002:61005"))
	if u, err := cfg.TenantUser(&cfg.Tenants[1]); err != nil || u == nil || u.UID != 61002 || u.GID != 61005 {
		t.Errorf("tenant b's user: %+v, %v", u, err)
	}
	if !cfg.UserPerTenant() {
		t.Error("two tenants with accounts of their own: UserPerTenant false")
	}
	for name, data := range map[string]string{
		"one tenant without":       withUsers("", "61001", ""),
		"a tenant on sandbox.user": withUsers("61001", "61001", "61002"),
	} {
		if mustParse(t, data).UserPerTenant() {
			t.Errorf("%s: UserPerTenant true", name)
		}
	}
	if cfg := mustParse(t, withUsers("61000", "", "61002")); func() bool { u, _ := cfg.TenantUser(&cfg.Tenants[0]); return u.UID != 61000 }() {
		t.Error("a tenant without its own user does not get sandbox.user")
	}
	var all []string
	for _, p := range problems(t, withUsers("", "61001", "61001")) {
		all = append(all, p.String())
	}
	if want := `tenants[1].sandbox.user: uid 61001 is also tenant "a"'s`; !strings.Contains(strings.Join(all, "\n"), want) {
		t.Errorf("problems lack %q:\n%s", want, strings.Join(all, "\n"))
	}
}
