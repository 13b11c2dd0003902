// Command acpgate puts ACP (Agent Client Protocol) agents on the network:
// WebSocket clients are multiplexed onto a pool of stdio agent processes.
//
//	acpgate [serve] [--config FILE] [--listen ADDR] [--agent "CMD ARGS..."]
//	acpgate demo-agent        a built-in ACP v1 agent on stdio
//	acpgate check-config --config FILE
//	acpgate audit verify [--key FILE]... [--allow-gaps] [--allow-missing-head] FILE...
//	acpgate keygen > session.key
//	acpgate version
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/demoagent"
	"github.com/acpgate/acpgate/gateway"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redact"
	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/proxy/supervise"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || !strings.HasPrefix(args[0], "-")) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, stderr)
	case "demo-agent":
		return demoAgent(args, stderr)
	case "check-config":
		return checkConfig(args, stdout, stderr)
	case "audit":
		return auditCmd(args, stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "acpgate %s\n", buildVersion())
		return 0
	case "keygen":
		return keygen(stdout, stderr)
	case "supervise":
		return superviseCmd(args, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "acpgate: unknown command %q\n\n", cmd)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage:
  acpgate [serve] [--config FILE] [--listen ADDR] [--agent "CMD ARGS..."]
                  [--allow-unauthenticated] [--log-level LEVEL] [--log-format text|json]
  acpgate demo-agent [--state-dir DIR] [--chunk-delay DURATION]
  acpgate check-config --config FILE
  acpgate audit verify [--key FILE]... [--allow-gaps] [--allow-missing-head] FILE...
                                   check an audit trail (its files oldest first): exit 1 if
                                   changed, 3 if it has gaps or starts after its head, 4 if
                                   it is keyed and no --key was given (MACs not checked)
  acpgate keygen > session.key     a new session key (32 random bytes, hex)
  acpgate version
