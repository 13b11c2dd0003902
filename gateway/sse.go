package gateway

import (
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The SSE streams of a Streamable-HTTP connection (httpconn.go): the GET
// that becomes a stream's receiver, the writer that frames and sends its
// events, and the events kept for a Last-Event-ID reconnect.

const (
	// sseKeepAlive is how often an idle SSE stream gets a comment.
	sseKeepAlive = 15 * time.Second
	// maxSessionStreams bounds a connection's session streams, read or not.
	maxSessionStreams = 1024
)

// sseStream is one SSE stream of a connection: its queued events, the
// events sent (kept for a Last-Event-ID reconnect), and its receiver.
type sseStream struct {
	next     int64 // the id of the next event
	queue    []sseEvent
	sent     []sseEvent // oldest first
	sentSize int
	receiver bool
	wake     chan struct{} // 1-buffered: something queued
}

type sseEvent struct {
	id  int64
	msg []byte
}

func (h *httpConn) stream(name string) *sseStream {
	st := h.streams[name]
	if st == nil {
		st = &sseStream{next: 1, wake: make(chan struct{}, 1)}
		if n, ok := h.gone[name]; ok { // its ids go on where they stopped
			st.next = n
			delete(h.gone, name)
		}
		h.streams[name] = st
	}
	return st
}

func (st *sseStream) poke() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// handleSSE serves one stream of a connection until the client leaves or
// the connection ends. Headers go out at once: the SDK client waits for
// them before it posts to the session.
func (s *Server) handleSSE(w http.ResponseWriter, r *http.Request) {
	who, agent, ok := s.authenticateAgent(w, r) // refused while draining; an anonymous request learns nothing else
	if !ok {
		return
	}
	if !strings.Contains(strings.ToLower(r.Header.Get("Accept")), "text/event-stream") {
		plain(w, http.StatusNotAcceptable, "Not Acceptable")
		return
	}
	if s.forwardHTTP(w, r, who) {
		return
	}
	h, name, ok := s.lookupSession(w, r, who, agent)
	if !ok {
		return
	}
	var after int64 = -1
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			plain(w, http.StatusBadRequest, "Last-Event-ID must be an event id this stream sent")
			return
		}
		after = n
	}
	st, ok := h.receive(w, name, after)
	if !ok {
		return
	}
	defer h.release(name, st)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // proxies must not hold events back
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	h.sendEvents(r, rc, w, st)
}

// receive makes the request the receiver of stream name, first putting
// back the events sent after Last-Event-ID (after, -1: none), or answers
// why not.
func (h *httpConn) receive(w http.ResponseWriter, name string, after int64) (*sseStream, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing || h.done {
		plain(w, http.StatusNotFound, "Unknown Acp-Connection-Id")
		return nil, false
	}
	if h.streams[name] == nil && len(h.streams) > maxSessionStreams {
		plain(w, http.StatusTooManyRequests, fmt.Sprintf("at most %d session event streams per connection", maxSessionStreams))
		return nil, false
	}
	st := h.stream(name)
	if st.receiver {
		plain(w, http.StatusConflict, "Outbound stream already has an active receiver")
		return nil, false
	}
	if after >= 0 {
		keptBefore, queuedBefore := st.sentSize, len(st.queue)
		requeued, ok := st.rewind(after, h.giveBack)
		if !ok {
			writeJSONError(w, http.StatusNotFound, "resume_refused", "the events after Last-Event-ID are no longer kept; start a new connection and session/load")
			return nil, false
		}
		h.kept -= keptBefore
		if n := len(st.queue) - queuedBefore; n > 0 {
			if h.queued == 0 {
				h.queuedSince = time.Now().UnixNano()
			}
			h.queued += n
			h.queuedBytes += requeued
		}
	}
	st.receiver = true
	return st, true
}

// sendEvents writes what stream st queues until the client leaves or the
// connection ends; what was queued before the end goes out first, as a
// WebSocket's queue goes before its close frame.
func (h *httpConn) sendEvents(r *http.Request, rc *http.ResponseController, w http.ResponseWriter, st *sseStream) {
	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	var buf []byte
	for {
		var n, size int
		h.gather(st)
		buf, n, size = h.takeEvents(st, buf[:0])
		if n > 0 {
			ok := writeSSE(rc, w, buf, h.writeWait)
			h.mu.Lock()
			h.tookLocked(n, size) // counted as queued until written
			h.writing--
			h.wroteAt = time.Now()
			h.progressLocked()
			h.mu.Unlock()
			h.wrote(n, len(buf))
			if !ok {
				return
			}
			continue
		}
		if cap(buf) > maxIdleFrameBuf {
			buf = nil // an idle stream keeps no big batch's copy (a busy one reuses it)
		}
		select {
		case <-st.wake:
		case <-h.ctx.Done():
			h.mu.Lock()
			left := len(st.queue)
			h.mu.Unlock()
			if left == 0 {
				return
			}
		case <-r.Context().Done():
			return
		case <-keepAlive.C:
			if !writeSSE(rc, w, []byte(":\n\n"), h.writeWait) {
				return
			}
		}
	}
}

