package main

import "testing"

// TestQuickFanout runs the fanout and history scenarios (issue #22) in
// -quick mode against the real binary: every client of a session, the
// owner and up to 8 attached ones, gets every chunk in order; every k has
// its ratio against the owner alone; with a history every session keeps
// half to all of history_bytes (an attach replays it) and without one nothing. Like
// TestQuick, it asserts no performance figure. It takes about 10 s.
func TestQuickFanout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gateways and dozens of client processes; skipped with -short")
	}
	dir, loadBin, gwBin := buildQuick(t)
	res, output := runLoad(t, dir, loadBin, "fanout", "-scenario", "fanout,history", "-quick", "-gateway-bin", gwBin, "-timeout", "2m")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s", output)
		}
	})
	if len(res.Errors) > 0 || !res.Quick {
		t.Fatalf("errors %q, quick %v", res.Errors, res.Quick)
	}
	checkFanout(t, res.Fanout, res.Counts)
	checkHistory(t, res.History, res.Counts)
}

func checkFanout(t *testing.T, r *fanoutResult, c counts) {
	if r == nil || len(r.Cases) != 2 {
		t.Fatalf("fanout: want 2 cases, have %+v", r)
	}
	if r.MaxClients < 9 {
		t.Errorf("fanout: max_clients %d", r.MaxClients)
	}
	for _, cs := range r.Cases {
		if len(cs.Ks) != len(c.FanoutKs) {
			t.Errorf("fanout %d B: %d ks, want %v", cs.Size, len(cs.Ks), c.FanoutKs)
			continue
		}
		for i, k := range cs.Ks {
			if k.K != c.FanoutKs[i] || len(k.Rounds) != c.FanoutReps || k.OwnerMsgsPerSec <= 0 || k.OwnerVsAlone <= 0 || k.DeliveredVsAlone <= 0 {
				t.Errorf("fanout %d B, k=%d: %d rounds, owner %.0f msgs/s, ÷ alone %.2f, delivered ÷ alone %.2f",
					cs.Size, k.K, len(k.Rounds), k.OwnerMsgsPerSec, k.OwnerVsAlone, k.DeliveredVsAlone)
			}
			if k.K > 0 && (k.AttachedMsgsPerSec <= 0 || k.AttachedVsAlone <= 0 || k.SlowestMsgsPerSec <= 0) {
				t.Errorf("fanout %d B, k=%d: attached %.0f msgs/s, ÷ alone %.2f", cs.Size, k.K, k.AttachedMsgsPerSec, k.AttachedVsAlone)
			}
			for _, rd := range k.Rounds {
				if len(rd.Attached) != k.K {
					t.Errorf("fanout %d B, k=%d: %d attached clients reported", cs.Size, k.K, len(rd.Attached))
				}
				for _, cl := range append([]fanoutRun{rd.Owner}, rd.Attached...) {
					if cl.Msgs != cs.Chunks || !cl.InOrder || len(cl.Errors) > 0 || cl.Bytes < int64(cs.Chunks)*int64(cs.Size) {
						t.Errorf("fanout %d B, k=%d, %s: %d of %d chunks, %d bytes, in order %v, errors %q",
							cs.Size, k.K, cl.Role, cl.Msgs, cs.Chunks, cl.Bytes, cl.InOrder, cl.Errors)
					}
				}
			}
		}
	}
}

func checkHistory(t *testing.T, r *historyResult, c counts) {
	if r == nil || len(r.Runs) != 2*len(c.HistoryLimits) {
		t.Fatalf("history: want %d runs, have %+v", 2*len(c.HistoryLimits), r)
	}
	for _, x := range r.Runs {
		if x.Sessions != c.HistorySessions || x.HeapAfter <= 0 || x.RSSAfter <= 0 {
			t.Errorf("history %s, %d B: %d sessions, heap %d, RSS %d", x.Gateway, x.HistoryBytes, x.Sessions, x.HeapAfter, x.RSSAfter)
		}
		// More than history_bytes was streamed; an attach replays the
		// newest history_bytes or a little more (a block), or nothing.
		if x.StreamedBytes <= int64(x.HistoryBytes) || x.Replayed != x.ResultReplayed {
			t.Errorf("history %s, %d B: streamed %d, replayed %d (result %d)", x.Gateway, x.HistoryBytes, x.StreamedBytes, x.Replayed, x.ResultReplayed)
		}
		if x.HistoryBytes == 0 && x.Replayed != 0 ||
			x.HistoryBytes > 0 && (x.ReplayedBytes < int64(x.HistoryBytes)/2-1024 || x.ReplayedBytes > int64(x.HistoryBytes) || !x.Trimmed) {
			// The history keeps the newest half to whole of history_bytes.
			t.Errorf("history %s, %d B: replayed %d bytes, trimmed %v", x.Gateway, x.HistoryBytes, x.ReplayedBytes, x.Trimmed)
		}
	}
}
