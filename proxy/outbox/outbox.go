// Package outbox is what one client connection sends its client: every
// message numbered, handed to the connection's current socket (its Sink),
// and kept, up to a byte limit, so that a client whose socket died can
// resume on a new one from the last message it received. It replays on a
// resume, gives a take-over the messages kept about one session, and
// forgets what the client is known to have read.
//
// # Who owns a pooled buffer
//
// A message comes to a Box in a buffer from jsonrpc's pool
// (jsonrpc.GetBuffer), owned by the caller until it delivers it. Then:
//
//   - A Box that keeps nothing (limit 0) hands the buffer to its sink,
//     which owns it from then on and gives it back to the pool once
//     written; with no sink the Box gives it back at once.
//   - A Box that keeps messages (limit > 0) owns the buffer from then on.
//     Its sinks only borrow it: they never change it and never give it
//     back, even when they drop it. The Box gives it back when the
//     client is known to have read it (AckLocked), or when it drops it for
//     room after the current sink has written it (WrittenSink), unless a
//     sink it has since replaced may still hold it. Any other buffer it
//     drops, and every buffer kept at Release, is left to the garbage
//     collector, since a sink may still be writing it. A pooled buffer
//     much bigger than its message is not kept: the message is copied into
//     a new buffer that fits, kept instead, and the pooled one given back
//     at once.
//   - SinceLocked returns copies in new pooled buffers: the caller owns them.
package outbox

