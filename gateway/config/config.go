// Package config reads and validates acpgate's YAML configuration.
//
// Unknown keys are errors. Load returns every problem it finds, each with
// its line and column, so that `acpgate check-config` can list them all.
package config

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/permrules"
)

// Config is the whole configuration file.
type Config struct {
	// Listen is the address of the ACP endpoints, the agent list, the probes,
	// the ticket endpoint and the web client.
	Listen string `yaml:"listen"`
	// AllowUnauthenticated permits serving without authentication on a
	// non-loopback address. Without it the gateway refuses to start there.
	AllowUnauthenticated bool `yaml:"allow_unauthenticated"`
	// ShutdownGrace bounds how long a drain lets running prompts finish.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// ShutdownDelay keeps accepting connections for this long after SIGTERM
	// while /readyz already answers 503, so load balancers stop sending new
	// clients before the listener closes (0 = close at once).
	ShutdownDelay Duration `yaml:"shutdown_delay"`
	// ShutdownLinger is how long a drain leaves each connection open after
	// the running prompts have ended (their answers written), for the
	// client to read them and close, before it closes it (1001). It runs
	// within shutdown_grace: see Config.Linger.
	ShutdownLinger Duration `yaml:"shutdown_linger"`

	// Agent is the one agent (named "default") when Agents is empty; with
	// Agents, its settings other than command are every named agent's
	// defaults.
	Agent Agent `yaml:"agent"`
	// Agents are named agents, each with a pool of its own, served at
	// /acp/<name>; DefaultAgent is the one /acp serves (required with more
	// than one).
	Agents       map[string]*NamedAgent `yaml:"agents"`
	DefaultAgent string                 `yaml:"default_agent"`
	Sandbox      Sandbox                `yaml:"sandbox"`
	Pool         Pool                   `yaml:"pool"`
	Sessions     Sessions               `yaml:"sessions"`
	Limits       Limits                 `yaml:"limits"`
	Timeouts     Timeouts               `yaml:"timeouts"`
	WebSocket    WebSocket              `yaml:"websocket"`
	Log          Log                    `yaml:"log"`
	// Observability configures metrics.
	Observability Observability `yaml:"observability"`
	// Audit configures the audit trail.
	Audit Audit `yaml:"audit"`

	// Tenants turns authentication on: every connection belongs to one.
	Tenants []Tenant `yaml:"tenants"`
	Auth    Auth     `yaml:"auth"`
	// Admin turns the admin API on (/v1/admin/...).
	Admin Admin `yaml:"admin"`
	// Budgets says where the ledger of the tenants' budgets is kept.
	Budgets Budgets `yaml:"budgets"`
	// Policy says what remote clients may do with the agent; tenants may
	// override it key by key.
	Policy PolicyYAML `yaml:"policy"`
	// Permissions are the standing permission rules of every tenant that
	// has no list of its own (and of the gateway without tenants).
	Permissions []permrules.Rule `yaml:"permissions"`
	// Sharing says who may attach to a session another client holds
	// (session/attach): the gateway without tenants, and every tenant's
	// default, which tenants may override key by key.
	Sharing SharingYAML `yaml:"sharing"`
	// SessionKeyFile holds the key that seals session IDs (32 random bytes
	// as 64 hex characters; `acpgate keygen` writes one). SessionKeyFiles
	// lists more keys: with SessionKeyFile unset its first entry seals new
	// IDs; every key opens IDs, so old keys can be kept during rotation.
	SessionKeyFile  string   `yaml:"session_key_file"`
	SessionKeyFiles []string `yaml:"session_key_files"`
	// Cluster makes the gateway a replica that serves any session (nil:
	// alone, or behind a balancer with affinity).
	Cluster *Cluster `yaml:"cluster"`
}

