// Package gateway is acpgate's HTTP surface: /acp over WebSocket and
// Streamable HTTP, /v1/agents, tickets, probes, metrics, the admin API and
// the browser client; reloads and draining. The ACP logic itself lives in
// package proxy.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redact"
	"github.com/acpgate/acpgate/permrules"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/access"
	relaymetrics "github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/sessionid"
	"github.com/acpgate/acpgate/web"
)

// Options configures a Server.
type Options struct {
	Config *config.Config
	// DemoAgent is the argv run for an agent configured without a command
	// (the built-in demo agent).
	DemoAgent []string
	// Supervisor returns the argv prefix of acpgate's supervisor for an
	// agent with that stop grace; nil: agents are started directly.
	Supervisor func(stopGrace time.Duration) []string
	Version    string
	Logger     *slog.Logger
	// Redactor takes the configuration's secrets out of what Logger
	// writes (its handler is a redact.Handler over it), of the audit
	// trail and of traces: New and Reload set its secrets. nil: New makes
	// one and wraps Logger's handler itself.
	Redactor *redact.Redactor
}

// Server is a running gateway.
type Server struct {
	// Static after New.
	log      *slog.Logger
	redactor *redact.Redactor // its secrets: Reload replaces them
	relay    *proxy.Relay
	authn    *auth.Authenticator // nil: no authentication (no tenants)
	admin    *adminAPI           // nil: no admin API
	launch   *launcher           // nil: the sandbox is off
	http     *http.Server
	registry *prometheus.Registry
	metrics  *metrics
	audit    *auditTrail        // what the gateway itself writes to the audit trail
	budgets  *budgets           // the tenants' budgets: their ledger
	tracing  *tracing           // nil: tracing off
	owners   *access.Owners     // sessions.owners_file; nil: in memory (the relay's own)
	links    *linkRegistry      // every open connection; refusing once the listener closes
	agents   *agents            // agent specs, agents a reload adds, removed agents' drains
	rules    *permrules.Decider // the standing permission rules; Reload swaps them
	replicas *replicas          // cluster:; nil alone

	started  atomic.Bool
	notReady atomic.Bool // SIGTERM received: /readyz says draining
	// opsOnMain: /metrics and /v1/admin/ are served on the main listener
	// (Serve decides, from the address it is bound to).
	opsOnMain atomic.Bool

	mu  sync.Mutex
	cfg *config.Config // the running configuration: Reload swaps it

	reloading sync.Mutex // held by Reload: one at a time
	// reloadFault, in tests, fails a reload after the prepare step it is
	// given the name of (nil: never).
	reloadFault func(step string) error
}

// Reload applies a new configuration's tenants, tokens and policy without
// dropping connections. Other settings need a restart: a reload that
// changes them is refused, and the running configuration stays, all of it.
// A reload prepares, then commits: prepareReload does all that can fail
// and changes nothing; commitReload swaps in what it built and cannot
// fail. A reload refused at any step has changed nothing.
func (s *Server) Reload(next *config.Config) (err error) {
	s.reloading.Lock() // commit relies on what prepare checked of the running state
	defer s.reloading.Unlock()
	defer func() {
		result := "success"
		if err != nil {
			result = "failure"
			s.log.Error("configuration reload refused; keeping the running configuration", "err", err)
		} else {
			s.log.Info("configuration reloaded", "tenants", len(next.Tenants))
		}
		s.metrics.reloads.WithLabelValues(result).Inc()
	}()
	p, err := s.prepareReload(next)
	if err != nil {
		return err
	}
	s.commitReload(p)
	return nil
}

// preparedReload is what prepareReload built of a configuration for
// commitReload to swap in.
type preparedReload struct {
	cur, next      *config.Config
	added, removed []string                     // agents
	specs          []proxy.AgentSpec            // the added agents', in added's order
	rules          *permrules.Table             // permissions
	creds          map[string]map[string]string // the tenants' agent credentials (nil: the sandbox is off)
	credsChanged   []string                     // the tenants whose credentials changed
	authTenants    *auth.Tenants                // nil: no authentication
	relayTenants   *proxy.TenantUpdate
	adminTokens    *auth.AdminTokens // nil: no admin API
}

// reloadStep is one step of a reload's prepare: it checks or builds
// something of p.next into p, and changes nothing else.
type reloadStep struct {
	name string
	run  func(s *Server, p *preparedReload) error
}

