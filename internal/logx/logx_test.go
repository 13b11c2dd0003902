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
	if !l.Allow() || !l.Allow() || l.Allow() {
		t.Error("a limiter of 2 an hour did not allow exactly 2")
	}
}
