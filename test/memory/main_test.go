// Package memory holds the real gateway to the memory bounds
// docs/operations.md states: what one connection may make it hold.
package memory

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

var binPath, fakePath string

// TestMain builds the gateway without the race detector, whatever the
// test binary has: its shadow memory would be most of what is measured.
// ACPGATE_E2E_BIN runs another build instead (harness.Prebuilt).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "acpgate-memory-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, what, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if binPath, err = harness.Prebuilt(); err != nil {
		fail("memory:", err)
	} else if binPath != "" {
		fmt.Fprintln(os.Stderr, "memory: using the prebuilt gateway", binPath)
	} else if binPath, err = harness.Build(dir, false); err != nil {
		fail("build acpgate:", err)
	}
	fakePath = filepath.Join(dir, "fakeagent")
	if err := harness.BuildFakeAgent(fakePath); err != nil {
		fail("build fakeagent:", err)
	}
	harness.Main(m, func() { os.RemoveAll(dir) })
}

const mib = 1 << 20

// startGateway runs the gateway on the fake agent, one agent process for
// up to 64 sessions, with more YAML appended to its configuration, and
// returns it and its process ID.
func startGateway(t *testing.T, more string) (*harness.Gateway, int) {
	t.Helper()
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
agent: {command: [%q], stop_grace: 1s}
pool: {min_idle: 1, max_processes: 1, max_sessions_per_process: 64}
log: {level: info, format: json}
`, fakePath) + more
	path := filepath.Join(t.TempDir(), "acpgate.yaml")
	harness.WriteFile(t, path, cfg, 0o600)
	g := harness.Start(t, harness.Options{Argv: []string{binPath, "serve", "--config", path}, Env: harness.EnvWithout("ACPGATE_"), CheckExit: true})
	return g, g.Cmd.Process.Pid
}

// procStatus reads one "Key: N kB" line of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			f := strings.Fields(rest)
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, key)
	return 0
}

// checkPeak fails the test when the gateway's peak RSS (VmHWM) is bound
// or more over baseline; what says what was done meanwhile.
func checkPeak(t *testing.T, pid int, baseline, bound int64, what string) {
	t.Helper()
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("gateway RSS: baseline %.1f MiB, peak %.1f MiB (+%.1f MiB); %s",
		float64(baseline)/mib, float64(peak)/mib, float64(peak-baseline)/mib, what)
	if peak-baseline >= bound {
		t.Errorf("the gateway's RSS peaked %.1f MiB over its baseline of %.1f MiB; the bound is %d MiB",
			float64(peak-baseline)/mib, float64(baseline)/mib, bound/mib)
	}
}

// metrics is the gateway's /metrics, parsed (metricscrape.Parse).
func metrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	_, body, err := metricscrape.Get(addr)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return metricscrape.Parse(body)
}

// prompts is the number of session/prompt messages the gateway has
// relayed in direction (agent_to_client: the agent's answers;
// client_to_agent: prompts sent to the agent).
func prompts(t *testing.T, addr, direction string) int {
	t.Helper()
	n := 0.0
	for k, v := range metrics(t, addr) {
		if strings.HasPrefix(k, "acpgate_messages_total{") && strings.Contains(k, `direction="`+direction+`"`) &&
			strings.Contains(k, `method="session/prompt"`) {
			n += v
		}
	}
	return int(n)
}
