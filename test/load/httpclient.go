package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The Streamable HTTP client: the wire of the SDK's createHttpStream, as
// the gateway serves it on /acp. Each message the client sends is a POST.
// The initialize POST carries no Acp-Connection-Id and is answered 200 with
// the response as its body and the connection's Acp-Connection-Id; every
// other POST names the connection (and the session, when params.sessionId
// is a string) and is answered 202 with an empty body. What the gateway
// sends arrives on SSE streams: the connection's (GET with
// Acp-Connection-Id: the answers to session/new and the like) and one per
// session (GET with Acp-Session-Id too: session/update, the answers to
// session/prompt and to requests that name the session). Events are
// "id: N\ndata: <json>\n\n".

const (
	connIDHeader    = "Acp-Connection-Id"
	sessIDHeader    = "Acp-Session-Id"
	sseReadBuffer   = 64 << 10
	maxSSEMessage   = 64 << 20 // as the WebSocket client's read limit
	sseBatchMsgs    = 1024     // a batch is handed to Recv after this many messages ...
	sseBatchBytes   = 1 << 20  // ... or bytes, or when the socket has nothing more buffered
	sseQueueBatches = 16
)

// newHTTPClient is one client's HTTP stack: keep-alive connections to the
// gateway (each SSE stream holds one, POSTs reuse an idle one), no proxy
// from the environment, no compression, no HTTP/2.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		ReadBufferSize:      sseReadBuffer,
		WriteBufferSize:     16 << 10,
	}}
}

// httpTransport is one Streamable HTTP connection. Each SSE stream is read
// by a goroutine of its own, which hands the messages to Recv in batches
// (one channel operation per socket read, not per message), or, once
// onMessage is set, to onMessage as each arrives.
type httpTransport struct {
	url    string
	client *http.Client
	ctx    context.Context
	cancel context.CancelFunc
	connID string
	// pending holds the initialize answer (the POST's body) until Recv
	// takes it.
	pending [][]byte

	mu       sync.Mutex
	sessions map[string]bool // the session streams opened

	in   chan *sseBatch
	free chan *sseBatch
	cur  *sseBatch
	pos  int

	// onMessage, if set, takes each message from the streams' goroutines
	// instead of Recv (the fan-in clients: no hand-off between goroutines,
	// as a WebSocket reader delivers what it reads).
	onMessage atomic.Pointer[func([]byte)]
	closeOnce sync.Once
}

// sseBatch is messages read from one stream: buf holds them back to back,
// ends[i] is where message i ends. err ends the stream.
type sseBatch struct {
	buf  []byte
	ends []int
	err  error
}

func newHTTPTransport(url string) *httpTransport {
	ctx, cancel := context.WithCancel(context.Background())
	return &httpTransport{url: url, client: newHTTPClient(), ctx: ctx, cancel: cancel, sessions: map[string]bool{},
		in: make(chan *sseBatch, sseQueueBatches), free: make(chan *sseBatch, sseQueueBatches+2)}
}

// Send POSTs msg: initialize first (it opens the connection and its
// stream), then anything, with Acp-Session-Id when params.sessionId is a
// string. The session's stream is opened first if it is not yet.
func (t *httpTransport) Send(msg []byte) error {
	if t.connID == "" {
		return t.initialize(msg)
	}
	return t.PostSession(msg, paramsSessionID(msg))
}

// PostSession POSTs msg for session sid ("" = none) and expects 202.
func (t *httpTransport) PostSession(msg []byte, sid string) error {
	if sid != "" {
		if err := t.openSession(sid); err != nil {
			return err
		}
	}
	resp, err := t.post(msg, sid)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("POST: %s: %.300s", resp.Status, body)
	}
	return nil
}

func (t *httpTransport) post(msg []byte, sid string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.ctx, http.MethodPost, t.url, bytes.NewReader(msg))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.connID != "" {
		req.Header.Set(connIDHeader, t.connID)
	}
	if sid != "" {
		req.Header.Set(sessIDHeader, sid)
	}
	return t.client.Do(req)
}

// initialize POSTs the initialize request, keeps its answer for Recv and
// opens the connection's stream.
func (t *httpTransport) initialize(msg []byte) error {
	var m struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(msg, &m) != nil || m.Method != "initialize" {
		return errors.New("the first message over HTTP must be initialize")
	}
	resp, err := t.post(msg, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSSEMessage))
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("initialize: %s: %.300s", resp.Status, body)
	}
	if t.connID = resp.Header.Get(connIDHeader); t.connID == "" {
		return errors.New("initialize: no Acp-Connection-Id in the answer")
	}
	t.pending = append(t.pending, body)
	return t.openStream("")
}

// openSession opens session sid's stream unless it is open.
func (t *httpTransport) openSession(sid string) error {
	t.mu.Lock()
	open := t.sessions[sid]
	t.sessions[sid] = true
	t.mu.Unlock()
	if open {
		return nil
	}
	if err := t.openStream(sid); err != nil {
		t.mu.Lock()
		delete(t.sessions, sid)
		t.mu.Unlock()
		return err
	}
	return nil
}

