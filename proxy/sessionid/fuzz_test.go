package sessionid

import (
	"strings"
	"testing"
)

// FuzzSealerOpen: opening never panics, only IDs this sealer issued for the
// tenant open, and what opens is what was sealed.
func FuzzSealerOpen(f *testing.F) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	s, err := New(key)
	if err != nil {
		f.Fatal(err)
	}
	for _, sid := range []string{"demo-0123456789abcdef", "0199a3f2-7c1e-7b5e-9a3c-5f2d8e1b4c6a", "", "é\x00"} {
		f.Add("acme", s.Seal("acme", sid), sid)
		f.Add("globex", s.Seal("acme", sid), sid)
	}
	f.Add("acme", "AAAA", "x")
	f.Add("acme", strings.Repeat("A", 100), "x")
	f.Fuzz(func(t *testing.T, tenant, id, sid string) {
		if got, err := s.Open(tenant, id); err == nil {
			// Anything that opens must be an ID this sealer made for tenant.
			if s.Seal(tenant, got) != id {
				t.Fatalf("Open(%q, %q) = %q, but sealing that gives %q", tenant, id, got, s.Seal(tenant, got))
			}
		}
		sealed := s.Seal(tenant, sid)
		if len(sealed) > maxSessionIDLen {
			if _, err := s.Open(tenant, sealed); err == nil {
				t.Fatalf("an ID over %d characters opened", maxSessionIDLen)
			}
			return // agents' IDs that long are not usable through the gateway
		}
		got, err := s.Open(tenant, sealed)
		if err != nil || got != sid {
			t.Fatalf("round trip of %q for %q: %q, %v", sid, tenant, got, err)
		}
		if _, err := s.Open(tenant+"x", sealed); err == nil {
			t.Fatalf("an ID of tenant %q opened for %q", tenant, tenant+"x")
		}
	})
}
