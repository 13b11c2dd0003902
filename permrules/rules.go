// Package permrules decides an agent's permission requests at the gateway,
// by standing rules, before any client is asked: the `permissions:` lists
// of the configuration, a tenant's own or the top-level default.
//
// A rule names a tool kind (ACP's ToolKind), a title glob and a path glob,
// each optional, and what to decide: allow, deny or ask. The first rule
// that matches a request decides; no match asks the clients, as does ask
// (which also stops the search). A rule matches when each key it sets
// matches:
//
//   - kind: the tool call's kind, equal. A request without one matches no
//     rule that names a kind.
//   - title: a glob over the whole raw title, where * is any run of
//     characters (slashes and newlines too), ? one character, [...] a
//     class, and \ quotes the next character. A request without a title
//     matches no rule that has one. A title holding a control character
//     never matches an allow rule's title.
//   - path: a glob over each location of the tool call, relative to the
//     tenant's virtual root: segments split at /, each matched with
//     [path.Match], and a ** segment stands for any number of segments
//     (none too; "**" alone matches every path inside the root). A
//     location outside the root, or not absolute, matches no glob. An
//     allow rule needs every location to match (and at least one
//     location); deny and ask need one location to match.
//
// The matching reads the request as clients would be sent it: its paths
// are already the tenant's virtual ones, and a path outside the root is
// shown redacted, so it matches nothing.
package permrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
)

// What a rule decides.
const (
	Allow = "allow" // the agent gets the request's allow option; no client is asked
	Deny  = "deny"  // the agent gets the request's reject option; no client is asked
	Ask   = "ask"   // the clients are asked; later rules are not looked at
)

// Kinds are ACP's tool kinds (ToolKind), the values a rule's kind may have.
var Kinds = []string{"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}

// Rule is one entry of a `permissions:` list.
type Rule struct {
	Kind   string `yaml:"kind"`
	Title  string `yaml:"title"`
	Path   string `yaml:"path"`
	Decide string `yaml:"decide"`
}

// Problem is what is wrong with one key of a rule.
type Problem struct {
	Key string // kind, title, path or decide
	Msg string
}

// Check lists what is wrong with r: an unknown kind or decide value, a bad
// glob, a path that is absolute or climbs with "..".
func (r Rule) Check() []Problem {
	var ps []Problem
	if r.Kind != "" && !slices.Contains(Kinds, r.Kind) {
		ps = append(ps, Problem{"kind", fmt.Sprintf("%s is not an ACP tool kind (%s)", strconv.Quote(r.Kind), strings.Join(Kinds, ", "))})
	}
	if err := checkTitle(r.Title); err != nil {
		ps = append(ps, Problem{"title", fmt.Sprintf("%s: %v", strconv.Quote(r.Title), err)})
	}
	if err := checkPath(r.Path); err != nil {
		ps = append(ps, Problem{"path", fmt.Sprintf("%s: %v", strconv.Quote(r.Path), err)})
	}
	switch r.Decide {
	case Allow, Deny, Ask:
	case "":
		ps = append(ps, Problem{"decide", "is required: allow, deny or ask"})
	default:
		ps = append(ps, Problem{"decide", fmt.Sprintf("%s is not allow, deny or ask", strconv.Quote(r.Decide))})
	}
	return ps
}

// String is the rule as the clients and the audit trail are told of it:
// its keys in a YAML flow mapping, strings quoted (control characters
// escaped).
func (r Rule) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for _, kv := range [][2]string{{"kind", r.Kind}, {"title", r.Title}, {"path", r.Path}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, "%s: %s, ", kv[0], strconv.Quote(kv[1]))
		}
	}
	b.WriteString("decide: " + r.Decide + "}")
	return b.String()
}

func checkTitle(glob string) error {
	if strings.ContainsFunc(glob, isControl) {
		return errors.New("holds a control character")
	}
	for i := 0; i < len(glob); i++ {
		switch glob[i] {
		case '\\':
			if i++; i == len(glob) {
				return errors.New("ends with a lone \\")
			}
		case '[':
			end := strings.IndexByte(glob[i+1:], ']')
			if end < 0 {
				return errors.New("has a [ without its ]")
			}
			if _, err := path.Match(glob[i:i+end+2], "x"); err != nil {
				return fmt.Errorf("class %s: %w", glob[i:i+end+2], err)
			}
			i += end + 1
		}
	}
	return nil
}

func checkPath(glob string) error {
	if glob == "" {
		return nil
	}
	if strings.HasPrefix(glob, "/") {
		return errors.New("must be relative to the tenant's root, not absolute")
	}
	for seg := range strings.SplitSeq(glob, "/") {
		switch seg {
		case "..":
			return errors.New(`must not climb out with ".."`)
		case "", ".":
			return errors.New(`has an empty or "." segment`)
		}
		if _, err := path.Match(seg, ""); err != nil {
			return fmt.Errorf("segment %s: %w", strconv.Quote(seg), err)
		}
	}
	return nil
}

// isControl reports a C0 or C1 control character, or DEL.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }

