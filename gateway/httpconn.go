package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	spans "github.com/acpgate/acpgate/proxy/observe/tracing"
)

// Streamable HTTP on /acp, the transport of the official SDK's
// createHttpStream and AcpServer: the client POSTs each message; the
// initialize POST is answered in its body with an Acp-Connection-Id; every
// other accepted POST gets 202, and what the agent sends arrives on SSE
// streams the client GETs: the connection's stream, and one per session
// (Acp-Session-Id). The connection's life (admission, the send queue and
// slow-client rule, timeouts, drain) is its link's, as for a WebSocket;
// auth, quotas, policy, path mapping and sealed session IDs are the
// proxy.Conn's.

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
	// minHTTPIdle is the least an HTTP connection with no request and no
	// event stream is kept (else sessions.detach_timeout).
	minHTTPIdle = 30 * time.Second
)

// sessionScoped are the methods whose POST must name its session in
// Acp-Session-Id (as the SDK's server requires).
var sessionScoped = map[string]bool{
	"session/cancel": true, "session/close": true, "session/delete": true, "session/fork": true,
	"session/load": true, "session/prompt": true, "session/resume": true, "session/set_config_option": true,
	"session/set_mode": true, "session/set_model": true,
}

// httpConn is one Streamable-HTTP connection: its link's transport, which
// routes each message the proxy sends to its SSE stream. Its receivers
// (the SSE requests' goroutines, net/http's) are its writers.
type httpConn struct {
	link

	history int // what its streams keep for a Last-Event-ID reconnect (sessions.replay_buffer_bytes)

	// Guarded by link.mu.
	streams   map[string]*sseStream // "" = the connection stream, else a session ID
	gone      map[string]int64      // the next event id of session streams dropped while empty
	replyTo   map[string]string     // a client request's raw id → the stream of its response
	askedOn   map[string]string     // an agent request's raw id → the stream it went on
	writing   int                   // receivers writing events they took from a queue
	wroteAt   time.Time             // when a receiver last finished writing events
	changed   chan struct{}         // closed when a receiver finishes writing or leaves; nil until flush waits
	kept      int                   // bytes kept on all streams for Last-Event-ID
	initID    []byte                // the initialize request in flight, if any
	initReply chan []byte
	lastUse   time.Time // the last POST, or the last receiver leaving
	sc        jsonrpc.Scanner
	scanned   jsonrpc.Message
	facts     msgFacts // what routeFacts read last
}

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

// sessionIDSpec locates params.sessionId (requests and notifications).
var sessionIDSpec = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"sessionId": {Kind: jsonrpc.FieldSessionID}}}

func routeSpec(m *jsonrpc.Message) *jsonrpc.Spec {
	if m.Kind == jsonrpc.KindResponse {
		return nil
	}
	return sessionIDSpec
}

// sessionOf is params.sessionId of a scanned message, when it is a string.
func sessionOf(m *jsonrpc.Message) (string, bool) {
	if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		return m.String(f)
	}
	return "", false
}

// routeFacts reads what routing needs of a message the proxy sends: its
// id, its method, and params.sessionId when that is a string. It uses the
// relay's own scanner (h.mu held: the scanner is not concurrent).
func (h *httpConn) routeFacts(msg []byte) (id []byte, method, sid string, hasSID bool) {
	m := &h.scanned
	if err := h.sc.Scan(msg, m, routeSpec); err != nil {
		return nil, "", "", false
	}
	sid, hasSID = sessionOf(m)
	return m.ID, m.Method, sid, hasSID
}

// routeLocked implements transport: a response goes to the stream of its
// request (the initialize answer to the initialize POST's body), anything
// else to its session's stream, or the connection's.
func (h *httpConn) routeLocked(msg []byte, f *msgFacts) (string, bool) {
	if f == nil {
		f = &h.facts
		f.id, f.method, f.sid, f.hasSID = h.routeFacts(msg)
	}
	id, method, sid, hasSID := f.id, f.method, f.sid, f.hasSID
	switch {
	case method == "" && h.initReply != nil && bytes.Equal(id, h.initID):
		h.initReply <- msg // the initialize POST's body, never SSE
		h.initReply, h.initID = nil, nil
		return "", true
	case method == "":
		route := h.replyTo[string(id)]
		delete(h.replyTo, string(id))
		return route, false
	}
	route := ""
	if hasSID {
		route = sid
	}
	if len(id) > 0 && string(id) != "null" {
		h.askedOn[string(id)] = route
	}
	return route, false
}

