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
		f.Add("acme", "token:alice", s.Seal("acme", "token:alice", sid), sid)
		f.Add("globex", "", s.Seal("acme", "", sid), sid)
		f.Add("acme", "", s.keys[0].seal(sealV1, "acme", []byte(sid)), sid)
	}
	f.Add("acme", "x", "AAAA", "x")
	f.Add("acme", "x", strings.Repeat("A", 100), "x")
	f.Fuzz(func(t *testing.T, tenant, subject, id, sid string) {
		if got, err := s.Open(tenant, id); err == nil {
			// Anything that opens must be an ID this sealer made for tenant.
			again := s.Seal(tenant, got.Subject, got.Agent)
			if got.Legacy {
				again = s.keys[0].seal(sealV1, tenant, []byte(got.Agent))
			}
			if again != id {
				t.Fatalf("Open(%q, %q) = %+v, but sealing that gives %q", tenant, id, got, again)
			}
		}
		sealed := s.Seal(tenant, subject, sid)
		if len(sealed) > maxSessionIDLen {
			if _, err := s.Open(tenant, sealed); err == nil {
				t.Fatalf("an ID over %d characters opened", maxSessionIDLen)
			}
			return // agents' IDs that long are not usable through the gateway
		}
		got, err := s.Open(tenant, sealed)
		if err != nil || got != (Opened{Agent: sid, Subject: subject}) {
			t.Fatalf("round trip of %q for %q: %+v, %v", sid, tenant, got, err)
		}
		if _, err := s.Open(tenant+"x", sealed); err == nil {
			t.Fatalf("an ID of tenant %q opened for %q", tenant, tenant+"x")
		}
	})
}
