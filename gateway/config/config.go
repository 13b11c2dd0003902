// Package config reads and validates acpgate's YAML configuration.
//
// Unknown keys are errors. Load returns every problem it finds, each with
// its line and column, so that `acpgate check-config` can list them all.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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

// resolveAgents lays each named agent's keys over its defaults: the
// agent: block's settings (not its command) and the top-level pool. The
// strict decode has already reported unknown keys and bad values.
func (c *Config) resolveAgents(root *yaml.Node) {
	for name := range c.Agents {
		n := find(root, "agents", name)
		if n == nil {
			continue
		}
		na := &NamedAgent{Agent: c.Agent, Pool: c.Pool}
		na.Command = nil
		na.Env = maps.Clone(c.Agent.Env)
		na.InheritEnv = slices.Clone(c.Agent.InheritEnv)
		_ = n.Decode(na)
		c.Agents[name] = na
	}
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
}

// WebSocket tunes the client transport.
type WebSocket struct {
	// PingInterval is how often a WebSocket is pinged; PingTimeout how long
	// its pong may take before the connection is taken for dead.
	PingInterval Duration `yaml:"ping_interval"`
	PingTimeout  Duration `yaml:"ping_timeout"`
	// WriteTimeout bounds one write to a client (a WebSocket frame, an SSE
	// event).
	WriteTimeout Duration `yaml:"write_timeout"`
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

// Problem is one configuration error and where it is.
type Problem struct {
	Line, Column int // 0 when unknown
	Msg          string
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("line %d, column %d: %s", p.Line, p.Column, p.Msg)
	}
	return p.Msg
}

// Error lists every problem found in a configuration.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d problem(s)", e.File, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(e.File)
		b.WriteString(": ")
		b.WriteString(p.String())
	}
	return b.String()
}

// LoadFile reads and validates a configuration file over the defaults.
func LoadFile(path string) (*Config, error) { return LoadFileWith(path, nil) }

// LoadFileWith is LoadFile with overlay (flags, the environment) applied to
// the settings read before they are validated, so that an overlay can
// complete or correct the file. A nil overlay changes nothing.
func LoadFileWith(path string, overlay func(*Config) error) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(path, path, data, overlay)
}

// Parse decodes and validates YAML over the defaults. name is used in
// error messages.
func Parse(name string, data []byte) (*Config, error) { return parse(name, "", data, nil) }

// parse decodes and validates data, named name in messages; file is the
// path it was read from ("" if none), which agents must not be able to read.
func parse(name, file string, data []byte, overlay func(*Config) error) (*Config, error) {
	cfg := Default()
	cerr := &Error{File: name}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		cerr.Problems = append(cerr.Problems, yamlProblems(err)...)
		return nil, cerr
	}
	if len(bytes.TrimSpace(data)) > 0 {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) { // EOF: only comments
			cerr.Problems = append(cerr.Problems, yamlProblems(err)...)
		}
	}
	if overlay != nil && len(cerr.Problems) == 0 {
		if err := overlay(cfg); err != nil {
			return nil, err
		}
	}
	if len(cerr.Problems) == 0 {
		cfg.resolveAgents(&root)
	}
	cerr.Problems = append(cerr.Problems, cfg.validate(&root)...)
	if len(cerr.Problems) == 0 && file != "" {
		cerr.Problems = append(cerr.Problems, cfg.sandboxExposures(&root, file)...)
	}
	if len(cerr.Problems) > 0 {
		return nil, cerr
	}
	return cfg, nil
}

