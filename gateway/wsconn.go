package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Subprotocol is the WebSocket subprotocol the gateway selects when offered.
const Subprotocol = "acp"

// ConnectionIDHeader carries the connection ID on the 101 response (RFD).
const ConnectionIDHeader = "Acp-Connection-Id"

// wsConn is one client WebSocket. An idle connection costs one goroutine,
// the reader. The frame handler and the writer are started when there is
// work and end when their queue is empty; pings and the handshake and idle
// timeouts run on one timer. Every goroutine is counted in bg and ends with
// the connection.
type wsConn struct {
	s           *Server
	ws          *websocket.Conn
	nc          *clientConn
	id          string
	log         *slog.Logger
	ctx         context.Context
	cancel      context.CancelFunc
	start       time.Time
	conn        *proxy.Conn
	cfg         *config.Config // the configuration the connection started with
	tenant      string
	tenantLabel string

	maxMsgs, maxBytes int
	keepsSent         bool // the connection keeps what it sends: Send borrows messages, never pools them

	bg sync.WaitGroup // writer, frame handler and timer runs

	mu          sync.Mutex
	done        bool // the reader has ended: start nothing more
	q, spare    [][]byte
	qBytes      int
	writing     bool // a writer goroutine owns the queue
	closing     bool
	closeCode   websocket.StatusCode
	closeReason string
	closeLabel  string        // the metrics label of the close
	room        chan struct{} // closed when the writer takes the queue; nil until a sender waits
	queuedSince int64         // unix nanos the queue last became non-empty
	frames      [][]byte      // client frames read, not yet handled
	frameBytes  int           // their size
	handling    bool          // a frame handler goroutine is running
	frameRoom   chan struct{} // closed when the handler takes a frame; nil until the reader waits
	timer       *time.Timer   // runs tick
	writeTimer  *time.Timer   // closes the connection when a batch's writes take write_timeout; the writer's

	// Owned by tick, which runs one at a time.
	handshakeAt, nextIdle, nextPing time.Time

	msgsIn, msgsOut, bytesIn, bytesOut atomic.Int64
	lastRead                           atomic.Int64 // unix nanos of the last message read
	lastWrite                          atomic.Int64 // unix nanos of the last message written
}

