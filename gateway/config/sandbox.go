package config

import (
	"fmt"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/proxy/sandbox"
)

// Sandbox confines agent processes (see package proxy/sandbox).
type Sandbox struct {
	// Mode is auto (on where the kernel has Landlock, an error in the log
	// where it has not), required (refuse to start without Landlock) or
	// off. Unset: auto with tenants configured, off without (a person's
	// own machine, where the agent keeps the user's environment).
	Mode string `yaml:"mode"`
	// ReadOnly are more paths every agent may read and execute (an agent's
	// install directory, a toolchain); ReadWrite more paths it may write.
	ReadOnly  []string `yaml:"read_only"`
	ReadWrite []string `yaml:"read_write"`
	// Home holds one private home per tenant: HOME=<home>/<tenant> (0700),
	// with TMPDIR inside it.
	Home string `yaml:"home"`
	// User is the account agents run as, UID[:GID] or a name, when the
	// gateway runs as root ("" = the gateway's own, without capabilities).
	User    string         `yaml:"user"`
	Network SandboxNetwork `yaml:"network"`
	Limits  SandboxLimits  `yaml:"limits"`
	// Cgroup is a cgroup v2 directory delegated to the gateway: each agent
	// process gets a child of it with the memory and process limits.
	Cgroup string `yaml:"cgroup"`
}

// SandboxNetwork restricts TCP (Landlock ABI 4 and later).
type SandboxNetwork struct {
	// Restrict turns the TCP rules on; then only the listed ports may be
	// connected to or bound.
	Restrict bool `yaml:"restrict"`
	// ConnectTCP are the ports agents may connect to, BindTCP those they may
	// bind, with Restrict on.
	ConnectTCP []int `yaml:"connect_tcp"`
	BindTCP    []int `yaml:"bind_tcp"`
}

// SandboxLimits bound what one agent process (with everything it starts)
// may use. 0 = no limit.
type SandboxLimits struct {
	// OpenFiles is RLIMIT_NOFILE.
	OpenFiles int `yaml:"open_files"`
	// Processes is RLIMIT_NPROC (which counts every process of the
	// agents' user, so it is meant for a dedicated sandbox.user) and, with
	// a cgroup, pids.max.
	Processes int `yaml:"processes"`
	// Memory is RLIMIT_DATA and, with a cgroup, memory.max.
	Memory ByteSize `yaml:"memory"`
}

// TenantSandbox adds paths for one tenant's agents.
type TenantSandbox struct {
	// ReadOnly are more paths these agents may read and execute; ReadWrite
	// more paths they may write.
	ReadOnly  []string `yaml:"read_only"`
	ReadWrite []string `yaml:"read_write"`
}

// TenantSandboxUser is a tenant's sandbox: its paths, and the account its
// agents run as.
type TenantSandboxUser struct {
	TenantSandbox `yaml:",inline"`
	// User, when set, is the account this tenant's agents run as (UID[:GID]
	// or a name; the gateway runs as root), over sandbox.user. One account
	// per tenant keeps tenants' agents apart without Landlock too.
	User string `yaml:"user"`
}

// ByteSize is a size written as 1048576, 512MiB, 2GiB, 64KiB (or KB, MB,
// GB for powers of ten).
type ByteSize int64

// UnmarshalYAML parses a size.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*b = ByteSize(v)
	return nil
}

// MarshalYAML writes the size in bytes.
func (b ByteSize) MarshalYAML() (any, error) { return int64(b), nil }

// ParseByteSize parses a ByteSize.
func ParseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.TrimSpace(s[len(num):])
	mult := map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || mult == 0 || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size (use e.g. 536870912, 512MiB, 2GiB)", s)
	}
	return n * mult, nil
}

// SandboxMode is the mode in effect: auto, required or off.
func (c *Config) SandboxMode() string {
	if c.Sandbox.Mode == "" {
		if c.AuthEnabled() {
			return "auto"
		}
		return "off"
	}
	return c.Sandbox.Mode
}

// SandboxUser resolves sandbox.user; nil when unset.
func (c *Config) SandboxUser() (*sandbox.User, error) {
	return parseUser("sandbox.user", c.Sandbox.User)
}

// TenantUser resolves the account tenant t's agents run as: its own
// sandbox.user, else sandbox.user; nil when neither is set.
func (c *Config) TenantUser(t *Tenant) (*sandbox.User, error) {
	if t != nil && t.Sandbox.User != "" {
		return parseUser(fmt.Sprintf("tenant %q sandbox.user", t.Name), t.Sandbox.User)
	}
	return c.SandboxUser()
}