// pushLocked implements transport.
func (h *httpConn) pushLocked(route string, msg []byte) bool {
	if route != "" && h.streams[route] == nil && h.idleSessionStreams() >= maxIdleSessionStreams {
		h.log.Warn("too many session streams without a receiver; closing the connection")
		h.link.closeLocked("too many unread session streams", "other")
		return false
	}
	st := h.stream(route)
	st.queue = append(st.queue, sseEvent{id: st.next, msg: msg})
	st.next++
	st.poke()
	return true
}

// dropQueuedLocked implements transport.
func (h *httpConn) dropQueuedLocked() (n, bytes int) {
	for _, st := range h.streams {
		for i, ev := range st.queue {
			bytes += len(ev.msg)
			h.giveBack(ev.msg)
			st.queue[i] = sseEvent{}
		}
		n += len(st.queue)
		st.queue = nil
	}
	return n, bytes
}

// closeLocked implements transport: run, waiting for the close, returns.
func (h *httpConn) closeLocked() {}

// handshakeDone implements transport: initialize has been answered.
func (h *httpConn) handshakeDone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.initReply == nil
}

// idleSince implements transport: the last POST or receiver leaving; a
// connection with a receiver is never idle.
func (h *httpConn) idleSince() (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	busy := false
	for _, st := range h.streams {
		busy = busy || st.receiver
	}
	return h.lastUse, busy
}

// tick implements transport: nothing periodic.
func (h *httpConn) tick(time.Time) time.Time { return time.Time{} }

// run waits for the connection's close (link.serve runs it). A drain's
// close first lets what the streams hold go out (flush). The streams end
// when the link's context does, after what they hold.
func (h *httpConn) run() (string, bool, []any) {
	<-h.closeReq
	reason, label, _ := h.closeState()
	if label == "shutdown" {
		h.flush(time.Second) // within the 5 s the shutdown bound leaves past the grace
	}
	return label, true, []any{"reason", reason}
}

// httpQuiet is how long a drain lets an HTTP connection's last events
// travel before it ends the connection's streams (see flush): longer than
// the 200 ms a proxy's kernel may hold the end of a partial response it
// forwards with MSG_MORE (HAProxy without option http-no-delay).
const httpQuiet = 300 * time.Millisecond

// flush waits, up to wait, until the connection has written what its
// streams with a receiver hold and has then been quiet for httpQuiet. A
// client's streams are separate requests, so the end of one (the
// connection stream, which the SDK takes for the end of the connection,
// failing what it still waits for) could otherwise reach the client before
// the last events of another (a session stream's answer to the last
// prompt). Receivers wake it as they finish writing or leave.
func (h *httpConn) flush(wait time.Duration) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	quiet := time.NewTimer(httpQuiet)
	defer quiet.Stop()
	for {
		h.mu.Lock()
		busy := h.writing > 0
		for _, st := range h.streams {
			busy = busy || st.receiver && len(st.queue) > 0
		}
		left := time.Until(h.wroteAt.Add(httpQuiet))
		if !busy && left <= 0 {
			h.mu.Unlock()
			return
		}
		if h.changed == nil {
			h.changed = make(chan struct{})
		}
		changed := h.changed
		h.mu.Unlock()
		quiet.Reset(max(left, 0))
		if busy {
			quiet.Stop()
		}
		select {
		case <-changed:
		case <-quiet.C:
		case <-deadline.C:
			return
		}
	}
}

// progressLocked wakes a waiting flush.
func (h *httpConn) progressLocked() {
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

func (h *httpConn) idleSessionStreams() int {
	n := 0
	for name, st := range h.streams {
		if name != "" && !st.receiver {
			n++
		}
	}
	return n
}

// plain writes a text/plain error, as the SDK's server does.
func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// authenticate applies the WebSocket upgrade's checks (origin, one
// credential) to a plain HTTP request and returns who it is (empty
// without authentication).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (auth.Identity, bool) {
	if s.links.refusing() {
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return auth.Identity{}, false
	}
	if id, ok := forwardedIdentity(r); ok { // signed by the replica it reached
		return id, true
	}
	if s.authn == nil {
		return auth.Identity{}, true
	}
	id, err := s.authn.Upgrade(r)
	if err != nil {
		auth.WriteError(w, err)
		return auth.Identity{}, false
	}
	return id, true
}

