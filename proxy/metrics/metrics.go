// Package metrics holds the relay's Prometheus metrics: their vectors, one
// agent's view of them (Agent), the bounded labels of tenants and methods,
// and the collector of the relay's live state (Live). The relay records
// into them; they read the relay only through the Live it registers.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's Prometheus metrics. Labels are bounded: methods
// are the known ACP method names (others become "_extension" or "other"),
// tenants are named up to a cap (then "other"), agents are the configured
// names, never a session ID, token or path.
//
// What an agent's pool and connections record carries that agent's name
// (an Agent view, made by ForAgent); the connection-level metrics of
// resumes and take-overs do not.
type Metrics struct {
	reg     prometheus.Registerer // what New registered them on (Register)
	tenants *TenantLabels

	sessionsActive      *prometheus.GaugeVec
	sessionsTotal       *prometheus.CounterVec
	messages            *prometheus.CounterVec
	messageBytes        *prometheus.CounterVec
	requestDuration     *prometheus.HistogramVec
	firstUpdate         *prometheus.HistogramVec
	spawns              *prometheus.CounterVec
	recycled            *prometheus.CounterVec
	fsServed            *prometheus.CounterVec
	exits               *prometheus.CounterVec
	spawnDuration       *prometheus.HistogramVec
	initializeDuration  *prometheus.HistogramVec
	poolWait            *prometheus.HistogramVec
	denials             *prometheus.CounterVec
	agentProtocolErrors *prometheus.CounterVec
	doubleReleases      *prometheus.CounterVec
	usageTokens         *prometheus.CounterVec
	usageCost           *prometheus.CounterVec
	promptSeconds       *prometheus.CounterVec
	usageRejected       *prometheus.CounterVec
	metaRemoved         *prometheus.CounterVec

	Detached  prometheus.Gauge
	Resumes   *prometheus.CounterVec // result: ok, refused; reason (Refused*)
	Takeovers *prometheus.CounterVec // turn: running, ended, idle

	// Multi-client sessions (session/attach).
	AttachedClients       prometheus.Gauge       // clients attached to sessions now
	Attaches              *prometheus.CounterVec // result: ok, not_found, refused, full, invalid
	PermissionResolutions *prometheus.CounterVec // outcome: selected, cancelled, timeout, disconnect
	PromptsQueued         prometheus.Gauge       // prompts waiting for another client's turn
}

// Reasons a resume is refused, for acpgate_resumes_total{reason}; the
// client is told the same in every case.
const (
	RefusedOtherReplica = "other_replica" // issued by another gateway process: another replica, or before a restart
	RefusedUnknown      = "unknown"       // not a token this process holds (never issued, ended, or malformed)
	RefusedMismatch     = "mismatch"      // another tenant's or another agent's connection
	RefusedNotKept      = "not_kept"      // the messages the client lacks are no longer kept, or the connection closed
)

// New registers the relay's metrics on reg. tenantCap bounds the
// number of distinct tenant label values.
func New(reg prometheus.Registerer, tenantCap int) *Metrics {
	m := &Metrics{
		reg:     reg,
		tenants: NewTenantLabels(tenantCap),
		sessionsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "acpgate_sessions_active", Help: "Sessions held by client connections, by tenant and agent.",
		}, []string{"tenant", "agent"}),
		sessionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_sessions_total", Help: "Session events: created (session/new, fork), loaded (load, resume), closed (client left or closed it), lost (agent died).",
		}, []string{"tenant", "event", "agent"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_messages_total", Help: "JSON-RPC messages relayed, by direction, method (responses: the request's method) and agent.",
		}, []string{"direction", "method", "agent"}),
		messageBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_message_bytes_total", Help: "Bytes of JSON-RPC messages relayed, by direction, method and agent.",
		}, []string{"direction", "method", "agent"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "acpgate_request_duration_seconds",
			Help:    "Time from a client request to the agent's response, by method and agent.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"method", "agent"}),
		firstUpdate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "acpgate_prompt_first_update_seconds",
			Help:    "Time from session/prompt to the first session/update of the turn.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"agent"}),
		spawns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_agent_spawns_total", Help: "Agent processes started.",
		}, []string{"agent"}),
		recycled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_agent_recycled_total", Help: "Agent processes retired by the pool's recycling limits, by reason: sessions (pool.recycle_after_sessions) or age (pool.recycle_after). A retired process takes no new sessions and stops when its last one ends.",
		}, []string{"reason", "agent"}),
		fsServed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_fs_standin_total", Help: "Agent fs/read_text_file and fs/write_text_file requests the gateway served itself from the tenant root, for a client that did not offer file access, by method and result (ok, error).",
		}, []string{"method", "result", "agent"}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_agent_exits_total", Help: "Agent processes that ended, by reason: stopped (by the gateway), exited (on their own, status 0), failed (non-zero status), killed (signal), init_failed.",
		}, []string{"reason", "agent"}),
		spawnDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "acpgate_agent_spawn_duration_seconds", Help: "Time from starting an agent process to its initialize answer.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"agent"}),
		initializeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "acpgate_agent_initialize_duration_seconds", Help: "Time the agent took to answer the gateway's initialize.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"agent"}),
		poolWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "acpgate_pool_wait_seconds", Help: "Time a request waited for an agent process.",
			Buckets: []float64{.0001, .001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"agent"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_policy_denials_total", Help: "Requests refused by the capability policy or tenant rules, by reason.",
		}, []string{"tenant", "reason", "agent"}),
		agentProtocolErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_agent_protocol_errors_total", Help: "Agent output the gateway could not relay, by kind (invalid_json, line_too_long, unknown_id, no_recipient, duplicate_id, request_timeout: the agent did not answer in time, client_timeout: the client did not answer an agent request within timeouts.client_request).",
		}, []string{"kind", "agent"}),
		metaRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_meta_removed_total", Help: "Members of clients' _meta (params._meta, or result._meta of an answer) removed before the agent saw the message, as policy.meta.allow says.",
		}, []string{"tenant", "agent"}),
		doubleReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "acpgate_double_releases_total", Help: "Holds given back twice (a bug, logged as an error; the second release changes nothing), by what: hold (a client request's tenant slot, process slot and session route), session, home, request (a process lease), or a *_count that would have gone below zero.",
		}, []string{"what", "agent"}),
	}
	m.newConnMetrics()
	m.newUsageMetrics()
	m.register()
	return m
}

