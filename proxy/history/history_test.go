package history

import (
	"fmt"
	"strings"
	"testing"
)

// The history keeps the newest messages, at least half its limit's worth
// and at most its limit, in order, and says when it dropped some; once
// full, its buffers take turns rather than grow.
func TestHistoryKeepsTheNewestWithinItsLimit(t *testing.T) {
	const size, n = 1000, 1000
	h := New(100_000)
	msg := func(i int) []byte { return []byte(fmt.Sprintf("%06d%s", i, strings.Repeat("x", size-6))) }
	var caps int
	for i := range n { // 1 MB through a 100 kB history
		h.Add(msg(i))
		if h.Bytes() > h.Limit() {
			t.Fatalf("after %d messages the history holds %d bytes for a %d byte limit", i+1, h.Bytes(), h.Limit())
		}
		if i == n/2 {
			caps = cap(h.prev.buf) + cap(h.cur.buf)
		}
	}
	if c := cap(h.prev.buf) + cap(h.cur.buf); c != caps {
		t.Errorf("the buffers grew from %d to %d bytes once full", caps, c)
	}
	var got []string
	h.Each(func(m []byte) { got = append(got, string(m)) })
	if len(got)*size < h.Limit()/2 || len(got)*size > h.Limit() || len(got) != h.Kept() || !h.Trimmed() {
		t.Fatalf("kept %d messages (trimmed %v), want the newest %d to %d and trimmed", len(got), h.Trimmed(), h.Limit()/2/size, h.Limit()/size)
	}
	for i, m := range got {
		if want := n - len(got) + i; m != string(msg(want)) {
			t.Fatalf("message %d is %.6s, want %06d", i, m, want)
		}
	}
}

// A message bigger than half the history's limit is not kept, nor anything
// before it (a replay must not skip it), and the buffers never hold more
// than the limit: a 16 MB update once made a 2 MiB history hold 16 MB.
func TestHistoryKeepsNoMessageOverHalfItsLimit(t *testing.T) {
	const limit = 100_000
	h := New(limit)
	for i, size := range []int{30_000, 20_000, 45_000, limit/2 + 1, limit, 40_000, 9_000, 50_000, 3 * limit} {
		h.Add(make([]byte, size))
		if c := cap(h.prev.buf) + cap(h.cur.buf); h.Bytes() > limit || c > limit {
			t.Fatalf("after message %d (%d bytes) the history holds %d bytes in buffers of %d for a %d byte limit", i, size, h.Bytes(), c, limit)
		}
		var kept []int
		h.Each(func(m []byte) { kept = append(kept, len(m)) })
		switch size {
		case limit/2 + 1, limit, 3 * limit:
			if len(kept) != 0 || !h.Trimmed() {
				t.Fatalf("after a %d byte message the history keeps %v (trimmed %v), want nothing and trimmed", size, kept, h.Trimmed())
			}
		default:
			if len(kept) == 0 || kept[len(kept)-1] != size {
				t.Fatalf("after a %d byte message the history keeps %v, want it last", size, kept)
			}
		}
	}
}
