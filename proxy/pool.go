package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// DefaultProfile is what pre-warmed processes are initialized with: the
	// client capabilities most clients bring.
	DefaultProfile Profile
	// ClientInfo is the name and version the gateway gives agents.
	ClientName, ClientVersion string
	// RequestTimeout and PromptTimeout bound how long a client request
	// waits for its agent; then the gateway answers it with an error (and
	// cancels the turn, for a prompt). 0 = no limit.
	RequestTimeout, PromptTimeout time.Duration

	mapPaths bool     // some tenant maps paths: locate path fields in agent output
	metrics  *Metrics // never nil once the pool runs
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
	if c.DefaultProfile.Version == 0 {
		c.DefaultProfile.Version = 1
	}
}

// Pool owns the agent processes. Processes are grouped by Profile: a client
// is only served by processes initialized with client capabilities it has
// itself, so an agent never asks a client for something it did not offer.
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
}

// NewPool starts a pool and its maintainer, which pre-warms MinIdle
// processes. Close stops everything.
func NewPool(cfg PoolConfig, log *slog.Logger) *Pool {
	cfg.setDefaults()
	if cfg.metrics == nil {
		cfg.metrics = nopMetrics()
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, log: log, ctx: ctx, stop: stop, kick: make(chan struct{}, 1), notify: make(chan struct{})}
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

// acquire returns a ready process of the profile. With forSession it also
// reserves a session slot, packing sessions onto the busiest process that
// has room so that idle processes stay idle (and warm). Without, the
// process becomes one more connection's home.
func (p *Pool) acquire(ctx context.Context, prof Profile, forSession bool) (*agentProc, error) {
	start := time.Now()
	defer func() { p.cfg.metrics.PoolWait.Observe(since(start)) }()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		var best, starting *agentProc
		for _, a := range p.procs {
			if a.prof != prof && !a.claimableBy(prof) {
				continue
			}
			a.mu.Lock()
			st, load := a.state, len(a.sessions)+a.reserved
			a.mu.Unlock()
			switch {
			case st == procStarting && load < p.cfg.MaxSessionsPerProcess:
				starting = a
			case st != procReady:
			case forSession && load >= p.cfg.MaxSessionsPerProcess:
			case best == nil || load > best.load():
				best = a
			}
		}
		if best != nil {
			if best.prof != prof { // a fresh warm process, now the tenant's
				best.prof = prof
				best.log.Info("agent process assigned to tenant", "tenant", prof.Tenant)
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
		if starting == nil {
			if err := p.spawnLocked(prof); err != nil {
				p.mu.Unlock()
				return nil, err
			}
		}
		wait := p.notify
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, &poolBusyError{wait: p.cfg.AcquireTimeout, procs: p.count(), max: p.cfg.MaxProcesses, perProc: p.cfg.MaxSessionsPerProcess}
			}
			return nil, ctx.Err()
		}
	}
}

// profile returns the process's profile.
func (a *agentProc) profile() Profile {
	a.pool.mu.Lock()
	defer a.pool.mu.Unlock()
	return a.prof
}

// claimableBy reports whether a is a warm process no one has used yet whose
// profile differs from prof only by tenant: it may become the tenant's.
// Called with the pool locked.
func (a *agentProc) claimableBy(prof Profile) bool {
	if a.claimed || a.prof.Tenant != "" || prof.Tenant == "" {
		return false
	}
	q := a.prof
	q.Tenant = prof.Tenant
	return q == prof
}

func (a *agentProc) load() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sessions) + a.reserved
}

func (p *Pool) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.procs)
}