// authenticateAgent is authenticate, then routeAgent. A request of an open
// connection (Acp-Connection-Id) keeps its connection's agent: on /acp
// after a reload changed default_agent, and on the path of an agent a
// reload removed while it drains (its turns may still need the client).
func (s *Server) authenticateAgent(w http.ResponseWriter, r *http.Request) (who auth.Identity, agent string, ok bool) {
	if who, ok = s.authenticate(w, r); !ok {
		return auth.Identity{}, "", false
	}
	if id := r.Header.Get(ConnectionIDHeader); id != "" {
		h := s.links.httpConn(id)
		if p := chi.URLParam(r, "agent"); h != nil && h.owns(who) && (p == "" || p == h.agent) {
			return who, h.agent, true
		}
	}
	agent, ok = s.routeAgent(w, r, who.Tenant)
	return who, agent, ok
}

// owns reports whether the connection is who's: its requests come from
// the tenant and subject that initialized it.
func (h *httpConn) owns(who auth.Identity) bool {
	return h.tenant == who.Tenant && h.subject == who.Subject
}

// lookup finds who's connection named by Acp-Connection-Id; another
// tenant's or subject's, or another agent's, gets the same 404 as an
// unknown one.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request, who auth.Identity, agent string) *httpConn {
	id := r.Header.Get(ConnectionIDHeader)
	if id == "" {
		plain(w, http.StatusBadRequest, "Missing Acp-Connection-Id")
		return nil
	}
	h := s.links.httpConn(id)
	if h == nil || !h.owns(who) || h.agent != agent || h.ending() {
		plain(w, http.StatusNotFound, "Unknown Acp-Connection-Id")
		return nil
	}
	return h
}

// leftLocked implements transport: no stream is open and none has events
// waiting, no receiver is writing and no initialize waits for its answer.
// The client reads nothing more (the SDK's client ends its streams as it
// closes; its DELETE cannot reach a draining gateway, whose listener is
// closed).
func (h *httpConn) leftLocked() bool {
	if h.writing > 0 || h.initID != nil {
		return false
	}
	for _, st := range h.streams {
		if st.receiver || len(st.queue) > 0 {
			return false
		}
	}
	return true
}

