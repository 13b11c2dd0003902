package main

import (
	"os"
	"os/exec"
	"testing"
)

// TestQuickCluster runs the cluster scenario (issue #38) in -quick mode
// against the real binary: two replicas and a Redis, a client on each
// path, every chunk of every stream in order through the session bridge
// and the forwarded event stream, a bridge opened. Like TestQuick, it
// asserts no performance figure. It needs redis-server (skipped without
// it unless ACPGATE_REQUIRE_REDIS=1).
func TestQuickCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two gateways and a Redis; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("ACPGATE_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server not found (ACPGATE_REQUIRE_REDIS=1)")
		}
		t.Skip("redis-server not found")
	}
	dir, loadBin, gwBin := buildQuick(t)
	res, output := runLoad(t, dir, loadBin, "cluster", "-scenario", "cluster", "-quick", "-gateway-bin", gwBin, "-timeout", "2m")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s", output)
		}
	})
	r := res.Cluster
	if len(res.Errors) > 0 || r == nil {
		t.Fatalf("errors %q, result %+v", res.Errors, r)
	}
	for name, p := range map[string]clusterPath{"direct": r.Direct, "forwarded": r.Forwarded, "direct (HTTP)": r.DirectHTTP,
		"forwarded (HTTP)": r.ForwardedHTTP} {
		if p.RTTP50us <= 0 || p.RTTP99us < p.RTTP50us || len(p.StreamRate) != r.Reps || p.MedianRate <= 0 {
			t.Errorf("%s: %+v", name, p)
		}
	}
	if r.Forwards < 1 {
		t.Errorf("replica b forwarded %v requests", r.Forwards)
	}
}
