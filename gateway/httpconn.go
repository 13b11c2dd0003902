package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/acpgate/acpgate/auth"
	"github.com/go-chi/chi/v5"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Streamable HTTP on /acp, the transport of the official SDK's
// createHttpStream and AcpServer: the client POSTs each message; the
// initialize POST is answered in its body with an Acp-Connection-Id; every
// other accepted POST gets 202, and what the agent sends arrives on SSE
// streams the client GETs: the connection's stream, and one per session
// (Acp-Session-Id). The connection behind it is the same proxy.Conn a
// WebSocket has: auth, quotas, policy, path mapping and sealed session IDs
// are shared.

const (
	sessionIDHeader = "Acp-Session-Id"
	// sseKeepAlive is how often an idle SSE stream gets a comment.
	sseKeepAlive = 15 * time.Second
	// maxIdleSessionStreams bounds a connection's session streams that
	// buffer with no receiver (the SDK's DEFAULT_MAX_BUFFERED_SESSION_STREAMS).
	maxIdleSessionStreams = 1024
	// maxSessionStreams bounds a connection's session streams, read or not.
	maxSessionStreams = 1024
	// maxHeaderID bounds an Acp-Session-Id (the SDK's maxIdLength).
	maxHeaderID = 1024
)

// sessionScoped are the methods whose POST must name its session in
// Acp-Session-Id (as the SDK's server requires).
var sessionScoped = map[string]bool{
	"session/cancel": true, "session/close": true, "session/delete": true, "session/fork": true,
	"session/load": true, "session/prompt": true, "session/resume": true, "session/set_config_option": true,
	"session/set_mode": true, "session/set_model": true,
}

// httpConn is one Streamable-HTTP connection: the proxy.Conn's sink, which
// routes each message to its SSE stream.
type httpConn struct {
	s        *Server
	id       string
	tenant   string
	agent    string
	log      *slog.Logger
	conn     *proxy.Conn
	maxBytes int // what its streams may buffer together (limits.send_queue_bytes)
	start    time.Time
	// tenantLabel is its metrics label; opened is set once initialize
	// has been answered (it then counts as open).
	tenantLabel string
	opened      bool
	history     int // what its streams keep for a Last-Event-ID reconnect (sessions.replay_buffer_bytes)

	mu        sync.Mutex
	streams   map[string]*sseStream // "" = the connection stream, else a session ID
	gone      map[string]int64      // the next event id of session streams dropped while empty
	replyTo   map[string]string     // a client request's raw id → the stream of its response
	askedOn   map[string]string     // an agent request's raw id → the stream it went on
	buffered  int                   // bytes queued on all streams
	writing   int                   // receivers writing events they took from a queue
	wrote     time.Time             // when a receiver last finished writing events
	kept      int                   // bytes kept on all streams for Last-Event-ID
	initID    []byte                // the initialize request in flight, if any
	initReply chan []byte
	lastUse   time.Time // the last POST, or the last receiver leaving
	ended     bool
	closing   bool // end is on its way: take nothing more
	sc        jsonrpc.Scanner
	scanned   jsonrpc.Message
	room      chan struct{} // closed when a receiver takes events; nil until a sender waits
	done      chan struct{} // closed when the connection ends
}

// sseStream is one SSE stream of a connection: its queued events, the
// events sent (kept for a Last-Event-ID reconnect), and its receiver.
type sseStream struct {
	next     int64 // the id of the next event
	queue    []sseEvent
	sent     []sseEvent // oldest first
	sentSize int
	receiver bool
	wake     chan struct{} // 1-buffered: something queued, or the connection ended
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

// envelope is what routing needs of a JSON-RPC message.
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// sessionID is params.sessionId when it is a string.
func (e *envelope) sessionID() (string, bool) {
	var p struct {
		SessionID json.RawMessage `json:"sessionId"`
	}
	if len(e.Params) == 0 || e.Params[0] != '{' || json.Unmarshal(e.Params, &p) != nil || len(p.SessionID) == 0 || p.SessionID[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(p.SessionID, &s) != nil {
		return "", false
	}
	return s, true
}

// sessionIDSpec locates params.sessionId (requests and notifications).
var sessionIDSpec = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"sessionId": {Kind: jsonrpc.FieldSessionID}}}

