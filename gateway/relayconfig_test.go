package gateway

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
)

// The relay gets sessions.history_bytes and max_clients, and each tenant's
// effective sharing (the top-level section under the tenant's keys).
func TestRelayConfigSessionsAndSharing(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Parse("test.yaml", []byte(`sandbox: {mode: off}
sessions: {history_bytes: 4096, max_clients: 3}
sharing: {attach: tenant}
tenants:
  - name: a
    tokens_sha256: ["`+hexOf('a')+`"]
    root: `+dir+`/a
  - name: b
    tokens_sha256: ["`+hexOf('b')+`"]
    root: `+dir+`/b
    sharing: {read_only_for_others: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	tenants := relayTenants(cfg)
	rc := relayConfig(cfg, nil, nil, nil, tenants)
	if rc.Sessions.HistoryBytes != 4096 || rc.Sessions.MaxClients != 3 {
		t.Errorf("relay sessions %+v, want history_bytes 4096 and max_clients 3", rc.Sessions)
	}
	want := map[string]proxy.Sharing{
		"a": {Attach: proxy.SharingTenant},
		"b": {Attach: proxy.SharingTenant, ReadOnlyForOthers: true},
	}
	if len(rc.Tenants) != len(want) {
		t.Fatalf("relay tenants %+v", rc.Tenants)
	}
	for _, tc := range rc.Tenants {
		if tc.Sharing != want[tc.Name] {
			t.Errorf("tenant %s: sharing %+v, want %+v", tc.Name, tc.Sharing, want[tc.Name])
		}
	}

	// Without tenants, the one anonymous tenant gets the top-level sharing;
	// history_bytes 0 keeps no history, which the relay takes as -1 (its 0
	// is the default).
	cfg, err = config.Parse("test.yaml", []byte("sessions: {history_bytes: 0}\nsharing: {attach: off}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rc = relayConfig(cfg, nil, nil, nil, relayTenants(cfg))
	if len(rc.Tenants) != 1 || rc.Tenants[0].Sharing != (proxy.Sharing{Attach: proxy.SharingOff}) {
		t.Errorf("tenant-less relay tenants %+v, want one with attach off", rc.Tenants)
	}
	if rc.Sessions.HistoryBytes != -1 || rc.Sessions.MaxClients != 8 {
		t.Errorf("relay sessions %+v, want history_bytes -1 (none) and the default max_clients 8", rc.Sessions)
	}
	// The configuration's attach values are the relay's.
	for c, p := range map[string]string{config.SharingSameSubject: proxy.SharingSameSubject,
		config.SharingTenant: proxy.SharingTenant, config.SharingOff: proxy.SharingOff} {
		if c != p {
			t.Errorf("config attach %q is the relay's %q", c, p)
		}
	}
}

func hexOf(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
