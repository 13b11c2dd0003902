package policy

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/filtered golden files")

// restrict is the expected ParseAgentCaps of a filtered result: the agent's
// capabilities intersected with the policy, written from the brief's rules.
func restrict(c AgentCaps, p Policy) AgentCaps {
	r := c
	r.Load = c.Load && p.Session.Load
	if c.Shape != ShapeV2 { // the later v2 shape has them as baseline
		r.Resume = c.Resume && p.Session.Resume
		r.Close = c.Close && p.Session.Close
		r.List = c.List && p.Session.List
	}
	r.Delete = c.Delete && p.Session.Delete
	r.AdditionalDirectories = c.AdditionalDirectories && p.Session.AdditionalDirectories
	r.Fork = c.Fork && p.Session.Fork && p.Unstable
	if c.Shape != ShapeV1 { // v1 stdio is mandatory: no flag to clear
		r.MCPStdio = c.MCPStdio && p.MCP.Stdio
	}
	r.MCPHTTP = c.MCPHTTP && p.MCP.HTTP
	r.MCPSSE = c.MCPSSE && p.MCP.SSE
	r.MCPACP = c.MCPACP && p.Unstable
	r.PromptImage = c.PromptImage && p.Prompt.Image
	r.PromptAudio = c.PromptAudio && p.Prompt.Audio
	r.PromptEmbeddedContext = c.PromptEmbeddedContext && p.Prompt.EmbeddedContext
	if !p.AgentAuth {
		r.AuthMethods, r.Logout = 0, false
	}
	r.AuthStatus = c.AuthStatus && p.AgentAuth && p.Unstable
	r.Providers = c.Providers && p.Unstable
	r.NES = c.NES && p.Unstable
	r.SystemPrompt = c.SystemPrompt && p.Unstable
	r.Archive = c.Archive && p.Unstable
	r.SessionStatus = c.SessionStatus && p.Unstable
	r.Title = c.Title && p.Unstable
	return r
}

// TestFilterProperties: every fixture × every test policy satisfies the
// independent checker, keeps its shape, re-parses to the restricted
// capabilities, and filtering is idempotent.
func TestFilterProperties(t *testing.T) {
	ps := testPolicies()
	for _, fx := range fixtures(t) {
		for _, name := range sortedNames(ps) {
			p := ps[name]
			t.Run(fx.name+"/"+name, func(t *testing.T) {
				out, err := FilterInitialize(fx.raw, p)
				if err != nil {
					t.Fatal(err)
				}
				checkFiltered(t, fx.raw, out, p)
				in := ParseAgentCaps(fx.raw)
				got := ParseAgentCaps(out)
				if want := restrict(in, p); got != want {
					t.Errorf("re-parsed caps\n got %+v\nwant %+v", got, want)
				}
				again, err := FilterInitialize(out, p)
				if err != nil || !bytes.Equal(again, out) {
					t.Errorf("not idempotent: %v\n%s\n%s", err, out, again)
				}
			})
		}
	}
}

// TestFilterAllOnIsIdentity: when the policy allows everything, a
// well-formed result passes byte for byte.
func TestFilterAllOnIsIdentity(t *testing.T) {
	for _, fx := range fixtures(t) {
		if fx.name == "v1-malformed" {
			continue
		}
		out, err := FilterInitialize(fx.raw, allOn())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, fx.raw) {
			t.Errorf("%s: changed under all-on:\n%s", fx.name, out)
		}
	}
}