// matchTitle matches a title glob against the whole of s, in time linear
// in len(s) times the glob's length (an agent chooses the title: a
// backtracking matcher would let a crafted one stall its reader): on a
// mismatch only the last '*' takes one more character.
func matchTitle(glob, s string) (bool, error) {
	toks, err := titleTokens(glob)
	if err != nil {
		return false, err
	}
	ti, si := 0, 0
	star, mark := -1, 0 // the last '*' seen, and where its run ends so far
	for si < len(s) {
		switch {
		case ti < len(toks) && toks[ti].star:
			star, mark = ti, si
			ti++
			continue
		case ti < len(toks):
			if n, ok, err := toks[ti].match(s[si:]); err != nil {
				return false, err
			} else if ok {
				ti, si = ti+1, si+n
				continue
			}
		}
		if star < 0 {
			return false, nil
		}
		_, n := firstRune(s[mark:]) // the '*' takes one more character
		mark += n
		ti, si = star+1, mark
	}
	for ti < len(toks) && toks[ti].star {
		ti++
	}
	return ti == len(toks), nil
}

// titleToken is one step of a title glob: a '*', a '?', a class or a
// literal character.
type titleToken struct {
	star  bool
	any   bool   // '?'
	class string // "[...]"
	lit   string // one character
}

// titleTokens splits a title glob into its steps.
func titleTokens(glob string) ([]titleToken, error) {
	var toks []titleToken
	for len(glob) > 0 {
		switch glob[0] {
		case '*':
			toks = append(toks, titleToken{star: true})
			glob = strings.TrimLeft(glob, "*")
		case '?':
			toks = append(toks, titleToken{any: true})
			glob = glob[1:]
		case '[':
			end := strings.IndexByte(glob[1:], ']')
			if end < 0 {
				return nil, path.ErrBadPattern
			}
			toks = append(toks, titleToken{class: glob[:end+2]})
			glob = glob[end+2:]
		default:
			if glob[0] == '\\' {
				if len(glob) < 2 {
					return nil, path.ErrBadPattern
				}
				glob = glob[1:]
			}
			lit, n := firstRune(glob)
			toks = append(toks, titleToken{lit: lit})
			glob = glob[n:]
		}
	}
	return toks, nil
}

// match reports whether the step matches the start of s, and how many
// bytes it takes.
func (t titleToken) match(s string) (int, bool, error) {
	r, n := firstRune(s)
	switch {
	case n == 0:
		return 0, false, nil
	case t.any:
		return n, true, nil
	case t.class != "":
		ok, err := path.Match(t.class, r)
		return n, ok, err
	}
	return n, r == t.lit, nil
}

// firstRune is s's first character as a string, and its length in bytes.
func firstRune(s string) (string, int) {
	for i := range s {
		if i > 0 {
			return s[:i], i
		}
	}
	return s, len(s)
}

// matchPath matches a path glob against a slash-separated relative path
// (no segments: the root itself).
func matchPath(glob, rel []string) bool {
	for len(glob) > 0 {
		if glob[0] == "**" {
			for i := 0; i <= len(rel); i++ {
				if matchPath(glob[1:], rel[i:]) {
					return true
				}
			}
			return false
		}
		if len(rel) == 0 {
			return false
		}
		if ok, _ := path.Match(glob[0], rel[0]); !ok {
			return false
		}
		glob, rel = glob[1:], rel[1:]
	}
	return len(rel) == 0
}

// relative is p's segments below root (nil, true: root itself); false when
// p is not absolute or lies outside root.
func relative(root, p string) ([]string, bool) {
	if !strings.HasPrefix(p, "/") || !strings.HasPrefix(root, "/") {
		return nil, false
	}
	p, root = path.Clean(p), path.Clean(root)
	if p == root {
		return nil, true
	}
	rest, ok := strings.CutPrefix(p, strings.TrimSuffix(root, "/")+"/")
	if !ok {
		return nil, false
	}
	return strings.Split(rest, "/"), true
}

// request is what a rule looks at in a session/request_permission.
type request struct {
	Params struct {
		ToolCall struct {
			Kind      *string `json:"kind"`
			Title     *string `json:"title"`
			Locations []struct {
				Path string `json:"path"`
			} `json:"locations"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Kind     string `json:"kind"`
		} `json:"options"`
	} `json:"params"`
}

// compiled is a checked rule, its path glob split.
type compiled struct {
	Rule
	path []string
	name string // how clients and the audit trail are told of it
}

func (c *compiled) matches(req *request, root string) bool {
	tc := &req.Params.ToolCall
	if c.Kind != "" && (tc.Kind == nil || *tc.Kind != c.Kind) {
		return false
	}
	if c.Title != "" {
		if tc.Title == nil || (c.Decide == Allow && strings.ContainsFunc(*tc.Title, isControl)) {
			return false
		}
		if ok, _ := matchTitle(c.Title, *tc.Title); !ok {
			return false
		}
	}
	if c.path == nil {
		return true
	}
	if len(tc.Locations) == 0 {
		return false
	}
	for _, l := range tc.Locations {
		rel, inside := relative(root, l.Path)
		ok := inside && matchPath(c.path, rel)
		if c.Decide == Allow && !ok {
			return false
		}
		if c.Decide != Allow && ok {
			return true
		}
	}
	return c.Decide == Allow
}

// outcome is the RequestPermissionOutcome that answers req as decide
// says: its allow_once option (else allow_always) for allow, reject_once
// (else reject_always) for deny, cancelled when it has neither.
func outcome(req *request, decide string) []byte {
	once, always := "allow_once", "allow_always"
	if decide == Deny {
		once, always = "reject_once", "reject_always"
	}
	for _, kind := range []string{once, always} {
		for _, o := range req.Params.Options {
			if o.Kind == kind {
				b, _ := json.Marshal(map[string]string{"outcome": "selected", "optionId": o.OptionID})
				return b
			}
		}
	}
	return []byte(`{"outcome":"cancelled"}`)
}