`)
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

type serveFlags struct {
	config, listen, agent, logLevel, logFormat string
	allowUnauth                                bool
}

func serve(args []string, stderr io.Writer) int {
	f, code := parseServeFlags(args, stderr)
	if code != 0 {
		return code
	}
	cfg, err := loadConfig(f, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "acpgate: %v\n", err)
		return 2
	}
	red := &redact.Redactor{} // the gateway sets its secrets
	log := newLogger(cfg.Log, stderr, red)
	exe, err := os.Executable()
	if err != nil {
		log.Error("cannot find the acpgate executable", "err", err)
		return 1
	}
	srv, err := gateway.New(gateway.Options{
		Config:    cfg,
		DemoAgent: []string{exe, "demo-agent"},
		Supervisor: func(grace time.Duration) []string {
			return []string{exe, "supervise", "--grace", grace.String(), "--parent-pid", strconv.Itoa(os.Getpid()), "--"}
		},
		Version:  buildVersion(),
		Logger:   log,
		Redactor: red,
	})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Listen, "err", err)
		_ = srv.Shutdown(context.Background())
		return 1
	}
	stopMetrics, err := serveMetrics(srv, cfg.Observability.MetricsListen, log)
	if err != nil {
		log.Error("cannot serve metrics", "addr", cfg.Observability.MetricsListen, "err", err)
		_ = srv.Shutdown(context.Background())
		return 1
	}
	defer stopMetrics()
	if cfg.Cluster != nil {
		cln, err := net.Listen("tcp", cfg.Cluster.Listen)
		if err != nil {
			log.Error("cannot listen", "addr", cfg.Cluster.Listen, "setting", "cluster.listen", "err", err)
			_ = ln.Close()
			_ = srv.Shutdown(context.Background())
			return 1
		}
		go func() { // ends with srv.Shutdown
			if err := srv.ServeCluster(cln); err != nil {
				log.Error("cluster listener failed", "addr", cln.Addr().String(), "err", err)
			}
		}()
	}
	return serveUntilSignal(srv, ln, cfg, f, log, stderr)
}

func parseServeFlags(args []string, stderr io.Writer) (serveFlags, int) {
	fs := flag.NewFlagSet("acpgate serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	fs.StringVar(&f.config, "config", "", "YAML configuration file")
	fs.StringVar(&f.listen, "listen", "", "listen address (default 127.0.0.1:8080)")
	fs.StringVar(&f.agent, "agent", "", `agent command line, e.g. "node agent.mjs" (default: the built-in demo agent)`)
	fs.BoolVar(&f.allowUnauth, "allow-unauthenticated", false, "allow serving without authentication on a non-loopback address")
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "", "text or json")
	if err := fs.Parse(args); err != nil {
		return f, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "acpgate serve: unexpected argument %q\n", fs.Arg(0))
		return f, 2
	}
	return f, 0
}

// serveMetrics serves the metrics on addr of their own, if set, until the
// returned stop.
func serveMetrics(srv *gateway.Server, addr string, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	mln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	metricsSrv := &http.Server{Handler: srv.OpsHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { // ends with metricsSrv.Close (stop)
		if err := metricsSrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener failed", "addr", mln.Addr().String(), "err", err)
		}
	}()
	log.Info("serving metrics", "addr", mln.Addr().String())
	return func() { _ = metricsSrv.Close() }, nil
}

// serveUntilSignal serves ln until a signal: SIGHUP reopens the audit file
// and reloads the configuration, SIGTERM or SIGINT drains.
func serveUntilSignal(srv *gateway.Server, ln net.Listener, cfg *config.Config, f serveFlags, log *slog.Logger, stderr io.Writer) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	for {
		select {
		case err := <-serveErr:
			log.Error("server failed", "err", err)
			_ = srv.Shutdown(context.Background())
			return 1
		case <-hup:
			// The audit file is opened afresh (logrotate moved it); on a
			// failure the old file is kept.
			if err := srv.ReopenAudit(); err != nil {
				log.Error("audit trail not reopened; writing on to the old file", "err", err)
			}
			// Tenants, tokens and policy reload; the file is read again and
			// the flags and environment laid over it as at start.
			next, err := loadConfig(f, stderr)
			if err != nil {
				log.Error("configuration reload refused; keeping the running configuration", "err", err)
				srv.ReloadFailed()
				continue
			}
			_ = srv.Reload(next)
		case sig := <-sigs:
			log.Info("draining", "signal", sig.String(), "grace", cfg.ShutdownGrace.D())
			return drain(srv, cfg, sigs, serveErr, log)
		}
	}
}

// drain shuts the gateway down; a second signal stops it at once.
func drain(srv *gateway.Server, cfg *config.Config, sigs <-chan os.Signal, serveErr <-chan error, log *slog.Logger) int {
	// Reloads cannot change these, so the startup values hold (an agent
	// added by a reload has its own stop grace: the longest counts).
	ctx, cancel := context.WithTimeout(context.Background(),
		cfg.ShutdownDelay.D()+cfg.ShutdownGrace.D()+srv.MaxStopGrace()+5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }() // ends within ctx
	select {
	case err := <-done:
		<-serveErr
		if err != nil {
			log.Warn("shutdown incomplete", "err", err)
		}
		log.Info("stopped")
		return 0
	case sig := <-sigs:
		// A second signal stops at once; the agents' supervisors get their
		// parent-death signal and clean up.
		log.Warn("stopping now", "signal", sig.String())
		return 1
	}
}

// loadConfig reads the file (if any) and applies the environment and flags
// over it, then validates the result once: a flag can correct the file.
func loadConfig(f serveFlags, stderr io.Writer) (*config.Config, error) {
	overlay := func(cfg *config.Config) error {
		unknown, err := cfg.ApplyEnv(os.Environ())
		if err != nil {
			return fmt.Errorf("environment: %w", err)
		}
		for _, name := range unknown {
			if !ignoredEnv(name) {
				fmt.Fprintf(stderr, "acpgate: warning: %s is not a setting (see docs/configuration.md)\n", name)
			}
		}
		if f.listen != "" {
			cfg.Listen = f.listen
		}
		if f.agent != "" {
			argv, err := config.SplitCommand(f.agent)
			if err != nil {
				return fmt.Errorf("--agent: %w", err)
			}
			cfg.Agent.Command = argv
		}
		if f.allowUnauth {
			cfg.AllowUnauthenticated = true
		}
		if f.logLevel != "" {
			cfg.Log.Level = f.logLevel
		}
		if f.logFormat != "" {
			cfg.Log.Format = f.logFormat
		}
		return nil
	}
	if f.config != "" {
		return config.LoadFileWith(f.config, overlay)
	}
	cfg := config.Default()
	if err := overlay(cfg); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// ignoredEnv: ACPGATE_* variables that are not settings but are expected:
// the demo agent's, the test runners', and the service links Kubernetes
// injects for a Service named acpgate.
func ignoredEnv(name string) bool {
	return strings.HasPrefix(name, "ACPGATE_DEMO_") || strings.HasPrefix(name, "ACPGATE_PORT") ||
		strings.HasPrefix(name, "ACPGATE_SERVICE_") || strings.HasPrefix(name, "ACPGATE_REQUIRE_") ||
		strings.HasPrefix(name, "ACPGATE_E2E_") || name == "ACPGATE_JAEGER_BIN"
}

// newLogger writes c's format at c's level to w, with red's secrets
// redacted from every record.
func newLogger(c config.Log, w io.Writer, red *redact.Redactor) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(redact.NewHandler(h, red))
}

func checkConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("acpgate check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "YAML configuration file to check")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "acpgate check-config: --config FILE is required")
		return 2
	}
	cfg, err := config.LoadFile(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	// The effective policy, so operators see what clients will be allowed.
	if len(cfg.Tenants) == 0 {
		fmt.Fprintf(stdout, "\neffective policy (no tenants):\n%s", indent(cfg.GlobalPolicy().Describe()))
	}
	for i := range cfg.Tenants {
		t := &cfg.Tenants[i]
		fmt.Fprintf(stdout, "\neffective policy of tenant %q:\n%s", t.Name, indent(cfg.TenantPolicy(t).Describe()))
	}
	fmt.Fprintf(stdout, "\n/metrics and the admin API: %s\n", cfg.OpsWhere())
	describeAgents(stdout, cfg)
	describeOwners(stdout, cfg)
	for _, w := range cfg.MetaWarnings() {
		fmt.Fprintf(stdout, "\nWARNING: %s\n", w)
	}
	describeDrain(stdout, cfg)
	describeSandbox(stdout, cfg)
	if !describeAgentEnv(stdout, cfg) {
		fmt.Fprintf(stderr, "%s: an agent credential cannot be read (above); serve would refuse to start\n", *path)
		return 1
	}
	if msg, ok := gateway.CredsApart(cfg); !ok {
		fmt.Fprintf(stderr, "%s: %s\n", *path, msg)
		return 1
	} else if msg != "" {
		fmt.Fprintf(stdout, "\n%s\n", msg)
	}
	return 0
}

// describeDrain tells what a SIGTERM gives running prompts and clients.
func describeDrain(w io.Writer, cfg *config.Config) {
	grace, linger := cfg.ShutdownGrace.D(), cfg.Linger()
	fmt.Fprintf(w, "\ndrain (SIGTERM): running prompts get %s (shutdown_grace) to finish before they are cancelled; ", grace)
	if linger <= 0 {
		fmt.Fprintln(w, "connections close as soon as they have their answers (shutdown_linger 0)")
		return
	}
	fmt.Fprintf(w, "once they have ended, each client gets up to %s (shutdown_linger", linger)
	if linger < cfg.ShutdownLinger.D() {
		fmt.Fprintf(w, " %s, cut to shutdown_grace", cfg.ShutdownLinger.D())
	}
	fmt.Fprintf(w, "; never past the grace) to read its last answers and close before the gateway closes it\n")
}

// describeAgentEnv lists each tenant's agent credentials by name and
// source, never by value, after reading each as serve would; it reports
// whether every one could be read.
func describeAgentEnv(w io.Writer, cfg *config.Config) bool {
	ok := true
	for i := range cfg.Tenants {
		t := &cfg.Tenants[i]
		if len(t.AgentEnv) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nagent credentials of tenant %q (only its agent processes get them, over the agent's env):\n", t.Name)
		for _, k := range slices.Sorted(maps.Keys(t.AgentEnv)) {
			src := t.AgentEnv[k]
			if _, err := src.ReadValue(); err != nil {
				ok = false
				fmt.Fprintf(w, "  %s from %s: CANNOT BE READ: %v\n", k, src, err)
				continue
			}
			fmt.Fprintf(w, "  %s from %s: readable\n", k, src)
		}
	}
	return ok
}

// describeOwners tells where session makers are kept, and for how long.
func describeOwners(w io.Writer, cfg *config.Config) {
	where := "in memory only (until a restart)"
	if cfg.Sessions.OwnersFile != "" {
		where = "in " + cfg.Sessions.OwnersFile
	}
	if cl := cfg.Cluster; cl != nil {
		where += ", and shared with the other replicas in " + redactedStore(cl.Store)
	}
	fmt.Fprintf(w, "\nsession owners: %s; up to %d in memory per tenant and agent; forgotten after %s unused\n",
		where, cfg.Sessions.OwnersPerTenant, cfg.Sessions.OwnersRetention.D())
	describeCluster(w, cfg)
}

// describeCluster tells how this replica joins the others (cluster:).
func describeCluster(w io.Writer, cfg *config.Config) {
	cl := cfg.Cluster
	if cl == nil {
		fmt.Fprintf(w, "\nreplicas: none (no cluster:); behind a balancer, Streamable HTTP and resumes need affinity\n")
		return
	}
	lease := cl.Lease.D()
	if lease <= 0 {
		lease = 5 * time.Second
	}
	fmt.Fprintf(w, "\nreplicas: this one is %q; owner registry %s; internal listener %s, reached at %s; lease %s\n",
		cl.ReplicaName(), redactedStore(cl.Store), cl.Listen, cl.AdvertiseURL(), lease)
	if cl.KeyFile != "" {
		fmt.Fprintf(w, "  envelopes signed with the key in %s\n", cl.KeyFile)
	} else {
		fmt.Fprintf(w, "  envelopes signed with a key derived from the session key\n")
	}
}

// redactedStore is a store URL without its password.
func redactedStore(spec string) string {
	if u, err := url.Parse(spec); err == nil && u.User != nil {
		return u.Redacted()
	}
	return spec
}

// describeSandbox tells what agents may reach under the sandbox, and
// whether this host can enforce it.
func describeSandbox(w io.Writer, cfg *config.Config) {
	mode := cfg.SandboxMode()
	fmt.Fprintf(w, "\nagent sandbox: %s", mode)
	if mode == "off" {
		fmt.Fprintln(w, " (agents get the gateway's whole environment and every file its user can reach)")
		return
	}
	if abi, err := sandbox.Probe(); err != nil {
		fmt.Fprintf(w, "; on this host: NO Landlock (%v)", err)
		if mode == "required" {
			fmt.Fprint(w, "; serve would refuse to start here")
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "; on this host: Landlock ABI %d (%s)\n", abi, sandbox.Features(abi, cfg.Sandbox.Network.Restrict))
	}
	show := func(who string, t *config.Tenant, a config.AgentEntry) {
		ro, rw := cfg.SandboxPaths(t, a.NamedAgent)
		if len(cfg.Agents) > 0 {
			who += fmt.Sprintf(", agent %q", a.Name)
		}
		fmt.Fprintf(w, "  %s: HOME %s\n    read-write: %s\n    read-only:  %s (and the agent's program)\n",
			who, cfg.SandboxHome(tenantName(t)), strings.Join(rw, " "), strings.Join(ro[len(sandbox.SystemReadOnly):], " "))
		if u, err := cfg.TenantUser(t); err == nil && u != nil {
			fmt.Fprintf(w, "    runs as:    uid %d gid %d\n", u.UID, u.GID)
		}
	}
	fmt.Fprintf(w, "  every agent reads: %s\n", strings.Join(sandbox.SystemReadOnly, " "))
	for _, a := range cfg.AgentList() {
		if len(cfg.Tenants) == 0 {
			show("agents", nil, a)
		}
		for i := range cfg.Tenants {
			if cfg.Tenants[i].MayUse(a.Name) {
				show(fmt.Sprintf("tenant %q", cfg.Tenants[i].Name), &cfg.Tenants[i], a)
			}
		}
	}
}

// describeAgents lists the agents, who may use each, and the policy of
// those with policy keys of their own.
func describeAgents(w io.Writer, cfg *config.Config) {
	def := cfg.DefaultAgentOf()
	fmt.Fprintln(w, "\nagents:")
	for _, a := range cfg.AgentList() {
		cmd := strings.Join(a.Command, " ")
		if cmd == "" {
			cmd = "(the built-in demo agent)"
		}
		path := "/acp/" + a.Name
		if a.Name == def {
			path = "/acp and " + path
		}
		var who []string
		for i := range cfg.Tenants {
			if cfg.Tenants[i].MayUse(a.Name) {
				who = append(who, cfg.Tenants[i].Name)
			}
		}
		costTotal := a.Usage.CostTotal
		if costTotal == "" {
			costTotal = config.CostPerLoad
		}
		fmt.Fprintf(w, "  %s: %s at %s; pool max_processes %d, min_idle %d; usage.cost_total %s", a.Name, cmd, path, a.Pool.MaxProcesses, a.Pool.MinIdle, costTotal)
		if len(cfg.Tenants) > 0 {
			fmt.Fprintf(w, "; tenants: %s", strings.Join(who, ", "))
		}
		fmt.Fprintln(w)
		if cfg.Agents[a.Name] != nil && cfg.Agents[a.Name].Policy != (config.PolicyYAML{}) {
			for i := range cfg.Tenants {
				if t := &cfg.Tenants[i]; t.MayUse(a.Name) {
					fmt.Fprintf(w, "\n  effective policy of tenant %q with agent %q:\n%s", t.Name, a.Name, indent(indent(cfg.TenantAgentPolicy(t, a.Name).Describe())))
				}
			}
			if len(cfg.Tenants) == 0 {
				fmt.Fprintf(w, "\n  effective policy with agent %q:\n%s", a.Name, indent(indent(cfg.AgentPolicy(a.Name).Describe())))
			}
		}
	}
}

func tenantName(t *config.Tenant) string {
	if t == nil {
		return ""
	}
	return t.Name
}

func demoAgent(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("acpgate demo-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", os.Getenv("ACPGATE_DEMO_STATE_DIR"), "where sessions are kept (default: a folder in the temp dir)")
	delay := fs.Duration("chunk-delay", 15*time.Millisecond, "pause between streamed chunks (negative: none)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- demoagent.Run(ctx, os.Stdin, os.Stdout, demoagent.Options{
			StateDir:   *stateDir,
			ChunkDelay: *delay,
			Name:       "acpgate-demo-agent",
			Version:    buildVersion(),
			Stderr:     stderr,
		})
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		// A read of stdin cannot be interrupted: give Run a moment to
		// finish what it is writing, then exit regardless.
		select {
		case err = <-done:
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "demo-agent: %v\n", err)
		return 1
	}
	return 0
}

func indent(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if line != "" {
			b.WriteString("  " + line)
		}
	}
	if !strings.HasSuffix(b.String(), "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

// keygen writes a new session key: 32 random bytes as 64 hex characters.
func keygen(stdout, stderr io.Writer) int {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		fmt.Fprintf(stderr, "acpgate keygen: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, hex.EncodeToString(key))
	return 0
}

func superviseCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("acpgate supervise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grace := fs.Duration("grace", 5*time.Second, "time between SIGTERM and SIGKILL")
	parent := fs.Int("parent-pid", 0, "the gateway's pid (the supervisor refuses to start if its parent is another process)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	return supervise.Run(fs.Args(), *grace, *parent)
}

// auditUsage is acpgate audit's usage line.
const auditUsage = "usage: acpgate audit verify [--key FILE]... [--allow-gaps] [--allow-missing-head] FILE...   (a rotated trail's files oldest first)"

// keyFiles is a repeatable --key.
type keyFiles []string

func (k *keyFiles) String() string     { return strings.Join(*k, ",") }
func (k *keyFiles) Set(v string) error { *k = append(*k, v); return nil }

// auditCmd is acpgate audit verify: exit 0 when the trail holds together
// and is whole; 1 at the first broken line (a changed, removed or inserted
// line, a seq missing within one run, a MAC that does not match with
// --key); 3 when it holds together but is not whole: it has gaps (events
// the gateway lost, each reported), or it begins before the files given
// (the head missing), unless --allow-gaps or --allow-missing-head accept
// that; 4 (before 3) when it holds together but its lines carry MACs no
// --key was given for: a keyed trail verified without its keys is not
// verified.
func auditCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 || args[0] != "verify" {
		fmt.Fprintln(stderr, auditUsage)
		return 2
	}
	fs := flag.NewFlagSet("acpgate audit verify", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var keyPaths keyFiles
	fs.Var(&keyPaths, "key", "a MAC key file (audit.hmac_key_file); repeat it for a trail written under several keys")
	allowGaps := fs.Bool("allow-gaps", false, "exit 0 despite gaps (they are still reported)")
	allowHead := fs.Bool("allow-missing-head", false, "exit 0 when the first file does not begin the trail (a rotated trail's later files)")
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() == 0 {
		if err != nil {
			fmt.Fprintf(stderr, "acpgate audit verify: %v\n", err)
		}
		fmt.Fprintln(stderr, auditUsage)
		return 2
	}
	var keys [][]byte
	for _, p := range keyPaths {
		k, err := audit.ReadVerifyKey(p)
		if err != nil {
			fmt.Fprintf(stderr, "acpgate audit verify: %v\n", err)
			return 2
		}
		keys = append(keys, k)
	}
	files := fs.Args()
	rep, err := audit.Verify(files, keys)
	for _, g := range rep.Gaps {
		fmt.Fprintln(stdout, g)
	}
	if err != nil {
		fmt.Fprintf(stderr, "acpgate audit verify: %v\n", err)
		fmt.Fprintf(stderr, "%d lines intact before it\n", rep.Lines)
		return 1
	}
	plural := "s"
	if len(files) == 1 {
		plural = ""
	}
	macs := ""
	switch {
	case len(keys) > 0:
		macs = ", every MAC checked"
	case rep.Unchecked > 0:
		macs = fmt.Sprintf(", %d MACs not checked (no --key)", rep.Unchecked)
	}
	fmt.Fprintf(stdout, "%d lines intact in %d file%s%s\n", rep.Lines, len(files), plural, macs)
	if len(rep.Keys) > 0 {
		uses := make([]string, len(rep.Keys))
		for i, k := range rep.Keys {
			uses[i] = k.String()
		}
		fmt.Fprintf(stdout, "keys, in order: %s; the trail ends under key %s\n", strings.Join(uses, ", then "), rep.Keys[len(rep.Keys)-1].Kid)
	}
	code := 0
	if rep.Head != "" {
		fmt.Fprintln(stdout, rep.Head)
		if !*allowHead {
			fmt.Fprintln(stderr, "acpgate audit verify: the trail's head is missing (--allow-missing-head accepts it)")
			code = 3
		}
	}
	if len(rep.Gaps) > 0 && !*allowGaps {
		fmt.Fprintf(stderr, "acpgate audit verify: %d gaps: events the gateway lost (--allow-gaps accepts them)\n", len(rep.Gaps))
		code = 3
	}
	if rep.Unchecked > 0 {
		fmt.Fprintf(stderr, "acpgate audit verify: %d of %d lines carry a MAC that was not checked: the trail is keyed; "+
			"give its keys (--key FILE for each key it was written under)\n", rep.Unchecked, rep.Lines)
		code = 4
	}
	return code
}