func routeSpec(m *jsonrpc.Message) *jsonrpc.Spec {
	if m.Kind == jsonrpc.KindResponse {
		return nil
	}
	return sessionIDSpec
}

// routeFacts reads what routing needs of a message the proxy sends: its
// id, its method, and params.sessionId when that is a string. It uses the
// relay's own scanner (h.mu held: the scanner is not concurrent).
func (h *httpConn) routeFacts(msg []byte) (id []byte, method, sid string, hasSID bool) {
	m := &h.scanned
	if err := h.sc.Scan(msg, m, routeSpec); err != nil {
		return nil, "", "", false
	}
	if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		sid, hasSID = m.String(f)
	}
	return m.ID, m.Method, sid, hasSID
}

// Send routes one message from the proxy to its stream (proxy.Sink). With
// wait, a full buffer is waited on (up to a second at a time while the
// client keeps reading), as a WebSocket's send queue is.
func (h *httpConn) Send(msg []byte, wait bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, method, sid, hasSID := h.routeFacts(msg)
	if h.ended || h.closing {
		return false
	}
	route := ""
	switch {
	case method == "" && h.initReply != nil && bytes.Equal(id, h.initID):
		h.initReply <- msg // the initialize POST's body, never SSE
		h.initReply, h.initID = nil, nil
		return true
	case method == "":
		route = h.replyTo[string(id)]
		delete(h.replyTo, string(id))
	default:
		if hasSID {
			route = sid
		}
		if len(id) > 0 && string(id) != "null" {
			h.askedOn[string(id)] = route
		}
	}
	for wait && h.buffered+len(msg) > h.maxBytes && !h.ended {
		// Backpressure: the receivers are reading, just slower than
		// the agent writes. A second without progress ends it.
		before := h.buffered
		if h.room == nil {
			h.room = make(chan struct{})
		}
		room := h.room
		h.mu.Unlock()
		t := time.NewTimer(time.Second)
		select {
		case <-room:
		case <-t.C:
		}
		t.Stop()
		h.mu.Lock()
		if h.buffered >= before {
			break
		}
	}
	if h.ended {
		return false
	}
	if h.buffered+len(msg) > h.maxBytes {
		h.closing = true
		h.log.Warn("the client is not reading its event streams; closing the connection", "buffered_bytes", h.buffered)
		go h.end("the client does not read its event streams", "slow_client") // Send runs under the proxy's locks
		return false
	}
	if route != "" && h.streams[route] == nil && h.idleSessionStreams() >= maxIdleSessionStreams {
		h.log.Warn("too many session streams without a receiver; closing the connection")
		go h.end("too many unread session streams", "other")
		return false
	}
	st := h.stream(route)
	st.queue = append(st.queue, sseEvent{id: st.next, msg: msg})
	st.next++
	h.buffered += len(msg)
	st.poke()
	return true
}

// Supersede ends the HTTP side: a WebSocket resumed the connection.
func (h *httpConn) Supersede() { go h.end("resumed on a WebSocket", "other") }

func (h *httpConn) idleSessionStreams() int {
	n := 0
	for name, st := range h.streams {
		if name != "" && !st.receiver {
			n++
		}
	}
	return n
}

// end ends the connection once: its streams close, the proxy connection
// ends (its tenant slot is released by its OnEnd). label is the metrics
// reason, as for a WebSocket close.
func (h *httpConn) end(why, label string) {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended = true
	opened := h.opened
	close(h.done)
	if h.room != nil {
		close(h.room)
		h.room = nil
	}
	for _, st := range h.streams {
		st.poke()
	}
	h.mu.Unlock()
	h.s.mu.Lock()
	delete(h.s.httpConns, h.id)
	h.s.mu.Unlock()
	h.log.Info("connection closed", "reason", why, "duration", time.Since(h.start).Round(time.Millisecond))
	if opened {
		h.s.metrics.connsOpen.WithLabelValues(h.tenantLabel, "http", h.agent).Dec()
		h.s.metrics.connsTotal.WithLabelValues(h.tenantLabel, label, "http", h.agent).Inc()
	}
	h.conn.SocketEnded(h, true)
}