func (s *Server) handleACP(w http.ResponseWriter, r *http.Request) {
	if s.drain.Load() {
		http.Error(w, "the gateway is shutting down", http.StatusServiceUnavailable)
		return
	}
	// Authentication, origin and quotas are decided before the upgrade: a
	// refused client gets an HTTP status and a body, never a 101 then a close.
	var tenant string
	accept := &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionDisabled}
	if s.authn != nil {
		id, err := s.authn.Upgrade(r)
		if err != nil { // counted by the authenticator's OnFailure hook
			auth.WriteError(w, err) // Upgrade has logged the reason (never the token)
			return
		}
		tenant = id.Tenant
		// Nothing after this point sees the token: Accept selects "acp".
		offered := auth.StripTokenProtocols(r)
		r.Header.Del("Sec-WebSocket-Protocol")
		if len(offered) > 0 {
			r.Header.Set("Sec-WebSocket-Protocol", strings.Join(offered, ", "))
		}
		accept.InsecureSkipVerify = true // the origin was checked by Upgrade
	}
	agent, ok := s.routeAgent(w, r, tenant)
	if !ok {
		return
	}
	// A resume continues a connection of the tenant's on this socket; it
	// holds its tenant slot already. Every refusal looks the same.
	var resumed *proxy.Conn
	var received int64
	if q := r.URL.Query(); q.Has("resume") {
		n, err := strconv.ParseInt(q.Get("received"), 10, 64)
		if err != nil {
			n = -1 // refused, and counted, like any bad resume
		}
		if resumed, err = s.relay.Resume(tenant, agent, q.Get("resume"), n); err != nil {
			s.log.Info("resume refused", "remote", r.RemoteAddr)
			writeJSONError(w, http.StatusNotFound, "resume_refused", err.Error())
			return
		}
		received = n
	} else if !s.admitTenant(tenant) {
		s.metrics.authFailures.WithLabelValues("too_many_connections").Inc()
		writeJSONError(w, http.StatusTooManyRequests, "too_many_connections",
			fmt.Sprintf("tenant %q has reached its max_connections", tenant))
		return
	}
	id := newConnID()
	if resumed != nil {
		id = resumed.ID() // the same connection, on a new socket
	}
	w.Header().Set(ConnectionIDHeader, id)
	uw := &upgradeWriter{ResponseWriter: w}
	ws, err := websocket.Accept(uw, r, accept)
	if err != nil {
		if resumed != nil {
			resumed.AbortResume()
		} else {
			s.releaseTenant(tenant)
		}
		s.log.Info("websocket upgrade refused", "err", err, "remote", r.RemoteAddr)
		return // Accept has written the HTTP error
	}
	cfg := s.config() // one snapshot: a reload may swap it meanwhile
	limits := cfg.Limits
	ws.SetReadLimit(int64(limits.MaxMessageBytes))
	ctx, cancel := context.WithCancel(context.Background())
	log := s.log.With("conn", id, "agent", agent)
	if s.authn != nil {
		log = log.With("tenant", tenant)
	}
	c := &wsConn{
		s:        s,
		ws:       ws,
		nc:       uw.conn,
		id:       id,
		log:      log,
		ctx:      ctx,
		cancel:   cancel,
		start:    time.Now(),
		cfg:      cfg,
		tenant:   tenant,
		maxMsgs:  limits.SendQueueMessages,
		maxBytes: limits.SendQueueBytes,
	}
	if resumed != nil {
		c.conn = resumed
	} else {
		// The tenant slot is held until the connection ends, which may be
		// after this socket (a detached connection still counts).
		release := func() { s.releaseTenant(tenant) }
		c.conn, err = s.relay.NewConn(proxy.ConnInfo{ID: id, Tenant: tenant, Agent: agent, Log: c.log, OnEnd: release}, c)
		if err != nil {
			cancel()
			release()
			log.Error("cannot serve connection", "err", err)
			_ = ws.Close(websocket.StatusInternalError, "internal error")
			return
		}
	}
	c.keepsSent = c.conn.KeepsSent()
	s.mu.Lock()
	if s.drain.Load() {
		s.mu.Unlock()
		c.conn.Close()
		cancel()
		_ = ws.Close(websocket.StatusGoingAway, "gateway shutting down")
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	c.tenantLabel = s.metrics.tenants.Label(tenant)
	s.metrics.connsOpen.WithLabelValues(c.tenantLabel, "websocket", c.conn.Agent()).Inc()
	c.log.Debug("connection opened", "remote", r.RemoteAddr, "subprotocol", ws.Subprotocol(), "resumed", resumed != nil)
	if resumed != nil {
		if err := resumed.Attach(c, received); err != nil {
			c.log.Info("resume failed after the upgrade", "err", err)
			c.closeWith(websocket.StatusPolicyViolation, "resume refused", "resume_refused")
		}
	}
	// The connection no longer needs this handler's goroutine (and its
	// request): the server owns the reader through s.wg.
	go c.run()
}

// admitTenant counts a connection against its tenant's max_connections.
func (s *Server) admitTenant(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	max := 0
	for _, t := range s.cfg.Tenants { // s.cfg changes on reload, under s.mu
		if t.Name == tenant {
			max = t.MaxConnections
		}
	}
	if max > 0 && s.tenantConns[tenant] >= max {
		return false
	}
	s.tenantConns[tenant]++
	return true
}

func (s *Server) releaseTenant(tenant string) {
	s.mu.Lock()
	s.tenantConns[tenant]--
	s.mu.Unlock()
}

func writeJSONError(w http.ResponseWriter, status int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": reason, "message": msg})
}

// frameQueue bounds the client frames read but not yet handled. The reader
// goes on reading (so pongs and close frames are seen) while a request
// waits for an agent process; past the bound it waits too (backpressure).
const frameQueue = 64

// frameQueueBytes bounds the bytes of those frames: past it the reader waits
// too (one frame of any allowed size is always taken).
const frameQueueBytes = 1 << 20