// ending reports whether a close of the connection is decided (a DELETE,
// a drain, an administrator): it is gone for its client, even while it
// still leaves the registry.
func (h *httpConn) ending() bool {
	_, _, closing := h.closeState()
	return closing
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

// lookupSession finds the connection a request names (lookup), then reads
// its Acp-Session-Id (sessionHeader); false when either refused it.
func (s *Server) lookupSession(w http.ResponseWriter, r *http.Request, who auth.Identity, agent string) (*httpConn, string, bool) {
	h := s.lookup(w, r, who, agent)
	if h == nil {
		return nil, "", false
	}
	session, ok := sessionHeader(w, r)
	return h, session, ok
}

// postTrace is the trace context of a POST's traceparent and tracestate
// headers: the parent of its request's span unless params._meta names one.
func postTrace(r *http.Request) trace.SpanContext {
	return spans.ParseTraceparent(r.Header.Get("traceparent"), r.Header.Get("tracestate"))
}

// postScanners are the scanners of client POSTs, which run concurrently.
var postScanners = sync.Pool{New: func() any { return new(postScan) }}

// postScan is one scan of a POSTed message: the relay's scanner, once; the
// relay handles the message as scanned (proxy.Conn.HandleScannedTrace).
type postScan struct {
	sc  jsonrpc.Scanner
	m   jsonrpc.Message
	err *jsonrpc.ScanError // nil: m is a valid JSON-RPC message
}

// scan reads msg's id, method and params.sessionId; false when it has
// answered a message that is not JSON, a batch or not an object.
func (p *postScan) scan(w http.ResponseWriter, msg []byte) bool {
	p.err = nil
	err := proxy.ScanClient(&p.sc, msg, &p.m)
	if err == nil {
		return true
	}
	if !errors.As(err, &p.err) || p.err.Class == jsonrpc.ErrParse {
		plain(w, http.StatusBadRequest, "Invalid JSON")
		return false
	}
	switch {
	case p.err.Class == jsonrpc.ErrBatch:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: JSON-RPC batches are not supported"}}`)
		return false
	case msg[0] != '{':
		plain(w, http.StatusBadRequest, "Invalid JSON-RPC message")
		return false
	}
	return true // an object, not JSON-RPC: the proxy answers it
}

// handleHTTPPost takes one client message.
func (s *Server) handleHTTPPost(w http.ResponseWriter, r *http.Request) {
	who, agent, ok := s.authenticateAgent(w, r)
	if !ok || s.forwardHTTP(w, r, who) {
		return
	}
	msg, ok := s.readPost(w, r)
	if !ok {
		return
	}
	p := postScanners.Get().(*postScan)
	defer postScanners.Put(p)
	if !p.scan(w, msg) {
		return
	}
	m := &p.m
	isInit := p.err == nil && m.Method == "initialize" && m.Kind == jsonrpc.KindRequest
	if isInit && r.Header.Get(ConnectionIDHeader) == "" {
		s.httpInitialize(w, r, who, agent, msg, m)
		return
	} else if isInit {
		plain(w, http.StatusBadRequest, "Initialize not allowed on existing connection")
		return
	}
	h, header, ok := s.lookupSession(w, r, who, agent)
	if !ok || p.err == nil && !checkRequestID(w, m.ID) {
		return
	}
	if status, why := h.admitPost(p, header); status != 0 {
		plain(w, status, why)
		return
	}
	h.read(len(msg))
	switch {
	case p.err == nil && s.replicas.intercept(&h.link, msg, m): // a session another replica holds: carried there
	case p.err == nil:
		h.conn.HandleScannedTrace(&h.link, m, postTrace(r))
	default:
		h.conn.HandleFrom(&h.link, msg) // the relay answers what is not JSON-RPC
	}
	w.WriteHeader(http.StatusAccepted)
}

// readPost reads a POST's body, a JSON message within
// limits.max_message_bytes, or answers why not.
func (s *Server) readPost(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		plain(w, http.StatusUnsupportedMediaType, "Unsupported Media Type")
		return nil, false
	}
	limit := s.config().Limits.MaxMessageBytes
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			plain(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body exceeds %d bytes (limits.max_message_bytes)", limit))
			return nil, false
		}
		plain(w, http.StatusBadRequest, "cannot read the request body")
		return nil, false
	}
	return bytes.TrimSpace(body), true
}

// checkRequestID refuses a string id over the SDK's maxIdLength.
func checkRequestID(w http.ResponseWriter, id []byte) bool {
	if len(id) <= maxHeaderID+2 || id[0] != '"' {
		return true
	}
	var rid string
	if json.Unmarshal(id, &rid) == nil && len(rid) > maxHeaderID {
		plain(w, http.StatusBadRequest, fmt.Sprintf("Request ID exceeds maxIdLength (%d)", maxHeaderID))
		return false
	}
	return true
}

// admitPost checks a POSTed message's Acp-Session-Id (header) against its
// session and records where its answer goes; a status other than 0
// refuses it.
func (h *httpConn) admitPost(p *postScan, header string) (int, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing || h.done {
		return http.StatusNotFound, "Unknown Acp-Connection-Id"
	}
	h.lastUse = time.Now()
	if p.err != nil {
		return 0, "" // no id or method to route by: the proxy answers it
	}
	m := &p.m
	if m.Kind == jsonrpc.KindResponse { // an answer to an agent request
		route, ok := h.askedOn[string(m.ID)]
		switch {
		case ok && route != "" && header == "":
			return http.StatusBadRequest, "Missing Acp-Session-Id"
		case ok && route != "" && header != route:
			return http.StatusBadRequest, "Mismatched Acp-Session-Id"
		}
		delete(h.askedOn, string(m.ID))
		return 0, ""
	}
	sid, hasSID := sessionOf(m)
	if (sessionScoped[m.Method] || hasSID) && header == "" {
		return http.StatusBadRequest, "Missing Acp-Session-Id"
	}
	if hasSID && header != sid {
		return http.StatusBadRequest, "Mismatched Acp-Session-Id"
	}
	if m.Kind == jsonrpc.KindRequest && string(m.ID) != "null" {
		route := header
		if m.Method == "session/load" {
			route = "" // its answer goes where the client learns of sessions
		}
		h.replyTo[string(m.ID)] = route
	}
	return 0, ""
}

