package proxy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// PoolConfig sizes the agent pool.
type PoolConfig struct {
	Agent                 AgentConfig
	MinIdle               int           // initialized processes with no session kept ready
	MaxProcesses          int           // upper bound on live processes
	MaxSessionsPerProcess int           // sessions one process serves at most
	MaxMessageBytes       int           // stdio line limit
	AcquireTimeout        time.Duration // how long a request waits for a process
	IdleTimeout           time.Duration // an idle process beyond MinIdle is stopped after this
	// RecycleAfterSessions and RecycleAfter retire a process once it has
	// served that many sessions, or has run that long (0 = never): it takes
	// no new sessions and stops once its last one has ended.
	RecycleAfterSessions int
	RecycleAfter         time.Duration
	// ClientRequestTimeout bounds how long an agent→client request (a
	// permission, fs, elicitation) waits for the client; then the gateway
	// answers it in the client's place. 0 = no limit.
	ClientRequestTimeout time.Duration
	// ClientInfo is the name and version the gateway gives agents.
	ClientName, ClientVersion string
	// RequestTimeout and PromptTimeout bound how long a client request
	// waits for its agent; then the gateway answers it with an error (and
	// cancels the turn, for a prompt). 0 = no limit.
	RequestTimeout, PromptTimeout time.Duration

	// TenantBound: a process belongs to one tenant from its start (the
	// sandbox confines it to that tenant's root), so warm processes are
	// started for tenants (SetTenants), the most recently active first.
	TenantBound bool

	tenantNames []string      // the configured tenants, for SetTenants at start
	mapPaths    bool          // some tenant maps paths: locate path fields in agent output
	fileAccess  *[2]bool      // what processes are told of fs read, write; nil = both
	metrics     *agentMetrics // never nil once the pool runs
}

