package pathmap

import (
	"path"
	"strings"
)

// File URIs (RFC 8089) are accepted as "file:" (scheme case-insensitive)
// followed by either "//" + authority + absolute path, where the authority
// is empty or "localhost" (case-insensitive), or directly an absolute path
// ("file:/abs"). The path ends at the first "?" or "#"; what follows (the
// query and fragment) is kept verbatim. The path is percent-decoded leniently
// (a raw byte that should have been escaped is taken as itself) except that
// a bad escape, %00 and %2F are refused: an encoded slash inside a segment
// is rejected rather than turned into a separator. Mapped URIs are written
// as "file://" + the percent-encoded path (empty authority) + the suffix.

// URIToAgent maps a client URI to the agent's view. A file URI has its path
// mapped as by [Mapper.ToAgent] (and is refused when that refuses it); a
// bare absolute path (no scheme, leading "/") is mapped as a path; any other
// absolute URI (https:, zed:, untitled:, data:, ...) passes unchanged. A
// string without a scheme that is not an absolute path is refused with
// [ErrNotURI]: ACP URI fields hold absolute URIs, and a relative reference
// would be resolved by the agent against a base the gateway cannot check.
func (m *Mapper) URIToAgent(u string) (string, error) {
	if !hasFileScheme(u) {
		if u != "" && u[0] == '/' {
			return m.ToAgent(u)
		}
		if !hasScheme(u) {
			return "", &PathError{Path: u, Err: ErrNotURI}
		}
		return u, nil
	}
	raw, suffix, _, err := splitFileURI(u)
	if err != nil {
		return "", &PathError{Path: u, Err: err}
	}
	p, err := unescapePath(raw)
	if err != nil {
		return "", &PathError{Path: u, Err: err}
	}
	h, err := m.ToAgent(p)
	if err != nil {
		pe := err.(*PathError)
		pe.Path = u
		return "", pe
	}
	return "file://" + escapePath(h) + suffix, nil
}

// URIToClient maps an agent URI to the client's view, lexically. A file URI
// under the host root becomes a file URI under the virtual root; a bare
// absolute path is mapped as by [Mapper.ToClient]; any other string passes
// unchanged with ok true. ok is false for a file URI outside the root or one
// that is malformed (bad escape, %2F, %00, remote host); the result is then a
// redacted file URI, "file:///%3Coutside-workspace%3E/<basename>" with no
// query or fragment, safe to show the client.
//
// A clean file URI without escapes costs at most the allocation of the
// result, and none when the virtual root equals the root and u is already
// in canonical "file:///" form.
func (m *Mapper) URIToClient(u string) (string, bool) {
	if !hasFileScheme(u) {
		if u != "" && u[0] == '/' {
			return m.ToClient(u)
		}
		return u, true
	}
	raw, suffix, plain, err := splitFileURI(u)
	if err != nil {
		return redactedURI, false
	}
	if plain && isCleanAbs(raw) {
		// Fast path: the encoded path is its own decoding and already clean.
		tail, ok := cutRoot(raw, m.root)
		if !ok {
			return redactURI(raw), false
		}
		if m.identity && strings.HasPrefix(u, "file:///") {
			return u, true
		}
		if m.vrootOnly {
			if tail == "" {
				tail = "/"
			}
			return "file://" + tail + suffix, true
		}
		return "file://" + m.vrootURI + tail + suffix, true
	}
	p, err := unescapePath(raw)
	if err != nil {
		return redactedURI, false
	}
	tail, ok := cutRoot(path.Clean(p), m.root)
	if !ok {
		return redactURI(p), false
	}
	return "file://" + escapePath(m.virtual(tail)) + suffix, true
}

// redactedURI is the file URI stand-in for a path outside the root.
const redactedURI = "file:///%3Coutside-workspace%3E"

// redactURI is [Redact] for a decoded path, as a file URI.
func redactURI(p string) string {
	if b := keptBase(p); b != "" {
		return redactedURI + "/" + escapePath(b)
	}
	return redactedURI
}

// hasFileScheme reports whether u starts with "file:", in any case.
func hasFileScheme(u string) bool {
	return len(u) >= 5 && u[0]|0x20 == 'f' && u[1]|0x20 == 'i' && u[2]|0x20 == 'l' &&
		u[3]|0x20 == 'e' && u[4] == ':'
}

// hasScheme reports whether u starts with an RFC 3986 scheme and ":".
func hasScheme(u string) bool {
	for i := 0; i < len(u); i++ {
		c := u[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.':
			if i == 0 {
				return false
			}
		case c == ':':
			return i > 0
		default:
			return false
		}
	}
	return false
}

// splitFileURI splits a URI that has the file scheme into its still-encoded
// absolute path and its suffix (query and fragment, with their "?" or "#").
// plain reports that the path needs neither decoding nor encoding.
func splitFileURI(u string) (raw, suffix string, plain bool, err error) {
	rest := u[len("file:"):]
	end := 0
	plain = true
	for ; end < len(rest); end++ {
		c := rest[end]
		if c == '?' || c == '#' {
			break
		}
		plain = plain && safe[c]
	}
	hier, suffix := rest[:end], rest[end:]
	if strings.HasPrefix(hier, "//") {
		auth := hier[2:]
		i := strings.IndexByte(auth, '/')
		if i < 0 {
			return "", "", false, ErrBadURI // no path: "file://" or "file://host"
		}
		if host := auth[:i]; host != "" && !strings.EqualFold(host, "localhost") {
			return "", "", false, ErrRemoteHost
		}
		hier = auth[i:]
	} else if !strings.HasPrefix(hier, "/") {
		return "", "", false, ErrBadURI // "file:" or "file:relative"
	}
	return hier, suffix, plain, nil
}

// safe marks the bytes that stand for themselves in an encoded path: "/"
// and RFC 3986 pchar (unreserved, sub-delims, ":" and "@").
var safe = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "/-._~!$&'()*+,;=:@" {
		t[c] = true
	}
	return t
}()

func isSafe(c byte) bool { return safe[c] }

const upperhex = "0123456789ABCDEF"

// escapePath percent-encodes every byte of p that [isSafe] rejects.
func escapePath(p string) string {
	n := 0
	for i := 0; i < len(p); i++ {
		if !isSafe(p[i]) {
			n++
		}
	}
	if n == 0 {
		return p
	}
	var b strings.Builder
	b.Grow(len(p) + 2*n)
	for i := 0; i < len(p); i++ {
		c := p[i]
		if isSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperhex[c>>4])
		b.WriteByte(upperhex[c&15])
	}
	return b.String()
}

// unescapePath percent-decodes an encoded path. Bytes other than "%" stand
// for themselves. A bad escape or a decoded or raw NUL is [ErrBadURI]; an
// encoded slash is [ErrEncodedSlash].
func unescapePath(s string) (string, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return "", ErrBadURI
	}
	if strings.IndexByte(s, '%') < 0 {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "", ErrBadURI
		}
		c = unhex(s[i+1])<<4 | unhex(s[i+2])
		switch c {
		case '/':
			return "", ErrEncodedSlash
		case 0:
			return "", ErrBadURI
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
