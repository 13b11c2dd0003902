package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
)

// DefaultAgent is the name of the agent of a relay configured without named
// agents (Config.Pool alone); its session IDs are bound to the tenant alone.
const DefaultAgent = sessionid.DefaultAgent

// ErrUnknownAgent: no agent of that name is configured (or it is being
// removed). ErrAgentNotAllowed: the tenant may not use the agent.
var (
	ErrUnknownAgent    = errors.New("unknown agent")
	ErrAgentNotAllowed = errors.New("agent not allowed for this tenant")
)

// AgentSpec is one named agent: the command its pool runs, the pool's
// limits, and how long the relay lets its requests wait.
type AgentSpec struct {
	Name     string
	Pool     PoolConfig
	Timeouts Timeouts
	// SharedTenants lets tenants share the agent's processes even where
	// the relay isolates tenants (pool isolation "shared").
	SharedTenants bool
	// CostPerSession: the agent's cumulative cost carries on across loads
	// and processes (usage.SetPerSession); else it may start again at
	// each load.
	CostPerSession bool
}

// Timeouts bound how long the relay lets requests wait; 0 = no limit.
type Timeouts struct {
	// ClientRequest bounds how long an agent→client request (a
	// permission, fs, elicitation) waits for the client; then the gateway
	// answers it in the client's place.
	ClientRequest time.Duration
	// Request and Prompt bound how long a client request waits for its
	// agent; then the gateway answers it with an error (and cancels the
	// turn, for a prompt).
	Request, Prompt time.Duration
}

// PoolConfig, AgentConfig and Launch configure an agent's pool (package
// pool).
type (
	PoolConfig  = pool.Config
	AgentConfig = pool.AgentConfig
	Launch      = pool.Launch
)

// AppendEnv appends vars to env as "K=V", sorted by name.
func AppendEnv(env []string, vars map[string]string) []string { return pool.AppendEnv(env, vars) }

// agent is a named agent's live state: its pool, its processes' sides and
// its metrics view. A connection belongs to one agent for its whole life.
type agent struct {
	// Static after AddAgent.
	name     string
	pool     *pool.Pool
	cfg      *pool.Config // the pool's, defaults applied
	timeouts Timeouts
	// costPerSession: its cumulative cost carries on across loads
	// (AgentSpec.CostPerSession).
	costPerSession bool
	mapPaths       bool // some tenant maps paths: locate path fields in agent output
	metrics        *metrics.Agent
	isolate        bool             // two tenants never share a process of this agent
	audit          audit.Recorder   // the relay's audit trail (nil: none)
	obs            *observe.Set     // what watches its sessions (events.go)
	dec            observe.Deciders // what decides for them
	// gatesReady: readiness waits for this agent. Agents configured at
	// start do; one a reload added does once its pool has had a process
	// ready, so that adding an agent never takes a ready replica (and every
	// replica reloaded alike) out of service while it starts.
	gatesReady bool
	// retired: removed by a reload; no new connection, the pool closes
	// once its connections are drained (CloseAgent).
	retired atomic.Bool
	// gating counts its sessions whose gate is not idle (establish.go):
	// while none is, a client message costs the gate one load of it.
	gating atomic.Int32

	mu    sync.Mutex
	sides map[*pool.Process]*procSide // the live processes' sides
}

// side returns the side of one of the agent's processes (its handler,
// made by newSide), even once it has exited.
func (ag *agent) side(p *pool.Process) *procSide { return p.Handler().(*procSide) }

// sideList is a snapshot of the agent's process sides.
func (ag *agent) sideList() []*procSide {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	out := make([]*procSide, 0, len(ag.sides))
	for _, l := range ag.sides {
		out = append(out, l)
	}
	return out
}

// placeSession finds the process for a session/load or session/resume: the
// one that still serves the session if there is one (even a retiring one:
// the session is already there), otherwise any process with room. It
// returns a session slot on it.
func (ag *agent) placeSession(ctx context.Context, prof Profile, agentSID string) (*pool.Lease, error) {
	want := prof.Kind()
	for _, l := range ag.sideList() {
		if s, _ := l.session([]byte(agentSID)); s == nil || !l.p.Profile().Serves(want) {
			continue
		}
		if lease, ok := l.p.LeaseSession(); ok {
			return lease, nil
		}
	}
	return ag.pool.Acquire(ctx, prof, true)
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
	cfg.FileAccess = fileAccess(r.caps, r.tenantCfg, spec.Name)
	isolate := r.isolate && !spec.SharedTenants
	cfg.TenantBound = cfg.TenantBound && isolate
	cfg.Tenants = tenantNames(r.tenantCfg, spec.Name)
	ag := &agent{name: spec.Name, metrics: r.metrics.ForAgent(spec.Name), isolate: isolate,
		timeouts: spec.Timeouts, costPerSession: spec.CostPerSession, mapPaths: r.mapPaths, sides: map[*pool.Process]*procSide{}, audit: r.audit,
		dec: r.deciders}
	ag.obs = r.observers(ag, r.extraObs)
	cfg.Metrics = ag.metrics.Pool()
	cfg.NewHandler = ag.newSide
	ag.pool = pool.New(cfg, r.log.With("agent", spec.Name))
	ag.cfg = ag.pool.Config()
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

// pools yields each agent's name and pool, in name order (metrics.Live).
func (r *Relay) pools(yield func(string, *pool.Pool) bool) {
	for _, ag := range r.agentList() {
		if !yield(ag.name, ag.pool) {
			return
		}
	}
}

// AgentPool returns the named agent's pool (nil: no such agent).
func (r *Relay) AgentPool(name string) *pool.Pool {
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
	st.AgentInfo, st.ProtocolVersion = ag.pool.Info()
	return st, true
}

// AgentsReady reports whether every agent's pool can produce a process
// (an agent added by a reload counts once it has had a process ready); if
// not, it names the first that cannot.
func (r *Relay) AgentsReady() (bool, string) {
	for _, ag := range r.agentList() {
		if ag.retired.Load() || !ag.gatesReady && !ag.pool.EverReady() {
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
