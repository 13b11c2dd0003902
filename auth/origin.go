package auth

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// originPattern is one AllowedOrigins entry, normalized: lower-case scheme
// and host, port filled in with the scheme's default.
type originPattern struct {
	scheme, host, port string
	wildcard           bool // host is the suffix after "*."
}

func (p originPattern) match(o origin) bool {
	if o.scheme != p.scheme || o.port != p.port {
		return false
	}
	if !p.wildcard {
		return o.host == p.host
	}
	return len(o.host) > len(p.host)+1 && strings.HasSuffix(o.host, "."+p.host)
}

// origin is a parsed, normalized Origin header or AllowedOrigins entry.
type origin struct {
	scheme, host, port string
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http", "ws":
		return "80"
	case "https", "wss":
		return "443"
	}
	return ""
}

// parseOrigin parses "scheme://host[:port]" (no userinfo, path, query or
// fragment; an IPv6 host in brackets).
func parseOrigin(s string) (origin, bool) {
	var o origin
	i := strings.Index(s, "://")
	if i <= 0 {
		return o, false
	}
	o.scheme = strings.ToLower(s[:i])
	for j, c := range o.scheme {
		if !(c >= 'a' && c <= 'z' || j > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return o, false
		}
	}
	host, port, ok := splitHostPort(s[i+3:])
	if !ok {
		return o, false
	}
	o.host, o.port = host, port
	if port == "" {
		o.port = defaultPort(o.scheme)
	}
	return o, true
}

// splitHostPort splits "host[:port]" and lower-cases the host.
func splitHostPort(hp string) (host, port string, ok bool) {
	if hp == "" || strings.ContainsAny(hp, "/?#@\\ \t") {
		return "", "", false
	}
	if strings.HasPrefix(hp, "[") {
		end := strings.IndexByte(hp, ']')
		if end < 0 {
			return "", "", false
		}
		host, hp = hp[:end+1], hp[end+1:]
		if hp != "" {
			if hp[0] != ':' {
				return "", "", false
			}
			port = hp[1:]
			if port == "" {
				return "", "", false
			}
		}
	} else if k := strings.LastIndexByte(hp, ':'); k >= 0 {
		host, port = hp[:k], hp[k+1:]
		if port == "" || strings.Contains(host, ":") {
			return "", "", false
		}
	} else {
		host = hp
	}
	if host == "" || host == "[]" {
		return "", "", false
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '0' || port[0] == '+' {
			return "", "", false
		}
	}
	return strings.ToLower(host), port, true
}

func parseOrigins(list []string) ([]originPattern, error) {
	var out []originPattern
	var errs []error
	for _, s := range list {
		p, err := parseOriginPattern(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

func parseOriginPattern(s string) (originPattern, error) {
	bad := func(why string) (originPattern, error) {
		return originPattern{}, fmt.Errorf("auth: allowed origin %q: %s", s, why)
	}
	if s == "*" || s == "null" {
		return bad(`not supported: list each origin, e.g. "https://ide.example.com" or "https://*.example.com"`)
	}
	o, ok := parseOrigin(s)
	if !ok {
		return bad(`want scheme://host[:port] with nothing after it, e.g. "https://ide.example.com"`)
	}
	p := originPattern{scheme: o.scheme, host: o.host, port: o.port}
	if rest, ok := strings.CutPrefix(o.host, "*."); ok {
		if !strings.Contains(rest, ".") {
			return bad(`a wildcard must stand above at least two labels, e.g. "https://*.example.com"`)
		}
		p.host, p.wildcard = rest, true
	}
	if strings.Contains(p.host, "*") {
		return bad(`"*" is only allowed as the whole leftmost label ("https://*.example.com")`)
	}
	return p, nil
}

// checkOrigin applies the origin policy. A request without Origin (a
// non-browser tool) passes; one with Origin must be same-origin (an http or
// https Origin whose host and port are the request's Host) or match
// AllowedOrigins.
func (a *Authenticator) checkOrigin(r *http.Request) *Error {
	vals := r.Header.Values("Origin")
	if len(vals) == 0 {
		return nil
	}
	deny := fail(http.StatusForbidden, ReasonOriginNotAllowed,
		"this origin may not use the gateway: add it to the gateway's allowed origins")
	if len(vals) > 1 {
		return deny
	}
	o, ok := parseOrigin(strings.TrimSpace(vals[0]))
	if !ok {
		return deny
	}
	if a.sameOrigin(o, r.Host) || a.allowedCrossOrigin(o) {
		return nil
	}
	return deny
}

func (a *Authenticator) allowedCrossOrigin(o origin) bool {
	for _, p := range a.origins {
		if p.match(o) {
			return true
		}
	}
	return false
}

// sameOrigin reports whether o is the gateway's own origin as seen by the
// client: its host is the request's Host. A Host without a port is on the
// default port of the Origin's scheme.
func (a *Authenticator) sameOrigin(o origin, reqHost string) bool {
	if o.scheme != "http" && o.scheme != "https" {
		return false
	}
	host, port, ok := splitHostPort(reqHost)
	if !ok || host != o.host {
		return false
	}
	if port == "" {
		return o.port == defaultPort(o.scheme)
	}
	return port == o.port
}

// isAllowedCrossOrigin reports whether the request comes from an allowed
// cross-site origin (not same-origin), for CORS on the ticket endpoint.
func (a *Authenticator) isAllowedCrossOrigin(r *http.Request) (string, bool) {
	vals := r.Header.Values("Origin")
	if len(vals) != 1 {
		return "", false
	}
	o, ok := parseOrigin(strings.TrimSpace(vals[0]))
	if !ok || a.sameOrigin(o, r.Host) || !a.allowedCrossOrigin(o) {
		return "", false
	}
	return vals[0], true
}
