// Package history keeps the bounded record of a live session's messages
// that session/attach replays to a client that joins it (ACP RFD #533).
package history

// History is the bounded record of a live session's messages that
// session/attach replays: two generations of messages back to back. New
// messages go to the current one; when it would pass half the limit, it
// becomes the previous one and the old previous one's buffer, emptied, is
// the current one. So a history keeps at least the newest half of its
// limit (unless a message bigger than that came: see Add) and at most its
// limit, and once it has filled up it allocates nothing: the two buffers
// take turns.
type History struct {
	limit     int
	prev, cur histGen
	trimmed   bool // something was dropped: a replay starts at the oldest kept
}

// New is a history of at most limit bytes.
func New(limit int) *History { return &History{limit: limit} }

// Limit is the most it keeps, in bytes.
func (h *History) Limit() int { return h.limit }

// Trimmed reports whether something was dropped: a replay starts at the
// oldest message kept.
func (h *History) Trimmed() bool { return h.trimmed }

// histGen is messages back to back; ends[i] is where message i ends.
type histGen struct {
	buf  []byte
	ends []int
}

// Add keeps msg as the newest message. A message bigger than half the
// limit is not kept, and neither is anything older (a replay must not skip
// one): the history starts again after it. The buffers grow as append
// would, but never past half the limit each, so that what they hold stays
// within the limit (a 16 MB update once made a 2 MiB history hold 16 MB).
func (h *History) Add(msg []byte) {
	half := max(h.limit/2, 1)
	if len(msg) > half {
		h.trimmed = true
		h.prev = histGen{buf: h.prev.buf[:0], ends: h.prev.ends[:0]}
		h.cur = histGen{buf: h.cur.buf[:0], ends: h.cur.ends[:0]}
		return
	}
	if len(h.cur.buf) > 0 && len(h.cur.buf)+len(msg) > half {
		h.trimmed = h.trimmed || len(h.prev.ends) > 0
		h.prev, h.cur = h.cur, histGen{buf: h.prev.buf[:0], ends: h.prev.ends[:0]}
	}
	if n := len(h.cur.buf) + len(msg); n > cap(h.cur.buf) {
		b := make([]byte, len(h.cur.buf), min(max(n, 2*cap(h.cur.buf)), half))
		copy(b, h.cur.buf)
		h.cur.buf = b
	}
	h.cur.buf = append(h.cur.buf, msg...)
	h.cur.ends = append(h.cur.ends, len(h.cur.buf))
}

// Bytes is the size of the kept messages.
func (h *History) Bytes() int { return len(h.prev.buf) + len(h.cur.buf) }

// Each calls f with every kept message, oldest first (f must not keep it).
func (h *History) Each(f func(msg []byte)) {
	for _, g := range []*histGen{&h.prev, &h.cur} {
		from := 0
		for _, end := range g.ends {
			f(g.buf[from:end])
			from = end
		}
	}
}

// Kept is the number of messages kept.
func (h *History) Kept() int { return len(h.prev.ends) + len(h.cur.ends) }

// Release drops every message (the session has ended).
func (h *History) Release() { h.prev, h.cur = histGen{}, histGen{} }