// plain writes a text/plain error, as the SDK's server does.
func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// authenticate applies the WebSocket upgrade's checks (origin, one
// credential) to a plain HTTP request and returns the tenant.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	if s.drain.Load() {
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return "", false
	}
	if s.authn == nil {
		return "", true
	}
	id, err := s.authn.Upgrade(r)
	if err != nil {
		auth.WriteError(w, err)
		return "", false
	}
	return id.Tenant, true
}

// authenticateAgent is authenticate, then routeAgent. A request of an open
// connection (Acp-Connection-Id) keeps its connection's agent: on /acp
// after a reload changed default_agent, and on the path of an agent a
// reload removed while it drains (its turns may still need the client).
func (s *Server) authenticateAgent(w http.ResponseWriter, r *http.Request) (tenant, agent string, ok bool) {
	if tenant, ok = s.authenticate(w, r); !ok {
		return "", "", false
	}
	if id := r.Header.Get(ConnectionIDHeader); id != "" {
		s.mu.Lock()
		h := s.httpConns[id]
		s.mu.Unlock()
		if p := chi.URLParam(r, "agent"); h != nil && h.tenant == tenant && (p == "" || p == h.agent) {
			return tenant, h.agent, true
		}
	}
	agent, ok = s.routeAgent(w, r, tenant)
	return tenant, agent, ok
}

// lookup finds the tenant's connection named by Acp-Connection-Id; another
// tenant's, or another agent's, gets the same 404 as an unknown one.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request, tenant, agent string) *httpConn {
	id := r.Header.Get(ConnectionIDHeader)
	if id == "" {
		plain(w, http.StatusBadRequest, "Missing Acp-Connection-Id")
		return nil
	}
	s.mu.Lock()
	h := s.httpConns[id]
	s.mu.Unlock()
	if h == nil || h.tenant != tenant || h.agent != agent {
		plain(w, http.StatusNotFound, "Unknown Acp-Connection-Id")
		return nil
	}
	return h
}

// sessionHeader reads Acp-Session-Id ("" when absent), refusing one over
// the SDK's maxIdLength.
func sessionHeader(w http.ResponseWriter, r *http.Request) (string, bool) {
	v := r.Header.Get(sessionIDHeader)
	if len(v) > maxHeaderID {
		plain(w, http.StatusBadRequest, fmt.Sprintf("Session ID exceeds maxIdLength (%d)", maxHeaderID))
		return "", false
	}
	return v, true
}

