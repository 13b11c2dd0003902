package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
)

// agentSpec is what the relay needs to run a configured agent: its
// command (the demo agent's without one), its supervisor, its launcher
// when the sandbox is on, and its pool.
func (s *Server) agentSpec(cfg *config.Config, a config.AgentEntry) (proxy.AgentSpec, error) {
	cmd := a.Command
	if len(cmd) == 0 {
		cmd = s.opts.DemoAgent
	}
	if len(cmd) == 0 {
		return proxy.AgentSpec{}, fmt.Errorf("agent %q: no command", a.Name)
	}
	var sup []string
	if s.opts.Supervisor != nil {
		sup = s.opts.Supervisor(a.StopGrace.D())
	}
	var launch func(string) (proxy.Launch, error)
	if s.launch != nil {
		launch = s.launch.forAgent(a.Name, cmd)
	}
	p := a.Pool
	return proxy.AgentSpec{
		Name:          a.Name,
		SharedTenants: p.Isolation == "shared",
		Pool: proxy.PoolConfig{
			Agent: proxy.AgentConfig{
				Command:     cmd,
				Env:         withTracingEnv(s.tracing.agentEnv(a.Name, ""), a.Env),
				Dir:         a.Dir,
				Supervisor:  sup,
				StopGrace:   a.StopGrace.D(),
				InitTimeout: a.InitTimeout.D(),
				Launch:      launch,
			},
			TenantBound:           s.launch != nil,
			MinIdle:               p.MinIdle,
			MaxProcesses:          p.MaxProcesses,
			MaxSessionsPerProcess: p.MaxSessionsPerProcess,
			MaxMessageBytes:       cfg.Limits.MaxMessageBytes,
			AcquireTimeout:        p.AcquireTimeout.D(),
			IdleTimeout:           p.IdleTimeout.D(),
			RecycleAfterSessions:  p.RecycleAfterSessions,
			RecycleAfter:          p.RecycleAfter.D(),
			ClientVersion:         s.opts.Version,
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
	if name == "" || cfg.AgentNamed(name) == nil || s.retiring(name) {
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

// retiring reports whether a reload removed the agent and it is draining.
func (s *Server) retiring(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.draining[name]
	return ok
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

// addAgents starts the pools of the agents a reload added; if one fails,
// those it added are stopped again.
func (s *Server) addAgents(next *config.Config, added []string) error {
	for i, name := range added {
		spec, err := s.agentSpec(next, config.AgentEntry{Name: name, NamedAgent: next.AgentNamed(name)})
		if err == nil {
			err = s.relay.AddAgent(spec)
		}
		if err != nil {
			for _, undo := range added[:i] {
				s.relay.RetireAgent(undo)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second+next.AgentNamed(undo).StopGrace.D())
				if cerr := s.relay.CloseAgent(ctx, undo); cerr != nil {
					s.log.Warn("undoing a reload: stopping an added agent", "agent", undo, "err", cerr)
				}
				cancel()
			}
			return fmt.Errorf("add agent %q: %w", name, err)
		}
		s.log.Info("agent added", "agent", name)
	}
	return nil
}

// retireAgents retires the agents a reload removed: they take no new
// connection and are drained in the background as a shutdown drains the
// gateway.
func (s *Server) retireAgents(cur *config.Config, removed []string) {
	for _, name := range removed {
		s.relay.RetireAgent(name)
		s.mu.Lock()
		s.draining[name] = struct{}{}
		s.mu.Unlock()
		stopGrace := cur.AgentNamed(name).StopGrace.D()
		s.agentDrains.Add(1)
		go func() { // ends within shutdown_grace and the agent's stop grace, or with Shutdown
			defer s.agentDrains.Done()
			s.drainAgent(name, stopGrace)
		}()
	}
}

// drainAgent ends a removed agent as Shutdown ends the gateway: running
// prompts get shutdown_grace to finish, then are cancelled; its sockets
// close with 1001 (going away); its processes stop.
func (s *Server) drainAgent(name string, stopGrace time.Duration) {
	cfg := s.config()
	log := s.log.With("agent", name)
	log.Info("agent removed: draining")
	s.finishPrompts(s.drainCtx, name, cfg.ShutdownGrace.D())
	links, _ := s.links.linksOf(name)
	for _, l := range links {
		l.goingAway("agent removed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second+stopGrace)
	defer cancel()
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	stop := context.AfterFunc(s.drainCtx, stopWait) // Shutdown ends the wait, not the agent's stop
	defer stop()
	s.links.waitLinks(waitCtx, name)
	if err := s.relay.CloseAgent(ctx, name); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("agent drain incomplete", "err", err)
	}
	s.mu.Lock()
	delete(s.draining, name)
	s.mu.Unlock()
	log.Info("agent removed: drained")
}

// MaxStopGrace is the longest stop grace of the agents configured now.
func (s *Server) MaxStopGrace() time.Duration {
	var g time.Duration
	for _, a := range s.config().AgentList() {
		g = max(g, a.StopGrace.D())
	}
	return g
}