func TestFilterExpected(t *testing.T) {
	allButFork := allOn()
	allButFork.Session.Fork = false
	cases := []struct {
		fixture string
		policy  Policy
		want    string
	}{
		{"codex-acp", Default(), `{"protocolVersion":1,"agentCapabilities":{"loadSession":true,
			"promptCapabilities":{"image":true,"audio":false,"embeddedContext":true},
			"mcpCapabilities":{"http":true,"sse":false},
			"sessionCapabilities":{"list":{},"resume":{},"close":{}},"auth":{}},
			"authMethods":[],"agentInfo":{"name":"codex-acp","title":"Codex","version":"0.16.0"}}`},
		{"claude-agent-acp", Policy{}, `{"protocolVersion":1,"agentCapabilities":{
			"_meta":{"claudeCode":{"promptQueueing":true}},
			"promptCapabilities":{"image":false,"embeddedContext":false},
			"mcpCapabilities":{"http":false,"sse":false},"loadSession":false,"sessionCapabilities":{}},
			"agentInfo":{"name":"@agentclientprotocol/claude-agent-acp","title":"Claude Agent","version":"0.49.0"},
			"authMethods":[]}`},
		{"claude-code-acp", Default(), `{"protocolVersion":1,"agentCapabilities":{
			"promptCapabilities":{"image":true,"embeddedContext":true},
			"mcpCapabilities":{"http":true,"sse":false},"loadSession":true,
			"sessionCapabilities":{"list":{},"resume":{}}},
			"agentInfo":{"name":"@zed-industries/claude-code-acp","title":"Claude Code","version":"0.16.2"},
			"authMethods":[]}`},
		{"v2-draft", Default(), `{"protocolVersion":2,"info":{"name":"v2-draft-agent",
			"title":"Hand-built from docs/v2-draft-initialization.txt and v2-draft-session-setup.txt","version":"0.0.0"},
			"capabilities":{"session":{"load":{},"resume":{},"close":{},"additionalDirectories":{},
			"mcp":{"http":{}},"prompt":{"image":{},"embeddedContext":{}}},"auth":{}},"authMethods":[]}`},
		{"v2-draft", Policy{}, `{"protocolVersion":2,"info":{"name":"v2-draft-agent",
			"title":"Hand-built from docs/v2-draft-initialization.txt and v2-draft-session-setup.txt","version":"0.0.0"},
			"capabilities":{"session":{"load":null,"resume":null,"close":null,"mcp":{},"prompt":{}},"auth":{}},"authMethods":[]}`},
		{"v2-schema", Default(), `{"protocolVersion":2,"info":{"name":"v2-schema-agent",
			"title":"Hand-built from schema/v2/schema.json (InitializeResponse)","version":"2.0.0-alpha.3"},
			"capabilities":{"session":{"prompt":{"image":{},"embeddedContext":{},"_meta":{"example.com/prompt":{"maxImages":4}}},
			"mcp":{"http":{}},"additionalDirectories":{},"_meta":{"example.com/session":"x"}},
			"auth":{},"_meta":{"zed.dev":{"feature":true}}},"authMethods":[],
			"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`},
		{"v2-schema-unstable", allButFork, `{"protocolVersion":2,"info":{"name":"v2-unstable-agent",
			"title":"Hand-built from schema/v2/schema.unstable.json","version":"2.0.0-alpha.3"},
			"capabilities":{"session":{"prompt":{"image":{},"audio":null,"embeddedContext":{}},
			"mcp":{"stdio":{},"http":{},"acp":{},"_x.example/quic":{}},"delete":{},"additionalDirectories":{},
			"systemPrompt":{"mode":{"override":{}}},"archive":{},"status":{},"title":{},"futureMarker":{}},
			"auth":{"status":{}},"providers":{},"futureTop":{"nested":[true,{"a":null}]},
			"_meta":{"example.com/unstable":"é😀"}},
			"authMethods":[{"type":"agent","methodId":"login","name":"Log in"},
			{"type":"_example.com/sso","methodId":"sso","name":"SSO","realm":"corp"}]}`},
		{"v1-unstable", Default(), `{"protocolVersion":1,"agentCapabilities":{"loadSession":true,
			"promptCapabilities":{"image":true,"audio":false,"embeddedContext":true,"_meta":{"k":"v"}},
			"mcpCapabilities":{"http":true,"sse":false},
			"sessionCapabilities":{"list":{},"additionalDirectories":{},"resume":{},"close":{},"futureMarker":{},"_meta":null},
			"auth":{},"futureFlag":true,"_meta":{"zed.dev":{"x":[1,2.5e3,"\u2028"]}}},
			"authMethods":[],
			"agentInfo":{"name":"v1-unstable-agent","title":"Hand-built from schema/v1/schema.unstable.json","version":"1.25.0"},
			"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`},
		{"v1-malformed", allOn(), `{"protocolVersion":1,"agentCapabilities":{"loadSession":false,
			"promptCapabilities":{"image":false,"audio":false,"embeddedContext":true},"mcpCapabilities":null,
			"sessionCapabilities":{"close":{}},"auth":{}},"authMethods":[],
			"agentInfo":{"name":"v1-malformed","version":"0"}}`},
		{"v2-no-session", allOn(), `{"protocolVersion":2,"info":{"name":"v2-no-session","version":"0"},
			"capabilities":{"auth":{}},"authMethods":[]}`},
	}
	for _, c := range cases {
		t.Run(c.fixture, func(t *testing.T) {
			out, err := FilterInitialize(fixtureBytes(t, c.fixture), c.policy)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := decoded(t, out), decoded(t, []byte(c.want)); !reflect.DeepEqual(got, want) {
				t.Errorf("got\n%s\nwant\n%s", compact(t, out), compact(t, []byte(c.want)))
			}
		})
	}
}