// yamlProblems splits a yaml error into one problem per line it reports.
func yamlProblems(err error) []Problem {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	var out []Problem
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		p := Problem{Msg: m}
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if i := strings.IndexByte(rest, ':'); i > 0 {
				if n, err := strconv.Atoi(rest[:i]); err == nil {
					p = Problem{Line: n, Column: 1, Msg: strings.TrimSpace(rest[i+1:])}
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// Validate checks a configuration that was built in code (flags over
// defaults); problems carry no location.
func (c *Config) Validate() error {
	if ps := c.validate(nil); len(ps) > 0 {
		return &Error{File: "configuration", Problems: ps}
	}
	return nil
}

// problemAt is a problem about the setting at a dotted path, located in
// the document when it sets it.
func problemAt(root *yaml.Node, path, format string, args ...any) Problem {
	p := Problem{Msg: path + ": " + fmt.Sprintf(format, args...)}
	if n := find(root, strings.Split(path, ".")...); n != nil {
		p.Line, p.Column = n.Line, n.Column
	}
	return p
}

func (c *Config) validate(root *yaml.Node) []Problem {
	var ps []Problem
	add := func(path, format string, args ...any) { ps = append(ps, problemAt(root, path, format, args...)) }
	c.validateListen(add)
	if c.ShutdownGrace < 0 {
		add("shutdown_grace", "must not be negative")
	}
	if c.ShutdownDelay < 0 {
		add("shutdown_delay", "must not be negative")
	}
	switch {
	case c.ShutdownLinger < 0:
		add("shutdown_linger", "must not be negative")
	case c.ShutdownLinger > c.ShutdownGrace && find(root, "shutdown_linger") != nil:
		// Set explicitly; the default (1s) is cut to a shorter grace.
		add("shutdown_linger", "%s must not exceed shutdown_grace (%s): the linger runs within the grace",
			c.ShutdownLinger.D(), c.ShutdownGrace.D())
	}
	ps = append(ps, validateAgent(root, "agent", &c.Agent)...)
	ps = append(ps, validatePool(root, "pool", &c.Pool)...)
	ps = append(ps, c.validateAgents(root)...)
	c.validateLimits(add)
	c.validateConnections(add)
	ps = append(ps, c.validateTenants(root)...)
	if sp := c.validateSandbox(root); len(sp) > 0 {
		ps = append(ps, sp...)
	} else {
		ps = append(ps, c.sandboxExposures(root)...)
	}
	c.validatePolicies(add)
	ps = append(ps, c.validatePermissions(root)...)
	c.validateSharing(add)
	c.validateAdmin(add)
	c.validateLog(add)
	c.validateAudit(add)
	c.validateTracing(add)
	c.validateBudgets(add)
	c.validateCluster(add)
	return ps
}

// addFunc records a problem at a YAML path.
type addFunc func(path, format string, args ...any)

func (c *Config) validateListen(add addFunc) {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		add("listen", "%q is not host:port: %v", c.Listen, err)
		return
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		add("listen", "port %q is not a number from 0 to 65535", port)
	}
	if !IsLoopback(host) && !c.AllowUnauthenticated && !c.AuthEnabled() {
		add("listen", "%q is not a loopback address and no authentication is configured: "+
			"serving agents to the network unauthenticated needs allow_unauthenticated: true (or --allow-unauthenticated)", c.Listen)
	}
}

// validateLimits checks sessions, limits and timeouts.
func (c *Config) validateLimits(add addFunc) {
	if c.Sessions.DetachTimeout < 0 {
		add("sessions.detach_timeout", "must not be negative (0 = end a connection with its socket)")
	}
	if c.Sessions.ReplayBufferBytes < 64<<10 || c.Sessions.ReplayBufferBytes > 1<<30 {
		add("sessions.replay_buffer_bytes", "must be from 65536 to 1073741824, is %d", c.Sessions.ReplayBufferBytes)
	}
	if c.Sessions.HistoryBytes < 0 || c.Sessions.HistoryBytes > 1<<30 {
		add("sessions.history_bytes", "must be from 0 (keep no history) to 1073741824, is %d", c.Sessions.HistoryBytes)
	}
	if c.Sessions.MaxClients < 1 || c.Sessions.MaxClients > 256 {
		add("sessions.max_clients", "must be from 1 to 256, is %d", c.Sessions.MaxClients)
	}
	if c.Sessions.OwnersRetention < Duration(time.Second) {
		add("sessions.owners_retention", "must be at least 1s (how long the maker of an unused session is remembered), is %s", time.Duration(c.Sessions.OwnersRetention))
	}
	if c.Sessions.OwnersPerTenant < 1 || c.Sessions.OwnersPerTenant > 1<<24 {
		add("sessions.owners_per_tenant", "must be from 1 to 16777216, is %d", c.Sessions.OwnersPerTenant)
	}
	if n := c.Sessions.AffinityCookie; n != "" && !cookieName.MatchString(n) {
		add("sessions.affinity_cookie", "%q is not a cookie name (letters, digits and !#$%%&'*+-.^_`|~, at most 64)", n)
	}
	if c.Limits.MaxMessageBytes < 1024 || c.Limits.MaxMessageBytes > 1<<30 {
		add("limits.max_message_bytes", "must be from 1024 to 1073741824, is %d", c.Limits.MaxMessageBytes)
	}
	if c.Limits.MaxPendingRequests < 1 {
		add("limits.max_pending_requests", "must be at least 1")
	}
	if c.Limits.TenantQueuedPromptBytes < 1 {
		add("limits.tenant_queued_prompt_bytes", "must be at least 1 (default 268435456, 256 MiB)")
	}
	if c.Limits.MessagesPerSecond < 0 || c.Limits.TenantMessagesPerSecond < 0 || c.Limits.MessageBurst < 0 || c.Limits.TenantMessageBurst < 0 {
		add("limits", "rates and bursts must not be negative (0 = no limit)")
	}
	if c.Timeouts.Handshake <= 0 || c.Timeouts.Request <= 0 || c.Timeouts.Prompt <= 0 || c.Timeouts.ClientRequest <= 0 || c.Timeouts.Idle < 0 {
		add("timeouts", "handshake, request, prompt and client_request must be positive; idle not negative (0 = never)")
	}
	if c.Limits.SendQueueMessages < 1 {
		add("limits.send_queue_messages", "must be at least 1")
	}
	if c.Limits.SendQueueBytes < c.Limits.MaxMessageBytes {
		add("limits.send_queue_bytes", "must be at least max_message_bytes (%d), is %d", c.Limits.MaxMessageBytes, c.Limits.SendQueueBytes)
	}
}

// validateConnections checks the websocket and observability settings.
func (c *Config) validateConnections(add addFunc) {
	if c.WebSocket.PingInterval < 0 {
		add("websocket.ping_interval", "must not be negative (0 disables pings)")
	}
	if c.WebSocket.PingTimeout <= 0 {
		add("websocket.ping_timeout", "must be positive")
	}
	if c.WebSocket.WriteTimeout <= 0 {
		add("websocket.write_timeout", "must be positive")
	}
	if c.Observability.TenantLabelLimit < 0 {
		add("observability.tenant_label_limit", "must not be negative")
	}
	if ml := c.Observability.MetricsListen; ml != "" {
		if _, _, err := net.SplitHostPort(ml); err != nil {
			add("observability.metrics_listen", "%q is not host:port: %v", ml, err)
		}
		if c.Observability.OpsOnMainListener {
			add("observability.ops_on_main_listener", "has no effect with observability.metrics_listen set "+
				"(/metrics and the admin API are served there, never on the main listener): remove one")
		}
	}
}

// validatePolicies checks the global policy and every tenant's with every agent.
func (c *Config) validatePolicies(add addFunc) {
	if err := c.GlobalPolicy().Validate(); err != nil {
		add("policy", "%v", err)
	}
	for i := range c.Tenants {
		for _, a := range c.AgentList() {
			if err := c.TenantAgentPolicy(&c.Tenants[i], a.Name).Validate(); err != nil {
				add("tenants", "tenants[%d].policy (with agent %q): %v", i, a.Name, err)
			}
		}
	}
}

func (c *Config) validateLog(add addFunc) {
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "%q is not text or json", c.Log.Format)
	}
}