func (c *PoolConfig) setDefaults() {
	if c.MaxProcesses <= 0 {
		c.MaxProcesses = 16
	}
	if c.MaxSessionsPerProcess <= 0 {
		c.MaxSessionsPerProcess = 32
	}
	if c.MinIdle > c.MaxProcesses {
		c.MinIdle = c.MaxProcesses
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 16 << 20
	}
	if c.AcquireTimeout <= 0 {
		c.AcquireTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.Agent.StopGrace <= 0 {
		c.Agent.StopGrace = 5 * time.Second
	}
	if c.Agent.InitTimeout <= 0 {
		c.Agent.InitTimeout = 60 * time.Second
	}
	if c.ClientName == "" {
		c.ClientName = "acpgate"
	}
}

// Pool owns the agent processes. Every process is told file access as far
// as the policies allow (the gateway stands in for a client without it), so
// one process serves any client of its tenant; only what the gateway cannot
// stand in for (terminal, the draft elicitation and auth capabilities) and
// the protocol version set processes apart (Profile.serves).
type Pool struct {
	cfg PoolConfig
	log *slog.Logger
	ctx context.Context
	// stop ends the maintainer; wg owns every goroutine of the pool and its
	// processes.
	stop context.CancelFunc
	wg   sync.WaitGroup
	kick chan struct{}

	mu      sync.Mutex
	procs   []*agentProc
	nextID  int64
	closed  bool
	notify  chan struct{} // closed and replaced whenever capacity changes
	fails   int           // consecutive start failures
	retryAt time.Time     // no new start before this, after failures
	lastErr error
	everOK  bool
	waiters int // acquirers waiting for capacity: no warming meanwhile
	// fsRead and fsWrite are what new processes are told about file access:
	// as far as any tenant's policy allows (SetFileAccess).
	fsRead, fsWrite bool
	// inits caches the newest initialize answer per kind told (tenant
	// cleared), so that a client's initialize is answered at once.
	inits      map[Profile]agentInit
	newestInit agentInit // the newest of them (/v1/agents)
	// tenants (configured order) and lastUse (a sequence number per
	// tenant) choose whom warm processes are started for when TenantBound.
	tenants []string
	lastUse map[string]uint64
	useSeq  uint64
}

// NewPool starts a pool and its maintainer, which pre-warms MinIdle
// processes. Close stops everything.
func NewPool(cfg PoolConfig, log *slog.Logger) *Pool {
	cfg.setDefaults()
	if cfg.metrics == nil {
		cfg.metrics = nopMetrics().forAgent(DefaultAgent)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, log: log, ctx: ctx, stop: stop, kick: make(chan struct{}, 1), notify: make(chan struct{}),
		fsRead: true, fsWrite: true, inits: map[Profile]agentInit{}, lastUse: map[string]uint64{}, tenants: cfg.tenantNames}
	if fa := cfg.fileAccess; fa != nil {
		p.fsRead, p.fsWrite = fa[0], fa[1]
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.maintain() }()
	return p
}

// changed wakes everything waiting for capacity and the maintainer.
func (p *Pool) changed() {
	p.mu.Lock()
	close(p.notify)
	p.notify = make(chan struct{})
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// errPoolClosed is returned once the pool is shutting down.
var errPoolClosed = errors.New("the gateway is shutting down")

// errAgentFailing is wrapped while the pool backs off after failed starts.
var errAgentFailing = errors.New("the agent is failing to start")

// poolBusyError: no process had room within the acquire timeout.
type poolBusyError struct {
	wait                time.Duration
	procs, max, perProc int
}

func (e *poolBusyError) Error() string {
	return fmt.Sprintf("no agent process free within %s (%d processes of at most %d, %d sessions each)", e.wait, e.procs, e.max, e.perProc)
}

// SetFileAccess sets what processes started from now on are told about
// file access: read and write as far as any tenant's policy allows them.
// Processes already running keep what they were told; the gateway stands
// in either way.
func (p *Pool) SetFileAccess(read, write bool) {
	p.mu.Lock()
	p.fsRead, p.fsWrite = read, write
	p.mu.Unlock()
}

// SetTenants lists the tenants warm processes may be started for when
// processes are tenant-bound, in the configured order.
func (p *Pool) SetTenants(names []string) {
	p.mu.Lock()
	p.tenants = append([]string(nil), names...)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// warmTenantLocked picks the tenant a tenant-bound warm process is started
// for: the most recently active tenant without an idle process, else the
// most recently active one ("" when no tenant is known).
func (p *Pool) warmTenantLocked() string {
	order := slices.Clone(p.tenants)
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(p.lastUse[b], p.lastUse[a]) })
	if len(order) == 0 {
		return ""
	}
	hasIdle := map[string]bool{}
	for _, a := range p.procs {
		a.mu.Lock()
		if (a.state == procReady || a.state == procStarting) && len(a.sessions) == 0 && a.reserved == 0 && !a.retiring {
			hasIdle[a.prof.Tenant] = true
		}
		a.mu.Unlock()
	}
	for _, t := range order {
		if !hasIdle[t] {
			return t
		}
	}
	return order[0]
}

// isBaseLocked reports whether a was told the base kind: a warm process
// any client (of its tenant, when tenant-bound) can use.
func (p *Pool) isBaseLocked(a *agentProc) bool {
	k := a.prof.kind()
	if p.cfg.TenantBound {
		k.Tenant = ""
	}
	return k == p.baseLocked().kind()
}

// baseLocked is what warm processes are told: protocol v1, file access,
// nothing the gateway cannot stand in for, no tenant yet. Any v1 client can
// use such a process.
func (p *Pool) baseLocked() Profile {
	return Profile{Version: 1, FsRead: p.fsRead, FsWrite: p.fsWrite}
}

// cachedInit returns the newest initialize answer of a process told the
// client's kind, or else of any kind that serves it.
func (p *Pool) cachedInit(prof Profile) (agentInit, bool) {
	k := prof.kind()
	k.Tenant = ""
	p.mu.Lock()
	defer p.mu.Unlock()
	if in, ok := p.inits[k]; ok {
		return in, true
	}
	for told, in := range p.inits {
		if told.serves(k) {
			return in, true
		}
	}
	return agentInit{}, false
}

// info is the agentInfo and protocol version of the newest initialize
// answer (nil, 0 before any).
func (p *Pool) info() (json.RawMessage, int) {
	p.mu.Lock()
	in := p.newestInit
	p.mu.Unlock()
	if in.result == nil {
		return nil, 0
	}
	var r struct {
		AgentInfo json.RawMessage `json:"agentInfo"`
	}
	if json.Unmarshal(in.result, &r) != nil || len(r.AgentInfo) == 0 || string(r.AgentInfo) == "null" {
		return nil, in.version
	}
	return r.AgentInfo, in.version
}

// acquire returns a ready process that serves a client of profile prof.
// With forSession it also reserves a session slot, packing sessions onto
// the busiest process that has room so that idle processes stay idle (and
// warm). Without, the process becomes one more connection's home.
//
// A process told exactly the client's kind is preferred: a ready one, else
// one starting, else a new one (an unused process told another kind is
// stopped to make room). When none can be had, any ready process that
// serves the client is taken. A client never waits on a process it
// cannot use, and retiring processes take nothing new.
func (p *Pool) acquire(ctx context.Context, prof Profile, forSession bool) (*agentProc, error) {
	want := prof.kind()
	start := time.Now()
	waiting := false
	defer func() {
		if waiting {
			p.mu.Lock()
			p.waiters--
			p.mu.Unlock()
		}
		p.cfg.metrics.PoolWait.Observe(since(start))
	}()
	if want.Tenant != "" {
		p.mu.Lock()
		p.useSeq++
		p.lastUse[want.Tenant] = p.useSeq
		p.mu.Unlock()
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		var exact, other, starting *agentProc
		exactLoad, otherLoad := -1, -1
		for _, a := range p.procs {
			claim := a.claimableBy(want)
			if !claim && !a.prof.serves(want) {
				continue
			}
			k := a.prof.kind()
			if claim {
				k.Tenant = want.Tenant
			}
			a.mu.Lock()
			st, load, retiring := a.state, len(a.sessions)+a.reserved, a.retiring
			a.mu.Unlock()
			room := load < p.cfg.MaxSessionsPerProcess
			switch {
			case retiring:
			case st == procStarting && k == want && room:
				starting = a
			case st != procReady || forSession && !room:
			case k == want && load > exactLoad:
				exact, exactLoad = a, load
			case k != want && load > otherLoad:
				other, otherLoad = a, load
			}
		}
		best := exact
		if best == nil && starting == nil {
			progress, err := p.spawnLocked(want)
			switch {
			case !progress && other != nil:
				best = other
			case err != nil:
				p.mu.Unlock()
				return nil, err
			}
		}
		if best != nil {
			if best.prof.Tenant != want.Tenant { // a fresh warm process, now the tenant's
				best.prof.Tenant = want.Tenant
				best.log.Info("agent process assigned to tenant", "tenant", want.Tenant)
			}
			best.claimed = true
			best.mu.Lock()
			if forSession {
				best.reserved++
			} else {
				best.conns++
			}
			best.mu.Unlock()
			p.mu.Unlock()
			return best, nil
		}
		if !waiting {
			waiting = true
			p.waiters++
		}
		wait := p.notify
		p.mu.Unlock()
		recheck := time.NewTimer(time.Second) // in case a change went unannounced
		select {
		case <-wait:
		case <-recheck.C:
		case <-ctx.Done():
			recheck.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, &poolBusyError{wait: p.cfg.AcquireTimeout, procs: p.count(), max: p.cfg.MaxProcesses, perProc: p.cfg.MaxSessionsPerProcess}
			}
			return nil, ctx.Err()
		}
		recheck.Stop()
	}
}