// TestFilterBytes pins the in-place edit: spacing, order and the exact bytes
// of everything not edited survive; commas stay right whichever members go.
func TestFilterBytes(t *testing.T) {
	p := Default()
	cases := []struct{ in, want string }{
		{ // spacing and unknown members
			`{"a":1, "agentCapabilities" : { "loadSession" : true , "x":[1,2] ,"mcpCapabilities":{"acp":true}} , "authMethods":[{"id":"q"}]}`,
			`{"a":1, "agentCapabilities" : { "loadSession" : true , "x":[1,2] ,"mcpCapabilities":{}} , "authMethods":[]}`,
		},
		{ // first, middle and last members removed
			`{"agentCapabilities":{"sessionCapabilities":{"delete":{},"list":{},"fork":{},"resume":{},"archive":{}}}}`,
			`{"agentCapabilities":{"sessionCapabilities":{"list":{},"resume":{}}}}`,
		},
		{ // every member removed
			"{\"agentCapabilities\":{\"sessionCapabilities\":{\n  \"delete\": {},\n  \"fork\": {}\n}}}",
			`{"agentCapabilities":{"sessionCapabilities":{}}}`,
		},
		{ // booleans turned off in place; escaped names are the names they spell
			`{"agentCapabilities":{"\u006coadSession":true,"mcpCapabilities":{"sse":true,"http":true}}}`,
			`{"agentCapabilities":{"\u006coadSession":true,"mcpCapabilities":{"sse":false,"http":true}}}`,
		},
		{ // indentation kept when the last members go
			"{\n  \"agentCapabilities\": {\n    \"loadSession\": true,\n    \"providers\": {},\n    \"nes\": {}\n  }\n}\n",
			"{\n  \"agentCapabilities\": {\n    \"loadSession\": true\n  }\n}\n",
		},
		{ // v2 draft markers become null
			`{"protocolVersion":2,"capabilities":{"session":{"load":{},"delete":{}}}}`,
			`{"protocolVersion":2,"capabilities":{"session":{"load":{}}}}`,
		},
		{ // nothing to do: the same bytes
			` {"protocolVersion":1} `,
			` {"protocolVersion":1} `,
		},
	}
	for _, c := range cases {
		out, err := FilterInitialize([]byte(c.in), p)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if string(out) != c.want {
			t.Errorf("in   %s\ngot  %s\nwant %s", c.in, out, c.want)
		}
	}
	var off Policy
	out, _ := FilterInitialize([]byte(`{"capabilities":{"session":{"load":{},"list":{},"x":1}}}`), off)
	if want := `{"capabilities":{"session":{"load":null,"list":null,"x":1}}}`; string(out) != want {
		t.Errorf("draft markers: got %s, want %s", out, want)
	}
}

func TestFilterErrors(t *testing.T) {
	for _, in := range []string{
		``, `null`, `[]`, `"x"`, `{`, `{"a":1}{}`, `{"a":1,"a":2}`,
		`{"agentCapabilities":{"loadSession":true,"loadSession":false}}`,
		"{\"agentInfo\":{\"name\":\"\xff\"}}",
	} {
		if out, err := FilterInitialize([]byte(in), Default()); err == nil {
			t.Errorf("%q: no error, got %s", in, out)
		}
	}
}

// TestFilterGolden keeps the filtered fixtures under testdata/filtered for
// review (go test -run Golden -update rewrites them).
func TestFilterGolden(t *testing.T) {
	ps := map[string]Policy{"default": Default(), "all-off": {}}
	for _, fx := range fixtures(t) {
		for pn, p := range ps {
			out, err := FilterInitialize(fx.raw, p)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "filtered", fx.name+"."+pn+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("%s: differs from the golden file:\n%s", path, out)
			}
		}
	}
}

func TestFixturesPresent(t *testing.T) {
	var names []string
	for _, fx := range fixtures(t) {
		names = append(names, fx.name)
	}
	for _, want := range []string{"claude-code-acp", "claude-agent-acp", "codex-acp", "acpgate-demo", "v2-draft", "v2-schema"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("fixture %s missing", want)
		}
	}
}
