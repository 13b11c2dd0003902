package budget

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/acpgate/acpgate/internal/redistest"
)

// BenchmarkPromptCheck is what the budget check adds to a prompt's setup,
// by store: one Prompt call for a budgeted tenant with spend on its way
// (the decider the relay asks before a prompt goes to the agent). It
// reports p50 and p99 besides the mean:
//
//	go test -run '^$' -bench PromptCheck -benchtime 20000x ./budget/
//
// (Redis: Debian's redis-server on loopback, started by the benchmark.)
func BenchmarkPromptCheck(b *testing.B) {
	redis := redistest.Start(b)
	for _, tc := range []struct {
		name string
		open func(b *testing.B) Store
	}{
		{"memory", func(*testing.B) Store { return NewMemory() }},
		{"file", func(b *testing.B) Store {
			s, err := OpenFile(filepath.Join(b.TempDir(), "ledger.db"))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"redis", func(b *testing.B) Store {
			s, err := OpenStore(redis.URL(2))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := New(Config{Store: tc.open(b), Limits: map[string]Limits{"acme": {Period: Day, Tokens: 1 << 40, Cost: map[string]float64{"USD": 1e9}}}})
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = l.Close(ctx)
			}()
			c := cost("acme", "s", "USD", 1)
			c.Session.Key, c.Total, c.First, c.From = "k", 1, true, 1 // a load's first report: counted against the kept value
			l.Observe(c)
			l.Observe(tokens("acme", "s", 10, 10))
			e := prompt("acme")
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if r := l.Prompt(e); r != nil {
					b.Fatalf("refused: %+v", r)
				}
				times = append(times, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(times)
			if len(times) > 0 {
				b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}
