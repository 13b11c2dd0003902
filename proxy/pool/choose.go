package pool

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Acquire returns a lease on a ready process that serves a client of
// profile prof. With forSession it is a session slot, packing sessions onto
// the busiest process that has room so that idle processes stay idle (and
// warm). Without, the process becomes one more connection's home.
//
// A process told exactly the client's kind is preferred: a ready one, else
// one starting, else a new one (an unused process told another kind is
// stopped to make room). When none can be had, any ready process that
// serves the client is taken. A client never waits on a process it
// cannot use, and retiring processes take nothing new. It waits until a
// release, a start or an exit changes what can be had, or ctx ends.
func (p *Pool) Acquire(ctx context.Context, prof Profile, forSession bool) (*Lease, error) {
	want := prof.Kind()
	start := time.Now()
	waiting := false
	defer func() {
		if waiting {
			p.mu.Lock()
			p.waiters--
			p.mu.Unlock()
		}
		p.cfg.Metrics.PoolWait.Observe(time.Since(start).Seconds())
	}()
	p.noteUse(want.Tenant)
	for {
		p.mu.Lock()
		l, err := p.tryAcquireLocked(want, forSession)
		if l != nil || err != nil {
			p.mu.Unlock()
			return l, err
		}
		if !waiting {
			waiting = true
			p.waiters++
		}
		wait := p.notify
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, &BusyError{Wait: p.cfg.AcquireTimeout, Procs: p.count(), Max: p.cfg.MaxProcesses, PerProc: p.cfg.MaxSessionsPerProcess}
			}
			return nil, ctx.Err()
		}
	}
}

// noteUse records that tenant is active, for warming tenant-bound processes.
func (p *Pool) noteUse(tenant string) {
	if tenant == "" {
		return
	}
	p.mu.Lock()
	p.useSeq++
	p.lastUse[tenant] = p.useSeq
	p.mu.Unlock()
}

// candidates are what one look at the pool finds for a client.
type candidates struct {
	exact, other, starting *Process
	exactLoad, otherLoad   int
}

// tryAcquireLocked leases the best process for want if one can be had now;
// (nil, nil) means wait (p.mu held).
func (p *Pool) tryAcquireLocked(want Profile, forSession bool) (*Lease, error) {
	if p.closed {
		return nil, ErrClosed
	}
	c := p.lookLocked(want, forSession)
	best := c.exact
	if best == nil && c.starting == nil {
		progress, err := p.spawnLocked(want)
		switch {
		case !progress && c.other != nil:
			best = c.other
		case err != nil:
			return nil, err
		}
	}
	if best == nil {
		return nil, nil
	}
	if best.prof.Tenant != want.Tenant { // a fresh warm process, now the tenant's
		best.prof.Tenant = want.Tenant
		best.Log().Info("agent process assigned to tenant", "tenant", want.Tenant)
	}
	best.claimed = true
	kind := kindHome
	if forSession {
		kind = kindSession
	}
	return p.leaseLocked(best, kind), nil
}

// lookLocked finds the candidates for a client of kind want (p.mu held).
func (p *Pool) lookLocked(want Profile, forSession bool) candidates {
	c := candidates{exactLoad: -1, otherLoad: -1}
	for _, a := range p.procs {
		claim := a.claimableBy(want)
		if !claim && !a.prof.Serves(want) {
			continue
		}
		k := a.prof.Kind()
		if claim {
			k.Tenant = want.Tenant
		}
		st, load := a.State(), a.sessions+a.reserved
		room := load < p.cfg.MaxSessionsPerProcess
		switch {
		case a.Retiring():
		case st == Starting && k == want && room:
			c.starting = a
		case st != Ready || forSession && !room:
		case k == want && load > c.exactLoad:
			c.exact, c.exactLoad = a, load
		case k != want && load > c.otherLoad:
			c.other, c.otherLoad = a, load
		}
	}
	return c
}

// claimableBy reports whether a is a warm process no one has used yet that
// would serve a client of kind want once it is the client's tenant's
// (pool.mu held).
func (a *Process) claimableBy(want Profile) bool {
	if a.claimed || a.prof.Tenant != "" || want.Tenant == "" {
		return false
	}
	q := a.prof
	q.Tenant = want.Tenant
	return q.Serves(want)
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
		return false, fmt.Errorf("%w (%v); next try in %s", ErrFailing, p.lastErr, p.retryAt.Sub(now).Round(time.Millisecond))
	}
	if len(p.procs) >= p.cfg.MaxProcesses {
		victim := p.victimLocked(want)
		if victim == nil {
			return false, nil
		}
		victim.Log().Info("stopping an unused agent process to make room", "for_tenant", want.Tenant)
		victim.Stop()
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
	a := &Process{
		pool:     p,
		id:       p.nextID,
		prof:     told,
		writeQ:   make(chan []byte, 256),
		exited:   make(chan struct{}),
		stopCh:   make(chan struct{}),
		ctrlWake: make(chan struct{}, 1),
		initCh:   make(chan []byte, 1),
	}
	a.log.Store(p.log.With("process", a.id))
	a.initID = a.NextID()
	p.procs = append(p.procs, a)
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.bringUp(a, told) }()
	return true, nil
}

