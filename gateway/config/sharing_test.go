package config

import (
	"os"
	"strings"
	"testing"
)

// sharingTenants is a configuration with the sandbox off and a tenant per
// name (with a root of its own under dir), each followed by its extra
// lines.
func sharingTenants(t *testing.T, dir string, names, extra []string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("sandbox: {mode: off}\ntenants:\n")
	for i, name := range names {
		if err := os.Mkdir(dir+"/"+name, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		b.WriteString("  - name: " + name + "\n    tokens_sha256: [" + strings.Repeat(name[:1], 64) + "]\n    root: " + dir + "/" + name + "\n")
		b.WriteString(extra[i])
	}
	return b.String()
}

func TestSessionsAttachDefaults(t *testing.T) {
	cfg := Default()
	if cfg.Sessions.HistoryBytes != 2<<20 || cfg.Sessions.MaxClients != 8 {
		t.Errorf("sessions history_bytes %d, max_clients %d; want 2097152 and 8", cfg.Sessions.HistoryBytes, cfg.Sessions.MaxClients)
	}
	if s := cfg.GlobalSharing(); s != (Sharing{Attach: SharingSameSubject}) {
		t.Errorf("default sharing %+v, want same_subject, not read-only for others", s)
	}
	cfg = mustParse(t, "sessions:\n  history_bytes: 0\n  max_clients: 1\n")
	if cfg.Sessions.HistoryBytes != 0 || cfg.Sessions.MaxClients != 1 {
		t.Errorf("history_bytes 0 and max_clients 1 parsed to %d and %d", cfg.Sessions.HistoryBytes, cfg.Sessions.MaxClients)
	}
	cfg = mustParse(t, "sessions: {history_bytes: 1073741824, max_clients: 256}\n")
	if cfg.Sessions.HistoryBytes != 1<<30 || cfg.Sessions.MaxClients != 256 {
		t.Errorf("the upper bounds parsed to %d and %d", cfg.Sessions.HistoryBytes, cfg.Sessions.MaxClients)
	}
}

func TestSessionsAttachBounds(t *testing.T) {
	cases := []struct{ data, key, msg string }{
		{"sessions:\n  history_bytes: -1\n", "history_bytes", "sessions.history_bytes: must be from 0 (keep no history) to 1073741824, is -1"},
		{"sessions:\n  history_bytes: 1073741825\n", "history_bytes", "sessions.history_bytes: must be from 0"},
		{"sessions:\n  max_clients: 0\n", "max_clients", "sessions.max_clients: must be from 1 to 256, is 0"},
		{"sessions:\n  detach_timeout: 1m\n  max_clients: 257\n", "max_clients", "sessions.max_clients: must be from 1 to 256, is 257"},
	}
	for _, tc := range cases {
		ps := problems(t, tc.data)
		if len(ps) != 1 {
			t.Errorf("%q: want 1 problem, got %d:\n%s", tc.data, len(ps), list(ps))
			continue
		}
		if !strings.Contains(ps[0].Msg, tc.msg) {
			t.Errorf("%q: problem %q, want %q", tc.data, ps[0], tc.msg)
		}
		wantAtKey(t, ps[0], tc.data, tc.key, 0)
	}
}

// The top-level sharing is the gateway's without tenants and every
// tenant's default; a tenant's keys are laid over it key by key.
func TestSharingLayers(t *testing.T) {
	dir := t.TempDir()
	cfg := mustParse(t, "sharing:\n  attach: tenant\n"+sharingTenants(t, dir, []string{"a", "b", "c"}, []string{
		"",
		"    sharing: {read_only_for_others: true}\n",
		"    sharing:\n      attach: off\n",
	}))
	if g := cfg.GlobalSharing(); g != (Sharing{Attach: SharingTenant}) {
		t.Errorf("global sharing %+v", g)
	}
	want := []Sharing{
		{Attach: SharingTenant},
		{Attach: SharingTenant, ReadOnlyForOthers: true},
		{Attach: SharingOff},
	}
	for i, w := range want {
		if got := cfg.TenantSharing(&cfg.Tenants[i]); got != w {
			t.Errorf("tenant %s: sharing %+v, want %+v", cfg.Tenants[i].Name, got, w)
		}
	}
	// Without a top-level section a tenant's keys are laid over the
	// defaults.
	cfg = mustParse(t, sharingTenants(t, dir, []string{"a"}, []string{"    sharing: {read_only_for_others: true}\n"}))
	if got := cfg.TenantSharing(&cfg.Tenants[0]); got != (Sharing{Attach: SharingSameSubject, ReadOnlyForOthers: true}) {
		t.Errorf("tenant sharing over the defaults: %+v", got)
	}
	if got := mustParse(t, "sharing: {attach: off}\n").GlobalSharing(); got != (Sharing{Attach: SharingOff}) {
		t.Errorf("sharing without tenants: %+v", got)
	}
}

func TestSharingAttachValues(t *testing.T) {
	data := "sharing:\n  attach: everyone\n" + sharingTenants(t, t.TempDir(), []string{"a"},
		[]string{"    sharing:\n      read_only_for_others: true\n      attach: same-subject\n"})
	ps := problems(t, data)
	if len(ps) != 2 {
		t.Fatalf("want 2 problems, got %d:\n%s", len(ps), list(ps))
	}
	p := findProblem(t, ps, `sharing.attach: "everyone" is not same_subject, tenant or off`)
	wantAtKey(t, p, data, "attach", 0)
	p = findProblem(t, ps, `tenants[0].sharing.attach: "same-subject" is not same_subject, tenant or off`)
	wantAtKey(t, p, data, "attach", 1)
	// read_only_for_others takes a boolean.
	ps = problems(t, "sharing:\n  read_only_for_others: sometimes\n")
	if len(ps) != 1 || ps[0].Line != 2 || !strings.Contains(ps[0].Msg, "sometimes") {
		t.Errorf("a non-boolean read_only_for_others: %s", list(ps))
	}
	// Unknown keys are errors here too.
	ps = problems(t, "sharing:\n  atach: tenant\n")
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "atach") {
		t.Errorf("an unknown sharing key: %s", list(ps))
	}
}

// sessions.affinity_cookie must be a cookie name.
func TestAffinityCookieMustBeACookieName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"", true}, {"ACPGATE_AFFINITY", true}, {"route", true}, {"bad name", false}, {"a=b", false}, {"x;y", false}} {
		c := Default()
		c.Sessions.AffinityCookie = tc.name
		err := c.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("affinity_cookie %q: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