// handleHTTPPost takes one client message.
func (s *Server) handleHTTPPost(w http.ResponseWriter, r *http.Request) {
	tenant, agent, ok := s.authenticateAgent(w, r)
	if !ok {
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		plain(w, http.StatusUnsupportedMediaType, "Unsupported Media Type")
		return
	}
	limit := s.config().Limits.MaxMessageBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			plain(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body exceeds %d bytes (limits.max_message_bytes)", limit))
			return
		}
		plain(w, http.StatusBadRequest, "cannot read the request body")
		return
	}
	trimmed := bytes.TrimSpace(body)
	// One decode validates an object too; json.Valid only tells a
	// malformed body from a well-formed one that is not an object.
	var e envelope
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &e) != nil {
		if !json.Valid(trimmed) {
			plain(w, http.StatusBadRequest, "Invalid JSON")
			return
		}
	}
	switch trimmed[0] {
	case '[':
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: JSON-RPC batches are not supported"}}`)
		return
	case '{':
	default:
		plain(w, http.StatusBadRequest, "Invalid JSON-RPC message")
		return
	}
	isInit := e.JSONRPC == "2.0" && e.Method == "initialize" && len(e.ID) > 0
	connID := r.Header.Get(ConnectionIDHeader)
	switch {
	case isInit && connID == "":
		s.httpInitialize(w, r, tenant, agent, trimmed, &e)
		return
	case isInit:
		plain(w, http.StatusBadRequest, "Initialize not allowed on existing connection")
		return
	}
	h := s.lookup(w, r, tenant, agent)
	if h == nil {
		return
	}
	header, ok := sessionHeader(w, r)
	if !ok {
		return
	}
	if len(e.ID) > 0 && e.ID[0] == '"' {
		var rid string
		if json.Unmarshal(e.ID, &rid) == nil && len(rid) > maxHeaderID {
			plain(w, http.StatusBadRequest, fmt.Sprintf("Request ID exceeds maxIdLength (%d)", maxHeaderID))
			return
		}
	}
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		plain(w, http.StatusNotFound, "Unknown Acp-Connection-Id")
		return
	}
	h.lastUse = time.Now()
	if e.Method == "" && len(e.ID) > 0 { // an answer to an agent request
		if route, ok := h.askedOn[string(e.ID)]; ok && route != "" {
			if header == "" {
				h.mu.Unlock()
				plain(w, http.StatusBadRequest, "Missing Acp-Session-Id")
				return
			}
			if header != route {
				h.mu.Unlock()
				plain(w, http.StatusBadRequest, "Mismatched Acp-Session-Id")
				return
			}
		}
		delete(h.askedOn, string(e.ID))
	} else if e.Method != "" {
		sid, hasSID := e.sessionID()
		if (sessionScoped[e.Method] || hasSID) && header == "" {
			h.mu.Unlock()
			plain(w, http.StatusBadRequest, "Missing Acp-Session-Id")
			return
		}
		if hasSID && header != sid {
			h.mu.Unlock()
			plain(w, http.StatusBadRequest, "Mismatched Acp-Session-Id")
			return
		}
		if len(e.ID) > 0 && string(e.ID) != "null" {
			route := header
			if e.Method == "session/load" {
				route = "" // its answer goes where the client learns of sessions
			}
			h.replyTo[string(e.ID)] = route
		}
	}
	h.mu.Unlock()
	h.conn.HandleFrom(h, trimmed)
	w.WriteHeader(http.StatusAccepted)
}

