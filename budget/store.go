// Package budget keeps each tenant's spend against its caps: a ledger of
// the tokens and cost the agents report, per tenant and period, in a store
// that may be the process's memory, a file that survives a restart, or
// Redis shared by replicas. It watches sessions (an observe.Observer) and
// decides before each prompt (an observe.Decider).
package budget

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Period is how long a budget runs before it starts again, in UTC.
type Period string

// Periods.
const (
	Day   Period = "day"
	Month Period = "month"
)

// Bounds is the start of the period holding t, and the start of the next.
func (p Period) Bounds(t time.Time) (start, next time.Time) {
	t = t.UTC()
	if p == Month {
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 0, 1)
}

// Valid reports whether p is a known period.
func (p Period) Valid() bool { return p == Day || p == Month }

// Key names one tenant's ledger for one period.
type Key struct {
	Tenant string
	Period Period
	Start  time.Time // the period's start (Period.Bounds)
}

// String is the key as stores name it: tenant/period/start date.
func (k Key) String() string {
	return k.Tenant + "/" + string(k.Period) + "/" + k.Start.UTC().Format(time.DateOnly)
}

// Spent is what a tenant spent in a period, or what is added to it.
type Spent struct {
	Tokens int64              // input + output tokens
	Cost   map[string]float64 // by currency
}

// add adds o to s.
func (s *Spent) add(o Spent) {
	s.Tokens += o.Tokens
	for cur, v := range o.Cost {
		if s.Cost == nil {
			s.Cost = map[string]float64{}
		}
		s.Cost[cur] += v
	}
}

// zero reports whether s adds nothing.
func (s Spent) zero() bool {
	if s.Tokens != 0 {
		return false
	}
	for _, v := range s.Cost {
		if v != 0 {
			return false
		}
	}
	return true
}

func (s Spent) clone() Spent {
	return Spent{Tokens: s.Tokens, Cost: maps.Clone(s.Cost)}
}

// Store keeps ledgers. Each Add is atomic: two replicas adding to one key
// at once both count.
type Store interface {
	// Name says where the ledger is, for errors and logs (never a
	// password).
	Name() string
	// Get is what key holds (zero: nothing yet).
	Get(ctx context.Context, key Key) (Spent, error)
	// Add adds s to key and returns what it holds then. next is when the
	// key's period ends: a store may forget the key some time after.
	Add(ctx context.Context, key Key, s Spent, next time.Time) (Spent, error)
	// Reset forgets what key holds.
	Reset(ctx context.Context, key Key) error
	Close() error
}

// OpenStore opens the store spec names: "memory" (or ""), "file:PATH" or
// "redis://[user:password@]host:port[/db]".
func OpenStore(spec string) (Store, error) {
	if err := CheckStore(spec); err != nil {
		return nil, err
	}
	switch {
	case spec == "" || spec == "memory":
		return NewMemory(), nil
	case strings.HasPrefix(spec, "file:"):
		return OpenFile(strings.TrimPrefix(spec, "file:"))
	}
	return OpenRedis(spec)
}

// CheckStore says what is wrong with a store spec (OpenStore's), without
// opening anything; its error never shows a password.
func CheckStore(spec string) error {
	switch {
	case spec == "" || spec == "memory":
		return nil
	case strings.HasPrefix(spec, "file:"):
		if strings.TrimPrefix(spec, "file:") == "" {
			return fmt.Errorf("budgets.store %q: file: needs a path", spec)
		}
		return nil
	case strings.HasPrefix(spec, "redis://") || strings.HasPrefix(spec, "rediss://"):
		_, err := redisOptions(spec)
		return err
	}
	return fmt.Errorf("budgets.store %q: want memory, file:PATH or redis://host:port/db", redactURL(spec))
}

// redactURL is spec without a password, even one url.Parse refuses.
func redactURL(spec string) string {
	if u, err := url.Parse(spec); err == nil {
		if u.User == nil {
			return spec
		}
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(spec, "://")
	if at := strings.LastIndex(rest, "@"); ok && at >= 0 {
		return scheme + "://xxxxx" + rest[at:]
	}
	return spec
}

// Memory is a store in the process: a restart forgets it.
type Memory struct {
	mu sync.Mutex
	m  map[Key]Spent
}

// NewMemory is an empty memory store.
func NewMemory() *Memory { return &Memory{m: map[Key]Spent{}} }

func (*Memory) Name() string { return "memory" }

func (s *Memory) Get(_ context.Context, key Key) (Spent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key].clone(), nil
}

func (s *Memory) Add(_ context.Context, key Key, add Spent, _ time.Time) (Spent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.m[key].clone()
	cur.add(add)
	s.m[key] = cur
	// Past periods are of no more use: one key per tenant stays.
	for k := range s.m {
		if k.Tenant == key.Tenant && k.Start.Before(key.Start) {
			delete(s.m, k)
		}
	}
	return cur.clone(), nil
}

func (s *Memory) Reset(_ context.Context, key Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}

func (*Memory) Close() error { return nil }
