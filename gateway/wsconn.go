package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Subprotocol is the WebSocket subprotocol the gateway selects when offered.
const Subprotocol = "acp"

// ConnectionIDHeader carries the connection ID on the 101 response (RFD).
const ConnectionIDHeader = "Acp-Connection-Id"

// wsConn is one client WebSocket: its link's transport, frames on one
// socket. An idle connection costs one goroutine, the reader. The frame
// handler and the writer are started when there is work and end when their
// queue is empty; pings run on the link's timer. Every goroutine is counted
// in the link's bg and ends with the connection.
type wsConn struct {
	link

	// Static after construction.
	ws *websocket.Conn
	nc *clientConn

	// Guarded by link.mu.
	q, spare   [][]byte
	writing    bool // a writer goroutine owns the queue
	closeCode  websocket.StatusCode
	frames     [][]byte      // client frames read, not yet handled
	frameBytes int           // their size
	handling   bool          // a frame handler goroutine is running
	frameRoom  chan struct{} // closed when the handler takes a frame; nil until the reader waits

	// Owned by the writer.
	writeTimer *time.Timer // closes the connection when a batch's writes take timeouts.write

	// Owned by the link's tick, which runs one at a time.
	nextPing time.Time
}

func (s *Server) handleACP(w http.ResponseWriter, r *http.Request) {
	if s.links.refusing() {
		http.Error(w, "the gateway is shutting down", http.StatusServiceUnavailable)
		return
	}
	who, accept, ok := s.authenticateUpgrade(w, r)
	if !ok {
		return
	}
	tenant := who.Tenant
	agent, ok := s.routeAgent(w, r, tenant)
	if !ok || s.tunnelResume(w, r, who, agent, accept) {
		return
	}
	resumed, received, ok := s.admitWebSocket(w, r, who, agent)
	if !ok {
		return
	}
	c := s.acceptWebSocket(w, r, accept, who, agent, resumed)
	if c == nil {
		return
	}
	if !s.links.register(&c.link) {
		c.conn.Close()
		c.cancel()
		_ = c.ws.Close(websocket.StatusGoingAway, "gateway shutting down")
		return
	}
	c.markOpen()
	c.log.Debug("connection opened", "remote", r.RemoteAddr, "subprotocol", c.ws.Subprotocol(), "resumed", resumed != nil)
	c.recordOpened(audit.F("resumed", resumed != nil))
	if resumed != nil {
		if err := resumed.Resume(&c.link, received); err != nil {
			c.log.Info("resume failed after the upgrade", "err", err)
			c.closeWith("resume refused", "resume_refused")
		}
	}
	// The connection no longer needs this handler's goroutine (and its
	// request): the server owns the reader through the registry.
	go c.serve(c.run)
}

// authenticateUpgrade decides authentication and origin before the
// upgrade: a refused client gets an HTTP status and a body, never a 101
// then a close. Without authentication the identity is empty.
func (s *Server) authenticateUpgrade(w http.ResponseWriter, r *http.Request) (auth.Identity, *websocket.AcceptOptions, bool) {
	accept := &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionDisabled}
	if id, ok := forwardedIdentity(r); ok { // signed by the replica it reached, which checked the origin
		accept.InsecureSkipVerify = true
		return id, accept, true
	}
	if s.authn == nil {
		return auth.Identity{}, accept, true
	}
	id, err := s.authn.Upgrade(r)
	if err != nil { // counted by the authenticator's OnFailure hook
		auth.WriteError(w, err) // Upgrade has logged the reason (never the token)
		return auth.Identity{}, nil, false
	}
	// Nothing after this point sees the token: Accept selects "acp".
	offered := auth.StripTokenProtocols(r)
	r.Header.Del("Sec-WebSocket-Protocol")
	if len(offered) > 0 {
		r.Header.Set("Sec-WebSocket-Protocol", strings.Join(offered, ", "))
	}
	accept.InsecureSkipVerify = true // the origin was checked by Upgrade
	return id, accept, true
}

// admitWebSocket takes the tenant's connection slot, or resumes a
// connection of the same credential subject on this socket (it holds its
// slot already). Every refused resume looks the same.
func (s *Server) admitWebSocket(w http.ResponseWriter, r *http.Request, who auth.Identity, agent string) (*proxy.Conn, int64, bool) {
	q := r.URL.Query()
	if !q.Has("resume") {
		return nil, 0, s.admit(w, who.Tenant)
	}
	n, err := strconv.ParseInt(q.Get("received"), 10, 64)
	if err != nil {
		n = -1 // refused, and counted, like any bad resume
	}
	resumed, err := s.relay.Resume(who.Tenant, who.Subject, agent, q.Get("resume"), n)
	if err != nil {
		s.log.Info("resume refused", "remote", r.RemoteAddr)
		writeJSONError(w, http.StatusNotFound, "resume_refused", err.Error())
		return nil, 0, false
	}
	return resumed, n, true
}