// newConnMetrics makes the metrics of connections and shared sessions:
// resumes, take-overs and attaches, not broken down by agent.
func (m *Metrics) newConnMetrics() {
	m.Detached = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "acpgate_connections_detached", Help: "Connections whose socket ended without a clean close, kept for a resume or a take-over until sessions.detach_timeout.",
	})
	m.Resumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_resumes_total", Help: "Resume requests (GET /acp?resume=…), by result (ok, refused) and why refused: other_replica (a token of another gateway process: another replica, or this one before a restart), unknown (never issued here, ended, or expired), mismatch (another tenant's or agent's connection), not_kept (messages the client lacks are no longer kept).",
	}, []string{"result", "reason"})
	m.Takeovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_takeovers_total", Help: "Sessions of a detached connection taken over by session/load or session/resume from another connection, by the turn found: running, ended (while detached), idle (the load went to the agent).",
	}, []string{"turn"})
	m.AttachedClients = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "acpgate_attached_clients", Help: "Clients attached to sessions with session/attach now (a session's owner is not counted).",
	})
	m.Attaches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_session_attaches_total", Help: "session/attach requests by result: ok, not_found (unknown, another tenant's, or not live on this replica), refused (the tenant's sharing policy), full (sessions.max_clients), invalid.",
	}, []string{"result"})
	m.PermissionResolutions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_permission_resolutions_total", Help: "Agent permission requests settled, by how: selected or cancelled (by a client's answer, the first of several), timeout (nobody answered within timeouts.client_request), disconnect (the last client left).",
	}, []string{"outcome"})
	m.PromptsQueued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "acpgate_prompts_queued", Help: "Prompts waiting for another client's turn on the same session to end (at most 8 a session).",
	})
}

// newUsageMetrics makes the metrics of what agents report using.
func (m *Metrics) newUsageMetrics() {
	m.usageTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_usage_tokens_total", Help: "Tokens the agents reported in PromptResponse.usage (taken as the turn's own), by tenant, kind (input, output, thought, cached_read, cached_write) and agent.",
	}, []string{"tenant", "kind", "agent"})
	m.usageCost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_usage_cost_total", Help: "Cost the agents reported in usage_update, by tenant, currency (the first 8 a tenant uses; the rest and malformed codes: other) and agent: the increase of each session's cumulative cost; what a session/load or session/resume replays is not counted.",
	}, []string{"tenant", "currency", "agent"})
	m.promptSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_prompt_seconds_total", Help: "Time session/prompt turns ran on the agents, from the prompt's sending to its answer, by tenant and agent.",
	}, []string{"tenant", "agent"})
	m.usageRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_usage_rejected_total", Help: "Usage and cost reports counted as nothing, by reason: invalid (not a number, a fractional token count), negative, too_large (over 1e12 tokens in a turn, a cost increase over 1e9), decreased (a cumulative cost went down: the new amount is the baseline), currencies (a session's ninth currency).",
	}, []string{"reason", "agent"})
}

// register exports the metrics on reg, the bounded series at 0 from the
// start so that rates and alerts see the first one.
func (m *Metrics) register() {
	for _, lv := range [][2]string{{"ok", ""}, {"refused", RefusedOtherReplica}, {"refused", RefusedUnknown}, {"refused", RefusedMismatch}, {"refused", RefusedNotKept}} {
		m.Resumes.WithLabelValues(lv[0], lv[1])
	}
	atZero(m.Takeovers, "running", "ended", "idle")
	atZero(m.Attaches, "ok", "not_found", "refused", "full", "invalid")
	atZero(m.PermissionResolutions, "selected", "cancelled", "timeout", "disconnect")
	m.reg.MustRegister(m.sessionsActive, m.sessionsTotal, m.messages, m.messageBytes, m.requestDuration,
		m.firstUpdate, m.spawns, m.recycled, m.fsServed, m.Detached, m.Resumes, m.Takeovers, m.AttachedClients, m.Attaches, m.PermissionResolutions, m.PromptsQueued, m.exits, m.spawnDuration,
		m.initializeDuration, m.poolWait, m.denials, m.metaRemoved, m.agentProtocolErrors, m.doubleReleases,
		m.usageTokens, m.usageCost, m.promptSeconds, m.usageRejected)
}

// Register exports c on the registry the metrics were made with: the
// relay's collector of its live state (Live), once per Metrics.
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// Nop is metrics on a registry of their own, which nothing exports: for a
// relay built without a registry, and for tests.
func Nop() *Metrics { return New(prometheus.NewRegistry(), 0) }

// Tenants returns the labeler, so the gateway's own metrics use the same
// bounded tenant labels.
func (m *Metrics) Tenants() *TenantLabels { return m.tenants }

// atZero creates the series of a one-label counter for each value.
func atZero(v *prometheus.CounterVec, values ...string) {
	for _, x := range values {
		v.WithLabelValues(x)
	}
}
