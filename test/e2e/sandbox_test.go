package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// The sandbox suite runs two tenants whose agent (the fake agent's
// _fake/host) acts on the host directly, as a real agent's own tools do,
// and tries every way out: other tenants' roots and homes, the gateway's
// secrets and environment, unlisted directories, links, signals, IPC.

// policyAllowFake lets clients call the fake agent's extension methods.
const policyAllowFake = "policy: {extensions: {allow: [\"_fake/*\"]}}\n"

// gatewaySecretEnv is set in the gateway's environment only.
const gatewaySecretEnv = "GATEWAY_ONLY_SECRET"

type hostAnswer struct {
	OK      bool     `json:"ok"`
	Data    string   `json:"data"`
	Entries []string `json:"entries"`
	Err     string   `json:"err"`
}

// host asks the client's agent to act on the host.
func host(t *testing.T, c *client, params map[string]any) hostAnswer {
	t.Helper()
	m := c.Call("_fake/host", params, 30*time.Second)
	if m.Error != nil {
		t.Fatalf("_fake/host %v: %s", params, m.Raw)
	}
	var a hostAnswer
	if err := json.Unmarshal(m.Result, &a); err != nil {
		t.Fatalf("_fake/host answer %s: %v", m.Result, err)
	}
	return a
}

// requireLandlock skips on a kernel without Landlock, saying so.
func requireLandlock(t *testing.T) int {
	t.Helper()
	abi, err := sandbox.Probe()
	if err != nil {
		t.Skipf("skipped: this kernel has no Landlock, so agents cannot be confined here: %v", err)
	}
	return abi
}

type sandboxEnv struct {
	*isoEnv
	g        *gateway
	cfgPath  string
	homes    string
	unlisted string
}

func startSandboxed(t *testing.T, extra string, env ...string) *sandboxEnv {
	t.Helper()
	e := &sandboxEnv{isoEnv: newIsoEnv(t)}
	// Something of each tenant's in its root, and a file nobody lists.
	for _, name := range tenantNames {
		writeFile(t, filepath.Join(e.roots[name], "secret.txt"), []byte(name+"'s secret"))
	}
	e.unlisted = filepath.Join(e.dir, "unlisted")
	if err := os.Mkdir(e.unlisted, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.unlisted, "file"), []byte("unlisted"))
	cfg := fakeAgentConfig(t, "") + e.config(e.keyFile, nil) + extra
	e.g = startGateway(t, gwOpts{config: cfg, env: append([]string{gatewaySecretEnv + "=hunter2"}, env...)})
	e.homes = filepath.Join(e.g.stateDir, "homes")
	e.cfgPath = e.g.Cmd.Args[slices.Index(e.g.Cmd.Args, "--config")+1]
	return e
}