// acceptWebSocket upgrades the request and makes its connection; nil when
// that failed (what admitWebSocket took is given back). A resumed
// connection keeps the subject it was made with.
func (s *Server) acceptWebSocket(w http.ResponseWriter, r *http.Request, accept *websocket.AcceptOptions,
	who auth.Identity, agent string, resumed *proxy.Conn) *wsConn {
	tenant := who.Tenant
	id := s.newConnID()
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
			s.links.giveSlot(tenant)
		}
		s.log.Info("websocket upgrade refused", "err", err, "remote", r.RemoteAddr)
		return nil // Accept has written the HTTP error
	}
	cfg := s.config() // one snapshot: a reload may swap it meanwhile
	ws.SetReadLimit(int64(cfg.Limits.MaxMessageBytes))
	log := s.log.With("conn", id, "agent", agent)
	if s.authn != nil {
		log = log.With("tenant", tenant)
	}
	c := &wsConn{ws: ws, nc: uw.conn}
	c.init(s, c, linkInfo{kind: "websocket", id: id, tenant: tenant, subject: who.Subject, agent: agent, log: log, cfg: cfg, affinity: affinityOf(r, cfg),
		remote: r.RemoteAddr, handshake: cfg.Timeouts.Handshake.D(), idle: cfg.Timeouts.Idle.D()})
	if every := cfg.WebSocket.PingInterval.D(); every > 0 {
		c.nextPing = c.start.Add(every)
	}
	if resumed != nil {
		c.setConn(resumed)
		return c
	}
	// The tenant slot is held until the connection ends, which may be
	// after this socket (a detached connection still counts).
	if err := c.newConn(false, nil); err != nil {
		c.cancel()
		log.Error("cannot serve connection", "err", err)
		_ = ws.Close(websocket.StatusInternalError, "internal error")
		return nil
	}
	return c
}

func writeJSONError(w http.ResponseWriter, status int, reason, msg string) {
	writeJSON(w, status, map[string]string{"error": reason, "message": msg})
}

// writeJSON answers with v as JSON, never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// frameQueue bounds the client frames read but not yet handled. The reader
// goes on reading (so pongs and close frames are seen) while a request
// waits for an agent process; past the bound it waits too (backpressure).
const frameQueue = 64

// frameQueueBytes bounds the bytes of those frames: past it the reader waits
// too (one frame of any allowed size is always taken).
const frameQueueBytes = 1 << 20

// run is the connection's reader (link.serve runs it): the connection ends
// when it returns. A close the client asked for, or one the gateway decided
// for good, ends the proxy connection (clean); any other end detaches it
// for a resume.
func (c *wsConn) run() (label string, clean bool, attrs []any) {
	// Writes carry no context (see writeLoop): closing the connection is
	// what unblocks them when the connection ends.
	stopClose := context.AfterFunc(c.ctx, func() { _ = c.ws.CloseNow() })
	defer stopClose()
	code, reason, label := c.readLoop()
	c.cancel()
	_ = c.ws.CloseNow()
	// A close frame without a status (1005) is as deliberate as a 1000:
	// several client libraries close that way (the ACP SDK's WebSocket
	// client among them); a drop sends no close frame at all.
	clean = (code == websocket.StatusNormalClosure || code == websocket.StatusNoStatusRcvd) && label == "client_closed" ||
		label == "shutdown" || label == "idle_timeout" || label == "handshake_timeout"
	return label, clean, []any{"close_code", int(code), "close_reason", reason}
}

