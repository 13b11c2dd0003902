package policy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// policyKey is one boolean of a Policy, for building policies key by key.
type policyKey struct {
	name string
	set  func(*Policy, bool)
}

var policyKeys = []policyKey{
	{"session.load", func(p *Policy, v bool) { p.Session.Load = v }},
	{"session.resume", func(p *Policy, v bool) { p.Session.Resume = v }},
	{"session.close", func(p *Policy, v bool) { p.Session.Close = v }},
	{"session.list", func(p *Policy, v bool) { p.Session.List = v }},
	{"session.delete", func(p *Policy, v bool) { p.Session.Delete = v }},
	{"session.fork", func(p *Policy, v bool) { p.Session.Fork = v }},
	{"session.additional_directories", func(p *Policy, v bool) { p.Session.AdditionalDirectories = v }},
	{"mcp.stdio", func(p *Policy, v bool) { p.MCP.Stdio = v }},
	{"mcp.http", func(p *Policy, v bool) { p.MCP.HTTP = v }},
	{"mcp.sse", func(p *Policy, v bool) { p.MCP.SSE = v }},
	{"prompt.image", func(p *Policy, v bool) { p.Prompt.Image = v }},
	{"prompt.audio", func(p *Policy, v bool) { p.Prompt.Audio = v }},
	{"prompt.embedded_context", func(p *Policy, v bool) { p.Prompt.EmbeddedContext = v }},
	{"client.fs_read", func(p *Policy, v bool) { p.Client.FsRead = v }},
	{"client.fs_write", func(p *Policy, v bool) { p.Client.FsWrite = v }},
	{"client.terminal", func(p *Policy, v bool) { p.Client.Terminal = v }},
	{"agent_auth", func(p *Policy, v bool) { p.AgentAuth = v }},
	{"unstable", func(p *Policy, v bool) { p.Unstable = v }},
}

func allOn() Policy {
	var p Policy
	for _, k := range policyKeys {
		k.set(&p, true)
	}
	p.Extensions = []string{"_*"}
	return p
}

// testPolicies: Default, all-on, all-off, and for every key "only" that key
// and "all but" that key, plus Default with that key flipped.
func testPolicies() map[string]Policy {
	ps := map[string]Policy{"default": Default(), "all-on": allOn(), "all-off": {}}
	for _, k := range policyKeys {
		var only Policy
		k.set(&only, true)
		ps["only "+k.name] = only
		but := allOn()
		k.set(&but, false)
		ps["all but "+k.name] = but
		flipOn, flipOff := Default(), Default()
		k.set(&flipOn, true)
		k.set(&flipOff, false)
		ps["default + "+k.name] = flipOn
		ps["default - "+k.name] = flipOff
	}
	return ps
}

func sortedNames(ps map[string]Policy) []string {
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type fixture struct {
	name string
	raw  []byte
}

func fixtures(t testing.TB) []fixture {
	t.Helper()
	files, err := filepath.Glob("testdata/initialize/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	var fs []fixture
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, fixture{strings.TrimSuffix(filepath.Base(f), ".json"), b})
	}
	return fs
}

