package ops

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

const promtool = "/usr/bin/promtool"

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// tenant is one tenant of a test configuration.
type tenant struct {
	name   string
	tokens []string
	root   string
	extra  string // more YAML keys for the tenant, e.g. "max_sessions: 1"
}

// tenantsYAML renders a tenants: section and a session key.
func tenantsYAML(t *testing.T, keyDir string, ts ...tenant) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, tn := range ts {
		fmt.Fprintf(&b, "  - name: %s\n    root: %s\n    tokens_sha256:\n", tn.name, tn.root)
		for _, tok := range tn.tokens {
			fmt.Fprintf(&b, "      - %q\n", sha(tok))
		}
		if tn.extra != "" {
			fmt.Fprintf(&b, "    %s\n", tn.extra)
		}
	}
	key := filepath.Join(keyDir, "session.key")
	if _, err := os.Stat(key); err != nil {
		writeFile(t, key, harness.RandomHex(t, 32)+"\n")
	}
	fmt.Fprintf(&b, "session_key_file: %s\n", key)
	return b.String()
}

// families parses the text exposition format: every family named by a
// # HELP or # TYPE line (with its type), and every sample name.
func families(text string) (types map[string]string, samples map[string]bool) {
	types, samples = map[string]string{}, map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line)
			if len(f) >= 4 {
				types[f[2]] = f[3]
			}
		case strings.HasPrefix(line, "# HELP "):
			if f := strings.Fields(line); len(f) >= 3 {
				if _, ok := types[f[2]]; !ok {
					types[f[2]] = "unknown"
				}
			}
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			name := line
			if i := strings.IndexAny(line, "{ "); i >= 0 {
				name = line[:i]
			}
			samples[name] = true
		}
	}
	return types, samples
}

// declaredMetrics lists the metric names the gateway's source registers
// (gateway/metrics.go, proxy/metrics/, gateway/cluster/: those only in
// cluster mode). A labelled family with no series yet is absent from
// /metrics altogether (client_golang writes no # HELP for an empty
// vector), so this is the fallback for those.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(acpgate_[a-z0-9_]+)"`)
	out := map[string]bool{}
	for _, f := range []string{"gateway/metrics.go", "gateway/audit.go", "proxy/metrics/metrics.go", "proxy/metrics/live.go", "budget/metrics.go", "gateway/cluster/metrics.go"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d metric declarations in the source: %v", len(out), out)
	}
	return out
}

var (
	quoted  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	metricP = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:$])((?:acpgate|go|process)_[a-zA-Z0-9_:]*)`)
)

// promqlMetrics returns the metric names in a PromQL expression (label
// values and strings removed first).
func promqlMetrics(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`)
	var out []string
	for _, m := range metricP.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	return out
}

// exported is what a running gateway exports, for name checks.
type exported struct {
	types    map[string]string
	samples  map[string]bool
	declared map[string]bool
}

// check says whether a PromQL metric name is exported: a sample name, a
// family, or a histogram/summary series of one; "declared" when only the
// source declares it (a labelled family with no series in this run).
func (e exported) check(name string) (ok bool, how string) {
	if e.samples[name] {
		return true, "sample"
	}
	if _, ok := e.types[name]; ok {
		return true, "family"
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if typ := e.types[base]; typ == "histogram" || (typ == "summary" && suf != "_bucket") {
				return true, "family"
			}
			if e.declared[base] {
				return true, "declared"
			}
		}
	}
	if e.declared[name] {
		return true, "declared"
	}
	return false, ""
}

// TestPromtoolCheckRules lints the alert rules and runs their unit tests.
func TestPromtoolCheckRules(t *testing.T) {
	pt := requireTool(t, promtool)
	dir := filepath.Join(repoRoot, "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "acpgate-rules.yaml"},
		{"test", "rules", "acpgate-rules.test.yaml"},
	} {
		cmd := exec.Command(pt, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Errorf("promtool %s: %v", strings.Join(args, " "), err)
		}
	}
}