// httpInitialize opens a connection: the initialize answer is the body.
func (s *Server) httpInitialize(w http.ResponseWriter, r *http.Request, tenant, agent string, msg []byte, e *envelope) {
	if string(e.ID) == "null" {
		plain(w, http.StatusBadRequest, "Initialize request must include an ID")
		return
	}
	if !s.admitTenant(tenant) {
		s.metrics.authFailures.WithLabelValues("too_many_connections").Inc()
		writeJSONError(w, http.StatusTooManyRequests, "too_many_connections",
			fmt.Sprintf("tenant %q has reached its max_connections", tenant))
		return
	}
	cfg := s.config()
	id := newConnID()
	log := s.log.With("conn", id, "transport", "http", "agent", agent)
	if s.authn != nil {
		log = log.With("tenant", tenant)
	}
	h := &httpConn{s: s, id: id, tenant: tenant, agent: agent, log: log, maxBytes: cfg.Limits.SendQueueBytes,
		history: cfg.Sessions.ReplayBufferBytes, streams: map[string]*sseStream{}, gone: map[string]int64{}, replyTo: map[string]string{},
		askedOn: map[string]string{}, initID: e.ID, initReply: make(chan []byte, 1), lastUse: time.Now(),
		done: make(chan struct{}), start: time.Now(), tenantLabel: s.metrics.tenants.Label(tenant)}
	conn, err := s.relay.NewConn(proxy.ConnInfo{ID: id, Tenant: tenant, Agent: agent, Log: log, NoResume: true, OnEnd: func() {
		s.releaseTenant(tenant)
		go h.end("ended", "other")
	}}, h)
	if err != nil {
		s.releaseTenant(tenant)
		log.Error("cannot serve connection", "err", err)
		plain(w, http.StatusInternalServerError, "internal error")
		return
	}
	h.conn = conn
	s.mu.Lock()
	if s.drain.Load() {
		s.mu.Unlock()
		conn.Close()
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	s.httpConns[id] = h
	s.mu.Unlock()
	log.Debug("connection opened", "remote", r.RemoteAddr)
	reply := h.initReply // Send clears the field once it has answered
	conn.HandleFrom(h, msg)
	ac := cfg.AgentNamed(agent)
	if ac == nil { // removed by a reload meanwhile
		ac = &config.NamedAgent{Agent: cfg.Agent, Pool: cfg.Pool}
	}
	wait := time.NewTimer(ac.Pool.AcquireTimeout.D() + ac.InitTimeout.D())
	defer wait.Stop()
	select {
	case reply := <-reply:
		h.mu.Lock()
		if !h.ended {
			h.opened = true
			s.metrics.connsOpen.WithLabelValues(h.tenantLabel, "http", h.agent).Inc()
		}
		h.mu.Unlock()
		w.Header().Set(ConnectionIDHeader, id)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(reply)
	case <-r.Context().Done():
		h.end("the client went away during initialize", "connection_lost")
	case <-wait.C:
		h.end("no initialize answer in time", "handshake_timeout")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"Initialize failed","data":"no answer from an agent in time"}}`, e.ID)
	}
}

// handleHTTPDelete ends a connection, as a WebSocket close 1000 would.
func (s *Server) handleHTTPDelete(w http.ResponseWriter, r *http.Request) {
	tenant, agent, ok := s.authenticateAgent(w, r)
	if !ok {
		return
	}
	h := s.lookup(w, r, tenant, agent)
	if h == nil {
		return
	}
	h.end("closed by client", "client_closed")
	w.WriteHeader(http.StatusAccepted)
}

// handleSSE serves one stream of a connection until the client leaves or
// the connection ends. Headers go out at once: the SDK client waits for
// them before it posts to the session.
func (s *Server) handleSSE(w http.ResponseWriter, r *http.Request) {
	if s.drain.Load() {
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	tenant, agent, ok := s.authenticateAgent(w, r) // an anonymous request learns nothing else
	if !ok {
		return
	}
	if !strings.Contains(strings.ToLower(r.Header.Get("Accept")), "text/event-stream") {
		plain(w, http.StatusNotAcceptable, "Not Acceptable")
		return
	}
	h := s.lookup(w, r, tenant, agent)
	if h == nil {
		return
	}
	name, ok := sessionHeader(w, r)
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
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		plain(w, http.StatusNotFound, "Unknown Acp-Connection-Id")
		return
	}
	if h.streams[name] == nil && len(h.streams) > maxSessionStreams {
		h.mu.Unlock()
		plain(w, http.StatusTooManyRequests, fmt.Sprintf("at most %d session event streams per connection", maxSessionStreams))
		return
	}
	st := h.stream(name)
	if st.receiver {
		h.mu.Unlock()
		plain(w, http.StatusConflict, "Outbound stream already has an active receiver")
		return
	}
	if after >= 0 {
		keptBefore := st.sentSize
		requeued, ok := st.rewind(after)
		if ok {
			h.kept -= keptBefore
		}
		if !ok {
			h.mu.Unlock()
			writeJSONError(w, http.StatusNotFound, "resume_refused", "the events after Last-Event-ID are no longer kept; start a new connection and session/load")
			return
		}
		h.buffered += requeued
	}
	st.receiver = true
	h.mu.Unlock()
	defer h.release(name, st)

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // proxies must not hold events back
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	writeTimeout := s.config().WebSocket.WriteTimeout.D()
	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	var buf []byte
	for {
		// The events are framed into buf before they are kept: once kept,
		// another stream's writer may evict (and recycle) them.
		h.mu.Lock()
		events := st.queue
		st.queue = nil
		buf = buf[:0]
		for _, ev := range events {
			buf = append(buf, "id: "...)
			buf = strconv.AppendInt(buf, ev.id, 10)
			buf = append(buf, "\ndata: "...)
			buf = append(buf, ev.msg...)
			buf = append(buf, "\n\n"...)
			h.buffered -= len(ev.msg)
			h.keep(st, ev)
		}
		if len(events) > 0 && h.room != nil {
			close(h.room)
			h.room = nil
		}
		ended := h.ended
		if len(events) > 0 {
			h.writing++
		}
		h.mu.Unlock()
		if len(events) > 0 {
			ok := s.writeSSE(rc, w, buf, writeTimeout)
			h.mu.Lock()
			h.writing--
			h.wrote = time.Now()
			h.mu.Unlock()
			if !ok {
				return
			}
			continue
		}
		if ended {
			// What was queued before the connection ended has gone out,
			// as a WebSocket's queue goes before its close frame.
			return
		}
		select {
		case <-st.wake:
		case <-h.done:
		case <-r.Context().Done():
			return
		case <-keepAlive.C:
			if !s.writeSSE(rc, w, []byte(":\n\n"), writeTimeout) {
				return
			}
		}
	}
}

// writeSSE writes and flushes within the write timeout: a receiver that
// stops reading is cut off rather than hold the stream.
func (s *Server) writeSSE(rc *http.ResponseController, w http.ResponseWriter, b []byte, timeout time.Duration) bool {
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
		jsonrpc.PutBuffer(victim.sent[0].msg) // the sink owns what it was sent
		victim.sent[0] = sseEvent{}
		victim.sent = victim.sent[1:]
	}
}

// rewind puts the events sent after id back in front of the queue, and
// forgets those up to it (the client has them). It returns the bytes put
// back, and false when the stream no longer holds every event after id.
func (st *sseStream) rewind(after int64) (int, bool) {
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
	if name != "" && len(st.queue) == 0 && len(st.sent) == 0 && h.streams[name] == st {
		delete(h.streams, name)
		if st.next > 1 { // a reconnect with Last-Event-ID must find where it was
			h.gone[name] = st.next
		}
	}
}

// endIdleHTTP ends HTTP connections with no receiver and no request for
// longer than idle.
func (s *Server) endIdleHTTP(idle time.Duration) {
	s.mu.Lock()
	conns := make([]*httpConn, 0, len(s.httpConns))
	for _, h := range s.httpConns {
		conns = append(conns, h)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, h := range conns {
		h.mu.Lock()
		busy := false
		for _, st := range h.streams {
			busy = busy || st.receiver
		}
		stale := !busy && now.Sub(h.lastUse) > idle
		h.mu.Unlock()
		if stale {
			h.end(fmt.Sprintf("no request and no event stream for %s", idle), "idle_timeout")
		}
	}
}

// endAllHTTP ends every HTTP connection (drain).
func (s *Server) endAllHTTP() {
	for _, h := range s.allHTTP() {
		h.end("shutdown", "shutdown")
	}
}

func (s *Server) allHTTP() []*httpConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*httpConn, 0, len(s.httpConns))
	for _, h := range s.httpConns {
		conns = append(conns, h)
	}
	return conns
}

// httpQuiet is how long a drain lets an HTTP connection's last events
// travel before it ends the connection's streams (see flushHTTP): longer
// than the 200 ms a proxy's kernel may hold the end of a partial response
// it forwards with MSG_MORE (HAProxy without option http-no-delay).
const httpQuiet = 300 * time.Millisecond

// flushHTTP waits, up to wait, until every HTTP connection (of agent, or
// all: "") has written what
// its streams with a receiver hold and has then been quiet for httpQuiet.
// A drain ends the connections after that: a client's streams are separate
// requests, so the end of one (the connection stream, which the SDK takes
// for the end of the connection, failing what it still waits for) could
// otherwise reach the client before the last events of another (a session
// stream's answer to the last prompt).
func (s *Server) flushHTTP(ctx context.Context, agent string, wait time.Duration) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		flushed := true
		for _, h := range s.allHTTP() {
			if agent != "" && h.agent != agent {
				continue
			}
			h.mu.Lock()
			flushed = flushed && h.writing == 0 && time.Since(h.wrote) >= httpQuiet
			for _, st := range h.streams {
				flushed = flushed && (!st.receiver || len(st.queue) == 0)
			}
			h.mu.Unlock()
		}
		if flushed {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// httpJanitor ends idle HTTP connections until ctx ends.
func (s *Server) httpJanitor(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			idle := s.config().Sessions.DetachTimeout.D()
			if idle < 30*time.Second {
				idle = 30 * time.Second
			}
			s.endIdleHTTP(idle)
		}
	}
}
