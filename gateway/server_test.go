package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/demoagent"
	"github.com/acpgate/acpgate/gateway/config"
)

// The test binary doubles as the agent: with ACPGATE_TEST_AGENT=demo in its
// environment it runs the demo agent on stdio, so the gateway is tested
// against real agent subprocesses.
func TestMain(m *testing.M) {
	if os.Getenv("ACPGATE_TEST_AGENT") == "demo" {
		err := demoagent.Run(context.Background(), os.Stdin, os.Stdout, demoagent.Options{
			StateDir: os.Getenv("ACPGATE_TEST_STATE"), ChunkDelay: -1,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// --- server ---

// syncBuffer collects the gateway's log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

type testServer struct {
	t      *testing.T
	s      *Server
	addr   string
	logs   *syncBuffer
	http   *http.Client
	served chan error
	// wrapListener, if set, wraps the listener serve makes.
	wrapListener func(net.Listener) net.Listener
}

// newTestServer builds a gateway running the demo agent (this test binary)
// with a small pool. It does not serve yet.
func newTestServer(t *testing.T, mutate func(*config.Config)) *testServer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Agent.Env = map[string]string{"ACPGATE_TEST_AGENT": "demo", "ACPGATE_TEST_STATE": t.TempDir()}
	cfg.Agent.StopGrace = config.Duration(2 * time.Second)
	cfg.Agent.InitTimeout = config.Duration(10 * time.Second)
	// One process, kept warm: once it is ready the pool starts no other
	// (see TestShutdownWhileAgentStarting for why that matters).
	cfg.Pool.MinIdle = 1
	cfg.Pool.MaxProcesses = 1
	cfg.Pool.AcquireTimeout = config.Duration(10 * time.Second)
	cfg.WebSocket.WriteTimeout = config.Duration(10 * time.Second)
	// The tests drive the demo agent's _demo/echo, an extension the default
	// policy refuses, at rates above the default per-connection limit.
	cfg.Policy.Extensions.Allow = &[]string{"_demo/*"}
	cfg.Limits.MessagesPerSecond = 0
	if mutate != nil {
		mutate(cfg)
	}
	logs := &syncBuffer{}
	s, err := New(Options{
		Config:    cfg,
		DemoAgent: []string{exe, "-test.run=^$"},
		Version:   "test",
		Logger:    slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	tr := &http.Transport{}
	ts := &testServer{t: t, s: s, logs: logs, http: &http.Client{Transport: tr}}
	t.Cleanup(func() {
		ts.shutdown()
		tr.CloseIdleConnections()
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})
	return ts
}

// serve starts serving on a loopback port.
func (ts *testServer) serve() {
	ts.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	if ts.wrapListener != nil {
		ln = ts.wrapListener(ln)
	}
	ts.served = make(chan error, 1)
	go func() { ts.served <- ts.s.Serve(ln) }()
}

// startServer builds a gateway, serves it and waits until it is ready.
func startServer(t *testing.T, mutate func(*config.Config)) *testServer {
	t.Helper()
	ts := newTestServer(t, mutate)
	ts.serve()
	ts.waitReady()
	return ts
}

// shutdown drains the gateway (again, if the test already did) and checks
// that Serve returned.
func (ts *testServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := ts.s.Shutdown(ctx); err != nil {
		ts.t.Errorf("Shutdown: %v", err)
	}
	if ts.served == nil {
		return
	}
	select {
	case err := <-ts.served:
		if err != nil {
			ts.t.Errorf("Serve: %v", err)
		}
		ts.served = nil
	case <-time.After(5 * time.Second):
		ts.t.Errorf("Serve did not return after Shutdown")
	}
}

func (ts *testServer) get(path string) (int, string) {
	ts.t.Helper()
	return httpGet(ts.t, ts.http, "http://"+ts.addr+path)
}

func httpGet(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func (ts *testServer) waitReady() {
	ts.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := ts.get("/readyz")
		if code == http.StatusOK {
			if body != "ready\n" {
				ts.t.Fatalf("/readyz 200 with body %q", body)
			}
			return
		}
		if code != http.StatusServiceUnavailable {
			ts.t.Fatalf("/readyz: %d %q", code, body)
		}
		if time.Now().After(deadline) {
			ts.t.Fatalf("not ready within 15 s: /readyz %d %q", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wsConns returns the server's open WebSocket connections.
func (ts *testServer) wsConns() []*wsConn {
	links, _ := ts.s.links.linksOf("")
	var out []*wsConn
	for _, l := range links {
		if c, ok := l.t.(*wsConn); ok {
			out = append(out, c)
		}
	}
	return out
}

// sockets is the number of open client connections.
func (s *Server) sockets() int {
	links, _ := s.links.linksOf("")
	return len(links)
}

// --- client ---

type rpcMsg struct {
	Raw    []byte          `json:"-"`
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wsClient is a WebSocket client that reads only when told to, so tests
// control whether it keeps up.
type wsClient struct {
	t      *testing.T
	ws     *websocket.Conn
	resp   *http.Response
	nextID int
}

func (ts *testServer) dial(subprotocols ...string) *wsClient {
	ts.t.Helper()
	return ts.dialWith(ts.http, subprotocols...)
}

func (ts *testServer) dialWith(hc *http.Client, subprotocols ...string) *wsClient {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws://"+ts.addr+"/acp", &websocket.DialOptions{
		HTTPClient:   hc,
		Subprotocols: subprotocols,
	})
	if err != nil {
		ts.t.Fatalf("dial: %v", err)
	}
	ws.SetReadLimit(64 << 20)
	c := &wsClient{t: ts.t, ws: ws, resp: resp}
	ts.t.Cleanup(func() { _ = ws.CloseNow() })
	return c
}

func (c *wsClient) write(ctx context.Context, typ websocket.MessageType, b []byte) {
	c.t.Helper()
	if err := c.ws.Write(ctx, typ, b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *wsClient) request(method string, params any) int {
	c.t.Helper()
	c.nextID++
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method, "params": params})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.write(ctx, websocket.MessageText, b)
	return c.nextID
}

// read returns the next message.
func (c *wsClient) read(ctx context.Context) (rpcMsg, error) {
	typ, b, err := c.ws.Read(ctx)
	if err != nil {
		return rpcMsg{}, err
	}
	if typ != websocket.MessageText {
		c.t.Errorf("the gateway sent a %v message", typ)
	}
	var m rpcMsg
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Errorf("the gateway sent invalid JSON %q: %v", b, err)
	}
	m.Raw = b
	return m, nil
}

// await reads until the response with the given raw id, skipping
// session/update notifications.
func (c *wsClient) await(id string, timeout time.Duration) rpcMsg {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		m, err := c.read(ctx)
		if err != nil {
			c.t.Fatalf("waiting for the response to %s: %v", id, err)
		}
		if m.Method == "" && string(m.ID) == id {
			return m
		}
		if m.Method != "session/update" {
			c.t.Fatalf("unexpected message while waiting for %s: %s", id, m.Raw)
		}
	}
}

func (c *wsClient) call(method string, params any) rpcMsg {
	c.t.Helper()
	return c.await(fmt.Sprint(c.request(method, params)), 15*time.Second)
}

func (c *wsClient) mustCall(method string, params any) json.RawMessage {
	c.t.Helper()
	m := c.call(method, params)
	if m.Error != nil {
		c.t.Fatalf("%s: error %d %s", method, m.Error.Code, m.Error.Message)
	}
	return m.Result
}

func (c *wsClient) initialize() {
	c.t.Helper()
	res := c.mustCall("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": true, "writeTextFile": true}},
		"clientInfo":         map[string]string{"name": "gateway-test", "version": "0"},
	})
	var r struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.ProtocolVersion != 1 {
		c.t.Fatalf("initialize result %s", res)
	}
}

func (c *wsClient) newSession() string {
	c.t.Helper()
	res := c.mustCall("session/new", map[string]any{"cwd": c.t.TempDir(), "mcpServers": []any{}})
	var r struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.SessionID == "" {
		c.t.Fatalf("session/new result %s", res)
	}
	return r.SessionID
}

// prompt runs a prompt turn and returns the streamed text.
func (c *wsClient) prompt(sid, text string) string {
	c.t.Helper()
	id := c.request("session/prompt", map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": text}}})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var b strings.Builder
	for {
		m, err := c.read(ctx)
		if err != nil {
			c.t.Fatalf("prompt: %v", err)
		}
		if m.Method == "session/update" {
			var u struct {
				Update struct {
					Kind    string `json:"sessionUpdate"`
					Content struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"update"`
			}
			_ = json.Unmarshal(m.Params, &u)
			if u.Update.Kind == "agent_message_chunk" {
				b.WriteString(u.Update.Content.Text)
			}
			continue
		}
		if m.Method == "" && string(m.ID) == fmt.Sprint(id) {
			if m.Error != nil {
				c.t.Fatalf("prompt: error %d %s", m.Error.Code, m.Error.Message)
			}
			return b.String()
		}
		c.t.Fatalf("unexpected message during a prompt: %s", m.Raw)
	}
}

// --- tests ---

func TestHealthAndReadiness(t *testing.T) {
	ts := newTestServer(t, nil)
	// Before Serve the gateway is alive but not ready.
	rec := httptest.NewRecorder()
	ts.s.http.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != "starting\n" {
		t.Errorf("/readyz before Serve: %d %q", rec.Code, rec.Body.String())
	}
	ts.serve()
	if code, body := ts.get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	ts.waitReady() // polls /readyz until 200 "ready"
	if !ts.s.Relay().Pool().Ready() {
		t.Error("/readyz said ready but the pool is not")
	}
	if code, body := ts.get("/"); code != http.StatusOK || !strings.Contains(body, "<title>acpgate</title>") {
		t.Errorf("/ does not serve the web client: %d %.200q", code, body)
	}
	if code, _ := ts.get("/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d", code)
	}

	// A second server on the same handler outlives Shutdown's listener, so
	// the probes can be seen while draining.
	probe := httptest.NewServer(ts.s.http.Handler)
	defer probe.Close()
	ts.shutdown()
	code, body := httpGet(t, ts.http, probe.URL+"/readyz")
	if code != http.StatusServiceUnavailable || body != "draining\n" {
		t.Errorf("/readyz while draining: %d %q", code, body)
	}
	if code, _ := httpGet(t, ts.http, probe.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while draining: %d", code)
	}
}

func TestHandshake(t *testing.T) {
	ts := startServer(t, nil)

	c := ts.dial("acp")
	if c.resp.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("status %d, want 101", c.resp.StatusCode)
	}
	id1 := c.resp.Header.Get(ConnectionIDHeader)
	if len(id1) < 16 {
		t.Errorf("101 response lacks a usable %s: %q", ConnectionIDHeader, id1)
	}
	if got := c.ws.Subprotocol(); got != "acp" {
		t.Errorf("subprotocol %q, want acp", got)
	}
	if got := c.resp.Header.Get("Sec-WebSocket-Protocol"); got != "acp" {
		t.Errorf("Sec-WebSocket-Protocol %q, want acp", got)
	}
	c.initialize()

	// acp is selected among others.
	c2 := ts.dial("x-other", "acp")
	if got := c2.ws.Subprotocol(); got != "acp" {
		t.Errorf("offering x-other and acp: subprotocol %q, want acp", got)
	}
	if id2 := c2.resp.Header.Get(ConnectionIDHeader); id2 == "" || id2 == id1 {
		t.Errorf("second connection's id %q (first %q): want a fresh one", id2, id1)
	}

	// A client that offers no subprotocol (or none the gateway knows) is
	// accepted too, and gets none.
	for _, offer := range [][]string{nil, {"x-other"}} {
		c3 := ts.dial(offer...)
		if got := c3.ws.Subprotocol(); got != "" {
			t.Errorf("offering %q: subprotocol %q, want none", offer, got)
		}
		if _, ok := c3.resp.Header["Sec-Websocket-Protocol"]; ok {
			t.Errorf("offering %q: the 101 has Sec-WebSocket-Protocol %q", offer, c3.resp.Header.Get("Sec-WebSocket-Protocol"))
		}
		if c3.resp.Header.Get(ConnectionIDHeader) == "" {
			t.Errorf("offering %q: no %s", offer, ConnectionIDHeader)
		}
		c3.initialize()
		sid := c3.newSession()
		if got, want := c3.prompt(sid, "hello there"), "You said: hello there"; got != want {
			t.Errorf("offering %q: prompt streamed %q, want %q", offer, got, want)
		}
	}

	// /acp is a WebSocket endpoint only.
	if code, _ := ts.get("/acp"); code < 400 || code >= 500 {
		t.Errorf("plain GET /acp: %d, want a 4xx", code)
	}
}

// Binary frames are taken as UTF-8 text, and a frame may hold several
// newline-delimited messages, as clients that pipe an ndjson stream onto
// the socket send them (marimo's use-acp); invalid UTF-8 is still refused.
func TestBinaryAndNewlineDelimitedFrames(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.dial("acp")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	// initialize as use-acp sends it: a binary frame, the JSON and a newline.
	c.write(ctx, websocket.MessageBinary, []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`+"\n"))
	m, err := c.read(ctx)
	if err != nil || m.Error != nil || string(m.ID) != "1" {
		t.Fatalf("initialize in a binary frame: %v %s", err, m.Raw)
	}
	// Two requests in one frame get two answers, each its own text frame.
	c.write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`+"\n"+
		`{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`+"\n"))
	ids := map[string]bool{}
	for len(ids) < 2 {
		m, err := c.read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.ID) > 0 {
			if m.Error != nil {
				t.Fatalf("session/new from a two-message frame: %s", m.Raw)
			}
			ids[string(m.ID)] = true
		}
	}
	// Invalid UTF-8 in a binary frame: a parse error, and the connection lives on.
	c.write(ctx, websocket.MessageBinary, []byte{0xff, 0x00, 0x01})
	if m, err := c.read(ctx); err != nil || m.Error == nil || m.Error.Code != -32700 {
		t.Fatalf("invalid UTF-8 in a binary frame: %v %s", err, m.Raw)
	}
	sid := c.newSession()
	if got, want := c.prompt(sid, "still here?"), "You said: still here?"; got != want {
		t.Fatalf("prompt after the frames streamed %q, want %q", got, want)
	}
}

// A message over limits.max_message_bytes closes the connection with 1009.
func TestMessageTooBig(t *testing.T) {
	ts := startServer(t, func(c *config.Config) {
		c.Limits.MaxMessageBytes = 4096
		c.Limits.SendQueueBytes = 1 << 20
	})
	c := ts.dial("acp")
	c.initialize()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Just under the limit passes.
	under := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":"u","method":"_demo/echo","params":{"pad":"%s"}}`, strings.Repeat("y", 3900))
	if len(under) > 4096 {
		t.Fatalf("test message is %d bytes", len(under))
	}
	c.write(ctx, websocket.MessageText, under)
	if m := c.await(`"u"`, 10*time.Second); m.Error != nil {
		t.Fatalf("echo under the limit: %s", m.Raw)
	}
	over := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":"o","method":"_demo/echo","params":{"pad":"%s"}}`, strings.Repeat("z", 5000))
	c.write(ctx, websocket.MessageText, over)
	_, err := c.read(ctx)
	if st := websocket.CloseStatus(err); st != websocket.StatusMessageTooBig {
		t.Fatalf("after a message over the limit: %v (status %v), want 1009", err, st)
	}
	// The socket is gone; the connection is kept for a resume (the
	// client did not close it).
	waitFor(t, 5*time.Second, "the socket is gone", func() bool { return ts.s.sockets() == 0 })
	if n := ts.s.Relay().Conns(); n != 1 {
		t.Fatalf("%d connections kept, want the detached one", n)
	}
	waitFor(t, 5*time.Second, "its close logged", func() bool {
		return strings.Contains(ts.logs.String(), "close_code=1009")
	})
}

func TestShutdownClosesWebSocketsGoingAway(t *testing.T) {
	ts := startServer(t, nil)
	probe := httptest.NewServer(ts.s.http.Handler)
	defer probe.Close()

	var clients []*wsClient
	for range 2 {
		c := ts.dial("acp")
		c.initialize()
		clients = append(clients, c)
	}
	sid := clients[0].newSession()
	if got := clients[0].prompt(sid, "hi"); got != "You said: hi" {
		t.Fatalf("prompt streamed %q", got)
	}
	// Each client reads until its connection ends.
	ends := make(chan error, len(clients))
	for _, c := range clients {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			for {
				if _, _, err := c.ws.Read(ctx); err != nil {
					ends <- err
					return
				}
			}
		}()
	}
	waitFor(t, 5*time.Second, "both connections registered", func() bool { return ts.s.Relay().Conns() == 2 })

	start := time.Now()
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		shut <- ts.s.Shutdown(ctx)
	}()

	// While draining (and after), the gateway is not ready and refuses new
	// WebSockets with 503.
	waitFor(t, 5*time.Second, "/readyz says draining", func() bool {
		code, body := httpGet(t, ts.http, probe.URL+"/readyz")
		return code == http.StatusServiceUnavailable && body == "draining\n"
	})
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	ws, resp, err := websocket.Dial(dctx, strings.Replace(probe.URL, "http", "ws", 1)+"/acp", &websocket.DialOptions{
		HTTPClient: ts.http, Subprotocols: []string{"acp"},
	})
	dcancel()
	if err == nil {
		_ = ws.CloseNow()
		t.Error("a WebSocket was accepted while draining")
	} else if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("WebSocket dial while draining: %v (response %v), want 503", err, resp)
	}
	if code, body := httpGet(t, ts.http, probe.URL+"/acp"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /acp while draining: %d %q, want 503", code, body)
	}

	for range clients {
		select {
		case err := <-ends:
			if st := websocket.CloseStatus(err); st != websocket.StatusGoingAway {
				t.Errorf("a client's connection ended with %v (status %v), want 1001", err, st)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a client was not closed within 10 s of Shutdown")
		}
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown did not return within 15 s")
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("Shutdown took %s", d)
	}
	if n := ts.s.Relay().Conns(); n != 0 {
		t.Errorf("%d relay connections after Shutdown", n)
	}
	if n := len(ts.wsConns()); n != 0 {
		t.Errorf("%d WebSocket connections after Shutdown", n)
	}
	if ts.s.Relay().Pool().Ready() {
		t.Error("the pool is ready after Shutdown")
	}
	// The listener is closed.
	if conn, err := net.DialTimeout("tcp", ts.addr, time.Second); err == nil {
		conn.Close()
		t.Error("the gateway still accepts TCP connections after Shutdown")
	}
}

// smallBufferListener gives each accepted connection a small kernel send
// buffer, so that a client that stops reading blocks the gateway's writer
// after a few messages rather than after megabytes.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(32 << 10)
	}
	return c, err
}

// slowWS dials an initialized WebSocket client with small kernel buffers
// (its queue fills soon once it stops reading) and returns it with the
// server's side of it, the only WebSocket connection.
func (ts *testServer) slowWS(t *testing.T) (*wsClient, *wsConn) {
	t.Helper()
	slow := ts.dialWith(smallBufferClient(t), "acp")
	slow.initialize()
	conns := ts.wsConns()
	if len(conns) != 1 {
		t.Fatalf("%d WebSocket connections, want 1", len(conns))
	}
	return slow, conns[0]
}

// smallBufferClient is an HTTP client whose connections have a small kernel
// receive buffer.
func smallBufferClient(t *testing.T) *http.Client {
	d := &net.Dialer{}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(32 << 10)
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// goroutines returns the stacks of every goroutine (for failure reports).
func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// slowClientServer serves with a send queue of 8 messages and small
// socket buffers, so that a client that stops reading is soon too slow.
func slowClientServer(t *testing.T) *testServer {
	t.Helper()
	ts := newTestServer(t, func(c *config.Config) {
		c.Limits.MaxMessageBytes = 1 << 20
		c.Limits.SendQueueMessages = 8
		c.Limits.SendQueueBytes = 2 << 20
		c.WebSocket.PingInterval = 0
		c.WebSocket.WriteTimeout = config.Duration(20 * time.Second)
	})
	ts.wrapListener = func(l net.Listener) net.Listener { return smallBufferListener{l} }
	ts.serve()
	ts.waitReady()
	return ts
}

// A client that stops reading while its agent keeps writing is closed with
// 1008 once its send queue is full; other clients are not held up.
func TestSlowConsumerClosedWithPolicyViolation(t *testing.T) {
	ts := slowClientServer(t)

	slow := ts.dialWith(smallBufferClient(t), "acp")
	slow.initialize()
	slow.newSession()
	slowSide := ts.wsConns()
	if len(slowSide) != 1 {
		t.Fatalf("%d server connections, want 1", len(slowSide))
	}
	sc := slowSide[0]
	gaveUp := func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return sc.closing && sc.closeCode == websocket.StatusPolicyViolation
	}

	// Echo requests of ~60 KB each, and no reading, until the gateway gives
	// up on the client (at most 400, ~24 MB). The writes are paced so that
	// the agent, which answers each one, is never more than a few dozen
	// behind: the gateway, not the agent, is under test.
	pad := strings.Repeat("x", 60<<10)
	const n = 400
	base := int(sc.msgsOut.Load())
	sent := 0
	behind := func() int {
		sc.mu.Lock()
		q := len(sc.q)
		sc.mu.Unlock()
		return sent - (int(sc.msgsOut.Load()) - base) - q
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	for sent < n && !gaveUp() {
		if behind() > 24 {
			if wctx.Err() != nil {
				t.Fatalf("the agent stopped answering after %d of %d echoes (%d behind); goroutines:\n%s", sent, n, behind(), goroutines())
			}
			time.Sleep(2 * time.Millisecond)
			continue
		}
		b := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{"n":%d,"pad":%q}}`, 1000+sent, sent, pad)
		if err := slow.ws.Write(wctx, websocket.MessageText, b); err != nil {
			t.Fatalf("write echo %d: %v; goroutines:\n%s", sent, err, goroutines())
		}
		sent++
	}
	if !gaveUp() {
		waitFor(t, 15*time.Second, "the gateway gives up on the slow client", gaveUp)
	}
	t.Logf("the gateway gave up on the slow client after %d echoes (%d written to it)", sent, int(sc.msgsOut.Load())-base)

	// The slow client is stuck; another client on the same gateway (and
	// the same agent process) works.
	fast := ts.dial("acp")
	fast.initialize()
	res := fast.mustCall("_demo/echo", map[string]any{"ping": "pong"})
	if !bytes.Contains(res, []byte(`"ping":"pong"`)) {
		t.Fatalf("echo for the other client: %s", res)
	}
	sid := fast.newSession()
	if got, want := fast.prompt(sid, "while the other is stuck"), "You said: while the other is stuck"; got != want {
		t.Fatalf("prompt streamed %q, want %q", got, want)
	}
	if !gaveUp() || ts.s.Relay().Conns() != 2 {
		t.Fatalf("the slow client is no longer stuck (%d connections)", ts.s.Relay().Conns())
	}

	// The slow client reads again: what was already on its way, then 1008.
	rctx, rcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer rcancel()
	got := 0
	var err error
	for {
		var m rpcMsg
		if m, err = slow.read(rctx); err != nil {
			break
		}
		if m.Error != nil {
			t.Fatalf("the slow client got an error: %s", m.Raw)
		}
		got++
	}
	if st := websocket.CloseStatus(err); st != websocket.StatusPolicyViolation {
		t.Fatalf("the slow client's connection ended with %v (status %v) after %d messages, want 1008", err, st, got)
	}
	if got >= sent {
		t.Errorf("the slow client got all %d answers; the queue was never full", got)
	}
	t.Logf("the slow client got %d of %d answers before 1008", got, sent)
	waitFor(t, 10*time.Second, "the slow client's socket is gone", func() bool { return ts.s.sockets() == 1 })

	// The other client is still connected and working.
	if got, want := fast.prompt(sid, "after"), "You said: after"; got != want {
		t.Fatalf("prompt after the slow client was closed streamed %q, want %q", got, want)
	}
	if !strings.Contains(ts.logs.String(), "closing slow client") {
		t.Error("no \"closing slow client\" in the log")
	}
}

// What a writer is writing to a client that stopped reading counts against
// send_queue_bytes until it is written: the queue does not fill again
// behind it (a connection once held the bound twice over, a stuck batch and
// a full queue).
func TestSendQueueCountsWhatIsBeingWritten(t *testing.T) {
	ts := slowClientServer(t) // send_queue_bytes 2 MiB, 32 KiB socket buffers
	_, sc := ts.slowWS(t)
	pad := strings.Repeat("x", 600<<10) // more than the sockets' buffers take
	accepted := 0
	for i := range 64 {
		msg := fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"_test/big","params":{"n":%d,"pad":%q}}`, i, pad)
		if !sc.Send(msg, false) {
			break
		}
		accepted += len(msg)
	}
	if _, label, closing := sc.closeState(); !closing || label != "slow_client" {
		t.Fatalf("the client that does not read was not cut off (closing %v, %q)", closing, label)
	}
	if limit := ts.s.config().Limits.SendQueueBytes; accepted > limit {
		t.Fatalf("the connection took %d bytes for a client that does not read; send_queue_bytes is %d", accepted, limit)
	}
}

