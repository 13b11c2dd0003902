package audit

import (
	"sync/atomic"

	"golang.org/x/time/rate"
)

// Limiter bounds the events one source can make the trail write (a flood
// of refused requests must not fill the disk): at most perSecond a second,
// in bursts of burst. It counts the events it holds back; the next one it
// lets through says how many, in a "suppressed" field.
type Limiter struct {
	lim  *rate.Limiter
	held atomic.Int64
}

// NewLimiter is a Limiter of perSecond events a second, bursts of burst.
func NewLimiter(perSecond float64, burst int) *Limiter {
	return &Limiter{lim: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// Let reports whether an event with fields may be written now, and
// returns its fields with "suppressed" added when events were held back
// since the last one let through.
func (l *Limiter) Let(fields []Field) ([]Field, bool) {
	if !l.lim.Allow() {
		l.held.Add(1)
		return nil, false
	}
	if n := l.held.Swap(0); n > 0 {
		fields = append(fields, F("suppressed", n))
	}
	return fields, true
}