// httpInitialize opens a connection: the initialize answer is the body. m
// is msg as scanned, handed to the relay as it is.
func (s *Server) httpInitialize(w http.ResponseWriter, r *http.Request, who auth.Identity, agent string, msg []byte, m *jsonrpc.Message) {
	id := m.ID
	if string(id) == "null" {
		plain(w, http.StatusBadRequest, "Initialize request must include an ID")
		return
	}
	if !s.admit(w, who.Tenant) {
		return
	}
	h, err := s.newHTTPConn(who, agent, id, affinityOf(r, s.config()), r.RemoteAddr)
	if err != nil {
		h.cancel()
		h.log.Error("cannot serve connection", "err", err)
		plain(w, http.StatusInternalServerError, "internal error")
		return
	}
	if !s.links.register(&h.link) {
		h.conn.Close()
		h.cancel()
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	go h.serve(h.run)
	h.log.Debug("connection opened", "remote", r.RemoteAddr)
	h.recordOpened()
	reply := h.initReply // Send clears the field once it has answered
	h.read(len(msg))
	s.replicas.noteInit(&h.link, msg)
	h.conn.HandleScannedTrace(&h.link, m, postTrace(r))
	select {
	case reply := <-reply:
		h.answerInit(w, reply)
	case <-r.Context().Done():
		h.closeWith("the client went away during initialize", "connection_lost")
	case <-h.ctx.Done():
		select {
		case reply := <-reply: // answered just before the end
			h.answerInit(w, reply)
			return
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"Initialize failed","data":"no answer from an agent in time"}}`, id)
	}
}

// newHTTPConn makes a connection whose initialize (id) is on its way. Its
// handshake timeout is the time a first agent process may take.
func (s *Server) newHTTPConn(who auth.Identity, agent string, initID []byte, affinity, remote string) (*httpConn, error) {
	tenant := who.Tenant
	cfg := s.config()
	id := s.newConnID()
	log := s.log.With("conn", id, "transport", "http", "agent", agent)
	if s.authn != nil {
		log = log.With("tenant", tenant)
	}
	ac := cfg.AgentNamed(agent)
	if ac == nil { // removed by a reload meanwhile
		ac = &config.NamedAgent{Agent: cfg.Agent, Pool: cfg.Pool}
	}
	h := &httpConn{history: cfg.Sessions.ReplayBufferBytes, streams: map[string]*sseStream{}, gone: map[string]int64{},
		replyTo: map[string]string{}, askedOn: map[string]string{}, initID: bytes.Clone(initID),
		initReply: make(chan []byte, 1), lastUse: time.Now()}
	h.init(s, h, linkInfo{kind: "http", id: id, tenant: tenant, subject: who.Subject, agent: agent, log: log, cfg: cfg, affinity: affinity, remote: remote,
		handshake: ac.Pool.AcquireTimeout.D() + ac.InitTimeout.D(), idle: max(cfg.Sessions.DetachTimeout.D(), minHTTPIdle)})
	// The proxy connection ending (its tenant slot given back) ends this.
	err := h.newConn(true, func() { h.closeWith("ended", "other") })
	return h, err
}

// answerInit writes the initialize answer: the connection is open.
func (h *httpConn) answerInit(w http.ResponseWriter, reply []byte) {
	h.markOpen()
	w.Header().Set(ConnectionIDHeader, h.id)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(reply)
	h.wrote(1, len(reply))
	h.giveBack(reply) // the sink owns what it was sent
}

// handleHTTPDelete ends a connection, as a WebSocket close 1000 would.
func (s *Server) handleHTTPDelete(w http.ResponseWriter, r *http.Request) {
	who, agent, ok := s.authenticateAgent(w, r)
	if !ok || s.forwardHTTP(w, r, who) {
		return
	}
	h := s.lookup(w, r, who, agent)
	if h == nil {
		return
	}
	h.closeWith("closed by client", "client_closed")
	w.WriteHeader(http.StatusAccepted)
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
	writeTimeout := h.cfg.WebSocket.WriteTimeout.D()
	keepAlive := time.NewTicker(sseKeepAlive)
	defer keepAlive.Stop()
	var buf []byte
	for {
		var n, size int
		h.gather(st)
		buf, n, size = h.takeEvents(st, buf[:0])
		if n > 0 {
			ok := writeSSE(rc, w, buf, writeTimeout)
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
			if !writeSSE(rc, w, []byte(":\n\n"), writeTimeout) {
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