// validateAgent checks an agent's settings (at path: agent, or
// agents.<name>).
func validateAgent(root *yaml.Node, path string, a *Agent) []Problem {
	var ps []Problem
	add := func(key, format string, args ...any) {
		ps = append(ps, problemAt(root, path+"."+key, format, args...))
	}
	if len(a.Command) > 0 && a.Command[0] == "" {
		add("command", "the program name is empty")
	}
	for k := range a.Env {
		if !validEnvName(k) {
			add("env", "%q is not a valid environment variable name", k)
		}
	}
	for _, k := range a.InheritEnv {
		if !validEnvName(k) {
			add("inherit_env", "%q is not a valid environment variable name", k)
		}
	}
	if a.StopGrace <= 0 {
		add("stop_grace", "must be positive")
	}
	if a.InitTimeout <= 0 {
		add("init_timeout", "must be positive")
	}
	switch a.Usage.CostTotal {
	case "", CostPerLoad, CostPerSession:
	default:
		add("usage.cost_total", "%q is not %s or %s", a.Usage.CostTotal, CostPerLoad, CostPerSession)
	}
	return ps
}

// validatePool checks a pool's settings (at path: pool, or
// agents.<name>.pool).
func validatePool(root *yaml.Node, path string, p *Pool) []Problem {
	var ps []Problem
	add := func(key, format string, args ...any) {
		ps = append(ps, problemAt(root, path+"."+key, format, args...))
	}
	if p.MaxProcesses < 1 {
		add("max_processes", "must be at least 1, is %d", p.MaxProcesses)
	}
	if p.MinIdle < 0 || p.MinIdle > p.MaxProcesses {
		add("min_idle", "must be from 0 to max_processes (%d), is %d", p.MaxProcesses, p.MinIdle)
	}
	if p.MaxSessionsPerProcess < 1 {
		add("max_sessions_per_process", "must be at least 1, is %d", p.MaxSessionsPerProcess)
	}
	if p.AcquireTimeout <= 0 {
		add("acquire_timeout", "must be positive")
	}
	if p.IdleTimeout <= 0 {
		add("idle_timeout", "must be positive")
	}
	if p.RecycleAfterSessions < 0 {
		add("recycle_after_sessions", "must not be negative (0 = never), is %d", p.RecycleAfterSessions)
	}
	if p.RecycleAfter < 0 {
		add("recycle_after", "must not be negative (0 = never)")
	}
	switch p.Isolation {
	case "tenant", "shared":
	default:
		add("isolation", "%q is not tenant or shared", p.Isolation)
	}
	return ps
}

