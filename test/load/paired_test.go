package main

import "testing"

// paired divides run i of one path by run i of the other, so a drift of
// the host between runs that both paths see cancels out.
func TestPairedRatio(t *testing.T) {
	path := func(name string, rates ...float64) *streamPath {
		p := &streamPath{Path: name}
		for _, r := range rates {
			p.Samples = append(p.Samples, streamSample{streamRun: streamRun{Msgs: int(r), ElapsedNS: 1e9}})
		}
		return p
	}
	// The host halves its speed after two runs: the medians say 1.33×,
	// each run says 1.0× or near it.
	a := path("a", 200, 210, 100, 100)
	b := path("b", 200, 200, 100, 75)
	pr := paired(a, b)
	if pr == nil || pr.Of != "a ÷ b" || pr.Runs != 4 {
		t.Fatalf("paired = %+v", pr)
	}
	if pr.Median != 1.025 || pr.Q1 != 1.0 || pr.Q3 < 1.19 || pr.Q3 > 1.2 {
		t.Errorf("median %v, middle half %v–%v; want 1.025, 1–1.19 (the middle of 1.05 and 1.33)", pr.Median, pr.Q1, pr.Q3)
	}
	if paired(a, path("c", 1, 2, 3)) != nil {
		t.Error("paths with different runs were paired")
	}
	if paired(a, path("d", 1, 0, 3, 4)) != nil {
		t.Error("a run that measured nothing was paired")
	}
	if paired(nil, b) != nil {
		t.Error("a missing path was paired")
	}
}
