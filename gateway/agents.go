package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
)

// agents is the gateway's side of the configured agents: what the relay
// runs each with, the agents a reload adds, and the drains of those it
// removes (drain.go).
type agents struct {
	// Static after construction.
	opts     Options   // DemoAgent, Supervisor and Version
	launch   *launcher // nil: the sandbox is off
	tracing  *tracing  // nil: tracing off
	links    *linkRegistry
	log      *slog.Logger
	drainCtx context.Context    // ends removed agents' grace (stopDrains)
	cancel   context.CancelFunc // cancels drainCtx
	gate     *drainGate         // refuses prompts while a drain lingers

	// Set once the relay has started, before anything is served.
	relay *proxy.Relay

	drains sync.WaitGroup // one per removed agent being drained

	mu       sync.Mutex
	draining map[string]struct{} // agents a reload removed, until drained
}

func newAgents(opts Options, launch *launcher, tr *tracing, links *linkRegistry, log *slog.Logger) *agents {
	ag := &agents{opts: opts, launch: launch, tracing: tr, links: links, log: log, draining: map[string]struct{}{},
		gate: &drainGate{agents: map[string]struct{}{}}}
	ag.drainCtx, ag.cancel = context.WithCancel(context.Background())
	return ag
}

// spec is what the relay needs to run a configured agent: its command
// (the demo agent's without one), its supervisor, its launcher when the
// sandbox is on, and its pool.
func (ag *agents) spec(cfg *config.Config, a config.AgentEntry) (proxy.AgentSpec, error) {
	cmd := a.Command
	if len(cmd) == 0 {
		cmd = ag.opts.DemoAgent
	}
	if len(cmd) == 0 {
		return proxy.AgentSpec{}, fmt.Errorf("agent %q: no command", a.Name)
	}
	var sup []string
	if ag.opts.Supervisor != nil {
		sup = ag.opts.Supervisor(a.StopGrace.D())
	}
	var launch func(string) (proxy.Launch, error)
	if ag.launch != nil {
		launch = ag.launch.forAgent(a.Name, cmd)
	}
	p := a.Pool
	return proxy.AgentSpec{
		Name:           a.Name,
		SharedTenants:  p.Isolation == "shared",
		CostPerSession: a.Usage.CostTotal == config.CostPerSession,
		Pool: proxy.PoolConfig{
			Agent: proxy.AgentConfig{
				Command:     cmd,
				Env:         withTracingEnv(ag.tracing.agentEnv(a.Name, ""), a.Env),
				Dir:         a.Dir,
				Supervisor:  sup,
				StopGrace:   a.StopGrace.D(),
				InitTimeout: a.InitTimeout.D(),
				Launch:      launch,
			},
			TenantBound:           ag.launch != nil,
			MinIdle:               p.MinIdle,
			MaxProcesses:          p.MaxProcesses,
			MaxSessionsPerProcess: p.MaxSessionsPerProcess,
			MaxMessageBytes:       cfg.Limits.MaxMessageBytes,
			AcquireTimeout:        p.AcquireTimeout.D(),
			IdleTimeout:           p.IdleTimeout.D(),
			RecycleAfterSessions:  p.RecycleAfterSessions,
			RecycleAfter:          p.RecycleAfter.D(),
			ClientVersion:         ag.opts.Version,
			Redact:                ag.opts.Redactor.String,
		},
		Timeouts: proxy.Timeouts{
			ClientRequest: cfg.Timeouts.ClientRequest.D(),
			Request:       cfg.Timeouts.Request.D(),
			Prompt:        cfg.Timeouts.Prompt.D(),
		},
	}, nil
}

// routeAgent is the agent a request to /acp or /acp/{agent} is for, after
// authentication: an unknown agent is 404 and one the tenant may not use
// 403, before any upgrade or connection.
func (s *Server) routeAgent(w http.ResponseWriter, r *http.Request, tenant string) (string, bool) {
	cfg := s.config()
	name := chi.URLParam(r, "agent")
	if name == "" {
		name = cfg.DefaultAgentOf()
	}
	if name == "" || cfg.AgentNamed(name) == nil || s.agents.retiring(name) {
		writeJSONError(w, http.StatusNotFound, "unknown_agent", fmt.Sprintf("no agent named %q here (GET /v1/agents lists them)", name))
		return "", false
	}
	if t := tenantOf(cfg, tenant); t != nil && !t.MayUse(name) {
		s.metrics.authFailures.WithLabelValues("agent_not_allowed").Inc()
		writeJSONError(w, http.StatusForbidden, "agent_not_allowed", fmt.Sprintf("tenant %q may not use agent %q", tenant, name))
		return "", false
	}
	return name, true
}