// openStream GETs a stream (sid "" = the connection's), waits for its
// headers and starts its reader.
func (t *httpTransport) openStream(sid string) error {
	req, err := http.NewRequestWithContext(t.ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(connIDHeader, t.connID)
	if sid != "" {
		req.Header.Set(sessIDHeader, sid)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return fmt.Errorf("GET stream %q: %s: %.300s", sid, resp.Status, body)
	}
	go t.readStream(resp.Body, sid)
	return nil
}

func (t *httpTransport) getBatch() *sseBatch {
	select {
	case b := <-t.free:
		b.buf, b.ends = b.buf[:0], b.ends[:0]
		return b
	default:
		return &sseBatch{buf: make([]byte, 0, 64<<10)}
	}
}

// hand passes a batch to Recv; false when the transport is closed.
func (t *httpTransport) hand(b *sseBatch) bool {
	select {
	case t.in <- b:
		return true
	case <-t.ctx.Done():
		return false
	}
}

// readStream parses one SSE stream until it ends. Only data lines count
// (several are joined with "\n"); id:, event:, retry: and comment lines are
// skipped; a blank line ends an event. A message on the connection stream
// that answers with a result.sessionId opens that session's stream before
// it is passed on, as the SDK's client does, so that the client's next
// POST to the session finds its stream open.
func (t *httpTransport) readStream(body io.ReadCloser, sid string) {
	defer body.Close()
	br := bufio.NewReaderSize(body, sseReadBuffer)
	b := t.getBatch()
	var long []byte
	start, inData := 0, false // where the current event's data starts in b.buf
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxSSEMessage {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			if err == nil && len(long) > maxSSEMessage {
				err = fmt.Errorf("an SSE line longer than %d bytes", maxSSEMessage)
			}
			line = long
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if len(b.ends) > 0 && !t.hand(b) {
				return
			}
			name := "connection"
			if sid != "" {
				name = "session " + sid
			}
			if h := t.onMessage.Load(); h == nil && t.ctx.Err() == nil {
				t.hand(&sseBatch{err: fmt.Errorf("the %s stream ended: %w", name, err)})
			}
			return
		}
		line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
		switch {
		case len(line) == 0: // the end of an event
			if !inData {
				continue
			}
			inData = false
			msg := b.buf[start:]
			if sid == "" && bytes.Contains(msg, []byte(`"sessionId"`)) {
				if s := resultSessionID(msg); s != "" {
					if err := t.openSession(s); err != nil && t.ctx.Err() == nil {
						t.hand(&sseBatch{err: fmt.Errorf("open the stream of session %s: %w", s, err)})
						return
					}
				}
			}
			if h := t.onMessage.Load(); h != nil {
				if len(b.ends) > 0 { // what came before onMessage was set
					if !t.hand(b) {
						return
					}
					b = t.getBatch()
					b.buf = append(b.buf, msg...)
					msg, start = b.buf, 0
				}
				(*h)(msg)
				b.buf = b.buf[:start]
				continue
			}
			b.ends = append(b.ends, len(b.buf))
			if br.Buffered() == 0 || len(b.ends) >= sseBatchMsgs || len(b.buf) >= sseBatchBytes {
				if !t.hand(b) {
					return
				}
				b = t.getBatch()
			}
		case bytes.HasPrefix(line, []byte("data:")):
			d := line[len("data:"):]
			if len(d) > 0 && d[0] == ' ' {
				d = d[1:]
			}
			if inData {
				b.buf = append(b.buf, '\n')
			} else {
				start, inData = len(b.buf), true
			}
			b.buf = append(b.buf, d...)
		}
		// Anything else (id:, event:, retry:, a ":" comment) is skipped.
	}
}

// Recv returns the next message from any stream (the initialize answer
// first); it is valid until the next call.
func (t *httpTransport) Recv() ([]byte, error) {
	if len(t.pending) > 0 {
		m := t.pending[0]
		t.pending = t.pending[1:]
		return m, nil
	}
	for {
		if b := t.cur; b != nil {
			if t.pos < len(b.ends) {
				from := 0
				if t.pos > 0 {
					from = b.ends[t.pos-1]
				}
				t.pos++
				return b.buf[from:b.ends[t.pos-1]], nil
			}
			select {
			case t.free <- b:
			default:
			}
			t.cur = nil
		}
		select {
		case b := <-t.in:
			if b.err != nil {
				return nil, b.err
			}
			t.cur, t.pos = b, 0
		case <-t.ctx.Done():
			return nil, net.ErrClosed
		}
	}
}

// Close ends the connection (DELETE, as the SDK's client does), then its
// streams and its keep-alive connections.
func (t *httpTransport) Close() error {
	t.closeOnce.Do(func() {
		if t.connID != "" && t.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(t.ctx, 5*time.Second)
			if req, err := http.NewRequestWithContext(ctx, http.MethodDelete, t.url, nil); err == nil {
				req.Header.Set(connIDHeader, t.connID)
				if resp, err := t.client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			cancel()
		}
		t.cancel()
		t.client.CloseIdleConnections()
	})
	return nil
}

