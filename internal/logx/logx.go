// Package logx bounds what one source can put into the logs: Truncate
// shortens a string, a Limiter caps how often something is logged.
package logx

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Truncate shortens s to at most n bytes, at a character's start, marking
// the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Quote is s truncated to n bytes (Truncate), as a Go string literal: what
// an error may quote of a client's or an agent's text.
func Quote(s string, n int) string { return strconv.Quote(Truncate(s, n)) }

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
