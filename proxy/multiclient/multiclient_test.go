package multiclient

import (
	"encoding/json"
	"testing"
)

// The attach result follows the session's mode and config options: as the
// agent's result gave them, then as its updates change them.
func TestSessionStateFollowsUpdates(t *testing.T) {
	var a Record
	a.NoteResult([]byte(`{"sessionId":"x","modes":{"currentModeId":"ask","availableModes":[{"id":"ask"},{"id":"code"}]},"configOptions":[{"id":"a"}]}`))
	a.NoteUpdate([]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{"sessionUpdate":"current_mode_update","currentModeId":"code"}}}`))
	a.NoteUpdate([]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{"sessionUpdate":"config_option_update","configOptions":[{"id":"b"}]}}}`))
	a.NoteUpdate([]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{"sessionUpdate":"tool_call_update","toolCallId":"t"}}}`))
	var modes struct {
		CurrentModeID string `json:"currentModeId"`
	}
	if err := json.Unmarshal(a.Get().Modes, &modes); err != nil || modes.CurrentModeID != "code" {
		t.Errorf("modes = %s, want currentModeId code", a.Get().Modes)
	}
	if string(a.Get().ConfigOptions) != `[{"id":"b"}]` {
		t.Errorf("configOptions = %s, want the update's", a.Get().ConfigOptions)
	}
}

// Client IDs are never minted twice, and do not count in the open.
func TestNewClientIDIsUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := NewClientID()
		if seen[id] || len(id) != 34 || id[:2] != "c-" {
			t.Fatalf("NewClientID() = %q (seen before: %v), want c- and 32 hex digits, never twice", id, seen[id])
		}
		seen[id] = true
	}
	a, b := NewClientID(), NewClientID()
	if a[:18] == b[:18] || a[18:] == b[18:] {
		t.Errorf("two IDs in a row, %s and %s, share a half", a, b)
	}
}

// A permission_resolved of a request a standing rule settled carries the
// rule and what it decided; without a rule, or a body, nothing changes.
func TestByPolicy(t *testing.T) {
	body := PermissionResolved([]byte(`{"params":{"toolCall":{"toolCallId":"t1"}}}`), nil, []byte(`{"outcome":"cancelled"}`))
	out := ByPolicy(body, "permissions[0] {decide: deny}\x1b", "deny")
	var u struct {
		SessionUpdate, ToolCallID string
		Policy                    struct{ Rule, Decide string }
	}
	if err := json.Unmarshal(out, &u); err != nil {
		t.Fatal(err)
	}
	if u.SessionUpdate != "permission_resolved" || u.ToolCallID != "t1" || u.Policy.Rule != "permissions[0] {decide: deny}\x1b" || u.Policy.Decide != "deny" {
		t.Errorf("ByPolicy = %s", out)
	}
	if string(ByPolicy(body, "", "")) != string(body) || ByPolicy(nil, "r", "allow") != nil {
		t.Error("ByPolicy changed a body without a rule, or made one from nil")
	}
}
