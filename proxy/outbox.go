package proxy

import (
	"sync"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// outbox is everything a connection sends its client, in order and
// numbered from 1 (the client counts what it receives the same way). While
// a socket is attached a message is handed to its sink at once. The outbox
// also keeps the most recent messages, up to limit bytes, so that
// a client whose socket died can resume from the last message it received,
// even if messages were in flight when the socket died. A message the
// client is known to have read (the socket answered a ping sent after it:
// see acked) is not kept any longer, so a live connection keeps only what
// may still be in flight. While no socket is
// attached (detached) messages are only kept; one that would have to be
// dropped before any socket got it ends the connection (overflow), since it
// could no longer be resumed exactly.
//
// A kept message is the very buffer the sink was handed, not a copy: while
// the outbox keeps messages (limit > 0, Conn.KeepsSent) the sink only
// borrows them and never gives them back to the buffer pool. The outbox
// gives a buffer back once the client is known to have read it (so the
// sink has written it), or once it drops it for room after the current
// sink has written it (WrittenSink), unless a superseded sink may still
// hold it (shared); any other it drops, and all at the end, are left to
// the garbage collector, since a sink may still be writing them.
//
// The outbox decides nothing about the socket's own queue: the sink does
// (Sink.Send).
type outbox struct {
	limit int          // bytes kept for replay; 0 = none (resume is off)
	put   func([]byte) // gives a dropped buffer back (nil: jsonrpc.PutBuffer; tests watch it)

	mu     sync.Mutex
	sink   Sink  // nil while detached
	sent   int64 // the number of the last message
	handed int64 // the number of the last message handed to a sink
	acked  int64 // the number of the last message the client is known to have read
	// The current sink's first numbered message is sinkBase+1, after
	// sinkExtra messages of its own (the _acpgate/resumed notification).
	sinkBase, sinkExtra int64
	shared              int64 // kept messages up to this one may be held by a superseded sink: never pooled
	kept                []outEntry
	first               int // kept[first:] are live (the rest are spent slots)
	bytes               int // capacity of the kept buffers
	overflow            bool
}

// outEntry is one kept message.
type outEntry struct {
	seq  int64
	data []byte   // the buffer the sink was handed
	sess *Session // the session it is about, if any (take-over)
}

// deliver numbers msg and hands it to the sink, if any (the sink owns msg
// from then on). sess is the session the message is about, if any; wait
// lets the sink wait for room (see Sink). It reports an overflow: the
// connection must end.
func (o *outbox) deliver(msg []byte, sess *Session, wait bool) (overflow bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deliverLocked(msg, sess, Facts{}, wait)
}

// deliverLocked is deliver with o.mu held; f is what the relay knows of msg
// (zero: nothing), for a sink that routes by it (FactSink).
func (o *outbox) deliverLocked(msg []byte, sess *Session, f Facts, wait bool) (overflow bool) {
	o.sent++
	if o.limit > 0 {
		msg = o.keep(msg, sess)
	}
	if o.sink == nil {
		if o.limit == 0 {
			jsonrpc.PutBuffer(msg)
		}
		return o.overflow
	}
	o.handed = o.sent
	if fs, ok := o.sink.(FactSink); ok && f.known() {
		fs.SendScanned(msg, f.ID, f.Method, f.SessionID, wait)
	} else {
		o.sink.Send(msg, wait)
	}
	return false
}

// keep keeps msg in the replay buffer and drops the oldest messages past
// the limit (o.mu held). A dropped buffer goes back to the pool only if the
// current sink has written it (writtenLocked). It returns the buffer to send: msg itself, or, when
// msg sits in a pooled buffer much bigger than it (which would pin memory
// and count against the limit), a copy that fits; no one else holds msg
// yet, so it goes back to the pool.
func (o *outbox) keep(msg []byte, sess *Session) []byte {
	if !fits(cap(msg), len(msg)) {
		c := append(make([]byte, 0, len(msg)), msg...)
		jsonrpc.PutBuffer(msg)
		msg = c
	}
	size := max(cap(msg), 512)
	written := o.writtenLocked()
	for o.bytes+size > o.limit && o.first < len(o.kept) {
		e := &o.kept[o.first]
		if e.seq > o.handed {
			o.overflow = true // no socket ever got it: resume is no longer exact
		}
		o.bytes -= max(cap(e.data), 512)
		if e.seq > o.shared && e.seq <= written { // the current sink is done with it
			o.giveBack(e.data)
		}
		*e = outEntry{}
		o.first++
	}
	o.kept = append(o.kept, outEntry{seq: o.sent, data: msg, sess: sess})
	o.bytes += size
	if o.first > 64 && o.first*2 > len(o.kept) { // compact the spent slots
		n := copy(o.kept, o.kept[o.first:])
		clear(o.kept[n:])
		o.kept, o.first = o.kept[:n], 0
	}
	return msg
}

// giveBack returns a kept buffer no one holds any more to the pool.
func (o *outbox) giveBack(b []byte) {
	if o.put != nil {
		o.put(b)
		return
	}
	jsonrpc.PutBuffer(b)
}

// writtenLocked is the number of the last message the current sink has
// written to its socket (0: none, or a sink that does not say).
func (o *outbox) writtenLocked() int64 {
	ws, ok := o.sink.(WrittenSink)
	if !ok {
		return 0
	}
	return min(o.sinkBase+ws.Written()-o.sinkExtra, o.handed)
}

// fits reports whether a buffer of capacity c suits a message of n bytes:
// big enough, and not so big that it wastes memory.
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
	o.shared = o.sent // the old sink may still be writing any of them
	for i := o.first; i < len(o.kept); i++ {
		if e := &o.kept[i]; e.seq > received {
			// May wait for room: a replay can hold more messages than a
			// send queue takes at once, and this client is reading.
			sink.Send(e.data, true)
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
		o.bytes -= max(cap(e.data), 512)
		if e.seq > o.shared { // written by the current sink, and read
			o.giveBack(e.data)
		}
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

// release forgets every kept message; the buffers are left to the garbage
// collector, since a sink may still be writing them.
func (o *outbox) release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kept, o.first, o.bytes, o.sink = nil, 0, 0, nil
	o.limit = 0 // the connection has ended: nothing more is kept
}
