//go:build poison

package jsonrpc

import (
	"bytes"
	"testing"
)

// TestPoisonedBuffer: a released buffer reads as poison, is not handed out
// again, and putting it twice panics.
func TestPoisonedBuffer(t *testing.T) {
	b := append(GetBuffer(16), `{"jsonrpc":"2.0"}`...)
	held := b // a holder that kept it past the release
	PutBuffer(b)
	if want := bytes.Repeat([]byte{poisonByte}, len(held)); !bytes.Equal(held, want) {
		t.Fatalf("a released buffer still reads %q", held)
	}
	if c := GetBuffer(16); &c[:1][0] == &held[0] {
		t.Fatal("a released buffer was handed out again")
	}
	PutBuffer(GetBuffer(16)) // never written: not poison yet, so no panic
	defer func() {
		if recover() == nil {
			t.Fatal("a second PutBuffer of one buffer did not panic")
		}
	}()
	PutBuffer(b)
}
