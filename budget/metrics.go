package budget

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ledger's Prometheus metrics. Tenants are labelled by
// Label (bounded by the caller); units are "tokens" or a currency (the
// agents' currencies are bounded labels already).
type Metrics struct {
	Label       func(tenant string) string
	Spent       *prometheus.GaugeVec   // acpgate_budget_spent{tenant,unit}
	Limit       *prometheus.GaugeVec   // acpgate_budget_limit{tenant,unit}
	Refusals    *prometheus.CounterVec // acpgate_budget_refusals_total{tenant}
	StoreErrors prometheus.Counter     // acpgate_budget_store_errors_total
	Lost        *prometheus.CounterVec // acpgate_budget_lost_total{tenant,unit}
}

// NewMetrics registers the ledger's metrics with reg; label bounds the
// tenant label (nil: the name).
func NewMetrics(reg prometheus.Registerer, label func(string) string) *Metrics {
	if label == nil {
		label = func(t string) string { return t }
	}
	m := &Metrics{
		Label: label,
		Spent: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "acpgate_budget_spent",
			Help: "What a budgeted tenant spent this period, by unit (tokens, or a currency), as the ledger last read it."}, []string{"tenant", "unit"}),
		Limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "acpgate_budget_limit",
			Help: "A budgeted tenant's cap for this period, by unit (tokens, or a currency)."}, []string{"tenant", "unit"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acpgate_budget_refusals_total",
			Help: "Prompts the gateway refused because the tenant's budget was exhausted."}, []string{"tenant"}),
		StoreErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "acpgate_budget_store_errors_total",
			Help: "Calls to the budget ledger's store that failed."}),
		Lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acpgate_budget_lost_total",
			Help: "Spend the ledger could not record: its store still failed at shutdown, by unit."}, []string{"tenant", "unit"}),
	}
	reg.MustRegister(m.Spent, m.Limit, m.Refusals, m.StoreErrors, m.Lost)
	return m
}

func (m *Metrics) limits(all map[string]Limits) {
	m.Limit.Reset()
	for tenant, lim := range all {
		if lim.Tokens > 0 {
			m.Limit.WithLabelValues(m.Label(tenant), "tokens").Set(float64(lim.Tokens))
		}
		for cur, v := range lim.Cost {
			m.Limit.WithLabelValues(m.Label(tenant), cur).Set(v)
		}
	}
}

func (m *Metrics) spent(tenant string, s Spent) {
	t := m.Label(tenant)
	m.Spent.WithLabelValues(t, "tokens").Set(float64(s.Tokens))
	for cur, v := range s.Cost {
		m.Spent.WithLabelValues(t, cur).Set(v)
	}
}

// reset puts the tenant's spend back to nothing (an operator's reset).
func (m *Metrics) reset(tenant string) {
	t := m.Label(tenant)
	m.Spent.DeletePartialMatch(prometheus.Labels{"tenant": t})
	m.Spent.WithLabelValues(t, "tokens").Set(0)
}

func (m *Metrics) refused(tenant string) { m.Refusals.WithLabelValues(m.Label(tenant)).Inc() }

func (m *Metrics) storeError() { m.StoreErrors.Inc() }

func (m *Metrics) lost(tenant string, s Spent) {
	t := m.Label(tenant)
	if s.Tokens > 0 {
		m.Lost.WithLabelValues(t, "tokens").Add(float64(s.Tokens))
	}
	for cur, v := range maps.All(s.Cost) {
		if v > 0 {
			m.Lost.WithLabelValues(t, cur).Add(v)
		}
	}
}