// run is the connection's reader; the connection ends when it returns.
func (c *wsConn) run() {
	defer c.s.wg.Done()
	defer c.s.metrics.connsOpen.WithLabelValues(c.tenantLabel, "websocket", c.conn.Agent()).Dec()
	// Writes carry no context (see writeLoop): closing the connection is
	// what unblocks them when the connection ends.
	stopClose := context.AfterFunc(c.ctx, func() { _ = c.ws.CloseNow() })
	defer stopClose()
	now := time.Now()
	c.lastWrite.Store(now.UnixNano())
	c.lastRead.Store(now.UnixNano())
	c.startTimer(now)
	code, reason, label := c.readLoop()
	c.cancel()
	c.mu.Lock()
	c.done = true
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.bg.Wait()
	_ = c.ws.CloseNow()
	// A close the client asked for, or one the gateway decided for good,
	// ends the connection; any other end detaches it for a resume.
	clean := code == websocket.StatusNormalClosure && label == "client_closed" ||
		label == "shutdown" || label == "idle_timeout" || label == "handshake_timeout"
	c.conn.SocketEnded(c, clean)
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	c.s.metrics.connsTotal.WithLabelValues(c.tenantLabel, label, "websocket", c.conn.Agent()).Inc()
	c.log.Info("connection closed",
		"duration", time.Since(c.start).Round(time.Millisecond),
		"msgs_in", c.msgsIn.Load(), "msgs_out", c.msgsOut.Load(),
		"bytes_in", c.bytesIn.Load(), "bytes_out", c.bytesOut.Load(),
		"close_code", int(code), "close_reason", reason)
}

// readLoop feeds the client's messages to the frame handler until the
// connection ends, and returns why it ended.
func (c *wsConn) readLoop() (code websocket.StatusCode, reason, label string) {
	for {
		msg, err := c.readMessage()
		if err != nil {
			return c.endReason(err)
		}
		c.msgsIn.Add(1)
		c.bytesIn.Add(int64(len(msg)))
		c.lastRead.Store(time.Now().UnixNano())
		c.mu.Lock()
		for len(c.frames) >= frameQueue || len(c.frames) > 0 && c.frameBytes+len(msg) > frameQueueBytes {
			if c.frameRoom == nil {
				c.frameRoom = make(chan struct{})
			}
			room := c.frameRoom
			c.mu.Unlock()
			select {
			case <-room:
			case <-c.ctx.Done():
				jsonrpc.PutBuffer(msg)
				return c.endReason(c.ctx.Err())
			}
			c.mu.Lock()
		}
		c.frames = append(c.frames, msg)
		c.frameBytes += len(msg)
		if !c.handling {
			c.handling = true
			c.bg.Add(1)
			go c.handleLoop()
		}
		c.mu.Unlock()
	}
}

// readMessage reads one whole message into a pooled buffer, so that an idle
// connection holds no read buffer of its own. A binary frame is taken as
// UTF-8 text, like a text frame: clients that pipe a newline-delimited JSON
// stream onto the socket send binary frames (marimo's use-acp). Invalid
// UTF-8 is refused like any bad JSON.
func (c *wsConn) readMessage() ([]byte, error) {
	_, r, err := c.ws.Reader(c.ctx)
	if err != nil {
		return nil, err
	}
	b := jsonrpc.GetBuffer(512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			jsonrpc.PutBuffer(b)
			return nil, err
		}
	}
}

// handleLoop handles the queued client frames in order, one at a time, and
// ends when the queue is empty.
func (c *wsConn) handleLoop() {
	defer c.bg.Done()
	for {
		c.mu.Lock()
		if len(c.frames) == 0 {
			c.frames = nil
			c.handling = false
			c.mu.Unlock()
			return
		}
		f := c.frames[0]
		c.frames[0] = nil
		c.frames = c.frames[1:]
		c.frameBytes -= len(f)
		if c.frameRoom != nil {
			close(c.frameRoom)
			c.frameRoom = nil
		}
		c.mu.Unlock()
		c.conn.HandleFrom(c, f) // keeps nothing of the frame
		jsonrpc.PutBuffer(f)    // so its buffer is reused
	}
}

// endReason describes how the connection ended: its close code and reason
// for the access log, and its bounded label for the metrics. A close the
// gateway decided carries the label it was given (closeWith).
func (c *wsConn) endReason(err error) (websocket.StatusCode, string, string) {
	c.mu.Lock()
	code, reason, label := c.closeCode, c.closeReason, c.closeLabel
	c.mu.Unlock()
	switch {
	case code != 0:
		return code, reason, label
	case websocket.CloseStatus(err) != -1:
		return websocket.CloseStatus(err), "closed by client", "client_closed"
	case errors.Is(err, io.EOF) || errors.Is(err, context.Canceled):
		return websocket.StatusAbnormalClosure, "connection lost", "connection_lost"
	case errors.Is(err, websocket.ErrMessageTooBig):
		return websocket.StatusMessageTooBig, "message over limits.max_message_bytes", "message_too_big"
	}
	return websocket.StatusAbnormalClosure, err.Error(), "connection_lost"
}

// Supersede implements proxy.Sink: the client resumed on another socket.
func (c *wsConn) Supersede() {
	c.closeWith(websocket.StatusPolicyViolation, "superseded by a resumed connection", "superseded")
}

