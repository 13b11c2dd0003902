package policy

import (
	"errors"
	"strings"
	"testing"
)

// outcome: "" allowed, "policy" ErrNotAllowed, "agent" ErrUnsupported,
// "invalid" ErrInvalid.
func outcome(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotAllowed):
		return "policy"
	case errors.Is(err, ErrUnsupported):
		return "agent"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	}
	return "other: " + err.Error()
}

func TestAllowClientMethod(t *testing.T) {
	codex := ParseAgentCaps(fixtureBytes(t, "codex-acp"))
	claude := ParseAgentCaps(fixtureBytes(t, "claude-agent-acp"))
	demo := ParseAgentCaps(fixtureBytes(t, "acpgate-demo"))
	v1u := ParseAgentCaps(fixtureBytes(t, "v1-unstable"))
	draft := ParseAgentCaps(fixtureBytes(t, "v2-draft"))
	draftPartial := ParseAgentCaps(fixtureBytes(t, "v2-draft-partial"))
	later := ParseAgentCaps(fixtureBytes(t, "v2-schema"))
	laterU := ParseAgentCaps(fixtureBytes(t, "v2-schema-unstable"))
	noSession := ParseAgentCaps(fixtureBytes(t, "v2-no-session"))

	def, on, off := Default(), allOn(), Policy{}
	forkOnly := Default()
	forkOnly.Session.Fork = true // without Unstable
	ext := Default()
	ext.Extensions = []string{"_zed.dev/*", "_acme/exact"}
	auth := Default()
	auth.AgentAuth = true

	cases := []struct {
		method string
		p      Policy
		caps   AgentCaps
		want   string
	}{
		// baseline
		{"session/new", off, codex, ""},
		{"session/prompt", off, later, ""},
		{"session/cancel", off, noSession, ""},
		{"$/cancel_request", off, codex, ""},
		{"session/set_mode", off, codex, ""},
		{"session/set_config_option", off, draft, ""},
		{"tool_call/cancel", off, later, ""},
		{"terminal/cancel", off, draft, ""},
		{"tool_call/cancel", on, codex, "agent"}, // v2 only
		{"terminal/cancel", on, codex, "agent"},
		// session/load
		{"session/load", def, codex, ""},
		{"session/load", off, codex, "policy"},
		{"session/load", def, draft, ""},
		{"session/load", def, draftPartial, "agent"}, // load: null
		{"session/load", def, later, "agent"},        // no load in the later v2 shape
		// resume / close / list
		{"session/resume", def, codex, ""},
		{"session/resume", off, codex, "policy"},
		{"session/close", def, claude, ""},
		{"session/close", def, ParseAgentCaps(fixtureBytes(t, "claude-code-acp")), "agent"},
		{"session/list", def, demo, ""},
		{"session/resume", def, later, ""}, // baseline with capabilities.session
		{"session/close", def, later, ""},
		{"session/list", def, later, ""},
		{"session/list", off, later, "policy"}, // advertised as baseline, still refused
		{"session/resume", def, noSession, "agent"},
		{"session/resume", def, draftPartial, ""},
		{"session/close", def, draftPartial, "agent"}, // draft: absent marker
		{"session/list", def, draft, "agent"},         // draft has no list marker
		// delete
		{"session/delete", def, claude, "policy"}, // default: off
		{"session/delete", on, claude, ""},
		{"session/delete", on, codex, "agent"},
		{"session/delete", on, later, ""},
		// fork: unstable and its own key
		{"session/fork", def, claude, "policy"},
		{"session/fork", forkOnly, claude, "policy"},
		{"session/fork", on, claude, ""},
		{"session/fork", on, codex, "agent"},
		{"session/fork", on, laterU, ""},
		// auth
		{"authenticate", def, codex, "policy"},
		{"authenticate", auth, codex, ""},
		{"authenticate", auth, claude, "agent"}, // authMethods: []
		{"logout", auth, codex, ""},
		{"logout", auth, ParseAgentCaps(fixtureBytes(t, "claude-code-acp")), "agent"}, // no auth.logout
		{"logout", def, codex, "policy"},
		{"auth/login", auth, later, ""},
		{"auth/logout", auth, later, ""},
		{"auth/login", def, later, "policy"},
		{"auth/login", auth, codex, "agent"},   // v2 name on a v1 agent
		{"authenticate", auth, later, "agent"}, // v1 name on a v2 agent
		{"auth/logout", auth, noSession, "agent"},
		{"auth/status", on, laterU, ""},
		{"auth/status", on, later, "agent"},
		{"auth/status", auth, laterU, "policy"}, // unstable off
		// extensions
		{"_zed.dev/workspace/list", ext, codex, ""},
		{"_zed.dev", ext, codex, "policy"},
		{"_acme/exact", ext, codex, ""},
		{"_acme/exact/more", ext, codex, "policy"},
		{"_other", def, codex, "policy"},
		{"_anything", on, codex, ""}, // "_*"
		// unstable
		{"providers/list", def, v1u, "policy"},
		{"providers/set", on, v1u, ""},
		{"providers/set", on, codex, "agent"},
		{"nes/start", def, v1u, "policy"},
		{"nes/start", on, v1u, ""},
		{"document/didOpen", on, codex, ""},
		{"mcp/message", def, codex, "policy"},
		{"mcp/message", on, codex, ""},
		{"proxy/successor", on, codex, ""},
		{"proxy/initialize", def, codex, "policy"},
		{"session/archive", on, v1u, ""},
		{"session/unarchive", on, laterU, ""},
		{"session/unarchive", def, laterU, "policy"},
		{"session/status", on, v1u, ""},
		{"session/set_title", on, v1u, ""},
		{"session/set_title", on, codex, "agent"},
		// everything else
		{"initialize", on, codex, "policy"},
		{"session/update", on, codex, "policy"},
		{"session/request_permission", on, codex, "policy"},
		{"fs/read_text_file", on, codex, "policy"},
		{"terminal/create", on, codex, "policy"},
		{"session/new ", on, codex, "policy"},
		{"Session/New", on, codex, "policy"},
		{"", on, codex, "policy"},
		{"future/method", on, later, "policy"},
	}
	for _, c := range cases {
		err := c.p.AllowClientMethod(c.method, c.caps)
		if got := outcome(err); got != c.want {
			t.Errorf("%q (%v agent): %q (%v), want %q", c.method, c.caps.Shape, got, err, c.want)
		}
	}
}

