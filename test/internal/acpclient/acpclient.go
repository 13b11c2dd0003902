// Package acpclient is the raw JSON-RPC over WebSocket client the test
// harnesses share. A Conn dials the gateway's /acp, reads every text frame
// into a channel of decoded messages on a goroutine of its own, and writes
// frames as given; it never fails a test (worker goroutines use it too).
// Client (one socket) and Resumable (a connection across sockets, resumed
// exactly) are for the test's own goroutine and fail the test instead of
// returning errors.
package acpclient

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Error is a JSON-RPC error object.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// Msg is one JSON-RPC message as the gateway sent it.
type Msg struct {
	Raw    []byte          `json:"-"` // the frame as read
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
}

// IsResponseTo reports whether m answers the request with the number id.
func (m Msg) IsResponseTo(id int) bool {
	return m.Method == "" && string(m.ID) == strconv.Itoa(id)
}

// Param returns a string field of params ("" if absent).
func (m Msg) Param(key string) string {
	var p map[string]any
	_ = json.Unmarshal(m.Params, &p)
	s, _ := p[key].(string)
	return s
}

// NewSessionID returns the sessionId of m, the answer to a session/new:
// "" when m is an error or carries none.
func (m Msg) NewSessionID() string {
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil {
		return ""
	}
	return res.SessionID
}

// Options says how to dial.
type Options struct {
	Header       http.Header
	Subprotocols []string      // sent as one Sec-WebSocket-Protocol header
	Timeout      time.Duration // for the handshake; 0 = 10 s
	Buffer       int           // messages read ahead; 0 = 100000
	// BadJSON is given a frame that is not JSON (Raw set) and says whether
	// to pass it on; nil drops it.
	BadJSON func(m *Msg, err error) bool
}

// Conn is one WebSocket and the goroutine that reads it.
type Conn struct {
	WS     *websocket.Conn
	TCP    *net.TCPConn // the connection under the WebSocket
	ConnID string       // the 101's Acp-Connection-Id
	In     chan Msg     // closed when the connection ends

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	readErr error
}

// Dial opens a WebSocket to url (ws://127.0.0.1:port/path). Keep-alives are
// off, so a refused handshake leaves nothing behind: it returns the HTTP
// response (its body holds at least the first 1 KiB) and the error. The
// caller closes the Conn.
func Dial(url string, o Options) (*Conn, *http.Response, error) {
	var (
		mu  sync.Mutex
		tcp *net.TCPConn
	)
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			tcp, _ = conn.(*net.TCPConn)
			mu.Unlock()
		}
		return conn, err
	}}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Buffer == 0 {
		o.Buffer = 100000
	}
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, o.Timeout)
	defer dcancel()
	ws, resp, err := websocket.Dial(dctx, url, &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   o.Header,
		Subprotocols: o.Subprotocols,
	})
	if err != nil {
		cancel()
		tr.CloseIdleConnections()
		return nil, resp, err
	}
	ws.SetReadLimit(64 << 20)
	mu.Lock()
	c := &Conn{WS: ws, TCP: tcp, ConnID: resp.Header.Get("Acp-Connection-Id"), In: make(chan Msg, o.Buffer),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	mu.Unlock()
	go c.read(o.BadJSON)
	return c, resp, nil
}

// read reads messages into In until the connection or its context ends,
// then records why and closes In and done.
func (c *Conn) read(bad func(*Msg, error) bool) {
	defer close(c.done)
	defer close(c.In)
	for {
		_, b, err := c.WS.Read(c.ctx)
		if err != nil {
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
			return
		}
		var m Msg
		if err := json.Unmarshal(b, &m); err != nil {
			m = Msg{Raw: b}
			if bad == nil || !bad(&m, err) {
				continue
			}
		}
		m.Raw = b
		select {
		case c.In <- m:
		case <-c.ctx.Done(): // closed while nobody reads
			return
		}
	}
}

// Ctx is the connection's context: cancelled when it is closed.
func (c *Conn) Ctx() context.Context { return c.ctx }

// Done is closed when the reading goroutine has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why reading ended (nil while it goes on).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// Write sends one text frame.
func (c *Conn) Write(b []byte) error {
	return c.WS.Write(c.ctx, websocket.MessageText, b)
}

// WriteJSON sends v as one JSON text frame, waiting at most timeout.
func (c *Conn) WriteJSON(v any, timeout time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	return c.WS.Write(ctx, websocket.MessageText, b)
}

// Close ends the connection with 1000 and waits for the reader.
func (c *Conn) Close() { _ = c.CloseWith(websocket.StatusNormalClosure, "") }

// CloseWith ends the connection with a close handshake of code and
// reason, waits for the reader and returns the handshake's error.
func (c *Conn) CloseWith(code websocket.StatusCode, reason string) error {
	err := c.WS.Close(code, reason)
	c.cancel()
	<-c.done
	return err
}

// Kill drops the connection without a close handshake.
func (c *Conn) Kill() {
	_ = c.WS.CloseNow()
	c.cancel()
	<-c.done
}

// Reset drops the TCP connection with an RST and no close frame, as a
// network loss does.
func (c *Conn) Reset() error {
	if c.TCP == nil {
		return net.ErrClosed
	}
	if err := c.TCP.SetLinger(0); err != nil {
		return err
	}
	err := c.TCP.Close()
	c.cancel()
	<-c.done
	_ = c.WS.CloseNow()
	return err
}

// Request is a JSON-RPC request object with a numeric id.
func Request(id int, method string, params any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params}
}

// Notification is a JSON-RPC notification object.
func Notification(method string, params any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "method": method, "params": params}
}

// Response is a JSON-RPC result answering id.
func Response(id json.RawMessage, result any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "result": result}
}

// TextPrompt is the params of a session/prompt with one text block.
func TextPrompt(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": text}}}
}

// PromptParams is the params of a session/prompt as the test agents
// (test/fakeagent, the load harness's agent) decode them.
type PromptParams struct {
	SessionID string        `json:"sessionId"`
	Prompt    []PromptBlock `json:"prompt"`
}

// PromptBlock is one content block of a prompt.
type PromptBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}
