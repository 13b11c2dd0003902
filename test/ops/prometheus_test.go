package ops

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const prometheusBin = "/usr/bin/prometheus"

// startPrometheus runs a real Prometheus on loopback that scrapes target
// every second and loads the alert rules; it is stopped when the test ends.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin := requireTool(t, prometheusBin)
	dir := t.TempDir()
	rules := filepath.Join(repoRoot, "deploy", "prometheus", "acpgate-rules.yaml")
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: acpgate
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	writeFile(t, cfgPath, cfg)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus log:\n%s", b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := httpGet("http://" + addr + "/-/ready")
		if err == nil && code == http.StatusOK {
			return addr
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited at start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 30 s (%d, %v)", code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type promResponse struct {
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Data   json.RawMessage `json:"data"`
}

func promAPI(t *testing.T, addr, path string, q url.Values) json.RawMessage {
	t.Helper()
	code, body, err := httpGet("http://" + addr + path + "?" + q.Encode())
	if err != nil {
		t.Fatalf("prometheus %s: %v", path, err)
	}
	var r promResponse
	if err := json.Unmarshal([]byte(body), &r); err != nil || code != http.StatusOK || r.Status != "success" {
		t.Fatalf("prometheus %s %v: HTTP %d %s %s", path, q, code, r.Error, body)
	}
	return r.Data
}

// query runs an instant query and returns its vector.
func query(t *testing.T, addr, expr string) []struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
} {
	t.Helper()
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := json.Unmarshal(promAPI(t, addr, "/api/v1/query", url.Values{"query": {expr}}), &data); err != nil {
		t.Fatal(err)
	}
	if data.ResultType != "vector" {
		t.Fatalf("query %q: result type %s", expr, data.ResultType)
	}
	return data.Result
}

// TestPrometheusScrapesGateway has a real Prometheus scrape the gateway
// while clients run prompt turns, then reads the series back through its
// HTTP API, and checks that it evaluates every alert rule without error.
func TestPrometheusScrapesGateway(t *testing.T) {
	requireTool(t, prometheusBin)
	// Recycling after one session (set through the environment, as an
	// operator may): the session's process retires and a new one is
	// spawned, which the pool's counters must show. Prometheus scrapes the
	// operations listener (metrics_listen), as in the deployment: a main
	// listener on a public address does not serve /metrics.
	g := startGateway(t, gwOpts{config: "observability:\n  metrics_listen: 127.0.0.1:0\n",
		env: []string{"ACPGATE_POOL_RECYCLE_AFTER_SESSIONS=1"}})
	if g.MetricsAddr() == "" {
		t.Fatal("no operations listener")
	}
	prom := startPrometheus(t, g.MetricsAddr())
	// One scrape before the traffic, so that rates see it happen.
	deadline := time.Now().Add(30 * time.Second)
	for len(query(t, prom, `up{job="acpgate"} == 1`)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Prometheus did not scrape the gateway within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}

	c, sid := dialSession(t, g.Addr)
	for i := 0; i < 3; i++ {
		if reason, text := c.prompt(sid, "hello"); reason != "end_turn" || text != "You said: hello" {
			t.Fatalf("prompt %d: %q %q", i, reason, text)
		}
	}
	c.Close() // acpgate_connections_total counts ended connections
	c2 := mustDial(t, g.Addr, "")
	c2.initialize()
	defer c2.Close()

	want := []string{
		`acpgate_connections_open{job="acpgate"} or acpgate_connections_total{job="acpgate"}`,
		`acpgate_connections_total{job="acpgate", reason="client_closed"}`,
		`acpgate_sessions_total{job="acpgate", event="created"}`,
		`acpgate_messages_total{job="acpgate", direction="client_to_agent", method="session/prompt"}`,
		`acpgate_request_duration_seconds_bucket{job="acpgate", method="session/prompt"}`,
		`acpgate_ready{job="acpgate"} == 1`,
		`acpgate_agent_recycled_total{job="acpgate", reason="sessions"} >= 1`,
		`acpgate_agent_spawns_total{job="acpgate"} >= 2`,
		`histogram_quantile(0.5, sum by (le) (rate(acpgate_prompt_first_update_seconds_bucket{job="acpgate"}[1m]))) > 0`,
	}
	deadline = time.Now().Add(30 * time.Second)
	pending := want
	for len(pending) > 0 {
		var still []string
		for _, q := range pending {
			if len(query(t, prom, q)) == 0 {
				still = append(still, q)
			}
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result within 30 s for:\n  %s", strings.Join(pending, "\n  "))
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, q := range want[:5] {
		r := query(t, prom, q)
		t.Logf("%s -> %d series, e.g. %v = %v", q, len(r), r[0].Metric, r[0].Value[1])
	}
	if r := query(t, prom, `sum(acpgate_messages_total{job="acpgate", method="session/prompt", direction="client_to_agent"})`); len(r) != 1 || r[0].Value[1] != "3" {
		t.Errorf("Prometheus counted %v session/prompt requests, want 3", r)
	}

	// Every alert rule was evaluated, without error, and none fires on a
	// healthy gateway.
	deadline = time.Now().Add(30 * time.Second)
	for {
		var data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					State     string `json:"state"`
					LastEval  string `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := json.Unmarshal(promAPI(t, prom, "/api/v1/rules", url.Values{"type": {"alert"}}), &data); err != nil {
			t.Fatal(err)
		}
		n, unevaluated := 0, 0
		var problems []string
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				n++
				switch {
				case r.Health == "unknown" || strings.HasPrefix(r.LastEval, "0001-"):
					unevaluated++
				case r.Health != "ok":
					problems = append(problems, fmt.Sprintf("%s: health %s: %s", r.Name, r.Health, r.LastError))
				case r.State != "inactive":
					problems = append(problems, fmt.Sprintf("%s is %s on a healthy gateway", r.Name, r.State))
				}
			}
		}
		if n == 0 {
			t.Fatal("Prometheus loaded no alert rules")
		}
		if len(problems) > 0 {
			t.Fatalf("alert rules:\n  %s", strings.Join(problems, "\n  "))
		}
		if unevaluated == 0 {
			t.Logf("Prometheus evaluated all %d alert rules: healthy, inactive", n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rules not evaluated within 30 s", unevaluated, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