// UserPerTenant reports whether every tenant's agents run as an account of
// their own: each tenant sets sandbox.user, no two share a uid, and none is
// the uid of sandbox.user (processes of no one tenant).
func (c *Config) UserPerTenant() bool {
	if len(c.Tenants) == 0 {
		return false
	}
	seen := map[int]bool{}
	if u, err := c.SandboxUser(); err == nil && u != nil {
		seen[u.UID] = true
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		u, err := c.TenantUser(t)
		if err != nil || u == nil || t.Sandbox.User == "" || seen[u.UID] {
			return false
		}
		seen[u.UID] = true
	}
	return true
}

// parseUser resolves UID[:GID] or a name (where names the setting).
func parseUser(where, s string) (*sandbox.User, error) {
	if s == "" {
		return nil, nil
	}
	name, group, hasGroup := strings.Cut(s, ":")
	var u sandbox.User
	if id, err := strconv.Atoi(name); err == nil {
		u.UID, u.GID = id, id
	} else {
		pw, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		u.UID, _ = strconv.Atoi(pw.Uid)
		u.GID, _ = strconv.Atoi(pw.Gid)
	}
	if hasGroup {
		if id, err := strconv.Atoi(group); err == nil {
			u.GID = id
		} else {
			g, err := user.LookupGroup(group)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			u.GID, _ = strconv.Atoi(g.Gid)
		}
	}
	if u.UID <= 0 || u.GID <= 0 {
		return nil, fmt.Errorf("%s: %q must name an unprivileged account (uid and gid above 0)", where, s)
	}
	return &u, nil
}

// SandboxHome is the private home of a tenant's agents ("" = the
// deployment without tenants).
func (c *Config) SandboxHome(tenant string) string {
	if tenant == "" {
		tenant = "default"
	}
	return filepath.Join(c.Sandbox.Home, tenant)
}

// SandboxPaths lists what the processes of agent a (nil: no named agents)
// of tenant t (nil: no tenants) may read and execute, and what they may
// also write: the system directories, sandbox.read_only and read_write, the
// agent's and the tenant's own additions, the tenant's root and its
// private home. Devices are not listed.
func (c *Config) SandboxPaths(t *Tenant, a *NamedAgent) (ro, rw []string) {
	ro = append(append(ro, sandbox.SystemReadOnly...), c.Sandbox.ReadOnly...)
	rw = append(rw, c.Sandbox.ReadWrite...)
	if a != nil {
		ro = append(ro, a.Sandbox.ReadOnly...)
		rw = append(rw, a.Sandbox.ReadWrite...)
	}
	name := ""
	if t != nil {
		name = t.Name
		ro = append(ro, t.Sandbox.ReadOnly...)
		rw = append(rw, t.Sandbox.ReadWrite...)
		rw = append(rw, t.Root)
	}
	rw = append(rw, c.SandboxHome(name))
	return ro, rw
}

// validateSandbox checks the sandbox settings, its own and the tenants'
// and agents' that only apply with it on.
func (c *Config) validateSandbox(root *yaml.Node) []Problem {
	var ps []Problem
	add := func(path, format string, args ...any) { ps = append(ps, problemAt(root, path, format, args...)) }
	sb := &c.Sandbox
	switch sb.Mode {
	case "", "auto", "required", "off":
	default:
		add("sandbox.mode", "%q is not auto, required or off", sb.Mode)
	}
	if c.SandboxMode() == "off" {
		return ps
	}
	sb.validatePaths(add)
	for i := range c.Tenants {
		absPaths(add, fmt.Sprintf("tenants[%d].sandbox.read_only", i), c.Tenants[i].Sandbox.ReadOnly)
		absPaths(add, fmt.Sprintf("tenants[%d].sandbox.read_write", i), c.Tenants[i].Sandbox.ReadWrite)
	}
	validateSandboxUsers(c, add)
	sb.validateLimits(add)
	validateSandboxAgents(c, add)
	return ps
}

// validatePaths checks sandbox.home, read_only and read_write.
func (sb *Sandbox) validatePaths(add addFunc) {
	if !filepath.IsAbs(sb.Home) || filepath.Clean(sb.Home) == "/" {
		add("sandbox.home", "%q must be an absolute directory other than /", sb.Home)
	}
	absPaths(add, "sandbox.read_only", sb.ReadOnly)
	absPaths(add, "sandbox.read_write", sb.ReadWrite)
}

// absPaths checks that every path of a list (at where) is absolute and not /.
func absPaths(add addFunc, where string, list []string) {
	for _, p := range list {
		if !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
			add(where, "%q must be an absolute path other than /", p)
		}
	}
}

