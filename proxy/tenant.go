package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/pathmap"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/usage"
)

// TenantConfig is one tenant as the relay needs it.
type TenantConfig struct {
	Name string
	// Root is the host directory the tenant's sessions work in;
	// VirtualRoot what clients see for it ("" = Root). An empty Root turns
	// path mapping off (the gateway without tenants).
	Root, VirtualRoot string
	MaxSessions       int // 0 = no cap
	// Policy says what the tenant's clients may do; nil = policy.Default().
	Policy *policy.Policy
	// AgentPolicies is the tenant's policy with a named agent, where it
	// differs from Policy (an agent's own policy keys).
	AgentPolicies map[string]*policy.Policy
	// Agents lists the agents the tenant may use; nil = every agent.
	Agents []string
	// Sharing says who may attach to the tenant's sessions (session/attach).
	Sharing Sharing
}

// Sharing is who may attach to a session another client holds.
type Sharing struct {
	// Attach: SharingSameSubject (also ""), SharingTenant or SharingOff.
	Attach string
	// ReadOnlyForOthers: a client of another subject attaches read-only
	// (with Attach SharingTenant).
	ReadOnlyForOthers bool
}

// Sharing.Attach values.
const (
	SharingSameSubject = "same_subject" // the credential subject that holds it (the default)
	SharingTenant      = "tenant"       // any client of the tenant
	SharingOff         = "off"          // nobody: session/attach is refused
)

func (c TenantConfig) policy() *policy.Policy {
	if c.Policy != nil {
		return c.Policy
	}
	p := policy.Default()
	return &p
}

// policyFor is the tenant's policy with the named agent.
func (c TenantConfig) policyFor(agent string) *policy.Policy {
	if p := c.AgentPolicies[agent]; p != nil {
		return p
	}
	return c.policy()
}

// mayUse reports whether the tenant may use the named agent.
func (c TenantConfig) mayUse(agent string) bool {
	return c.Agents == nil || slices.Contains(c.Agents, agent)
}

// tenant is a tenant's live state.
type tenant struct {
	name    string
	label   string // metrics label
	metrics *Metrics
	mapper  atomic.Pointer[pathmap.Mapper] // nil: paths pass unchanged; swapped on reload

	limiter *rate.Limiter                // all of the tenant's connections; nil = none
	conf    atomic.Pointer[TenantConfig] // policies and agents; never nil; swapped on reload

	mu          sync.Mutex
	maxSessions int
	sessions    int                 // sessions held by the tenant's connections
	pending     int                 // session/new, load, resume in flight
	currencies  map[string]struct{} // named in the usage cost labels (currencyLabel)
}

func newTenant(c TenantConfig, m *Metrics) (*tenant, error) {
	mapper, err := c.mapper()
	if err != nil {
		return nil, err
	}
	return makeTenant(c, mapper, m), nil
}

// makeTenant builds a tenant whose mapper is already made (nil: no path
// mapping). The caller sets its limiter.
func makeTenant(c TenantConfig, mapper *pathmap.Mapper, m *Metrics) *tenant {
	t := &tenant{name: c.Name, maxSessions: c.MaxSessions, metrics: m, label: m.tenants.Label(c.Name)}
	t.mapper.Store(mapper)
	t.conf.Store(&c)
	return t
}

func (c TenantConfig) mapper() (*pathmap.Mapper, error) {
	if c.Root == "" {
		return nil, nil
	}
	m, err := pathmap.New(c.Root, c.VirtualRoot)
	if err != nil {
		return nil, fmt.Errorf("tenant %q: %w", c.Name, err)
	}
	return m, nil
}

// update applies a reloaded configuration; sessions and quotas in use carry
// over.
func (t *tenant) update(c TenantConfig, mapper *pathmap.Mapper) {
	t.mu.Lock()
	t.maxSessions = c.MaxSessions
	t.mu.Unlock()
	t.mapper.Store(mapper)
	t.conf.Store(&c)
}

// policy returns the tenant's current policy with the named agent.
func (t *tenant) policy(agent string) *policy.Policy { return t.conf.Load().policyFor(agent) }

// sharing is who may (now) attach to the tenant's sessions.
func (t *tenant) sharing() Sharing { return t.conf.Load().Sharing }

// mayUse reports whether the tenant may (now) use the named agent.
func (t *tenant) mayUse(agent string) bool { return t.conf.Load().mayUse(agent) }

// codeQuota is the JSON-RPC error code for a tenant over its session quota.
const codeQuota = -32005

// tryReserve holds a session slot for a request that may add a session,
// and returns the limit in force too. A move (a session another of the
// tenant's connections holds, loaded here) is already counted: its slot is
// held past the cap, so that the holder ending before the move never lets
// another session in over the quota.
func (t *tenant) tryReserve(move bool) (bool, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !move && t.maxSessions > 0 && t.sessions+t.pending >= t.maxSessions {
		return false, t.maxSessions
	}
	t.pending++
	return true, t.maxSessions
}

// unreserve gives back a slot tryReserve held. One more than was held is a
// bug: logged, counted, and ignored.
func (t *tenant) unreserve(am *agentMetrics, log *slog.Logger) {
	t.mu.Lock()
	ok := t.pending > 0
	if ok {
		t.pending--
	}
	t.mu.Unlock()
	if !ok {
		am.DoubleReleases.WithLabelValues("tenant_slot").Inc()
		log.Error("a tenant session slot was given back twice; ignored", "tenant", t.name)
	}
}

// added counts n sessions (negative: ended) of the tenant with an agent.
func (t *tenant) added(am *agentMetrics, n int) {
	t.mu.Lock()
	t.sessions += n
	t.mu.Unlock()
	am.SessionsActive.WithLabelValues(t.label).Add(float64(n))
}

