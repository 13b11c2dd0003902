package main

import (
	"fmt"
	"slices"
	"time"
)

// dist summarizes latencies.
type dist struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_us"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
	Mean float64 `json:"mean_us"`
}

// summarize sorts d in place and returns its percentiles (nearest rank).
func summarize(d []time.Duration) dist {
	if len(d) == 0 {
		return dist{}
	}
	slices.Sort(d)
	us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1e3 }
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(d))+0.999999) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return dist{
		N: len(d), Min: us(d[0]), P50: us(rank(0.50)), P90: us(rank(0.90)), P99: us(rank(0.99)),
		P999: us(rank(0.999)), Max: us(d[len(d)-1]), Mean: us(sum / time.Duration(len(d))),
	}
}

// fmtUS prints microseconds readably.
func fmtUS(us float64) string {
	switch {
	case us >= 10_000:
		return fmt.Sprintf("%.1f ms", us/1e3)
	case us >= 1000:
		return fmt.Sprintf("%.2f ms", us/1e3)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}

func fmtRatio(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", x)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
