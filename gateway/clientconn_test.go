package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/gateway/config"
)

// TestIdleConnectionIsOneGoroutine: an initialized, idle connection keeps
// only its reader; the writer, the frame handler and the timer's runs end
// when they have nothing to do.
func TestIdleConnectionIsOneGoroutine(t *testing.T) {
	ts := startServer(t, nil)
	const n = 20
	clients := make([]*wsClient, n)
	for i := range clients {
		clients[i] = ts.dial(Subprotocol)
		clients[i].initialize()
	}
	// The clients live in this process too: count the gateway's goroutines
	// by function.
	var perConn int
	waitFor(t, 5*time.Second, "idle connections to settle at one gateway goroutine each", func() bool {
		perConn = countGoroutines("gateway.(*wsConn)")
		return perConn == n
	})
	if perConn != n {
		t.Fatalf("%d gateway goroutines for %d idle connections", perConn, n)
	}
	// Work still gets done: a call starts the writer and the handler again.
	for _, c := range clients[:3] {
		if sid := c.newSession(); sid == "" {
			t.Fatal("no session")
		}
	}
}

// countGoroutines counts the goroutines with a frame containing fn.
func countGoroutines(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte(fn)) {
			n++
		}
	}
	return n
}

// TestFrameWithUpgradeRequest: a client may send its first frame in the
// same segment as the upgrade request; net/http has then read it already,
// and the gateway must still see it.
func TestFrameWithUpgradeRequest(t *testing.T) {
	ts := startServer(t, nil)
	nc, err := net.DialTimeout("tcp", ts.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	req := "GET /acp HTTP/1.1\r\nHost: " + ts.addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: acp\r\n\r\n"
	msg := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`
	if _, err := nc.Write(append([]byte(req), maskedText(msg)...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", resp.StatusCode)
	}
	hdr := make([]byte, 2)
	if _, err := ioReadFull(br, hdr); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	n := int(hdr[1] & 0x7f)
	if n == 126 {
		ext := make([]byte, 2)
		if _, err := ioReadFull(br, ext); err != nil {
			t.Fatal(err)
		}
		n = int(binary.BigEndian.Uint16(ext))
	}
	body := make([]byte, n)
	if _, err := ioReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	if hdr[0] != 0x81 || !strings.Contains(string(body), `"protocolVersion":1`) || !strings.Contains(string(body), `"id":1`) {
		t.Fatalf("frame %x: %s", hdr, body)
	}
}

func ioReadFull(br *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := br.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// maskedText is one client text frame (clients must mask).
func maskedText(s string) []byte {
	mask := [4]byte{1, 2, 3, 4}
	var out []byte
	out = append(out, 0x81)
	switch {
	case len(s) < 126:
		out = append(out, 0x80|byte(len(s)))
	default:
		out = append(out, 0x80|126, byte(len(s)>>8), byte(len(s)))
	}
	out = append(out, mask[:]...)
	for i := 0; i < len(s); i++ {
		out = append(out, s[i]^mask[i%4])
	}
	return out
}

// countingListener counts the write calls on accepted connections.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, writes: l.writes}, nil
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestBurstIsCorked: a burst of small messages leaves in far fewer writes
// than messages, and every message arrives whole and in order.
func TestBurstIsCorked(t *testing.T) {
	var writes atomic.Int64
	ts := newTestServer(t, nil)
	ts.wrapListener = func(ln net.Listener) net.Listener { return countingListener{Listener: ln, writes: &writes} }
	ts.serve()
	ts.waitReady()
	c := ts.dial(Subprotocol)
	c.initialize()
	conns := ts.wsConns()
	if len(conns) != 1 {
		t.Fatalf("%d connections", len(conns))
	}
	wc := conns[0]
	const n = 2000
	start := writes.Load()
	// Queue the burst in one go, as an agent streaming faster than the
	// socket drains would.
	wc.mu.Lock()
	hold := wc.writing
	wc.writing = true // keep the writer from starting until all are queued
	wc.mu.Unlock()
	for i := range n {
		if !wc.Send(fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"_x/n","params":{"i":%d,"pad":"%s"}}`, i, strings.Repeat("x", 200)), true) {
			t.Fatal("Send refused")
		}
	}
	wc.mu.Lock()
	wc.writing = hold
	wc.startWriterLocked()
	wc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		m, err := c.read(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if want := fmt.Sprintf(`"i":%d,`, i); !strings.Contains(string(m.Raw), want) {
			t.Fatalf("message %d: %s", i, m.Raw)
		}
	}
	got := writes.Load() - start
	t.Logf("%d messages of about 260 B in %d write calls", n, got)
	if got > n/10 {
		t.Fatalf("%d write calls for %d messages: not corked", got, n)
	}
}

// streamTo sends 260 B notifications to wc until stop is closed or Send
// refuses; the returned function stops it and waits.
func streamTo(wc *wsConn) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if !wc.Send(fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"_x/n","params":{"i":%d,"pad":"%s"}}`, i, strings.Repeat("x", 200)), true) {
				return
			}
		}
	}()
	return func() { close(done); <-ended }
}

// TestCloseWhileStreaming: the close frames coder/websocket writes by itself
// (the answer to a client's close, 1009 for a message over the limit) can be
// written while the writer is corked; they must still reach the client
// before the connection is closed.
func TestCloseWhileStreaming(t *testing.T) {
	ts := startServer(t, func(cfg *config.Config) { cfg.Limits.MaxMessageBytes = 4096 })
	const rounds = 15
	for r := range rounds {
		for _, tooBig := range []bool{false, true} {
			c := ts.dial(Subprotocol)
			c.initialize()
			var wc *wsConn
			for _, x := range ts.wsConns() {
				if x.id == c.resp.Header.Get(ConnectionIDHeader) {
					wc = x
				}
			}
			if wc == nil {
				t.Fatal("connection not found")
			}
			stop := streamTo(wc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for i := 0; i < 200; i++ {
				if _, err := c.read(ctx); err != nil {
					t.Fatalf("round %d: read: %v", r, err)
				}
			}
			if tooBig {
				c.write(ctx, websocket.MessageText, []byte(`{"pad":"`+strings.Repeat("x", 5000)+`"}`))
				var err error
				for err == nil {
					_, err = c.read(ctx)
				}
				if st := websocket.CloseStatus(err); st != websocket.StatusMessageTooBig {
					t.Fatalf("round %d: a message over the limit while streaming ended with %v, want 1009", r, err)
				}
			} else if err := c.ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
				t.Fatalf("round %d: the client's close while streaming got no answer: %v", r, err)
			}
			cancel()
			stop()
		}
	}
}
