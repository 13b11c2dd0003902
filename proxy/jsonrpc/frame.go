package jsonrpc

import (
	"bytes"
	"errors"
	"io"

	"github.com/go-json-experiment/json/jsontext"
)

// Messages calls fn with each JSON-RPC message a client frame holds, in
// order. A frame is normally one message; clients that write a
// newline-delimited JSON stream onto a WebSocket (marimo's use-acp) send a
// message and its newline per frame, or several messages in one. A frame
// without a newline is passed whole. Otherwise each top-level value is
// passed on its own, so that each is checked as if it had come alone; a
// pretty-printed message is still one value. From the first value that is
// not valid JSON on, each remaining non-blank line is passed on its own (the
// scanner refuses what is not a message, with its own error); a frame with
// nothing but white space is passed whole. fn must not keep the slice.
func Messages(frame []byte, fn func([]byte)) {
	if bytes.IndexByte(frame, '\n') < 0 {
		fn(frame)
		return
	}
	dec := jsontext.NewDecoder(bytes.NewReader(frame), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	n := 0
	for {
		start := dec.InputOffset()
		v, err := dec.ReadValue()
		if errors.Is(err, io.EOF) {
			if n == 0 {
				fn(frame)
			}
			return
		}
		if err != nil {
			// Not JSON from here on: each remaining line on its own, as a
			// newline-delimited stream's reader would take them.
			for line := range bytes.Lines(frame[start:]) {
				if line = bytes.TrimSpace(line); len(line) > 0 {
					fn(line)
				}
			}
			return
		}
		n++
		fn(v)
	}
}
