package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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

// wsConn is one client WebSocket. The HTTP handler goroutine reads; a writer
// goroutine drains the bounded send queue; a pinger keeps the connection
// alive. Both end with the connection's context.
type wsConn struct {
	s           *Server
	ws          *websocket.Conn
	id          string
	log         *slog.Logger
	ctx         context.Context
	cancel      context.CancelFunc
	start       time.Time
	conn        *proxy.Conn
	cfg         *config.Config // the configuration the connection started with
	tenantLabel string

	maxMsgs, maxBytes int

	mu          sync.Mutex
	q, spare    [][]byte
	qBytes      int
	closing     bool
	closeCode   websocket.StatusCode
	closeReason string
	wake        chan struct{}

	msgsIn, msgsOut, bytesIn, bytesOut atomic.Int64
	lastActive                         atomic.Int64  // unix nanos of the last message either way
	lastWrite                          atomic.Int64  // unix nanos of the last message written
	room                               chan struct{} // closed when the writer takes the queue (guarded by mu)
	queuedSince                        int64         // unix nanos the queue last became non-empty (guarded by mu)
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
	if !s.admitTenant(tenant) {
		s.metrics.authFailures.WithLabelValues("too_many_connections").Inc()
		writeJSONError(w, http.StatusTooManyRequests, "too_many_connections",
			fmt.Sprintf("tenant %q has reached its max_connections", tenant))
		return
	}
	admitted := true
	defer func() {
		if admitted {
			s.releaseTenant(tenant)
		}
	}()
	id := newConnID()
	w.Header().Set(ConnectionIDHeader, id)
	ws, err := websocket.Accept(w, r, accept)
	if err != nil {
		s.log.Info("websocket upgrade refused", "err", err, "remote", r.RemoteAddr)
		return // Accept has written the HTTP error
	}
	limits := s.config().Limits
	ws.SetReadLimit(int64(limits.MaxMessageBytes))
	ctx, cancel := context.WithCancel(context.Background())
	log := s.log.With("conn", id)
	if s.authn != nil {
		log = log.With("tenant", tenant)
	}
	c := &wsConn{
		s:        s,
		ws:       ws,
		id:       id,
		log:      log,
		ctx:      ctx,
		cancel:   cancel,
		start:    time.Now(),
		cfg:      s.config(),
		maxMsgs:  limits.SendQueueMessages,
		maxBytes: limits.SendQueueBytes,
		wake:     make(chan struct{}, 1),
		room:     make(chan struct{}),
	}
	c.conn, err = s.relay.NewConn(proxy.ConnInfo{ID: id, Tenant: tenant, Log: c.log}, c)
	if err != nil {
		cancel()
		log.Error("cannot serve connection", "err", err)
		_ = ws.Close(websocket.StatusInternalError, "internal error")
		return
	}
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
	defer s.wg.Done()
	c.tenantLabel = s.metrics.tenants.Label(tenant)
	s.metrics.connsOpen.WithLabelValues(c.tenantLabel).Inc()
	defer s.metrics.connsOpen.WithLabelValues(c.tenantLabel).Dec()
	c.log.Debug("connection opened", "remote", r.RemoteAddr, "subprotocol", ws.Subprotocol())
	c.run()
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

func (c *wsConn) run() {
	// Writes carry no context (see writeLoop): closing the connection is
	// what unblocks them when the connection ends.
	stopClose := context.AfterFunc(c.ctx, func() { _ = c.ws.CloseNow() })
	defer stopClose()
	c.lastWrite.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	frames := make(chan []byte, frameQueue)
	wg.Add(3)
	go func() { defer wg.Done(); c.writeLoop() }()
	go func() { defer wg.Done(); c.pingLoop() }()
	go func() { // handles frames in order, one at a time
		defer wg.Done()
		for f := range frames {
			c.conn.Handle(f)     // keeps nothing of the frame
			jsonrpc.PutBuffer(f) // so its buffer is reused
		}
	}()
	code, reason := c.readLoop(frames)
	close(frames)
	c.cancel()
	wg.Wait()
	_ = c.ws.CloseNow()
	c.conn.Close()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	c.s.metrics.connsTotal.WithLabelValues(c.tenantLabel, closeLabel(code, reason)).Inc()
	c.log.Info("connection closed",
		"duration", time.Since(c.start).Round(time.Millisecond),
		"msgs_in", c.msgsIn.Load(), "msgs_out", c.msgsOut.Load(),
		"bytes_in", c.bytesIn.Load(), "bytes_out", c.bytesOut.Load(),
		"close_code", int(code), "close_reason", reason)
}

// readLoop feeds the client's messages to the relay until the connection
// ends, and returns why it ended.
func (c *wsConn) readLoop(frames chan<- []byte) (websocket.StatusCode, string) {
	var buf bytes.Buffer
	for {
		typ, r, err := c.ws.Reader(c.ctx)
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err != nil {
			return c.endReason(err)
		}
		c.msgsIn.Add(1)
		c.bytesIn.Add(int64(buf.Len()))
		c.lastActive.Store(time.Now().UnixNano())
		if typ != websocket.MessageText {
			c.Send(jsonrpc.AppendError(nil, nil, jsonrpc.CodeInvalidRequest,
				"binary frames are not supported: send each JSON-RPC message as one text frame", nil))
			continue
		}
		select {
		case frames <- append(jsonrpc.GetBuffer(buf.Len()), buf.Bytes()...):
		case <-c.ctx.Done():
			return c.endReason(c.ctx.Err())
		}
		if buf.Cap() > 1<<20 { // do not keep one big message's buffer for the connection's life
			buf = bytes.Buffer{}
		}
	}
}

// endReason describes how the connection ended, for the access log.
func (c *wsConn) endReason(err error) (websocket.StatusCode, string) {
	c.mu.Lock()
	code, reason := c.closeCode, c.closeReason
	c.mu.Unlock()
	if code != 0 {
		return code, reason
	}
	if st := websocket.CloseStatus(err); st != -1 {
		return st, "closed by client"
	}
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return websocket.StatusAbnormalClosure, "connection lost"
	}
	var tooBig interface{ Error() string }
	if errors.As(err, &tooBig) && bytes.Contains([]byte(err.Error()), []byte("read limited at")) {
		return websocket.StatusMessageTooBig, "message over limits.max_message_bytes"
	}
	return websocket.StatusAbnormalClosure, err.Error()
}

