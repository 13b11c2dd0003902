package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestQuick runs each scenario of the harness in -quick mode against the
// real acpgate binary and checks that it worked: every message arrived, in
// order, every request was answered, nothing failed. It asserts no
// performance figure: those depend on the machine.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gateways and thousands of connections; skipped with -short")
	}
	dir, loadBin, gwBin := buildQuick(t)
	for _, scenario := range []string{"stream", "fanin", "idle", "setup"} {
		t.Run(scenario, func(t *testing.T) {
			args := []string{"-scenario", scenario, "-quick", "-gateway-bin", gwBin, "-timeout", "2m"}
			switch scenario {
			case "stream":
				args = append(args, "-resume-off", "-audit", "-tracing") // the default, resume off, audit and tracing on, side by side
			case "setup":
				args = append(args, "-audit")
			case "fanin":
				args = append(args, "-tracing")
			}
			res, output := runLoad(t, dir, loadBin, scenario, args...)
			if len(res.Errors) > 0 || res.Command == "" || !res.Quick {
				t.Fatalf("errors %q, command %q, quick %v\n%s", res.Errors, res.Command, res.Quick, output)
			}
			switch scenario {
			case "stream":
				checkStream(t, res.Stream, "gateway")
				checkStream(t, res.Stream, "gateway"+resumeOffName)
				checkStream(t, res.Stream, "gateway"+auditOnName)
				checkStream(t, res.Stream, "gateway"+tracingOnName)
				for _, c := range res.Stream.Cases {
					if c.ResumeOnVsOff <= 0 || c.AuditOnVsOff <= 0 || c.TracingOnVsOff <= 0 {
						t.Errorf("stream %d B: resume on ÷ off %v, audit on ÷ off %v, tracing on ÷ off %v", c.Size, c.ResumeOnVsOff, c.AuditOnVsOff, c.TracingOnVsOff)
					}
				}
			case "fanin":
				checkFanin(t, res.Fanin)
				if res.Fanin.Traced == nil || res.Fanin.Traced.Answered == 0 {
					t.Errorf("fanin: no traced gateway path")
				}
			case "idle":
				checkIdle(t, res.Idle)
			case "setup":
				checkSetup(t, res.Setup)
			}
			if t.Failed() {
				t.Logf("output:\n%s", output)
			}
		})
	}
}

// buildQuick builds the harness and the gateway into a test directory.
func buildQuick(t *testing.T) (dir, loadBin, gwBin string) {
	dir = t.TempDir()
	loadBin, gwBin = filepath.Join(dir, "load"), filepath.Join(dir, "acpgate")
	for _, b := range [][]string{{loadBin, "."}, {gwBin, "github.com/acpgate/acpgate/cmd/acpgate"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return dir, loadBin, gwBin
}

// runLoad runs the harness in dir with args and -out dir/name.json, and
// returns the results it wrote and its output. A run that fails, or writes
// no results, fails the test.
func runLoad(t *testing.T, dir, loadBin, name string, args ...string) (results, []byte) {
	t.Helper()
	out := filepath.Join(dir, name+".json")
	args = append(args, "-out", out)
	cmd := exec.Command(loadBin, args...)
	cmd.Dir = dir
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("load %q: %v\n%s", args, err, output)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("results: %v", err)
	}
	return res, output
}

// TestQuickHTTP runs the stream and fanin scenarios in -quick mode with the
// gateway paths over Streamable HTTP (-transport http) against the real
// binary: every chunk arrives on the session's SSE stream, in order, and
// every POSTed round trip is answered. The fan-in runs with both ways of
// POSTing (-http-client lean, the default, and nethttp). Like TestQuick, it
// asserts no performance figure. It takes about 30 s; the harness stops
// everything after 2 minutes.
func TestQuickHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gateways and hundreds of HTTP connections; skipped with -short")
	}
	dir, loadBin, gwBin := buildQuick(t)
	run := func(t *testing.T, name string, args ...string) *results {
		args = append([]string{"-transport", "http", "-quick", "-gateway-bin", gwBin, "-timeout", "2m"}, args...)
		res, output := runLoad(t, dir, loadBin, name, args...)
		if len(res.Errors) > 0 || !res.Quick || len(res.Transports) != 1 || res.Transports[0] != "http" {
			t.Fatalf("errors %q, quick %v, transports %q\n%s", res.Errors, res.Quick, res.Transports, output)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("output:\n%s", output)
			}
		})
		return &res
	}
	t.Run("stream,fanin", func(t *testing.T) {
		res := run(t, "http", "-scenario", "stream,fanin")
		checkStream(t, res.Stream, "gateway (HTTP)")
		if res.Stream != nil {
			for _, c := range res.Stream.Cases {
				for _, p := range c.Paths {
					if p.Path == "gateway" {
						t.Errorf("stream %d B: a WebSocket gateway path with -transport http", c.Size)
					}
					if p.Path == "gateway (HTTP)" && p.Transport != "http" {
						t.Errorf("stream %d B: the HTTP path says transport %q", c.Size, p.Transport)
					}
				}
			}
			// 2,000 chunks of 20 KiB are less than the default 64 MiB the
			// HTTP sink may hold, whatever the pace.
			if d := res.Stream.DefaultLimitsHTTP; d == nil || d.Msgs != res.Counts.LargeChunks || !d.InOrder {
				t.Errorf("stream over HTTP with the default limits: %+v", d)
			}
		}
		checkFaninHTTP(t, res.Fanin, "lean")
	})
	t.Run("fanin-nethttp", func(t *testing.T) {
		res := run(t, "nethttp", "-scenario", "fanin", "-http-client", "nethttp", "-profile=false")
		checkFaninHTTP(t, res.Fanin, "nethttp")
	})
}

