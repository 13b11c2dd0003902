package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// link is the life of one client connection, whichever its transport:
// admission and the registry, the bounded send queue and its slow-client
// rule, the handshake and idle timer, metrics and the close. It is the
// proxy.Conn's sink. What differs between a WebSocket (frames on one
// socket) and Streamable HTTP (POSTs in, event streams out) is behind
// transport; both embed a link.
type link struct {
	// Static after construction.
	s           *Server
	t           transport
	kind        string // the metrics transport label: websocket, http
	id          string
	tenant      string
	subject     string // who the credential names (auth.Identity.Subject)
	affinity    string // the balancer's affinity cookie on the opening request (linkInfo)
	remote      string // the opening request's remote address
	agent       string
	tenantLabel string
	log         *slog.Logger
	cfg         *config.Config // the configuration the connection started with
	start       time.Time
	ctx         context.Context // ends with the connection
	cancel      context.CancelFunc
	maxMsgs     int           // limits.send_queue_messages
	maxBytes    int           // limits.send_queue_bytes
	handshake   time.Duration // no handshake within it closes the connection
	idle        time.Duration // idle that long closes it (0: never)
	writeWait   time.Duration // a batch not written within it closes it (timeouts.write)

	// Set before the link is registered, read-only afterwards.
	conn      *proxy.Conn
	keepsSent bool // conn keeps what it sends for a resume: messages are borrowed, never pooled (proxy.Sink)

	bg sync.WaitGroup // goroutines the connection started; serve waits for them

	// Guarded by mu, which the transport's own state shares.
	mu          sync.Mutex
	done        bool // the connection is ending: start nothing more
	closing     bool // a close is decided: queue nothing more
	closeReason string
	closeLabel  string // the metrics label of the close
	closeReq    chan struct{}
	opened      bool          // counted in acpgate_connections_open
	queued      int           // messages handed to the transport and not yet written: queued or being written
	queuedBytes int           // their bytes
	queuedSince int64         // unix nanos queued last became non-zero
	room        chan struct{} // closed when a writer takes messages; nil until a sender waits
	timer       *time.Timer   // runs tick

	// Owned by tick, which runs one at a time.
	handshakeAt, nextIdle time.Time

	msgsIn, msgsOut, bytesIn, bytesOut atomic.Int64
	lastRead                           atomic.Int64 // unix nanos of the last message read
	lastWrite                          atomic.Int64 // unix nanos of the last message written
}

// transport is what a link's transport does its own way. Methods named
// Locked run with link.mu held.
type transport interface {
	// routeLocked picks the queue of a message for the client; facts, if
	// not nil, are what the caller read of it already. taken: the
	// transport delivered it another way and owns it.
	routeLocked(msg []byte, facts *msgFacts) (queue string, taken bool)
	// pushLocked appends msg to queue and wakes its writer; false refuses
	// it (the transport has decided a close).
	pushLocked(queue string, msg []byte) bool
	// dropQueuedLocked gives back what the queues hold (a slow client) and
	// says how many messages and bytes that was; what a writer is writing
	// stays counted until it is done with it (tookLocked).
	dropQueuedLocked() (n, bytes int)
	// closeLocked starts the end of the connection after what is queued
	// (closeReason and closeLabel are set).
	closeLocked()
	// handshakeDone reports whether the handshake timeout no longer applies.
	handshakeDone() bool
	// idleSince is when the connection last did something, and whether it
	// is busy now (never idle then).
	idleSince() (last time.Time, busy bool)
	// tick does the transport's own periodic work when due and returns
	// when it is due next (zero: never).
	tick(now time.Time) time.Time
	// leftLocked reports whether the client has gone without closing the
	// connection: nothing it could still receive (a drain need not wait
	// for it). A WebSocket's client goes by closing it.
	leftLocked() bool
}

// linkInfo is what a new link is made of.
type linkInfo struct {
	kind, id, tenant, subject, agent string
	affinity                         string // "NAME=VALUE" of the balancer's affinity cookie, if the request had it
	remote                           string // the opening request's remote address
	log                              *slog.Logger
	cfg                              *config.Config
	handshake, idle                  time.Duration
}

func (l *link) init(s *Server, t transport, in linkInfo) {
	l.s, l.t, l.kind, l.id, l.tenant, l.subject, l.agent, l.log, l.cfg = s, t, in.kind, in.id, in.tenant, in.subject, in.agent, in.log, in.cfg
	l.affinity, l.remote = in.affinity, in.remote
	l.tenantLabel = s.metrics.tenants.Label(in.tenant)
	l.start = time.Now()
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.maxMsgs, l.maxBytes = in.cfg.Limits.SendQueueMessages, in.cfg.Limits.SendQueueBytes
	l.handshake, l.idle = in.handshake, in.idle
	l.writeWait = in.cfg.Timeouts.WriteTimeout(in.cfg.WebSocket)
	l.closeReq = make(chan struct{})
	now := l.start.UnixNano()
	l.lastRead.Store(now)
	l.lastWrite.Store(now)
}

