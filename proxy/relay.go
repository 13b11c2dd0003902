package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/access"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/clientcaps"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
	"github.com/acpgate/acpgate/proxy/pathmap"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
)

// Config configures a Relay.
type Config struct {
	// Agents are the named agents, each with a pool of its own; none = one
	// agent named DefaultAgent with Pool.
	Agents []AgentSpec
	Pool   PoolConfig
	// ClientCaps caps what agents may be told about clients (and so what
	// they may ask of them): a client's own capabilities are intersected
	// with it.
	ClientCaps Profile
	// Sealer seals session IDs; nil = a random key per gateway process.
	Sealer *sessionid.Sealer
	// Owners remembers who made each session, for session/list; nil = in
	// memory. The caller closes it after the relay.
	Owners *access.Owners
	// Tenants lists who may connect; none = one anonymous tenant "" with
	// no path mapping.
	Tenants []TenantConfig
	// IsolateTenants keeps each tenant on agent processes of its own.
	IsolateTenants bool
	// Metrics receives the relay's metrics (a Metrics serves one relay);
	// nil = not exported.
	Metrics *metrics.Metrics
	// Limits bound each connection and tenant.
	Limits Limits
	// Sessions says how long a connection outlives its socket.
	Sessions SessionsConfig
	// Audit takes the audit trail's events (sessions, turns, permissions,
	// files, policy denials); nil = none. AuditPrompts adds a prompt's text
	// to prompt.started.
	Audit        audit.Recorder
	AuditPrompts bool
	// Tracing makes the relay's spans (trace.go); nil = tracing off.
	Tracing trace.TracerProvider
	// Cluster, when set, makes the relay one replica of several: it asks
	// it where a session not live here is, and what an administrator ended
	// elsewhere.
	Cluster Cluster
	// Instance names this gateway in its resume tokens ("<instance>.<random>"):
	// a cluster's replica name, so that any replica knows where a token
	// was issued ("": a random name for this process).
	Instance string
	// Observers watch every session's events beside the relay's metrics,
	// the audit trail and tracing; Deciders decide, in order, whether a
	// prompt may go to the agent and may answer an agent's permission
	// request in the clients' place (package observe).
	Observers []observe.Observer
	Deciders  []observe.Decider
}

// SessionsConfig says how long a connection outlives its socket.
type SessionsConfig struct {
	// DetachTimeout keeps a connection whose socket ended without a clean
	// close (its sessions, running turns and pending requests) for a resume
	// or a take-over; 0 = end it at once.
	DetachTimeout time.Duration
	// ReplayBufferBytes bounds the messages a connection keeps for a
	// resume (default 8 MiB).
	ReplayBufferBytes int
	// HistoryBytes bounds the record of a live session's updates that
	// session/attach replays (0: 2 MiB; negative: none). A session whose
	// tenant has attach off keeps none.
	HistoryBytes int
	// MaxClients bounds the clients of one session, its owner included
	// (0: 8); the next session/attach is refused.
	MaxClients int
}

// Limits bound what clients may send.
type Limits struct {
	MaxPendingRequests      int     // per connection (0 = none)
	MessagesPerSecond       float64 // per connection (0 = none)
	MessageBurst            int
	TenantMessagesPerSecond float64 // all of a tenant's connections (0 = none)
	TenantMessageBurst      int
	// TenantQueuedPromptBytes bounds the prompts all of a tenant's
	// connections hold waiting for sessions' turns (0 =
	// DefaultTenantQueuedPromptBytes), beside each connection's and each
	// session's own bounds.
	TenantQueuedPromptBytes int64
}

// DefaultTenantQueuedPromptBytes is Limits.TenantQueuedPromptBytes unset.
const DefaultTenantQueuedPromptBytes = 256 << 20

// tenantQueuedBytes is the tenant-wide bound of queued prompts.
func (l Limits) tenantQueuedBytes() int64 {
	if l.TenantQueuedPromptBytes > 0 {
		return l.TenantQueuedPromptBytes
	}
	return DefaultTenantQueuedPromptBytes
}

func newLimiter(perSecond float64, burst int) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(perSecond))
	}
	return rate.NewLimiter(rate.Limit(perSecond), burst)
}