// paramsSessionID is params.sessionId when it is a string.
func paramsSessionID(msg []byte) string {
	var m struct {
		Params struct {
			SessionID json.RawMessage `json:"sessionId"`
		} `json:"params"`
	}
	var s string
	if json.Unmarshal(msg, &m) != nil || len(m.Params.SessionID) == 0 || json.Unmarshal(m.Params.SessionID, &s) != nil {
		return ""
	}
	return s
}

// resultSessionID is result.sessionId of a response, when it is a string.
func resultSessionID(msg []byte) string {
	var m struct {
		Result struct {
			SessionID string `json:"sessionId"`
		} `json:"result"`
	}
	if json.Unmarshal(msg, &m) != nil {
		return ""
	}
	return m.Result.SessionID
}

// httpEndpoint is a fan-in client over HTTP. The dispatcher only queues a
// request; the client's own goroutine POSTs its requests one at a time, in
// order, as the SDK's client does. (Over a WebSocket the dispatcher's send
// is a write to the socket; a POST waits for its 202, and one dispatcher
// waiting for each would measure itself.) With lean (-http-client lean,
// the default) that goroutine writes each POST on a keep-alive connection
// of its own and reads the answer itself (postConn); otherwise it uses the
// transport's http.Client.
type httpEndpoint struct {
	t    *httpTransport
	sid  string
	q    chan []byte
	done chan struct{}
	once sync.Once
	dead atomic.Bool
}

func newHTTPEndpoint(t *httpTransport, sid string, lean bool, fail func(error)) (*httpEndpoint, error) {
	e := &httpEndpoint{t: t, sid: sid, q: make(chan []byte, 4096), done: make(chan struct{})}
	post, stop := func(msg []byte) error { return t.PostSession(msg, sid) }, func() {}
	if lean {
		pc, err := newPostConn(t.url, t.connID)
		if err != nil {
			return nil, err
		}
		post, stop = func(msg []byte) error { return pc.post(msg, sid) }, pc.close
	}
	go func() {
		defer stop()
		for {
			select {
			case msg := <-e.q:
				if e.dead.Load() {
					continue
				}
				if err := post(msg); err != nil {
					e.dead.Store(true)
					fail(err)
				}
			case <-e.done:
				return
			}
		}
	}()
	return e, nil
}

func (e *httpEndpoint) send(msg []byte) error {
	if e.dead.Load() {
		return errors.New("an earlier POST failed")
	}
	select {
	case e.q <- bytes.Clone(msg):
		return nil
	case <-e.done:
		return net.ErrClosed
	}
}

func (e *httpEndpoint) close() {
	e.once.Do(func() { close(e.done) })
	e.t.Close()
}

// postConn POSTs on one keep-alive connection from the caller's goroutine:
// the request goes out in one write, and the answer is read with
// net/http's own parser (http.ReadResponse). net/http's Transport hands
// each request to a writer goroutine and each answer back from a reader
// goroutine; on two vCPUs shared with the gateway, those hand-offs cost
// the client about 40% more CPU per round trip and showed in the latency
// tail (docs/benchmarks/issue-15-21-streamable-http.md).
type postConn struct {
	addr, host, path, connID string
	c                        net.Conn
	br                       *bufio.Reader
	used                     bool // a request went over c: it may have been closed since
	buf                      []byte
}

func newPostConn(rawURL, connID string) (*postConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" {
		return nil, fmt.Errorf("POST URL %q: want http://host/path", rawURL)
	}
	return &postConn{addr: u.Host, host: u.Host, path: u.RequestURI(), connID: connID}, nil
}

func (p *postConn) close() {
	if p.c != nil {
		p.c.Close()
		p.c = nil
	}
}

// post sends msg for session sid ("" = none) and expects 202. A reused
// connection that the server had closed is redialled once.
func (p *postConn) post(msg []byte, sid string) error {
	b := append(p.buf[:0], "POST "...)
	b = append(b, p.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, p.host...)
	b = append(b, "\r\nContent-Type: application/json\r\n"+connIDHeader+": "...)
	b = append(b, p.connID...)
	if sid != "" {
		b = append(b, "\r\n"+sessIDHeader+": "...)
		b = append(b, sid...)
	}
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(msg)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, msg...)
	p.buf = b
	for try := 0; ; try++ {
		resp, err := p.roundTrip(b)
		if err != nil {
			reused := p.used
			p.close()
			if reused && try == 0 && errors.Is(err, io.EOF) {
				continue // closed while idle: nothing was read, so nothing was handled
			}
			return err
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if err != nil || resp.Close {
			p.close()
		}
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST: %s: %.300s", resp.Status, body)
		}
		return err
	}
}

func (p *postConn) roundTrip(req []byte) (*http.Response, error) {
	if p.c == nil {
		c, err := net.DialTimeout("tcp", p.addr, 30*time.Second)
		if err != nil {
			return nil, err
		}
		p.c, p.br, p.used = c, bufio.NewReaderSize(c, 4<<10), false
	}
	if _, err := p.c.Write(req); err != nil {
		return nil, err
	}
	p.used = true
	return http.ReadResponse(p.br, nil)
}
