package permrules

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pathmap"
)

// List is one tenant's rules, checked, with the root their paths are
// relative to. Immutable once made.
type List struct {
	rules []compiled
	m     *pathmap.Mapper // the tenant's root; nil: the session's cwd (the gateway without tenants)
}

// Compile checks rules and makes them a List; m maps the tenant's virtual
// root, which paths are relative to, to its host directory, where they
// are resolved (nil for the gateway without tenants: paths are then
// relative to the session's cwd); where is how a rule is named
// ("permissions" makes "permissions[2]").
func Compile(rules []Rule, m *pathmap.Mapper, where string) (*List, error) {
	l := &List{m: m}
	var errs []error
	for i, r := range rules {
		name := fmt.Sprintf("%s[%d]", where, i)
		for _, p := range r.Check() {
			errs = append(errs, fmt.Errorf("%s.%s: %s", name, p.Key, p.Msg))
		}
		c := compiled{Rule: r, name: name + " " + r.String()}
		if r.Path != "" {
			c.path = newPathGlob(strings.Split(r.Path, "/"))
		}
		if r.Title != "" {
			toks, _ := titleTokens(r.Title) // checked above
			c.title = newTitleGlob(toks)
		}
		l.rules = append(l.rules, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return l, nil
}

// Verdict is what a List says of one request.
type Verdict struct {
	Decide  string // Allow, Deny, Ask; "": no rule matched
	Rule    string // the rule that matched, named and written out
	Outcome []byte // for Allow and Deny: the RequestPermissionOutcome
}

// Decide looks for the first rule that matches msg, a
// session/request_permission as clients would be sent it; cwd is the
// session's as clients see it (the root when the list has none). A deny
// or ask rule naming a kind, whose other keys match a request that names
// no kind, cannot be judged: the clients are asked (Ask, the rule named
// with "(the request names no kind)"), and no later rule is looked at; so
// is one with a path that matches no location when one of them cannot be
// resolved (see matchLocations).
func (l *List) Decide(msg []byte, cwd string) Verdict {
	if l == nil || len(l.rules) == 0 {
		return Verdict{}
	}
	var req request
	if err := jsonv2.Unmarshal(msg, &req); err != nil {
		return Verdict{} // the clients judge what the gateway cannot read
	}
	sc := l.scope(cwd)
	for i := range l.rules {
		c := &l.rules[i]
		switch c.matches(&req, sc) {
		case noMatch:
			continue
		case kindUnknown:
			return Verdict{Decide: Ask, Rule: c.name + " (the request names no kind)"}
		case unjudged:
			return Verdict{Decide: Ask, Rule: c.name + " (a location cannot be resolved)"}
		}
		v := Verdict{Decide: c.Decide, Rule: c.name}
		if c.Decide != Ask {
			v.Outcome = outcome(&req, c.Decide)
		}
		return v
	}
	return Verdict{}
}

// scope is where the list resolves a request's paths: the tenant's root,
// else the session's cwd (mapped to itself, its symbolic links resolved;
// none when it cannot be, and then no path is resolved).
func (l *List) scope(cwd string) *scope {
	if l.m != nil {
		return &scope{root: l.m.VirtualRoot(), cwd: cwd, m: l.m}
	}
	sc := &scope{cwd: cwd}
	if path.IsAbs(cwd) {
		sc.root = path.Clean(cwd)
		sc.m, _ = pathmap.New(cwd, cwd)
	}
	return sc
}

// Table is every tenant's rules. Immutable once made.
type Table struct {
	Tenants map[string]*List // by tenant name ("": the gateway without tenants)
	Default *List            // for a tenant not in Tenants
}

func (t *Table) list(tenant string) *List {
	if t == nil {
		return nil
	}
	if l, ok := t.Tenants[tenant]; ok {
		return l
	}
	return t.Default
}

// Decider answers permission requests by the rules of the session's tenant
// (an observe.PermissionDecider): allow and deny rules answer the agent, with By
// "policy" and the rule; ask and no match leave it to the clients. Its
// table is swapped whole by Update (a configuration reload); safe for
// concurrent use.
type Decider struct {
	table atomic.Pointer[Table]
	count func(tenantLabel, decide string) // nil: not counted
}

// NewDecider decides by t; count, if not nil, is told of every rule that
// matched (tenantLabel: the tenant's label on metrics).
func NewDecider(t *Table, count func(tenantLabel, decide string)) *Decider {
	d := &Decider{count: count}
	d.table.Store(t)
	return d
}

// Update replaces the rules; requests already answered keep their answer.
func (d *Decider) Update(t *Table) { d.table.Store(t) }

// Permission decides e's request (e.Msg) by its tenant's rules.
func (d *Decider) Permission(e *observe.Event) (observe.Decision, bool) {
	if e.Session == nil {
		return observe.Decision{}, false
	}
	v := d.table.Load().list(e.Session.Tenant).Decide(e.Msg, e.Session.Cwd)
	if v.Decide != "" && d.count != nil {
		d.count(e.Session.Label, v.Decide)
	}
	if v.Decide != Allow && v.Decide != Deny {
		return observe.Decision{}, false
	}
	return observe.Decision{Outcome: v.Outcome, By: "policy", Rule: v.Rule, Decide: v.Decide}, true
}

var _ observe.PermissionDecider = (*Decider)(nil)
