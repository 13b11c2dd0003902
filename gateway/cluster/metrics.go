package cluster

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the cluster's: what was carried to other replicas, how
// long the hop took, take-overs and the store's failures.
type Metrics struct {
	Forwarded     *prometheus.CounterVec   // op
	ForwardErrors *prometheus.CounterVec   // op, reason
	ForwardTime   *prometheus.HistogramVec // op
	Takeovers     prometheus.Counter
	StoreErrors   *prometheus.CounterVec // op
	Replicas      prometheus.Gauge
}

// NewMetrics makes the metrics, registered on reg if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acpgate_cluster_forwarded_total",
			Help: "Requests and streams carried to the replica that holds their connection or session, by operation."}, []string{"op"}),
		ForwardErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acpgate_cluster_forward_errors_total",
			Help: "Forwards that failed, by operation and reason (owner_gone, store_unavailable, refused)."}, []string{"op", "reason"}),
		ForwardTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "acpgate_cluster_forward_seconds",
			Help:    "Time of one forwarded hop (a POST until the owner's answer; a stream until its headers; a session bridge until it is open and initialized), by operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"op"}),
		Takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "acpgate_cluster_takeovers_total",
			Help: "Owner records taken over from a replica that was gone."}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "acpgate_cluster_store_errors_total",
			Help: "Failed calls to the cluster store, by operation."}, []string{"op"}),
		Replicas: prometheus.NewGauge(prometheus.GaugeOpts{Name: "acpgate_cluster_replicas",
			Help: "Live replicas this one saw in the store at its last look."}),
	}
	if reg != nil {
		reg.MustRegister(m.Forwarded, m.ForwardErrors, m.ForwardTime, m.Takeovers, m.StoreErrors, m.Replicas)
	}
	return m
}