func tenantOf(cfg *config.Config, name string) *config.Tenant {
	for i := range cfg.Tenants {
		if cfg.Tenants[i].Name == name {
			return &cfg.Tenants[i]
		}
	}
	return nil
}

// agentJSON is one entry of GET /v1/agents.
type agentJSON struct {
	Name            string          `json:"name"`
	AgentInfo       json.RawMessage `json:"agentInfo"`
	ProtocolVersion int             `json:"protocolVersion,omitempty"`
	Ready           bool            `json:"ready"`
	Default         bool            `json:"default,omitempty"`
}

// handleAgents lists the agents the caller's tenant may use, with what
// their newest initialize answer said of them. It authenticates as /acp
// does (a ticket is spent by it: list with the token); a page on an
// allowed origin may read it (CORS).
func (s *Server) handleAgents(w http.ResponseWriter, r *http.Request) {
	if s.authn != nil && s.authn.CORS(w, r, "GET") {
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	who, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	cfg := s.config()
	t := tenantOf(cfg, who.Tenant)
	def := cfg.DefaultAgentOf()
	out := struct {
		Agents []agentJSON `json:"agents"`
	}{Agents: []agentJSON{}}
	for _, a := range cfg.AgentList() {
		if t != nil && !t.MayUse(a.Name) {
			continue
		}
		st, ok := s.relay.AgentStatus(a.Name)
		if !ok { // being removed
			continue
		}
		info := st.AgentInfo
		if info == nil {
			info = json.RawMessage("null")
		}
		out.Agents = append(out.Agents, agentJSON{Name: a.Name, AgentInfo: info, ProtocolVersion: st.ProtocolVersion,
			Ready: st.Ready, Default: a.Name == def})
	}
	writeJSON(w, http.StatusOK, out)
}

// agentChanges compares the agents of two configurations: which were
// added and removed, and which changed in a way only a restart applies
// (anything but their policy).
func agentChanges(cur, next *config.Config) (added, removed, restart []string) {
	curAgents := map[string]*config.NamedAgent{}
	for _, a := range cur.AgentList() {
		curAgents[a.Name] = a.NamedAgent
	}
	for _, a := range next.AgentList() {
		old, ok := curAgents[a.Name]
		delete(curAgents, a.Name)
		if !ok {
			added = append(added, a.Name)
			continue
		}
		x, y := *old, *a.NamedAgent
		x.Policy, y.Policy = config.PolicyYAML{}, config.PolicyYAML{}
		if !reflect.DeepEqual(x, y) {
			restart = append(restart, a.Name)
		}
	}
	for name := range curAgents {
		removed = append(removed, name)
	}
	slices.Sort(removed)
	return added, removed, restart
}

// prepare builds the specs of the agents a reload adds.
func (ag *agents) prepare(next *config.Config, added []string) ([]proxy.AgentSpec, error) {
	specs := make([]proxy.AgentSpec, 0, len(added))
	for _, name := range added {
		spec, err := ag.spec(next, config.AgentEntry{Name: name, NamedAgent: next.AgentNamed(name)})
		if err != nil {
			return nil, fmt.Errorf("add agent %q: %w", name, err)
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// add runs the agents a reload adds (prepare made their specs, and the
// reload checked that the relay has none of them).
func (ag *agents) add(specs []proxy.AgentSpec) {
	for _, spec := range specs {
		if err := ag.relay.AddAgent(spec); err != nil {
			ag.log.Error("agent not added", "agent", spec.Name, "err", err) // a reload's prepare rules this out
			continue
		}
		ag.log.Info("agent added", "agent", spec.Name)
	}
}

// MaxStopGrace is the longest stop grace of the agents configured now.
func (s *Server) MaxStopGrace() time.Duration {
	var g time.Duration
	for _, a := range s.config().AgentList() {
		g = max(g, a.StopGrace.D())
	}
	return g
}