// newConn makes the link's proxy connection, which holds the tenant slot
// (taken by admit) until it ends for good: onEnd runs then too.
func (l *link) newConn(noResume bool, onEnd func()) error {
	release := func() {
		l.s.links.giveSlot(l.tenant)
		l.s.replicas.connEnded(l.id)
		if onEnd != nil {
			onEnd()
		}
	}
	conn, err := l.s.relay.NewConn(proxy.ConnInfo{ID: l.id, Tenant: l.tenant, Subject: l.subject, Agent: l.agent, Log: l.log,
		NoResume: noResume, OnEnd: release, Affinity: l.affinity, Transport: l.kind, Remote: l.remote}, l)
	if err != nil {
		l.s.links.giveSlot(l.tenant)
		return fmt.Errorf("new connection: %w", err)
	}
	l.setConn(conn)
	l.s.replicas.connStarted(l.id)
	return nil
}

// setConn makes conn the link's connection.
func (l *link) setConn(conn *proxy.Conn) {
	l.conn, l.keepsSent = conn, conn.KeepsSent()
}

// giveBack returns a message the transport is done with (written, refused
// or dropped) to the buffer pool, unless the connection keeps it for a
// resume: then the relay's outbox owns it (proxy.Sink).
func (l *link) giveBack(msg []byte) {
	if !l.keepsSent {
		jsonrpc.PutBuffer(msg)
	}
}

// admit counts a new connection against its tenant's max_connections, or
// answers 429.
func (s *Server) admit(w http.ResponseWriter, tenant string) bool {
	limit := 0
	if t := tenantOf(s.config(), tenant); t != nil {
		limit = t.MaxConnections
	}
	if s.links.takeSlot(tenant, limit) {
		return true
	}
	s.metrics.authFailures.WithLabelValues("too_many_connections").Inc()
	writeJSONError(w, http.StatusTooManyRequests, "too_many_connections",
		fmt.Sprintf("tenant %q has reached its max_connections", tenant))
	return false
}

// serve runs a registered link until run returns why it ended (label, the
// metrics reason; clean: the proxy connection ends for good, else it may
// detach), then ends it: it waits for the goroutines the connection
// started, tells the proxy connection and leaves the registry.
func (l *link) serve(run func() (label string, clean bool, attrs []any)) {
	defer l.s.links.serveDone()
	l.startTimer()
	label, clean, attrs := run()
	l.cancel()
	l.mu.Lock()
	l.done = true
	if l.timer != nil {
		l.timer.Stop()
	}
	opened := l.opened
	l.mu.Unlock()
	l.bg.Wait()
	l.conn.SocketEnded(l, clean)
	l.s.links.unregister(l)
	if opened {
		l.s.metrics.connsOpen.WithLabelValues(l.tenantLabel, l.kind, l.agent).Dec()
		l.s.metrics.connsTotal.WithLabelValues(l.tenantLabel, label, l.kind, l.agent).Inc()
	}
	l.recordClosed(label, attrs)
	l.log.Info("connection closed", append([]any{
		"duration", time.Since(l.start).Round(time.Millisecond),
		"msgs_in", l.msgsIn.Load(), "msgs_out", l.msgsOut.Load(),
		"bytes_in", l.bytesIn.Load(), "bytes_out", l.bytesOut.Load()}, attrs...)...)
}

// markOpen counts the connection as open, once, unless it is ending.
func (l *link) markOpen() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opened || l.done || l.closing {
		return
	}
	l.opened = true
	l.s.metrics.connsOpen.WithLabelValues(l.tenantLabel, l.kind, l.agent).Inc()
}

// closeWith closes the connection after what is queued; label is the
// close's metrics label. Only the first close counts; it never blocks.
func (l *link) closeWith(reason, label string) {
	l.mu.Lock()
	l.closeLocked(reason, label)
	l.mu.Unlock()
}

func (l *link) closeLocked(reason, label string) {
	if l.closing {
		return
	}
	l.closing = true
	l.closeReason, l.closeLabel = reason, label
	close(l.closeReq)
	l.t.closeLocked()
}

// closeState returns the close decided, if any.
func (l *link) closeState() (reason, label string, closing bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closeReason, l.closeLabel, l.closing
}

