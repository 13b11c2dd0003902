package audit

import (
	"testing"
	"time"
)

// One address's flood takes its own budget only: another address's
// events are still written, and what was held back is written as a
// suppressed event with its count and remote, by the timer and on Close.
func TestThrottleBySource(t *testing.T) {
	var m Memory
	th := NewThrottle(&m, "admin.denied", ThrottleConfig{PerSource: 0.001, Burst: 2, FlushAfter: 20 * time.Millisecond})
	for range 100 {
		th.Record(Event{Fields: []Field{F("remote", "10.0.0.1:1")}}, "10.0.0.1", "10.0.0.1:1")
	}
	th.Record(Event{Fields: []Field{F("remote", "10.0.0.2:1")}}, "10.0.0.2", "10.0.0.2:1")
	if n := len(m.Events("admin.denied")); n != 3 {
		t.Fatalf("%d admin.denied written, want 3 (the flood's burst of 2, and the other address's)", n)
	}
	waitFor(t, func() bool { return len(m.Events("admin.denied.suppressed")) == 1 })
	s := m.Events("admin.denied.suppressed")[0]
	if s.Fields[0] != F("count", int64(98)) || s.Fields[1] != F("remote", "10.0.0.1:1") {
		t.Errorf("suppressed: %v; want count 98 from 10.0.0.1:1", s.Fields)
	}
	th.Record(Event{}, "10.0.0.1", "10.0.0.1:2") // held, flushed by Close
	th.Close()
	if evs := m.Events("admin.denied.suppressed"); len(evs) != 2 || evs[1].Fields[0] != F("count", int64(1)) {
		t.Errorf("after Close: %v", evs)
	}
	th.Record(Event{}, "10.0.0.3", "10.0.0.3:1")
	th.Close()
	if n := len(m.Events()); n != 5 {
		t.Errorf("%d events after a second Close and a Record after Close, want 5", n)
	}
}

// Sources are bounded: past Sources, idle ones are let go, and new ones
// share one budget while none is idle.
func TestThrottleBounded(t *testing.T) {
	var m Memory
	th := NewThrottle(&m, "auth.failed", ThrottleConfig{PerSource: 0.001, Burst: 1, Sources: 2, Total: 1e6, TotalBurst: 1e6})
	defer th.Close()
	for _, src := range []string{"a", "b", "c", "d"} {
		th.Record(Event{}, src, src)
		th.Record(Event{}, src, src)
	}
	th.mu.Lock()
	n, over := len(th.srcs), th.srcs[overflow]
	th.mu.Unlock()
	if n != 3 || over == nil || over.held != 3 || over.remote != "(many)" {
		t.Fatalf("%d sources tracked (overflow %+v); want a, b and the overflow holding 3", n, over)
	}
	if got := len(m.Events("auth.failed")); got != 3 {
		t.Errorf("%d written, want 3 (a, b, and the overflow's burst)", got)
	}
}