// closeLabel is the bounded metrics label of a close.
func closeLabel(code websocket.StatusCode, reason string) string {
	switch {
	case code == websocket.StatusMessageTooBig:
		return "message_too_big"
	case code == websocket.StatusPolicyViolation:
		return "slow_client"
	case code == websocket.StatusGoingAway && reason == "ping timeout":
		return "ping_timeout"
	case reason == "idle timeout":
		return "idle_timeout"
	case reason == "no initialize within the handshake timeout":
		return "handshake_timeout"
	case code == websocket.StatusGoingAway:
		return "shutdown"
	case reason == "closed by client":
		return "client_closed"
	case code == websocket.StatusAbnormalClosure:
		return "connection_lost"
	}
	return "other"
}

// Send implements proxy.Sink: it queues without blocking and closes the
// connection (1008) when the client falls too far behind.
func (c *wsConn) Send(msg []byte) bool {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return false
	}
	// Full: a client whose writer keeps draining is reading as fast as the
	// gateway can send, so wait for room (its agent's output is held up
	// meanwhile); one whose writer made no progress for stallTimeout has
	// stopped reading and is closed.
	for !c.closing && (len(c.q) >= c.maxMsgs || c.qBytes+len(msg) > c.maxBytes) &&
		time.Since(time.Unix(0, max(c.lastWrite.Load(), c.queuedSince))) < stallTimeout {
		room := c.room
		c.mu.Unlock()
		select {
		case <-room:
		case <-time.After(stallTimeout):
		case <-c.ctx.Done():
		}
		c.mu.Lock()
	}
	if c.closing {
		c.mu.Unlock()
		return false
	}
	if len(c.q) >= c.maxMsgs || c.qBytes+len(msg) > c.maxBytes {
		queued, bytes := len(c.q), c.qBytes
		c.closing = true
		c.closeCode, c.closeReason = websocket.StatusPolicyViolation, "client too slow: send queue full"
		c.q, c.qBytes = c.q[:0], 0
		c.mu.Unlock()
		c.s.metrics.slowDisconnects.Inc()
		c.log.Warn("closing slow client", "queued_msgs", queued, "queued_bytes", bytes)
		c.signal()
		return false
	}
	if len(c.q) == 0 {
		c.queuedSince = time.Now().UnixNano()
	}
	c.q = append(c.q, msg)
	c.qBytes += len(msg)
	c.mu.Unlock()
	c.signal()
	return true
}