// Send implements proxy.Sink: it queues msg and closes the connection
// (1008) when the client falls too far behind the send queue's limits.
// With wait, a full queue whose writer keeps draining (the client reads as
// fast as the gateway can send) is waited on instead, up to stallTimeout
// without progress; the relay asks for that only when no other client
// shares the agent process, whose output is held up meanwhile.
func (c *wsConn) Send(msg []byte, wait bool) bool {
	c.mu.Lock()
	full := func() bool { return len(c.q) >= c.maxMsgs || c.qBytes+len(msg) > c.maxBytes }
	for wait && !c.closing && !c.done && full() {
		stalled := time.Since(time.Unix(0, max(c.lastWrite.Load(), c.queuedSince)))
		if stalled >= stallTimeout {
			break
		}
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.mu.Unlock()
		wait := time.NewTimer(stallTimeout - stalled)
		select {
		case <-room:
		case <-wait.C:
		case <-c.ctx.Done():
		}
		wait.Stop()
		c.mu.Lock()
		if c.ctx.Err() != nil { // the connection is ending
			break
		}
	}
	if c.closing || c.done || c.ctx.Err() != nil {
		c.mu.Unlock()
		c.giveBack(msg) // refused: it goes back to the pool, unless borrowed
		return false
	}
	if full() {
		queued, bytes := len(c.q), c.qBytes
		c.closing = true
		c.closeCode, c.closeReason, c.closeLabel = websocket.StatusPolicyViolation, "client too slow: send queue full", "slow_client"
		for i, m := range c.q {
			c.giveBack(m)
			c.q[i] = nil
		}
		c.q, c.qBytes = c.q[:0], 0
		c.startWriterLocked()
		c.mu.Unlock()
		c.giveBack(msg)
		c.s.metrics.slowDisconnects.Inc()
		c.log.Warn("closing slow client", "queued_msgs", queued, "queued_bytes", bytes)
		return false
	}
	if len(c.q) == 0 {
		c.queuedSince = time.Now().UnixNano()
	}
	c.q = append(c.q, msg)
	c.qBytes += len(msg)
	c.startWriterLocked()
	c.mu.Unlock()
	return true
}

// stallTimeout is how long a full send queue may go without the writer
// making progress before the client counts as not reading.
const stallTimeout = time.Second

// startWriterLocked starts a writer unless one is running (c.mu held).
func (c *wsConn) startWriterLocked() {
	if c.writing || c.done {
		return
	}
	c.writing = true
	c.bg.Add(1)
	go c.writeLoop()
}

// goingAway closes the connection with 1001 after what is queued.
func (c *wsConn) goingAway() {
	c.closeWith(websocket.StatusGoingAway, "gateway shutting down", "shutdown")
}

// closeWith closes the connection with code after what is queued; label is
// the close's metrics label.
func (c *wsConn) closeWith(code websocket.StatusCode, reason, label string) {
	c.mu.Lock()
	if !c.closing {
		c.closing = true
		c.closeCode, c.closeReason, c.closeLabel = code, reason, label
	}
	c.startWriterLocked()
	c.mu.Unlock()
}

// writeLoop writes the queue in batches until it is empty, then ends. A
// batch is corked: its frames leave in as few write(2) calls as fit.
func (c *wsConn) writeLoop() {
	defer c.bg.Done()
	timeout := c.cfg.WebSocket.WriteTimeout.D()
	for {
		c.mu.Lock()
		batch := c.q
		if len(batch) == 0 && !c.closing {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.q, c.spare = c.spare[:0], nil
		c.qBytes = 0
		closing, code, reason := c.closing, c.closeCode, c.closeReason
		if c.room != nil {
			close(c.room) // wake senders waiting for room
			c.room = nil
		}
		c.mu.Unlock()
		if len(batch) > 0 {
			// One timer, re-armed per batch, bounds the writes (a context
			// with a deadline would cost the library a timer per frame).
			if c.writeTimer == nil {
				c.writeTimer = time.AfterFunc(timeout, func() {
					c.log.Info("write to client timed out; closing", "write_timeout", timeout)
					_ = c.ws.CloseNow()
				})
			} else {
				c.writeTimer.Reset(timeout)
			}
			err := c.writeBatch(batch)
			c.writeTimer.Stop()
			if err != nil {
				c.log.Debug("write to client failed", "err", err)
				c.mu.Lock()
				c.closing = true // Send refuses from now on; writing stays set
				c.mu.Unlock()
				c.cancel()
				return
			}
		}
		c.mu.Lock()
		if c.spare == nil {
			c.spare = batch[:0]
		}
		c.mu.Unlock()
		if closing {
			_ = c.ws.Close(code, reason)
			c.cancel()
			return
		}
	}
}

// giveBack returns a message the socket is done with to the buffer pool,
// unless the connection keeps it for a resume (proxy.Sink.Send): then the
// relay's outbox owns it.
func (c *wsConn) giveBack(msg []byte) {
	if !c.keepsSent {
		jsonrpc.PutBuffer(msg)
	}
}

func (c *wsConn) writeBatch(batch [][]byte) error {
	c.nc.cork()
	for i, msg := range batch {
		if err := c.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
			c.nc.uncork()
			return err
		}
		now := time.Now().UnixNano()
		c.msgsOut.Add(1)
		c.bytesOut.Add(int64(len(msg)))
		c.lastWrite.Store(now) // progress: the cork flushes as it fills
		c.giveBack(msg)
		batch[i] = nil
	}
	return c.nc.uncork()
}