// agentName is a name that fits in a URL path segment and a metrics label.
var agentName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// validateAgents checks agents:, default_agent and the tenants' agents
// lists.
func (c *Config) validateAgents(root *yaml.Node) []Problem {
	var ps []Problem
	add := func(path, format string, args ...any) { ps = append(ps, problemAt(root, path, format, args...)) }
	if len(c.Agents) > 0 && len(c.Agent.Command) > 0 {
		add("agent.command", "is set and so is agents:; with named agents, give each its command under agents.<name>.command "+
			"(agent: then only holds the defaults of the other settings)")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Agents)) {
		a := c.Agents[name]
		if !agentName.MatchString(name) {
			add("agents", "%q is not an agent name: 1-63 letters, digits, '_' or '-', starting with a letter or digit", name)
			continue
		}
		if a == nil {
			add("agents."+name, "has no settings (an agent with no command runs the built-in demo agent: write {} for that)")
			continue
		}
		ps = append(ps, validateAgent(root, "agents."+name, &a.Agent)...)
		ps = append(ps, validatePool(root, "agents."+name+".pool", &a.Pool)...)
		if err := c.AgentPolicy(name).Validate(); err != nil {
			add("agents."+name+".policy", "%v", err)
		}
	}
	switch def := c.DefaultAgent; {
	case def != "" && c.AgentNamed(def) == nil:
		add("default_agent", "%q is not a configured agent (agents: %s)", def, strings.Join(c.agentNames(), ", "))
	case def == "" && len(c.Agents) > 1:
		add("agents", "several agents and no default_agent: name the one /acp serves (the others are at /acp/<name>)")
	}
	for i := range c.Tenants {
		for _, name := range c.Tenants[i].Agents {
			if c.AgentNamed(name) == nil {
				ps = append(ps, problemAt(root, "tenants", "tenants[%d].agents: %q is not a configured agent (agents: %s)",
					i, name, strings.Join(c.agentNames(), ", ")))
			}
		}
	}
	return ps
}

func (c *Config) agentNames() []string {
	var out []string
	for _, a := range c.AgentList() {
		out = append(out, a.Name)
	}
	return out
}

var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func (c *Config) validateTenants(root *yaml.Node) []Problem {
	var ps []Problem
	at := func(n *yaml.Node, format string, args ...any) {
		p := Problem{Msg: fmt.Sprintf(format, args...)}
		if n != nil {
			p.Line, p.Column = n.Line, n.Column
		}
		ps = append(ps, p)
	}
	tenantsNode := find(root, "tenants")
	item := func(i int, key string) *yaml.Node {
		if tenantsNode == nil || tenantsNode.Kind != yaml.SequenceNode || i >= len(tenantsNode.Content) {
			return nil
		}
		n := tenantsNode.Content[i]
		if m := member(n, key); m != nil {
			return m
		}
		return n // no such key: the tenant itself
	}
	seen := map[string]bool{}
	for i := range c.Tenants {
		c.validateTenant(i, seen, at, item)
	}
	// Roots must not overlap: a tenant whose root holds another's could list
	// and load that tenant's sessions.
	for i := range c.Tenants {
		for j := i + 1; j < len(c.Tenants); j++ {
			a, b := filepath.Clean(c.Tenants[i].Root), filepath.Clean(c.Tenants[j].Root)
			if a == b || strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/") {
				at(item(j, "root"), "tenants[%d].root: %q overlaps tenant %q's root %q; tenant roots must be disjoint",
					j, c.Tenants[j].Root, c.Tenants[i].Name, c.Tenants[i].Root)
			}
		}
	}
	c.validateAuth(root, at)
	return ps
}

// nodeAt records a problem at a YAML node.
type nodeAt func(n *yaml.Node, format string, args ...any)

