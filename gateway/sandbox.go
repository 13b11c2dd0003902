package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/sandbox"
)

// launcher decides how each agent process starts when the sandbox is on:
// its environment (only agent.inherit_env, agent.env, the tenant's
// agent_env, HOME and TMPDIR),
// its working directory (the tenant root), and its confinement, which
// acpgate supervise applies before it starts the agent.
type launcher struct {
	log *slog.Logger
	abi int // Landlock ABI; 0: the kernel has none (mode auto)
	// probeErr is why there is no Landlock (abi 0): a reload that adds
	// agent_env is refused with it.
	probeErr error
	cfg      atomic.Pointer[config.Config]
	seq      atomic.Int64
	// tracing gives agents their OTEL_* variables; nil: none. Set before
	// the first launch.
	tracing *tracing
	// creds are the tenants' agent credentials (agent_env), which a
	// process bound to a tenant gets over the agent's env.
	creds *agentCreds
}

// newLauncher returns nil when the sandbox is off. With mode required and
// no Landlock it refuses; with mode auto it logs an error and confines
// what it can without Landlock.
func newLauncher(cfg *config.Config, supervisor []string, log *slog.Logger) (*launcher, error) {
	mode := cfg.SandboxMode()
	if mode == "off" {
		return nil, nil
	}
	if len(supervisor) == 0 {
		return nil, errors.New("the sandbox needs acpgate's supervisor to start agents")
	}
	creds, err := newAgentCreds(cfg, log)
	if err != nil {
		return nil, err
	}
	l := &launcher{log: log, creds: creds}
	l.cfg.Store(cfg)
	abi, err := sandbox.Probe()
	if cerr := credsApart(cfg, abi, err, os.Geteuid()); cerr != nil {
		return nil, cerr
	}
	l.probeErr = err
	switch {
	case err != nil && mode == "required":
		return nil, fmt.Errorf("sandbox.mode is required but the agents cannot be confined: %w", err)
	case err != nil:
		log.Error("agents run WITHOUT Landlock", "err", err,
			"meaning", "tenants' agents can read and write whatever the gateway's user can; their environment, home and "+
				"capabilities are still restricted (sandbox.mode: required refuses to start instead)")
	default:
		l.abi = abi
		log.Info("agent sandbox on", "landlock_abi", abi, "restricts", sandbox.Features(abi, cfg.Sandbox.Network.Restrict),
			"network", map[bool]string{true: "tcp ports restricted", false: "not restricted"}[cfg.Sandbox.Network.Restrict && abi >= 4])
		if cfg.Sandbox.Network.Restrict && abi < 4 {
			log.Error("sandbox.network.restrict needs Landlock ABI 4; this kernel's agents keep their network", "landlock_abi", abi)
		}
	}
	if err := checkUsers(cfg, os.Geteuid()); err != nil {
		return nil, err
	}
	if u, _ := cfg.SandboxUser(); os.Geteuid() == 0 && u == nil && !cfg.UserPerTenant() {
		log.Warn("agents run as root, without capabilities; set sandbox.user to an unprivileged account")
	}
	if err := os.MkdirAll(cfg.Sandbox.Home, 0o711); err != nil {
		return nil, fmt.Errorf("sandbox.home: %w (set sandbox.home to a directory the gateway may create)", err)
	}
	lim := cfg.Sandbox.Limits
	if cg := cfg.Sandbox.Cgroup; cg != "" {
		if err := sandbox.PrepareCgroup(cg, lim.Memory > 0, lim.Processes > 0); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// checkUsers refuses sandbox.user and tenants[].sandbox.user unless the
// gateway runs as root (euid), which alone can start agents as them.
func checkUsers(cfg *config.Config, euid int) error {
	if u, err := cfg.SandboxUser(); err != nil {
		return err
	} else if u != nil && euid != 0 {
		return fmt.Errorf("sandbox.user %q needs the gateway to run as root", cfg.Sandbox.User)
	}
	for i := range cfg.Tenants {
		t := &cfg.Tenants[i]
		if t.Sandbox.User != "" && euid != 0 {
			return fmt.Errorf("tenant %q's sandbox.user %q needs the gateway to run as root", t.Name, t.Sandbox.User)
		}
	}
	return nil
}

// credsApart says why cfg's agent credentials (tenants[].agent_env) would
// not be kept apart on this host, or nil. What keeps tenant A's agents
// from reading B's credential in /proc/<pid>/environ is either Landlock (a
// process confined by it may not inspect, in ptrace's read mode, a process
// outside its own domain, and each agent process has a domain of its own)
// or one account per tenant (tenants[].sandbox.user, the gateway running
// as root, euid): an agent without capabilities may not inspect another
// user's process. abi and probeErr are what sandbox.Probe reported: with
// agent_env and no account per tenant, sandbox.mode auto is required.
func credsApart(cfg *config.Config, abi int, probeErr error, euid int) error {
	if !cfg.HasAgentEnv() || (probeErr == nil && abi >= 1) || (euid == 0 && cfg.UserPerTenant()) {
		return nil
	}
	why := "the kernel offers no Landlock ABI"
	if probeErr != nil {
		why = probeErr.Error()
	}
	return fmt.Errorf("tenants[].agent_env needs Landlock to keep one tenant's agents from reading another's credentials "+
		"(/proc/<pid>/environ: all agents run as one user), and this host has none: %s; run the gateway where Landlock "+
		"is enabled (Linux 5.13 or later with landlock in the lsm= list, and a container seccomp profile that allows the "+
		"landlock_* system calls), or run it as root with an account of its own for every tenant "+
		"(tenants[].sandbox.user, no two alike, none sandbox.user's)", why)
}

// CredsApart is what check-config reports about tenants[].agent_env on
// this host: how the tenants' credentials are kept apart, or why serve
// would refuse to start. ok is false for a refusal; "" when no tenant
// has agent_env.
func CredsApart(cfg *config.Config) (msg string, ok bool) {
	if !cfg.HasAgentEnv() {
		return "", true
	}
	abi, err := sandbox.Probe()
	if err := credsApart(cfg, abi, err, os.Geteuid()); err != nil {
		return "agent_env: REFUSED on this host, serve would not start: " + err.Error(), false
	}
	if err != nil || abi < 1 {
		return "agent_env: tenants' credentials are kept apart by one account per tenant (tenants[].sandbox.user) on this host " +
			"(no Landlock; an agent may not read another user's process environment)", true
	}
	return fmt.Sprintf("agent_env: tenants' credentials are kept apart by Landlock ABI %d on this host "+
		"(no agent may read the environment of a process outside its own Landlock domain)", abi), true
}

// setTracing makes agents export their traces where the gateway's go.
func (l *launcher) setTracing(t *tracing) {
	if l != nil {
		l.tracing = t
	}
}

// update takes a reloaded configuration (tenants and their paths).
func (l *launcher) update(cfg *config.Config) { l.cfg.Store(cfg) }

// forAgent is proxy.AgentConfig.Launch for the named agent, which runs
// cmd: its program is always readable and executable.
func (l *launcher) forAgent(name string, cmd []string) func(string) (proxy.Launch, error) {
	exe := ""
	if p, err := exec.LookPath(cmd[0]); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if p, err = filepath.Abs(p); err == nil {
			exe = p
		}
	}
	return func(tenant string) (proxy.Launch, error) { return l.launch(name, exe, tenant) }
}

// launch says how a process of the named agent starts for tenant.
func (l *launcher) launch(agentName, exe, tenant string) (proxy.Launch, error) {
	cfg := l.cfg.Load()
	agent := cfg.AgentNamed(agentName)
	if agent == nil {
		return proxy.Launch{}, fmt.Errorf("agent %q is no longer configured", agentName)
	}
	t, err := launchTenant(cfg, tenant)
	if err != nil {
		return proxy.Launch{}, err
	}
	name := ""
	if t != nil {
		name = t.Name
	}
	home := cfg.SandboxHome(name)
	tmp := filepath.Join(home, "tmp")
	user, err := cfg.TenantUser(t)
	if err != nil {
		return proxy.Launch{}, err
	}
	if err := l.makeHome(user, home, tmp); err != nil {
		return proxy.Launch{}, err
	}
	vars := withTracingEnv(l.tracing.agentEnv(agentName, name), agent.Env)
	if creds := l.creds.of(tenant); len(creds) > 0 { // a process bound to the tenant: its credentials win
		vars = maps.Clone(vars)
		if vars == nil {
			vars = map[string]string{}
		}
		maps.Copy(vars, creds)
	}
	var env []string
	for _, k := range agent.InheritEnv {
		if _, set := vars[k]; set {
			continue
		}
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	env = append(proxy.AppendEnv(env, vars), "HOME="+home, "TMPDIR="+tmp)

	ro, rw := cfg.SandboxPaths(t, agent)
	if exe != "" {
		ro = append(ro, exe)
	}
	lim := cfg.Sandbox.Limits
	spec := l.sandboxSpec(cfg, ro, rw, user)
	launch := proxy.Launch{Dir: home, Sandbox: "landlock v" + strconv.Itoa(l.abi)}
	if l.abi == 0 {
		launch.Sandbox = "no landlock"
	}
	if t != nil {
		launch.Dir = t.Root
	}
	if cg := cfg.Sandbox.Cgroup; cg != "" {
		c, err := sandbox.NewCgroup(cg, fmt.Sprintf("agent-%s-%s-%d-%d", orDefault(name), agentName, os.Getpid(), l.seq.Add(1)),
			int64(lim.Memory), int64(lim.Processes))
		if err != nil {
			return proxy.Launch{}, err
		}
		spec.Cgroup = c.Path()
		launch.Exited = c.Close
		launch.Sandbox += ", cgroup"
	}
	launch.Env = append(env, sandbox.EnvVar+"="+spec.Encode())
	return launch, nil
}

// launchTenant is the configured tenant a process is for: nil without
// tenants; the one tenant when isolation is shared and there is one.
func launchTenant(cfg *config.Config, tenant string) (*config.Tenant, error) {
	t := tenantOf(cfg, tenant)
	if tenant == "" && len(cfg.Tenants) == 1 { // isolation: shared, one tenant
		t = &cfg.Tenants[0]
	}
	if tenant != "" && t == nil {
		return nil, fmt.Errorf("tenant %q is not configured", tenant)
	}
	return t, nil
}

// makeHome makes an agent's home and temporary directory, its user's only.
func (l *launcher) makeHome(user *sandbox.User, dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("agent home: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return fmt.Errorf("agent home: %w", err)
		}
		if user != nil {
			if err := os.Chown(d, user.UID, user.GID); err != nil {
				return fmt.Errorf("agent home: %w", err)
			}
		}
	}
	return nil
}

// sandboxSpec is the sandbox of a process that may read ro and write rw,
// running as user (nil: the gateway's).
func (l *launcher) sandboxSpec(cfg *config.Config, ro, rw []string, user *sandbox.User) *sandbox.Spec {
	lim := cfg.Sandbox.Limits
	spec := &sandbox.Spec{
		Landlock:  l.abi > 0,
		ReadOnly:  ro,
		ReadWrite: rw,
		Devices:   sandbox.SystemDevices,
		DevicesRO: sandbox.SystemDevicesRO,
		Limits: sandbox.Limits{OpenFiles: uint64(lim.OpenFiles), Processes: uint64(lim.Processes),
			DataBytes: uint64(lim.Memory)},
		User: user,
	}
	if n := cfg.Sandbox.Network; n.Restrict {
		spec.Net = &sandbox.Net{}
		for _, p := range n.ConnectTCP {
			spec.Net.ConnectTCP = append(spec.Net.ConnectTCP, uint16(p))
		}
		for _, p := range n.BindTCP {
			spec.Net.BindTCP = append(spec.Net.BindTCP, uint16(p))
		}
	}
	return spec
}

func orDefault(tenant string) string {
	if tenant == "" {
		return "default"
	}
	return tenant
}
