package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
)

// Validation: what Parse and Validate check of a configuration, each
// problem at the key it is about. The newer sections (audit, budgets,
// permissions, sandbox, sharing, agent_env, tracing) check themselves in
// their own files.

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
	c.Sessions.validate(add)
	c.Limits.validate(add)
	c.Timeouts.validate(add)
	c.WebSocket.validate(add)
	c.Observability.validate(add)
	ps = append(ps, c.validateTenants(root)...)
	if sp := c.validateSandbox(root); len(sp) > 0 {
		ps = append(ps, sp...)
	} else {
		ps = append(ps, c.sandboxExposures(root)...)
	}
	c.validatePolicies(add)
	ps = append(ps, c.validatePermissions(root)...)
	c.Sharing.validate(add)
	c.validateAdmin(add)
	c.Log.validate(add)
	c.Audit.validate(add)
	c.Observability.Tracing.validate(add)
	c.Budgets.validate(add)
	c.Cluster.validate(c, add)
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

// validate checks the sessions section.
func (s *Sessions) validate(add addFunc) {
	if s.DetachTimeout < 0 {
		add("sessions.detach_timeout", "must not be negative (0 = end a connection with its socket)")
	}
	if s.ReplayBufferBytes < 64<<10 || s.ReplayBufferBytes > 1<<30 {
		add("sessions.replay_buffer_bytes", "must be from 65536 to 1073741824, is %d", s.ReplayBufferBytes)
	}
	if s.HistoryBytes < 0 || s.HistoryBytes > 1<<30 {
		add("sessions.history_bytes", "must be from 0 (keep no history) to 1073741824, is %d", s.HistoryBytes)
	}
	if s.MaxClients < 1 || s.MaxClients > 256 {
		add("sessions.max_clients", "must be from 1 to 256, is %d", s.MaxClients)
	}
	if s.OwnersRetention < Duration(time.Second) {
		add("sessions.owners_retention", "must be at least 1s (how long the maker of an unused session is remembered), is %s", time.Duration(s.OwnersRetention))
	}
	if s.OwnersPerTenant < 1 || s.OwnersPerTenant > 1<<24 {
		add("sessions.owners_per_tenant", "must be from 1 to 16777216, is %d", s.OwnersPerTenant)
	}
	if n := s.AffinityCookie; n != "" && !cookieName.MatchString(n) {
		add("sessions.affinity_cookie", "%q is not a cookie name (letters, digits and !#$%%&'*+-.^_`|~, at most 64)", n)
	}
}

// validate checks the limits section.
func (l *Limits) validate(add addFunc) {
	if l.MaxMessageBytes < 1024 || l.MaxMessageBytes > 1<<30 {
		add("limits.max_message_bytes", "must be from 1024 to 1073741824, is %d", l.MaxMessageBytes)
	}
	if l.MaxPendingRequests < 1 {
		add("limits.max_pending_requests", "must be at least 1")
	}
	if l.TenantQueuedPromptBytes < 1 {
		add("limits.tenant_queued_prompt_bytes", "must be at least 1 (default 268435456, 256 MiB)")
	}
	if l.MessagesPerSecond < 0 || l.TenantMessagesPerSecond < 0 || l.MessageBurst < 0 || l.TenantMessageBurst < 0 {
		add("limits", "rates and bursts must not be negative (0 = no limit)")
	}
	if l.SendQueueMessages < 1 {
		add("limits.send_queue_messages", "must be at least 1")
	}
	if l.SendQueueBytes < l.MaxMessageBytes {
		add("limits.send_queue_bytes", "must be at least max_message_bytes (%d), is %d", l.MaxMessageBytes, l.SendQueueBytes)
	}
}

// validate checks the timeouts section.
func (t *Timeouts) validate(add addFunc) {
	if t.Handshake <= 0 || t.Request <= 0 || t.Prompt <= 0 || t.ClientRequest <= 0 || t.Idle < 0 {
		add("timeouts", "handshake, request, prompt and client_request must be positive; idle not negative (0 = never)")
	}
	if t.Write < 0 {
		add("timeouts.write", "must not be negative (0 = websocket.write_timeout)")
	}
}

// validate checks the websocket section.
func (w *WebSocket) validate(add addFunc) {
	if w.PingInterval < 0 {
		add("websocket.ping_interval", "must not be negative (0 disables pings)")
	}
	if w.PingTimeout <= 0 {
		add("websocket.ping_timeout", "must be positive")
	}
	if w.WriteTimeout <= 0 {
		add("websocket.write_timeout", "must be positive")
	}
}

// validate checks the observability section (its tracing: Tracing.validate).
func (o *Observability) validate(add addFunc) {
	if o.TenantLabelLimit < 0 {
		add("observability.tenant_label_limit", "must not be negative")
	}
	if ml := o.MetricsListen; ml != "" {
		if _, _, err := net.SplitHostPort(ml); err != nil {
			add("observability.metrics_listen", "%q is not host:port: %v", ml, err)
		}
		if o.OpsOnMainListener {
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

// validate checks the log section.
func (l *Log) validate(add addFunc) {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "%q is not one of debug, info, warn, error", l.Level)
	}
	switch l.Format {
	case "text", "json":
	default:
		add("log.format", "%q is not text or json", l.Format)
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

// cookieName is what an HTTP cookie's name may be (RFC 6265 token).
var cookieName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]{1,64}$")