func TestClientMethodMessages(t *testing.T) {
	codex := ParseAgentCaps(fixtureBytes(t, "codex-acp"))
	err := Default().AllowClientMethod("session/delete", codex)
	if got := err.Error(); got != `method "session/delete" is not allowed by the gateway policy` {
		t.Errorf("policy message: %s", got)
	}
	on := allOn()
	err = on.AllowClientMethod("session/delete", codex)
	if got := err.Error(); got != `method "session/delete" is not available: the agent does not support it` {
		t.Errorf("agent message: %s", got)
	}
	var pe *Error
	if !errors.As(err, &pe) || pe.Kind != ErrUnsupported {
		t.Errorf("errors.As: %#v", err)
	}
	long := strings.Repeat("é", 200)
	msg := Default().AllowClientMethod(long, codex).Error()
	if len(msg) > 200 || !strings.Contains(msg, "…") {
		t.Errorf("long method names are cut: %d bytes", len(msg))
	}
	if msg := Default().AllowClientMethod("x\n\"y", codex).Error(); strings.ContainsAny(msg, "\n") {
		t.Errorf("control characters are quoted: %q", msg)
	}
}

func TestAllowAgentMethod(t *testing.T) {
	def, on, off := Default(), allOn(), Policy{}
	ext := Policy{Extensions: []string{"_zed.dev/*"}}
	authOnly := Policy{AgentAuth: true}
	unstOnly := Policy{Unstable: true}
	cases := []struct {
		method string
		p      Policy
		want   string
	}{
		{"session/update", off, ""},
		{"session/request_permission", off, ""},
		{"elicitation/create", off, ""},
		{"elicitation/complete", off, ""},
		{"$/cancel_request", off, ""},
		{"fs/read_text_file", def, ""},
		{"fs/read_text_file", off, "policy"},
		{"fs/write_text_file", def, ""},
		{"fs/write_text_file", Policy{Client: ClientPolicy{FsRead: true}}, "policy"},
		{"fs/delete_file", on, "policy"},
		{"terminal/create", def, "policy"},
		{"terminal/create", Policy{Client: ClientPolicy{Terminal: true}}, ""},
		{"terminal/output", on, ""},
		{"terminal/wait_for_exit", on, ""},
		{"terminal/kill", on, ""},
		{"terminal/release", on, ""},
		{"_zed.dev/notify", ext, ""},
		{"_zed.devx/notify", ext, "policy"},
		{"_other", def, "policy"},
		{"mcp/connect", def, "policy"},
		{"mcp/message", unstOnly, ""},
		{"proxy/successor", unstOnly, ""},
		{"auth/status_update", unstOnly, "policy"},
		{"auth/status_update", authOnly, "policy"},
		{"auth/status_update", on, ""},
		{"session/new", on, "policy"},
		{"initialize", on, "policy"},
		{"unknown/method", on, "policy"},
	}
	for _, c := range cases {
		err := c.p.AllowAgentMethod(c.method)
		if got := outcome(err); got != c.want {
			t.Errorf("%q: %q (%v), want %q", c.method, got, err, c.want)
		}
	}
}

