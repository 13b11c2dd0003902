// Package permrules decides an agent's permission requests at the gateway,
// by standing rules, before any client is asked: the `permissions:` lists
// of the configuration, a tenant's own or the top-level default.
//
// A rule names a tool kind (ACP's ToolKind), a title glob and a path glob,
// each optional, and what to decide: allow, deny or ask. The first rule
// that matches a request decides; no match asks the clients, as does ask
// (which also stops the search). The rules guard against the agent (a
// prompt-injected model choosing its tool calls), not against the tenant's
// own clients, who may approve anything or switch approval off. A rule
// matches when each key it sets matches:
//
//   - kind: the tool call's kind, equal. A request without one (such as
//     claude-code-acp's) matches no allow rule that names a kind; a deny
//     or ask rule that names a kind, and whose other keys match, cannot
//     judge it: the clients are asked, and no later rule is looked at.
//   - title: a glob over the whole raw title, where * is any run of
//     characters, ? one character, [...] a class, and \ quotes the next
//     character. A request without a title matches no rule that has one.
//     An allow rule matches as tokens and fails closed: its *, ? and
//     classes take no space or tab (a glob matches word by word), and it
//     never matches a title that holds a control character, a shell
//     control operator or substitution, a ".." segment, backticks that do
//     not pair, or a path inside the root that goes through a symbolic
//     link or cannot be resolved (see allowable). A deny or ask rule
//     matches the title or any form a shell would run its command under
//     (see commandForms): "`rm *`" denies "`git status && /bin/rm -rf ~`".
//   - path: a glob over each location of the tool call, relative to the
//     tenant's virtual root: segments split at /, each matched with
//     [path.Match], and a ** segment stands for any number of segments
//     (none too; "**" alone matches every path inside the root). A
//     location is resolved in the tenant's root (symbolic links followed,
//     [pathmap.Mapper.Resolve]). An allow rule needs every location, as
//     resolved, to match (and at least one location); a location with a
//     ".." segment, outside the root, not absolute, or that cannot be
//     resolved or resolves outside the root, matches no allow. Deny and
//     ask need one location to match, as written or as resolved; when
//     none does and one cannot be resolved (see matchLocations), the
//     clients are asked and no later rule is looked at.
//
// Matching a request against any rule takes time linear in the request's
// size times a constant of the rule: the globs are automata whose live
// states follow the title or path once; resolving paths in the file
// system is bounded by maxLocations and maxSegments.
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

// matchTitle matches a title glob, in steps, against the whole of s.
func matchTitle(toks []titleToken, s string, word bool) bool {
	return newTitleGlob(toks).match(s, word)
}

// titleGlob is a title glob ready to match: its steps are the states of
// an automaton whose set of live states follows the title one character
// at a time, so a match takes time linear in the title's length times the
// glob's (an agent chooses the title: a backtracking matcher would let a
// crafted one stall its reader). Up to 63 steps, the set is the bits of a
// word, and a character costs a few word operations.
type titleGlob struct {
	toks  []titleToken
	small bool        // fewer than 64 steps: the sets are bits
	star  uint64      // the '*' steps
	lit   uint64      // the literal steps
	ascii [128]uint64 // the steps other than '*' that take each ASCII character
}

func newTitleGlob(toks []titleToken) *titleGlob {
	g := &titleGlob{toks: toks, small: len(toks) < 64}
	if !g.small {
		return g
	}
	for i, t := range toks {
		switch {
		case t.star:
			g.star |= 1 << i
			continue
		case t.lit != "":
			g.lit |= 1 << i
		}
		for c := range rune(128) {
			if t.match(c) {
				g.ascii[c] |= 1 << i
			}
		}
	}
	return g
}