// metricsGateway runs a gateway with two tenants, drives traffic through
// it so that the labelled families get series (connections, sessions,
// messages, a policy denial, auth failures, a reload), and returns its
// /metrics text.
func metricsGateway(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	rootA, rootB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{rootA, rootB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tokA := "alpha-" + harness.RandomHex(t, 16)
	cfg := "pool:\n  idle_timeout: 1s\n" + tenantsYAML(t, dir,
		tenant{name: "alpha", tokens: []string{tokA}, root: rootA, extra: "max_sessions: 1"},
		tenant{name: "beta", tokens: []string{"beta-" + harness.RandomHex(t, 16)}, root: rootB})
	g := startGateway(t, gwOpts{config: cfg})

	// Auth failures: no token, a wrong token.
	for _, tok := range []string{"", "wrong-token"} {
		if c, resp, err := dial(t, g.Addr, tok); err == nil {
			c.Close()
			t.Fatalf("dial with token %q was accepted", tok)
		} else if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("dial with token %q: %v, want 401", tok, err)
		}
	}
	// Prompts, and a session over the tenant's quota (a policy denial).
	c := mustDial(t, g.Addr, tokA)
	c.initialize()
	sid := c.NewSession(rootA)
	for i := 0; i < 3; i++ {
		if reason, text := c.prompt(sid, "hello"); reason != "end_turn" || text != "You said: hello" {
			t.Fatalf("prompt: %q %q", reason, text)
		}
	}
	m := c.Await(c.Request("session/new", map[string]any{"cwd": rootA, "mcpServers": []any{}}), 30*time.Second, nil)
	if m.Error == nil {
		t.Fatalf("a second session/new over max_sessions 1 succeeded: %s", m.Raw)
	}
	c.Close()
	// A successful reload.
	if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	g.WaitLogs(t, "configuration reloaded", 1, 10*time.Second)

	// Wait for the closed connection and the idle tenant process to show.
	deadline := time.Now().Add(15 * time.Second)
	var text string
	for {
		text = g.metrics(t)
		if metricscrape.Sample(text, "acpgate_connections_total", `agent="default",reason="client_closed",tenant="alpha",transport="websocket"`) >= 1 &&
			strings.Contains(text, "acpgate_agent_exits_total{") {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("metrics after traffic lack a closed connection or an agent exit:\n%s", text)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return text
}

func TestExportedMetrics(t *testing.T) {
	text := metricsGateway(t)
	types, samples := families(text)
	e := exported{types: types, samples: samples, declared: declaredMetrics(t)}
	var acp []string
	for name := range types {
		if strings.HasPrefix(name, "acpgate_") {
			acp = append(acp, name)
		}
	}
	sort.Strings(acp)
	t.Logf("acpgate families with series after traffic (%d): %s", len(acp), strings.Join(acp, " "))
	var missing []string
	for name := range e.declared {
		if _, ok := types[name]; !ok {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	t.Logf("declared but without series in this run: %v", missing)

	t.Run("promtool check metrics", func(t *testing.T) {
		pt := requireTool(t, promtool)
		cmd := exec.Command(pt, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		out, err := cmd.CombinedOutput()
		t.Logf("promtool check metrics: %q", out)
		if err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	})

	t.Run("grafana dashboard", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "acpgate.json"))
		if err != nil {
			t.Fatal(err)
		}
		var dash map[string]any
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatalf("acpgate.json: %v", err)
		}
		exprs := dashboardQueries(t, dash)
		if len(exprs) < 20 {
			t.Fatalf("only %d queries in the dashboard", len(exprs))
		}
		used := checkNames(t, e, exprs)
		var notShown []string
		for name := range e.declared {
			if !used[name] {
				notShown = append(notShown, name)
			}
		}
		sort.Strings(notShown)
		if len(notShown) > 0 {
			t.Logf("metrics the dashboard does not show: %v", notShown)
		}
	})

	t.Run("alert rules", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "acpgate-rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var rules struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(b, &rules); err != nil {
			t.Fatal(err)
		}
		exprs := map[string]string{}
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				exprs[g.Name+"/"+r.Alert] = r.Expr
			}
		}
		if len(exprs) < 8 {
			t.Fatalf("only %d rules", len(exprs))
		}
		checkNames(t, e, exprs)
	})
}

// checkNames fails for every metric name in exprs that the gateway does
// not export, and returns the base names used.
func checkNames(t *testing.T, e exported, exprs map[string]string) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	viaSource := map[string]bool{}
	for where, expr := range exprs {
		names := promqlMetrics(expr)
		for _, n := range names {
			ok, how := e.check(n)
			if !ok {
				t.Errorf("%s: %s is not a metric the gateway exports (expr %q)", where, n, expr)
				continue
			}
			if how == "declared" {
				viaSource[n] = true
			}
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, cut := strings.CutSuffix(n, suf); cut && (e.types[b] != "" || e.declared[b]) {
					base = b
				}
			}
			used[base] = true
		}
	}
	if len(viaSource) > 0 {
		t.Logf("names checked against the source's declarations (no series in this run): %v", keys(viaSource))
	}
	return used
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// dashboardQueries returns every PromQL query of a Grafana dashboard:
// panel targets and templating variable queries, keyed by where they are.
func dashboardQueries(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	panels, _ := dash["panels"].([]any)
	ids := map[float64]bool{}
	for _, p := range panels {
		p := p.(map[string]any)
		title, _ := p["title"].(string)
		if id, ok := p["id"].(float64); !ok || ids[id] {
			t.Errorf("panel %q: missing or duplicate id", title)
		} else {
			ids[id] = true
		}
		if _, ok := p["gridPos"].(map[string]any); !ok {
			t.Errorf("panel %q: no gridPos", title)
		}
		if p["type"] == "row" {
			continue
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		for i, tg := range targets {
			expr, _ := tg.(map[string]any)["expr"].(string)
			if strings.TrimSpace(expr) == "" {
				t.Errorf("panel %q target %d: empty expr", title, i)
			}
			out[fmt.Sprintf("panel %q target %d", title, i)] = expr
		}
	}
	tmpl, _ := dash["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	for _, v := range vars {
		v := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		switch q := v["query"].(type) {
		case string:
			out[fmt.Sprintf("variable %v", v["name"])] = q
		case map[string]any:
			s, _ := q["query"].(string)
			out[fmt.Sprintf("variable %v", v["name"])] = s
		}
	}
	return out
}

// TestPromQLNameExtraction pins the name extraction the checks rely on.
func TestPromQLNameExtraction(t *testing.T) {
	got := promqlMetrics(`histogram_quantile(0.99, sum by (le) (rate(acpgate_request_duration_seconds_bucket{method!="acpgate_fake", job=~"$job"}[$__rate_interval]))) / go_goroutines + process_resident_memory_bytes`)
	want := []string{"acpgate_request_duration_seconds_bucket", "go_goroutines", "process_resident_memory_bytes"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got %v, want %v", got, want)
	}
	e := exported{types: map[string]string{"acpgate_x_seconds": "histogram"}, samples: map[string]bool{}, declared: map[string]bool{"acpgate_y_total": true}}
	for name, want := range map[string]bool{"acpgate_x_seconds_bucket": true, "acpgate_x_seconds_count": true, "acpgate_y_total": true, "acpgate_z": false, "acpgate_x_seconds_total": false} {
		if ok, _ := e.check(name); ok != want {
			t.Errorf("check(%s) = %v, want %v", name, ok, want)
		}
	}
}
