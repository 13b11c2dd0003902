package audit

import (
	"slices"
	"sync"
)

// Memory is a Recorder that keeps the events in memory, in order: for
// tests, and for a program that embeds the gateway and ships its events
// itself. It grows without bound.
type Memory struct {
	mu  sync.Mutex
	evs []Event
}

// Record implements Recorder.
func (m *Memory) Record(ev Event) {
	m.mu.Lock()
	m.evs = append(m.evs, ev)
	m.mu.Unlock()
}

// Events returns the events recorded so far of the given kinds (every
// event with none), in order.
func (m *Memory) Events(kinds ...string) []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Event
	for _, ev := range m.evs {
		if len(kinds) == 0 || slices.Contains(kinds, ev.Event) {
			out = append(out, ev)
		}
	}
	return out
}
