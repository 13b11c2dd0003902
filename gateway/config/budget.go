package config

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/budget"
	"github.com/acpgate/acpgate/proxy/usage"
)

// Budgets says where the tenants' budget ledger is kept (a restart is
// needed to change it; the tenants' limits reload).
type Budgets struct {
	// Store is "memory" (the default: a restart forgets the ledger),
	// "file:PATH" (an embedded database that survives a restart) or
	// "redis://[user:password@]host:port[/db]" (shared by replicas).
	Store string `yaml:"store"`
	// OnStoreError is what a budgeted tenant's prompt gets while the store
	// fails: "deny" (the default: an error naming the store) or "allow"
	// (it runs; its spend is added once the store is back).
	OnStoreError string `yaml:"on_store_error"`
}

// Budget is one tenant's caps for a period.
type Budget struct {
	// Period is "day" (the default) or "month", in UTC.
	Period string `yaml:"period"`
	// Tokens caps input + output tokens a period (0: no cap).
	Tokens int64 `yaml:"tokens"`
	// Cost caps the cost the agents report, per currency (absent: no cap).
	Cost map[string]float64 `yaml:"cost"`
}

// Limits is the budget as the ledger takes it.
func (b *Budget) Limits() budget.Limits {
	p := budget.Period(b.Period)
	if p == "" {
		p = budget.Day
	}
	return budget.Limits{Period: p, Tokens: b.Tokens, Cost: maps.Clone(b.Cost)}
}

// BudgetLimits is every budgeted tenant's limits, by name.
func (c *Config) BudgetLimits() map[string]budget.Limits {
	m := map[string]budget.Limits{}
	for _, t := range c.Tenants {
		if t.Budget != nil {
			m[t.Name] = t.Budget.Limits()
		}
	}
	return m
}

// HasBudgets reports whether some tenant has a budget.
func (c *Config) HasBudgets() bool {
	for _, t := range c.Tenants {
		if b := t.Budget; b != nil && (b.Tokens > 0 || len(b.Cost) > 0) {
			return true
		}
	}
	return false
}

// validate checks the budgets section.
func (b *Budgets) validate(add addFunc) {
	if err := budget.CheckStore(b.Store); err != nil {
		// Never the password: CheckStore's text leaves it out.
		add("budgets.store", "%s", strings.TrimPrefix(err.Error(), "budgets.store "))
	}
	switch b.OnStoreError {
	case "deny", "allow":
	default:
		add("budgets.on_store_error", "%q is not deny or allow", b.OnStoreError)
	}
}

// validateBudget checks tenants[i].budget (at n, the budget's node).
func validateBudget(i int, b *Budget, at nodeAt, n *yaml.Node) {
	if b == nil {
		return
	}
	where := fmt.Sprintf("tenants[%d].budget", i)
	if b.Period != "" && !budget.Period(b.Period).Valid() {
		at(n, "%s.period: %q is not day or month", where, b.Period)
	}
	if b.Tokens < 0 {
		at(n, "%s.tokens: must not be negative (0 = no cap), is %d", where, b.Tokens)
	}
	for _, cur := range slices.Sorted(maps.Keys(b.Cost)) {
		v := b.Cost[cur]
		if usage.CurrencyLabel(cur) != cur || cur == usage.OtherCurrency {
			at(n, "%s.cost: %q is not a currency metering counts on its own (1-16 letters, digits, '_' or '-', not %q)",
				where, cur, usage.OtherCurrency)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			at(n, "%s.cost.%s: must be a positive amount (leave the currency out for no cap), is %v", where, cur, v)
		}
	}
}
