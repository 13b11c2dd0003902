package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	spans "github.com/acpgate/acpgate/proxy/observe/tracing"
)

// The Streamable-HTTP handlers on Server: a POST's authentication, its
// connection and session, its admission and the initialize that opens a
// connection; a DELETE. httpconn.go is the transport, sse.go the event
// streams a client GETs.

const (
	sessionIDHeader = "Acp-Session-Id"
	// maxHeaderID bounds an Acp-Session-Id (the SDK's maxIdLength).
	maxHeaderID = 1024
)

// sessionScoped are the methods whose POST must name its session in
// Acp-Session-Id (as the SDK's server requires).
var sessionScoped = map[string]bool{
	acp.SessionCancel: true, acp.SessionClose: true, acp.SessionDelete: true, acp.SessionFork: true,
	acp.SessionLoad: true, acp.SessionPrompt: true, acp.SessionResume: true, acp.SessionSetConfigOption: true,
	acp.SessionSetMode: true, acp.SessionSetModel: true,
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
	if id, ok := forwardedIdentity(r); ok {
		// Signed by the replica it reached, for a connection held here (no
		// replica carries an initialize): served while this replica drains
		// too, as its own clients' requests are.
		return id, true
	}
	if s.links.refusing() {
		plain(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return auth.Identity{}, false
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
	isInit := p.err == nil && m.Method == acp.Initialize && m.Kind == jsonrpc.KindRequest
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
		if m.Method == acp.SessionLoad {
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