func fixtureBytes(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/initialize", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ---- The independent property checker ----
//
// It knows the capability table as written in the protocol reference
// (PROTOCOL.md §6 and the draft pages), decodes with encoding/json, and
// shares no code with the package's filter.

type capKind int

const (
	kBool     capKind = iota // v1 boolean; advertised = true
	kUnstBool                // v1 unstable boolean: removed when not allowed
	kMarker                  // {} marker; advertised = object
	kDraft                   // v2 draft-only marker: null when not allowed
	kOpaque                  // unstable opaque value; advertised = present, not null
)

type capSpec struct {
	path    string // dot-separated from the result
	kind    capKind
	allowed func(Policy) bool
}

func capTable() []capSpec {
	var t []capSpec
	add := func(path string, k capKind, f func(Policy) bool) { t = append(t, capSpec{path, k, f}) }
	// v1
	add("agentCapabilities.loadSession", kBool, func(p Policy) bool { return p.Session.Load })
	add("agentCapabilities.promptCapabilities.image", kBool, func(p Policy) bool { return p.Prompt.Image })
	add("agentCapabilities.promptCapabilities.audio", kBool, func(p Policy) bool { return p.Prompt.Audio })
	add("agentCapabilities.promptCapabilities.embeddedContext", kBool, func(p Policy) bool { return p.Prompt.EmbeddedContext })
	add("agentCapabilities.mcpCapabilities.http", kBool, func(p Policy) bool { return p.MCP.HTTP })
	add("agentCapabilities.mcpCapabilities.sse", kBool, func(p Policy) bool { return p.MCP.SSE })
	add("agentCapabilities.mcpCapabilities.acp", kUnstBool, func(p Policy) bool { return p.Unstable })
	sess := map[string]func(Policy) bool{
		"list":                  func(p Policy) bool { return p.Session.List },
		"resume":                func(p Policy) bool { return p.Session.Resume },
		"close":                 func(p Policy) bool { return p.Session.Close },
		"delete":                func(p Policy) bool { return p.Session.Delete },
		"additionalDirectories": func(p Policy) bool { return p.Session.AdditionalDirectories },
		"fork":                  func(p Policy) bool { return p.Session.Fork && p.Unstable },
		"systemPrompt":          func(p Policy) bool { return p.Unstable },
		"archive":               func(p Policy) bool { return p.Unstable },
		"status":                func(p Policy) bool { return p.Unstable },
		"title":                 func(p Policy) bool { return p.Unstable },
	}
	for k, f := range sess {
		add("agentCapabilities.sessionCapabilities."+k, kMarker, f)
		kind := kMarker
		if k == "list" || k == "resume" || k == "close" {
			kind = kDraft
		}
		add("capabilities.session."+k, kind, f)
	}
	add("capabilities.session.load", kDraft, func(p Policy) bool { return p.Session.Load })
	for _, pre := range []string{"agentCapabilities.auth.", "capabilities.auth."} {
		add(pre+"logout", kMarker, func(p Policy) bool { return p.AgentAuth })
		add(pre+"status", kMarker, func(p Policy) bool { return p.AgentAuth && p.Unstable })
	}
	for _, pre := range []string{"agentCapabilities.", "capabilities."} {
		for _, k := range []string{"providers", "nes", "positionEncoding"} {
			add(pre+k, kOpaque, func(p Policy) bool { return p.Unstable })
		}
	}
	// v2
	add("capabilities.session.mcp.stdio", kMarker, func(p Policy) bool { return p.MCP.Stdio })
	add("capabilities.session.mcp.http", kMarker, func(p Policy) bool { return p.MCP.HTTP })
	add("capabilities.session.mcp.sse", kMarker, func(p Policy) bool { return p.MCP.SSE })
	add("capabilities.session.mcp.acp", kMarker, func(p Policy) bool { return p.Unstable })
	add("capabilities.session.prompt.image", kMarker, func(p Policy) bool { return p.Prompt.Image })
	add("capabilities.session.prompt.audio", kMarker, func(p Policy) bool { return p.Prompt.Audio })
	add("capabilities.session.prompt.embeddedContext", kMarker, func(p Policy) bool { return p.Prompt.EmbeddedContext })
	return t
}

// containers are the objects whose members the table describes; every
// other member of them must pass through byte for byte.
var containers = []string{
	"", "agentCapabilities", "agentCapabilities.promptCapabilities", "agentCapabilities.mcpCapabilities",
	"agentCapabilities.sessionCapabilities", "agentCapabilities.auth",
	"capabilities", "capabilities.session", "capabilities.session.mcp", "capabilities.session.prompt", "capabilities.auth",
}

// jsonIndex maps the paths of a document's nested object members (names
// joined by NUL, up to four levels) to their raw values.
type jsonIndex map[string]json.RawMessage

func indexJSON(raw []byte) jsonIndex {
	idx := jsonIndex{"": raw}
	var walk func(prefix string, v json.RawMessage, depth int)
	walk = func(prefix string, v json.RawMessage, depth int) {
		if depth >= 4 || jsonKind(v) != '{' {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return
		}
		for k, sub := range m {
			path := k
			if depth > 0 {
				path = prefix + "\x00" + k
			}
			idx[path] = sub
			walk(path, sub, depth+1)
		}
	}
	walk("", raw, 0)
	return idx
}

// rawAt looks up a dot path (the table's member names contain no dots).
func rawAt(idx jsonIndex, path string) (json.RawMessage, bool) {
	v, ok := idx[strings.ReplaceAll(path, ".", "\x00")]
	return v, ok
}

func jsonKind(v json.RawMessage) byte {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return 0
	}
	return v[0]
}

func advertises(idx jsonIndex, s capSpec) bool {
	v, ok := rawAt(idx, s.path)
	if !ok {
		return false
	}
	switch s.kind {
	case kBool, kUnstBool:
		return string(bytes.TrimSpace(v)) == "true"
	case kMarker, kDraft:
		return jsonKind(v) == '{'
	default:
		return jsonKind(v) != 'n'
	}
}

// orderedKeys lists an object's member names in order (encoding/json's
// token stream).
func orderedKeys(raw json.RawMessage) ([]string, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, false
		}
	}
	return keys, true
}