// Relay multiplexes client connections onto the agent pool. It is the ACP
// core: it knows nothing of HTTP or WebSockets.
type Relay struct {
	bg      workers // what must not run on its caller's stack
	metrics *metrics.Metrics
	sealer  *sessionid.Sealer
	owners  *access.Owners // who made the sessions seen here (session/list)
	log     *slog.Logger
	caps    Profile
	isolate bool
	limits  Limits
	tenants map[string]*tenant
	ctx     context.Context
	cancel  context.CancelFunc
	resume  SessionsConfig
	audit   audit.Recorder // nil: no audit trail
	// What watches and decides for every agent's sessions besides the
	// built-in observers (Config.Observers, Config.Deciders).
	extraObs []observe.Observer
	deciders observe.Deciders
	prompts  bool         // audit prompt text (Config.AuditPrompts)
	tracer   trace.Tracer // nil: tracing off (Config.Tracing)

	mu        sync.Mutex // guards conns, tenants, resumable and agents
	conns     map[*Conn]struct{}
	resumable map[string]*Conn  // by resume token
	agents    map[string]*agent // by name, until removed
	first     string            // the first agent configured (Pool)
	tenantCfg []TenantConfig    // as configured, for agents added later
	// adminEnded: the last sessions an administrator ended, by the ID
	// clients see (maxAdminEnded of them), for the error naming them.
	adminEnded inflight.Recent[string]

	mapPaths bool    // some tenant maps paths (set at start: a reload cannot turn it on)
	instance string  // this process's name in resume tokens
	named    bool    // instance is a replica's name (Config.Instance), of any length
	cluster  Cluster // nil: alone

	connSeq atomic.Uint64 // numbers connections in the order they are made (lockOutboxes)

	promptMu sync.Mutex
	promptCh chan struct{} // closed and replaced whenever a prompt ends (WaitPrompts)
}

// NewRelay starts the agent pool. Close stops it.
func NewRelay(cfg Config, log *slog.Logger) (*Relay, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	m := cfg.Metrics
	tenants, mapPaths, err := newTenants(cfg, m)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sealer := cfg.Sealer
	r := &Relay{
		owners:     cfg.Owners,
		adminEnded: inflight.Recent[string]{Max: maxAdminEnded},
		tracer:     tracing.TracerOf(cfg.Tracing, TracerName),
		metrics:    m,
		sealer:     sealer,
		log:        log,
		caps:       cfg.ClientCaps,
		isolate:    cfg.IsolateTenants,
		limits:     cfg.Limits,
		tenants:    tenants,
		ctx:        ctx,
		cancel:     cancel,
		conns:      map[*Conn]struct{}{},
		resumable:  map[string]*Conn{},
		resume:     cfg.Sessions,
		audit:      cfg.Audit,
		prompts:    cfg.AuditPrompts,
		extraObs:   cfg.Observers,
		deciders:   observe.NewDeciders(cfg.Deciders...),
		agents:     map[string]*agent{},
		first:      cfg.Agents[0].Name,
		tenantCfg:  cfg.Tenants,
		mapPaths:   mapPaths,
		instance:   cmp.Or(cfg.Instance, sessionid.NewInstance()),
		named:      cfg.Instance != "",
		cluster:    cfg.Cluster,
		promptCh:   make(chan struct{}),
	}
	for _, spec := range cfg.Agents {
		if err := r.AddAgent(spec); err != nil {
			_ = r.Close(context.Background())
			return nil, err
		}
		r.agents[spec.Name].gatesReady = true
	}
	if err := m.Register(metrics.Live{Pools: r.pools, ReplayBytes: r.replayBytes}); err != nil {
		_ = r.Close(context.Background())
		return nil, fmt.Errorf("proxy: registering the relay's live metrics: %w", err)
	}
	provision(r, cfg.Observers, cfg.Deciders)
	return r, nil
}

var _ observe.Control = (*Relay)(nil) // plug-ins act through it (provision)

// withDefaults is cfg with what it leaves unset filled in.
func (cfg Config) withDefaults() Config {
	if cfg.Sealer == nil {
		cfg.Sealer = sessionid.NewRandom()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Nop()
	}
	if len(cfg.Tenants) == 0 {
		cfg.Tenants = []TenantConfig{{}}
	}
	if len(cfg.Agents) == 0 {
		cfg.Agents = []AgentSpec{{Name: DefaultAgent, Pool: cfg.Pool}}
	}
	if cfg.Sessions.DetachTimeout > 0 && cfg.Sessions.ReplayBufferBytes <= 0 {
		cfg.Sessions.ReplayBufferBytes = 8 << 20
	}
	if cfg.Owners == nil {
		cfg.Owners = &access.Owners{}
	}
	if cfg.Sessions.HistoryBytes == 0 {
		cfg.Sessions.HistoryBytes = 2 << 20
	}
	if cfg.Sessions.MaxClients <= 0 {
		cfg.Sessions.MaxClients = 8
	}
	return cfg
}

