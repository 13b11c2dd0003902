package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/usage"
)

// Agent is one agent's view of the metrics: every series it records
// carries agent="<name>".
type Agent struct {
	root *Metrics

	SessionsActive      *prometheus.GaugeVec   // tenant
	SessionsTotal       *prometheus.CounterVec // tenant, event: created, loaded, closed, lost
	Messages            *prometheus.CounterVec // direction, method
	MessageBytes        *prometheus.CounterVec // direction, method
	RequestDuration     prometheus.ObserverVec // method
	FirstUpdate         prometheus.Observer
	Spawns              prometheus.Counter
	Recycled            *prometheus.CounterVec // reason: sessions, age
	FsServed            *prometheus.CounterVec // method, result
	Exits               *prometheus.CounterVec // reason
	SpawnDuration       prometheus.Observer
	InitializeDuration  prometheus.Observer
	PoolWait            prometheus.Observer
	Denials             *prometheus.CounterVec // tenant, reason
	MetaRemoved         *prometheus.CounterVec // tenant
	AgentProtocolErrors *prometheus.CounterVec // kind
	DoubleReleases      *prometheus.CounterVec // what
	UsageTokens         *prometheus.CounterVec // tenant, kind
	UsageCost           *prometheus.CounterVec // tenant, currency
	PromptSeconds       *prometheus.CounterVec // tenant
	UsageRejected       *prometheus.CounterVec // reason
	byMethod            [2]sync.Map            // direction → method label → *msgCounters
}

// ForAgent is the view of the metrics an agent's pool and connections
// record into. Its counters of bounded label sets start at 0.
func (m *Metrics) ForAgent(name string) *Agent {
	l := prometheus.Labels{"agent": name}
	am := &Agent{
		root:                m,
		SessionsActive:      m.sessionsActive.MustCurryWith(l),
		SessionsTotal:       m.sessionsTotal.MustCurryWith(l),
		Messages:            m.messages.MustCurryWith(l),
		MessageBytes:        m.messageBytes.MustCurryWith(l),
		RequestDuration:     m.requestDuration.MustCurryWith(l),
		FirstUpdate:         m.firstUpdate.WithLabelValues(name),
		Spawns:              m.spawns.WithLabelValues(name),
		Recycled:            m.recycled.MustCurryWith(l),
		FsServed:            m.fsServed.MustCurryWith(l),
		Exits:               m.exits.MustCurryWith(l),
		SpawnDuration:       m.spawnDuration.WithLabelValues(name),
		InitializeDuration:  m.initializeDuration.WithLabelValues(name),
		PoolWait:            m.poolWait.WithLabelValues(name),
		Denials:             m.denials.MustCurryWith(l),
		MetaRemoved:         m.metaRemoved.MustCurryWith(l),
		AgentProtocolErrors: m.agentProtocolErrors.MustCurryWith(l),
		DoubleReleases:      m.doubleReleases.MustCurryWith(l),
		UsageTokens:         m.usageTokens.MustCurryWith(l),
		UsageCost:           m.usageCost.MustCurryWith(l),
		PromptSeconds:       m.promptSeconds.MustCurryWith(l),
		UsageRejected:       m.usageRejected.MustCurryWith(l),
	}
	// Exported at 0 from the start, so rates and alerts see the first one.
	atZero(am.Recycled, "sessions", "age")
	atZero(am.UsageRejected, usage.RejectInvalid, usage.RejectNegative, usage.RejectTooLarge, usage.RejectDecreased, usage.RejectCurrencies)
	return am
}

// Pool is what the agent's pool records, from the agent's series.
func (m *Agent) Pool() *pool.Metrics {
	return &pool.Metrics{
		Spawns:             m.Spawns,
		Exits:              m.Exits,
		SpawnDuration:      m.SpawnDuration,
		InitializeDuration: m.InitializeDuration,
		PoolWait:           m.PoolWait,
		Recycled:           m.Recycled,
		LineTooLong:        m.AgentProtocolErrors.WithLabelValues("line_too_long"),
		DoubleReleases:     m.DoubleReleases,
	}
}

// Root is the metrics the view was made from, for the series of
// connections and shared sessions that carry no agent.
func (m *Agent) Root() *Metrics { return m.root }

// Directions for message metrics.
const (
	ClientToAgent = "client_to_agent"
	AgentToClient = "agent_to_client"
)

type msgCounters struct{ msgs, bytes prometheus.Counter }

// Message counts one relayed message of n bytes in direction dir. The
// counters are resolved once per direction and method: the hot path does
// one map load, no allocation.
func (m *Agent) Message(dir, method string, n int) {
	d := 0
	if dir == AgentToClient {
		d = 1
	}
	l := MethodLabel(method) // the cache is keyed by the bounded label
	v, ok := m.byMethod[d].Load(l)
	if !ok {
		v, _ = m.byMethod[d].LoadOrStore(l, &msgCounters{
			msgs:  m.Messages.WithLabelValues(dir, l),
			bytes: m.MessageBytes.WithLabelValues(dir, l),
		})
	}
	c := v.(*msgCounters)
	c.msgs.Inc()
	c.bytes.Add(float64(n))
}
