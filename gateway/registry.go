package gateway

import (
	"context"
	"sync"
	"sync/atomic"
)

// linkRegistry is every open client connection, either transport: what a
// drain closes and waits for, the Streamable HTTP connections by ID, and
// the connections each tenant holds (max_connections).
type linkRegistry struct {
	refused atomic.Bool    // the listener is closing: no link registers
	wg      sync.WaitGroup // one per registered link, until its serve returns

	mu        sync.Mutex
	links     map[*link]struct{}
	httpConns map[string]*httpConn // Streamable HTTP connections by ID
	changed   chan struct{}        // closed (and replaced) when a link leaves
	tenants   map[string]int       // open connections per tenant, counted by takeSlot
}

func newLinkRegistry() *linkRegistry {
	return &linkRegistry{links: map[*link]struct{}{}, httpConns: map[string]*httpConn{}, changed: make(chan struct{}),
		tenants: map[string]int{}}
}

// refuse makes every later register fail (a shutdown).
func (r *linkRegistry) refuse() { r.refused.Store(true) }

// refusing reports whether the gateway takes no new connection.
func (r *linkRegistry) refusing() bool { return r.refused.Load() }

// takeSlot counts a connection of tenant, unless it has limit (0: no
// limit) already.
func (r *linkRegistry) takeSlot(tenant string, limit int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if limit > 0 && r.tenants[tenant] >= limit {
		return false
	}
	r.tenants[tenant]++
	return true
}

// giveSlot gives back a connection takeSlot counted.
func (r *linkRegistry) giveSlot(tenant string) {
	r.mu.Lock()
	r.tenants[tenant]--
	r.mu.Unlock()
}

// register adds l, and counts it in the wait group until its serve returns
// (serveDone); false once the registry refuses.
func (r *linkRegistry) register(l *link) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused.Load() {
		return false
	}
	r.links[l] = struct{}{}
	if h, ok := l.t.(*httpConn); ok {
		r.httpConns[l.id] = h
	}
	r.wg.Add(1)
	return true
}

// unregister removes l and wakes those waiting for the registry to change.
func (r *linkRegistry) unregister(l *link) {
	r.mu.Lock()
	delete(r.links, l)
	if h, ok := r.httpConns[l.id]; ok && &h.link == l {
		delete(r.httpConns, l.id)
	}
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// serveDone ends the count register took: l's serve has returned.
func (r *linkRegistry) serveDone() { r.wg.Done() }

// httpConn is the registered Streamable HTTP connection id (nil: none).
func (r *linkRegistry) httpConn(id string) *httpConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.httpConns[id]
}

// linksOf returns the registered links of agent ("" = all) and a channel
// closed when the registry next changes.
func (r *linkRegistry) linksOf(agent string) ([]*link, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*link
	for l := range r.links {
		if agent == "" || l.agent == agent {
			out = append(out, l)
		}
	}
	return out, r.changed
}

// waitLinks waits until no link of agent ("" = all) is left, or ctx ends.
func (r *linkRegistry) waitLinks(ctx context.Context, agent string) {
	for {
		left, changed := r.linksOf(agent)
		if len(left) == 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// waitServed waits until every registered link's serve has returned, or
// ctx ends.
func (r *linkRegistry) waitServed(ctx context.Context) {
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }() // ends when the last serve returns
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// queued sums the send queues of every open connection.
func (r *linkRegistry) queued() float64 {
	links, _ := r.linksOf("")
	n := 0
	for _, l := range links {
		l.mu.Lock()
		n += l.queued
		l.mu.Unlock()
	}
	return float64(n)
}