// profile returns what the process was told.
func (a *agentProc) profile() Profile {
	a.pool.mu.Lock()
	defer a.pool.mu.Unlock()
	return a.prof
}

// claimableBy reports whether a is a warm process no one has used yet that
// would serve a client of kind want once it is the client's tenant's.
// Called with the pool locked.
func (a *agentProc) claimableBy(want Profile) bool {
	if a.claimed || a.prof.Tenant != "" || want.Tenant == "" {
		return false
	}
	q := a.prof
	q.Tenant = want.Tenant
	return q.serves(want)
}

// unusedLocked reports whether a is ready and carries nothing: no session,
// no reserved slot, no request either way. A connection may still call it
// home; it acquires another when this one is gone. Called with a.mu held.
func (a *agentProc) unusedLocked() bool {
	return a.state == procReady && len(a.sessions) == 0 && a.reserved == 0 && len(a.pending) == 0 && len(a.inbound) == 0
}

func (p *Pool) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.procs)
}

// spawnLocked starts one more process told kind want (and file access) if
// the pool has room and is not backing off after failures. A full pool
// makes room by stopping an unused process told another kind, or one that
// is retiring. progress reports whether either happened; without it
// the caller waits for capacity or uses what it has.
func (p *Pool) spawnLocked(want Profile) (progress bool, err error) {
	if now := time.Now(); now.Before(p.retryAt) {
		return false, fmt.Errorf("%w (%v); next try in %s", errAgentFailing, p.lastErr, p.retryAt.Sub(now).Round(time.Millisecond))
	}
	if len(p.procs) >= p.cfg.MaxProcesses {
		victim := p.victimLocked(want)
		if victim == nil {
			return false, nil
		}
		victim.log.Info("stopping an unused agent process to make room", "for_tenant", want.Tenant)
		victim.stop(p.cfg.Agent.StopGrace)
		return true, nil
	}
	told := want
	told.FsRead, told.FsWrite = p.fsRead, p.fsWrite
	if p.cfg.TenantBound && told.Tenant == "" {
		if told.Tenant = p.warmTenantLocked(); told.Tenant == "" {
			return false, errors.New("no tenant to start an agent process for")
		}
	}
	p.nextID++
	a := &agentProc{
		pool:     p,
		id:       p.nextID,
		prof:     told,
		log:      p.log.With("process", p.nextID),
		writeQ:   make(chan []byte, 256),
		exited:   make(chan struct{}),
		stopCh:   make(chan struct{}),
		ctrlWake: make(chan struct{}, 1),
		fsSlots:  make(chan struct{}, maxFsStandIn),
		pending:  map[int64]*outReq{},
		inbound:  map[string]*inReq{},
		sessions: map[string]*Session{},
	}
	p.procs = append(p.procs, a)
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.bringUp(a, told.Tenant) }()
	return true, nil
}