// checkFiltered asserts the filter's contract for one input, policy and
// output, independently of the implementation:
//   - every capability in the table: advertised in out ⇔ advertised in in ∧
//     allowed by p, and its value in out is well formed;
//   - authMethods: [] unless p.AgentAuth, else byte-identical;
//   - every other member of a capability container: byte-identical;
//   - member order kept, no member added.
func checkFiltered(t *testing.T, inRaw, outRaw []byte, p Policy) {
	t.Helper()
	if !json.Valid(outRaw) {
		t.Fatalf("output is not valid JSON:\n%s", outRaw)
	}
	in, out := indexJSON(inRaw), indexJSON(outRaw)
	known := map[string]capSpec{}
	for _, s := range capTable() {
		known[s.path] = s
		inHas, outHas := advertises(in, s), advertises(out, s)
		if want := inHas && s.allowed(p); outHas != want {
			t.Errorf("%s: advertised=%v, want %v (agent %v, policy %v)", s.path, outHas, want, inHas, s.allowed(p))
		}
		v, present := rawAt(out, s.path)
		if _, had := rawAt(in, s.path); had && !present && s.kind == kBool {
			t.Errorf("%s: v1 boolean removed (it should become false)", s.path)
		}
		if !present {
			continue
		}
		k := jsonKind(v)
		switch s.kind {
		case kBool, kUnstBool:
			if k != 't' && k != 'f' {
				t.Errorf("%s: %s is not a boolean", s.path, v)
			}
			if s.kind == kUnstBool && !s.allowed(p) {
				t.Errorf("%s: unstable key kept", s.path)
			}
		case kMarker:
			if k != '{' && k != 'n' {
				t.Errorf("%s: %s is not a marker", s.path, v)
			}
		case kDraft:
			if k != '{' && k != 'n' {
				t.Errorf("%s: %s is not a marker", s.path, v)
			}
			if _, had := rawAt(in, s.path); !had {
				t.Errorf("%s: added", s.path)
			}
		case kOpaque:
			if !s.allowed(p) {
				t.Errorf("%s: unstable key kept", s.path)
			}
		}
	}
	isContainer := map[string]bool{}
	for _, c := range containers {
		isContainer[c] = true
	}
	for _, c := range containers {
		inObj, ok1 := rawAt(in, c)
		outObj, ok2 := rawAt(out, c)
		if !ok1 || jsonKind(inObj) != '{' {
			if ok2 && jsonKind(outObj) == '{' {
				t.Errorf("%q: became an object", c)
			}
			continue
		}
		if !ok2 {
			t.Errorf("%q: container removed", c)
			continue
		}
		if jsonKind(outObj) != '{' {
			continue // a malformed container normalized to null is checked by its members
		}
		inKeys, _ := orderedKeys(inObj)
		outKeys, _ := orderedKeys(outObj)
		// out's keys are a subsequence of in's.
		j := 0
		for _, k := range outKeys {
			for j < len(inKeys) && inKeys[j] != k {
				j++
			}
			if j == len(inKeys) {
				t.Errorf("%q: member %q added or reordered (in %v, out %v)", c, k, inKeys, outKeys)
				break
			}
			j++
		}
		var inM, outM map[string]json.RawMessage
		_ = json.Unmarshal(inObj, &inM)
		_ = json.Unmarshal(outObj, &outM)
		for k, iv := range inM {
			path := strings.TrimPrefix(c+"."+k, ".")
			if _, ok := known[path]; ok || isContainer[path] || (c == "" && k == "authMethods") {
				continue
			}
			ov, ok := outM[k]
			if !ok || !bytes.Equal(iv, ov) {
				t.Errorf("%q: unknown member changed: %s -> %s", path, iv, ov)
			}
		}
	}
	if iv, ok := rawAt(in, "authMethods"); ok {
		ov, ok := rawAt(out, "authMethods")
		switch {
		case !ok:
			t.Errorf("authMethods removed")
		case p.AgentAuth && jsonKind(iv) == '[' && !bytes.Equal(iv, ov):
			t.Errorf("authMethods changed although agent_auth is on: %s", ov)
		case !p.AgentAuth:
			var arr []any
			if json.Unmarshal(ov, &arr) != nil || len(arr) != 0 {
				t.Errorf("authMethods = %s, want []", ov)
			}
		}
	} else if _, ok := rawAt(out, "authMethods"); ok {
		t.Errorf("authMethods added")
	}
}

// decoded is a JSON value decoded for deep comparison.
func decoded(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("compact: %v", err)
	}
	return buf.String()
}