// Tenant is one customer of the gateway.
type Tenant struct {
	// Name names the tenant in logs, metrics, the audit trail and the admin
	// API.
	Name string `yaml:"name"`
	// TokensSHA256 are the hex SHA-256 hashes of the tenant's API tokens.
	TokensSHA256 []string `yaml:"tokens_sha256"`
	// Root is the host directory the agent works in; VirtualRoot the path
	// clients see for it (default: Root).
	Root        string `yaml:"root"`
	VirtualRoot string `yaml:"virtual_root"`
	// MaxConnections and MaxSessions cap the tenant (0 = no cap).
	MaxConnections int `yaml:"max_connections"`
	MaxSessions    int `yaml:"max_sessions"`
	// Policy overrides the global policy for this tenant, key by key.
	Policy PolicyYAML `yaml:"policy"`
	// Sandbox adds paths this tenant's agents may read or write.
	Sandbox TenantSandboxUser `yaml:"sandbox"`
	// Agents lists the named agents the tenant may use (unset: all of
	// them).
	Agents []string `yaml:"agents"`
	// Sharing overrides the top-level sharing for this tenant, key by key.
	Sharing SharingYAML `yaml:"sharing"`
	// Budget caps what the tenant's agents spend a period (nil: no cap);
	// budgets: says where the ledger is kept.
	Budget *Budget `yaml:"budget"`
	// AgentEnv are variables only this tenant's agent processes get, over
	// the agent's own env (the tenant's win): credentials, read from a
	// file or the gateway's environment at start and on every reload.
	// Needs pool.isolation: tenant and the sandbox.
	AgentEnv map[string]AgentEnvSource `yaml:"agent_env"`
	// Permissions are the tenant's standing permission rules (unset: the
	// top-level list; an empty list: none).
	Permissions []permrules.Rule `yaml:"permissions"`
}

// MayUse reports whether the tenant may use the named agent.
func (t *Tenant) MayUse(agent string) bool {
	return t.Agents == nil || slices.Contains(t.Agents, agent)
}

// Auth configures who may connect.
type Auth struct {
	// AllowedOrigins lists the browser origins allowed to open WebSockets
	// ("https://ide.example.com", "https://*.example.com"); the gateway's
	// own origin is always allowed.
	AllowedOrigins []string `yaml:"allowed_origins"`
	JWT            *JWT     `yaml:"jwt"`
	// TicketTTL is how long a one-time ticket from POST /v1/tickets lives
	// (at most 60s).
	TicketTTL Duration `yaml:"ticket_ttl"`
}

// JWT configures bearer JWTs, in addition to static tokens.
type JWT struct {
	// Issuer and Audience must match the token's iss and aud (both
	// required).
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// JWKSFile, JWKSURL and HS256SecretFile give the keys that sign tokens:
	// a JWKS file, a JWKS URL (fetched and refreshed), or a file holding an
	// HS256 secret; at least one is required.
	JWKSFile        string `yaml:"jwks_file"`
	JWKSURL         string `yaml:"jwks_url"`
	HS256SecretFile string `yaml:"hs256_secret_file"`
	// TenantClaim names the claim that holds the tenant's name.
	TenantClaim string `yaml:"tenant_claim"`
}

// AuthEnabled reports whether connections must authenticate.
func (c *Config) AuthEnabled() bool { return len(c.Tenants) > 0 }

// Agent says how to run the agent.
type Agent struct {
	// Command is the agent's argv (no shell). Empty = the built-in demo agent.
	Command []string `yaml:"command"`
	// Env is added to the agent's environment (a named agent's env adds its
	// keys to these).
	Env map[string]string `yaml:"env"`
	// Dir is the agent's working directory ("" = the gateway's); with
	// tenants and the sandbox on, each agent starts in its tenant's root.
	Dir string `yaml:"dir"`
	// InheritEnv names the variables of the gateway's own environment a
	// sandboxed agent gets (with the sandbox off it gets all of them).
	InheritEnv []string `yaml:"inherit_env"`
	// StopGrace is how long an agent gets after SIGTERM before SIGKILL.
	StopGrace Duration `yaml:"stop_grace"`
	// InitTimeout bounds the agent's answer to initialize.
	InitTimeout Duration `yaml:"init_timeout"`
	// Usage says how the agent reports what it uses.
	Usage AgentUsage `yaml:"usage"`
}

// AgentUsage says how an agent reports what it uses.
type AgentUsage struct {
	// CostTotal is how the agent's cumulative usage_update cost runs:
	// CostPerLoad (the default; "" is the default too) may start again
	// from zero at each session/load or resume, CostPerSession carries on
	// across loads and processes (budgets then count a load's first
	// report with no replayed total over the session's kept value).
	CostTotal string `yaml:"cost_total"`
}

// The values of usage.cost_total.
const (
	CostPerLoad    = "per_load"
	CostPerSession = "per_session"
)