// stallTimeout is how long a full send queue may go without the writer
// making progress before the client counts as not reading.
const stallTimeout = time.Second

func (c *wsConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// goingAway closes the connection with 1001 after what is queued.
func (c *wsConn) goingAway() { c.closeWith(websocket.StatusGoingAway, "gateway shutting down") }

// closeWith closes the connection with code after what is queued.
func (c *wsConn) closeWith(code websocket.StatusCode, reason string) {
	c.mu.Lock()
	if !c.closing {
		c.closing = true
		c.closeCode, c.closeReason = code, reason
	}
	c.mu.Unlock()
	c.signal()
}

func (c *wsConn) writeLoop() {
	timeout := c.cfg.WebSocket.WriteTimeout.D()
	for {
		select {
		case <-c.wake:
		case <-c.ctx.Done():
			return
		}
		c.mu.Lock()
		batch := c.q
		c.q, c.spare = c.spare[:0], nil
		c.qBytes = 0
		closing, code, reason := c.closing, c.closeCode, c.closeReason
		close(c.room) // wake senders waiting for room
		c.room = make(chan struct{})
		c.mu.Unlock()
		if len(batch) > 0 {
			// One timer per batch bounds the writes (a context with a
			// deadline would cost the library a timer per frame).
			stuck := time.AfterFunc(timeout, func() {
				c.log.Info("write to client timed out; closing", "write_timeout", timeout)
				_ = c.ws.CloseNow()
			})
			for i, msg := range batch {
				if err := c.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
					stuck.Stop()
					c.log.Debug("write to client failed", "err", err)
					c.cancel()
					return
				}
				now := time.Now().UnixNano()
				c.msgsOut.Add(1)
				c.bytesOut.Add(int64(len(msg)))
				c.lastActive.Store(now)
				c.lastWrite.Store(now)
				jsonrpc.PutBuffer(msg)
				batch[i] = nil
			}
			stuck.Stop()
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

// pingLoop keeps the connection alive and enforces the handshake and idle
// timeouts.
func (c *wsConn) pingLoop() {
	c.lastActive.Store(time.Now().UnixNano())
	handshake := time.NewTimer(c.cfg.Timeouts.Handshake.D())
	defer handshake.Stop()
	every := c.cfg.WebSocket.PingInterval.D()
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	idle := c.cfg.Timeouts.Idle.D()
	var idleTick <-chan time.Time
	if idle > 0 {
		t := time.NewTicker(min(idle/4, time.Minute) + time.Millisecond)
		defer t.Stop()
		idleTick = t.C
	}
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-handshake.C:
			if !c.conn.Initialized() {
				c.log.Info("no initialize in time; closing", "handshake_timeout", c.cfg.Timeouts.Handshake.D())
				c.closeWith(websocket.StatusPolicyViolation, "no initialize within the handshake timeout")
			}
			continue
		case <-idleTick:
			if since := time.Since(time.Unix(0, c.lastActive.Load())); since >= idle && !c.conn.Busy() {
				c.log.Info("idle; closing", "idle_for", since.Round(time.Second))
				c.closeWith(websocket.StatusGoingAway, "idle timeout")
			}
			continue
		case <-tick:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.WebSocket.PingTimeout.D())
		err := c.ws.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Info("client did not answer ping; closing", "err", err)
				c.mu.Lock()
				if c.closeCode == 0 {
					c.closeCode, c.closeReason = websocket.StatusGoingAway, "ping timeout"
				}
				c.mu.Unlock()
			}
			c.cancel()
			return
		}
	}
}