// validateSandboxUsers checks sandbox.user and the tenants' own accounts,
// one per tenant.
func validateSandboxUsers(c *Config, add addFunc) {
	if _, err := c.SandboxUser(); err != nil {
		add("sandbox.user", "%v", err)
	}
	uids := map[int]string{}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.Sandbox.User == "" {
			continue
		}
		where := fmt.Sprintf("tenants[%d].sandbox.user", i)
		u, err := c.TenantUser(t)
		switch {
		case err != nil:
			add(where, "%v", err)
		case uids[u.UID] != "":
			add(where, "uid %d is also tenant %q's: each tenant's agents need an account of their own", u.UID, uids[u.UID])
		default:
			uids[u.UID] = t.Name
		}
	}
}

// validateLimits checks sandbox.network, sandbox.limits and sandbox.cgroup.
func (sb *Sandbox) validateLimits(add addFunc) {
	for _, p := range append(append([]int(nil), sb.Network.ConnectTCP...), sb.Network.BindTCP...) {
		if p < 1 || p > 65535 {
			add("sandbox.network", "port %d is not from 1 to 65535", p)
		}
	}
	if (len(sb.Network.ConnectTCP) > 0 || len(sb.Network.BindTCP) > 0) && !sb.Network.Restrict {
		add("sandbox.network", "connect_tcp and bind_tcp only apply with restrict: true")
	}
	if sb.Limits.OpenFiles < 0 || sb.Limits.Processes < 0 || sb.Limits.Memory < 0 {
		add("sandbox.limits", "limits must not be negative (0 = no limit)")
	}
	if sb.Limits.OpenFiles > 0 && sb.Limits.OpenFiles < 16 {
		add("sandbox.limits.open_files", "%d is too few for any agent (at least 16)", sb.Limits.OpenFiles)
	}
	if sb.Limits.Memory > 0 && sb.Limits.Memory < 16<<20 {
		add("sandbox.limits.memory", "%d bytes is too little for any agent (at least 16MiB)", sb.Limits.Memory)
	}
	if sb.Cgroup != "" && !filepath.IsAbs(sb.Cgroup) {
		add("sandbox.cgroup", "%q must be an absolute path (a cgroup v2 directory delegated to the gateway)", sb.Cgroup)
	}
}

// validateSandboxAgents checks the agents' settings that only apply with
// the sandbox on.
func validateSandboxAgents(c *Config, add addFunc) {
	for _, a := range c.AgentList() {
		at := "agent"
		if len(c.Agents) > 0 {
			at = "agents." + a.Name
			absPaths(add, at+".sandbox.read_only", a.Sandbox.ReadOnly)
			absPaths(add, at+".sandbox.read_write", a.Sandbox.ReadWrite)
		}
		pool := at + ".pool"
		if len(c.Agents) == 0 {
			pool = "pool"
		}
		if len(c.Tenants) > 1 && a.Pool.Isolation == "shared" {
			add(pool+".isolation", "shared with the sandbox on and %d tenants: one agent process cannot be confined to two tenants' roots "+
				"(use isolation: tenant, or sandbox.mode: off for a trusted single organisation)", len(c.Tenants))
		}
		if a.Dir != "" && len(c.Tenants) > 0 {
			add(at+".dir", "with the sandbox on, each agent starts in its tenant's root; remove %s.dir", at)
		}
	}
}

// sandboxExposures lists the secrets an agent could read with the sandbox
// on, and the tenant data one tenant's agents could reach of another's:
// the session keys, the JWKS and HS256 secret files and the configuration
// file itself (extra) must lie outside every path an agent may read; no
// tenant's paths may reach into another tenant's root or home.
func (c *Config) sandboxExposures(root *yaml.Node, extra ...string) []Problem {
	if c.SandboxMode() == "off" {
		return nil
	}
	var ps []Problem
	at := func(key, format string, args ...any) {
		p := Problem{Msg: fmt.Sprintf(format, args...)}
		if n := find(root, strings.Split(key, ".")...); n != nil {
			p.Line, p.Column = n.Line, n.Column
		}
		ps = append(ps, p)
	}
	views := sandboxViews(c)
	homes := sandbox.Resolve(c.Sandbox.Home)
	exposedSecrets(c, views, homes, extra, at)
	exposedRoots(c, views, homes, at)
	// Paths every agent (or one tenant's) may use must not hold the homes.
	for _, v := range views {
		for _, p := range v.paths {
			if p == c.SandboxHome(nameOf(v.t)) || (v.t != nil && p == v.t.Root) {
				continue
			}
			if sandbox.Within(homes, sandbox.Resolve(p)) {
				at("sandbox.home", "sandbox.home %s lies inside %s, which %s may use: each tenant's home would be open to the others", c.Sandbox.Home, p, v.who)
			}
		}
	}
	return ps
}