// validateTenant checks tenants[i]; seen holds the names before it.
func (c *Config) validateTenant(i int, seen map[string]bool, at nodeAt, item func(i int, key string) *yaml.Node) {
	t := &c.Tenants[i]
	where := fmt.Sprintf("tenants[%d]", i)
	if !tenantName.MatchString(t.Name) {
		at(item(i, "name"), "%s.name: %q must be 1-63 letters, digits, '.', '_' or '-'", where, t.Name)
	} else if seen[t.Name] {
		at(item(i, "name"), "%s.name: tenant %q is listed twice", where, t.Name)
	}
	seen[t.Name] = true
	for _, h := range t.TokensSHA256 {
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			at(item(i, "tokens_sha256"), "%s.tokens_sha256: %q is not a hex SHA-256 (64 hex characters)", where, truncate(h, 16))
		}
	}
	if len(t.TokensSHA256) == 0 && c.Auth.JWT == nil {
		at(item(i, ""), "%s: tenant %q has no tokens_sha256 and no auth.jwt is configured: nobody could connect as it", where, t.Name)
	}
	if !filepath.IsAbs(t.Root) || filepath.Clean(t.Root) == "/" {
		at(item(i, "root"), "%s.root: %q must be an absolute directory other than /", where, t.Root)
	} else if st, err := os.Stat(t.Root); err != nil || !st.IsDir() {
		at(item(i, "root"), "%s.root: %q is not an existing directory", where, t.Root)
	}
	if t.VirtualRoot != "" && !filepath.IsAbs(t.VirtualRoot) {
		at(item(i, "virtual_root"), "%s.virtual_root: %q must be absolute", where, t.VirtualRoot)
	}
	if t.MaxConnections < 0 || t.MaxSessions < 0 {
		at(item(i, ""), "%s: max_connections and max_sessions must not be negative (0 = no cap)", where)
	}
	validateBudget(i, t.Budget, at, item(i, "budget"))
	if t.Sharing.badAttach() {
		n := item(i, "sharing")
		if n != nil {
			if m := member(n, "attach"); m != nil {
				n = m
			}
		}
		at(n, "%s.sharing.attach: %q is not same_subject, tenant or off", where, *t.Sharing.Attach)
	}
	c.validateAgentEnv(i, at, item)
}

// validateAuth checks the auth settings and the session keys.
func (c *Config) validateAuth(root *yaml.Node, at nodeAt) {
	if len(c.Tenants) == 0 && (c.Auth.JWT != nil || len(c.Auth.AllowedOrigins) > 0) {
		at(find(root, "auth"), "auth: is set but no tenants are configured; list tenants to turn authentication on")
	}
	if j := c.Auth.JWT; j != nil {
		if j.JWKSFile == "" && j.JWKSURL == "" && j.HS256SecretFile == "" {
			at(find(root, "auth", "jwt"), "auth.jwt: needs jwks_file, jwks_url or hs256_secret_file")
		}
		if j.Issuer == "" || j.Audience == "" {
			at(find(root, "auth", "jwt"), "auth.jwt: issuer and audience are required")
		}
	}
	if c.Auth.TicketTTL <= 0 || c.Auth.TicketTTL.D() > time.Minute {
		at(find(root, "auth", "ticket_ttl"), "auth.ticket_ttl: must be from 1s to 60s")
	}
	for _, f := range c.sessionKeyPaths() {
		if _, err := ReadSessionKey(f); err != nil {
			at(find(root, "session_key_file"), "%v", err)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// sessionKeyPaths lists the key files, the sealing key first.
func (c *Config) sessionKeyPaths() []string {
	var out []string
	if c.SessionKeyFile != "" {
		out = append(out, c.SessionKeyFile)
	}
	return append(out, c.SessionKeyFiles...)
}

// SessionKeys reads the configured session keys, the sealing key first. No
// key files: nil.
func (c *Config) SessionKeys() ([][]byte, error) {
	var keys [][]byte
	for _, f := range c.sessionKeyPaths() {
		k, err := ReadSessionKey(f)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// ReadSessionKey reads a key file: 64 hex characters (32 bytes), surrounding
// white space ignored.
func ReadSessionKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != 32 {
		return nil, fmt.Errorf("session key %s: must hold 32 bytes as 64 hex characters (acpgate keygen writes one)", path)
	}
	return k, nil
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

// find returns the value node at a key path in a YAML document, or nil if
// the document does not set it.
func find(root *yaml.Node, path ...string) *yaml.Node {
	if root == nil || len(root.Content) == 0 {
		return nil
	}
	n := root.Content[0]
	for _, key := range path {
		if n = member(n, key); n == nil {
			return nil
		}
	}
	return n
}

// member is the value of key in the mapping n (nil if n is not a mapping
// or has no such key).
func member(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// cookieName is what an HTTP cookie's name may be (RFC 6265 token).
var cookieName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]{1,64}$")