// TestHostileSandbox: two tenants' agents work in their own root and home
// and try every way out.
func TestHostileSandbox(t *testing.T) {
	abi := requireLandlock(t)
	e := startSandboxed(t, policyAllowFake+"sandbox: {limits: {open_files: 256}}\n")
	g := e.g
	g.WaitLog(t, "agent sandbox on", "", "", 5*time.Second)

	clients := map[string]*client{}
	pids := map[string]int{}
	for _, name := range tenantNames {
		c := dialToken(t, g, e.tokens[name])
		c.newSession(vroot)
		clients[name] = c
		p := host(t, c, map[string]any{"op": "pid"})
		pids[name], _ = strconv.Atoi(p.Data)
	}
	if pids["acme"] == pids["globex"] || pids["acme"] == 0 {
		t.Fatalf("agent pids %v: the tenants must have agent processes of their own", pids)
	}
	if n := g.CountLogs("agent started", "sandbox", "landlock v"+strconv.Itoa(abi)); n < 2 {
		t.Errorf("%d agent starts logged with sandbox \"landlock v%d\", want at least 2", n, abi)
	}

	for _, name := range tenantNames {
		other := tenantNames[0]
		if name == other {
			other = tenantNames[1]
		}
		c := clients[name]
		home := filepath.Join(e.homes, name)
		realHome, _ := filepath.EvalSymlinks(home)
		otherHome := filepath.Join(e.homes, other)
		root, otherRoot := e.real[name], e.real[other]

		t.Run(name+"/works in its own root and home", func(t *testing.T) {
			st := host(t, c, map[string]any{"op": "status"})
			if st.Data != root && st.Data != vroot { // the gateway maps the root to the virtual one in agent output
				t.Errorf("working directory %q, want the tenant root %q (%s)", st.Data, root, vroot)
			}
			for _, want := range []string{"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
				"CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1"} {
				if !slices.Contains(st.Entries, want) {
					t.Errorf("status lacks %q: %v", want, st.Entries)
				}
			}
			for _, op := range []map[string]any{
				{"op": "write", "path": filepath.Join(root, "own.txt"), "data": "mine"},
				{"op": "read", "path": filepath.Join(root, "own.txt")},
				{"op": "read", "path": filepath.Join(root, "secret.txt")},
				{"op": "list", "path": root},
				{"op": "write", "path": filepath.Join(home, "note"), "data": "home"},
				{"op": "read", "path": filepath.Join(home, "note")},
				{"op": "write", "path": filepath.Join(home, "tmp", "scratch"), "data": "tmp"},
				{"op": "read", "path": "/etc/passwd"},
				{"op": "exec", "argv": []string{"/bin/sh", "-c", "echo ok > sub.txt && cat sub.txt && mkdir -p d && mv sub.txt d/"}},
			} {
				if a := host(t, c, op); !a.OK {
					t.Errorf("%v: %s", op, a.Err)
				}
			}
			if st, err := os.Stat(home); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("home %s: %v, mode %v; want 0700", home, err, st.Mode().Perm())
			}
		})

		t.Run(name+"/environment is its own", func(t *testing.T) {
			env := host(t, c, map[string]any{"op": "env"}).Entries
			for _, kv := range env {
				k, _, _ := strings.Cut(kv, "=")
				if k == gatewaySecretEnv || strings.HasPrefix(k, "ACPGATE_") {
					t.Errorf("the agent sees %s", kv)
				}
			}
			for _, want := range []string{"HOME=" + home, "TMPDIR=" + filepath.Join(home, "tmp"), "FAKE_MODE="} {
				if !slices.Contains(env, want) {
					t.Errorf("environment lacks %s: %v", want, env)
				}
			}
			if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
				t.Errorf("environment lacks PATH (agent.inherit_env): %v", env)
			}
			lim := host(t, c, map[string]any{"op": "read", "path": "/proc/self/limits"})
			if !strings.Contains(lim.Data, "Max open files            256                  256") {
				t.Errorf("sandbox.limits.open_files 256 not applied:\n%s", lim.Data)
			}
		})

		t.Run(name+"/cannot escape", func(t *testing.T) {
			gw := g.Cmd.Process.Pid
			denied := []struct {
				what string
				op   map[string]any
			}{
				{"the session key", map[string]any{"op": "read", "path": e.keyFile}},
				{"the config file", map[string]any{"op": "read", "path": e.cfgPath}},
				{"the other tenant's root", map[string]any{"op": "read", "path": filepath.Join(otherRoot, "secret.txt")}},
				{"a listing of the other tenant's root", map[string]any{"op": "list", "path": otherRoot}},
				{"a write into the other tenant's root", map[string]any{"op": "write", "path": filepath.Join(otherRoot, "planted"), "data": "x"}},
				{"the other tenant's home", map[string]any{"op": "list", "path": otherHome}},
				{"a write into the other tenant's home", map[string]any{"op": "write", "path": filepath.Join(otherHome, "planted"), "data": "x"}},
				{"the homes directory", map[string]any{"op": "list", "path": e.homes}},
				{"an unlisted directory", map[string]any{"op": "list", "path": e.unlisted}},
				{"a file in an unlisted directory", map[string]any{"op": "read", "path": filepath.Join(e.unlisted, "file")}},
				{"a write to /tmp", map[string]any{"op": "write", "path": filepath.Join(os.TempDir(), fmt.Sprintf("acpgate-escape-%d", gw)), "data": "x"}},
				{"/etc/shadow", map[string]any{"op": "read", "path": "/etc/shadow"}},
				{"the gateway's environment", map[string]any{"op": "read", "path": fmt.Sprintf("/proc/%d/environ", gw)}},
				{"the other tenant's agent's environment", map[string]any{"op": "read", "path": fmt.Sprintf("/proc/%d/environ", pids[other])}},
				{"the session key through a symlink in its root", map[string]any{"op": "symlink", "path": e.keyFile, "target": filepath.Join(root, "key-link")}},
				{"a hard link of the session key into its root", map[string]any{"op": "link", "path": e.keyFile, "target": filepath.Join(root, "key-hard")}},
				{"a hard link of the other tenant's file into its root", map[string]any{"op": "link", "path": filepath.Join(otherRoot, "secret.txt"), "target": filepath.Join(root, "stolen")}},
				{"a shell reading the session key", map[string]any{"op": "exec", "argv": []string{"/bin/cat", e.keyFile}}},
				{"a shell listing the other tenant's root", map[string]any{"op": "exec", "argv": []string{"/bin/ls", otherRoot}}},
			}
			if abi >= 6 {
				denied = append(denied,
					struct {
						what string
						op   map[string]any
					}{"a signal to the gateway", map[string]any{"op": "kill", "pid": gw}},
					struct {
						what string
						op   map[string]any
					}{"a signal to the other tenant's agent", map[string]any{"op": "kill", "pid": pids[other]}})
			}
			for _, d := range denied {
				a := host(t, c, d.op)
				if a.OK {
					t.Errorf("%s: allowed (%q)", d.what, a.Data[:min(len(a.Data), 80)])
				} else {
					t.Logf("%s: %s", d.what, a.Err)
				}
			}
			if _, err := os.Stat(filepath.Join(otherRoot, "planted")); err == nil {
				t.Errorf("a file was planted in %s", otherRoot)
			}
			_ = realHome
		})
	}

	t.Run("abstract UNIX sockets outside the agent's domain", func(t *testing.T) {
		if abi < 6 {
			t.Skipf("skipped: Landlock ABI %d does not scope abstract UNIX sockets (ABI 6 does)", abi)
		}
		name := fmt.Sprintf("acpgate-test-%d", os.Getpid())
		ln, err := net.Listen("unix", "@"+name)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go acceptAndClose(ln)
		if a := host(t, clients["acme"], map[string]any{"op": "abstract", "path": name}); a.OK {
			t.Errorf("the agent connected to the test's abstract socket @%s", name)
		} else {
			t.Logf("refused: %s", a.Err)
		}
	})
}

