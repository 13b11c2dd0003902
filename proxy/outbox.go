package proxy

import (
	"sync"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// outbox is everything a connection sends its client, in order and
// numbered from 1 (the client counts what it receives the same way). While
// a socket is attached a message is handed to its sink at once. The outbox
// also keeps a copy of the most recent messages, up to limit bytes, so that
// a client whose socket died can resume from the last message it received,
// even if messages were in flight when the socket died. A message the
// client is known to have read (the socket answered a ping sent after it:
// see acked) is not kept any longer, so a live connection keeps only what
// may still be in flight. While no socket is
// attached (detached) messages are only kept; one that would have to be
// dropped before any socket got it ends the connection (overflow), since it
// could no longer be resumed exactly.
//
// The outbox decides nothing about the socket's own queue: the sink does
// (Sink.Send).
type outbox struct {
	limit int // bytes kept for replay; 0 = none (resume is off)

	mu     sync.Mutex
	sink   Sink  // nil while detached
	sent   int64 // the number of the last message
	handed int64 // the number of the last message handed to a sink
	acked  int64 // the number of the last message the client is known to have read
	// The current sink's first numbered message is sinkBase+1, after
	// sinkExtra messages of its own (the _acpgate/resumed notification).
	sinkBase, sinkExtra int64
	kept                []outEntry
	first               int // kept[first:] are live (the rest are spent slots)
	bytes               int // capacity of the kept copies
	overflow            bool
}

// outEntry is one kept message.
type outEntry struct {
	seq  int64
	data []byte   // a pooled copy
	sess *Session // the session it is about, if any (take-over)
}

// deliver numbers msg and hands it to the sink, if any (the sink owns msg
// from then on). sess is the session the message is about, if any; wait
// lets the sink wait for room (see Sink). It reports an overflow: the
// connection must end.
func (o *outbox) deliver(msg []byte, sess *Session, wait bool) (overflow bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deliverLocked(msg, sess, wait)
}

func (o *outbox) deliverLocked(msg []byte, sess *Session, wait bool) (overflow bool) {
	o.sent++
	if o.limit > 0 {
		o.keep(msg, sess)
	}
	if o.sink == nil {
		jsonrpc.PutBuffer(msg)
		return o.overflow
	}
	o.handed = o.sent
	o.sink.Send(msg, wait)
	return false
}

// keep copies msg into the replay buffer and drops the oldest copies past
// the limit (o.mu held).
func (o *outbox) keep(msg []byte, sess *Session) {
	// Make room first; the buffer of a copy dropped for it is reused when
	// its size fits (a stream's messages are alike: no pool round trip).
	var c []byte
	need := max(len(msg), 512)
	for o.bytes+need > o.limit && o.first < len(o.kept) {
		e := &o.kept[o.first]
		if e.seq > o.handed {
			o.overflow = true // no socket ever got it: resume is no longer exact
		}
		o.bytes -= cap(e.data)
		if c == nil && fits(cap(e.data), len(msg)) {
			c = e.data[:0]
		} else {
			jsonrpc.PutBuffer(e.data)
		}
		*e = outEntry{}
		o.first++
	}
	if c == nil {
		if c = jsonrpc.GetBuffer(len(msg)); !fits(cap(c), len(msg)) {
			// A big pooled buffer would pin memory and count against the limit.
			jsonrpc.PutBuffer(c)
			c = make([]byte, 0, len(msg))
		}
	}
	c = append(c, msg...)
	o.kept = append(o.kept, outEntry{seq: o.sent, data: c, sess: sess})
	o.bytes += cap(c)
	if o.first > 64 && o.first*2 > len(o.kept) { // compact the spent slots
		n := copy(o.kept, o.kept[o.first:])
		clear(o.kept[n:])
		o.kept, o.first = o.kept[:n], 0
	}
}

// fits reports whether a buffer of capacity c suits a copy of n bytes: big
// enough, and not so big that it wastes memory.
func fits(c, n int) bool { return c >= n && c <= 2*n+1024 }

// canResumeLocked reports whether every message after the first received is
// still kept (o.mu held).
func (o *outbox) canResumeLocked(received int64) bool {
	if o.limit == 0 || o.overflow || received < 0 || received > o.sent {
		return false
	}
	if received == o.sent {
		return true
	}
	return o.first < len(o.kept) && o.kept[o.first].seq <= received+1
}

// replayLocked hands the kept messages after received to sink, in order
// (o.mu held).
func (o *outbox) replayLocked(sink Sink, received int64) {
	o.sinkBase, o.sinkExtra = received, 1
	for i := o.first; i < len(o.kept); i++ {
		if e := &o.kept[i]; e.seq > received {
			// May wait for room: a replay can hold more messages than a
			// send queue takes at once, and this client is reading.
			sink.Send(append(jsonrpc.GetBuffer(len(e.data)), e.data...), true)
		}
	}
	o.handed = o.sent
}

// sinceLocked returns copies of the kept messages about sess numbered after
// seq (o.mu held).
func (o *outbox) sinceLocked(sess *Session, seq int64) [][]byte {
	var out [][]byte
	for i := o.first; i < len(o.kept); i++ {
		if e := &o.kept[i]; e.seq > seq && e.sess == sess {
			out = append(out, append(jsonrpc.GetBuffer(len(e.data)), e.data...))
		}
	}
	return out
}

// ackLocked drops the kept messages up to the written-th message the
// current sink wrote before a ping its client answered (o.mu held).
func (o *outbox) ackLocked(written int64) {
	acked := min(o.sinkBase+written-o.sinkExtra, o.handed)
	if acked <= o.acked {
		return
	}
	o.acked = acked
	for o.first < len(o.kept) && o.kept[o.first].seq <= acked {
		e := &o.kept[o.first]
		o.bytes -= cap(e.data)
		jsonrpc.PutBuffer(e.data)
		*e = outEntry{}
		o.first++
	}
	if o.first == len(o.kept) {
		o.kept, o.first = o.kept[:0], 0
	}
}

// keptBytes is the size of the replay buffer.
func (o *outbox) keptBytes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// release gives every kept copy back.
func (o *outbox) release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := o.first; i < len(o.kept); i++ {
		jsonrpc.PutBuffer(o.kept[i].data)
	}
	o.kept, o.first, o.bytes, o.sink = nil, 0, 0, nil
	o.limit = 0 // the connection has ended: nothing more is kept
}
