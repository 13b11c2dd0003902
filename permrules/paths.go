package permrules

import (
	"errors"
	"path"
	"strings"

	"github.com/acpgate/acpgate/proxy/pathmap"
)

// scope is where a request's paths are resolved.
type scope struct {
	root string          // the root as clients see it (the virtual root, or the session's cwd)
	cwd  string          // the session's cwd as clients see it
	m    *pathmap.Mapper // to the host directory; nil: no path can be resolved
	locs []resolved      // the request's locations, each looked at once for all rules

	// The request's title as the rules read it, worked out once for all.
	forms     []string // commandForms; nil: not yet
	allowed   bool     // allowable
	allowedOK bool     // allowed is worked out
}

// commandForms is commandForms(title), title being the request's.
func (sc *scope) commandForms(title string) []string {
	if sc.forms == nil {
		sc.forms = commandForms(title)
	}
	return sc.forms
}

// allowable is allowable(title, sc), title being the request's.
func (sc *scope) allowable(title string) bool {
	if !sc.allowedOK {
		sc.allowed, sc.allowedOK = allowable(title, sc), true
	}
	return sc.allowed
}

// resolved is one location of a request, below the root.
type resolved struct {
	lex      []string // as written, cleaned
	inside   bool     // lex is below the root
	res      []string // once its links are followed
	resolved bool     // res is below the root: the path has no ".." segment and could be resolved
	same     bool     // res is lex: no link on the way
	// unresolved: where it leads is unknown (not absolute, a ".." segment,
	// beyond maxLocations or maxSegments, no root to resolve in, a lookup
	// that failed); a location outside the root, as written or as
	// resolved, is known to be outside.
	unresolved bool
	done       bool // worked out
}

// location is locs[i] (of the request sc is for) below the root, worked
// out on first use.
func (sc *scope) location(locs []location, i int) *resolved {
	if sc.locs == nil {
		sc.locs = make([]resolved, len(locs))
	}
	l := &sc.locs[i]
	if l.done {
		return l
	}
	l.done = true
	p := locs[i].Path
	if !path.IsAbs(p) {
		l.unresolved = true
		return l
	}
	clean, dotdot := shape(p)
	if !clean {
		p = path.Clean(p) // a path already clean (most) is not copied again
	}
	l.lex, l.inside = below(sc.root, p)
	if !l.inside && !dotdot {
		return l // outside the root: no glob of the root's matches
	}
	if sc.m == nil || dotdot || i >= maxLocations || strings.Count(p, "/") > maxSegments {
		l.unresolved = true
		return l
	}
	r, err := sc.m.Resolve(p)
	switch {
	case errors.Is(err, pathmap.ErrSymlinkEscape):
	case err != nil:
		l.unresolved = true
	case r == p:
		l.res, l.resolved, l.same = l.lex, l.inside, true
	default:
		l.res, l.resolved = below(sc.root, r)
	}
	return l
}

// plain reports whether the absolute path p, a word of a title, is what
// it says: outside the root (not the root's to judge), or inside it, free
// of "..", and the path it resolves to.
func (sc *scope) plain(p string) bool {
	if sc.root == "" {
		return false
	}
	if _, inside := relative(sc.root, p); !inside {
		return true
	}
	if sc.m == nil || hasDotDot(p) || strings.Count(p, "/") > maxSegments {
		return false
	}
	r, err := sc.m.Resolve(p)
	return err == nil && r == path.Clean(p)
}

// shape reports, in one pass, whether the absolute path p is clean (as
// path.Clean leaves it) and whether it has a ".." segment.
func shape(p string) (clean, dotdot bool) {
	clean = len(p) == 1 || p[len(p)-1] != '/'
	for i := 0; i < len(p); {
		j := strings.IndexByte(p[i+1:], '/') + i + 1 // the segment p[i+1:j]
		if j == i {
			j = len(p)
		}
		switch p[i+1 : j] {
		case "":
			clean = clean && j == len(p)
		case ".":
			clean = false
		case "..":
			clean, dotdot = false, true
		}
		i = j
	}
	return clean, dotdot
}

// hasDotDot reports a ".." segment in p.
func hasDotDot(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}
