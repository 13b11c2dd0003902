//go:build poison

package jsonrpc

import "fmt"

// poisoning: built with -tags poison, a released buffer is scribbled over
// and never reused, so that whoever still reads it reads poison, never
// another owner's message.
const poisoning = true

// poisonByte fills released buffers. It is not ASCII, so JSON cannot
// contain it unescaped, and no valid UTF-8 text is a run of it.
const poisonByte = 0xDB

// poison fills b's whole capacity with poisonByte. A buffer that is poison
// already was put twice: that panics.
func poison(b []byte) {
	b = b[:cap(b)]
	if len(b) == 0 {
		return
	}
	put := true
	for _, c := range b {
		if c != poisonByte {
			put = false
			break
		}
	}
	if put {
		panic(fmt.Sprintf("jsonrpc: PutBuffer of a buffer already put (%d bytes of poison)", len(b)))
	}
	for i := range b {
		b[i] = poisonByte
	}
}