// reloadSteps are a reload's prepare, in order; every one that can fail
// runs before anything is applied.
var reloadSteps = []reloadStep{
	{"restart", func(_ *Server, p *preparedReload) error { return restartNeeded(p.cur, p.next) }},
	{"permissions", func(_ *Server, p *preparedReload) (err error) { p.rules, err = p.next.PermissionTable(); return err }},
	{"agents", prepareAgentChanges},
	{"credentials", prepareCreds},
	{"auth tenants", prepareAuthTenants},
	{"relay tenants", func(s *Server, p *preparedReload) (err error) {
		p.relayTenants, err = s.relay.PrepareTenants(relayTenants(p.next))
		return err
	}},
	{"admin tokens", func(s *Server, p *preparedReload) (err error) {
		p.adminTokens, err = s.admin.prepare(p.next)
		return err
	}},
	{"agent specs", func(s *Server, p *preparedReload) (err error) {
		p.specs, err = s.agents.prepare(p.next, p.added)
		return err
	}},
}

// prepareReload validates next and runs reloadSteps; it changes nothing
// (it logs, as a credential it could not re-read).
func (s *Server) prepareReload(next *config.Config) (*preparedReload, error) {
	if err := next.Validate(); err != nil {
		return nil, err
	}
	warnMeta(s.log, next)
	p := &preparedReload{cur: s.config(), next: next}
	for _, step := range reloadSteps {
		err := step.run(s, p)
		if err == nil && s.reloadFault != nil {
			err = s.reloadFault(step.name)
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// restartNeeded refuses a configuration that changes what only a restart
// applies.
func restartNeeded(cur, next *config.Config) error {
	if next.AuthEnabled() != cur.AuthEnabled() {
		return errors.New("turning authentication on or off (adding the first or removing the last tenant) needs a restart")
	}
	if why := adminReloadable(cur, next); why != "" {
		return errors.New(why)
	}
	if changed := restartOnlyChanges(cur, next); len(changed) > 0 {
		return fmt.Errorf("%s settings need a restart; only tenants (tokens, quotas, roots, agents, sharing, budget), policy, "+
			"sharing, permissions, agents added or removed and default_agent reload", strings.Join(changed, ", "))
	}
	return nil
}

// prepareAgentChanges finds the agents added and removed, refusing other
// changes to a running agent and the return of one still draining.
func prepareAgentChanges(s *Server, p *preparedReload) error {
	var restart []string
	p.added, p.removed, restart = agentChanges(p.cur, p.next)
	if len(restart) > 0 {
		return fmt.Errorf("agents %s: settings other than policy need a restart (or remove the agent, reload, and add it again)",
			strings.Join(restart, ", "))
	}
	for _, name := range p.added {
		if s.agents.retiring(name) || s.relay.AgentPool(name) != nil {
			return fmt.Errorf("agent %q is still draining after its removal; reload again once it has stopped", name)
		}
	}
	return nil
}

// prepareCreds reads the tenants' agent credentials, when the sandbox is
// on: one that cannot be read keeps its value, or refuses the reload if it
// has none.
func prepareCreds(s *Server, p *preparedReload) (err error) {
	if s.launch == nil {
		return nil
	}
	if err := credsApart(p.next, s.launch.abi, s.launch.probeErr, os.Geteuid()); err != nil {
		return err
	}
	if err := checkUsers(p.next, os.Geteuid()); err != nil {
		return err
	}
	p.creds, p.credsChanged, err = s.launch.creds.read(p.next)
	return err
}

// prepareAuthTenants builds the authenticator's tenant table, when there
// is one.
func prepareAuthTenants(s *Server, p *preparedReload) (err error) {
	if s.authn != nil {
		p.authTenants, err = auth.ParseTenants(authTenants(p.next))
	}
	return err
}

// commitReload swaps in what prepareReload built. Added agents run before
// they are routed to; removed ones are no longer routed to before they
// retire; new credentials are redacted before any agent gets them.
func (s *Server) commitReload(p *preparedReload) {
	if p.authTenants != nil {
		s.authn.SetTenants(p.authTenants)
	}
	p.relayTenants.Apply()
	if s.launch != nil {
		s.launch.update(p.next)
	}
	s.agents.add(p.specs)
	s.admin.setTokens(p.adminTokens)
	s.budgets.reload(p.next)
	s.rules.Update(p.rules)
	s.mu.Lock()
	s.cfg = p.next
	s.mu.Unlock()
	s.agents.retire(p.cur, p.removed)
	if s.launch != nil {
		// The old values stay redacted too while processes that hold them run.
		setSecrets(s.redactor, p.next, mergeCreds(s.launch.creds.all(), p.creds), s.log)
		s.launch.creds.set(p.creds)
		s.replaceTenantAgents(p.next, p.credsChanged)
	} else {
		setSecrets(s.redactor, p.next, nil, s.log)
	}
	s.audit.configReloaded(p.cur, p.next, p.added, p.removed, p.credsChanged)
}

// replaceTenantAgents retires the agent processes of the tenants whose
// agent credentials changed: their idle processes stop and are replaced,
// running sessions finish where they are, new sessions start on processes
// with the new values.
func (s *Server) replaceTenantAgents(cfg *config.Config, tenants []string) {
	for _, t := range tenants {
		n := 0
		for _, a := range cfg.AgentList() {
			if p := s.relay.AgentPool(a.Name); p != nil {
				n += p.RetireTenant(t, "agent_env")
			}
		}
		s.log.Info("agent credentials changed: the tenant's agent processes are replaced; running sessions finish on the old ones",
			"tenant", t, "processes_retired", n)
	}
}

// restartOnlyChanges names (by YAML key) the top-level settings that differ
// between cur and next, other than tenants, policy, sharing, permissions,
// agents and default_agent, which reload (agentChanges says which agents' changes
// need a restart). A new setting is covered without being listed here.
func restartOnlyChanges(cur, next *config.Config) []string {
	var changed []string
	a, b := reflect.ValueOf(cur).Elem(), reflect.ValueOf(next).Elem()
	for i := range a.NumField() {
		key, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("yaml"), ",")
		if key == "tenants" || key == "policy" || key == "sharing" || key == "agents" || key == "default_agent" || key == "admin" ||
			key == "permissions" {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			changed = append(changed, key)
		}
	}
	return changed
}

// authTenants is the authenticator's view of the configured tenants.
func authTenants(cfg *config.Config) []auth.TenantTokens {
	var out []auth.TenantTokens
	for _, t := range cfg.Tenants {
		out = append(out, auth.TenantTokens{Name: t.Name, TokensSHA256: t.TokensSHA256})
	}
	return out
}

// ReloadFailed counts a reload whose file could not be read or parsed.
func (s *Server) ReloadFailed() { s.metrics.reloads.WithLabelValues("failure").Inc() }

// warnMeta logs each policy whose meta.allow lets a dangerous _meta key
// through (config.MetaWarnings).
func warnMeta(log *slog.Logger, cfg *config.Config) {
	for _, w := range cfg.MetaWarnings() {
		log.Warn("policy.meta.allow is unsafe", "why", w)
	}
}

// relayTenants is the relay's view of the configured tenants (one
// anonymous tenant with the global policy and sharing when none are
// configured).
func relayTenants(cfg *config.Config) []proxy.TenantConfig {
	agentPolicies := func(t *config.Tenant) map[string]*policy.Policy {
		m := map[string]*policy.Policy{}
		for _, a := range cfg.AgentList() {
			var pol policy.Policy
			if t == nil {
				pol = cfg.AgentPolicy(a.Name)
			} else {
				pol = cfg.TenantAgentPolicy(t, a.Name)
			}
			m[a.Name] = &pol
		}
		return m
	}
	if len(cfg.Tenants) == 0 {
		pol := cfg.GlobalPolicy()
		return []proxy.TenantConfig{{Policy: &pol, AgentPolicies: agentPolicies(nil), Sharing: relaySharing(cfg.GlobalSharing())}}
	}
	var out []proxy.TenantConfig
	for i := range cfg.Tenants {
		t := &cfg.Tenants[i]
		pol := cfg.TenantPolicy(t)
		out = append(out, proxy.TenantConfig{Name: t.Name, Root: t.Root, VirtualRoot: t.VirtualRoot, MaxSessions: t.MaxSessions,
			Policy: &pol, AgentPolicies: agentPolicies(t), Agents: t.Agents, Sharing: relaySharing(cfg.TenantSharing(t))})
	}
	return out
}

// relaySharing is the relay's view of a tenant's sharing (the config's
// attach values are the relay's).
func relaySharing(s config.Sharing) proxy.Sharing {
	return proxy.Sharing{Attach: s.Attach, ReadOnlyForOthers: s.ReadOnlyForOthers}
}

// historyBytes is sessions.history_bytes as the relay takes it: there 0
// means the default, so the configuration's 0 (keep no history) is -1.
func historyBytes(cfg *config.Config) int {
	if cfg.Sessions.HistoryBytes == 0 {
		return -1
	}
	return cfg.Sessions.HistoryBytes
}

// config returns the running configuration.
func (s *Server) config() *config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// newSealer seals session IDs with the configured keys, or with a random
// key (IDs then die with the process).
func newSealer(cfg *config.Config, log *slog.Logger) (*sessionid.Sealer, error) {
	keys, err := cfg.SessionKeys()
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Warn("no session_key_file configured: using a random key; session IDs will not survive a restart " +
			"or work across replicas (acpgate keygen > session.key)")
		return sessionid.NewRandom(), nil
	}
	return sessionid.New(keys...)
}

func newAuthenticator(cfg *config.Config, log *slog.Logger, onFailure func(*http.Request, string)) (*auth.Authenticator, error) {
	ac := auth.Config{AllowedOrigins: cfg.Auth.AllowedOrigins, TicketTTL: cfg.Auth.TicketTTL.D(), OnFailure: onFailure,
		Tenants: authTenants(cfg)}
	if j := cfg.Auth.JWT; j != nil {
		ac.JWT = &auth.JWTConfig{Issuer: j.Issuer, Audience: j.Audience, JWKSFile: j.JWKSFile, JWKSURL: j.JWKSURL,
			HS256SecretFile: j.HS256SecretFile, TenantClaim: j.TenantClaim}
	}
	return auth.New(ac, log)
}

// New builds a server and starts its agents' pools.
func New(opts Options) (*Server, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Redactor == nil {
		opts.Redactor = &redact.Redactor{}
		log = slog.New(redact.NewHandler(log.Handler(), opts.Redactor))
	}
	// The secrets known before any is read from the tenants' sources
	// (those are added once the launcher has read them, before any agent
	// starts).
	setSecrets(opts.Redactor, cfg, nil, log)
	warnMeta(log, cfg)
	sealer, err := newSealer(cfg, log)
	if err != nil {
		return nil, err
	}
	tenants := relayTenants(cfg)
	reg := prometheus.NewRegistry()
	relayMetrics := relaymetrics.New(reg, cfg.Observability.TenantLabelLimit)
	authFailures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_auth_failures_total", Help: "Refused upgrades and ticket requests, by reason (never the credential).",
	}, []string{"reason"})
	p, err := openParts(opts, log, reg, relayMetrics, authFailures)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, redactor: opts.Redactor, authn: p.authn, launch: p.launch, links: newLinkRegistry(),
		tracing: p.tracing, registry: reg, audit: p.trail, budgets: p.bud}
	s.agents = newAgents(opts, p.launch, p.tracing, s.links, log)
	s.metrics = newMetrics(reg, s, relayMetrics, authFailures, opts.Version) // before the relay: its deciders count
	if s.replicas, err = newReplicas(s, cfg, reg); err == nil {
		err = s.startRelay(cfg, relayMetrics, sealer, tenants)
	}
	if err != nil {
		s.agents.stopDrains()
		s.replicas.close(context.Background())
		s.tracing.close(context.Background(), log)
		p.close()
		return nil, err
	}
	if p.admins != nil {
		s.admin = &adminAPI{admins: p.admins, relay: s.relay, links: s.links, audit: s.audit, budget: p.bud.ledger, log: log,
			replicas: s.replicas}
	}
	s.replicas.start(s.TracerProvider())
	s.http = &http.Server{
		Handler:           s.routes(cfg, p.authn),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// serverParts are what New opens before it starts the relay.
type serverParts struct {
	authn   *auth.Authenticator // nil: no authentication
	admins  *auth.Admins        // nil: no admin API
	launch  *launcher           // nil: the sandbox is off
	trail   *auditTrail
	bud     *budgets
	tracing *tracing // nil: tracing off
}

// openParts opens a server's parts in order; when one fails, those opened
// before it are closed.
func openParts(opts Options, log *slog.Logger, reg *prometheus.Registry, relayMetrics *relaymetrics.Metrics,
	authFailures *prometheus.CounterVec) (_ *serverParts, err error) {
	cfg := opts.Config
	p := &serverParts{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if cfg.AuthEnabled() {
		if p.authn, err = newAuthenticator(cfg, log, func(r *http.Request, reason string) {
			authFailures.WithLabelValues(reason).Inc()
			p.trail.authFailed(r, reason) // set below, before any request is served
		}); err != nil {
			return nil, err
		}
	}
	if p.admins, err = newAdmins(cfg, p.authn, log); err != nil {
		return nil, err
	}
	var sup []string
	if opts.Supervisor != nil {
		sup = opts.Supervisor(0)
	}
	if p.launch, err = newLauncher(cfg, sup, log); err != nil {
		return nil, err
	}
	if p.launch != nil {
		setSecrets(opts.Redactor, cfg, p.launch.creds.all(), log)
	}
	if p.trail, err = openAudit(cfg, opts.Version, reg, opts.Redactor, log); err != nil {
		return nil, err
	}
	if p.bud, err = newBudgets(cfg, reg, relayMetrics.Tenants(), p.trail, log); err != nil {
		return nil, err
	}
	if p.tracing, err = startTracing(cfg, opts.Version, opts.Redactor, log); err != nil {
		return nil, err
	}
	return p, nil
}

// close lets go of the authenticator, the budgets and the audit trail, if
// they were opened.
func (p *serverParts) close() {
	if p.authn != nil {
		p.authn.Close()
	}
	if p.bud != nil {
		_ = p.bud.close(context.Background())
	}
	if p.trail != nil {
		_ = p.trail.close()
	}
}

// startRelay starts the relay (s.relay) with cfg's agents, s's audit
// trail and tracing.
func (s *Server) startRelay(cfg *config.Config, m *relaymetrics.Metrics, sealer *sessionid.Sealer, tenants []proxy.TenantConfig) (err error) {
	defer func() {
		if err != nil && s.owners != nil { // a failed start lets go of the owners file
			_ = s.owners.Close()
			s.owners = nil
		}
	}()
	s.launch.setTracing(s.tracing)
	var agents []proxy.AgentSpec
	for _, a := range cfg.AgentList() {
		spec, err := s.agents.spec(cfg, a)
		if err != nil {
			return err
		}
		agents = append(agents, spec)
	}
	rc := relayConfig(cfg, m, agents, sealer, tenants)
	rc.Audit, rc.AuditPrompts = s.audit.rec, cfg.Audit.IncludePrompts
	ownersCfg := access.OwnersConfig{PerScope: cfg.Sessions.OwnersPerTenant, Retention: time.Duration(cfg.Sessions.OwnersRetention)}
	rc.Owners = access.NewOwners(ownersCfg)
	if path := cfg.Sessions.OwnersFile; path != "" {
		owners, err := access.OpenOwners(path, s.log, ownersCfg)
		if err != nil {
			return err
		}
		rc.Owners, s.owners = owners, owners
	}
	rc.Tracing = s.TracerProvider()
	// The ledger hears of spend and decides before each prompt (and gets
	// the relay's control, to cancel a turn past a cap); the standing rules
	// decide before a permission request reaches a client.
	rc.Observers = append(rc.Observers, s.budgets.ledger)
	if s.replicas != nil { // the registry hears of every session made or loaded here, and of its end
		rc.Observers = append(rc.Observers, s.replicas)
		rc.Instance, rc.Cluster = s.replicas.name(), s.replicas
		s.replicas.share(rc.Owners)
	}
	table, err := cfg.PermissionTable()
	if err != nil {
		return err
	}
	s.rules = permrules.NewDecider(table, s.metrics.ruleDecision)
	// A lingering drain refuses prompts first: nothing else need decide.
	rc.Deciders = append(rc.Deciders, s.agents.gate, s.budgets.ledger, s.rules)
	relay, err := proxy.NewRelay(rc, s.log)
	if err != nil {
		return err
	}
	s.relay, s.agents.relay = relay, relay
	return nil
}

// relayConfig is the relay's configuration.
func relayConfig(cfg *config.Config, m *relaymetrics.Metrics, agents []proxy.AgentSpec, sealer *sessionid.Sealer,
	tenants []proxy.TenantConfig) proxy.Config {
	return proxy.Config{
		Metrics: m,
		Agents:  agents,
		Limits: proxy.Limits{
			MaxPendingRequests:      cfg.Limits.MaxPendingRequests,
			MessagesPerSecond:       cfg.Limits.MessagesPerSecond,
			MessageBurst:            cfg.Limits.MessageBurst,
			TenantMessagesPerSecond: cfg.Limits.TenantMessagesPerSecond,
			TenantMessageBurst:      cfg.Limits.TenantMessageBurst,
			TenantQueuedPromptBytes: int64(cfg.Limits.TenantQueuedPromptBytes),
		},
		ClientCaps: proxy.AllCapabilities,
		Sealer:     sealer,
		Tenants:    tenants,
		Sessions: proxy.SessionsConfig{
			DetachTimeout:     cfg.Sessions.DetachTimeout.D(),
			ReplayBufferBytes: cfg.Sessions.ReplayBufferBytes,
			HistoryBytes:      historyBytes(cfg),
			MaxClients:        cfg.Sessions.MaxClients,
		},
		IsolateTenants: cfg.AuthEnabled(),
	}
}

// routes is the gateway's HTTP surface.
func (s *Server) routes(cfg *config.Config, authn *auth.Authenticator) http.Handler {
	r := chi.NewRouter()
	notFound := web.Handler(func() string { return s.config().Sessions.AffinityCookie })
	if cfg.Observability.MetricsListen == "" {
		r.Use(s.opsGate(notFound))
	}
	// /acp (the default agent) and /acp/{agent}: a WebSocket upgrade, or
	// Streamable HTTP (POST a message, GET an event stream, DELETE the
	// connection).
	for _, path := range []string{"/acp", "/acp/{agent}"} {
		r.Get(path, func(w http.ResponseWriter, r *http.Request) {
			if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				s.handleACP(w, r)
				return
			}
			s.handleSSE(w, r)
		})
		r.Post(path, s.handleHTTPPost)
		r.Delete(path, s.handleHTTPDelete)
		for _, m := range []string{http.MethodHead, http.MethodPut, http.MethodPatch, http.MethodOptions} {
			r.MethodFunc(m, path, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Allow", "GET, POST, DELETE")
				plain(w, http.StatusMethodNotAllowed, "Method Not Allowed")
			})
		}
	}
	r.HandleFunc("/v1/agents", s.handleAgents)
	if cfg.Observability.MetricsListen == "" { // served only where opsGate lets them
		r.Handle("/metrics", s.MetricsHandler())
		s.admin.routes(r) // else on the operations listener (OpsHandler)
	}
	if authn != nil {
		r.Handle("/v1/tickets", authn.TicketsHandler())
	}
	r.Get("/healthz", s.handleHealth)
	r.Get("/readyz", s.handleReady)
	r.Handle("/*", notFound)
	return r
}