import (
	"sync"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Sink carries messages to one client: the gateway implements it over a
// WebSocket and over Streamable HTTP's event streams. A Box's sink changes
// when the client resumes on a new socket (ResumeLocked).
type Sink interface {
	// Send queues msg. The sink owns msg from now on (it may give it back
	// to jsonrpc's buffer pool once written), unless its Box keeps what it
	// sends for a resume (the connection's KeepsSent): then the sink only
	// borrows msg and must neither change nor pool it. With wait false it
	// never blocks: when the client has fallen too far behind, the sink
	// closes its socket and returns false (the connection then detaches and
	// keeps the messages for a resume). With wait true it may wait for room
	// as long as the client keeps reading, until its writer has made no
	// progress for a second: backpressure, which the relay asks for only
	// when no other client's session shares the agent process, and which
	// a resumed socket's catch-up (CatchUp) uses, holding up no one else.
	Send(msg []byte, wait bool) bool
	// Supersede closes the socket: the client resumed on another one.
	Supersede()
}

// FactSink is a Sink that routes a message by what the relay already knows
// of it instead of scanning it again (Streamable HTTP picks the stream an
// event goes to by the answer's id, or the call's method and session).
// SendScanned is Send with those facts: id is the client's raw id of an
// answer (nil for a call), method a call's method, sessionID the session
// ID the client sees ("" for none).
type FactSink interface {
	SendScanned(msg, id []byte, method, sessionID string, wait bool) bool
}

// WrittenSink is a Sink that counts the messages it has written to its
// socket, in the order it was handed them, including any it sent of its
// own accord first (Written). A kept message the sink has written may be
// pooled once the replay buffer drops it for room.
type WrittenSink interface {
	Written() int64
}

// Facts are what the relay knows of a message it delivers (FactSink).
type Facts struct {
	ID        []byte
	Method    string
	SessionID string
}

func (f Facts) known() bool { return f.ID != nil || f.Method != "" }

// Box is everything a connection sends its client, in order and numbered
// from 1 (the client counts what it receives the same way). While a sink
// is attached a message is handed to it at once, unless the sink resumed
// and is still catching up (CatchUp): then it waits its turn, kept. A Box
// with a limit also keeps the most recent messages, up to limit bytes,
// each tagged with what it is about (T: the session, for a take-over), so
// that a client whose socket died can resume from the last message it
// received, even if messages were in flight when the socket died. A
// message the client is known to have read (its socket answered a ping
// sent after it: AckLocked) is not kept any longer, so a live connection
// keeps only what may still be in flight. While no sink is attached
// (detached) messages are only kept; one that would have to be dropped
// before any sink got it (or, catching up, before the resumed sink got it)
// is an overflow: the connection must end, since it could no longer be
// resumed exactly.
//
// A kept message is the very buffer the sink was handed, not a copy: the
// Box is the one owner of a kept buffer, from its delivery until the Box
// gives it back to jsonrpc's pool or leaves it to the garbage collector
// (see the package doc); its sinks only borrow it.
//
// The Box decides nothing about the socket's own queue: the sink does
// (Sink.Send). Its methods whose names end in Locked are called with the
// Box locked (Lock); the others lock it themselves. Its lock is taken after its
// connection's and before its sink's own.
type Box[T comparable] struct {
	limit int          // bytes kept for replay; 0 = none (resume is off)
	put   func([]byte) // gives a dropped buffer back (nil: jsonrpc.PutBuffer; tests watch it)

	mu     sync.Mutex
	sink   Sink  // nil while detached
	sent   int64 // the number of the last message
	handed int64 // the number of the last message handed to a sink
	acked  int64 // the number of the last message the client is known to have read
	// The current sink's first numbered message is sinkBase+1, after
	// sinkExtra messages of its own (the resume's greeting).
	sinkBase, sinkExtra int64
	shared              int64 // kept messages up to this one may be held by a superseded sink: never pooled
	// catching: the sink resumed and CatchUp has yet to hand it messages
	// up to sent; deliveries are only kept meanwhile, and handed is the
	// last message CatchUp handed it.
	catching bool
	kept     []entry[T]
	first    int // kept[first:] are live (the rest are spent slots)
	bytes    int // capacity of the kept buffers
	overflow bool
}

// entry is one kept message.
type entry[T comparable] struct {
	seq  int64
	data []byte // the buffer the sink was handed
	tag  T      // what it is about (its session, for a take-over)
}

// Init gives a new Box its first sink (nil: none) and the bytes it keeps
// for a resume (0: none), before anyone else uses it.
func (o *Box[T]) Init(sink Sink, limit int) { o.sink, o.limit = sink, limit }

// Lock locks the Box, for the methods whose names end in Locked. A caller that locks
// two Boxes at once locks them in one fixed order.
func (o *Box[T]) Lock() { o.mu.Lock() }

// Unlock unlocks the Box.
func (o *Box[T]) Unlock() { o.mu.Unlock() }

// Deliver is DeliverLocked with no facts, locking the Box.
func (o *Box[T]) Deliver(msg []byte, tag T, wait bool) (overflow bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.DeliverLocked(msg, tag, Facts{}, wait)
}

// DeliverLocked numbers msg, keeps it (a Box with a limit) and hands it to
// the sink, if any; the Box or the sink owns msg from then on (see the
// package doc). tag is what msg is about (the zero T: nothing); f is what
// the relay knows of msg (zero: nothing), for a sink that routes by it
// (FactSink); wait lets the sink wait for room (see Sink). It reports an
// overflow: the connection must end.
func (o *Box[T]) DeliverLocked(msg []byte, tag T, f Facts, wait bool) (overflow bool) {
	o.sent++
	if o.limit > 0 {
		msg = o.keep(msg, tag)
	}
	if o.sink == nil || o.catching { // kept for a resume, or for CatchUp
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
// the limit. A dropped buffer goes back to the pool only if the current
// sink has written it (writtenLocked). It returns the buffer to send: msg
// itself, or, when msg sits in a pooled buffer much bigger than it (which
// would pin memory and count against the limit), a copy that fits; no one
// else holds msg yet, so it goes back to the pool.
func (o *Box[T]) keep(msg []byte, tag T) []byte {
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
			o.overflow = true // no sink ever got it: resume is no longer exact
		}
		o.bytes -= max(cap(e.data), 512)
		if e.seq > o.shared && e.seq <= written { // the current sink is done with it
			o.giveBack(e.data)
		}
		*e = entry[T]{}
		o.first++
	}
	o.kept = append(o.kept, entry[T]{seq: o.sent, data: msg, tag: tag})
	o.bytes += size
	if o.first > 64 && o.first*2 > len(o.kept) { // compact the spent slots
		n := copy(o.kept, o.kept[o.first:])
		clear(o.kept[n:])
		o.kept, o.first = o.kept[:n], 0
	}
	return msg
}

// giveBack returns a kept buffer no one holds any more to the pool.
func (o *Box[T]) giveBack(b []byte) {
	if o.put != nil {
		o.put(b)
		return
	}
	jsonrpc.PutBuffer(b)
}

// writtenLocked is the number of the last message the current sink has
// written to its socket (0: none, or a sink that does not say).
func (o *Box[T]) writtenLocked() int64 {
	ws, ok := o.sink.(WrittenSink)
	if !ok {
		return 0
	}
	return min(o.sinkBase+ws.Written()-o.sinkExtra, o.handed)
}

// fits reports whether a buffer of capacity c suits a message of n bytes:
// big enough, and not so big that it wastes memory.
func fits(c, n int) bool { return c >= n && c <= 2*n+1024 }

// SinkLocked returns the current sink (nil: detached).
func (o *Box[T]) SinkLocked() Sink { return o.sink }

// SentLocked returns the number of the last message delivered.
func (o *Box[T]) SentLocked() int64 { return o.sent }

// HandedLocked returns the number of the last message handed to the
// current sink, or the last one before a detach: SentLocked, except while
// a resumed sink catches up.
func (o *Box[T]) HandedLocked() int64 { return o.handed }

// DetachLocked drops the current sink: messages are only kept until a
// resume.
func (o *Box[T]) DetachLocked() { o.sink, o.catching = nil, false }

// CanResumeLocked reports whether every message after the first received
// is still kept.
func (o *Box[T]) CanResumeLocked(received int64) bool {
	if o.limit == 0 || o.overflow || received < 0 || received > o.sent {
		return false
	}
	if received == o.sent {
		return true
	}
	return o.first < len(o.kept) && o.kept[o.first].seq <= received+1
}

// ResumeLocked makes sink the Box's sink for a client that has received
// the first received messages (CanResumeLocked said yes): the old sink, if
// any, is superseded, and sink is sent greeting (a message of the
// connection's own, not numbered) and marked as catching up. It hands sink
// nothing else: the caller then calls CatchUp, with no lock held, which
// hands it the kept messages after received, then whatever was delivered
// meanwhile, in order. It reports whether there was an old sink.
func (o *Box[T]) ResumeLocked(sink Sink, received int64, greeting []byte) (superseded bool) {
	old := o.sink
	if old != nil {
		old.Supersede()
	}
	sink.Send(greeting, false)
	o.sink, o.catching = sink, true
	o.sinkBase, o.sinkExtra = received, 1
	o.shared = o.sent // the old sink may still be writing any of them
	o.handed = received
	return old != nil
}

// CatchUp hands sink, resumed by ResumeLocked, the messages it has not
// been handed yet, one at a time and in order, each with the Box unlocked
// while sink takes it: sink may wait for room (a replay can hold more than
// a send queue takes at once), and meanwhile the Box takes deliveries,
// which keep what they bring for CatchUp to hand over next. It returns
// once sink has been handed everything (it is then live: deliveries go to
// it directly), or when sink can take no more (it refused a message: its
// socket is closing), is no longer the Box's sink (superseded, detached,
// released), or missed a message dropped for room (an overflow, which a
// delivery reports).
func (o *Box[T]) CatchUp(sink Sink) {
	for {
		o.mu.Lock()
		if o.sink != sink || !o.catching || o.overflow {
			o.mu.Unlock()
			return
		}
		if o.handed == o.sent {
			o.catching = false
			o.mu.Unlock()
			return
		}
		// Kept messages are numbered without gaps from kept[first]; the
		// next one is still kept, or its drop was an overflow.
		i := o.first + int(o.handed+1-o.kept[o.first].seq)
		msg := o.kept[i].data
		o.handed++
		o.mu.Unlock()
		// Safe unlocked: the Box gives a kept buffer back to the pool only
		// once this sink has written it (writtenLocked), and never one a
		// superseded sink may hold (shared); nobody changes it.
		if !sink.Send(msg, true) {
			return
		}
	}
}

// SinceLocked returns copies, in new pooled buffers the caller owns, of the
// kept messages tagged tag numbered after seq.
func (o *Box[T]) SinceLocked(tag T, seq int64) [][]byte {
	var out [][]byte
	for i := o.first; i < len(o.kept); i++ {
		if e := &o.kept[i]; e.seq > seq && e.tag == tag {
			out = append(out, append(jsonrpc.GetBuffer(len(e.data)), e.data...))
		}
	}
	return out
}

// AckLocked drops the kept messages up to the written-th message the
// current sink wrote before a ping its client answered.
func (o *Box[T]) AckLocked(written int64) {
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
		*e = entry[T]{}
		o.first++
	}
	if o.first == len(o.kept) {
		o.kept, o.first = o.kept[:0], 0
	}
}

// KeptBytes is the size of the replay buffer.
func (o *Box[T]) KeptBytes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// Limit is the most the Box keeps, in bytes (0: nothing, or it was
// released).
func (o *Box[T]) Limit() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.limit
}

// Release forgets every kept message and keeps nothing from now on: the
// connection has ended. The buffers are left to the garbage collector,
// since a sink may still be writing them.
func (o *Box[T]) Release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kept, o.first, o.bytes, o.sink, o.catching = nil, 0, 0, nil, false
	o.limit = 0
}