// victimLocked picks an unused process to stop when the pool is full: a
// retiring one first, else one told another kind than want.
func (p *Pool) victimLocked(want Profile) *agentProc {
	var victim *agentProc
	for _, a := range p.procs {
		a.mu.Lock()
		unused, retiring := a.unusedLocked(), a.retiring
		a.mu.Unlock()
		k := a.prof.kind()
		if a.claimableBy(want) {
			k.Tenant = want.Tenant
		}
		switch {
		case !unused:
		case retiring:
			return a
		case victim == nil && k != want:
			victim = a
		}
	}
	return victim
}

// bringUp starts a process and initializes it; on failure the pool backs off.
func (p *Pool) bringUp(a *agentProc, tenant string) {
	start := time.Now()
	p.cfg.metrics.Spawns.Inc()
	err := a.start(&p.cfg, tenant)
	if err == nil {
		ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Agent.InitTimeout)
		initStart := time.Now()
		err = a.initialize(ctx, &p.cfg)
		cancel()
		if err != nil {
			a.initFailed.Store(true)
			a.stop(p.cfg.Agent.StopGrace)
		} else {
			p.cfg.metrics.InitializeDuration.Observe(since(initStart))
			p.cfg.metrics.SpawnDuration.Observe(since(start))
		}
	} else {
		p.cfg.metrics.Exits.WithLabelValues("init_failed").Inc()
	}
	p.mu.Lock()
	if err != nil {
		a.initErr = err
		p.fails++
		p.lastErr = err
		backoff := 100 * time.Millisecond << min(p.fails-1, 9) // up to ~51 s
		p.retryAt = time.Now().Add(min(backoff, 30*time.Second))
		if a.cmd == nil { // never started: nothing will reap it
			p.removeLocked(a)
		}
	} else {
		p.fails, p.lastErr, p.everOK = 0, nil, true
		p.retryAt = time.Time{}
		k := a.prof.kind()
		k.Tenant = ""
		p.inits[k] = a.init
		p.newestInit = a.init
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Error("agent failed to start", "process", a.id, "err", err)
	} else {
		a.mu.Lock()
		if a.state == procStarting {
			a.state = procReady
			a.readyAt = time.Now()
		}
		a.mu.Unlock()
		a.log.Info("agent ready", "protocol_version", a.init.version, "took", time.Since(start).Round(time.Millisecond))
	}
	p.changed()
}