// startTimer arms the connection's one timer: the handshake deadline, the
// idle check and pings.
func (c *wsConn) startTimer(now time.Time) {
	c.handshakeAt = now.Add(c.cfg.Timeouts.Handshake.D())
	if every := c.cfg.WebSocket.PingInterval.D(); every > 0 {
		c.nextPing = now.Add(every)
	}
	if idle := c.cfg.Timeouts.Idle.D(); idle > 0 {
		c.nextIdle = now.Add(idleEvery(idle))
	}
	c.mu.Lock()
	c.timer = time.AfterFunc(c.nextTick(now), c.tick)
	c.mu.Unlock()
}

func idleEvery(idle time.Duration) time.Duration { return min(idle/4, time.Minute) + time.Millisecond }

// nextTick is how long until the earliest pending deadline; -1 if none.
func (c *wsConn) nextTick(now time.Time) time.Duration {
	var next time.Time
	for _, t := range []time.Time{c.handshakeAt, c.nextIdle, c.nextPing} {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if next.IsZero() {
		return -1
	}
	return max(next.Sub(now), 0)
}

// tick runs when one of the timer's deadlines is due, then re-arms it.
func (c *wsConn) tick() {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return
	}
	c.bg.Add(1)
	timer := c.timer
	c.mu.Unlock()
	defer c.bg.Done()
	now := time.Now()
	if !c.handshakeAt.IsZero() && !now.Before(c.handshakeAt) {
		c.handshakeAt = time.Time{}
		if !c.conn.HandshakeDone() {
			c.log.Info("no initialize in time; closing", "handshake_timeout", c.cfg.Timeouts.Handshake.D())
			c.closeWith(websocket.StatusPolicyViolation, "no initialize within the handshake timeout", "handshake_timeout")
			return
		}
	}
	if !c.nextIdle.IsZero() && !now.Before(c.nextIdle) {
		idle := c.cfg.Timeouts.Idle.D()
		c.nextIdle = now.Add(idleEvery(idle))
		lastActive := max(c.lastRead.Load(), c.lastWrite.Load()) // the last message either way
		if since := time.Since(time.Unix(0, lastActive)); since >= idle && !c.conn.Busy() {
			c.log.Info("idle; closing", "idle_for", since.Round(time.Second))
			c.closeWith(websocket.StatusGoingAway, "idle timeout", "idle_timeout")
			return
		}
	}
	if !c.nextPing.IsZero() && !now.Before(c.nextPing) {
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.WebSocket.PingTimeout.D())
		written := c.msgsOut.Load() // written before the ping frame, in order
		err := c.ws.Ping(ctx)
		cancel()
		if err == nil {
			c.conn.Acked(c, written) // the pong came after them: the client has them
		}
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Info("client did not answer ping; closing", "err", err)
				c.mu.Lock()
				if c.closeCode == 0 {
					c.closeCode, c.closeReason, c.closeLabel = websocket.StatusGoingAway, "ping timeout", "ping_timeout"
				}
				c.mu.Unlock()
			}
			c.cancel()
			return
		}
		now = time.Now()
		c.nextPing = now.Add(c.cfg.WebSocket.PingInterval.D())
	}
	c.mu.Lock() // orders this run's writes before the next run's reads
	if d := c.nextTick(now); d >= 0 && !c.done {
		timer.Reset(d)
	}
	c.mu.Unlock()
}
