package logx

import (
	"testing"
	"time"
)

func TestTruncate(t *testing.T) {
	if got := Truncate("abcdef", 3); got != "abc…" {
		t.Errorf("Truncate = %q, want abc…", got)
	}
	if got := Truncate("abc", 3); got != "abc" {
		t.Errorf("Truncate = %q, want abc (no cut)", got)
	}
}

func TestLimiter(t *testing.T) {
	l := NewLimiter(2, time.Hour)
	allowed := 0
	for range 3 {
		if l.Allow() {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("a limiter of 2 an hour allowed %d of 3", allowed)
	}
}
