package sessionid

import (
	"strings"
	"testing"
)

func TestSealer(t *testing.T) {
	s := NewRandom()
	id := s.Seal("acme", "agent-session-1")
	if id != s.Seal("acme", "agent-session-1") {
		t.Fatal("sealing is not deterministic")
	}
	if id == s.Seal("globex", "agent-session-1") {
		t.Fatal("two tenants got the same ID for one session")
	}
	if got, err := s.Open("acme", id); err != nil || got != "agent-session-1" {
		t.Fatalf("open: %q %v", got, err)
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
	oldID := oldS.Seal("acme", "s1")
	if got, err := rotated.Open("acme", oldID); err != nil || got != "s1" {
		t.Fatalf("an ID under the old key did not open after rotation: %v", err)
	}
	if rotated.Seal("acme", "s1") == oldID {
		t.Fatal("new IDs are still sealed with the old key")
	}
	if _, err := oldS.Open("acme", rotated.Seal("acme", "s1")); err == nil {
		t.Fatal("the old key alone opened an ID sealed with the new one")
	}
}

// The scope of the agent named "default" is the tenant alone, so the IDs a
// single-agent gateway issued open unchanged; any other agent's differ.
func TestScope(t *testing.T) {
	s := NewRandom()
	id := s.Seal("acme", "agent-sid")
	if got, err := s.Open(Scope("acme", DefaultAgent), id); err != nil || got != "agent-sid" {
		t.Errorf("default agent: Open = %q, %v", got, err)
	}
	if _, err := s.Open(Scope("acme", "codex"), id); err == nil {
		t.Error("an ID of the default agent opened for agent codex")
	}
	other := s.Seal(Scope("acme", "codex"), "agent-sid")
	if other == id {
		t.Error("two agents' IDs for one session are the same")
	}
	if _, err := s.Open(Scope("acme", "claude"), other); err == nil {
		t.Error("agent codex's ID opened for agent claude")
	}
}