// NamedAgent is one entry of agents: an agent's settings, its pool (the
// top-level pool with these keys laid over it), its policy keys (laid over
// the global policy, under each tenant's own) and the paths its processes
// may use besides every agent's (its install directory).
type NamedAgent struct {
	Agent   `yaml:",inline"`
	Pool    Pool          `yaml:"pool"`
	Policy  PolicyYAML    `yaml:"policy"`
	Sandbox TenantSandbox `yaml:"sandbox"`
}

// DefaultAgentName is the name of the agent a single agent: block
// configures.
const DefaultAgentName = "default"

// AgentEntry is one agent of the effective list (AgentList).
type AgentEntry struct {
	Name string
	*NamedAgent
}

// AgentList is the agents the gateway serves, in name order: the named
// agents, or the one agent: block, named "default".
func (c *Config) AgentList() []AgentEntry {
	if len(c.Agents) == 0 {
		return []AgentEntry{{Name: DefaultAgentName, NamedAgent: &NamedAgent{Agent: c.Agent, Pool: c.Pool}}}
	}
	out := make([]AgentEntry, 0, len(c.Agents))
	for _, name := range slices.Sorted(maps.Keys(c.Agents)) {
		out = append(out, AgentEntry{Name: name, NamedAgent: c.Agents[name]})
	}
	return out
}

// AgentNamed returns the named agent's settings, or nil (a map lookup:
// it runs for every request to /acp).
func (c *Config) AgentNamed(name string) *NamedAgent {
	if len(c.Agents) == 0 {
		if name != DefaultAgentName {
			return nil
		}
		return &NamedAgent{Agent: c.Agent, Pool: c.Pool}
	}
	return c.Agents[name]
}

// DefaultAgentOf is the agent /acp serves: default_agent, or the only one.
func (c *Config) DefaultAgentOf() string {
	if c.DefaultAgent != "" {
		return c.DefaultAgent
	}
	switch len(c.Agents) {
	case 0:
		return DefaultAgentName
	case 1:
		for name := range c.Agents {
			return name
		}
	}
	return ""
}

// Pool sizes the agent pool.
type Pool struct {
	// MinIdle is how many initialized processes with no session are kept
	// ready.
	MinIdle int `yaml:"min_idle"`
	// MaxProcesses caps the agent's processes.
	MaxProcesses int `yaml:"max_processes"`
	// MaxSessionsPerProcess caps the sessions one process serves.
	MaxSessionsPerProcess int `yaml:"max_sessions_per_process"`
	// AcquireTimeout is how long a request waits for a free process.
	AcquireTimeout Duration `yaml:"acquire_timeout"`
	// IdleTimeout stops idle processes beyond MinIdle after this long.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// RecycleAfterSessions and RecycleAfter retire an agent process once it
	// has been given that many sessions, or has run that long (0 = never):
	// it takes no new sessions, is replaced, and stops when its last
	// session ends.
	RecycleAfterSessions int      `yaml:"recycle_after_sessions"`
	RecycleAfter         Duration `yaml:"recycle_after"`
	// Isolation is "tenant" (two tenants never share an agent process) or
	// "shared" (for trusted single-organisation deployments).
	Isolation string `yaml:"isolation"`
}

// Sessions says how long a connection outlives its socket.
type Sessions struct {
	// DetachTimeout keeps a connection whose socket ended without a clean
	// close by the client (its sessions, running turns, pending requests)
	// for a resume or a take-over (0 = end it at once).
	DetachTimeout Duration `yaml:"detach_timeout"`
	// ReplayBufferBytes bounds what a connection keeps for a resume.
	ReplayBufferBytes int `yaml:"replay_buffer_bytes"`
	// HistoryBytes bounds the record of a live session's updates that
	// session/attach replays (0 = keep none: an attach replays nothing).
	HistoryBytes int `yaml:"history_bytes"`
	// MaxClients bounds the clients of one session, its owner included;
	// the next session/attach is refused.
	MaxClients int `yaml:"max_clients"`
	// OwnersFile keeps who made each session (an embedded database), so
	// that session/list still shows a subject its sessions after a
	// restart ("" = in memory only).
	OwnersFile string `yaml:"owners_file"`
	// OwnersRetention forgets the maker of a session not made, loaded or
	// ended through this gateway for that long (in memory and in the
	// file, which is compacted at start when that freed most of it).
	OwnersRetention Duration `yaml:"owners_retention"`
	// OwnersPerTenant bounds the session makers kept in memory per tenant
	// and agent: past it that tenant's oldest is forgotten from memory
	// (the file keeps it). One tenant's sessions never push out another's.
	OwnersPerTenant int `yaml:"owners_per_tenant"`
	// AffinityCookie names the balancer's affinity cookie ("" = none).
	// When a connection's opening request carries it, its initialize
	// result says so (_meta.acpgate.affinity), so that a share link can
	// route another device to the replica that serves the session. The
	// web page the gateway serves names it too: a share link may set
	// that cookie and no other (none when "").
	AffinityCookie string `yaml:"affinity_cookie"`
}