// placeSession finds the process for a session/load or session/resume: the
// one that still serves the session if there is one (even a retiring one:
// the session is already there), otherwise any process with room, with a
// slot reserved.
func (p *Pool) placeSession(ctx context.Context, prof Profile, agentSID string) (*agentProc, error) {
	want := prof.kind()
	p.mu.Lock()
	for _, a := range p.procs {
		if !a.prof.serves(want) { // a session's process already serves its tenant
			continue
		}
		a.mu.Lock()
		_, has := a.sessions[agentSID]
		if has && a.state == procReady {
			a.reserved++
			a.mu.Unlock()
			p.mu.Unlock()
			return a, nil
		}
		a.mu.Unlock()
	}
	p.mu.Unlock()
	return p.acquire(ctx, prof, true)
}

// retire marks a as taking no new sessions, for reason ("sessions" or
// "age"). The maintainer stops it once it is unused and warms a
// replacement.
func (a *agentProc) retire(reason string) {
	a.mu.Lock()
	already := a.retiring || a.state != procReady
	a.retiring = true
	served := a.served
	a.mu.Unlock()
	if already {
		return
	}
	a.pool.cfg.metrics.Recycled.WithLabelValues(reason).Inc()
	a.log.Info("agent process retiring: it takes no new sessions and stops when its last one ends",
		"reason", reason, "sessions_served", served)
	a.pool.changed()
}

func (a *agentProc) isRetiring() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.retiring
}

// removed forgets a process that has exited.
func (p *Pool) removed(a *agentProc) {
	p.mu.Lock()
	p.removeLocked(a)
	p.mu.Unlock()
	p.changed()
}

func (p *Pool) removeLocked(a *agentProc) {
	for i, x := range p.procs {
		if x == a {
			p.procs = append(p.procs[:i], p.procs[i+1:]...)
			return
		}
	}
}

