package policy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ModelPolicy is the model allow-list. The gateway removes every model
// outside it from what clients are shown (session results and config
// option updates), refuses a client's switch to one, and moves a session
// that the agent starts on one to the first allowed model it offers
// (package proxy/models).
type ModelPolicy struct {
	// Allow lists model ID patterns: "*" matches any run of characters
	// ("/" included), "?" any one character; every other character
	// matches itself (there are no classes or escapes). nil: every model;
	// empty: none.
	Allow []string `yaml:"allow"`
}

// maxPattern bounds the length of one allow-list pattern.
const maxPattern = 256

// Restricts reports whether the list limits the models at all.
func (m ModelPolicy) Restricts() bool { return m.Allow != nil }

// Allows reports whether sessions may run on the model id: with no list,
// every model; with one, a model that a valid pattern matches.
func (m ModelPolicy) Allows(id string) bool {
	if m.Allow == nil {
		return true
	}
	for _, pat := range m.Allow {
		if validateModelPattern(pat) == nil && matchGlob(pat, id) {
			return true
		}
	}
	return false
}

// Describe is the list for an error message: the patterns, quoted and
// comma-separated (at most the first 10).
func (m ModelPolicy) Describe() string {
	if len(m.Allow) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, pat := range m.Allow {
		if i == 10 {
			fmt.Fprintf(&b, ", … (%d more)", len(m.Allow)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(pat))
	}
	return b.String()
}

func validateModelPattern(pat string) error { return validatePattern(pat, "model") }

// validatePattern checks one allow-list pattern (models, modes, _meta
// keys); what names what it matches, for the error.
func validatePattern(pat, what string) error {
	switch {
	case pat == "":
		return fmt.Errorf("an empty pattern matches no %s", what)
	case len(pat) > maxPattern:
		return fmt.Errorf("%q…: longer than %d bytes", pat[:32], maxPattern)
	case !utf8.ValidString(pat):
		return fmt.Errorf("%q: not valid UTF-8", pat)
	}
	for _, r := range pat {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q: control characters are not allowed", pat)
		}
	}
	return nil
}

// matchGlob reports whether pat ("*": any run, "?": any one character)
// matches all of s. It takes O(len(pat)·len(s)) at worst: a "*" that
// fails is retried from one character further, never from further back.
func matchGlob(pat, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pat) && pat[p] == '*':
			star, mark = p, i
			p++
		case p < len(pat) && pat[p] == '?':
			_, n := utf8.DecodeRuneInString(s[i:])
			p, i = p+1, i+n
		case p < len(pat) && pat[p] == s[i]:
			p, i = p+1, i+1
		case star >= 0:
			_, n := utf8.DecodeRuneInString(s[mark:])
			mark += n
			p, i = star+1, mark
		default:
			return false
		}
	}
	for p < len(pat) && pat[p] == '*' {
		p++
	}
	return p == len(pat)
}
