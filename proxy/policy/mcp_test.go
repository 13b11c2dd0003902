package policy

import (
	"strings"
	"testing"
)

// Values that must never appear in an error message.
var secrets = []string{"SECRET", "/usr/bin/evil", "--token", "s3cr3t", "hunter2", "q=private"}

func TestCheckMCPServer(t *testing.T) {
	codex := ParseAgentCaps(fixtureBytes(t, "codex-acp"))          // v1: http, no sse
	claude := ParseAgentCaps(fixtureBytes(t, "claude-agent-acp"))  // v1: http, sse
	minimal := ParseAgentCaps(fixtureBytes(t, "v1-minimal"))       // v1: neither
	v1u := ParseAgentCaps(fixtureBytes(t, "v1-unstable"))          // v1: acp too
	draft := ParseAgentCaps(fixtureBytes(t, "v2-draft"))           // v2: stdio, http
	partial := ParseAgentCaps(fixtureBytes(t, "v2-draft-partial")) // v2: http only
	laterU := ParseAgentCaps(fixtureBytes(t, "v2-schema-unstable"))
	nonstd := ParseAgentCaps(fixtureBytes(t, "v2-nonstandard")) // v2: stdio, sse

	def, on := Default(), allOn()
	stdio := Default()
	stdio.MCP.Stdio = true
	hosts := Default()
	hosts.MCP.HTTPHosts = []string{"mcp.example.com", "*.tools.example.org", "10.0.0.7", "::1"}

	v1stdio := `{"name":"db","command":"/usr/bin/evil","args":["--token","s3cr3t"],"env":[{"name":"SECRET","value":"hunter2"}]}`
	v2stdio := `{"type":"stdio","name":"db","command":"/usr/bin/evil","args":["--token"],"env":[{"name":"SECRET","value":"hunter2"}]}`
	httpEntry := func(u string) string {
		return `{"type":"http","name":"api","url":"` + u + `","headers":[{"name":"Authorization","value":"Bearer hunter2"}]}`
	}
	sseEntry := `{"type":"sse","name":"events","url":"https://mcp.example.com/sse?q=private","headers":[]}`

	cases := []struct {
		desc  string
		p     Policy
		caps  AgentCaps
		entry string
		want  string // outcome
		msg   string // exact message, when given
	}{
		{"v1 stdio, default", def, codex, v1stdio, "policy", `mcpServers[1] "db": stdio MCP servers are not allowed by this gateway`},
		{"v1 stdio allowed", stdio, codex, v1stdio, "", ""},
		{"v1 explicit stdio type", stdio, codex, `{"type":"stdio","name":"x","command":"c","args":[],"env":[]}`, "", ""},
		{"v2 stdio, default", def, draft, v2stdio, "policy", `mcpServers[1] "db": stdio MCP servers are not allowed by this gateway`},
		{"v2 stdio allowed", stdio, draft, v2stdio, "", ""},
		{"v2 stdio not advertised", stdio, partial, v2stdio, "agent", `mcpServers[1] "db": the agent does not support stdio MCP servers`},
		{"v2 entry without type is stdio", def, draft, `{"name":"db","command":"/usr/bin/evil"}`, "policy", ""},
		{"v1 http", def, codex, httpEntry("https://mcp.example.com/mcp?q=private"), "", ""},
		{"v1 http not advertised", def, minimal, httpEntry("https://mcp.example.com/"), "agent", `mcpServers[1] "api": the agent does not support http MCP servers`},
		{"v1 http off", Policy{}, codex, httpEntry("https://mcp.example.com/"), "policy", `mcpServers[1] "api": http MCP servers are not allowed by this gateway`},
		{"v2 http", def, partial, httpEntry("http://localhost:8080/mcp"), "", ""},
		{"v1 sse off by default", def, claude, sseEntry, "policy", ""},
		{"v1 sse", on, claude, sseEntry, "", ""},
		{"v1 sse not advertised", on, codex, sseEntry, "agent", ""},
		{"v2 sse (not in v2)", on, draft, sseEntry, "agent", ""},
		{"v2 sse advertised anyway", on, nonstd, sseEntry, "", ""},
		{"acp needs unstable", def, v1u, `{"type":"acp","name":"a","serverId":"s"}`, "policy", ""},
		{"acp", on, v1u, `{"type":"acp","name":"a","serverId":"s"}`, "", ""},
		{"acp v2", on, laterU, `{"type":"acp","name":"a","serverId":"s"}`, "", ""},
		{"acp not advertised", on, codex, `{"type":"acp","name":"a","serverId":"s"}`, "agent", ""},
		{"custom type", on, laterU, `{"type":"_x.example/quic","name":"q"}`, "policy", `mcpServers[1] "q": MCP transport type "_x.example/quic" is not allowed by this gateway`},
		{"unknown type", on, claude, `{"type":"websocket","name":"w","url":"wss://x"}`, "policy", ""},
		{"type not a string", on, claude, `{"type":null,"name":"n","command":"/usr/bin/evil"}`, "invalid", ""},
		{"escaped type name", def, codex, `{"\u0074ype":"stdio","name":"e","command":"/usr/bin/evil"}`, "policy", ""},
		{"duplicate type", on, claude, `{"type":"http","type":"stdio","name":"d","url":"https://a.example.com"}`, "invalid", `mcpServers[1]: not a valid JSON object`},
		{"not an object", on, claude, `["stdio"]`, "invalid", ""},
		{"no name", def, codex, `{"command":"/usr/bin/evil"}`, "policy", `mcpServers[1]: stdio MCP servers are not allowed by this gateway`},
		// URLs
		{"url missing", def, codex, `{"type":"http","name":"api","headers":[]}`, "invalid", ""},
		{"url not a string", def, codex, `{"type":"http","name":"api","url":5}`, "invalid", ""},
		{"url relative", def, codex, httpEntry("/mcp"), "invalid", ""},
		{"url scheme", def, codex, httpEntry("file:///etc/passwd"), "invalid", ""},
		{"url ws", def, codex, httpEntry("ws://mcp.example.com/"), "invalid", ""},
		{"url userinfo", def, codex, httpEntry("https://mcp.example.com@evil.com/"), "invalid", ""},
		{"url userinfo password", def, codex, httpEntry("https://user:hunter2@mcp.example.com/"), "invalid", ""},
		{"url backslash", def, codex, httpEntry(`https://evil.com\\\\@mcp.example.com/`), "invalid", ""},
		{"url space", def, codex, httpEntry("https://mcp.example.com /x"), "invalid", ""},
		{"url encoded host", def, codex, httpEntry("https://mcp%2eexample.com/"), "invalid", ""},
		{"url bad port", def, codex, httpEntry("https://mcp.example.com:99999/"), "invalid", ""},
		{"url empty port", def, codex, httpEntry("https://mcp.example.com:/"), "invalid", ""},
		{"url no host", def, codex, httpEntry("https:///path"), "invalid", ""},
		{"url opaque", def, codex, httpEntry("https:mcp.example.com"), "invalid", ""},
		{"url unicode host", def, codex, httpEntry("https://mcp.exämple.com/"), "invalid", ""},
		{"url upper-case scheme and host", hosts, codex, httpEntry("HTTPS://MCP.Example.COM/x"), "", ""},
		// HTTPHosts
		{"host allowed", hosts, codex, httpEntry("https://mcp.example.com:8443/mcp?q=private"), "", ""},
		{"host not allowed", hosts, codex, httpEntry("https://evil.example.com/mcp?q=private"), "policy", `mcpServers[1] "api": host "evil.example.com" is not among the MCP hosts this gateway allows`},
		{"host suffix trick", hosts, codex, httpEntry("https://mcp.example.com.evil.com/"), "policy", ""},
		{"wildcard", hosts, codex, httpEntry("https://a.b.tools.example.org/"), "", ""},
		{"wildcard apex", hosts, codex, httpEntry("https://tools.example.org/"), "policy", ""},
		{"ip", hosts, codex, httpEntry("http://10.0.0.7:3000/"), "", ""},
		{"ip other", hosts, codex, httpEntry("http://10.0.0.8/"), "policy", ""},
		{"ipv6", hosts, codex, httpEntry("http://[0:0:0:0:0:0:0:1]:3000/"), "", ""},
		{"ipv6 zone", hosts, codex, httpEntry("http://[fe80::1%25eth0]/"), "invalid", ""},
		{"trailing dot", hosts, codex, httpEntry("https://mcp.example.com./"), "", ""},
	}
	for _, c := range cases {
		err := c.p.CheckMCPServer(1, []byte(c.entry), c.caps)
		if got := outcome(err); got != c.want {
			t.Errorf("%s: %q (%v), want %q", c.desc, got, err, c.want)
			continue
		}
		if err == nil {
			continue
		}
		if c.msg != "" && err.Error() != c.msg {
			t.Errorf("%s: message\n got %s\nwant %s", c.desc, err, c.msg)
		}
		if !strings.HasPrefix(err.Error(), "mcpServers[1]") {
			t.Errorf("%s: message does not name the entry: %s", c.desc, err)
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: message leaks %q: %s", c.desc, s, err)
			}
		}
	}
}