// Shutdown while the pool is still starting an agent process. Under -race
// this catches unsynchronised access to the process's state: the pool's
// Close reads what the starting goroutine writes.
func TestShutdownWhileAgentStarting(t *testing.T) {
	for i := range 30 {
		t.Run(fmt.Sprint("round", i), func(t *testing.T) {
			ts := newTestServer(t, nil)
			pool := ts.s.Relay().Pool()
			waitFor(t, 5*time.Second, "an agent process starting", func() bool { return pool.Stats().Processes > 0 })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ts.s.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if st := pool.Stats(); st.Processes != 0 {
				t.Fatalf("%d agent processes after Shutdown", st.Processes)
			}
			if pool.Ready() {
				t.Fatal("the pool is ready after Shutdown")
			}
		})
	}
}

// A client that never reads never answers pings: it is disconnected.
// A client that reads stays.
func TestPingTimeout(t *testing.T) {
	ts := startServer(t, func(c *config.Config) {
		c.WebSocket.PingInterval = config.Duration(100 * time.Millisecond)
		c.WebSocket.PingTimeout = config.Duration(100 * time.Millisecond)
	})
	alive := ts.dial("acp")
	aliveCtx := alive.ws.CloseRead(context.Background()) // reads (and answers pings) until the connection ends
	waitFor(t, 5*time.Second, "the live client registered", func() bool { return ts.s.Relay().Conns() == 1 })

	ts.dial("acp") // never reads
	waitFor(t, 5*time.Second, "the mute client registered", func() bool {
		return strings.Count(ts.logs.String(), `msg="connection opened"`) == 2
	})
	start := time.Now()
	waitFor(t, 3*time.Second, "the mute client disconnected", func() bool { return ts.s.Relay().Conns() == 1 })
	t.Logf("the mute client was disconnected after %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, 3*time.Second, "its close logged", func() bool {
		return strings.Contains(ts.logs.String(), `close_reason="ping timeout"`)
	})

	// The live client has answered pings all along, and keeps doing so.
	time.Sleep(500 * time.Millisecond)
	if err := aliveCtx.Err(); err != nil {
		t.Fatalf("the client that answers pings was disconnected")
	}
	if n := ts.s.Relay().Conns(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	// Once it leaves too, none is left.
	_ = alive.ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, 3*time.Second, "no connections left", func() bool { return ts.s.Relay().Conns() == 0 })
}

// The mute-client half of TestPingTimeout alone: the count drops to 0.
func TestPingTimeoutAlone(t *testing.T) {
	ts := startServer(t, func(c *config.Config) {
		c.WebSocket.PingInterval = config.Duration(100 * time.Millisecond)
		c.WebSocket.PingTimeout = config.Duration(100 * time.Millisecond)
	})
	mute := ts.dial("acp")
	waitFor(t, 5*time.Second, "the client registered", func() bool {
		return strings.Contains(ts.logs.String(), `msg="connection opened"`)
	})
	waitFor(t, 3*time.Second, "the client disconnected", func() bool { return ts.s.Relay().Conns() == 0 })
	// The client sees the connection gone once it reads.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := mute.ws.Read(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read on the dropped connection: %v", err)
	}
}