func TestCheckPromptBlock(t *testing.T) {
	codex := ParseAgentCaps(fixtureBytes(t, "codex-acp"))           // image, embeddedContext
	laterU := ParseAgentCaps(fixtureBytes(t, "v2-schema-unstable")) // image, embeddedContext (audio: null)
	later := ParseAgentCaps(fixtureBytes(t, "v2-schema"))           // image, audio, embeddedContext
	def, on, off := Default(), allOn(), Policy{}
	cases := []struct {
		typ  string
		p    Policy
		caps AgentCaps
		want string
	}{
		{"text", off, codex, ""},
		{"resource_link", off, later, ""},
		{"image", def, codex, ""},
		{"image", off, codex, "policy"},
		{"audio", def, later, "policy"},
		{"audio", on, later, ""},
		{"audio", on, codex, "agent"},
		{"audio", on, laterU, "agent"},
		{"resource", def, codex, ""},
		{"resource", Policy{Prompt: PromptPolicy{Image: true}}, codex, "policy"},
		{"resource", def, ParseAgentCaps(fixtureBytes(t, "v2-no-session")), "agent"},
		{"_custom", on, codex, "policy"},
		{"video", on, codex, "policy"},
		{"", on, codex, "policy"},
	}
	for _, c := range cases {
		err := c.p.CheckPromptBlock(3, c.typ, c.caps)
		if got := outcome(err); got != c.want {
			t.Errorf("%q: %q (%v), want %q", c.typ, got, err, c.want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "prompt[3]: ") {
			t.Errorf("%q: message %q does not name the block", c.typ, err)
		}
	}
	if msg := off.CheckPromptBlock(0, "image", codex).Error(); msg != "prompt[0]: image content is not allowed by the gateway policy" {
		t.Errorf("message: %s", msg)
	}
}

func TestCheckAdditionalDirectories(t *testing.T) {
	claude := ParseAgentCaps(fixtureBytes(t, "claude-agent-acp"))
	codex := ParseAgentCaps(fixtureBytes(t, "codex-acp"))
	later := ParseAgentCaps(fixtureBytes(t, "v2-schema"))
	for _, c := range []struct {
		p    Policy
		caps AgentCaps
		want string
	}{
		{Default(), claude, ""},
		{Default(), later, ""},
		{Default(), codex, "agent"},
		{Policy{}, claude, "policy"},
	} {
		if got := outcome(c.p.CheckAdditionalDirectories(c.caps)); got != c.want {
			t.Errorf("%+v: %q, want %q", c.caps, got, c.want)
		}
	}
}

// TestGatesMatchFilter: for every fixture and policy, a method the
// filtered initialize result advertises (re-parsed) is one the gate lets
// through, and vice versa for the gated session and prompt capabilities.
func TestGatesMatchFilter(t *testing.T) {
	ps := testPolicies()
	for _, fx := range fixtures(t) {
		agent := ParseAgentCaps(fx.raw)
		for _, name := range sortedNames(ps) {
			p := ps[name]
			out, err := FilterInitialize(fx.raw, p)
			if err != nil {
				t.Fatal(err)
			}
			seen := ParseAgentCaps(out)
			for method, adv := range map[string]bool{
				"session/load": seen.Load, "session/resume": seen.Resume, "session/close": seen.Close,
				"session/list": seen.List, "session/delete": seen.Delete, "session/fork": seen.Fork,
			} {
				gateOK := p.AllowClientMethod(method, agent) == nil
				// The later v2 shape advertises resume/close/list as baseline:
				// the gate may refuse what it cannot hide.
				if adv && !gateOK && !(agent.Shape == ShapeV2 && method != "session/load" && method != "session/delete" && method != "session/fork") {
					t.Errorf("%s/%s: %s advertised but refused", fx.name, name, method)
				}
				if !adv && gateOK {
					t.Errorf("%s/%s: %s not advertised but allowed", fx.name, name, method)
				}
			}
			for typ, adv := range map[string]bool{"image": seen.PromptImage, "audio": seen.PromptAudio, "resource": seen.PromptEmbeddedContext} {
				if gateOK := p.CheckPromptBlock(0, typ, agent) == nil; gateOK != adv {
					t.Errorf("%s/%s: prompt %s advertised %v, gate %v", fx.name, name, typ, adv, gateOK)
				}
			}
			if gateOK := p.CheckAdditionalDirectories(agent) == nil; gateOK != seen.AdditionalDirectories {
				t.Errorf("%s/%s: additionalDirectories advertised %v, gate %v", fx.name, name, seen.AdditionalDirectories, gateOK)
			}
		}
	}
}