// Limits bound what one message and one connection may take.
type Limits struct {
	// MaxMessageBytes caps a WebSocket message and an agent's stdio line.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// SendQueueMessages and SendQueueBytes bound what the gateway holds for
	// a client that reads slower than its agent writes; past either, the
	// connection is closed (1008). Past the message count alone, a client
	// whose socket took a message within the last second is still reading:
	// it is held to SendQueueBytes only.
	SendQueueMessages int `yaml:"send_queue_messages"`
	SendQueueBytes    int `yaml:"send_queue_bytes"`
	// MaxPendingRequests caps a connection's requests waiting for agents.
	MaxPendingRequests int `yaml:"max_pending_requests"`
	// MessagesPerSecond and MessageBurst limit what one connection sends;
	// TenantMessagesPerSecond and TenantMessageBurst what all of a
	// tenant's connections send together (0 = no limit). Cancellations and
	// answers to the agent's requests are never limited.
	MessagesPerSecond       float64 `yaml:"messages_per_second"`
	MessageBurst            int     `yaml:"message_burst"`
	TenantMessagesPerSecond float64 `yaml:"tenant_messages_per_second"`
	TenantMessageBurst      int     `yaml:"tenant_message_burst"`
	// TenantQueuedPromptBytes bounds the prompts all of a tenant's
	// connections hold waiting for other clients' turns in shared
	// sessions (beside 64 MiB per connection, 32 MiB and 8 prompts per
	// session); past it a prompt gets -32006.
	TenantQueuedPromptBytes int `yaml:"tenant_queued_prompt_bytes"`
}

// Timeouts bound how long the gateway waits.
type Timeouts struct {
	// Handshake: a connection that sends no initialize within it is closed.
	Handshake Duration `yaml:"handshake"`
	// Idle: a connection with no message either way and no running prompt
	// for this long is closed (0 = never).
	Idle Duration `yaml:"idle"`
	// Request: an agent that does not answer a request within it (prompts
	// excepted) is answered for with an error.
	Request Duration `yaml:"request"`
	// Prompt: the same for session/prompt, whose turns may run long; the
	// turn is also cancelled on the agent.
	Prompt Duration `yaml:"prompt"`
	// ClientRequest: a client that does not answer an agent's request
	// (permission, fs, elicitation) within it is answered for: permission
	// cancelled, anything else -32603.
	ClientRequest Duration `yaml:"client_request"`
	// Write: a client that does not take a batch written to it (WebSocket
	// frames, SSE events) within it is cut off, on either transport. 0 =
	// websocket.write_timeout, the older name of this setting (30s).
	Write Duration `yaml:"write"`
}

// WebSocket tunes the client transport.
type WebSocket struct {
	// PingInterval is how often a WebSocket is pinged; PingTimeout how long
	// its pong may take before the connection is taken for dead.
	PingInterval Duration `yaml:"ping_interval"`
	PingTimeout  Duration `yaml:"ping_timeout"`
	// WriteTimeout is timeouts.write's older name, for both transports:
	// used when timeouts.write is not set.
	WriteTimeout Duration `yaml:"write_timeout"`
}

// WriteTimeout is how long a client may take to take a batch written to
// it (timeouts.write, else websocket.write_timeout).
func (t Timeouts) WriteTimeout(ws WebSocket) time.Duration {
	if t.Write > 0 {
		return t.Write.D()
	}
	return ws.WriteTimeout.D()
}

