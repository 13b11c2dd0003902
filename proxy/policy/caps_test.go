package policy

import "testing"

func TestParseAgentCapsFixtures(t *testing.T) {
	want := map[string]AgentCaps{
		"claude-code-acp": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true,
			Load: true, Resume: true, List: true, Fork: true,
			MCPStdio: true, MCPHTTP: true, MCPSSE: true,
			PromptImage: true, PromptEmbeddedContext: true, AuthMethods: 1},
		"claude-agent-acp": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true,
			Load: true, Resume: true, Close: true, List: true, Delete: true, AdditionalDirectories: true, Fork: true,
			MCPStdio: true, MCPHTTP: true, MCPSSE: true,
			PromptImage: true, PromptEmbeddedContext: true},
		"codex-acp": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true,
			Load: true, Resume: true, Close: true, List: true,
			MCPStdio: true, MCPHTTP: true,
			PromptImage: true, PromptEmbeddedContext: true, AuthMethods: 3, Logout: true},
		"acpgate-demo": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true,
			Load: true, Resume: true, Close: true, List: true, AdditionalDirectories: true,
			MCPStdio: true, MCPHTTP: true, PromptEmbeddedContext: true},
		"v1-minimal":   {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true, MCPStdio: true},
		"v1-malformed": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true, MCPStdio: true, Close: true, PromptEmbeddedContext: true},
		"v1-unstable": {ProtocolVersion: 1, Shape: ShapeV1, Sessions: true,
			Load: true, Resume: true, Close: true, List: true, Delete: true, AdditionalDirectories: true, Fork: true,
			MCPStdio: true, MCPHTTP: true, MCPSSE: true, MCPACP: true,
			PromptImage: true, PromptAudio: true, PromptEmbeddedContext: true,
			AuthMethods: 2, Logout: true, AuthStatus: true,
			Providers: true, NES: true, SystemPrompt: true, Archive: true, SessionStatus: true, Title: true},
		"v2-draft": {ProtocolVersion: 2, Shape: ShapeV2Draft, Sessions: true,
			Load: true, Resume: true, Close: true, Delete: true, AdditionalDirectories: true,
			MCPStdio: true, MCPHTTP: true,
			PromptImage: true, PromptAudio: true, PromptEmbeddedContext: true,
			AuthMethods: 1, Logout: true},
		"v2-draft-partial": {ProtocolVersion: 2, Shape: ShapeV2Draft, Sessions: true,
			Resume: true, MCPHTTP: true, PromptImage: true},
		"v2-schema": {ProtocolVersion: 2, Shape: ShapeV2, Sessions: true,
			Resume: true, Close: true, List: true, Delete: true, AdditionalDirectories: true,
			MCPStdio: true, MCPHTTP: true,
			PromptImage: true, PromptAudio: true, PromptEmbeddedContext: true,
			AuthMethods: 2, Logout: true},
		"v2-schema-unstable": {ProtocolVersion: 2, Shape: ShapeV2, Sessions: true,
			Resume: true, Close: true, List: true, Delete: true, AdditionalDirectories: true, Fork: true,
			MCPStdio: true, MCPHTTP: true, MCPACP: true,
			PromptImage: true, PromptEmbeddedContext: true,
			AuthMethods: 2, Logout: true, AuthStatus: true,
			Providers: true, SystemPrompt: true, Archive: true, SessionStatus: true, Title: true},
		"v2-no-session": {ProtocolVersion: 2, Shape: ShapeV2},
		"v2-nonstandard": {ProtocolVersion: 2, Shape: ShapeV2, Sessions: true,
			Resume: true, Close: true, List: true, Fork: true,
			MCPStdio: true, MCPSSE: true, PromptAudio: true,
			AuthMethods: 1, Logout: true, AuthStatus: true, NES: true},
	}
	for _, fx := range fixtures(t) {
		w, ok := want[fx.name]
		if !ok {
			t.Errorf("%s: no expectation", fx.name)
			continue
		}
		if got := ParseAgentCaps(fx.raw); got != w {
			t.Errorf("%s:\n got %+v\nwant %+v", fx.name, got, w)
		}
	}
}

