package ops

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// The Kubernetes manifests themselves are decoded into the API types by the
// separate module in deploy/validate; these tests check the deploy/ files
// against the real binary.

func deployFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configMapConfig returns acpgate.yaml from deploy/k8s/configmap.yaml.
func configMapConfig(t *testing.T) []byte {
	t.Helper()
	var cm struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(deployFile(t, "k8s/configmap.yaml"), &cm); err != nil {
		t.Fatal(err)
	}
	cfg, ok := cm.Data["acpgate.yaml"]
	if cm.Kind != "ConfigMap" || !ok {
		t.Fatalf("deploy/k8s/configmap.yaml: no ConfigMap with acpgate.yaml")
	}
	return []byte(cfg)
}

// loopbackCluster points the cluster: block of the configuration at path,
// if it has one, at a Redis of the test's and a loopback listener (the
// Deployment gives each pod its name and address through ACPGATE_CLUSTER_*
// variables: TestDeploymentEnvAreSettings).
func loopbackCluster(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := yaml.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	cl, ok := top["cluster"].(map[string]any)
	if !ok {
		return
	}
	internal := harness.FreeAddr(t)
	cl["name"], cl["store"], cl["listen"], cl["advertise"] = "ops", redistest.Start(t).URL(0), internal, "http://"+internal
	out, err := yaml.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, string(out))
}