// TestSandboxUser: with the gateway running as root, sandbox.user names the
// account agents run as; their home is theirs.
func TestSandboxUser(t *testing.T) {
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("skipped: sandbox.user needs the gateway to run as root")
	}
	const uid = 65534
	env := newIsoEnv(t)
	for _, name := range tenantNames {
		if err := os.Chown(env.roots[name], uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	// The agents' user must be able to walk to its root and home, and to
	// its program.
	state := t.TempDir()
	for _, d := range []string{filepath.Dir(env.dir), env.dir, state, filepath.Dir(fakeAgentBin(t))} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, gwOpts{stateDir: state, config: fakeAgentConfig(t, "") + env.config(env.keyFile, nil) + policyAllowFake +
		fmt.Sprintf("sandbox: {user: \"%d:%d\"}\n", uid, uid)})
	c := dialToken(t, g, env.tokens["acme"])
	st := host(t, c, map[string]any{"op": "status"})
	if !slices.Contains(st.Entries, fmt.Sprintf("Uid: %d %d %d %d", uid, uid, uid, uid)) {
		t.Errorf("the agent does not run as %d: %v", uid, st.Entries)
	}
	home := filepath.Join(g.stateDir, "homes", "acme")
	for _, op := range []map[string]any{
		{"op": "write", "path": filepath.Join(env.real["acme"], "mine"), "data": "x"},
		{"op": "write", "path": filepath.Join(home, "mine"), "data": "x"},
	} {
		if a := host(t, c, op); !a.OK {
			t.Errorf("%v: %s", op, a.Err)
		}
	}
	if a := host(t, c, map[string]any{"op": "read", "path": env.keyFile}); a.OK {
		t.Errorf("the agent's user read the session key")
	}
}

// TestSandboxNetwork: with sandbox.network.restrict, only the listed TCP
// ports can be connected to.
func TestSandboxNetwork(t *testing.T) {
	abi := requireLandlock(t)
	if abi < 4 {
		t.Skipf("skipped: Landlock ABI %d has no TCP rules (ABI 4 does)", abi)
	}
	var lns [2]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go acceptAndClose(ln)
		lns[i] = ln
	}
	allowed, other := lns[0].Addr().String(), lns[1].Addr().String()
	port := lns[0].Addr().(*net.TCPAddr).Port
	e := startSandboxed(t, policyAllowFake+fmt.Sprintf("sandbox: {network: {restrict: true, connect_tcp: [%d]}}\n", port))
	c := dialToken(t, e.g, e.tokens["acme"])
	if a := host(t, c, map[string]any{"op": "dial", "path": allowed}); !a.OK {
		t.Errorf("connect to the listed port %s: %s", allowed, a.Err)
	}
	if a := host(t, c, map[string]any{"op": "dial", "path": other}); a.OK {
		t.Errorf("connected to the unlisted port %s", other)
	} else {
		t.Logf("unlisted port: %s", a.Err)
	}
	if a := host(t, c, map[string]any{"op": "dial", "path": e.g.Addr}); a.OK {
		t.Errorf("connected to the gateway's own port %s", e.g.Addr)
	}
}

