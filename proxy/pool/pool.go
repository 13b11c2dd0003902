// Package pool runs an agent's processes: it starts, initializes, warms,
// recycles and stops them, and chooses the process a client's request goes
// to. It knows nothing of the messages that cross them: each process hands
// its lines, the maintainer's ticks and its exit to a Handler made for it
// (Config.NewHandler), which the relay provides.
//
// What a holder takes of a process (a session slot, a connection's home, a
// request in flight) is a Lease, released exactly once. The pool chooses by
// the counters its leases keep, under its one lock; every release that
// frees capacity wakes the waiters at once.
//
// Lock order: Pool.mu before Process.mu. The relay's code (Config.NewHandler,
// the Handler, AgentConfig.Launch) is never called with either held.
package pool

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Pool owns an agent's processes. Every process is told file access as far
// as the policies allow (the relay stands in for a client without it), so
// one process serves any client of its tenant; only what the gateway cannot
// stand in for (terminal, the draft elicitation and auth capabilities) and
// the protocol version set processes apart (Profile.Serves).
type Pool struct {
	// Static after construction.
	cfg  Config
	log  *slog.Logger
	ctx  context.Context
	stop context.CancelFunc // ends the maintainer
	wg   sync.WaitGroup     // every goroutine of the pool and its processes
	kick chan struct{}      // wakes the maintainer

	mu      sync.Mutex
	procs   []*Process
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
	inits      map[Profile]Init
	newestInit Init // the newest of them (/v1/agents)
	// tenants (configured order) and lastUse (a sequence number per
	// tenant) choose whom warm processes are started for when TenantBound.
	tenants []string
	lastUse map[string]uint64
	useSeq  uint64
}

// New starts a pool and its maintainer, which pre-warms MinIdle processes.
// Close stops everything.
func New(cfg Config, log *slog.Logger) *Pool {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Pool{cfg: cfg, log: log, ctx: ctx, stop: stop, kick: make(chan struct{}, 1), notify: make(chan struct{}),
		fsRead: true, fsWrite: true, inits: map[Profile]Init{}, lastUse: map[string]uint64{}, tenants: cfg.Tenants}
	if fa := cfg.FileAccess; fa != nil {
		p.fsRead, p.fsWrite = fa[0], fa[1]
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.maintain() }()
	return p
}

// Config returns the pool's configuration, defaults applied.
func (p *Pool) Config() *Config { return &p.cfg }

// changedLocked wakes everything waiting for capacity (p.mu held) and the
// maintainer.
func (p *Pool) changedLocked() {
	close(p.notify)
	p.notify = make(chan struct{})
	p.kickMaintainer()
}

func (p *Pool) kickMaintainer() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// doubleRelease reports a lease released twice, or a counter that would go
// below zero: a bug in the holder, never silent.
func (p *Pool) doubleRelease(a *Process, what string) {
	p.cfg.Metrics.DoubleReleases.WithLabelValues(what).Inc()
	p.log.Error("a process lease was released twice; ignored", "process", a.id, "what", what)
}

// release gives back a session slot or a home.
func (p *Pool) release(l *Lease) {
	a := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	n := &a.homes
	switch {
	case l.kind == kindSession && l.committed:
		n = &a.sessions
	case l.kind == kindSession:
		n = &a.reserved
	}
	if *n <= 0 {
		p.doubleRelease(a, l.kind.String()+"_count")
		return
	}
	*n--
	p.changedLocked()
}

// commit turns a reserved slot into a session.
func (p *Pool) commit(l *Lease) {
	a := l.p
	p.mu.Lock()
	if l.committed || l.released.Load() {
		p.mu.Unlock()
		return
	}
	l.committed = true
	a.reserved--
	a.sessions++
	a.served++
	due := p.cfg.RecycleAfterSessions > 0 && a.served >= p.cfg.RecycleAfterSessions
	p.mu.Unlock()
	if due {
		a.Retire("sessions")
	}
}

// LeaseSession takes a session slot on a for a session it already serves
// (a load of it): room is not checked. It fails only once a is not ready.
func (a *Process) LeaseSession() (*Lease, bool) {
	return a.pool.hold(a, kindSession, false)
}

// TryLeaseSession takes a session slot on a if it has room (a fork).
func (a *Process) TryLeaseSession() (*Lease, bool) {
	return a.pool.hold(a, kindSession, true)
}