// isOpsPath reports whether path is the operations surface: /metrics or
// the admin API.
func isOpsPath(p string) bool {
	return p == "/metrics" || strings.HasPrefix(p, "/v1/admin/") || p == "/v1/admin"
}

// opsGate hands a request for /metrics or /v1/admin/ to notFound (the
// answer any unknown path gets: 404) unless the main listener serves
// them (opsOnMain): before routing, so that a method the API lacks gets
// the 404 too, not a 405 that would tell it is there.
func (s *Server) opsGate(notFound http.Handler) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !s.opsOnMain.Load() && isOpsPath(path.Clean(r.URL.Path)) { // Clean copies nothing when already clean
				notFound.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// opsOnMain says whether the main listener, bound to addr, serves
// /metrics and the admin API: not when observability.metrics_listen
// takes them; on a loopback address, yes; on any other (0.0.0.0 and ::
// included: every interface), only with observability.ops_on_main_listener.
func opsOnMain(cfg *config.Config, addr net.Addr) (on, loopback bool) {
	ta, ok := addr.(*net.TCPAddr)
	loopback = ok && ta.IP.IsLoopback()
	return cfg.Observability.MetricsListen == "" && (loopback || cfg.Observability.OpsOnMainListener), loopback
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	cfg := s.config()
	on, loopback := opsOnMain(cfg, ln.Addr())
	s.opsOnMain.Store(on)
	switch {
	case on && !loopback:
		s.log.Warn("/metrics and the admin API are served on the main listener, which is not a loopback address "+
			"(observability.ops_on_main_listener): whoever reaches it reaches them (the admin API still needs its credential); "+
			"observability.metrics_listen keeps them apart", "addr", ln.Addr().String())
	case !on && cfg.Observability.MetricsListen == "":
		s.log.Info("/metrics and the admin API are not served on the main listener, which is not a loopback address; "+
			"observability.metrics_listen serves them", "addr", ln.Addr().String())
	}
	s.started.Store(true)
	s.log.Info("listening", "addr", ln.Addr().String())
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// handleReady is not ready while starting, while the pool cannot produce an
// initialized agent, and while draining.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if why := s.ready(); why != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(why + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// ready returns why the gateway is not ready, or "".
func (s *Server) ready() string {
	switch {
	case s.notReady.Load() || s.links.refusing():
		return "draining"
	case !s.started.Load():
		return "starting"
	}
	if ok, name := s.relay.AgentsReady(); !ok {
		if len(s.config().Agents) == 0 {
			return "no agent ready"
		}
		return fmt.Sprintf("no agent ready: agent %q has no process ready", name)
	}
	return ""
}

// MetricsHandler serves the Prometheus metrics.
func (s *Server) MetricsHandler() http.Handler {
	// OpenMetrics when the scraper asks for it (Prometheus does): latency
	// histograms carry trace_id exemplars then.
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		EnableOpenMetrics: true})
}