// newTenants makes the configured tenants; mapPaths reports whether one
// maps paths.
func newTenants(cfg Config, m *metrics.Metrics) (tenants map[string]*tenant, mapPaths bool, err error) {
	tenants = map[string]*tenant{}
	for _, tc := range cfg.Tenants {
		t, err := newTenant(tc, m)
		if err != nil {
			return nil, false, err
		}
		t.limiter = newLimiter(cfg.Limits.TenantMessagesPerSecond, cfg.Limits.TenantMessageBurst)
		t.queuedBytes.Max = cfg.Limits.tenantQueuedBytes()
		mapPaths = mapPaths || t.mapper.Load() != nil
		tenants[tc.Name] = t
	}
	return tenants, mapPaths, nil
}

// provision hands r's Control to each plug-in that acts on the relay
// (observe.Provisioner), once each, however many times it is registered.
func provision(r *Relay, obs []observe.Observer, decs []observe.Decider) {
	var done []observe.Provisioner
	plugins := make([]any, 0, len(obs)+len(decs))
	for _, o := range obs {
		plugins = append(plugins, o)
	}
	for _, d := range decs {
		plugins = append(plugins, d)
	}
	for _, p := range plugins {
		pv, ok := p.(observe.Provisioner)
		if !ok || pv == nil || !reflect.TypeOf(pv).Comparable() || slices.Contains(done, pv) {
			continue
		}
		done = append(done, pv)
		pv.Provision(r)
	}
}

// fileAccess is what an agent's processes are told about file access: read
// and write as far as the deployment and the policy of any tenant that may
// use the agent allow them.
func fileAccess(caps Profile, tenants []TenantConfig, agent string) *[2]bool {
	var fa [2]bool
	for _, tc := range tenants {
		if !tc.mayUse(agent) {
			continue
		}
		read, write, _ := tc.policyFor(agent).ClientCaps()
		fa[0] = fa[0] || read && caps.FsRead
		fa[1] = fa[1] || write && caps.FsWrite
	}
	return &fa
}

// Pool returns the pool of the first agent configured (for tests and the
// load harness; see AgentPool).
func (r *Relay) Pool() *pool.Pool { return r.AgentPool(r.first) }

