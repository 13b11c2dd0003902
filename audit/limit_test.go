package audit

import (
	"testing"

	"golang.org/x/time/rate"
)

// Past its burst the limiter holds events back, and the next one it lets
// through says how many it held.
func TestLimiterCountsWhatItHolds(t *testing.T) {
	l := NewLimiter(0.001, 2) // refills far slower than the test runs
	for i := range 2 {
		if f, ok := l.Let([]Field{F("n", i)}); !ok || len(f) != 1 {
			t.Fatalf("event %d within the burst: %v %v", i, f, ok)
		}
	}
	for i := range 3 {
		if _, ok := l.Let(nil); ok {
			t.Fatalf("event %d past the burst let through", i)
		}
	}
	if n := l.held.Load(); n != 3 {
		t.Fatalf("held %d, want 3", n)
	}
	l.lim = rate.NewLimiter(rate.Inf, 1) // room again
	f, ok := l.Let([]Field{F("n", 9)})
	if !ok || len(f) != 2 || f[1] != F("suppressed", int64(3)) {
		t.Fatalf("the next event: %v %v, want n and suppressed 3", f, ok)
	}
	if n := l.held.Load(); n != 0 {
		t.Errorf("held %d after it was said, want 0", n)
	}
}
