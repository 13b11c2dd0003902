package inflight

import (
	"fmt"
	"sync"
)

// Gate holds a session's client messages, in order, while something the
// gateway must know before it can decide on them is not known yet: under
// a model or mode allow-list, the session's current model and mode until
// the answer that established the session (and any switch the gateway
// makes) is done. Close opens a wait, Open ends one; while any wait is open,
// or held messages remain to be handled, Hold keeps what it is given.
// The zero value is idle. Its lock is a leaf.
type Gate[T any] struct {
	mu       sync.Mutex
	waits    int  // Close calls not yet Opened
	draining bool // a caller of Open or Next is handling the held messages
	held     []gated[T]
	bytes    int
}

type gated[T any] struct {
	v T
	n int
}

// Bounds of what one session's gate holds, in number and in bytes.
const (
	MaxGated      = 64
	MaxGatedBytes = 32 << 20
)

// Why a message cannot be held.
var (
	ErrGateFull  = fmt.Errorf("%d messages already wait for this session to be established", MaxGated)
	ErrGateBytes = fmt.Errorf("the messages waiting for this session to be established would pass %d MiB", MaxGatedBytes>>20)
)

func (g *Gate[T]) activeLocked() bool { return g.waits > 0 || g.draining || len(g.held) > 0 }

// Close opens a wait: messages are held until it ends (Open). first: the
// gate was idle.
func (g *Gate[T]) Close() (first bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	first = !g.activeLocked()
	g.waits++
	return first
}

// Active reports whether the gate holds what it is given now (not idle).
func (g *Gate[T]) Active() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.activeLocked()
}

// Hold keeps v (n bytes) unless the gate is idle (held false: handle it
// now). A gate with no room refuses it (err) and keeps nothing.
func (g *Gate[T]) Hold(v T, n int) (held bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !g.activeLocked():
		return false, nil
	case len(g.held) >= MaxGated:
		return false, ErrGateFull
	case g.bytes+n > MaxGatedBytes:
		return false, ErrGateBytes
	}
	g.held = append(g.held, gated[T]{v, n})
	g.bytes += n
	return true, nil
}

// Open ends a wait (one Close opened; more Opens do nothing). drain: it
// was the last, and the caller now handles the held messages in order
// (Next until it says stop); idle: the gate has nothing more to hold.
func (g *Gate[T]) Open() (drain, idle bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waits == 0 {
		return false, false
	}
	g.waits--
	switch {
	case g.waits > 0 || g.draining:
		return false, false
	case len(g.held) == 0:
		return false, true
	}
	g.draining = true
	return true, false
}

// Next is the oldest held message, taken, for the drainer to handle. ok
// false: stop, because a wait opened again (its Open drains the rest) or
// none is left (idle: the gate has nothing more to hold).
func (g *Gate[T]) Next() (v T, n int, ok, idle bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.waits > 0:
		g.draining = false
		return v, 0, false, false
	case len(g.held) == 0:
		g.draining = false
		return v, 0, false, true
	}
	e := g.held[0]
	clear(g.held[:1])
	g.held = g.held[1:]
	g.bytes -= e.n
	return e.v, e.n, true, false
}

// Drop takes every held message (the session has ended) with its size.
// idle: the gate has nothing more to hold.
func (g *Gate[T]) Drop() (vs []T, ns []int, idle bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	had := g.activeLocked()
	for _, e := range g.held {
		vs, ns = append(vs, e.v), append(ns, e.n)
	}
	g.held, g.bytes = nil, 0
	return vs, ns, had && !g.activeLocked()
}
