package jsonrpc

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// Edit replaces Raw[Start:End] with Repl.
type Edit struct {
	Start, End int
	Repl       []byte
}

// Splice appends raw to dst with the edits applied. Edits must be sorted by
// Start and must not overlap. Bytes outside the edits are copied verbatim.
func Splice(dst, raw []byte, edits []Edit) []byte {
	n := len(raw)
	for _, e := range edits {
		n += len(e.Repl) - (e.End - e.Start)
	}
	if cap(dst)-len(dst) < n {
		grown := make([]byte, len(dst), len(dst)+n+1)
		copy(grown, dst)
		dst = grown
	}
	at := 0
	for _, e := range edits {
		dst = append(dst, raw[at:e.Start]...)
		dst = append(dst, e.Repl...)
		at = e.End
	}
	return append(dst, raw[at:]...)
}

// SpliceLine is Splice for a peer that reads one message a line (an
// agent's stdin): the message is appended with its line breaks made spaces,
// then a newline. In valid JSON a raw CR or LF is white space between tokens
// (a string cannot hold one), so the message means the same; kept, it would
// end the line early, and what follows it would reach the agent as lines of
// their own, messages the gateway never checked (a client's pretty-printed
// value hiding a whole request).
func SpliceLine(dst, raw []byte, edits []Edit) []byte {
	at := len(dst)
	dst = Splice(dst, raw, edits)
	oneLine(dst[at:])
	return append(dst, '\n')
}

// oneLine replaces each CR and LF of b with a space.
func oneLine(b []byte) {
	for _, c := range [...]byte{'\n', '\r'} {
		for i := bytes.IndexByte(b, c); i >= 0; {
			b[i] = ' '
			j := bytes.IndexByte(b[i+1:], c)
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
}

// Message buffers are reused: the relay splices each outgoing message into
// a pooled buffer and the transport gives it back once written (at 20 KB a
// message, fresh buffers were most of the garbage collector's work).
// bufPool holds boxes with a buffer in them; boxPool the empty boxes, so
// that neither getting nor putting a buffer allocates a box, and a Put
// never lands on a box that still holds a buffer. Built with -tags poison,
// nothing is pooled: PutBuffer scribbles over the buffer (poison_on.go).
var (
	bufPool sync.Pool
	boxPool = sync.Pool{New: func() any { return new([]byte) }}
)

// maxPooled: bigger buffers are left to the garbage collector.
const maxPooled = 256 << 10

// GetBuffer returns an empty buffer with room for at least n bytes.
func GetBuffer(n int) []byte {
	if poisoning { // nothing is reused
		return make([]byte, 0, max(n, 512))
	}
	bp, _ := bufPool.Get().(*[]byte)
	if bp == nil {
		return make([]byte, 0, max(n, 512))
	}
	b := *bp
	*bp = nil
	boxPool.Put(bp)
	if cap(b) < n {
		return make([]byte, 0, n)
	}
	return b[:0]
}

// PutBuffer gives a message buffer back once it is no longer used.
func PutBuffer(b []byte) {
	if poisoning {
		poison(b)
		return
	}
	if cap(b) == 0 || cap(b) > maxPooled {
		return
	}
	bp := boxPool.Get().(*[]byte)
	*bp = b[:0]
	bufPool.Put(bp)
}

// SortEdits orders edits by Start, an insertion (Start == End) before a
// replacement that starts where it is inserted (insertion sort: there are
// a handful).
func SortEdits(edits []Edit) {
	before := func(a, b Edit) bool {
		return a.Start < b.Start || a.Start == b.Start && a.End == a.Start && b.End > b.Start
	}
	for i := 1; i < len(edits); i++ {
		for j := i; j > 0 && before(edits[j], edits[j-1]); j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
}

// DeleteElements appends to dst the edits that remove the dropped elements
// of one array, leaving valid JSON. elems are the [start, end) ranges of
// every element of the array, in order; drop says which to remove. The
// separating commas are chosen together, so any subset can be removed.
func DeleteElements(dst []Edit, elems [][2]int, drop func(i int) bool) []Edit {
	lastKept := -1
	for i := range elems {
		if !drop(i) {
			lastKept = i
		}
	}
	if lastKept < 0 { // all of them: empty the array
		if len(elems) > 0 {
			dst = append(dst, Edit{Start: elems[0][0], End: elems[len(elems)-1][1]})
		}
		return dst
	}
	for i, e := range elems {
		switch {
		case !drop(i):
		case i < lastKept: // up to the next element, taking the comma after
			dst = append(dst, Edit{Start: e[0], End: elems[i+1][0]})
		default: // after the last kept one: from the end of the one before
			dst = append(dst, Edit{Start: elems[i-1][1], End: e[1]})
		}
	}
	return dst
}

// AppendQuote appends s as a JSON string. s must be valid UTF-8; invalid
// bytes are replaced rather than failing, so gateway-built messages are
// always valid JSON.
func AppendQuote(dst []byte, s string) []byte {
	out, _ := jsontext.AppendQuote(dst, s) // the only error is invalid UTF-8, already replaced
	return out
}

// Standard and ACP error codes.
const (
	CodeParseError       = -32700
	CodeInvalidRequest   = -32600
	CodeMethodNotFound   = -32601
	CodeInvalidParams    = -32602
	CodeInternalError    = -32603
	CodeRequestCancelled = -32800
	CodeAuthRequired     = -32000
	CodeNotFound         = -32002
)

// AppendError appends an error response. id is raw JSON (nil means null);
// data is raw JSON or nil.
func AppendError(dst, id []byte, code int, message string, data []byte) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	if len(id) == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, id...)
	}
	dst = append(dst, `,"error":{"code":`...)
	dst = strconv.AppendInt(dst, int64(code), 10)
	dst = append(dst, `,"message":`...)
	dst = AppendQuote(dst, message)
	if len(data) > 0 {
		dst = append(dst, `,"data":`...)
		dst = append(dst, data...)
	}
	return append(dst, "}}"...)
}

// AppendResult appends a success response with a raw JSON result.
func AppendResult(dst, id, result []byte) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	if len(id) == 0 {
		id = []byte("null")
	}
	dst = append(dst, id...)
	dst = append(dst, `,"result":`...)
	dst = append(dst, result...)
	return append(dst, '}')
}

// AppendRequest appends a request (id non-nil) or notification (id nil) with
// raw JSON params (nil omits them).
func AppendRequest(dst, id []byte, method string, params []byte) []byte {
	dst = append(dst, `{"jsonrpc":"2.0",`...)
	if id != nil {
		dst = append(dst, `"id":`...)
		dst = append(dst, id...)
		dst = append(dst, ',')
	}
	dst = append(dst, `"method":`...)
	dst = AppendQuote(dst, method)
	if params != nil {
		dst = append(dst, `,"params":`...)
		dst = append(dst, params...)
	}
	return append(dst, '}')
}
