package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A WebSocket ACP client that goes through the balancer, keeps the
// affinity cookie it is given and can resume its connection exactly
// (README, Resume after a drop).

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type rpcMsg struct {
	Raw    []byte          `json:"-"`
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

func (m rpcMsg) isResponseTo(id int) bool {
	return m.Method == "" && string(m.ID) == strconv.Itoa(id)
}

// socket is one WebSocket to the balancer.
type socket struct {
	ws     *websocket.Conn
	tcp    *net.TCPConn
	resp   *http.Response // the 101
	ctx    context.Context
	cancel context.CancelFunc
	in     chan rpcMsg
	done   chan struct{}

	mu      sync.Mutex
	readErr error
}

// dialSocket opens a WebSocket to addr+path with header. A refused
// handshake returns the HTTP response (with its body) and the error.
func dialSocket(t *testing.T, addr, path string, header http.Header) (*socket, *http.Response, error) {
	t.Helper()
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
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, 15*time.Second)
	defer dcancel()
	ws, resp, err := websocket.Dial(dctx, "ws://"+addr+path, &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   header,
		Subprotocols: []string{"acp"},
	})
	if err != nil {
		cancel()
		tr.CloseIdleConnections()
		return nil, resp, err
	}
	mu.Lock()
	defer mu.Unlock()
	if tcp == nil {
		ws.CloseNow()
		cancel()
		t.Fatal("the WebSocket does not run on a *net.TCPConn")
	}
	ws.SetReadLimit(64 << 20)
	s := &socket{ws: ws, tcp: tcp, resp: resp, ctx: ctx, cancel: cancel, in: make(chan rpcMsg, 100000), done: make(chan struct{})}
	go s.read(t)
	t.Cleanup(func() { s.closeWith(websocket.StatusNormalClosure) })
	return s, resp, nil
}

func (s *socket) read(t *testing.T) {
	defer close(s.done)
	defer close(s.in)
	for {
		_, b, err := s.ws.Read(s.ctx)
		if err != nil {
			s.mu.Lock()
			s.readErr = err
			s.mu.Unlock()
			return
		}
		var m rpcMsg
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("the gateway sent invalid JSON: %v: %.300s", err, b)
			continue
		}
		m.Raw = b
		select {
		case s.in <- m:
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *socket) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readErr
}

func (s *socket) closeWith(code websocket.StatusCode) {
	_ = s.ws.Close(code, "")
	s.cancel()
	<-s.done
}

// reset drops the TCP connection with an RST and no close frame, as a
// network loss does.
func (s *socket) reset(t *testing.T) {
	t.Helper()
	if err := s.tcp.SetLinger(0); err != nil {
		t.Fatalf("SetLinger(0): %v", err)
	}
	if err := s.tcp.Close(); err != nil {
		t.Fatalf("close the TCP connection: %v", err)
	}
	s.cancel()
	<-s.done
	s.ws.CloseNow()
}

// affinity returns the value of the affinity cookie a response sets ("" if
// none).
func affinity(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			return c.Value
		}
	}
	return ""
}

// acpClient is one ACP connection through the balancer, across its
// sockets. It counts the messages it received (all but _acpgate/resumed)
// and keeps the frames it sent, to resume exactly. Only the test's
// goroutine may use it.
type acpClient struct {
	t      *testing.T
	c      *cluster
	name   string // X-Scale-Client: names it in the balancer's log
	cookie string // the affinity cookie: the replica it is bound to
	s      *socket
	connID string
	token  string // the resume token
	got    int
	frames []string
	nextID int
}

// connect opens a fresh connection through the balancer, with the given
// affinity cookie ("" = none, as a new client). The balancer must set the
// affinity cookie of the replica it chose when the client had none.
func (c *cluster) connect(t *testing.T, name, cookie string) *acpClient {
	t.Helper()
	h := c.header(cookie)
	h.Set("X-Scale-Client", name)
	s, resp, err := dialSocket(t, c.lb.addr, "/acp", h)
	if err != nil {
		t.Fatalf("%s: dial through the balancer: %v (%s)", name, err, respText(resp))
	}
	cl := &acpClient{t: t, c: c, name: name, cookie: cookie, s: s, connID: resp.Header.Get("Acp-Connection-Id")}
	if cl.connID == "" {
		t.Fatalf("%s: the 101 has no Acp-Connection-Id", name)
	}
	if set := affinity(resp); set != "" {
		cl.cookie = set
	} else if cookie == "" {
		t.Fatalf("%s: the balancer's 101 to a client without a cookie sets no %s cookie (Set-Cookie: %q)", name, cookieName, resp.Header.Values("Set-Cookie"))
	}
	if cl.cookie != "a" && cl.cookie != "b" {
		t.Fatalf("%s: affinity cookie %q names no replica", name, cl.cookie)
	}
	return cl
}

