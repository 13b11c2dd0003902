package permrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/acpgate/acpgate/proxy/observe"
)

// List is one tenant's rules, checked, with the virtual root their paths
// are relative to. Immutable once made.
type List struct {
	rules []compiled
	root  string // "": the session's cwd (the gateway without tenants)
}

// Compile checks rules and makes them a List; root is the tenant's virtual
// root ("" for the gateway without tenants: paths are then relative to the
// session's cwd), where is how a rule is named ("permissions" makes
// "permissions[2]").
func Compile(rules []Rule, root, where string) (*List, error) {
	l := &List{root: root}
	var errs []error
	for i, r := range rules {
		name := fmt.Sprintf("%s[%d]", where, i)
		for _, p := range r.Check() {
			errs = append(errs, fmt.Errorf("%s.%s: %s", name, p.Key, p.Msg))
		}
		c := compiled{Rule: r, name: name + " " + r.String()}
		if r.Path != "" {
			c.path = strings.Split(r.Path, "/")
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
// session's (used when the list has no root).
func (l *List) Decide(msg []byte, cwd string) Verdict {
	if l == nil || len(l.rules) == 0 {
		return Verdict{}
	}
	var req request
	if err := json.Unmarshal(msg, &req); err != nil {
		return Verdict{} // the clients judge what the gateway cannot read
	}
	root := l.root
	if root == "" {
		root = cwd
	}
	for i := range l.rules {
		c := &l.rules[i]
		if !c.matches(&req, root) {
			continue
		}
		v := Verdict{Decide: c.Decide, Rule: c.name}
		if c.Decide != Ask {
			v.Outcome = outcome(&req, c.Decide)
		}
		return v
	}
	return Verdict{}
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
// (an observe.Decider): allow and deny rules answer the agent, with By
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

// Prompt never refuses a prompt.
func (d *Decider) Prompt(*observe.Event) *observe.Refusal { return nil }

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

var _ observe.Decider = (*Decider)(nil)