func TestMatchHost(t *testing.T) {
	pats := []string{"mcp.example.com", "*.example.org", "10.0.0.7", "[::1]", "Upper.Example.NET", "bad pattern", "*", "*.com", "a.*.example.io", "host.example:8080"}
	cases := []struct {
		host string
		want bool
	}{
		{"mcp.example.com", true},
		{"MCP.EXAMPLE.COM", true},
		{"mcp.example.com.", true},
		{"x.mcp.example.com", false},
		{"example.com", false},
		{"mcp.example.com:443", false}, // a port is not a host name
		{"a.example.org", true},
		{"a.b.example.org", true},
		{"example.org", false},
		{".example.org", false},
		{"a..example.org", false},
		{"aexample.org", false},
		{"example.org.evil.com", false},
		{"10.0.0.7", true},
		{"10.0.0.8", false},
		{"::1", true},
		{"[::1]", true},
		{"0:0:0:0:0:0:0:1", true},
		{"upper.example.net", true},
		{"anything.com", false}, // "*.com" is malformed: matches nothing
		{"a.b.example.io", false},
		{"host.example", false},
		{"", false},
		{"*", false},
		{"bad pattern", false},
	}
	for _, c := range cases {
		if got := MatchHost(pats, c.host); got != c.want {
			t.Errorf("MatchHost(%q) = %v, want %v", c.host, got, c.want)
		}
	}
	if MatchHost(nil, "example.com") {
		t.Error("no patterns match nothing (empty HTTPHosts means any host is decided by the caller)")
	}
	if MatchHost([]string{"*.1.0.10"}, "2.1.0.10") {
		t.Error("a wildcard never matches an IP literal")
	}
}

func TestValidateHostPattern(t *testing.T) {
	good := []string{"mcp.example.com", "*.example.com", "*.a.b.example.com", "localhost", "10.0.0.7", "::1", "[::1]", "MCP.Example.com", "under_score.example.com", "example.com."}
	bad := []string{"", "*", "*.com", "a.*.com", "*x.example.com", "https://mcp.example.com", "mcp.example.com:8080", "mcp.example.com/path", "user@host", "has space", "exämple.com", "fe80::1%eth0", "a..b", "[mcp.example.com]"}
	for _, g := range good {
		if err := ValidateHostPattern(g); err != nil {
			t.Errorf("%q: %v", g, err)
		}
	}
	for _, b := range bad {
		if err := ValidateHostPattern(b); err == nil {
			t.Errorf("%q: accepted", b)
		}
	}
}