func (cl *acpClient) sendRaw(s string) {
	cl.t.Helper()
	cl.frames = append(cl.frames, s)
	if err := cl.s.ws.Write(cl.s.ctx, websocket.MessageText, []byte(s)); err != nil {
		cl.t.Fatalf("%s: write: %v", cl.name, err)
	}
}

func (cl *acpClient) request(method string, params any) int {
	cl.t.Helper()
	cl.nextID++
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": cl.nextID, "method": method, "params": params})
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.sendRaw(string(b))
	return cl.nextID
}

// next returns the next message and counts it.
func (cl *acpClient) next(what string, timeout time.Duration) rpcMsg {
	cl.t.Helper()
	select {
	case m, ok := <-cl.s.in:
		if !ok {
			cl.t.Fatalf("%s: %s: the socket ended: %v (after %d messages)", cl.name, what, cl.s.err(), cl.got)
		}
		if m.Method == "_acpgate/resumed" {
			cl.t.Fatalf("%s: %s: _acpgate/resumed in the middle of the stream: %s", cl.name, what, m.Raw)
		}
		cl.got++
		return m
	case <-time.After(timeout):
		cl.t.Fatalf("%s: %s: nothing within %s", cl.name, what, timeout)
	}
	return rpcMsg{}
}

// await reads until the answer to id, passing everything else to other
// (nil: only session/update may come).
func (cl *acpClient) await(what string, id int, timeout time.Duration, other func(rpcMsg)) rpcMsg {
	cl.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			cl.t.Fatalf("%s: %s: no answer within %s", cl.name, what, timeout)
		}
		m := cl.next(what, left)
		if m.isResponseTo(id) {
			return m
		}
		if other != nil {
			other(m)
		} else if m.Method != "session/update" {
			cl.t.Fatalf("%s: %s: unexpected message: %.500s", cl.name, what, m.Raw)
		}
	}
}