// maintain keeps MinIdle warm processes of the base profile (any client
// can use one), stops idle processes beyond that after IdleTimeout, retires
// processes past their age, stops retiring processes once unused, and
// expires requests nobody answered in time.
func (p *Pool) maintain() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.mu.Lock()
		if !p.closed {
			p.maintainLocked(time.Now())
		}
		procs := append([]*agentProc(nil), p.procs...)
		p.mu.Unlock()
		for _, a := range procs {
			a.expireRequests(p.cfg.RequestTimeout, p.cfg.PromptTimeout)
			a.expireInbound(p.cfg.ClientRequestTimeout)
			if p.cfg.RecycleAfter > 0 && a.age() >= p.cfg.RecycleAfter {
				a.retire("age")
			}
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

func (p *Pool) maintainLocked(now time.Time) {
	base := p.baseLocked().kind()
	idle := 0
	var reap, done []*agentProc
	for _, a := range p.procs {
		a.mu.Lock()
		isIdle := (a.state == procReady || a.state == procStarting) && len(a.sessions) == 0 && a.reserved == 0 && !a.retiring
		if isIdle && p.isBaseLocked(a) {
			idle++
		}
		if a.retiring && a.unusedLocked() {
			done = append(done, a)
		}
		// A process is quiet from the first tick that finds it ready with
		// nothing attached; anything attached resets it.
		switch quiet := isIdle && a.state == procReady && a.conns == 0; {
		case !quiet:
			a.idleAt = time.Time{}
		case a.idleAt.IsZero():
			a.idleAt = now
		case now.Sub(a.idleAt) > p.cfg.IdleTimeout:
			reap = append(reap, a)
		}
		a.mu.Unlock()
	}
	for _, a := range done {
		a.log.Info("stopping a retired agent process: its last session has ended")
		a.stop(p.cfg.Agent.StopGrace)
	}
	// Warming waits while a client waits for capacity: the client's
	// process comes first. A pool without min_idle that has never had a
	// process start still starts one, so that readiness tells whether the
	// agent can start at all; it is then stopped when idle like any other.
	want := p.cfg.MinIdle
	if want == 0 && !p.everOK && len(p.procs) == 0 {
		want = 1
	}
	for ; idle < want && len(p.procs) < p.cfg.MaxProcesses && !now.Before(p.retryAt) && p.waiters == 0; idle++ {
		if _, err := p.spawnLocked(base); err != nil {
			break
		}
	}
	for _, a := range reap {
		isBase := p.isBaseLocked(a)
		if isBase && idle <= p.cfg.MinIdle {
			continue
		}
		if isBase {
			idle--
		}
		a.log.Info("stopping idle agent", "idle_for", now.Sub(a.idleAt).Round(time.Second))
		a.stop(p.cfg.Agent.StopGrace)
	}
}

// age is how long the process has been ready (0 before).
func (a *agentProc) age() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.readyAt.IsZero() || a.state != procReady {
		return 0
	}
	return time.Since(a.readyAt)
}

// expireInbound answers, in the client's place, the agent's requests a
// client has left unanswered for longer than limit: a permission request is
// cancelled, anything else gets -32603. The client hears nothing more of it;
// a late answer is dropped.
func (a *agentProc) expireInbound(limit time.Duration) {
	if limit <= 0 {
		return
	}
	now := time.Now()
	var expired []*inReq
	a.mu.Lock()
	var conns []*Conn
	var ids []int64
	for id, in := range a.inbound {
		if now.Sub(in.start) >= limit && in.claim() {
			delete(a.inbound, id)
			expired = append(expired, in)
			conns, ids = append(conns, in.conn), append(ids, in.connID)
		}
	}
	a.mu.Unlock()
	for i, in := range expired {
		conns[i].forgetAgentReq(ids[i])
		a.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("client_timeout").Inc()
		conns[i].log.Info("the client did not answer an agent request in time; answered in its place",
			"method", in.method, "waited", now.Sub(in.start).Round(time.Second))
		a.answerForClient(in.agentID, in.method, jsonrpc.CodeInternalError,
			fmt.Sprintf("the client did not answer %s within %s", in.method, limit))
	}
}

// expireRequests answers the client requests an agent has sat on too long.
func (a *agentProc) expireRequests(reqTimeout, promptTimeout time.Duration) {
	now := time.Now()
	var expired []*outReq
	a.mu.Lock()
	for id, r := range a.pending {
		limit := reqTimeout
		if r.method == mSessionPrompt {
			limit = promptTimeout
		}
		if r.internal != nil || limit <= 0 || now.Sub(r.start) < limit {
			continue
		}
		delete(a.pending, id)
		if r.reserved {
			a.reserved--
		}
		expired = append(expired, r)
	}
	a.mu.Unlock()
	for _, r := range expired {
		a.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("request_timeout").Inc()
		if r.conn == nil {
			continue // the gateway's own fire-and-forget request
		}
		c := r.conn
		a.log.Warn("agent did not answer in time; answered for it", "method", r.method, "waited", now.Sub(r.start).Round(time.Millisecond))
		if r.method == mSessionPrompt && r.sess != nil {
			a.notify(mSessionCancel, sessionIDObject(r.sess.AgentID))
		}
		if r.attach != nil {
			a.dropSession(r.attach)
			c.detach(r.attach)
		}
		c.forgetClientReq(r)
		c.replyError(r.clientID, jsonrpc.CodeInternalError,
			fmt.Sprintf("the agent did not answer %s within %s", r.method, now.Sub(r.start).Round(time.Second)), nil)
	}
	if len(expired) > 0 {
		a.pool.changed()
	}
}