// TestDeploymentEnvAreSettings: every ACPGATE_* variable deployment.yaml
// sets is a setting the gateway applies (config.EnvNames); one it does not
// know is only warned about at start, and its value silently lost (the
// Deployment names each replica and gives it its address that way).
func TestDeploymentEnvAreSettings(t *testing.T) {
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Env []struct {
							Name string `yaml:"name"`
						} `yaml:"env"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(deployFile(t, "k8s/deployment.yaml"), &dep); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range config.EnvNames() {
		known[n] = true
	}
	n := 0
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if !strings.HasPrefix(e.Name, config.EnvPrefix) {
				continue
			}
			n++
			if !known[e.Name] {
				t.Errorf("deploy/k8s/deployment.yaml sets %s, which is not a setting: the gateway warns and ignores it", e.Name)
			}
		}
	}
	t.Logf("%d ACPGATE_* variables in deployment.yaml", n)
}

// relocate moves every host path of a configuration under dir and creates
// what the gateway checks at start (tenant roots, the agent's directory, a
// valid session key). It returns the rewritten file's path and the paths it
// moved.
func relocate(t *testing.T, name string, data []byte, dir string) (string, []string) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var moved []string
	move := func(n *yaml.Node, kind string) {
		if n.Kind != yaml.ScalarNode || !strings.HasPrefix(n.Value, "/") {
			return
		}
		moved = append(moved, n.Value)
		n.Value = filepath.Join(dir, n.Value)
		switch kind {
		case "dir":
			if err := os.MkdirAll(n.Value, 0o755); err != nil {
				t.Fatal(err)
			}
		case "key":
			if err := os.MkdirAll(filepath.Dir(n.Value), 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, n.Value, harness.RandomHex(t, 32)+"\n")
		}
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i].Value, n.Content[i+1]
				switch k {
				case "root", "dir":
					move(v, "dir")
				case "session_key_file":
					move(v, "key")
				case "session_key_files":
					for _, c := range v.Content {
						move(c, "key")
					}
				case "jwks_file", "hs256_secret_file":
					move(v, "file")
				default:
					walk(v)
				}
			}
		}
	}
	walk(&doc)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, filepath.Base(name))
	writeFile(t, path, string(out))
	return path, moved
}

func checkConfig(t *testing.T, path string) (int, string) {
	t.Helper()
	out, err := exec.Command(binPath, "check-config", "--config", path).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestDeployConfigsPassCheckConfig runs `acpgate check-config` on the
// example configuration and on the ConfigMap's. As shipped they name host
// paths (tenant roots, the session key) that exist only where they are
// deployed: the only problems allowed are those, and with the paths moved
// under a temporary directory and created, the files must pass.
func TestDeployConfigsPassCheckConfig(t *testing.T) {
	for name, data := range map[string][]byte{
		"acpgate.example.yaml":            deployFile(t, "acpgate.example.yaml"),
		"k8s/configmap.yaml:acpgate.yaml": configMapConfig(t),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			asShipped := filepath.Join(dir, "as-shipped.yaml")
			writeFile(t, asShipped, string(data))
			code, out := checkConfig(t, asShipped)
			if code != 0 && code != 1 {
				t.Fatalf("check-config as shipped: exit %d\n%s", code, out)
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
				if !strings.Contains(line, "is not an existing directory") && !strings.Contains(line, "session key") {
					t.Errorf("check-config as shipped: a problem other than a missing host path: %s", line)
				}
			}
			path, moved := relocate(t, name, data, filepath.Join(dir, "host"))
			code, out = checkConfig(t, path)
			t.Logf("relocated %v; check-config: exit %d: %s", moved, code, strings.TrimSpace(out))
			if code != 0 {
				t.Errorf("check-config %s: exit %d\n%s", name, code, out)
			}
		})
	}
}

type probeSpec struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// TestDeploymentAgainstGateway runs the gateway with the ConfigMap's
// configuration (paths relocated, listeners on loopback through flags and
// ACPGATE_* variables) and checks the Deployment's probes, the
// ServiceMonitor's path and the Ingress' exposure against it.
func TestDeploymentAgainstGateway(t *testing.T) {
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name           string     `yaml:"name"`
						Args           []string   `yaml:"args"`
						LivenessProbe  *probeSpec `yaml:"livenessProbe"`
						ReadinessProbe *probeSpec `yaml:"readinessProbe"`
						StartupProbe   *probeSpec `yaml:"startupProbe"`
						Ports          []struct {
							Name string `yaml:"name"`
							Port int    `yaml:"containerPort"`
						} `yaml:"ports"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(deployFile(t, "k8s/deployment.yaml"), &dep); err != nil {
		t.Fatal(err)
	}
	var sm struct {
		Spec struct {
			Endpoints []struct {
				Port string `yaml:"port"`
				Path string `yaml:"path"`
			} `yaml:"endpoints"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(deployFile(t, "k8s/servicemonitor.yaml"), &sm); err != nil {
		t.Fatal(err)
	}
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("want one container, have %d", len(cs))
	}
	c := cs[0]
	// The container's args run the real binary's flag parser.
	if i := slices.Index(c.Args, "--config"); i < 0 || c.Args[0] != "serve" {
		t.Fatalf("container args %v: want serve --config FILE", c.Args)
	}

	dir := t.TempDir()
	path, _ := relocate(t, "acpgate.yaml", configMapConfig(t), dir)
	env := []string{"ACPGATE_OBSERVABILITY_METRICS_LISTEN=127.0.0.1:0"}
	loopbackCluster(t, path)
	if _, err := sandbox.Probe(); err != nil {
		// The ConfigMap requires the sandbox; a node without Landlock
		// refuses to start, which test/e2e covers. The probes still run.
		t.Logf("no Landlock here (%v): running the ConfigMap's configuration with sandbox.mode auto", err)
		env = append(env, "ACPGATE_SANDBOX_MODE=auto")
	}
	g := startGateway(t, gwOpts{configPath: path, env: env})
	if g.MetricsAddr() == "" {
		t.Fatal("the ConfigMap's configuration serves no separate metrics listener")
	}
	probes := map[string]*probeSpec{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe}
	for name, p := range probes {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s probe is not httpGet", name)
			continue
		}
		if p.HTTPGet.Port != "http" {
			t.Errorf("%s probe: port %v, want the http port (the main listener)", name, p.HTTPGet.Port)
		}
		code, body, err := httpGet("http://" + g.Addr + p.HTTPGet.Path)
		t.Logf("%s probe GET %s -> %d %q", name, p.HTTPGet.Path, code, strings.TrimSpace(body))
		if err != nil || code != http.StatusOK {
			t.Errorf("%s probe GET %s: %d %v", name, p.HTTPGet.Path, code, err)
		}
	}
	for _, ep := range sm.Spec.Endpoints {
		if ep.Port != "metrics" {
			t.Errorf("ServiceMonitor scrapes port %q, want metrics", ep.Port)
		}
		code, body, err := httpGet("http://" + g.MetricsAddr() + ep.Path)
		if err != nil || code != http.StatusOK || !strings.Contains(body, "# HELP acpgate_ready") {
			t.Errorf("ServiceMonitor path %s on metrics_listen: %d %v", ep.Path, code, err)
		}
	}
	// The Ingress routes the http port: /metrics must not be there.
	if code, body, _ := httpGet("http://" + g.Addr + "/metrics"); strings.Contains(body, "acpgate_") {
		t.Errorf("/metrics is served on the main listener (%d) although metrics_listen is set", code)
	}
}

// unit is a parsed systemd unit: section -> key -> values.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, data []byte) unit {
	t.Helper()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("unit: bad line %q", line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// TestSystemdUnit checks deploy/systemd/acpgate.service with
// systemd-analyze verify (with ExecStart pointing at the built binary) and
// against the example configuration it runs.
func TestSystemdUnit(t *testing.T) {
	data := deployFile(t, "systemd/acpgate.service")
	u := parseUnit(t, data)
	svc := "Service"

	// Hardening the deployment relies on.
	for k, want := range map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"CapabilityBoundingSet": "", "AmbientCapabilities": "", "KillMode": "mixed", "DynamicUser": "yes",
		"ExecReload": "/bin/kill -HUP $MAINPID",
	} {
		if got, ok := u[svc][k]; !ok || got[len(got)-1] != want {
			t.Errorf("%s=%v, want %q", k, got, want)
		}
	}

	// The unit runs the example configuration: its stop timeout must
	// outlast the gateway's own shutdown bound, its state directories must
	// hold the tenant roots, its credential the session key.
	var cfg struct {
		ShutdownGrace string `yaml:"shutdown_grace"`
		Agent         struct {
			StopGrace string `yaml:"stop_grace"`
			Dir       string `yaml:"dir"`
		} `yaml:"agent"`
		Tenants []struct {
			Root string `yaml:"root"`
		} `yaml:"tenants"`
		SessionKeyFile string `yaml:"session_key_file"`
	}
	if err := yaml.Unmarshal(deployFile(t, "acpgate.example.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(u.get(svc, "ExecStart"), "--config /etc/acpgate/acpgate.yaml") {
		t.Errorf("ExecStart %q does not run /etc/acpgate/acpgate.yaml", u.get(svc, "ExecStart"))
	}
	grace, err1 := time.ParseDuration(cfg.ShutdownGrace)
	stop, err2 := time.ParseDuration(cfg.Agent.StopGrace)
	timeout, err3 := time.ParseDuration(u.get(svc, "TimeoutStopSec"))
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("durations: %v %v %v", err1, err2, err3)
	}
	if bound := grace + stop + 5*time.Second; timeout <= bound {
		t.Errorf("TimeoutStopSec=%s must exceed shutdown_grace + stop_grace + 5s = %s", timeout, bound)
	}
	stateDirs := strings.Fields(u.get(svc, "StateDirectory"))
	covered := func(p string) bool {
		for _, d := range stateDirs {
			if p == "/var/lib/"+d {
				return true
			}
		}
		return false
	}
	for _, tn := range cfg.Tenants {
		if !covered(tn.Root) {
			t.Errorf("tenant root %s is not created by StateDirectory=%v (the gateway refuses a missing root)", tn.Root, stateDirs)
		}
	}
	if cfg.Agent.Dir != "" && !covered(cfg.Agent.Dir) {
		t.Errorf("agent.dir %s is not a StateDirectory", cfg.Agent.Dir)
	}
	for _, env := range u[svc]["Environment"] {
		if v, ok := strings.CutPrefix(env, "ACPGATE_DEMO_STATE_DIR="); ok && !covered(v) {
			t.Errorf("ACPGATE_DEMO_STATE_DIR=%s is not a StateDirectory (ProtectSystem=strict makes the rest read-only)", v)
		}
	}
	cred, _, _ := strings.Cut(u.get(svc, "LoadCredential"), ":")
	if cfg.SessionKeyFile != "/run/credentials/acpgate.service/"+cred {
		t.Errorf("session_key_file %s is not the LoadCredential %q", cfg.SessionKeyFile, cred)
	}

	// systemd's own parser, with the binary where the unit expects it.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed; skipping systemd-analyze verify")
	}
	dir := t.TempDir()
	unitPath := filepath.Join(dir, "acpgate.service")
	writeFile(t, unitPath, strings.ReplaceAll(string(data), "/usr/local/bin/acpgate", binPath))
	cmd := exec.Command(analyze, "verify", unitPath)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	t.Logf("systemd-analyze verify: %v %q", err, out)
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDockerfile reads deploy/Dockerfile (Docker cannot run here) and checks
// what the other deployment files depend on.
func TestDockerfile(t *testing.T) {
	data := string(deployFile(t, "Dockerfile"))
	type stage struct {
		from, name string
		lines      []string
	}
	var stages []*stage
	args := map[string]string{}
	// Join continuation lines, drop comments.
	var instrs []string
	cur := ""
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur == "") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur += s + " "
			continue
		}
		instrs = append(instrs, cur+trimmed)
		cur = ""
	}
	for _, in := range instrs {
		f := strings.Fields(in)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "ARG":
			if k, v, ok := strings.Cut(f[1], "="); ok && len(stages) == 0 {
				args[k] = v
			}
		case "FROM":
			s := &stage{from: f[1]}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				s.name = f[3]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, in)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, have %d stages", len(stages))
	}
	// The builder's Go is the module's.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil || stages[0].from != "golang:${GO_VERSION}" || args["GO_VERSION"] != string(m[1]) {
		t.Errorf("builder FROM %s with GO_VERSION=%s; go.mod wants go %s", stages[0].from, args["GO_VERSION"], m[1])
	}
	build := strings.Join(stages[0].lines, "\n")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "./cmd/acpgate"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage lacks %q", want)
		}
	}
	if src, err := os.ReadFile(filepath.Join(repoRoot, "cmd", "acpgate", "main.go")); err != nil || !strings.Contains(string(src), "var version = ") {
		t.Errorf("cmd/acpgate has no `var version` for -X main.version: %v", err)
	}
	var depArgs struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args []string `yaml:"args"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(deployFile(t, "k8s/deployment.yaml"), &depArgs); err != nil {
		t.Fatal(err)
	}
	for _, s := range stages[1:] {
		var user, entry, cmd string
		var copied []string
		for _, l := range s.lines {
			f := strings.Fields(l)
			switch strings.ToUpper(f[0]) {
			case "USER":
				user = f[1]
			case "ENTRYPOINT":
				entry = strings.TrimSpace(strings.TrimPrefix(l, f[0]))
			case "CMD":
				cmd = strings.TrimSpace(strings.TrimPrefix(l, f[0]))
			case "COPY":
				copied = append(copied, f[len(f)-1])
			}
		}
		where := "stage FROM " + s.from
		uid, _, _ := strings.Cut(user, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("%s: USER %q must be a numeric non-root uid (runAsNonRoot checks it)", where, user)
		}
		if len(copied) == 0 || entry != fmt.Sprintf("[%q]", copied[len(copied)-1]) {
			t.Errorf("%s: ENTRYPOINT %s is not the copied binary %v", where, entry, copied)
		}
		if cs := depArgs.Spec.Template.Spec.Containers; len(cs) == 1 {
			want := `["` + strings.Join(cs[0].Args, `", "`) + `"]`
			if cmd != want {
				t.Errorf("%s: CMD %s differs from the Deployment's args %s", where, cmd, want)
			}
		}
	}
	last := stages[len(stages)-1]
	if !strings.Contains(last.from, "distroless/static") || !strings.HasSuffix(last.from, ":nonroot") {
		t.Errorf("the default (last) stage is FROM %s, want distroless/static:nonroot", last.from)
	}
	if !slices.ContainsFunc(stages, func(s *stage) bool { return strings.HasPrefix(s.from, "node:") }) {
		t.Error("no node-based variant for npm agents")
	}
}