// victimLocked picks an unused process to stop when the pool is full: a
// retiring one first, else one told another kind than want.
func (p *Pool) victimLocked(want Profile) *Process {
	var victim *Process
	for _, a := range p.procs {
		k := a.prof.Kind()
		if a.claimableBy(want) {
			k.Tenant = want.Tenant
		}
		switch {
		case !unusedLocked(a):
		case a.Retiring():
			return a
		case victim == nil && k != want:
			victim = a
		}
	}
	return victim
}

// bringUp makes the process's handler, starts the process and initializes
// it, telling it told; on failure the pool backs off. The handler is made
// with no lock held: it is the relay's code.
func (p *Pool) bringUp(a *Process, told Profile) {
	h := p.cfg.NewHandler(a)
	p.mu.Lock()
	a.handler = h
	p.mu.Unlock()
	start := time.Now()
	p.cfg.Metrics.Spawns.Inc()
	err := a.start(&p.cfg, told.Tenant)
	if err == nil {
		ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Agent.InitTimeout)
		initStart := time.Now()
		err = a.initialize(ctx, &p.cfg, told)
		cancel()
		if err != nil {
			a.initFailed.Store(true)
			a.Stop()
		} else {
			p.cfg.Metrics.InitializeDuration.Observe(time.Since(initStart).Seconds())
			p.cfg.Metrics.SpawnDuration.Observe(time.Since(start).Seconds())
		}
	} else {
		p.cfg.Metrics.Exits.WithLabelValues("init_failed").Inc()
	}
	p.started(a, start, err)
}

// started records how a start went: a failure backs the pool off; a
// success is cached and the process becomes ready.
func (p *Pool) started(a *Process, start time.Time, err error) {
	p.mu.Lock()
	neverRan := false
	if err != nil {
		p.fails++
		p.lastErr = err
		backoff := 100 * time.Millisecond << min(p.fails-1, 9) // up to ~51 s
		p.retryAt = time.Now().Add(min(backoff, 30*time.Second))
		a.mu.Lock()
		neverRan = a.cmd == nil
		a.mu.Unlock()
		if neverRan { // nothing will reap it
			a.state.Store(uint32(Dead))
			close(a.exited)
			p.removeLocked(a)
		}
	} else {
		p.fails, p.lastErr, p.everOK = 0, nil, true
		p.retryAt = time.Time{}
		k := a.prof.Kind()
		k.Tenant = ""
		p.inits[k] = a.init
		p.newestInit = a.init
		a.readyAt = time.Now()
		a.state.CompareAndSwap(uint32(Starting), uint32(Ready))
	}
	p.changedLocked()
	p.mu.Unlock()
	if neverRan {
		a.handler.Exited(err) // as waitLoop would have
	}
	if err != nil {
		p.log.Error("agent failed to start", "process", a.id, "err", err)
		return
	}
	a.Log().Info("agent ready", "protocol_version", a.init.Version, "took", time.Since(start).Round(time.Millisecond))
}

// Retire marks a as taking no new sessions, for reason ("sessions",
// "age" or "agent_env"). The maintainer stops it once it is unused (a
// starting process once it is ready) and warms a replacement.
func (a *Process) Retire(reason string) {
	if st := a.State(); st != Ready && st != Starting || !a.retiring.CompareAndSwap(false, true) {
		return
	}
	a.pool.mu.Lock()
	served := a.served
	a.pool.changedLocked()
	a.pool.mu.Unlock()
	a.pool.cfg.Metrics.Recycled.WithLabelValues(reason).Inc()
	a.Log().Info("agent process retiring: it takes no new sessions and stops when its last one ends",
		"reason", reason, "sessions_served", served)
}

// RetireTenant retires every process of tenant, starting or ready, for
// reason (Retire): running sessions finish on them, new ones go to fresh
// processes. It returns how many it retired.
func (p *Pool) RetireTenant(tenant, reason string) int {
	p.mu.Lock()
	var procs []*Process
	for _, a := range p.procs {
		if a.prof.Tenant == tenant && !a.Retiring() {
			procs = append(procs, a)
		}
	}
	p.mu.Unlock()
	for _, a := range procs {
		a.Retire(reason)
	}
	return len(procs)
}

// removed forgets a process that has exited.
func (p *Pool) removed(a *Process) {
	p.mu.Lock()
	p.removeLocked(a)
	p.changedLocked()
	p.mu.Unlock()
}

func (p *Pool) removeLocked(a *Process) {
	for i, x := range p.procs {
		if x == a {
			p.procs = append(p.procs[:i], p.procs[i+1:]...)
			return
		}
	}
}
