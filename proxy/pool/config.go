package pool

import (
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AgentConfig says how to start an agent process.
type AgentConfig struct {
	Command []string          // argv; no shell
	Env     map[string]string // added to the gateway's environment
	Dir     string            // working directory ("" = the gateway's)
	// Supervisor, if set, is an argv prefix that runs Command under a
	// supervisor (acpgate's own "supervise" subcommand): it makes sure no
	// descendant of the agent outlives the gateway, even when the gateway
	// is killed with SIGKILL.
	Supervisor []string
	// StopGrace is how long an agent gets after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// InitTimeout bounds the agent's answer to initialize.
	InitTimeout time.Duration
	// Launch, if set, decides how each process of a tenant ("" for a
	// process of no tenant) starts: the sandbox. Without it a process
	// gets the gateway's environment plus Env, in Dir.
	Launch func(tenant string) (Launch, error)
}

// AppendEnv appends vars to env as "K=V", sorted by name, so that a
// process's environment does not depend on map order.
func AppendEnv(env []string, vars map[string]string) []string {
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// Launch is how one agent process starts.
type Launch struct {
	Env []string // the whole environment, "K=V"
	Dir string   // working directory
	// Sandbox says how the process is confined, for the log ("" = not).
	Sandbox string
	// Exited, if set, is called once the process is reaped (and on a
	// failed start); what it returns explains the exit in the log (a
	// limit that killed it), or is "".
	Exited func() string
}

// Config sizes a pool. The zero value of each field has a default
// (setDefaults).
type Config struct {
	Agent                 AgentConfig
	MinIdle               int           // initialized processes with no session kept ready
	MaxProcesses          int           // upper bound on live processes
	MaxSessionsPerProcess int           // sessions one process serves at most
	MaxMessageBytes       int           // stdio line limit
	AcquireTimeout        time.Duration // how long a request waits for a process
	IdleTimeout           time.Duration // an idle process beyond MinIdle is stopped after this
	// RecycleAfterSessions and RecycleAfter retire a process once it has
	// served that many sessions, or has run that long (0 = never): it takes
	// no new sessions and stops once its last one has ended.
	RecycleAfterSessions int
	RecycleAfter         time.Duration
	// ClientName and ClientVersion are the clientInfo the pool gives agents
	// in its initialize.
	ClientName, ClientVersion string

	// TenantBound: a process belongs to one tenant from its start (the
	// sandbox confines it to that tenant's root), so warm processes are
	// started for tenants (SetTenants), the most recently active first.
	TenantBound bool
	// Tenants are the configured tenants, for SetTenants at start.
	Tenants []string
	// FileAccess is what processes are told of fs read and write; nil =
	// both (SetFileAccess changes it for processes started later).
	FileAccess *[2]bool

	// NewHandler makes the handler of a process's output, ticks and exit
	// before the process starts, with no pool lock held; nil = lines are
	// dropped.
	NewHandler func(*Process) Handler
	// Redact, if set, takes secrets out of an agent's stderr line before
	// it is kept or logged (and so before it is cut to the log's bound,
	// which could leave part of a secret).
	Redact func(string) string
	// Metrics receives the pool's metrics; nil = not exported.
	Metrics *Metrics
}

func (c *Config) setDefaults() {
	if c.MaxProcesses <= 0 {
		c.MaxProcesses = 16
	}
	if c.MaxSessionsPerProcess <= 0 {
		c.MaxSessionsPerProcess = 32
	}
	if c.MinIdle > c.MaxProcesses {
		c.MinIdle = c.MaxProcesses
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 16 << 20
	}
	if c.AcquireTimeout <= 0 {
		c.AcquireTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.Agent.StopGrace <= 0 {
		c.Agent.StopGrace = 5 * time.Second
	}
	if c.Agent.InitTimeout <= 0 {
		c.Agent.InitTimeout = 60 * time.Second
	}
	if c.ClientName == "" {
		c.ClientName = "acpgate"
	}
	if c.Metrics == nil {
		c.Metrics = NopMetrics()
	}
	if c.NewHandler == nil {
		c.NewHandler = func(*Process) Handler { return nopHandler{} }
	}
}

// Handler is what the pool calls for one process. The pool knows nothing
// of what the lines mean: the relay routes them.
type Handler interface {
	// Line is called with each line the agent writes (without its '\n'),
	// on the process's read goroutine, one at a time; line is reused after
	// it returns. The answer to the pool's own initialize is not passed on.
	Line(line []byte)
	// Tick is called about once a second by the pool's maintainer, and
	// whenever it is woken: the handler expires what waited too long.
	Tick(now time.Time)
	// Exited is called once, after the process was reaped and its reader
	// has finished, or its start failed: everything still routed through
	// it has failed.
	Exited(reason error)
}

type nopHandler struct{}

func (nopHandler) Line([]byte)    {}
func (nopHandler) Tick(time.Time) {}
func (nopHandler) Exited(error)   {}

// Metrics are what a pool records. Each is one agent's series; the relay
// makes them from its labelled vectors.
type Metrics struct {
	Spawns             prometheus.Counter
	Exits              *prometheus.CounterVec // reason: stopped, exited, failed, killed, init_failed
	SpawnDuration      prometheus.Observer
	InitializeDuration prometheus.Observer
	PoolWait           prometheus.Observer
	Recycled           *prometheus.CounterVec // reason: sessions, age
	LineTooLong        prometheus.Counter     // agent lines over the message limit, skipped
	// DoubleReleases counts leases released more than once, by kind
	// (session, home, request), and counters that would have gone below
	// zero (session_count, home_count, request_count): a bug, logged too.
	DoubleReleases *prometheus.CounterVec
}

// NopMetrics are metrics registered nowhere.
func NopMetrics() *Metrics {
	return &Metrics{
		Spawns:             prometheus.NewCounter(prometheus.CounterOpts{Name: "spawns"}),
		Exits:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exits"}, []string{"reason"}),
		SpawnDuration:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "spawn"}),
		InitializeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "init"}),
		PoolWait:           prometheus.NewHistogram(prometheus.HistogramOpts{Name: "wait"}),
		Recycled:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recycled"}, []string{"reason"}),
		LineTooLong:        prometheus.NewCounter(prometheus.CounterOpts{Name: "line_too_long"}),
		DoubleReleases:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "double_releases"}, []string{"what"}),
	}
}