// gather lets the relay's goroutines run once before the stream's writer
// takes a small queue, as a WebSocket's writer does (wsConn.gatherLocked).
// An empty one too: after a write, what the relay queues meanwhile goes out
// without the writer first sleeping on its wake channel (interleaved, 9
// runs each, yielding on an empty queue streamed 5% more 20 KB messages).
func (h *httpConn) gather(st *sseStream) {
	h.mu.Lock()
	small := len(st.queue) < smallBatch
	h.mu.Unlock()
	if small {
		runtime.Gosched()
	}
}

// maxIdleFrameBuf is the largest framing buffer a stream's writer keeps
// while it waits for events.
const maxIdleFrameBuf = 1 << 20

// maxFrameBatch bounds what one write of a stream frames (at least one
// event): what is being written counts against send_queue_bytes, so a
// batch of the whole queue would leave the relay no room until it is
// written, and its framed copy would double what the queue holds. 256 KiB
// streamed 20 KB events 1.12x as fast as 1 MiB, and 4 MiB 0.80x (load
// -scenario stream -transport http -reps 11, interleaved).
const maxFrameBatch = 256 << 10

// takeEvents frames what st queues, up to maxFrameBatch, into buf and
// keeps it for Last-Event-ID: the events are framed before they are kept,
// for once kept, another stream's writer may evict (and recycle) them. It returns how many, and
// their size: they count as queued until the writer has written buf
// (tookLocked).
func (h *httpConn) takeEvents(st *sseStream, buf []byte) ([]byte, int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	events := st.queue
	n, size := 0, 0
	for _, ev := range events {
		if n > 0 && len(buf) >= maxFrameBatch {
			break // the rest waits for the next batch
		}
		buf = append(buf, "id: "...)
		buf = strconv.AppendInt(buf, ev.id, 10)
		buf = append(buf, "\ndata: "...)
		buf = append(buf, ev.msg...)
		buf = append(buf, "\n\n"...)
		size += len(ev.msg)
		h.keep(st, ev)
		n++
	}
	clear(events[:n])
	if st.queue = events[n:]; len(st.queue) == 0 {
		st.queue = nil
	}
	if n > 0 {
		h.writing++
	}
	return buf, n, size
}

// writeSSE writes and flushes within the write timeout: a receiver that
// stops reading is cut off rather than hold the stream.
func writeSSE(rc *http.ResponseController, w http.ResponseWriter, b []byte, timeout time.Duration) bool {
	_ = rc.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := w.Write(b); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// keep records a sent event for a Last-Event-ID reconnect. What all of a
// connection's streams keep is bounded by sessions.replay_buffer_bytes: the
// oldest events of this stream go first, then other streams' (h.mu held).
func (h *httpConn) keep(st *sseStream, ev sseEvent) {
	st.sent = append(st.sent, ev)
	st.sentSize += len(ev.msg)
	h.kept += len(ev.msg)
	for h.kept > h.history {
		victim := st
		if len(st.sent) <= 1 { // keep the event just sent if anything else can go
			for _, o := range h.streams {
				if o != st && len(o.sent) > 0 {
					victim = o
					break
				}
			}
		}
		if len(victim.sent) == 0 {
			return
		}
		n := len(victim.sent[0].msg)
		victim.sentSize -= n
		h.kept -= n
		h.giveBack(victim.sent[0].msg) // the sink owns what it was sent
		victim.sent[0] = sseEvent{}
		victim.sent = victim.sent[1:]
	}
}

// rewind puts the events sent after id back in front of the queue, and
// forgets those up to it (the client has them: their buffers go to
// giveBack). It returns the bytes put back, and false when the stream no
// longer holds every event after id.
func (st *sseStream) rewind(after int64, giveBack func([]byte)) (int, bool) {
	if after >= st.next {
		return 0, false
	}
	first := st.next
	if len(st.sent) > 0 {
		first = st.sent[0].id
	} else if len(st.queue) > 0 {
		first = st.queue[0].id
	}
	if after+1 < first {
		return 0, false
	}
	var again []sseEvent
	n := 0
	for _, ev := range st.sent {
		if ev.id > after {
			again = append(again, ev)
			n += len(ev.msg)
		} else {
			giveBack(ev.msg) // the client has it
		}
	}
	st.sent, st.sentSize = nil, 0
	st.queue = append(again, st.queue...)
	return n, true
}

// release detaches a stream's receiver; a session stream left empty goes.
func (h *httpConn) release(name string, st *sseStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st.receiver = false
	h.lastUse = time.Now()
	h.progressLocked()
	if name != "" && len(st.queue) == 0 && len(st.sent) == 0 && h.streams[name] == st {
		delete(h.streams, name)
		if st.next > 1 { // a reconnect with Last-Event-ID must find where it was
			if len(h.gone) >= maxSessionStreams {
				for k := range h.gone { // bounded: one forgotten (its reconnect is refused, 404)
					delete(h.gone, k)
					break
				}
			}
			h.gone[name] = st.next
		}
	}
}