// LeaseRequest counts a client request in flight on a; false once a has
// exited.
func (a *Process) LeaseRequest() (*Lease, bool) {
	if a.State() == Dead {
		return nil, false
	}
	a.requests.Add(1)
	return &Lease{p: a, kind: kindRequest}, true
}

func (p *Pool) hold(a *Process, kind leaseKind, checkRoom bool) (*Lease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.State() != Ready || checkRoom && a.sessions+a.reserved >= p.cfg.MaxSessionsPerProcess {
		return nil, false
	}
	return p.leaseLocked(a, kind), true
}

// leaseLocked makes a lease of a (p.mu held).
func (p *Pool) leaseLocked(a *Process, kind leaseKind) *Lease {
	switch kind {
	case kindSession:
		a.reserved++
	case kindHome:
		a.homes++
	}
	return &Lease{p: a, kind: kind}
}

// ErrClosed is returned once the pool is shutting down.
var ErrClosed = errors.New("the gateway is shutting down")

// ErrFailing is wrapped while the pool backs off after failed starts.
var ErrFailing = errors.New("the agent is failing to start")

// BusyError: no process had room within the acquire timeout.
type BusyError struct {
	Wait                time.Duration
	Procs, Max, PerProc int
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("no agent process free within %s (%d processes of at most %d, %d sessions each)", e.Wait, e.Procs, e.Max, e.PerProc)
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
	p.kickMaintainer()
}

// idleLocked: starting or ready, with no session and no slot reserved,
// and not retiring (p.mu held).
func idleLocked(a *Process) bool {
	st := a.State()
	return (st == Ready || st == Starting) && a.sessions == 0 && a.reserved == 0 && !a.Retiring()
}

// unusedLocked reports whether a is ready and carries nothing: no session,
// no reserved slot, no request in flight. A connection may still call it
// home; it acquires another when this one is gone (p.mu held).
func unusedLocked(a *Process) bool {
	return a.State() == Ready && a.sessions == 0 && a.reserved == 0 && a.requests.Load() == 0
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
		if idleLocked(a) {
			hasIdle[a.prof.Tenant] = true
		}
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
func (p *Pool) isBaseLocked(a *Process) bool {
	k := a.prof.Kind()
	if p.cfg.TenantBound {
		k.Tenant = ""
	}
	return k == p.baseLocked().Kind()
}

// baseLocked is what warm processes are told: protocol v1, file access,
// nothing the gateway cannot stand in for, no tenant yet. Any v1 client can
// use such a process.
func (p *Pool) baseLocked() Profile {
	return Profile{Version: 1, FsRead: p.fsRead, FsWrite: p.fsWrite}
}

// CachedInit returns the newest initialize answer of a process told the
// client's kind, or else of any kind that serves it.
func (p *Pool) CachedInit(prof Profile) (Init, bool) {
	k := prof.Kind()
	k.Tenant = ""
	p.mu.Lock()
	defer p.mu.Unlock()
	if in, ok := p.inits[k]; ok {
		return in, true
	}
	for told, in := range p.inits {
		if told.Serves(k) {
			return in, true
		}
	}
	return Init{}, false
}

// Info is the agentInfo and protocol version of the newest initialize
// answer (nil, 0 before any).
func (p *Pool) Info() (json.RawMessage, int) {
	p.mu.Lock()
	in := p.newestInit
	p.mu.Unlock()
	if in.Result == nil {
		return nil, 0
	}
	var r struct {
		AgentInfo json.RawMessage `json:"agentInfo"`
	}
	if json.Unmarshal(in.Result, &r) != nil || len(r.AgentInfo) == 0 || string(r.AgentInfo) == "null" {
		return nil, in.Version
	}
	return r.AgentInfo, in.Version
}

// ClientReason is what a client is told about a failure to reach an agent:
// why, without host details (argv, agent stderr), which only go to the log.
func ClientReason(err error) string {
	switch {
	case errors.Is(err, ErrFailing):
		return "the agent is failing to start; try again shortly"
	case errors.Is(err, ErrAgentExited):
		return "the agent process exited"
	case errors.Is(err, context.DeadlineExceeded):
		return "the agent did not take the request in time"
	case errors.Is(err, ErrClosed):
		return ErrClosed.Error()
	}
	var busy *BusyError
	if errors.As(err, &busy) {
		return busy.Error()
	}
	return "internal error"
}
