package policy

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// CheckMCPServer decides whether one mcpServers[] entry of session/new,
// load, resume or fork (raw: the entry's JSON object) may go to the agent.
//
// The transport is the entry's "type": "stdio", "http", "sse" or the
// unstable "acp". An entry without "type" is stdio (the v1 form; v2
// requires the type, and classifying a missing one as stdio is the
// conservative reading). Custom ("_"-prefixed) and unknown types are
// refused. The transport must be allowed by the policy (acp: p.Unstable)
// and advertised by the agent (v1: stdio always, http and sse in
// mcpCapabilities; v2: session.mcp.*). An http or sse entry's "url" must be
// an absolute http or https URL without user info whose host is a DNS name
// or an IP literal, allowed by p.MCP.HTTPHosts (empty: any host).
//
// Errors name the entry by index and name and give the reason; they never
// repeat command, args, env, headers or the URL beyond its host. They wrap
// ErrNotAllowed, ErrUnsupported or ErrInvalid (the caller answers -32602).
func (p Policy) CheckMCPServer(index int, raw []byte, caps AgentCaps) error {
	label := "mcpServers[" + strconv.Itoa(index) + "]"
	ms, err := objectMembers(raw)
	if err != nil {
		return &Error{Kind: ErrInvalid, Msg: label + ": not a valid JSON object"}
	}
	if name, ok := stringValue(lookup(ms, "name")); ok {
		label += " " + quoteClient(name)
	}
	fail := func(kind error, format string, args ...any) error {
		return &Error{Kind: kind, Msg: label + ": " + fmt.Sprintf(format, args...)}
	}

	transport := "stdio"
	if v := lookup(ms, "type"); v != nil {
		t, ok := stringValue(v)
		if !ok {
			return fail(ErrInvalid, `"type" must be a string`)
		}
		transport = t
	}
	var allowed, supported bool
	switch transport {
	case "stdio":
		allowed, supported = p.MCP.Stdio, caps.MCPStdio
	case "http":
		allowed, supported = p.MCP.HTTP, caps.MCPHTTP
	case "sse":
		allowed, supported = p.MCP.SSE, caps.MCPSSE
	case "acp":
		allowed, supported = p.Unstable, caps.MCPACP
	default:
		return fail(ErrNotAllowed, "MCP transport type %s is not allowed by this gateway", quoteClient(transport))
	}
	if !allowed {
		return fail(ErrNotAllowed, "%s MCP servers are not allowed by this gateway", transport)
	}
	if !supported {
		return fail(ErrUnsupported, "the agent does not support %s MCP servers", transport)
	}
	if transport != "http" && transport != "sse" {
		return nil
	}

	s, ok := stringValue(lookup(ms, "url"))
	if !ok {
		return fail(ErrInvalid, `"url" must be a string`)
	}
	host, why := urlHost(s)
	if why != "" {
		return fail(ErrInvalid, "its url %s", why)
	}
	if len(p.MCP.HTTPHosts) > 0 && !MatchHost(p.MCP.HTTPHosts, host) {
		return fail(ErrNotAllowed, "host %s is not among the MCP hosts this gateway allows", quoteClient(host))
	}
	return nil
}

// urlHost returns the host of an http(s) URL, or why it is not acceptable.
// It is strict so that the gateway and the agent cannot read different
// hosts from one URL: no spaces, control characters or backslashes, no user
// info ("https://allowed@evil"), no percent-encoded or non-ASCII hosts.
func urlHost(s string) (host, why string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f || c == '\\' {
			return "", "is not a valid URL (spaces, control characters or backslashes)"
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", "is not a valid URL"
	}
	if scheme := strings.ToLower(u.Scheme); scheme != "http" && scheme != "https" {
		return "", "must be an http or https URL"
	}
	if u.Opaque != "" || u.Host == "" {
		return "", "must be an absolute http or https URL with a host"
	}
	if u.User != nil {
		return "", "must not contain user info (send credentials in headers)"
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", "has an invalid port"
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", "has an invalid port"
	}
	host = strings.ToLower(u.Hostname())
	if !validHostName(host) {
		if _, err := netip.ParseAddr(host); err != nil || strings.Contains(host, "%") {
			return "", "does not have a valid host name"
		}
	}
	return host, ""
}

// validHostName reports whether h is a lower-case DNS name: labels of
// letters, digits, '-' and '_', separated by single dots, an optional
// trailing dot.
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// normHost lower-cases h, drops the brackets of an IPv6 literal and one
// trailing dot.
func normHost(h string) string {
	h = strings.ToLower(h)
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") && strings.Contains(h, ":") {
		h = h[1 : len(h)-1]
	}
	return strings.TrimSuffix(h, ".")
}

// MatchHost reports whether host matches one of patterns, ignoring ASCII
// case, a trailing dot and IPv6 brackets. A pattern is an exact host name
// or IP literal, or "*.example.com", which matches every subdomain of
// example.com at any depth (a.example.com, a.b.example.com) but not
// example.com itself, and never an IP literal.
//
// host is a bare host name as returned by url.URL.Hostname: there is no
// port handling. A host or pattern with a port ("example.com:8443") is not
// a host name and matches nothing, so an allowed host is allowed on every
// port of that host. Malformed patterns (see [ValidateHostPattern]) match
// nothing.
func MatchHost(patterns []string, host string) bool {
	h := normHost(host)
	addr, ipErr := netip.ParseAddr(h)
	isIP := ipErr == nil
	if !isIP && !validHostName(h) {
		return false // "host:port", or not a host name at all
	}
	for _, pat := range patterns {
		if ValidateHostPattern(pat) != nil {
			continue
		}
		pn := normHost(pat)
		if suffix, ok := strings.CutPrefix(pn, "*"); ok { // suffix = ".example.com"
			if !isIP && len(h) > len(suffix) && strings.HasSuffix(h, suffix) {
				return true
			}
			continue
		}
		if pn == h {
			return true
		}
		if isIP { // "::1" and "0:0:0:0:0:0:0:1" are one address
			if a, err := netip.ParseAddr(pn); err == nil && a == addr {
				return true
			}
		}
	}
	return false
}

// ValidateHostPattern checks one mcp.http_hosts entry: a host name
// ("mcp.example.com"), an IP literal ("10.0.0.7", "::1" or "[::1]"), or a
// wildcard "*.example.com" standing above at least two labels. No scheme,
// port, path or other use of "*".
func ValidateHostPattern(pat string) error {
	bad := func(why string) error { return fmt.Errorf("host pattern %q: %s", pat, why) }
	h := normHost(pat)
	if h == "" {
		return bad("empty")
	}
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/?#@") {
		return bad(`want a host name only, e.g. "mcp.example.com" or "*.example.com"`)
	}
	if _, err := netip.ParseAddr(h); err == nil && !strings.Contains(h, "%") {
		return nil
	}
	if strings.Contains(h, ":") {
		return bad("ports are not part of a host pattern: an allowed host is allowed on every port")
	}
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		if !strings.Contains(rest, ".") {
			return bad(`a wildcard must stand above at least two labels, e.g. "*.example.com"`)
		}
		h = rest
	}
	if strings.Contains(h, "*") {
		return bad(`"*" is only allowed as the whole leftmost label ("*.example.com")`)
	}
	if !validHostName(h) {
		return bad("not a valid host name (letters, digits, '-', '_' and dots; IDNs in their xn-- form)")
	}
	return nil
}
