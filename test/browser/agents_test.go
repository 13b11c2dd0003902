//go:build unix

package browser

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserPicksAgent: a gateway with three named agents (issue #16):
//
//	demo    the built-in demo agent (no command), default_agent
//	second  test/fakeagent, which calls itself "fakeagent" in agentInfo
//	broken  test/fakeagent told to exit before initialize: never ready
//
// The page lists them from GET /v1/agents in a labelled <select> (the
// default preselected, agentInfo shown, "not ready" on broken), takes a
// turn with demo, picks second with the keyboard and takes a turn there
// (the header then names fakeagent, the connection is /acp/second), is
// reloaded (the pick is remembered and the connection resumed), switches
// back (demo's session is in demo's list, not second's), and honours
// ?agent= in its address. Last, through a proxy that refuses WebSocket
// upgrades, ?agent=second falls back to Streamable HTTP on /acp/second. The
// gateway's metrics must count every prompt under the agent the script
// says it sent it to, and its log names each connection's agent.
func TestBrowserPicksAgent(t *testing.T) {
	r := newRig(t)
	fake := filepath.Join(r.dir, "fakeagent")
	if err := harness.BuildFakeAgent(fake); err != nil {
		t.Fatal(err)
	}
	config := writeConfig(t, r.dir, fmt.Sprintf(`agents:
  demo: {}
  second:
    command: [%q]
  broken:
    command: [%q]
    env: {FAKE_MODE: exit-before-init}
default_agent: demo
`, fake, fake))

	gw := r.launch(t, config, "") // /readyz stays 503: broken never starts
	defer gw.stop()
	base := "http://" + gw.Addr
	waitAgents(t, base, "demo", "second")
	px := startNoUpgradeProxy(t, gw.Addr)
	defer px.close()

	var sent map[string]int // agent -> prompts the script sent it
	start := time.Now()
	r.runScript(t, base+"/", "agents", []string{"ACPGATE_FALLBACK_URL=http://" + px.addr + "/"}, func(action string) error {
		counts, ok := strings.CutPrefix(action, "prompts ")
		if !ok {
			return fmt.Errorf("unknown harness action %q", action)
		}
		sent = map[string]int{}
		for _, kv := range strings.Fields(counts) {
			name, n, _ := strings.Cut(kv, "=")
			v, err := strconv.Atoi(n)
			if err != nil {
				return fmt.Errorf("harness action %q: %v", action, err)
			}
			sent[name] = v
		}
		return nil
	})
	t.Logf("the scenario took %v", time.Since(start).Round(time.Millisecond))

	// The gateway's own account of which agent got what.
	metrics := scrape(t, base+"/metrics")
	px.close()
	gw.stop()
	r.saveLog(t, "agents-gateway.log")
	if t.Failed() {
		return
	}
	if sent["demo"] == 0 || sent["second"] == 0 {
		t.Fatalf("the script reported prompts %v, want some for demo and second", sent)
	}
	refused, seen := px.counts()
	t.Logf("fallback proxy: %d upgrades refused; forwarded %v", refused, seen)
	if refused == 0 {
		t.Errorf("no WebSocket upgrade reached the fallback proxy")
	}
	for _, want := range []string{"POST /acp/second", "GET /acp/second", "DELETE /acp/second", "GET /v1/agents"} {
		if seen[want] == 0 {
			t.Errorf("the fallback proxy forwarded no %s", want)
		}
	}
	for k := range seen {
		if _, path, _ := strings.Cut(k, " "); (path == "/acp" || strings.HasPrefix(path, "/acp/")) && path != "/acp/second" {
			t.Errorf("the fallback proxy forwarded %s: not the picked agent", k)
		}
	}
	for _, agent := range []string{"demo", "second", "broken"} {
		got := metricSum(metrics, "acpgate_messages_total", map[string]string{"agent": agent, "method": "session/prompt", "direction": "client_to_agent"})
		if got != float64(sent[agent]) {
			t.Errorf("acpgate_messages_total{agent=%q,method=\"session/prompt\",direction=\"client_to_agent\"} = %v, the page sent %d", agent, got, sent[agent])
		}
	}
	if got := metricSum(metrics, "acpgate_sessions_total", map[string]string{"agent": "second", "event": "created"}); got < 1 {
		t.Errorf("acpgate_sessions_total{agent=\"second\",event=\"created\"} = %v, want at least 1", got)
	}
	for _, agent := range []string{"demo", "second"} {
		if got := metricSum(metrics, "acpgate_connections_total", map[string]string{"agent": agent}); got < 1 {
			t.Errorf("acpgate_connections_total{agent=%q} = %v: no connection to it ended", agent, got)
		}
	}
	// The gateway's log names each connection's agent too.
	closed := map[string]int{}
	for _, line := range strings.Split(r.log.String(), "\n") {
		var rec struct{ Msg, Agent string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "connection closed" {
			closed[rec.Agent]++
		}
	}
	if closed["demo"] == 0 || closed["second"] == 0 || closed["broken"] != 0 {
		t.Errorf("\"connection closed\" log records by agent: %v, want some for demo and second, none for broken", closed)
	}
}

// waitAgents polls GET /v1/agents until the named agents are ready.
func waitAgents(t *testing.T, base string, names ...string) {
	t.Helper()
	deadline := time.Now().Add(startLimit)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/v1/agents")
		if err == nil {
			var body struct {
				Agents []struct {
					Name  string `json:"name"`
					Ready bool   `json:"ready"`
				} `json:"agents"`
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			if json.Unmarshal(b, &body) == nil {
				ready := map[string]bool{}
				for _, a := range body.Agents {
					ready[a.Name] = a.Ready
				}
				all := true
				for _, n := range names {
					all = all && ready[n]
				}
				if all {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("agents %v not ready within %v; last /v1/agents: %s", names, startLimit, last)
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// metricSum adds up the samples of a metric whose labels include want.
func metricSum(text, name string, want map[string]string) float64 {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		m := sampleLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] != name {
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if v, err := strconv.ParseFloat(m[3], 64); match && err == nil {
			sum += v
		}
	}
	return sum
}
