package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/budget"
	"github.com/acpgate/acpgate/gateway/config"
)

// A reload changes a tenant's budget (the admin API lists the new
// limits) but not where the ledger is kept; the admin API resets a
// budget and answers 404 for a tenant without one.
func TestBudgetsReloadAndAdmin(t *testing.T) {
	ts := startServer(t, withAdmin(t, func(c *config.Config) {
		c.Tenants[0].Budget = &config.Budget{Cost: map[string]float64{"USD": 25}}
	}))
	defer ts.shutdown()
	base := "http://" + ts.addr + "/v1/admin/budgets"
	var list struct{ Budgets []budget.Status }
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "admintok", &list); code != http.StatusOK ||
		len(list.Budgets) != 1 || list.Budgets[0].Tenant != "acme" || list.Budgets[0].Limits.Cost["USD"] != 25 ||
		list.Budgets[0].Period != budget.Day || list.Budgets[0].Exhausted != nil {
		t.Fatalf("GET budgets: %d %+v", code, list)
	}
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "tok", nil); code != http.StatusForbidden {
		t.Errorf("a tenant's token: %d", code)
	}

	cur := ts.s.config()
	next := *cur
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].Budget = &config.Budget{Period: "month", Tokens: 1000}
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("a budget change was refused: %v", err)
	}
	list.Budgets = nil
	if code, _ := adminCall(t, ts.http, http.MethodGet, base, "admintok", &list); code != http.StatusOK ||
		len(list.Budgets) != 1 || list.Budgets[0].Limits.Tokens != 1000 || len(list.Budgets[0].Limits.Cost) != 0 ||
		list.Budgets[0].Period != budget.Month {
		t.Fatalf("after the reload: %d %+v", code, list)
	}
	store := *ts.s.config()
	store.Budgets.Store = "file:" + t.TempDir() + "/ledger.db"
	if err := ts.s.Reload(&store); err == nil || !strings.Contains(err.Error(), "budgets settings need a restart") {
		t.Fatalf("a store change: %v", err)
	}

	if code, _ := adminCall(t, ts.http, http.MethodPost, base+"/acme/reset", "admintok", nil); code != http.StatusOK {
		t.Errorf("reset acme: %d", code)
	}
	if code, _ := adminCall(t, ts.http, http.MethodPost, base+"/initech/reset", "admintok", nil); code != http.StatusNotFound {
		t.Errorf("reset of a tenant without a budget: %d", code)
	}
	off := *ts.s.config()
	off.Tenants = append([]config.Tenant(nil), off.Tenants...)
	off.Tenants[0].Budget = nil
	if err := ts.s.Reload(&off); err != nil {
		t.Fatal(err)
	}
	if code, _ := adminCall(t, ts.http, http.MethodPost, base+"/acme/reset", "admintok", nil); code != http.StatusNotFound {
		t.Errorf("reset once the budget is gone: %d", code)
	}
}