// left reports whether the connection has nothing left to send and its
// client can receive nothing more (transport.leftLocked).
func (l *link) left() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queued == 0 && l.t.leftLocked()
}

// goingAway closes the connection for a drain (label shutdown): what is
// queued goes out first.
func (l *link) goingAway(reason string) { l.closeWith(reason, "shutdown") }

// Supersede implements proxy.Sink: the client resumed on another socket.
func (l *link) Supersede() { l.closeWith("superseded by a resumed connection", "superseded") }

// Written implements proxy.WrittenSink: the messages written to the
// client so far. A WebSocket writes them in the order they were handed
// over; Streamable HTTP does not (its streams), but it keeps nothing for
// a resume (proxy.ConnInfo.NoResume), so nothing reads its count.
func (l *link) Written() int64 { return l.msgsOut.Load() }

// stallTimeout is how long a full send queue may go without a writer
// making progress before the client counts as not reading.
const stallTimeout = time.Second

// Send implements proxy.Sink: it queues msg for the client and closes the
// connection (slow_client) when the client falls too far behind the send
// queue's limits (limits.send_queue_messages and _bytes, over all of the
// transport's queues). With wait, a full queue whose writers keep making
// progress (the client reads as fast as the gateway can send) is waited
// on instead, until they make none for stallTimeout; the relay asks for
// that only when no other client shares the agent process, whose output is
// held up meanwhile, and for a resumed socket's replay, which holds up
// nothing else (proxy.Conn.Resume).
func (l *link) Send(msg []byte, wait bool) bool { return l.send(msg, nil, wait) }

// msgFacts is what routing needs of a message: its raw id, its method and
// params.sessionId, when that is a string.
type msgFacts struct {
	id     []byte
	method string
	sid    string
	hasSID bool
}

// SendScanned is Send for a caller that has scanned msg already (the
// relay): id is its raw JSON-RPC id (nil: none), method its method ("":
// a response) and sessionID its params.sessionId ("": none). The HTTP
// transport then routes msg without scanning it a second time; the relay
// calls it instead of Send when its sink has it.
func (l *link) SendScanned(msg, id []byte, method, sessionID string, wait bool) bool {
	return l.send(msg, &msgFacts{id: id, method: method, sid: sessionID, hasSID: sessionID != ""}, wait)
}

func (l *link) send(msg []byte, facts *msgFacts, wait bool) bool {
	l.mu.Lock()
	if l.closing || l.done {
		l.mu.Unlock()
		l.giveBack(msg)
		return false
	}
	queue, taken := l.t.routeLocked(msg, facts)
	if taken {
		l.mu.Unlock()
		return true
	}
	if wait {
		l.waitRoomLocked(len(msg))
	}
	switch {
	case l.closing || l.done || l.ctx.Err() != nil:
	case l.fullLocked(len(msg)) && !l.burstLocked(len(msg)):
		l.slowLocked()
	case l.t.pushLocked(queue, msg):
		if l.queued == 0 {
			l.queuedSince = time.Now().UnixNano()
		}
		l.queued++
		l.queuedBytes += len(msg)
		l.mu.Unlock()
		return true
	}
	l.mu.Unlock()
	l.giveBack(msg) // refused
	return false
}

func (l *link) fullLocked(n int) bool {
	return l.queued >= l.maxMsgs || l.queuedBytes+n > l.maxBytes
}

// burstLocked reports whether a queue that is full by its message count
// may take n bytes more without waiting: its bytes still fit and its
// writers made progress within stallTimeout. That is a client reading as
// fast as it can behind an agent's burst, which must not be cut off even
// when it cannot hold up the agent (wait false, the process or the
// session is shared); send_queue_bytes stays the hard bound.
func (l *link) burstLocked(n int) bool {
	return l.queuedBytes+n <= l.maxBytes &&
		time.Since(time.Unix(0, max(l.lastWrite.Load(), l.queuedSince))) < stallTimeout
}

// waitRoomLocked waits while the queue is full and its writers make
// progress (l.mu held, released while waiting).
func (l *link) waitRoomLocked(n int) {
	for !l.closing && !l.done && l.fullLocked(n) {
		stalled := time.Since(time.Unix(0, max(l.lastWrite.Load(), l.queuedSince)))
		if stalled >= stallTimeout {
			return
		}
		if l.room == nil {
			l.room = make(chan struct{})
		}
		room := l.room
		l.mu.Unlock()
		t := time.NewTimer(stallTimeout - stalled)
		select {
		case <-room:
		case <-t.C:
		case <-l.ctx.Done():
		}
		t.Stop()
		l.mu.Lock()
		if l.ctx.Err() != nil { // the connection is ending
			return
		}
	}
}

