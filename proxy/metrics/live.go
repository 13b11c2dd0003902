package metrics

import (
	"iter"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/proxy/pool"
)

var (
	replayBytesDesc     = prometheus.NewDesc("acpgate_replay_buffer_bytes", "Bytes held in the connections' replay buffers (sessions.replay_buffer_bytes each at most).", nil, nil)
	processStatesDesc   = prometheus.NewDesc("acpgate_agent_processes", "Agent processes by state and agent.", []string{"state", "agent"}, nil)
	sessionsPerProcDesc = prometheus.NewDesc("acpgate_agent_process_sessions",
		"Sessions per agent process (a histogram over the live processes).", []string{"agent"}, nil)
)

// Live is the relay's live state, read at each scrape: the relay registers
// it on its metrics (Metrics.Register).
type Live struct {
	Pools       iter.Seq2[string, *pool.Pool] // each agent's name and pool, in name order
	ReplayBytes func() int                    // bytes held in the connections' replay buffers
}

// Describe and Collect export each pool's live state (process states and
// the sessions-per-process histogram) and the replay buffers' size.
func (l Live) Describe(ch chan<- *prometheus.Desc) {
	ch <- processStatesDesc
	ch <- sessionsPerProcDesc
	ch <- replayBytesDesc
}

func (l Live) Collect(ch chan<- prometheus.Metric) {
	for agent, p := range l.Pools {
		collectPool(ch, agent, p)
	}
	ch <- prometheus.MustNewConstMetric(replayBytesDesc, prometheus.GaugeValue, float64(l.ReplayBytes()))
}

func collectPool(ch chan<- prometheus.Metric, agent string, p *pool.Pool) {
	st := p.Stats()
	buckets := []float64{0, 1, 2, 4, 8, 16, 32, 64, 128}
	cum := make(map[float64]uint64, len(buckets))
	var sum float64
	for _, k := range st.PerProcess {
		sum += float64(k)
		for _, b := range buckets {
			if float64(k) <= b {
				cum[b]++
			}
		}
	}
	for _, state := range []pool.State{pool.Starting, pool.Ready, pool.Stopping} {
		ch <- prometheus.MustNewConstMetric(processStatesDesc, prometheus.GaugeValue, float64(st.ByState[state]), state.String(), agent)
	}
	ch <- prometheus.MustNewConstHistogram(sessionsPerProcDesc, uint64(len(st.PerProcess)), sum, cum, agent)
}