// Shutdown drains the gateway: it turns not-ready and stops accepting, lets
// running prompts finish for up to shutdown_grace, then cancels them,
// leaves the clients up to shutdown_linger (within the grace) to read
// their answers and close, closes every connection left (a WebSocket with
// 1001, going away) and stops every agent process group.
func (s *Server) Shutdown(ctx context.Context) error {
	s.notReady.Store(true)
	s.replicas.drain()
	if d := s.config().ShutdownDelay.D(); d > 0 {
		s.log.Info("not ready; still accepting while load balancers catch up", "shutdown_delay", d)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	s.links.refuse()
	// The listener closes now; Shutdown also waits for open SSE streams,
	// which end with their connections below.
	httpDone := make(chan error, 1)
	go func() { httpDone <- s.http.Shutdown(ctx) }() // hijacked WebSockets are not waited for
	cfg := s.config()
	end := s.agents.finishPrompts(ctx, "", cfg.ShutdownGrace.D())
	s.agents.lingerThenClose(ctx, "", cfg.Linger(), end, "gateway shutting down")
	s.links.waitServed(ctx)
	var err error
	select {
	case err = <-httpDone:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.agents.stopDrains()   // removed agents still draining stop now, with the rest
	s.relay.CloseDetached() // nobody will resume them here
	s.replicas.close(ctx)   // its records go: their sessions and connections are free at once
	if rerr := s.relay.Close(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if s.owners != nil {
		if oerr := s.owners.Close(); oerr != nil {
			s.log.Error("session owners file: close", "err", oerr)
		}
	}
	// No turn reports spend any more: what is on its way goes to the store
	// (budget.exceeded to the trail, still open).
	if berr := s.budgets.close(ctx); berr != nil {
		s.log.Error("budgets: the ledger's store did not close cleanly", "err", berr)
	}
	if aerr := s.audit.close(); aerr != nil { // logged and counted, never a failed shutdown
		s.log.Error("audit trail: the last events were not written", "err", aerr)
	}
	s.tracing.close(ctx, s.log)
	if s.authn != nil {
		s.authn.Close()
	}
	return err
}

// Relay returns the ACP relay (tests and test/load).
func (s *Server) Relay() *proxy.Relay { return s.relay }

// newConnID is a connection's ID: a random (version 4) UUID, as the SDK's
// reference server issues. It identifies; it grants nothing (a resume
// needs the tenant's credentials and the resume token). In a cluster it is
// "<replica>.<uuid>", so that any replica knows where it is held.
func (s *Server) newConnID() string {
	if s.replicas != nil {
		return s.replicas.name() + "." + uuid.NewString()
	}
	return uuid.NewString()
}