// slowLocked closes a client that fell behind: what its queues hold is
// dropped, and the close is counted. The rule and the metric are the same
// for every transport.
func (l *link) slowLocked() {
	queued, bytes := l.queued, l.queuedBytes
	n, dropped := l.t.dropQueuedLocked()
	l.queued, l.queuedBytes = l.queued-n, l.queuedBytes-dropped
	l.closeLocked("client too slow: send queue full", "slow_client")
	l.s.metrics.slowDisconnects.Inc()
	l.log.Warn("closing slow client", "queued_msgs", queued, "queued_bytes", bytes)
}

// tookLocked records that a writer is done with n messages of size bytes
// it took off the queues (written, or given up with the socket): senders
// waiting for room wake. A writer calls it after its writes, not when it
// takes the messages: what it is writing to a client that stopped reading
// counts against send_queue_bytes too, or the queue could fill again
// behind it and the connection hold twice its bound.
func (l *link) tookLocked(n, bytes int) {
	l.queued -= n
	l.queuedBytes -= bytes
	if l.room != nil {
		close(l.room)
		l.room = nil
	}
}

// wrote records messages written to the client.
func (l *link) wrote(n, bytes int) {
	l.msgsOut.Add(int64(n))
	l.bytesOut.Add(int64(bytes))
	l.lastWrite.Store(time.Now().UnixNano())
}

// read records a message read from the client.
func (l *link) read(bytes int) {
	l.msgsIn.Add(1)
	l.bytesIn.Add(int64(bytes))
	l.lastRead.Store(time.Now().UnixNano())
}

// startTimer arms the connection's one timer: the handshake deadline, the
// idle check and the transport's own periodic work.
func (l *link) startTimer() {
	now := time.Now()
	l.handshakeAt = now.Add(l.handshake)
	if l.idle > 0 {
		l.nextIdle = now.Add(idleEvery(l.idle))
	}
	next := earliest(l.handshakeAt, l.nextIdle, l.t.tick(time.Time{}))
	l.mu.Lock()
	if !l.done {
		l.timer = time.AfterFunc(untilOrNever(next, now), l.tick)
	}
	l.mu.Unlock()
}

func idleEvery(idle time.Duration) time.Duration { return min(idle/4, time.Minute) + time.Millisecond }

// earliest is the earliest of the non-zero times (zero if none).
func earliest(ts ...time.Time) time.Time {
	var next time.Time
	for _, t := range ts {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

// untilOrNever is how long until t: never (a long time) when t is zero.
func untilOrNever(t, now time.Time) time.Duration {
	if t.IsZero() {
		return 1<<63 - 1
	}
	return max(t.Sub(now), 0)
}

// tick runs when one of the timer's deadlines is due, then re-arms it.
func (l *link) tick() {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return
	}
	l.bg.Add(1)
	timer := l.timer
	l.mu.Unlock()
	defer l.bg.Done()
	now := time.Now()
	if !l.handshakeAt.IsZero() && !now.Before(l.handshakeAt) {
		l.handshakeAt = time.Time{}
		if !l.t.handshakeDone() {
			l.log.Info("no initialize in time; closing", "handshake_timeout", l.handshake)
			l.closeWith("no initialize within the handshake timeout", "handshake_timeout")
			return
		}
	}
	if !l.nextIdle.IsZero() && !now.Before(l.nextIdle) {
		l.nextIdle = now.Add(idleEvery(l.idle))
		last, busy := l.t.idleSince()
		if since := now.Sub(last); since >= l.idle && !busy {
			l.log.Info("idle; closing", "idle_for", since.Round(time.Second))
			l.closeWith("idle timeout", "idle_timeout")
			return
		}
	}
	next := earliest(l.handshakeAt, l.nextIdle, l.t.tick(now))
	l.mu.Lock() // orders this run's writes before the next run's reads
	if !next.IsZero() && !l.done {
		timer.Reset(untilOrNever(next, time.Now()))
	}
	l.mu.Unlock()
}

// affinityOf is "NAME=VALUE" of the affinity cookie cfg names, if r
// carries it ("" otherwise).
func affinityOf(r *http.Request, cfg *config.Config) string {
	name := cfg.Sessions.AffinityCookie
	if name == "" {
		return ""
	}
	ck, err := r.Cookie(name)
	if err != nil || ck.Value == "" || len(ck.Value) > 256 {
		return ""
	}
	return name + "=" + ck.Value
}