// TestSandboxMemoryLimit: an agent past sandbox.limits.memory dies, and
// the gateway reports it like any crash: the request gets an error, the
// log says the agent exited, and a new process serves the next client.
func TestSandboxMemoryLimit(t *testing.T) {
	requireLandlock(t)
	// RLIMIT_DATA counts reserved writable memory, thread stacks too, so
	// the limit sits well above what the agent uses at rest, and above what
	// a -race supervisor reserves (over 400 MiB: below that, its next
	// allocation after the limit fails, more likely the bigger the binary).
	e := startSandboxed(t, policyAllowFake+"sandbox: {limits: {memory: 768MiB}}\n")
	c := dialToken(t, e.g, e.tokens["acme"])
	m := c.Call("_fake/host", map[string]any{"op": "alloc", "mib": 1024}, 30*time.Second)
	if m.Error == nil {
		t.Fatalf("1 GiB allocated under a 768 MiB limit: %s", m.Raw)
	}
	t.Logf("answer: %s", m.Raw)
	e.g.WaitLog(t, "agent exited", "", "", 10*time.Second)
	c2 := dialToken(t, e.g, e.tokens["acme"])
	if a := host(t, c2, map[string]any{"op": "alloc", "mib": 8}); !a.OK {
		t.Errorf("a small allocation after the crash failed: %s", a.Err)
	}
}

// TestSandboxCgroup runs agents in a delegated cgroup v2 with memory and
// process limits, where the machine has one.
func TestSandboxCgroup(t *testing.T) {
	requireLandlock(t)
	parent := os.Getenv("ACPGATE_E2E_CGROUP")
	if parent == "" {
		for _, d := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.controllers"))
			if err == nil && strings.Contains(string(b), "memory") && strings.Contains(string(b), "pids") {
				parent = filepath.Join(d, fmt.Sprintf("acpgate-e2e-%d", os.Getpid()))
				break
			}
		}
	}
	if parent == "" {
		t.Skip("skipped: no cgroup v2 with the memory and pids controllers here (set ACPGATE_E2E_CGROUP to a delegated one)")
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Skipf("skipped: cannot create a cgroup under %s: %v", filepath.Dir(parent), err)
	}
	t.Cleanup(func() { os.Remove(parent) })
	// memory also sets RLIMIT_DATA: above a -race supervisor's reservation,
	// as in TestSandboxMemoryLimit.
	e := startSandboxed(t, policyAllowFake+fmt.Sprintf("sandbox: {cgroup: %q, limits: {memory: 768MiB, processes: 64}}\n", parent))
	c := dialToken(t, e.g, e.tokens["acme"])
	cg := host(t, c, map[string]any{"op": "read", "path": "/proc/self/cgroup"})
	if !strings.Contains(cg.Data, "agent-acme-") {
		t.Errorf("the agent is not in its own cgroup: %q", cg.Data)
	}
	m := c.Call("_fake/host", map[string]any{"op": "alloc", "mib": 1024}, 30*time.Second)
	if m.Error == nil {
		t.Fatalf("1 GiB allocated under a 768 MiB limit: %s", m.Raw)
	}
	e.g.WaitLog(t, "agent exited", "", "", 10*time.Second)
}

