package sessionid

import (
	"strings"
	"testing"
)

func TestSealer(t *testing.T) {
	s := NewRandom()
	id := s.Seal("acme", "token:alice", "agent-session-1")
	if id != s.Seal("acme", "token:alice", "agent-session-1") {
		t.Fatal("sealing is not deterministic")
	}
	if id == s.Seal("globex", "token:alice", "agent-session-1") {
		t.Fatal("two tenants got the same ID for one session")
	}
	if got, err := s.Open("acme", id); err != nil || got != (Opened{Agent: "agent-session-1", Subject: "token:alice"}) {
		t.Fatalf("open: %+v %v", got, err)
	}
	if _, err := s.Open("globex", id); err == nil {
		t.Fatal("an ID opened for another tenant")
	}
	if _, err := NewRandom().Open("acme", id); err == nil {
		t.Fatal("an ID opened under another key")
	}
	tampered := []byte(id)
	tampered[len(tampered)/2] ^= 1
	for _, bad := range []string{"", "x", string(tampered), strings.Repeat("A", 5000), id + "A"} {
		if _, err := s.Open("acme", bad); err == nil {
			t.Errorf("opened a bad ID %q", bad)
		}
	}
	if _, err := New(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte key was accepted")
	}
	// Rotation: IDs sealed under an old key still open; new ones use the new.
	oldKey, newKey := make([]byte, 32), make([]byte, 32)
	newKey[0] = 1
	oldS, _ := New(oldKey)
	rotated, _ := New(newKey, oldKey)
	oldID := oldS.Seal("acme", "token:alice", "s1")
	if got, err := rotated.Open("acme", oldID); err != nil || got.Agent != "s1" {
		t.Fatalf("an ID under the old key did not open after rotation: %v", err)
	}
	if rotated.Seal("acme", "token:alice", "s1") == oldID {
		t.Fatal("new IDs are still sealed with the old key")
	}
	if _, err := oldS.Open("acme", rotated.Seal("acme", "token:alice", "s1")); err == nil {
		t.Fatal("the old key alone opened an ID sealed with the new one")
	}
}

// The scope of the agent named "default" is the tenant alone, so the IDs a
// single-agent gateway issued open unchanged; any other agent's differ.
func TestScope(t *testing.T) {
	s := NewRandom()
	id := s.Seal("acme", "token:alice", "agent-sid")
	if got, err := s.Open(Scope("acme", DefaultAgent), id); err != nil || got.Agent != "agent-sid" {
		t.Errorf("default agent: Open = %+v, %v", got, err)
	}
	if _, err := s.Open(Scope("acme", "codex"), id); err == nil {
		t.Error("an ID of the default agent opened for agent codex")
	}
	other := s.Seal(Scope("acme", "codex"), "token:alice", "agent-sid")
	if other == id {
		t.Error("two agents' IDs for one session are the same")
	}
	if _, err := s.Open(Scope("acme", "claude"), other); err == nil {
		t.Error("agent codex's ID opened for agent claude")
	}
}

// The subject that made a session is sealed in its ID: two subjects'
// IDs for one agent session differ, each opens to its own subject, and an
// ID of before the subject was sealed (version 1) still opens, naming
// nobody.
func TestSubjectSealed(t *testing.T) {
	s := NewRandom()
	alice, bob := s.Seal("acme", "token:alice", "sid"), s.Seal("acme", "jwt:bob", "sid")
	if alice == bob {
		t.Fatal("two subjects got the same ID for one session")
	}
	for id, want := range map[string]Opened{alice: {Agent: "sid", Subject: "token:alice"}, bob: {Agent: "sid", Subject: "jwt:bob"},
		s.Seal("acme", "", "sid"): {Agent: "sid"}, s.Seal("acme", "a\x00b", "\x00"): {Agent: "\x00", Subject: "a\x00b"}} {
		if got, err := s.Open("acme", id); err != nil || got != want {
			t.Errorf("Open(%q) = %+v, %v; want %+v", id, got, err, want)
		}
	}
	if strings.Contains(alice, "alice") {
		t.Error("the subject shows in the ID")
	}
	legacy := s.keys[0].seal(sealV1, "acme", []byte("old-sid"))
	if got, err := s.Open("acme", legacy); err != nil || got != (Opened{Agent: "old-sid", Legacy: true}) {
		t.Errorf("a version 1 ID: %+v, %v", got, err)
	}
	if _, err := s.Open("globex", legacy); err == nil {
		t.Error("a version 1 ID opened for another tenant")
	}
	// A version 1 ID relabelled as version 2 (or back) does not open.
	raw, _ := b64.DecodeString(legacy)
	raw[0] = sealV2
	if _, err := s.Open("acme", b64.EncodeToString(raw)); err == nil {
		t.Error("a version 1 ID relabelled as 2 opened")
	}
}