// match reports whether the glob matches the whole of s. With word set
// (allow rules), a '*', '?' or class never takes a space or a tab, so a
// glob matches a command word by word: "`cat docs/*`" is not matched by
// "`cat docs/a /etc/passwd`".
func (g *titleGlob) match(s string, word bool) bool {
	if !g.small {
		return g.matchLarge(s, word)
	}
	live := uint64(1)
	live |= (live & g.star) << 1
	for _, r := range s {
		var takes uint64
		if r < 128 {
			takes = g.ascii[r]
		} else {
			for i, t := range g.toks {
				if !t.star && t.match(r) {
					takes |= 1 << i
				}
			}
		}
		stars := g.star
		if word && (r == ' ' || r == '\t') {
			takes &= g.lit
			stars = 0
		}
		live = (live&takes)<<1 | live&stars
		live |= (live & g.star) << 1
		if live == 0 {
			return false
		}
	}
	return live&(1<<len(g.toks)) != 0
}

// matchLarge is match for a glob of 64 steps or more: the same automaton,
// its set a slice.
func (g *titleGlob) matchLarge(s string, word bool) bool {
	toks := g.toks
	cur, next := make([]bool, len(toks)+1), make([]bool, len(toks)+1)
	cur[0] = true
	starClosure(toks, cur)
	for _, r := range s {
		clear(next)
		live := false
		space := word && (r == ' ' || r == '\t')
		for i := range toks {
			t := &toks[i]
			switch {
			case !cur[i]:
			case space && t.lit == "":
			case t.star:
				next[i], live = true, true
			case t.match(r):
				next[i+1], live = true, true
			}
		}
		if !live {
			return false
		}
		starClosure(toks, next)
		cur, next = next, cur
	}
	return cur[len(toks)]
}

