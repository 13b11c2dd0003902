package proxy

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/metrics"
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
	// Sharing says who may touch a session another subject of the tenant
	// made: load, resume, take over, attach, delete, close, list.
	Sharing Sharing
}

// Sharing is who may touch a session another subject made (package access).
type Sharing = access.Sharing

// Sharing.Attach values.
const (
	SharingSameSubject = access.SameSubject
	SharingTenant      = access.Tenant
	SharingOff         = access.Off
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
	metrics *metrics.Metrics
	mapper  atomic.Pointer[pathmap.Mapper] // nil: paths pass unchanged; swapped on reload

	limiter *rate.Limiter // all of the tenant's connections; nil = none
	// queuedBytes: the prompts of all its connections waiting for
	// sessions' turns (Limits.TenantQueuedPromptBytes).
	queuedBytes inflight.Budget
	conf        atomic.Pointer[TenantConfig] // policies and agents; never nil; swapped on reload

	mu          sync.Mutex
	maxSessions int
	sessions    int          // sessions held by the tenant's connections
	pending     int          // session/new, load, resume in flight
	currencies  usage.Labels // named in the usage cost labels
}

func newTenant(c TenantConfig, m *metrics.Metrics) (*tenant, error) {
	mapper, err := c.mapper()
	if err != nil {
		return nil, err
	}
	return makeTenant(c, mapper, m), nil
}

// makeTenant builds a tenant whose mapper is already made (nil: no path
// mapping). The caller sets its limiter.
func makeTenant(c TenantConfig, mapper *pathmap.Mapper, m *metrics.Metrics) *tenant {
	t := &tenant{name: c.Name, maxSessions: c.MaxSessions, metrics: m, label: m.Tenants().Label(c.Name)}
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
func (t *tenant) unreserve(am *metrics.Agent, log *slog.Logger) {
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
func (t *tenant) added(am *metrics.Agent, n int) {
	t.mu.Lock()
	t.sessions += n
	t.mu.Unlock()
	am.SessionsActive.WithLabelValues(t.label).Add(float64(n))
}

// denied counts a refusal by reason.
func (t *tenant) denied(am *metrics.Agent, reason string) {
	am.Denials.WithLabelValues(t.label, reason).Inc()
}

// metaRemoved counts n members removed from a client's _meta.
func (t *tenant) metaRemoved(am *metrics.Agent, n int) {
	am.MetaRemoved.WithLabelValues(t.label).Add(float64(n))
}
