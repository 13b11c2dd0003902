package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestDefault(t *testing.T) {
	want := Policy{
		Session: SessionPolicy{Load: true, Resume: true, Close: true, List: true, Delete: false, Fork: false, AdditionalDirectories: true},
		MCP:     MCPPolicy{Stdio: false, HTTP: true, SSE: false, HTTPHosts: nil},
		Prompt:  PromptPolicy{Image: true, Audio: false, EmbeddedContext: true},
		Client:  ClientPolicy{FsRead: true, FsWrite: true, Terminal: false},
	}
	if got := Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("Default() = %+v", got)
	}
	r, w, term := Default().ClientCaps()
	if !r || !w || term {
		t.Errorf("ClientCaps = %v %v %v", r, w, term)
	}
	if err := Default().Validate(); err != nil {
		t.Error(err)
	}
}

func TestDescribe(t *testing.T) {
	want := `session:
  load: true
  resume: true
  close: true
  list: true
  delete: false
  fork: false
  additional_directories: true
mcp:
  stdio: false
  http: true
  sse: false
  http_hosts: []  # any host
prompt:
  image: true
  audio: false
  embedded_context: true
client:
  fs_read: true
  fs_write: true
  terminal: false
agent_auth: false
extensions: []  # none
unstable: false
models:
  allow: null  # every model
modes:
  allow: null  # every mode
meta:
  allow: []  # only traceparent, tracestate, acpgate
`
	if got := Default().Describe(); got != want {
		t.Errorf("Describe:\n%s", got)
	}
	p := Default()
	p.MCP.HTTPHosts = []string{"*.example.com", `we"ird`}
	p.Extensions = []string{"_zed.dev/*"}
	p.Unstable = true
	got := p.String()
	for _, s := range []string{"  http_hosts:\n    - \"*.example.com\"\n    - \"we\\\"ird\"\n", "extensions:\n  - \"_zed.dev/*\"\n", "unstable: true\n"} {
		if !strings.Contains(got, s) {
			t.Errorf("String() lacks %q:\n%s", s, got)
		}
	}
	// One key per line, every key of the policy present.
	lines := strings.Count(Default().Describe(), "\n")
	if lines != 30 {
		t.Errorf("%d lines", lines)
	}
}

func TestValidate(t *testing.T) {
	p := Default()
	p.MCP.HTTPHosts = []string{"ok.example.com", "bad:80", "*.com"}
	p.Extensions = []string{"_ok/*", "noprefix", "_a*b", "_sp ace"}
	err := p.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{`"bad:80"`, `"*.com"`, `"noprefix"`, `"_a*b"`, `"_sp ace"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error lacks %s: %v", s, err)
		}
	}
	if strings.Contains(err.Error(), "ok.example.com") || strings.Contains(err.Error(), "_ok/*") {
		t.Errorf("valid entries reported: %v", err)
	}
}

func TestMatchExtension(t *testing.T) {
	pats := []string{"_zed.dev/*", "_acme/exact", "*", "_a*b*", "nounderscore*"}
	for m, want := range map[string]bool{
		"_zed.dev/x":       true,
		"_zed.dev/":        true,
		"_zed.dev":         false,
		"_zed.devil/x":     false,
		"_acme/exact":      true,
		"_acme/exactly":    false,
		"_a*b/x":           false, // "*" inside a pattern is malformed: no match
		"_other":           false, // "*" alone is malformed: no match
		"nounderscore/abc": false,
	} {
		if got := matchExtension(pats, m); got != want {
			t.Errorf("%q: %v, want %v", m, got, want)
		}
	}
	if !matchExtension([]string{"_*"}, "_anything") {
		t.Error(`"_*" matches every extension`)
	}
}
