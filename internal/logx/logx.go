// Package logx bounds what one source can put into the logs: Truncate
// shortens a string, a Limiter caps how often something is logged.
package logx

import "time"

// Truncate shortens s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Limiter allows n events per period. It is not safe for concurrent use.
type Limiter struct {
	n      int
	period time.Duration
	start  time.Time
	count  int
}

// NewLimiter allows n events per period.
func NewLimiter(n int, period time.Duration) *Limiter {
	return &Limiter{n: n, period: period}
}

// Allow reports whether one more event may be logged now.
func (l *Limiter) Allow() bool {
	now := time.Now()
	if now.Sub(l.start) > l.period {
		l.start, l.count = now, 0
	}
	l.count++
	return l.count <= l.n
}
