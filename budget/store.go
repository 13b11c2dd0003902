// Package budget keeps each tenant's spend against its caps: a ledger of
// the tokens and cost the agents report, per tenant and period, in a store
// that may be the process's memory, a file that survives a restart, or
// Redis shared by replicas. It watches sessions (an observe.Observer) and
// decides before each prompt (an observe.PromptDecider).
package budget

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/acpgate/acpgate/proxy/usage"
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

// addCost adds inc (> 0) of currency cur to s.
func (s *Spent) addCost(cur string, inc float64) {
	if inc <= 0 {
		return
	}
	if s.Cost == nil {
		s.Cost = map[string]float64{}
	}
	s.Cost[cur] += inc
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

// Mark is one load's live reports of an agent session's cumulative cost
// in a currency (observe.CostReported), From to Total, in order: what a
// store counts against the value it keeps for the session (counted).
type Mark struct {
	Session  string // the agent session's observe.Session.Key
	Currency string
	// First: the mark starts with its load's first live report (the
	// session was loaded or resumed) of an agent whose total carries on
	// across loads (usage.cost_total: per_session) and whose replay
	// carried no total, whose total is From: it counts against the kept
	// value. Else From is the load's report before the mark's first: 0
	// for a session made on this gateway process and its first report;
	// for a load's first report, the load's baseline (the total its
	// replay carried, or 0: package usage, Budgeted).
	First bool
	From  float64
	Total float64 // the last report's total
}

// counted is the rule every store applies to a mark, in the same atomic
// step as the addition; kept is the session's kept value (known false:
// none), the session's last counted total. keep says the kept value
// becomes the mark's Total.
//
//   - A First mark (a load's first report of a per-session total with no
//     replayed total) below the kept value: the agent's total started
//     again from zero, so it counts in full. At or above it: its increase
//     over it (the same total reported by two loads counts once). With no
//     kept value (a session last seen before kept values, or idle past
//     keepPeriods): in full, the safe side. A load's first report of a
//     per-load total (the default) is not First: it counts over its
//     load's baseline, as a later report over its previous one.
//   - A later report of the load counts its increase over the load's
//     previous report, whatever another load did to the kept value
//     meanwhile: two processes running one session each spend (counting
//     over the kept value would count this load's earlier reports again
//     when another load's restarted total lowered it, or nothing of this
//     load's spend when another load raised it).
//   - A decrease within a load (Total below From) counts nothing and
//     changes nothing; the meter sends none, this is the store's guard.
//   - More than usage.MaxCostIncrease at once counts nothing, and moves
//     the kept value (as the meter does).
func counted(kept float64, known bool, m Mark) (inc float64, keep bool) {
	switch {
	case m.Total < m.From:
		return 0, false
	case !m.First:
		inc = m.Total - m.From
	case known && m.From >= kept:
		inc = m.Total - kept
	default:
		inc = m.Total
	}
	if inc > usage.MaxCostIncrease {
		inc = 0
	}
	return inc, true
}

// keptKey names a session's kept value of a currency in a store: tenant,
// session key and currency, NUL-separated (tenant names and session keys
// hold no NUL; the currency, last, may hold anything).
func keptKey(tenant string, m Mark) string {
	return tenant + "\x00" + m.Session + "\x00" + m.Currency
}

// Store keeps ledgers, and the last counted cumulative cost of each agent
// session that reported one (its kept value, per currency, for
// keepPeriods after its last report, whatever the period). Each Add is
// atomic: two replicas adding to one key at once both count, and two
// loads' first reports of one total at once count it once.
type Store interface {
	// Name says where the ledger is, for errors and logs (never a
	// password).
	Name() string
	// Get is what key holds (zero: nothing yet).
	Get(ctx context.Context, key Key) (Spent, error)
	// Add adds s to key, and what each mark counts (counted, in order,
	// the session being key.Tenant's), and returns what key holds then. next is when the key's period ends: a store may
	// forget the key some time after.
	Add(ctx context.Context, key Key, s Spent, marks []Mark, next time.Time) (Spent, error)
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
	mu     sync.Mutex
	m      map[Key]Spent
	kept   map[string]keptValue // by keptKey
	pruned time.Time            // when kept values were last pruned
}

// keptValue is a session's kept value of a currency, and when it was
// last reported.
type keptValue struct {
	Total float64   `json:"total"`
	Seen  time.Time `json:"seen"`
}

// NewMemory is an empty memory store.
func NewMemory() *Memory { return &Memory{m: map[Key]Spent{}, kept: map[string]keptValue{}} }

func (*Memory) Name() string { return "memory" }

func (s *Memory) Get(_ context.Context, key Key) (Spent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key].clone(), nil
}

func (s *Memory) Add(_ context.Context, key Key, add Spent, marks []Mark, _ time.Time) (Spent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.m[key].clone()
	cur.add(add)
	now := time.Now()
	for _, mk := range marks {
		k := keptKey(key.Tenant, mk)
		was, known := s.kept[k]
		inc, keep := counted(was.Total, known, mk)
		if keep {
			s.kept[k] = keptValue{Total: mk.Total, Seen: now}
		}
		cur.addCost(mk.Currency, inc)
	}
	if now.Sub(s.pruned) > pruneEvery {
		s.pruned = now
		for k, v := range s.kept {
			if now.Sub(v.Seen) > keepPeriods {
				delete(s.kept, k)
			}
		}
	}
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
