package gateway

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	relaymetrics "github.com/acpgate/acpgate/proxy/metrics"
)

// metrics are the gateway's own Prometheus metrics (the relay registers its
// own on the same registry).
type metrics struct {
	tenants         *relaymetrics.TenantLabels
	connsOpen       *prometheus.GaugeVec   // tenant, transport, agent
	connsTotal      *prometheus.CounterVec // tenant, reason, transport, agent
	authFailures    *prometheus.CounterVec // reason
	slowDisconnects prometheus.Counter
	reloads         *prometheus.CounterVec // result
	ruleDecisions   *prometheus.CounterVec // tenant, decide
}

func newMetrics(reg *prometheus.Registry, s *Server, relay *relaymetrics.Metrics, authFailures *prometheus.CounterVec, version string) *metrics {
	m := &metrics{
		authFailures: authFailures,
		tenants:      relay.Tenants(),
		connsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "acpgate_connections_open", Help: "Open client connections, by transport (websocket, http) and agent.",
		}, []string{"tenant", "transport", "agent"}),
		connsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_connections_total", Help: "Client connections that ended, by close reason, transport (websocket, http) and agent.",
		}, []string{"tenant", "reason", "transport", "agent"}),
		slowDisconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "acpgate_slow_client_disconnects_total", Help: "Connections closed because the client read slower than its agent wrote (a WebSocket with 1008).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_config_reloads_total", Help: "SIGHUP configuration reloads, by result (success, failure).",
		}, []string{"result"}),
		ruleDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_permission_rule_decisions_total",
			Help: "Agent permission requests a standing permission rule matched, by tenant and what the rule decides (allow, deny, ask).",
		}, []string{"tenant", "decide"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "acpgate_build_info", Help: "The running acpgate's version (value 1).",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	build.Set(1)
	queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "acpgate_send_queue_messages", Help: "Messages waiting in client send queues (all connections).",
	}, s.links.queued)
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "acpgate_ready", Help: "1 when /readyz answers 200.",
	}, func() float64 { return gaugeBool(s.ready() == "") })
	// Drains in progress, to watch a rollout: this gateway's own (SIGTERM
	// received, 1 until it exits) and removed agents' (SIGHUP).
	drains := func(kind string, f func() float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "acpgate_drains_in_progress", Help: drainsHelp,
			ConstLabels: prometheus.Labels{"kind": kind},
		}, f)
	}
	drainGateway := drains("gateway", func() float64 { return gaugeBool(s.notReady.Load() || s.links.refusing()) })
	drainAgents := drains("agent", func() float64 { return float64(s.agents.drainsInProgress()) })
	reg.MustRegister(m.connsOpen, m.connsTotal, m.authFailures, m.slowDisconnects, m.reloads, m.ruleDecisions, build, queued, ready, drainGateway, drainAgents,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ruleDecision counts a permission request a standing rule matched
// (tenant: the tenant's label on metrics).
func (m *metrics) ruleDecision(tenant, decide string) {
	m.ruleDecisions.WithLabelValues(tenant, decide).Inc()
}

// gaugeBool is a gauge's value for b: 1 when true, 0 when false.
func gaugeBool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

const drainsHelp = "Drains under way: kind gateway (SIGTERM received: not ready, finishing turns), agent (agents a reload removed, finishing theirs)."