// Observability configures /metrics and tracing.
type Observability struct {
	// MetricsListen serves /metrics and the admin API on a separate
	// address (for example 127.0.0.1:9090) instead of the main listener.
	// "" = the main one, when it is a loopback address (or
	// OpsOnMainListener).
	MetricsListen string `yaml:"metrics_listen"`
	// OpsOnMainListener serves /metrics and the admin API on a main
	// listener that is not a loopback address, when MetricsListen is
	// unset (false: there they get 404, as any unknown path). On a
	// loopback main listener they are served either way.
	OpsOnMainListener bool `yaml:"ops_on_main_listener"`
	// TenantLabelLimit caps how many tenants get their own label value in
	// metrics; the rest are "other".
	TenantLabelLimit int `yaml:"tenant_label_limit"`
	// Tracing configures OpenTelemetry traces (tracing.go).
	Tracing Tracing `yaml:"tracing"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

// Duration is a time.Duration written as "30s", "5m".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		// A TypeError lets the decoder go on and report every other problem.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %q is not a duration (use e.g. 30s, 5m)", n.Line, s)}}
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Linger is how long a drain leaves connections open for their clients
// after the running prompts have ended: shutdown_linger, cut to
// shutdown_grace.
func (c *Config) Linger() time.Duration {
	return max(min(c.ShutdownLinger.D(), c.ShutdownGrace.D()), 0)
}

// Default returns the configuration used when no file is given.
func Default() *Config {
	return &Config{
		Listen:         "127.0.0.1:8080",
		ShutdownGrace:  Duration(30 * time.Second),
		ShutdownLinger: Duration(time.Second),
		Agent: Agent{
			StopGrace:   Duration(5 * time.Second),
			InitTimeout: Duration(60 * time.Second),
			InheritEnv:  []string{"PATH", "LANG", "LC_ALL", "TZ", "TERM"},
			Usage:       AgentUsage{CostTotal: CostPerLoad},
		},
		Sandbox: Sandbox{Home: "/var/lib/acpgate/homes"},
		Pool: Pool{
			MinIdle:               1,
			MaxProcesses:          16,
			MaxSessionsPerProcess: 32,
			AcquireTimeout:        Duration(30 * time.Second),
			IdleTimeout:           Duration(5 * time.Minute),
			Isolation:             "tenant",
		},
		Sessions: Sessions{
			DetachTimeout:     Duration(5 * time.Minute),
			ReplayBufferBytes: 8 << 20,
			HistoryBytes:      2 << 20,
			MaxClients:        8,
			OwnersRetention:   Duration(30 * 24 * time.Hour),
			OwnersPerTenant:   1 << 16,
		},
		Auth: Auth{TicketTTL: Duration(30 * time.Second)},
		Limits: Limits{
			MaxMessageBytes:    16 << 20,
			SendQueueMessages:  4096,
			SendQueueBytes:     64 << 20,
			MaxPendingRequests: 256,
			MessagesPerSecond:  100,
			MessageBurst:       200,
			// Four connections' worth of the 64 MiB each may hold.
			TenantQueuedPromptBytes: 256 << 20,
		},
		Timeouts: Timeouts{
			Handshake: Duration(10 * time.Second),
			Idle:      Duration(30 * time.Minute),
			Request:   Duration(2 * time.Minute),
			Prompt:    Duration(60 * time.Minute),
			// A permission request may wait for a person.
			ClientRequest: Duration(30 * time.Minute),
		},
		WebSocket: WebSocket{
			PingInterval: Duration(30 * time.Second),
			PingTimeout:  Duration(15 * time.Second),
			WriteTimeout: Duration(30 * time.Second),
		},
		Log:           Log{Level: "info", Format: "text"},
		Observability: Observability{TenantLabelLimit: 100},
		Budgets:       Budgets{Store: "memory", OnStoreError: "deny"},
	}
}

// OpsWhere says where /metrics and the admin API are served (check-config
// shows it), judged from the listen addresses as configured: the gateway
// judges the main listener by the address it binds.
func (c *Config) OpsWhere() string {
	host, _, _ := net.SplitHostPort(c.Listen)
	switch {
	case c.Observability.MetricsListen != "":
		return "on observability.metrics_listen " + c.Observability.MetricsListen + " (the main listener answers 404)"
	case IsLoopback(host):
		return "on the main listener " + c.Listen + " (a loopback address)"
	case c.Observability.OpsOnMainListener:
		return "on the main listener " + c.Listen + ", NOT a loopback address (observability.ops_on_main_listener: true): " +
			"whoever reaches it reaches them"
	}
	return "not served: the main listener " + c.Listen + " is not a loopback address and observability.metrics_listen is unset (they answer 404)"
}

// IsLoopback reports whether a listen host only accepts local connections.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