// spawnLocked starts one more process of the profile if the pool has room
// and is not backing off after failures. With no room it returns nil: the
// caller waits for capacity.
func (p *Pool) spawnLocked(prof Profile) error {
	if now := time.Now(); now.Before(p.retryAt) {
		return fmt.Errorf("%w (%v); next try in %s", errAgentFailing, p.lastErr, p.retryAt.Sub(now).Round(time.Millisecond))
	}
	if len(p.procs) >= p.cfg.MaxProcesses {
		// Make room: stop an idle process of another profile.
		victim := p.idleVictimLocked(prof)
		if victim == nil {
			return nil
		}
		victim.stop(p.cfg.Agent.StopGrace)
		return nil
	}
	p.nextID++
	a := &agentProc{
		pool:     p,
		id:       p.nextID,
		prof:     prof,
		log:      p.log.With("agent", p.nextID),
		writeQ:   make(chan []byte, 256),
		exited:   make(chan struct{}),
		stopCh:   make(chan struct{}),
		ctrlWake: make(chan struct{}, 1),
		pending:  map[int64]*outReq{},
		inbound:  map[string]*inReq{},
		sessions: map[string]*Session{},
	}
	p.procs = append(p.procs, a)
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.bringUp(a) }()
	return nil
}

// idleVictimLocked picks an idle ready process whose profile differs from
// prof, to stop when the pool is full.
func (p *Pool) idleVictimLocked(prof Profile) *agentProc {
	for _, a := range p.procs {
		a.mu.Lock()
		idle := a.state == procReady && len(a.sessions) == 0 && a.reserved == 0 && a.conns == 0
		a.mu.Unlock()
		if idle && a.prof != prof {
			return a
		}
	}
	return nil
}

// bringUp starts a process and initializes it; on failure the pool backs off.
func (p *Pool) bringUp(a *agentProc) {
	start := time.Now()
	p.cfg.metrics.Spawns.Inc()
	err := a.start(&p.cfg)
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
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Error("agent failed to start", "agent", a.id, "err", err)
	} else {
		a.mu.Lock()
		if a.state == procStarting {
			a.state = procReady
		}
		a.mu.Unlock()
		a.log.Info("agent ready", "protocol_version", a.init.version, "took", time.Since(start).Round(time.Millisecond))
	}
	p.changed()
}

// placeSession finds the process for a session/load or session/resume: the
// one that still serves the session if there is one, otherwise any process
// with room, with a slot reserved.
func (p *Pool) placeSession(ctx context.Context, prof Profile, agentSID string) (*agentProc, error) {
	p.mu.Lock()
	for _, a := range p.procs {
		if a.prof != prof { // a session's process already serves its tenant
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

// maintain keeps MinIdle processes of the default profile warm and stops
// idle processes beyond that after IdleTimeout.
func (p *Pool) maintain() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.mu.Lock()
		if !p.closed {
			idle := 0
			now := time.Now()
			var reap []*agentProc
			for _, a := range p.procs {
				a.mu.Lock()
				isIdle := (a.state == procReady || a.state == procStarting) && len(a.sessions) == 0 && a.reserved == 0
				if isIdle && a.prof == p.cfg.DefaultProfile {
					idle++
				}
				// A process is quiet from the first tick that finds it
				// ready with nothing attached; anything attached resets it.
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
			for ; idle < p.cfg.MinIdle && len(p.procs) < p.cfg.MaxProcesses && !now.Before(p.retryAt); idle++ {
				if err := p.spawnLocked(p.cfg.DefaultProfile); err != nil {
					break
				}
			}
			for _, a := range reap {
				if a.prof == p.cfg.DefaultProfile && idle <= p.cfg.MinIdle {
					continue
				}
				if a.prof == p.cfg.DefaultProfile {
					idle--
				}
				a.log.Info("stopping idle agent", "idle_for", now.Sub(a.idleAt).Round(time.Second))
				a.stop(p.cfg.Agent.StopGrace)
			}
		}
		procs := append([]*agentProc(nil), p.procs...)
		p.mu.Unlock()
		for _, a := range procs {
			a.expireRequests(p.cfg.RequestTimeout, p.cfg.PromptTimeout)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
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