// sandboxView is what an agent may read under the sandbox, for a tenant
// (or the one view without tenants).
type sandboxView struct {
	who   string
	t     *Tenant
	paths []string // read-only and read-write alike: what it may read
}

// sandboxViews is every agent's view, by tenant.
func sandboxViews(c *Config) []sandboxView {
	var views []sandboxView
	for _, a := range c.AgentList() {
		// With one agent: "agents", "tenant X's agents"; with named ones,
		// which agent.
		agents, suffix := "agents", "agents"
		if len(c.Agents) > 0 {
			agents, suffix = fmt.Sprintf("agent %q", a.Name), fmt.Sprintf("agent %q", a.Name)
		}
		if len(c.Tenants) == 0 {
			ro, rw := c.SandboxPaths(nil, a.NamedAgent)
			views = append(views, sandboxView{agents, nil, append(ro, rw...)})
		}
		for i := range c.Tenants {
			if !c.Tenants[i].MayUse(a.Name) {
				continue
			}
			ro, rw := c.SandboxPaths(&c.Tenants[i], a.NamedAgent)
			views = append(views, sandboxView{fmt.Sprintf("tenant %q's %s", c.Tenants[i].Name, suffix), &c.Tenants[i], append(ro, rw...)})
		}
	}
	return views
}

// keyAt records a problem at a dotted configuration key.
type keyAt func(key, format string, args ...any)

// exposedSecrets reports the secret files (and extra: the configuration
// files) an agent could read under the sandbox.
func exposedSecrets(c *Config, views []sandboxView, homes string, extra []string, at keyAt) {
	type secret struct{ key, path string }
	var secrets []secret
	for _, f := range c.sessionKeyPaths() {
		secrets = append(secrets, secret{"session_key_file", f})
	}
	if c.Audit.HMACKeyFile != "" {
		secrets = append(secrets, secret{"audit.hmac_key_file", c.Audit.HMACKeyFile})
	}
	if j := c.Auth.JWT; j != nil {
		if j.JWKSFile != "" {
			secrets = append(secrets, secret{"auth.jwt.jwks_file", j.JWKSFile})
		}
		if j.HS256SecretFile != "" {
			secrets = append(secrets, secret{"auth.jwt.hs256_secret_file", j.HS256SecretFile})
		}
	}
	keys, files := c.agentEnvFiles()
	for i, f := range files {
		secrets = append(secrets, secret{keys[i], f})
	}
	for _, f := range extra {
		secrets = append(secrets, secret{"", f})
	}
	// readableBy names who may read file and through which path, or "".
	readableBy := func(file string) (who, via string) {
		for _, v := range views {
			for _, p := range v.paths {
				if sandbox.Within(file, sandbox.Resolve(p)) {
					return v.who, p
				}
			}
		}
		if sandbox.Within(file, homes) {
			return "the agents", c.Sandbox.Home
		}
		return "", ""
	}
	for _, s := range secrets {
		who, via := readableBy(sandbox.Resolve(s.path))
		if who == "" {
			continue
		}
		what := "the configuration file " + s.path
		if s.key != "" {
			what = s.key + " " + s.path
		}
		at(s.key, "%s is readable by %s under the sandbox (inside %s): move it out of every tenant root, home and sandbox path", what, who, via)
	}
}

// exposedRoots reports tenant roots that overlap the homes or a path
// another tenant's agents may use.
func exposedRoots(c *Config, views []sandboxView, homes string, at keyAt) {
	overlap := func(a, b string) bool { return sandbox.Within(a, b) || sandbox.Within(b, a) }
	for i := range c.Tenants {
		t := &c.Tenants[i]
		r := sandbox.Resolve(t.Root)
		if overlap(r, homes) {
			at("sandbox.home", "sandbox.home %s and tenants[%d].root %s overlap: one tenant's agents could reach the others' homes", c.Sandbox.Home, i, t.Root)
		}
		for _, v := range views {
			if v.t == t {
				continue
			}
			for _, p := range v.paths {
				rp := sandbox.Resolve(p)
				if v.t != nil && p == v.t.Root {
					continue // roots are checked to be disjoint already
				}
				if p == c.SandboxHome(nameOf(v.t)) {
					continue
				}
				if overlap(r, rp) {
					at("tenants", "tenants[%d].root %s overlaps %s, which %s may use: tenant roots must lie outside the system directories and every sandbox path", i, t.Root, p, v.who)
					break
				}
			}
		}
	}
}

func nameOf(t *Tenant) string {
	if t == nil {
		return ""
	}
	return t.Name
}