// event counts a session event (created, loaded, closed, lost).
func (t *tenant) event(am *agentMetrics, e string) {
	am.SessionsTotal.WithLabelValues(t.label, e).Inc()
}

// denied counts a refusal by reason.
func (t *tenant) denied(am *agentMetrics, reason string) {
	am.Denials.WithLabelValues(t.label, reason).Inc()
}

// currencyLabel bounds the currency labels of the tenant's metrics to
// the first usage.MaxCurrencies seen; the rest are "other".
func (t *tenant) currencyLabel(cur string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.currencies[cur]; ok || cur == usage.OtherCurrency {
		return cur
	}
	if len(t.currencies) >= usage.MaxCurrencies {
		return usage.OtherCurrency
	}
	if t.currencies == nil {
		t.currencies = map[string]struct{}{}
	}
	t.currencies[cur] = struct{}{}
	return cur
}

// pathError is a client path the tenant may not use.
type pathError struct {
	label string
	err   error
}

func (e *pathError) Error() string { return "params." + e.label + ": " + e.err.Error() }

// mapToAgent rewrites the path and file URI fields of a client message from
// the tenant's virtual root to its host root. A path outside the root, or
// one that escapes it through a symlink, is refused naming the field.
func (t *tenant) mapToAgent(m *jsonrpc.Message, edits []jsonrpc.Edit) ([]jsonrpc.Edit, error) {
	mapper := t.mapper.Load()
	if mapper == nil {
		return edits, nil
	}
	for _, f := range m.Fields {
		if f.Kind != jsonrpc.FieldPath && f.Kind != jsonrpc.FieldURI {
			continue
		}
		v, ok := m.String(f)
		if !ok {
			return edits, &pathError{f.Label, errors.New("must be a string")}
		}
		var mapped string
		var err error
		if f.Kind == jsonrpc.FieldPath {
			mapped, err = mapper.ToAgent(v)
		} else {
			mapped, err = mapper.URIToAgent(v)
		}
		if err != nil {
			return edits, &pathError{f.Label, err}
		}
		if mapped != v {
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
		}
	}
	return edits, nil
}

// mapToClient rewrites the path and file URI fields of an agent message
// from the host root to the virtual root. Host paths outside the root are redacted, except in a
// request that asks the client to act on the file: then outside is
// returned as the label of the offending field, and nothing is edited.
func (t *tenant) mapToClient(m *jsonrpc.Message, edits []jsonrpc.Edit, confined bool) ([]jsonrpc.Edit, string) {
	mapper := t.mapper.Load()
	if mapper == nil {
		return edits, ""
	}
	for _, f := range m.Fields {
		if f.Kind != jsonrpc.FieldPath && f.Kind != jsonrpc.FieldURI {
			continue
		}
		v, ok := m.String(f)
		if !ok {
			continue // not a string: nothing to map, passed as it is
		}
		// Outside the root, both return the redacted stand-in
		// ("/<outside-workspace>/<basename>", or its file URI).
		var mapped string
		if f.Kind == jsonrpc.FieldPath {
			mapped, ok = mapper.ToClient(v)
		} else {
			mapped, ok = mapper.URIToClient(v)
		}
		if !ok && confined {
			return edits, f.Label
		}
		if mapped != v {
			edits = append(edits, jsonrpc.Edit{Start: f.Start, End: f.End, Repl: jsonrpc.AppendQuote(nil, mapped)})
		}
	}
	return edits, ""
}

// scrubHostRoot replaces the tenant's host root with its virtual root
// wherever it still appears in agent output (free text: tool titles,
// rawInput, messages), so a tenant never learns where its files live on the
// host. Only whole path prefixes match ("/srv/acme" not in "/srv/acme2").
// Roots with characters JSON escapes are left alone.
func (t *tenant) scrubHostRoot(out []byte) []byte {
	m := t.mapper.Load()
	if m == nil || m.Root() == m.VirtualRoot() {
		return out
	}
	root, virt := m.Root(), m.VirtualRoot()
	if !jsonPlain(root) || !jsonPlain(virt) {
		return out
	}
	i := bytes.Index(out, []byte(root))
	if i < 0 {
		return out
	}
	if virt == "/" {
		virt = ""
	}
	var b []byte // from the pool once there is something to replace
	rest := out
	for ; i >= 0; i = bytes.Index(rest, []byte(root)) {
		end := i + len(root)
		if end < len(rest) && !pathBoundary(rest[end]) || i > 0 && !pathStart(rest[i-1]) {
			if b != nil { // not a path: copied as it is (before b, out's prefix is implied)
				b = append(b, rest[:end]...)
			}
			rest = rest[end:]
			continue
		}
		if b == nil {
			b = jsonrpc.GetBuffer(len(out) + 64)
			b = append(b, out[:len(out)-len(rest)]...)
		}
		b = append(b, rest[:i]...)
		b = append(b, virt...)
		if (end == len(rest) || rest[end] != '/') && virt == "" {
			b = append(b, '/')
		}
		rest = rest[end:]
	}
	if b == nil {
		return out
	}
	b = append(b, rest...)
	jsonrpc.PutBuffer(out)
	return b
}

// pathBoundary: the byte after a root that ends a path component.
func pathBoundary(c byte) bool {
	return c == '/' || c == '"' || c == '\\' || c == ' ' || c == '\'' || c == '`' || c == ':' || c == ')' || c == ']' || c == ',' || c == '\n' || c == '\t'
}

// pathStart: the byte before a root where a path may start.
func pathStart(c byte) bool {
	return c == '"' || c == ' ' || c == '\'' || c == '`' || c == '(' || c == '[' || c == '=' || c == ':' || c == ',' || c == '\n' || c == '\t' || c == '>'
}

// jsonPlain reports whether s appears in JSON text as itself.
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}