func TestParseAgentCapsShapes(t *testing.T) {
	cases := []struct {
		in   string
		want Shape
	}{
		{`not json`, ShapeUnknown},
		{`[]`, ShapeUnknown},
		{`{"protocolVersion":1}`, ShapeV1},
		{`{}`, ShapeV1},
		{`{"protocolVersion":2}`, ShapeV2},
		{`{"protocolVersion":2,"agentCapabilities":{}}`, ShapeV1},
		{`{"protocolVersion":1,"capabilities":{}}`, ShapeV2},
		{`{"protocolVersion":2,"capabilities":{},"agentCapabilities":{}}`, ShapeV2},
		{`{"protocolVersion":1,"capabilities":{},"agentCapabilities":{}}`, ShapeV1},
		{`{"protocolVersion":2,"capabilities":{"session":{}}}`, ShapeV2},
		{`{"protocolVersion":2,"capabilities":{"session":{"load":null}}}`, ShapeV2Draft},
		{`{"protocolVersion":2,"capabilities":{"session":{"close":{}}}}`, ShapeV2Draft},
		{`{"protocolVersion":2,"capabilities":{"session":{"list":{}}}}`, ShapeV2Draft},
	}
	for _, c := range cases {
		if got := ParseAgentCaps([]byte(c.in)).Shape; got != c.want {
			t.Errorf("%s: shape %v, want %v", c.in, got, c.want)
		}
	}
	// Baselines of the later v2 shape need capabilities.session.
	c := ParseAgentCaps([]byte(`{"protocolVersion":2,"capabilities":{"session":{}}}`))
	if !c.Sessions || !c.Resume || !c.Close || !c.List || c.Load || c.MCPStdio {
		t.Errorf("later v2 baseline: %+v", c)
	}
	c = ParseAgentCaps([]byte(`{"protocolVersion":2,"capabilities":{"session":null}}`))
	if c.Sessions || c.Resume || c.List {
		t.Errorf("v2 without session: %+v", c)
	}
	// Draft shape: only what is marked.
	c = ParseAgentCaps([]byte(`{"protocolVersion":2,"capabilities":{"session":{"resume":{},"close":null}}}`))
	if !c.Resume || c.Close || c.List || c.Load {
		t.Errorf("draft markers: %+v", c)
	}
	// protocolVersion forms.
	for in, want := range map[string]int{`{"protocolVersion":2.0}`: 2, `{"protocolVersion":"2"}`: 0, `{"protocolVersion":-1}`: 0, `{"protocolVersion":1e0}`: 1, `{"protocolVersion":70000}`: 0} {
		if got := ParseAgentCaps([]byte(in)).ProtocolVersion; got != want {
			t.Errorf("%s: version %d, want %d", in, got, want)
		}
	}
	// v1 authMethods and logout; v2 authMethods make both auth methods.
	c = ParseAgentCaps([]byte(`{"protocolVersion":1,"agentCapabilities":{"auth":{"logout":{}}},"authMethods":[{"id":"a"},{"id":"b,]}"}]}`))
	if c.AuthMethods != 2 || !c.Logout {
		t.Errorf("v1 auth: %+v", c)
	}
	c = ParseAgentCaps([]byte(`{"protocolVersion":2,"capabilities":{"auth":{"logout":{}}},"authMethods":[]}`))
	if c.AuthMethods != 0 || c.Logout {
		t.Errorf("v2 empty authMethods: %+v", c)
	}
}

func TestShapeString(t *testing.T) {
	for s, want := range map[Shape]string{ShapeUnknown: "unknown", ShapeV1: "v1", ShapeV2Draft: "v2-draft", ShapeV2: "v2"} {
		if s.String() != want {
			t.Errorf("%d: %q", s, s.String())
		}
	}
}

// TestParseAgentCapsClose: session/close is advertised only by a marker
// object (v1, v2 draft) or by the later v2 shape's baseline; the relay
// closes sessions on the agent by this, so false, null and a draft without
// the marker are not support.
func TestParseAgentCapsClose(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{`{"protocolVersion":1,"agentCapabilities":{"sessionCapabilities":{"close":{}}}}`, true},
		{`{"protocolVersion":1,"agentCapabilities":{"sessionCapabilities":{"close":false}}}`, false},
		{`{"protocolVersion":1,"agentCapabilities":{"sessionCapabilities":{"close":null}}}`, false},
		{`{"protocolVersion":1,"agentCapabilities":{}}`, false},
		{`{"protocolVersion":2,"capabilities":{"session":{}}}`, true},
		{`{"protocolVersion":2,"capabilities":{"session":{"load":{}}}}`, false},
		{`{"protocolVersion":2,"capabilities":{"session":{"load":{},"close":{}}}}`, true},
	} {
		if got := ParseAgentCaps([]byte(c.in)).Close; got != c.want {
			t.Errorf("%s: Close = %v, want %v", c.in, got, c.want)
		}
	}
}
