package policy

import (
	"strings"
	"testing"
)

func TestModelPolicyAllows(t *testing.T) {
	p := ModelPolicy{Allow: []string{"claude-sonnet-*", "gpt-4?", "exact", "openai/*-mini", "*haiku*"}}
	for id, want := range map[string]bool{
		"claude-sonnet-4":      true,
		"claude-sonnet-":       true,
		"claude-sonnet":        false,
		"claude-opus-4":        false,
		"gpt-4o":               true,
		"gpt-4":                false,
		"gpt-4oo":              false,
		"gpt-4é":               true, // "?" is one character, not one byte
		"exact":                true,
		"exactly":              false,
		"Exact":                false, // case matters
		"openai/gpt-4.1-mini":  true,  // "*" crosses "/"
		"openai/gpt-4.1-mini2": false,
		"a-haiku-b":            true,
		"*":                    false, // an ID is never a pattern
		"claude-sonnet-*":      true,  // but a pattern matches it as text
		"":                     false,
	} {
		if got := p.Allows(id); got != want {
			t.Errorf("Allows(%q) = %v, want %v", id, got, want)
		}
	}
	if !(ModelPolicy{}).Allows("anything") || (ModelPolicy{}).Restricts() {
		t.Error("no list allows every model")
	}
	none := ModelPolicy{Allow: []string{}}
	if none.Allows("x") || !none.Restricts() {
		t.Error("an empty list allows no model")
	}
	if (ModelPolicy{Allow: []string{"", "a\x00*"}}).Allows("a\x00b") {
		t.Error("a malformed pattern matched")
	}
}

func TestMatchGlobIsLinearish(t *testing.T) {
	// A pattern of many stars against a long ID that fails at the end:
	// quadratic at worst, never exponential.
	pat := strings.Repeat("a*", 40) + "b"
	id := strings.Repeat("a", 20000)
	if matchGlob(pat, id) {
		t.Fatal("matched")
	}
}

func TestValidateModels(t *testing.T) {
	p := Default()
	p.Models.Allow = []string{"ok-*", "", "bad\x01", strings.Repeat("x", 300)}
	err := p.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{"empty pattern", `"bad\x01"`, "longer than 256"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error lacks %s: %v", s, err)
		}
	}
	if strings.Contains(err.Error(), "ok-*") {
		t.Errorf("a valid pattern reported: %v", err)
	}
	p.Models.Allow = []string{"a", "b"}
	if got := p.Models.Describe(); got != `"a", "b"` {
		t.Errorf("Describe: %s", got)
	}
	if !strings.Contains(p.Describe(), "models:\n  allow:\n    - \"a\"\n    - \"b\"\n") {
		t.Errorf("policy Describe:\n%s", p.Describe())
	}
}
