package gateway

import (
	"bytes"
	"time"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// Streamable HTTP on /acp, the transport of the official SDK's
// createHttpStream and AcpServer: the client POSTs each message; the
// initialize POST is answered in its body with an Acp-Connection-Id; every
// other accepted POST gets 202, and what the agent sends arrives on SSE
// streams the client GETs: the connection's stream, and one per session
// (Acp-Session-Id). The connection's life (admission, the send queue and
// slow-client rule, timeouts, drain) is its link's, as for a WebSocket;
// auth, quotas, policy, path mapping and sealed session IDs are the
// proxy.Conn's. This file is the transport; httppost.go has the POST and
// DELETE handlers, sse.go the event streams.

const (
	// maxIdleSessionStreams bounds a connection's session streams that
	// buffer with no receiver (the SDK's DEFAULT_MAX_BUFFERED_SESSION_STREAMS).
	maxIdleSessionStreams = 1024
	// minHTTPIdle is the least an HTTP connection with no request and no
	// event stream is kept (else sessions.detach_timeout).
	minHTTPIdle = 30 * time.Second
)

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

// owns reports whether the connection is who's: its requests come from
// the tenant and subject that initialized it.
func (h *httpConn) owns(who auth.Identity) bool {
	return h.tenant == who.Tenant && h.subject == who.Subject
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
