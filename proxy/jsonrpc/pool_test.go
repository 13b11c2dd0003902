//go:build !race && !poison

// (The race detector makes sync.Pool drop items at random; -tags poison
// reuses nothing.)

package jsonrpc

import "testing"

// TestBufferPoolReuses: with several buffers in flight, as between an agent
// reader and a connection writer, getting and putting message buffers does
// not allocate.
func TestBufferPoolReuses(t *testing.T) {
	payload := make([]byte, 20<<10)
	cycle := func() {
		a := append(GetBuffer(len(payload)), payload...)
		b := append(GetBuffer(len(payload)), payload...)
		c := append(GetBuffer(len(payload)), payload...)
		PutBuffer(a)
		PutBuffer(b)
		PutBuffer(c)
	}
	cycle()
	if n := testing.AllocsPerRun(200, cycle); n > 0.5 {
		t.Fatalf("%.1f allocations per cycle of three 20 KB buffers", n)
	}
}
