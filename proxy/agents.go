package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
)

// DefaultAgent is the name of the agent of a relay configured without named
// agents (Config.Pool alone).
const DefaultAgent = "default"

// ErrUnknownAgent: no agent of that name is configured (or it is being
// removed). ErrAgentNotAllowed: the tenant may not use the agent.
var (
	ErrUnknownAgent    = errors.New("unknown agent")
	ErrAgentNotAllowed = errors.New("agent not allowed for this tenant")
)

// AgentSpec is one named agent: the command its pool runs, and the pool's
// limits.
type AgentSpec struct {
	Name string
	Pool PoolConfig
	// SharedTenants lets tenants share the agent's processes even where
	// the relay isolates tenants (pool isolation "shared").
	SharedTenants bool
}

// agent is a named agent's live state: its pool and its metrics view. A
// connection belongs to one agent for its whole life.
type agent struct {
	name    string
	pool    *Pool
	metrics *agentMetrics
	isolate bool // two tenants never share a process of this agent
	// gatesReady: readiness waits for this agent. Agents configured at
	// start do; one a reload added does once its pool has had a process
	// ready, so that adding an agent never takes a ready replica (and every
	// replica reloaded alike) out of service while it starts.
	gatesReady bool
	// retired: removed by a reload; no new connection, the pool closes
	// once its connections are drained (CloseAgent).
	retired atomic.Bool
}

// AddAgent starts a named agent's pool. A name in use is an error.
func (r *Relay) AddAgent(spec AgentSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.agents[spec.Name]; ok {
		return fmt.Errorf("agent %q: already configured", spec.Name)
	}
	if spec.Name == "" {
		return errors.New("agent: a name is required")
	}
	cfg := spec.Pool
	cfg.mapPaths = r.mapPaths
	cfg.fileAccess = fileAccess(r.caps, r.tenantCfg, spec.Name)
	isolate := r.isolate && !spec.SharedTenants
	cfg.TenantBound = cfg.TenantBound && isolate
	cfg.tenantNames = tenantNames(r.tenantCfg, spec.Name)
	ag := &agent{name: spec.Name, metrics: r.metrics.forAgent(spec.Name), isolate: isolate}
	cfg.metrics = ag.metrics
	ag.pool = NewPool(cfg, r.log.With("agent", spec.Name))
	r.agents[spec.Name] = ag
	return nil
}

// agentList is a snapshot of the agents, in name order.
func (r *Relay) agentList() []*agent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*agent, 0, len(r.agents))
	for _, ag := range r.agents {
		out = append(out, ag)
	}
	slices.SortFunc(out, func(a, b *agent) int { return strings.Compare(a.name, b.name) })
	return out
}

// AgentPool returns the named agent's pool (nil: no such agent).
func (r *Relay) AgentPool(name string) *Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ag := r.agents[name]; ag != nil {
		return ag.pool
	}
	return nil
}

// AgentStatus is what /v1/agents tells about an agent.
type AgentStatus struct {
	Name string
	// AgentInfo is the agentInfo of the agent's newest initialize answer
	// (nil before one of its processes has answered).
	AgentInfo       json.RawMessage
	ProtocolVersion int
	// Ready: the agent's pool can produce a process now.
	Ready bool
}

// AgentStatus reports on a named agent that is not being removed.
func (r *Relay) AgentStatus(name string) (AgentStatus, bool) {
	r.mu.Lock()
	ag := r.agents[name]
	r.mu.Unlock()
	if ag == nil || ag.retired.Load() {
		return AgentStatus{}, false
	}
	st := AgentStatus{Name: name, Ready: ag.pool.Ready()}
	st.AgentInfo, st.ProtocolVersion = ag.pool.info()
	return st, true
}

// AgentsReady reports whether every agent's pool can produce a process
// (an agent added by a reload counts once it has had a process ready); if
// not, it names the first that cannot.
func (r *Relay) AgentsReady() (bool, string) {
	for _, ag := range r.agentList() {
		if ag.retired.Load() || !ag.gatesReady && !ag.pool.everReady() {
			continue
		}
		if !ag.pool.Ready() {
			return false, ag.name
		}
	}
	return true, ""
}

// RetireAgent stops the named agent from taking new connections (a reload
// removed it). Its connections carry on until CloseAgent.
func (r *Relay) RetireAgent(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ag := r.agents[name]
	if ag == nil {
		return false
	}
	ag.retired.Store(true) // under r.mu: NewConn checks it there before registering
	return true
}

// AgentConns counts the named agent's open connections (detached ones
// included).
func (r *Relay) AgentConns(name string) int {
	n := 0
	for _, c := range r.connList() {
		if c.ag.name == name {
			n++
		}
	}
	return n
}

// CloseAgent ends every connection of a retired agent that is still open,
// stops its processes and forgets it.
func (r *Relay) CloseAgent(ctx context.Context, name string) error {
	r.mu.Lock()
	ag := r.agents[name]
	r.mu.Unlock()
	if ag == nil {
		return nil
	}
	if !ag.retired.Load() {
		return fmt.Errorf("agent %q: not retired", name)
	}
	for _, c := range r.connList() {
		if c.ag == ag {
			c.Close()
		}
	}
	err := ag.pool.Close(ctx)
	r.mu.Lock()
	if r.agents[name] == ag {
		delete(r.agents, name)
	}
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("agent %q: %w", name, err)
	}
	return nil
}

// Agent is the name of the agent the connection belongs to.
func (c *Conn) Agent() string { return c.ag.name }
