// Package redact keeps secrets out of what the gateway writes. A Redactor
// holds the set of secret values (the tenants' agent credentials, the
// gateway's own keys) and replaces each occurrence with Mark; NewHandler
// applies it to every record of a slog.Handler, message and attributes
// alike, so that no call site can forget it.
//
// The set is replaced whole (Set) when the configuration reloads; readers
// never lock.
package redact

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Mark replaces a secret.
const Mark = "[REDACTED]"

// MinLen is the shortest secret redacted: a shorter value would match
// ordinary text (and so show where it occurs) and mangle the log. Set
// reports the shorter ones, which the caller refuses or warns about.
const MinLen = 8

// Redactor replaces secrets in text. Its zero value redacts nothing; it is
// safe for concurrent use.
type Redactor struct {
	set atomic.Pointer[secretSet]
	gen atomic.Uint64 // counts Set calls: handlers rebuild what they hold
}

// secretSet is one generation of secrets, indexed by their first bytes so
// that a scan takes time linear in the text, whatever their number.
type secretSet struct {
	// first2 has the bit of each secret's first two bytes set: most
	// positions of a text are passed over on one lookup.
	first2 [1 << 16 / 64]uint64
	// byPrefix lists the secrets by their first four bytes, longest first,
	// so that of two overlapping secrets the longer is replaced whole.
	byPrefix map[uint32][]string
}

func newSecretSet(vals []string) *secretSet {
	set := &secretSet{byPrefix: map[uint32][]string{}}
	slices.SortFunc(vals, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, v := range vals {
		k := first2(v, 0)
		set.first2[k/64] |= 1 << (k % 64)
		p := prefix4(v, 0)
		set.byPrefix[p] = append(set.byPrefix[p], v)
	}
	return set
}

func first2(s string, i int) uint16 { return uint16(s[i]) | uint16(s[i+1])<<8 }
func prefix4(s string, i int) uint32 {
	return uint32(s[i]) | uint32(s[i+1])<<8 | uint32(s[i+2])<<16 | uint32(s[i+3])<<24
}

// find returns the first secret in s at or after from, and where: -1 if
// none.
func (set *secretSet) find(s string, from int) (int, string) {
	for i := from; i+MinLen <= len(s); i++ {
		k := first2(s, i)
		if set.first2[k/64]&(1<<(k%64)) == 0 {
			continue
		}
		for _, sec := range set.byPrefix[prefix4(s, i)] {
			if strings.HasPrefix(s[i:], sec) {
				return i, sec
			}
		}
	}
	return -1, ""
}

// Secret is one secret value and where it comes from (named in warnings,
// never the value).
type Secret struct {
	Source string
	Value  string
}

// Set makes secrets the set redacted from now on, with the forms a value
// takes once quoted by a JSON or Go encoder when they differ. It returns
// the sources of the values shorter than MinLen, which are not redacted.
func (r *Redactor) Set(secrets []Secret) (short []string) {
	seen := map[string]bool{}
	var vals []string
	add := func(v string) {
		if !seen[v] {
			seen[v] = true
			vals = append(vals, v)
		}
	}
	for _, s := range secrets {
		if len(s.Value) < MinLen {
			short = append(short, s.Source)
			continue
		}
		add(s.Value)
		if j, err := json.Marshal(s.Value); err == nil { // a JSON string, without its quotes
			add(string(j[1 : len(j)-1]))
		}
		q := strconv.Quote(s.Value)
		add(q[1 : len(q)-1])
	}
	r.set.Store(newSecretSet(vals))
	r.gen.Add(1)
	return short
}

// generation changes with every Set.
func (r *Redactor) generation() uint64 {
	if r == nil {
		return 0
	}
	return r.gen.Load()
}

// empty reports whether there is nothing to redact.
func (r *Redactor) empty() bool {
	if r == nil {
		return true
	}
	s := r.set.Load()
	return s == nil || len(s.byPrefix) == 0
}

// String returns s with every secret replaced by Mark; s itself when it
// holds none (no allocation). It takes time linear in len(s).
func (r *Redactor) String(s string) string {
	if r.empty() {
		return s
	}
	set := r.set.Load()
	i, sec := set.find(s, 0)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	last := 0
	for i >= 0 {
		b.WriteString(s[last:i])
		b.WriteString(Mark)
		last = i + len(sec)
		i, sec = set.find(s, last)
	}
	b.WriteString(s[last:])
	return b.String()
}

// Contains reports whether s holds a secret.
func (r *Redactor) Contains(s string) bool {
	if r.empty() {
		return false
	}
	i, _ := r.set.Load().find(s, 0)
	return i >= 0
}
