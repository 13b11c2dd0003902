package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/budget"
)

// budgetTenant is a config with one tenant acme whose budget is b (YAML
// flow mapping), and top, laid before it.
func budgetTenant(t *testing.T, top, b string) string {
	return fmt.Sprintf("%stenants:\n  - name: acme\n    tokens_sha256: [%q]\n    root: %q\n    budget: %s\n",
		top, strings.Repeat("ab", 32), t.TempDir(), b)
}

func TestBudgetsParse(t *testing.T) {
	cfg := mustParse(t, budgetTenant(t, "", "{tokens: 2000000, cost: {USD: 25, EUR: 10.5}}"))
	if cfg.Budgets.Store != "memory" || cfg.Budgets.OnStoreError != "deny" {
		t.Errorf("defaults: %+v", cfg.Budgets)
	}
	lim := cfg.BudgetLimits()["acme"]
	if lim.Period != budget.Day || lim.Tokens != 2000000 || lim.Cost["USD"] != 25 || lim.Cost["EUR"] != 10.5 || !cfg.HasBudgets() {
		t.Errorf("limits: %+v", lim)
	}
	cfg = mustParse(t, budgetTenant(t, "budgets: {store: \"redis://:pw@127.0.0.1:6379/2\", on_store_error: allow}\n",
		"{period: month, cost: {USD: 1}}"))
	if cfg.Budgets.OnStoreError != "allow" || cfg.BudgetLimits()["acme"].Period != budget.Month {
		t.Errorf("%+v %+v", cfg.Budgets, cfg.BudgetLimits())
	}
	if cfg := mustParse(t, budgetTenant(t, "budgets: {store: file:/var/lib/acpgate/ledger.db}\n", "{tokens: 0}")); cfg.HasBudgets() {
		t.Error("a budget that caps nothing counts as one")
	}
}

// check-config finds every problem of budgets and tenants' budgets, each
// at its line, and never prints a Redis password.
func TestBudgetProblems(t *testing.T) {
	for _, c := range []struct{ top, budget, want string }{
		{"", "{period: week}", `tenants[0].budget.period: "week" is not day or month`},
		{"", "{tokens: -1}", "tenants[0].budget.tokens: must not be negative"},
		{"", "{cost: {USD: -5}}", "tenants[0].budget.cost.USD: must be a positive amount"},
		{"", "{cost: {USD: 0}}", "tenants[0].budget.cost.USD: must be a positive amount"},
		{"", "{cost: {USD: .nan}}", "tenants[0].budget.cost.USD: must be a positive amount"},
		{"", `{cost: {"US$": 5}}`, `tenants[0].budget.cost: "US$" is not a currency`},
		{"", `{cost: {other: 5}}`, `tenants[0].budget.cost: "other" is not a currency`},
		{"", `{cost: {ABCDEFGHIJKLMNOPQ: 5}}`, `is not a currency`},
		{"", "{cost: {USD: lots}}", "cannot unmarshal"},
		{"", "{tokens: 5, hours: 3}", "field hours not found"},
		{"budgets: {store: sqlite:/x}\n", "{tokens: 5}", `budgets.store: "sqlite:/x": want memory, file:PATH or redis://`},
		{"budgets: {store: \"file:\"}\n", "{tokens: 5}", "file: needs a path"},
		{"budgets: {store: \"redis://u:hunter2@host:port/0\"}\n", "{tokens: 5}", "budgets.store: redis://xxxxx@host:port/0"},
		{"budgets: {store: \"redis://u:hunter2@host/x\"}\n", "{tokens: 5}", "invalid database number"},
		{"budgets: {on_store_error: maybe}\n", "{tokens: 5}", `budgets.on_store_error: "maybe" is not deny or allow`},
	} {
		data := budgetTenant(t, c.top, c.budget)
		ps := problems(t, data)
		var all []string
		for _, p := range ps {
			all = append(all, p.String())
		}
		text := strings.Join(all, "\n")
		if !strings.Contains(text, c.want) {
			t.Errorf("%s%s: problems\n%s\nwant %q", c.top, c.budget, text, c.want)
		}
		if strings.Contains(text, "hunter2") {
			t.Errorf("the password is in the problems: %s", text)
		}
		if strings.HasPrefix(c.want, "tenants[0].budget") && (ps[0].Line != strings.Count(data, "\n") || ps[0].Line == 0) {
			t.Errorf("%s: at line %d, want the budget's (%d)", c.budget, ps[0].Line, strings.Count(data, "\n"))
		}
	}
}
