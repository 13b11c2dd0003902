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
	dir := t.TempDir()
	loadBin, gwBin := filepath.Join(dir, "load"), filepath.Join(dir, "acpgate")
	for _, b := range [][]string{{loadBin, "."}, {gwBin, "github.com/acpgate/acpgate/cmd/acpgate"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	for _, scenario := range []string{"stream", "fanin", "idle", "setup"} {
		t.Run(scenario, func(t *testing.T) {
			out := filepath.Join(dir, scenario+".json")
			cmd := exec.Command(loadBin, "-scenario", scenario, "-quick", "-out", out, "-gateway-bin", gwBin, "-timeout", "2m")
			cmd.Dir = dir
			output, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("load -scenario %s -quick: %v\n%s", scenario, err, output)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var res results
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatalf("results: %v", err)
			}
			if len(res.Errors) > 0 || res.Command == "" || !res.Quick {
				t.Fatalf("errors %q, command %q, quick %v\n%s", res.Errors, res.Command, res.Quick, output)
			}
			switch scenario {
			case "stream":
				checkStream(t, res.Stream)
			case "fanin":
				checkFanin(t, res.Fanin)
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

func checkStream(t *testing.T, r *streamResult) {
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
		if !paths["gateway"] || !paths["direct (stdio)"] {
			t.Errorf("stream %d B: paths %v", c.Size, paths)
		}
	}
}

func checkFanin(t *testing.T, r *faninResult) {
	if r == nil {
		t.Fatal("fanin: no result")
	}
	for name, x := range map[string]faninRun{"gateway": r.Gateway, "direct": r.Direct} {
		if x.Sent == 0 || x.Answered != x.Sent || x.Missing != 0 || x.Errors != 0 || x.Latency.N == 0 || x.Latency.P50 <= 0 {
			t.Errorf("fanin %s: sent %d, answered %d, missing %d, errors %d (%s), %d samples",
				name, x.Sent, x.Answered, x.Missing, x.Errors, x.LastError, x.Latency.N)
		}
	}
	if len(r.GatewaySteps) == 0 || len(r.DirectSteps) == 0 {
		t.Errorf("fanin: no rate search steps")
	}
	if r.Stray != 0 {
		t.Errorf("fanin: %d answers matched no request", r.Stray)
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
	if r == nil || len(r.Paths) != 5 {
		t.Fatalf("setup: want 5 paths, have %+v", r)
	}
	for _, p := range r.Paths {
		if p.Samples == 0 || p.SessionNew.N != p.Samples || p.Total.P50 <= 0 || len(p.Errors) > 0 || p.Failed > 0 {
			t.Errorf("setup %s: %d of %d samples, errors %q", p.Path, p.SessionNew.N, p.Samples, p.Errors)
		}
	}
	// The mixed path reads the gateway's spawn count: at least the warm
	// process.
	mixed := r.Paths[4]
	if mixed.Spawns == nil || mixed.SpawnsAtReady == nil || *mixed.SpawnsAtReady < 1 || *mixed.Spawns < *mixed.SpawnsAtReady {
		t.Errorf("setup %s: spawns %v, at ready %v", mixed.Path, mixed.Spawns, mixed.SpawnsAtReady)
	}
}