func (cl *acpClient) initialize() {
	cl.t.Helper()
	m := cl.await("initialize", cl.request("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{},
		"clientInfo":         map[string]string{"name": "scale-" + cl.name, "version": "0"},
	}), 30*time.Second, nil)
	var res struct {
		Meta struct {
			Acpgate struct {
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Meta.Acpgate.ResumeToken == "" {
		cl.t.Fatalf("%s: initialize: %s (want a result with _meta.acpgate.resumeToken)", cl.name, m.Raw)
	}
	cl.token = res.Meta.Acpgate.ResumeToken
}

func (cl *acpClient) newSession() string {
	cl.t.Helper()
	m := cl.await("session/new", cl.request("session/new", map[string]any{"cwd": cl.c.root, "mcpServers": []any{}}), 30*time.Second, nil)
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.SessionID == "" {
		cl.t.Fatalf("%s: session/new: %s", cl.name, m.Raw)
	}
	return res.SessionID
}

// turn runs a prompt to its end and checks the demo agent's echo.
func (cl *acpClient) turn(sid, text string, timeout time.Duration) {
	cl.t.Helper()
	tally := &turnTally{t: cl.t, sid: sid}
	m := cl.await("session/prompt "+text, cl.request("session/prompt", textPrompt(sid, text)), timeout, tally.add)
	tally.check(m, "You said: "+text)
}

// closeClean ends the connection with 1000.
func (cl *acpClient) closeClean() { cl.s.closeWith(websocket.StatusNormalClosure) }

// resume opens a new socket for the connection through the balancer with
// the client's affinity cookie, having received n messages. It checks the
// 101 and _acpgate/resumed, re-sends the frames the gateway lacks and
// returns the 101 and the gateway's count of the client's messages.
func (cl *acpClient) resume(n int) (*http.Response, int) {
	cl.t.Helper()
	h := cl.c.header(cl.cookie)
	h.Set("X-Scale-Client", cl.name+"-resume")
	s, resp, err := dialSocket(cl.t, cl.c.lb.addr, resumePath(cl.token, n), h)
	if err != nil {
		cl.t.Fatalf("%s: resume with received=%d: refused: %v (%s)", cl.name, n, err, respText(resp))
	}
	if id := resp.Header.Get("Acp-Connection-Id"); id != cl.connID {
		cl.t.Fatalf("%s: the resumed socket's Acp-Connection-Id is %q, the connection's %q", cl.name, id, cl.connID)
	}
	cl.s = s
	var first rpcMsg
	select {
	case m, ok := <-s.in:
		if !ok {
			cl.t.Fatalf("%s: the resumed socket ended before _acpgate/resumed: %v", cl.name, s.err())
		}
		first = m
	case <-time.After(10 * time.Second):
		cl.t.Fatalf("%s: no _acpgate/resumed within 10 s", cl.name)
	}
	var p struct {
		Received *int `json:"received"`
	}
	if first.Method != "_acpgate/resumed" || len(first.ID) != 0 || json.Unmarshal(first.Params, &p) != nil || p.Received == nil ||
		*p.Received < 0 || *p.Received > len(cl.frames) {
		cl.t.Fatalf("%s: the resumed socket's first message is %.300s; want _acpgate/resumed with the gateway's count (<= %d)", cl.name, first.Raw, len(cl.frames))
	}
	for _, f := range cl.frames[*p.Received:] {
		if err := s.ws.Write(s.ctx, websocket.MessageText, []byte(f)); err != nil {
			cl.t.Fatalf("%s: re-send: %v", cl.name, err)
		}
	}
	return resp, *p.Received
}

func resumePath(token string, received int) string {
	return "/acp?resume=" + url.QueryEscape(token) + "&received=" + strconv.Itoa(received)
}

func respText(resp *http.Response) string {
	if resp == nil {
		return "no HTTP response"
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("HTTP %d %s", resp.StatusCode, b)
}

func textPrompt(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": text}}}
}

// update is the part of a session/update the test looks at.
type update struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		Kind    string `json:"sessionUpdate"`
		Content struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"update"`
}

func parseUpdate(t *testing.T, m rpcMsg) update {
	t.Helper()
	var u update
	if m.Method != "session/update" || json.Unmarshal(m.Params, &u) != nil {
		t.Fatalf("want a session/update: %.500s", m.Raw)
	}
	return u
}

// turnTally collects one session's streamed reply and the
// session_info_update that ends a demo agent turn.
type turnTally struct {
	t      *testing.T
	sid    string
	text   strings.Builder
	chunks int
	infos  int
}

func (tt *turnTally) add(m rpcMsg) {
	tt.t.Helper()
	u := parseUpdate(tt.t, m)
	if u.SessionID != tt.sid {
		tt.t.Fatalf("an update for another session: %.500s", m.Raw)
	}
	switch u.Update.Kind {
	case "agent_message_chunk":
		tt.text.WriteString(u.Update.Content.Text)
		tt.chunks++
	case "session_info_update":
		tt.infos++
	}
}

// check asserts the turn ended with end_turn, one session_info_update and
// exactly the text want.
func (tt *turnTally) check(resp rpcMsg, want string) {
	tt.t.Helper()
	var r struct {
		StopReason string `json:"stopReason"`
	}
	if resp.Error != nil || json.Unmarshal(resp.Result, &r) != nil || r.StopReason != "end_turn" {
		tt.t.Fatalf("the turn's answer is %.300s; want stopReason end_turn", resp.Raw)
	}
	if got := tt.text.String(); got != want {
		tt.t.Fatalf("the turn's text is not the echo: %s", diverge(got, want))
	}
	if tt.infos != 1 {
		tt.t.Fatalf("%d session_info_update messages in the turn, want 1", tt.infos)
	}
}

// diverge describes where got departs from want.
func diverge(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	ctx := func(s string) string { return s[max(0, i-24):min(len(s), i+24)] }
	return fmt.Sprintf("got %d bytes, want %d; they differ at byte %d: got …%q…, want …%q…", len(got), len(want), i, ctx(got), ctx(want))
}

// echoText is a prompt of about n bytes without demo agent keywords: the
// agent echoes it in 8-character chunks, chunkDelay apart.
func echoText(tag string, n int) string {
	var b strings.Builder
	b.WriteString(tag)
	for i := 1; b.Len() < n; i++ {
		fmt.Fprintf(&b, " scale check %04d", i)
	}
	return b.String()
}

// closeStatus is the close code a socket's read ended with (-1: none).
func closeStatus(err error) websocket.StatusCode {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return -1
}