// readLoop feeds the client's messages to the frame handler until the
// connection ends, and returns why it ended.
func (c *wsConn) readLoop() (code websocket.StatusCode, reason, label string) {
	for {
		msg, err := c.readMessage()
		if err != nil {
			return c.endReason(err)
		}
		c.read(len(msg))
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
func (c *wsConn) readMessage() ([]byte, error) { return readPooled(c.ctx, c.ws) }

// readPooled reads ws's next message into a buffer from jsonrpc's pool
// (the caller owns it).
func readPooled(ctx context.Context, ws *websocket.Conn) ([]byte, error) {
	_, r, err := ws.Reader(ctx)
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
		if !c.s.replicas.intercept(&c.link, f, nil) { // a session another replica holds: carried there
			c.conn.HandleFrom(&c.link, f) // keeps nothing of the frame
		}
		jsonrpc.PutBuffer(f) // so its buffer is reused
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

// closeCodeOf is the WebSocket close code of a close the gateway decides.
func closeCodeOf(label string) websocket.StatusCode {
	switch label {
	case "shutdown", "idle_timeout":
		return websocket.StatusGoingAway
	}
	return websocket.StatusPolicyViolation
}

// routeLocked implements transport: a WebSocket has one queue.
func (c *wsConn) routeLocked([]byte, *msgFacts) (string, bool) { return "", false }

// pushLocked implements transport.
func (c *wsConn) pushLocked(_ string, msg []byte) bool {
	c.q = append(c.q, msg)
	c.startWriterLocked()
	return true
}

// dropQueuedLocked implements transport.
func (c *wsConn) dropQueuedLocked() (n, bytes int) {
	for i, m := range c.q {
		bytes += len(m)
		c.giveBack(m)
		c.q[i] = nil
	}
	n = len(c.q)
	c.q = c.q[:0]
	return n, bytes
}

// closeLocked implements transport: the writer sends the close frame after
// what is queued.
func (c *wsConn) closeLocked() {
	c.closeCode = closeCodeOf(c.closeLabel)
	c.startWriterLocked()
}

// leftLocked implements transport: a WebSocket's client goes by closing
// it, which ends the link.
func (c *wsConn) leftLocked() bool { return false }

// handshakeDone implements transport: the client has sent a valid
// initialize (answered or waiting for a first agent process).
func (c *wsConn) handshakeDone() bool { return c.conn.HandshakeDone() }

// idleSince implements transport: the last message either way; a
// connection with requests in flight (a running prompt) is never idle.
func (c *wsConn) idleSince() (time.Time, bool) {
	return time.Unix(0, max(c.lastRead.Load(), c.lastWrite.Load())), c.conn.Busy()
}

// tick implements transport: it pings when a ping is due. A pong tells
// the proxy connection that the client has what was written before the
// ping.
func (c *wsConn) tick(now time.Time) time.Time {
	if c.nextPing.IsZero() || now.Before(c.nextPing) {
		return c.nextPing
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.WebSocket.PingTimeout.D())
	written := c.msgsOut.Load() // written before the ping frame, in order
	err := c.ws.Ping(ctx)
	cancel()
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
		return time.Time{}
	}
	c.conn.Acked(&c.link, written) // the pong came after them: the client has them
	c.nextPing = time.Now().Add(c.cfg.WebSocket.PingInterval.D())
	return c.nextPing
}

// startWriterLocked starts a writer unless one is running (c.mu held).
func (c *wsConn) startWriterLocked() {
	if c.writing || c.done {
		return
	}
	c.writing = true
	c.bg.Add(1)
	go c.writeLoop()
}

// writeLoop writes the queue in batches until it is empty, then ends. A
// batch is corked: its frames leave in as few write(2) calls as fit. A
// decided close goes out after what was queued before it.
//
// A small queue waits for the relay's goroutines to run once first
// (gatherLocked): a writer as fast as the relay would otherwise take one
// message at a time, one write(2) each, and stay that way.
func (c *wsConn) writeLoop() {
	defer c.bg.Done()
	for {
		c.mu.Lock()
		c.gatherLocked()
		batch := c.q
		if len(batch) == 0 && !c.closing {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.q, c.spare = c.spare[:0], nil
		closing, code, reason := c.closing, c.closeCode, c.closeReason
		c.mu.Unlock()
		size := 0
		for _, m := range batch {
			size += len(m)
		}
		written := len(batch) == 0 || c.writeTimed(batch)
		c.mu.Lock()
		c.tookLocked(len(batch), size) // counted as queued until now
		if !written {
			// The socket is broken: Send refuses from now on (writing
			// stays set), and no close is decided, so the end counts as
			// connection_lost and the connection may resume.
			c.closing = true
			c.mu.Unlock()
			c.cancel()
			return
		}
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

// smallBatch is the queue under which the writer yields once before it
// takes it (see writeLoop).
const smallBatch = 16

// gatherLocked lets the relay's goroutines run once before the writer
// takes a small queue (c.mu held; released meanwhile). With nothing else to
// run it returns at once; a lone answer waits no longer than that.
func (c *wsConn) gatherLocked() {
	if len(c.q) >= smallBatch || c.closing {
		return
	}
	c.mu.Unlock()
	runtime.Gosched()
	c.mu.Lock()
}

// writeTimed writes a batch within timeouts.write: one timer, re-armed per
// batch, bounds the writes (a context with a deadline would cost the
// library a timer per frame).
func (c *wsConn) writeTimed(batch [][]byte) bool {
	timeout := c.writeWait
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
		return false
	}
	return true
}

func (c *wsConn) writeBatch(batch [][]byte) error {
	c.nc.cork()
	for i, msg := range batch {
		if err := c.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
			_ = c.nc.uncork()
			return err
		}
		c.wrote(1, len(msg)) // progress: the cork flushes as it fills
		c.giveBack(msg)
		batch[i] = nil
	}
	return c.nc.uncork()
}
