package pool

import (
	"context"
	"fmt"
	"time"
)

// maintain keeps MinIdle warm processes of the base profile (any client
// can use one), stops idle processes beyond that after IdleTimeout, retires
// processes past their age, stops retiring processes once unused, and ticks
// each process's handler (which expires requests nobody answered in time).
// It runs once a second and whenever capacity changes.
func (p *Pool) maintain() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.mu.Lock()
		now := time.Now()
		if !p.closed {
			p.maintainLocked(now)
		}
		procs := append([]*Process(nil), p.procs...)
		handlers := make([]Handler, len(procs)) // nil for a process not started yet
		for i, a := range procs {
			handlers[i] = a.handler
		}
		p.mu.Unlock()
		for i, a := range procs {
			if handlers[i] != nil {
				handlers[i].Tick(now)
			}
			if p.cfg.RecycleAfter > 0 && a.age() >= p.cfg.RecycleAfter {
				a.Retire("age")
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

// maintainLocked does one round of the maintainer's work (p.mu held).
func (p *Pool) maintainLocked(now time.Time) {
	idle := 0
	var reap []*Process
	for _, a := range p.procs {
		isIdle := idleLocked(a)
		if isIdle && p.isBaseLocked(a) {
			idle++
		}
		if a.Retiring() && unusedLocked(a) {
			a.Log().Info("stopping a retired agent process: its last session has ended")
			a.Stop()
		}
		// A process is quiet from the first round that finds it ready with
		// nothing attached; anything attached resets it.
		switch quiet := isIdle && a.State() == Ready && a.homes == 0; {
		case !quiet:
			a.idleAt = time.Time{}
		case a.idleAt.IsZero():
			a.idleAt = now
		case now.Sub(a.idleAt) > p.cfg.IdleTimeout:
			reap = append(reap, a)
		}
	}
	idle = p.warmLocked(now, idle)
	for _, a := range reap {
		isBase := p.isBaseLocked(a)
		if isBase && idle <= p.cfg.MinIdle {
			continue
		}
		if isBase {
			idle--
		}
		a.Log().Info("stopping idle agent", "idle_for", now.Sub(a.idleAt).Round(time.Second))
		a.Stop()
	}
}

// warmLocked starts warm processes up to MinIdle and returns the idle count
// (p.mu held). Warming waits while a client waits for capacity: the
// client's process comes first. A pool without min_idle that has never had
// a process start still starts one, so that readiness tells whether the
// agent can start at all; it is then stopped when idle like any other.
func (p *Pool) warmLocked(now time.Time, idle int) int {
	want := p.cfg.MinIdle
	if want == 0 && !p.everOK && len(p.procs) == 0 {
		want = 1
	}
	base := p.baseLocked().Kind()
	for ; idle < want && len(p.procs) < p.cfg.MaxProcesses && !now.Before(p.retryAt) && p.waiters == 0; idle++ {
		if _, err := p.spawnLocked(base); err != nil {
			break
		}
	}
	return idle
}

// age is how long the process has been ready (0 unless ready).
func (a *Process) age() time.Duration {
	if a.State() != Ready {
		return 0
	}
	return time.Since(a.readyAt)
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
		if a.State() == Ready {
			return true
		}
	}
	return p.everOK && p.fails == 0
}

// EverReady reports whether a process of the pool has ever been ready.
func (p *Pool) EverReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.everOK
}

// LastError is the newest start failure since the last success (nil: none).
func (p *Pool) LastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Stats is a snapshot of the pool.
type Stats struct {
	Processes, Ready, Sessions int
	Reserved                   int // session slots held for requests in flight
	Requests                   int // client requests in flight
	// ByState counts the processes in each state; PerProcess lists each
	// process's sessions.
	ByState    [Dead + 1]int
	PerProcess []int
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s Stats
	for _, a := range p.procs {
		st := a.State()
		s.Processes++
		s.ByState[st]++
		if st == Ready {
			s.Ready++
		}
		s.Sessions += a.sessions
		s.Reserved += a.reserved
		s.Requests += int(a.requests.Load())
		s.PerProcess = append(s.PerProcess, a.sessions)
	}
	return s
}

// Close stops every agent process (SIGTERM to its group, SIGKILL after the
// grace period) and waits until all are reaped or ctx ends.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	procs := append([]*Process(nil), p.procs...)
	p.changedLocked() // waiters see the pool closed
	p.mu.Unlock()
	p.stop()
	for _, a := range procs {
		a.Stop()
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