// TestSandboxRefusesExposingConfigs: check-config and start-up refuse a
// configuration whose secrets an agent could read, naming the file.
func TestSandboxRefusesExposingConfigs(t *testing.T) {
	e := newIsoEnv(t)
	e.withJWT(t)
	homes := filepath.Join(e.dir, "homes")
	inRoot := filepath.Join(e.roots["acme"], "session.key")
	writeFile(t, inRoot, []byte(harness.RandomHex(t, 32)))
	shared := filepath.Join(e.dir, "shared")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, cfg, want string
	}{
		{"session key in a tenant root", e.config(inRoot, nil) + fmt.Sprintf("sandbox: {home: %q}\n", homes),
			"session_key_file " + inRoot + " is readable by tenant \"acme\"'s agents"},
		{"secrets in a read_only path", e.config(e.keyFile, nil) + fmt.Sprintf("sandbox: {home: %q, read_only: [%q]}\n", homes, e.dir),
			"is readable by"},
		{"jwks under the homes", strings.Replace(e.config(e.keyFile, nil), e.jwksFile, filepath.Join(homes, "jwks.json"), 1) +
			fmt.Sprintf("sandbox: {home: %q}\n", homes), "auth.jwt.jwks_file " + filepath.Join(homes, "jwks.json")},
		{"shared isolation with two tenants", e.config(e.keyFile, nil) + fmt.Sprintf("sandbox: {home: %q}\npool: {isolation: shared}\n", homes),
			"one agent process cannot be confined to two tenants' roots"},
		{"a tenant path holding the other's root", e.config(e.keyFile, nil) + fmt.Sprintf("sandbox: {home: %q, read_write: [%q]}\n", homes, e.roots["globex"]),
			"globex overlaps " + e.roots["globex"] + ", which tenant \"acme\"'s agents may use"},
		{"the homes inside a tenant root", e.config(e.keyFile, nil) + fmt.Sprintf("sandbox: {home: %q}\n", filepath.Join(e.roots["acme"], "homes")),
			"overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "jwks") {
				if err := os.MkdirAll(homes, 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(homes, "jwks.json"), mustRead(t, e.jwksFile))
			}
			cfg := strings.Replace(tc.cfg, "pool: {min_idle: 1}\n", "", 1)
			path := filepath.Join(t.TempDir(), "acpgate.yaml")
			writeFile(t, path, []byte(cfg))
			for _, args := range [][]string{{"check-config", "--config", path}, {"serve", "--listen", "127.0.0.1:0", "--config", path}} {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
				cancel()
				if err == nil {
					t.Fatalf("%s accepted the configuration:\n%s", args[0], out)
				}
				if !strings.Contains(string(out), tc.want) {
					t.Errorf("%s: output lacks %q:\n%s", args[0], tc.want, out)
				}
			}
		})
	}
	t.Run("the config file itself in a read_only path", func(t *testing.T) {
		dir := filepath.Join(shared, "conf")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "acpgate.yaml")
		writeFile(t, path, []byte(e.config(e.keyFile, nil)+fmt.Sprintf("sandbox: {home: %q, read_only: [%q]}\n", homes, shared)))
		out, err := exec.Command(binPath, "check-config", "--config", path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "the configuration file "+path+" is readable by") {
			t.Fatalf("check-config: %v\n%s", err, out)
		}
	})
}

// acceptAndClose accepts and closes connections until ln closes.
func acceptAndClose(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSandboxWithoutLandlock forces the Landlock probe to fail: mode
// required refuses to start; mode auto starts, logs an error and stays
// ready, with the environment still scrubbed.
func TestSandboxWithoutLandlock(t *testing.T) {
	force := sandbox.ForceNoLandlockEnv + "=1"
	t.Run("required refuses to start", func(t *testing.T) {
		e := newIsoEnv(t)
		path := filepath.Join(t.TempDir(), "acpgate.yaml")
		writeFile(t, path, []byte(e.config(e.keyFile, nil)+fmt.Sprintf("sandbox: {mode: required, home: %q}\n", filepath.Join(e.dir, "homes"))))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binPath, "serve", "--listen", "127.0.0.1:0", "--config", path)
		cmd.Env = append(gatewayEnv(), force)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("the gateway started:\n%s", out)
		}
		if !strings.Contains(string(out), "sandbox.mode is required but the agents cannot be confined") {
			t.Errorf("no clear message:\n%s", out)
		}
	})
	t.Run("auto starts with an error and stays ready", func(t *testing.T) {
		e := startSandboxed(t, policyAllowFake, force)
		e.g.WaitLog(t, "agents run WITHOUT Landlock", "", "", 5*time.Second)
		if n := e.g.CountLogs("agents run WITHOUT Landlock", "level", "ERROR"); n != 1 {
			t.Errorf("%d error-level lines about the missing Landlock, want 1", n)
		}
		hc := &http.Client{Timeout: 5 * time.Second}
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := hc.Get("http://" + e.g.Addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz not ready: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c := dialToken(t, e.g, e.tokens["acme"])
		env := host(t, c, map[string]any{"op": "env"}).Entries
		if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, gatewaySecretEnv+"=") }) {
			t.Errorf("without Landlock the agent still must not see the gateway's environment: %v", env)
		}
		st := host(t, c, map[string]any{"op": "status"})
		if !slices.Contains(st.Entries, "CapEff: 0000000000000000") || !slices.Contains(st.Entries, "NoNewPrivs: 1") {
			t.Errorf("without Landlock the agent still runs without privileges: %v", st.Entries)
		}
		if n := e.g.CountLogs("agent started", "sandbox", "no landlock"); n < 1 {
			t.Errorf("agent start not logged with sandbox \"no landlock\"")
		}
	})
}