// Ready reports whether the pool can serve: it has a ready process or has
// started one successfully and is not failing to start them now.
func (p *Pool) Ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, a := range p.procs {
		a.mu.Lock()
		ok := a.state == procReady
		a.mu.Unlock()
		if ok {
			return true
		}
	}
	return p.everOK && p.fails == 0
}

// everReady reports whether a process of the pool has ever been ready.
func (p *Pool) everReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.everOK
}

// Stats is a snapshot of the pool.
type Stats struct {
	Processes, Ready, Sessions int
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s Stats
	for _, a := range p.procs {
		a.mu.Lock()
		s.Processes++
		if a.state == procReady {
			s.Ready++
		}
		s.Sessions += len(a.sessions)
		a.mu.Unlock()
	}
	return s
}

// Close stops every agent process (SIGTERM to its group, SIGKILL after the
// grace period) and waits until all are reaped or ctx ends.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	procs := append([]*agentProc(nil), p.procs...)
	p.mu.Unlock()
	p.stop()
	for _, a := range procs {
		a.stop(p.cfg.Agent.StopGrace)
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		for _, a := range procs {
			a.kill()
		}
		<-done
		return fmt.Errorf("stop agents: %w", ctx.Err())
	}
}

// --- process helpers used by connections ---

func (a *agentProc) alive() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state == procReady
}

func (a *agentProc) kill() {
	a.mu.Lock()
	cmd, dead := a.cmd, a.state == procDead
	a.mu.Unlock()
	if cmd != nil && cmd.Process != nil && !dead { // a reaped group's id may be reused
		_ = killGroup(cmd.Process.Pid)
	}
}

// track registers a client request the process is about to receive and
// assigns its agent-side id.
func (a *agentProc) track(r *outReq) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == procDead {
		return false
	}
	a.nextID++
	r.agentID, r.p = a.nextID, a
	a.pending[r.agentID] = r
	return true
}

// untrack removes a request that will not be answered; false if it was
// already gone (answered, or failed by the agent's death).
func (a *agentProc) untrack(r *outReq) bool {
	a.mu.Lock()
	found, freed := a.pending[r.agentID] == r, false
	if found {
		delete(a.pending, r.agentID)
		if r.reserved {
			a.reserved--
			freed = true
		}
	}
	a.mu.Unlock()
	if freed {
		a.pool.changed()
	}
	return found
}

// tryReserveSlot holds a session slot on this process if it has room.
func (a *agentProc) tryReserveSlot() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state != procReady || len(a.sessions)+a.reserved >= a.pool.cfg.MaxSessionsPerProcess {
		return false
	}
	a.reserved++
	return true
}

func (a *agentProc) unreserve() {
	a.mu.Lock()
	if a.reserved > 0 {
		a.reserved--
	}
	a.mu.Unlock()
	a.pool.changed()
}

func (a *agentProc) releaseHome() {
	a.mu.Lock()
	a.conns--
	a.mu.Unlock()
	a.pool.changed()
}

// fireAndForget sends a request of the gateway's own whose answer nobody
// waits for.
func (a *agentProc) fireAndForget(method string, params []byte) {
	a.mu.Lock()
	if a.state == procDead {
		a.mu.Unlock()
		return
	}
	a.nextID++
	id := a.nextID
	a.pending[id] = &outReq{agentID: id, p: a, method: method, start: time.Now()}
	a.mu.Unlock()
	a.sendCtrl(append(jsonrpc.AppendRequest(nil, strconv.AppendInt(nil, id, 10), method, params), '\n'))
}