func checkFaninHTTP(t *testing.T, r *faninResult, client string) {
	if r == nil || r.HTTP == nil {
		t.Fatal("fanin: no HTTP result")
	}
	if r.HTTP.Client != client {
		t.Errorf("fanin: HTTP client %q, want %q", r.HTTP.Client, client)
	}
	checkFaninRuns(t, map[string]faninRun{"gateway (HTTP)": r.HTTP.Gateway, "direct": r.Direct})
	if r.Gateway.Sent != 0 || len(r.GatewaySteps) != 0 {
		t.Errorf("fanin: a WebSocket gateway path ran with -transport http")
	}
	if len(r.HTTP.Steps) == 0 || len(r.DirectSteps) == 0 {
		t.Errorf("fanin: no rate search steps")
	}
	if r.Stray != 0 {
		t.Errorf("fanin: %d answers matched no request", r.Stray)
	}
}

// checkStream checks that every path ran and every run got every chunk in
// order, and that the direct path and the gateway path named ran.
func checkStream(t *testing.T, r *streamResult, gateway string) {
	if r == nil || len(r.Cases) != 2 {
		t.Fatalf("stream: want 2 cases, have %+v", r)
	}
	for _, c := range r.Cases {
		paths := map[string]bool{}
		for _, p := range c.Paths {
			paths[p.Path] = true
			if len(p.Samples) == 0 || p.MsgsPerSec <= 0 || p.MBPerSec <= 0 {
				t.Errorf("stream %d B via %s: %d samples, %.0f msgs/s", c.Size, p.Path, len(p.Samples), p.MsgsPerSec)
			}
			for _, s := range p.Samples {
				if s.Msgs != c.Chunks || !s.InOrder || len(s.Errors) > 0 || s.Bytes < int64(c.Chunks)*int64(c.Size) {
					t.Errorf("stream %d B via %s: %d of %d chunks, %d bytes, in order %v, errors %q",
						c.Size, p.Path, s.Msgs, c.Chunks, s.Bytes, s.InOrder, s.Errors)
				}
			}
		}
		if !paths[gateway] || !paths["direct (stdio)"] {
			t.Errorf("stream %d B: paths %v", c.Size, paths)
		}
	}
}

func checkFanin(t *testing.T, r *faninResult) {
	if r == nil {
		t.Fatal("fanin: no result")
	}
	checkFaninRuns(t, map[string]faninRun{"gateway": r.Gateway, "direct": r.Direct})
	if len(r.GatewaySteps) == 0 || len(r.DirectSteps) == 0 {
		t.Errorf("fanin: no rate search steps")
	}
	if r.Stray != 0 {
		t.Errorf("fanin: %d answers matched no request", r.Stray)
	}
}

// checkFaninRuns checks that each run sent, had every request answered,
// none missing and no error, and measured latency.
func checkFaninRuns(t *testing.T, runs map[string]faninRun) {
	t.Helper()
	for name, x := range runs {
		if x.Sent == 0 || x.Answered != x.Sent || x.Missing != 0 || x.Errors != 0 || x.Latency.N == 0 || x.Latency.P50 <= 0 {
			t.Errorf("fanin %s: sent %d, answered %d, missing %d, errors %d (%s), %d samples",
				name, x.Sent, x.Answered, x.Missing, x.Errors, x.LastError, x.Latency.N)
		}
	}
}

func checkIdle(t *testing.T, r *idleResult) {
	if r == nil {
		t.Fatal("idle: no result")
	}
	if r.InProc.Goroutines-r.InProc.Goroutines0 < r.Conns || r.InProc.GoroutinesPerConn <= 0 {
		t.Errorf("idle: %d → %d goroutines for %d connections", r.InProc.Goroutines0, r.InProc.Goroutines, r.Conns)
	}
	if r.InProc.GoroutinesAfter > r.InProc.Goroutines0+10 {
		t.Errorf("idle: %d goroutines left after closing (%d before)", r.InProc.GoroutinesAfter, r.InProc.Goroutines0)
	}
	if r.OutProc.RSS <= r.OutProc.RSS0 || r.OutProc.RSSPerConn <= 0 {
		t.Errorf("idle: RSS %d → %d", r.OutProc.RSS0, r.OutProc.RSS)
	}
}

func checkSetup(t *testing.T, r *setupResult) {
	if r == nil || len(r.Paths) != 6 {
		t.Fatalf("setup: want 6 paths (the warm one twice: audit off and on), have %+v", r)
	}
	for _, p := range r.Paths {
		if p.Samples == 0 || p.SessionNew.N != p.Samples || p.Total.P50 <= 0 || len(p.Errors) > 0 || p.Failed > 0 {
			t.Errorf("setup %s: %d of %d samples, errors %q", p.Path, p.SessionNew.N, p.Samples, p.Errors)
		}
	}
	// The mixed path reads the gateway's spawn count: at least the warm
	// process.
	mixed := r.Paths[5]
	if mixed.Spawns == nil || mixed.SpawnsAtReady == nil || *mixed.SpawnsAtReady < 1 || *mixed.Spawns < *mixed.SpawnsAtReady {
		t.Errorf("setup %s: spawns %v, at ready %v", mixed.Path, mixed.Spawns, mixed.SpawnsAtReady)
	}
}
