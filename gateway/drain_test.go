package gateway

import (
	"testing"

	"github.com/acpgate/acpgate/proxy/observe"
)

// The drain gate refuses the prompts of the agents whose drain lingers,
// and of every agent once the gateway's does; a removed agent's name takes
// prompts again once its drain is over.
func TestDrainGate(t *testing.T) {
	g := &drainGate{agents: map[string]struct{}{}}
	prompt := func(agent string) *observe.Refusal {
		return g.Prompt(&observe.Event{Kind: observe.TurnStarted, Session: &observe.Session{Agent: agent}})
	}
	if r := prompt("a"); r != nil {
		t.Fatalf("an open gate refused: %+v", r)
	}
	g.shut("a")
	if r := prompt("a"); r == nil || r.Code != -32800 || r.Message != drainRefusal.Message {
		t.Errorf("agent a lingering: %+v, want the drain's refusal", r)
	}
	if r := prompt("b"); r != nil {
		t.Errorf("agent b refused while only a lingers: %+v", r)
	}
	g.reopen("a")
	if r := prompt("a"); r != nil {
		t.Errorf("agent a refused after its drain: %+v", r)
	}
	g.shut("")
	for _, a := range []string{"a", "b"} {
		if r := prompt(a); r == nil || r.Code != -32800 {
			t.Errorf("agent %s while the gateway lingers: %+v, want the drain's refusal", a, r)
		}
	}
	if _, ok := any(g).(observe.PermissionDecider); ok {
		t.Error("the drain gate decides permissions")
	}
}
