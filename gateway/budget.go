package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/budget"
	"github.com/acpgate/acpgate/gateway/config"
	relaymetrics "github.com/acpgate/acpgate/proxy/metrics"
)

// budgets is the gateway's side of the tenants' budgets: the ledger, an
// observer and a prompt decider of the relay's, which the relay hands its
// control when it is made (observe.Provisioner) to cancel the turns of a
// tenant past a cap. Static after newBudgets.
type budgets struct {
	ledger *budget.Ledger
}

// newBudgets opens the ledger's store (budgets.store) and starts the
// ledger with every tenant's limits; its events go to trail, its metrics
// to reg with the relay's tenant labels.
func newBudgets(cfg *config.Config, reg prometheus.Registerer, labels *relaymetrics.TenantLabels, trail *auditTrail,
	log *slog.Logger) (*budgets, error) {
	store, err := budget.OpenStore(cfg.Budgets.Store)
	if err != nil {
		return nil, fmt.Errorf("budgets: %w", err)
	}
	if store.Name() == "memory" && cfg.HasBudgets() {
		log.Warn("budgets: the ledger is in memory: a restart forgets what tenants spent this period " +
			"(budgets.store: file:PATH keeps it, redis:// shares it among replicas)")
	}
	b := &budgets{}
	b.ledger = budget.New(budget.Config{
		Store:             store,
		AllowOnStoreError: cfg.Budgets.OnStoreError == "allow",
		Limits:            cfg.BudgetLimits(),
		Event:             trail.budgetEvent,
		Metrics:           budget.NewMetrics(reg, labels.Label),
		Log:               log,
	})
	log.Info("budgets: ledger started", "store", store.Name(), "on_store_error", cfg.Budgets.OnStoreError,
		"budgeted_tenants", len(cfg.BudgetLimits()))
	return b, nil
}

// reload applies a reload's limits.
func (b *budgets) reload(next *config.Config) { b.ledger.SetLimits(next.BudgetLimits()) }

// close stops the ledger once the relay has stopped: what is still on its
// way to the store is written (bounded by ctx).
func (b *budgets) close(ctx context.Context) error { return b.ledger.Close(ctx) }

// budgetEvent records one of the ledger's events (budget.exceeded,
// budget.reset); "by" is who did it, the event's subject.
func (t *auditTrail) budgetEvent(event, tenant string, fields map[string]any) {
	if !t.on() {
		return
	}
	ev := audit.Event{Event: event, Tenant: tenant}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if by, ok := fields[k].(string); ok && k == "by" {
			ev.Subject = by
		}
		ev.Fields = append(ev.Fields, audit.F(k, fields[k]))
	}
	t.record(ev)
}