// starClosure adds to set the states a '*' reaches by taking nothing.
func starClosure(toks []titleToken, set []bool) {
	for i, t := range toks {
		if set[i] && t.star {
			set[i+1] = true
		}
	}
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

// match reports whether the step (not a '*') takes the character r.
func (t *titleToken) match(r rune) bool {
	switch {
	case t.any:
		return true
	case t.class != "":
		ok, _ := path.Match(t.class, string(r))
		return ok
	}
	return string(r) == t.lit
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
	return newPathGlob(glob).match(rel)
}

// pathGlob is a path glob ready to match, in time linear in the path's
// length times the glob's: as titleGlob, an automaton over the glob's
// segments whose live states follow the path one segment at a time (a
// "**" state takes any segment and stays; a segment glob takes one that
// fits it, [path.Match] being linear in the segment).
type pathGlob []pathSeg

// pathSeg is one segment of a path glob.
type pathSeg struct {
	glob     string
	globstar bool // "**"
	literal  bool // no metacharacter: takes itself only
}

func newPathGlob(glob []string) pathGlob {
	g := make(pathGlob, len(glob))
	for i, s := range glob {
		g[i] = pathSeg{glob: s, globstar: s == "**", literal: !strings.ContainsAny(s, `*?[\`)}
	}
	return g
}

func (g pathGlob) match(rel []string) bool {
	if len(g) >= 64 {
		return g.matchLarge(rel)
	}
	var globstars uint64
	for i := range g {
		if g[i].globstar {
			globstars |= 1 << i
		}
	}
	closure := func(set uint64) uint64 {
		for {
			next := set | (set&globstars)<<1
			if next == set {
				return set
			}
			set = next
		}
	}
	live := closure(1)
	for _, seg := range rel {
		var takes uint64
		for i := range g {
			if live&(1<<i) != 0 && !g[i].globstar && g[i].takes(seg) {
				takes |= 1 << i
			}
		}
		if live = closure(takes<<1 | live&globstars); live == 0 {
			return false
		}
	}
	return live&(1<<len(g)) != 0
}

// takes reports whether the segment glob (not "**") takes seg.
func (s *pathSeg) takes(seg string) bool {
	if s.literal {
		return s.glob == seg
	}
	ok, _ := path.Match(s.glob, seg)
	return ok
}

// matchLarge is match for a glob of 64 segments or more: the same
// automaton, its set a slice.
func (g pathGlob) matchLarge(rel []string) bool {
	cur, next := make([]bool, len(g)+1), make([]bool, len(g)+1)
	cur[0] = true
	g.closure(cur)
	for _, seg := range rel {
		clear(next)
		live := false
		for i := range g {
			switch s := &g[i]; {
			case !cur[i]:
			case s.globstar:
				next[i], live = true, true
			case s.takes(seg):
				next[i+1], live = true, true
			}
		}
		if !live {
			return false
		}
		g.closure(next)
		cur, next = next, cur
	}
	return cur[len(g)]
}

// closure adds to set the states a "**" reaches by taking no segment.
func (g pathGlob) closure(set []bool) {
	for i := range g {
		if set[i] && g[i].globstar {
			set[i+1] = true
		}
	}
}

// relative is p's segments below root (nil, true: root itself); false when
// p is not absolute or lies outside root.
func relative(root, p string) ([]string, bool) {
	if !path.IsAbs(p) || !path.IsAbs(root) {
		return nil, false
	}
	return below(path.Clean(root), path.Clean(p))
}

// below is relative for a clean absolute root and path.
func below(root, p string) ([]string, bool) {
	if root == "" || p == "" {
		return nil, false
	}
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
			Kind      *string    `json:"kind"`
			Title     *string    `json:"title"`
			Locations []location `json:"locations"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Kind     string `json:"kind"`
		} `json:"options"`
	} `json:"params"`
}

// location is one of a tool call's locations.
type location struct {
	Path string `json:"path"`
}

// compiled is a checked rule, its title glob in steps and its path glob
// split.
type compiled struct {
	Rule
	title *titleGlob // nil: no title key
	path  pathGlob   // nil: no path key
	name  string     // how clients and the audit trail are told of it
}

// A rule's verdict on one request.
type match uint8

const (
	noMatch     match = iota
	matched           // the rule decides
	kindUnknown       // a deny or ask rule whose other keys match, on a request without a kind
	unjudged          // a deny or ask rule with a path that matches no location, one of which it cannot resolve
)

// What a path rule resolves in a request: at most maxLocations locations,
// each of at most maxSegments segments. Resolving looks at the file system
// (one lstat a segment that exists), so these bound what an agent's
// request costs there. A location beyond them is not resolved.
const (
	maxLocations = 64
	maxSegments  = 256
)

// matches judges req by the rule, its paths resolved in sc.
func (c *compiled) matches(req *request, sc *scope) match {
	tc := &req.Params.ToolCall
	kindless := tc.Kind == nil || *tc.Kind == ""
	if c.Kind != "" && !kindless && *tc.Kind != c.Kind {
		return noMatch
	}
	if c.Kind != "" && kindless && c.Decide == Allow {
		return noMatch
	}
	if c.title != nil && (tc.Title == nil || !c.matchTitle(*tc.Title, sc)) {
		return noMatch
	}
	if c.path != nil {
		if m := c.matchLocations(tc.Locations, sc); m != matched {
			return m
		}
	}
	if c.Kind != "" && kindless {
		return kindUnknown
	}
	return matched
}

// matchTitle: an allow rule matches the title word by word, and only a
// title allowable says holds a plain command or paths (checked after the
// glob, whose words bound how many paths are looked up); a deny or ask
// rule matches any form a shell would run the title's command under.
func (c *compiled) matchTitle(title string, sc *scope) bool {
	if c.Decide == Allow {
		return !strings.ContainsFunc(title, isControl) && c.title.match(title, true) && sc.allowable(title)
	}
	for _, f := range sc.commandForms(title) {
		if c.title.match(f, false) {
			return true
		}
	}
	return false
}

// matchLocations: an allow rule needs every location, resolved in the
// root, to match (and at least one location). A deny or ask rule needs
// one location to match, as written or as resolved; when none does but one
// could not be resolved (not absolute, a ".." segment, beyond maxLocations
// or maxSegments, unreadable on the way), the rule cannot judge the
// request: unjudged.
func (c *compiled) matchLocations(locs []location, sc *scope) match {
	if len(locs) == 0 {
		return noMatch
	}
	unresolved := false
	for i := range locs {
		l := sc.location(locs, i)
		if c.Decide == Allow {
			if !l.resolved || !c.path.match(l.res) {
				return noMatch
			}
			continue
		}
		if l.inside && c.path.match(l.lex) || l.resolved && !l.same && c.path.match(l.res) {
			return matched
		}
		unresolved = unresolved || l.unresolved
	}
	switch {
	case c.Decide == Allow:
		return matched
	case unresolved:
		return unjudged
	}
	return noMatch
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