// NewConn registers a client connection of a configured tenant. The caller
// feeds it the client's messages (HandleFrom, HandleScannedTrace), tells it
// of its sockets (SocketEnded, Attach) and calls Close when the client is
// gone for good.
func (r *Relay) NewConn(info ConnInfo, sink Sink) (*Conn, error) {
	name := info.Agent
	if name == "" {
		name = r.first
	}
	r.mu.Lock()
	ten := r.tenants[info.Tenant]
	ag := r.agents[name]
	r.mu.Unlock()
	if ten == nil {
		return nil, fmt.Errorf("unknown tenant %q", info.Tenant)
	}
	if ag == nil || ag.retired.Load() {
		return nil, fmt.Errorf("%w: %q", ErrUnknownAgent, name)
	}
	if !ten.mayUse(name) {
		return nil, fmt.Errorf("%w: tenant %q, agent %q", ErrAgentNotAllowed, info.Tenant, name)
	}
	log := info.Log
	if log == nil {
		log = r.log.With("conn", info.ID, "agent", name)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &Conn{
		seq:         r.connSeq.Add(1),
		relay:       r,
		id:          info.ID,
		tenant:      info.Tenant,
		ten:         ten,
		ag:          ag,
		scope:       sessionid.Scope(info.Tenant, name),
		subject:     info.Subject,
		affinity:    info.Affinity,
		clientID:    multiclient.NewClientID(),
		log:         log,
		onEnd:       info.OnEnd,
		opened:      time.Now(),
		transport:   info.Transport,
		remote:      info.Remote,
		ctx:         ctx,
		cancel:      cancel,
		sessions:    map[string]*Session{},
		reqs:        inflight.NewTable[*outReq, *inReq](),
		queuedBytes: inflight.Budget{Max: maxConnQueuedBytes},
	}
	c.cr = clientReader{c: c, resolve: acp.ClientSpec, limiter: newLimiter(r.limits.MessagesPerSecond, r.limits.MessageBurst),
		logLim: logx.NewLimiter(20, time.Second)}
	c.cr.sc.Methods = acp.Methods
	c.cr.sc.SnakeTwins = true
	c.auditLim = audit.NewLimiter(20, 20)
	keep := 0 // bytes the outbox keeps for a resume
	if r.resume.DetachTimeout > 0 && !info.NoResume {
		keep = r.resume.ReplayBufferBytes
		c.token = sessionid.NewToken(r.instance)
		c.keeps = true
	}
	c.out.Init(sink, keep)
	r.mu.Lock()
	if ag.retired.Load() || r.agents[name] != ag { // retired meanwhile: CloseAgent would miss it
		r.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("%w: %q", ErrUnknownAgent, name)
	}
	r.conns[c] = struct{}{}
	if c.token != "" {
		r.resumable[c.token] = c
	}
	r.mu.Unlock()
	return c, nil
}

func (r *Relay) connClosed(c *Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	if c.token != "" {
		delete(r.resumable, c.token)
	}
	r.mu.Unlock()
}

// replayBytes is the size of every connection's replay buffer.
func (r *Relay) replayBytes() int {
	n := 0
	for _, c := range r.connList() {
		n += c.out.KeptBytes()
	}
	return n
}

// connList is a snapshot of the open connections.
func (r *Relay) connList() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	conns := make([]*Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	return conns
}

// CloseDetached ends every connection that has no socket (a drain: nobody
// will resume them here).
func (r *Relay) CloseDetached() {
	for _, c := range r.connList() {
		if c.Detached() {
			c.Close()
		}
	}
}

// Conns returns the number of open client connections.
func (r *Relay) Conns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// profileFor is a client's profile: what it offers within what the
// deployment allows. File access stays as the client offered it (the
// tenant's policy is applied to each fs request, so a reload takes effect);
// a terminal the policy turns off is never told to an agent.
func (r *Relay) profileFor(c *Conn, initParams []byte) (Profile, error) {
	p, err := clientcaps.Parse(initParams)
	if err != nil {
		return Profile{}, err
	}
	p = p.Intersect(r.caps)
	_, _, terminal := c.ten.policy(c.ag.name).ClientCaps()
	p.Terminal = p.Terminal && terminal
	if c.ag.isolate {
		p.Tenant = c.tenant
	}
	return p, nil
}

// runningPrompts lists the client prompts the agent ("" = every agent) is
// still working on, and counts the prompt answers taken from them but not
// yet handed to their clients.
func (r *Relay) runningPrompts(agent string) (running []*outReq, answering int) {
	for _, ag := range r.agentList() {
		if agent != "" && ag.name != agent {
			continue
		}
		for _, l := range ag.sideList() {
			var n int
			running, n = l.runningPrompts(running)
			answering += n
		}
	}
	return running, answering
}

// PromptsInFlight counts the prompts the agent ("" = every agent) is still
// working on, answers not yet handed to their clients included.
func (r *Relay) PromptsInFlight(agent string) int {
	running, answering := r.runningPrompts(agent)
	return len(running) + answering
}

// promptsChanged wakes WaitPrompts: a prompt has ended.
func (r *Relay) promptsChanged() {
	r.promptMu.Lock()
	close(r.promptCh)
	r.promptCh = make(chan struct{})
	r.promptMu.Unlock()
}

// WaitPrompts waits until the agent ("" = every agent) has no prompt in
// flight (PromptsInFlight), or ctx ends. Each prompt's end wakes it.
func (r *Relay) WaitPrompts(ctx context.Context, agent string) error {
	return r.waitPromptsUntil(ctx, func() bool { return r.PromptsInFlight(agent) == 0 })
}

// waitPromptsUntil waits until done holds, checked again at each prompt's
// end, or ctx ends.
func (r *Relay) waitPromptsUntil(ctx context.Context, done func() bool) error {
	for {
		r.promptMu.Lock()
		ch := r.promptCh
		r.promptMu.Unlock()
		if done() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CancelPrompts sends session/cancel for every prompt the agent ("" =
// every agent) is running (a drain that ran out of grace) and waits up to
// wait for the agents to answer them; a prompt still unanswered then is
// answered by the gateway. Prompts waiting for another client's turn are
// refused: they were never sent. Either way its client gets stopReason
// "cancelled" (and the session's other clients turn_complete) before the
// drain closes it.
func (r *Relay) CancelPrompts(agent string, wait time.Duration) {
	pending, _ := r.runningPrompts(agent)
	var running []*outReq
	for _, req := range pending {
		if req.sess.shared() && !req.sess.turn.IsRunning(req) {
			// Waiting for another client's turn: it will not be sent.
			req.sess.failQueued(nil, "the gateway is shutting down; the prompt was not sent to the agent")
			continue
		}
		running = append(running, req)
	}
	for _, req := range running {
		req.side.p.Notify(acp.SessionCancel, acp.SessionIDObject(req.sess.AgentID))
	}
	if len(running) > 0 {
		r.log.Info("cancelled running prompts", "count", len(running), "agent", agent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if r.WaitPrompts(ctx, agent) == nil {
		return
	}
	for _, req := range running {
		if req.side.take(req) { // the agent did not answer its cancel in time
			req.cancelInPlace()
		}
	}
}

// tenantNames lists the named tenants that may use the agent.
func tenantNames(cfgs []TenantConfig, agent string) []string {
	var names []string
	for _, c := range cfgs {
		if c.Name != "" && c.mayUse(agent) {
			names = append(names, c.Name)
		}
	}
	return names
}

// UpdateTenants applies a reloaded tenant list: existing tenants keep their
// sessions and counts and get the new settings; new tenants can connect;
// removed tenants' open connections live on until they close. Nothing is
// applied if any tenant is invalid.
func (r *Relay) UpdateTenants(cfgs []TenantConfig) error {
	u, err := r.PrepareTenants(cfgs)
	if err != nil {
		return err
	}
	u.Apply()
	return nil
}

// TenantUpdate is a reloaded tenant list, checked and ready to apply
// (Relay.PrepareTenants).
type TenantUpdate struct {
	r       *Relay
	cfgs    []TenantConfig
	mappers []*pathmap.Mapper
}

// PrepareTenants checks a reloaded tenant list and builds what applying it
// needs, changing nothing: UpdateTenants in two steps, for a reload that
// applies nothing until every step of it is ready.
func (r *Relay) PrepareTenants(cfgs []TenantConfig) (*TenantUpdate, error) {
	mappers := make([]*pathmap.Mapper, len(cfgs))
	for i, c := range cfgs {
		m, err := c.mapper()
		if err != nil {
			return nil, err
		}
		if m != nil && !r.mapPaths {
			return nil, fmt.Errorf("tenant %q: path mapping cannot be turned on by a reload; restart the gateway", c.Name)
		}
		mappers[i] = m
	}
	return &TenantUpdate{r: r, cfgs: cfgs, mappers: mappers}, nil
}

// Apply applies the tenant list (see UpdateTenants); it cannot fail.
func (u *TenantUpdate) Apply() {
	r, cfgs, mappers := u.r, u.cfgs, u.mappers
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenantCfg = cfgs
	for _, ag := range r.agents {
		fa := fileAccess(r.caps, cfgs, ag.name)
		ag.pool.SetFileAccess(fa[0], fa[1])
		ag.pool.SetTenants(tenantNames(cfgs, ag.name))
	}
	for i, c := range cfgs {
		if t := r.tenants[c.Name]; t != nil {
			t.update(c, mappers[i])
			continue
		}
		t := makeTenant(c, mappers[i], r.metrics)
		t.limiter = newLimiter(r.limits.TenantMessagesPerSecond, r.limits.TenantMessageBurst)
		t.queuedBytes.Max = r.limits.tenantQueuedBytes()
		r.tenants[c.Name] = t
	}
}

// Close cancels waiting requests and stops every agent process (their
// readers end first), then waits for the relay's own goroutines.
func (r *Relay) Close(ctx context.Context) error {
	r.cancel()
	var errs []error
	for _, ag := range r.agentList() { // their readers and exit handlers end first: they start work
		if err := ag.pool.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("agent %q: %w", ag.name, err))
		}
	}
	r.bg.Close()
	return errors.Join(errs...)
}

// workers runs what must not run on its caller's stack, which may be an
// agent's reader or hold a session's fan lock: a prompt that waited for
// its turn starts, an agent request is answered in its clients' place, an
// overflowed connection ends. Relay.Close closes it once the agents'
// readers have stopped: it waits for what runs, and nothing more starts
// (the agents are gone).
type workers struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Go runs f on a goroutine of its own, unless the workers have closed
// (false).
func (w *workers) Go(f func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.wg.Go(f)
	}
	return !w.closed
}

// Close lets nothing more start and waits for what runs.
func (w *workers) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}
