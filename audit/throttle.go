package audit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ThrottleConfig sizes a Throttle; zero fields take the defaults.
type ThrottleConfig struct {
	PerSource  float64       // events a second one source may make written (0: 10)
	Burst      int           // a source's burst (0: 50)
	Total      float64       // events a second of all sources together (0: 100)
	TotalBurst int           // their burst (0: 500)
	Sources    int           // sources tracked at once (0: 1024); past it new sources share one budget
	FlushAfter time.Duration // a held-back count is written at most this long after its first event (0: 10s)
}

// Throttle bounds the events of one kind that anyone can make the trail
// write without a credential (auth.failed, admin.denied), by source (the
// remote address): a flood from one address neither fills the disk nor
// crowds another address's events, nor another kind's (each kind has its
// own Throttle), out. What it holds back is not lost silently: a
// "<kind>.suppressed" event per source (count, remote) follows within
// FlushAfter, and on Close.
//
// A Throttle is safe for concurrent use; its flush timer ends with Close.
type Throttle struct {
	rec   Recorder
	kind  string
	cfg   ThrottleConfig
	total *rate.Limiter

	mu        sync.Mutex
	srcs      map[string]*source // bounded by cfg.Sources, plus the overflow ""
	timer     *time.Timer        // the pending flush (nil: none)
	closed    bool
	lastSweep time.Time
	flushing  sync.WaitGroup // a timer's flush running
}

// source is one address's budget and what it held back.
type source struct {
	lim    *rate.Limiter
	remote string // as the first held event gave it
	held   int64
	seen   time.Time
	shared bool // the overflow
}

// overflow is the source every address shares once Sources are tracked.
const overflow = ""

// NewThrottle throttles events of kind into rec.
func NewThrottle(rec Recorder, kind string, cfg ThrottleConfig) *Throttle {
	if cfg.PerSource <= 0 {
		cfg.PerSource = 10
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 50
	}
	if cfg.Total <= 0 {
		cfg.Total = 100
	}
	if cfg.TotalBurst <= 0 {
		cfg.TotalBurst = 500
	}
	if cfg.Sources <= 0 {
		cfg.Sources = 1024
	}
	if cfg.FlushAfter <= 0 {
		cfg.FlushAfter = 10 * time.Second
	}
	return &Throttle{rec: rec, kind: kind, cfg: cfg, total: rate.NewLimiter(rate.Limit(cfg.Total), cfg.TotalBurst),
		srcs: map[string]*source{}}
}

// Record writes ev (of the Throttle's kind) from src (its remote host;
// remote: as the event names it) if its source's and the kind's budgets
// allow; otherwise it counts it for the source's next suppressed event.
func (t *Throttle) Record(ev Event, src, remote string) {
	ev.Event = t.kind
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	now := time.Now()
	s := t.source(src, now)
	s.seen = now
	if s.lim.AllowN(now, 1) && t.total.AllowN(now, 1) {
		t.mu.Unlock()
		t.rec.Record(ev)
		return
	}
	if s.held == 0 {
		s.remote = remote
		if s.shared {
			s.remote = "(many)"
		}
	}
	s.held++
	if t.timer == nil {
		t.flushing.Add(1)
		t.timer = time.AfterFunc(t.cfg.FlushAfter, func() {
			defer t.flushing.Done()
			t.flush()
		})
	}
	t.mu.Unlock()
}

// source is src's budget, made if new (t.mu held): with Sources tracked
// already, idle ones (nothing held, budget full again) are let go, at most
// once a second; if none is, src shares the overflow budget.
func (t *Throttle) source(src string, now time.Time) *source {
	if s := t.srcs[src]; s != nil {
		return s
	}
	if len(t.srcs) >= t.cfg.Sources && now.Sub(t.lastSweep) >= time.Second {
		t.lastSweep = now
		refill := time.Duration(float64(t.cfg.Burst) / t.cfg.PerSource * float64(time.Second))
		for k, s := range t.srcs {
			if k != overflow && s.held == 0 && now.Sub(s.seen) >= refill {
				delete(t.srcs, k)
			}
		}
	}
	if len(t.srcs) >= t.cfg.Sources {
		src = overflow
		if s := t.srcs[src]; s != nil {
			return s
		}
	}
	s := &source{lim: rate.NewLimiter(rate.Limit(t.cfg.PerSource), t.cfg.Burst), shared: src == overflow}
	t.srcs[src] = s
	return s
}

// flush writes a suppressed event for each source that held events back.
func (t *Throttle) flush() {
	t.mu.Lock()
	t.timer = nil
	var evs []Event
	for _, s := range t.srcs {
		if s.held > 0 {
			evs = append(evs, Event{Event: t.kind + ".suppressed", Fields: []Field{F("count", s.held), F("remote", s.remote)}})
			s.held = 0
		}
	}
	t.mu.Unlock()
	for _, ev := range evs {
		t.rec.Record(ev)
	}
}

// Close writes what is held back now and stops the Throttle: it records
// nothing after. It waits for a flush the timer started.
func (t *Throttle) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	if t.timer != nil && t.timer.Stop() {
		t.flushing.Done() // it will not run
	}
	t.mu.Unlock()
	t.flushing.Wait()
	t.flush()
}
