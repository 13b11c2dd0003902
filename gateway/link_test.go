package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// HTTP and WebSocket slow clients are cut and counted the same way: a
// client that stops reading while its agent keeps answering is closed once
// its send queue (limits.send_queue_messages and _bytes) is full and its
// writers have made no progress for stallTimeout, under the same metrics
// (acpgate_slow_client_disconnects_total, and acpgate_connections_total
// with reason slow_client) and the same log line, whichever the transport.
func TestSlowClientsCutTheSameWay(t *testing.T) {
	ts := slowClientServer(t)

	// Streamable HTTP: the client never opens its connection's event
	// stream, where the answers to its echoes go.
	hc := openHTTP(t, ts)
	posted := 0
	waitFor(t, 15*time.Second, "the HTTP connection to be cut", func() bool {
		code, _ := hc.post(nil, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{"n":%d}}`, 100+posted, posted))
		posted++
		return code == http.StatusNotFound
	})
	if posted <= 8 {
		t.Errorf("the HTTP connection was cut after %d echoes; its queue holds 8", posted)
	}
	waitMetrics(t, ts, "the HTTP connection counted",
		`acpgate_connections_total{agent="default",reason="slow_client",tenant="default",transport="http"} 1`,
		"acpgate_slow_client_disconnects_total 1")

	// WebSocket: the client stops reading (small kernel buffers both
	// ways, so that its queue fills soon).
	slow, sc := ts.slowWS(t)
	cut := func() bool {
		_, label, closing := sc.closeState()
		return closing && label == "slow_client"
	}
	pad := strings.Repeat("x", 60<<10)
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	for i := 0; i < 400 && !cut(); i++ {
		b := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{"n":%d,"pad":%q}}`, 1000+i, i, pad)
		if err := slow.ws.Write(wctx, websocket.MessageText, b); err != nil {
			break // the gateway closed it meanwhile
		}
	}
	waitFor(t, 15*time.Second, "the WebSocket connection to be cut", cut)
	// The client reads again: what was on its way, then 1008.
	rctx, rcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer rcancel()
	var err error
	for err == nil {
		_, err = slow.read(rctx)
	}
	if st := websocket.CloseStatus(err); st != websocket.StatusPolicyViolation {
		t.Fatalf("the slow WebSocket ended with %v (status %v), want 1008", err, st)
	}
	waitMetrics(t, ts, "the WebSocket connection counted",
		`acpgate_connections_total{agent="default",reason="slow_client",tenant="default",transport="websocket"} 1`,
		"acpgate_slow_client_disconnects_total 2")
	if n := strings.Count(ts.logs.String(), "closing slow client"); n != 2 {
		t.Errorf(`%d "closing slow client" log lines, want one per transport`, n)
	}
}

// waitMetrics waits until the metrics page has every one of lines.
func waitMetrics(t *testing.T, ts *testServer, what string, lines ...string) {
	t.Helper()
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, body = ts.get("/metrics")
		have := map[string]bool{}
		for _, l := range strings.Split(body, "\n") {
			have[l] = true
		}
		all := true
		for _, l := range lines {
			all = all && have[l]
		}
		if all {
			return
		}
	}
	t.Fatalf("%s: not within 10s; want %q, have:\n%s", what, lines,
		grepLines(body, "acpgate_connections_total")+"\n"+grepLines(body, "acpgate_slow_client"))
}

// SendScanned routes as Send does, without scanning: the relay passes
// what it read of the message.
func TestSendScannedRoutesLikeSend(t *testing.T) {
	ts := startServer(t, nil)
	hc := openHTTP(t, ts)
	h := ts.s.links.httpConn(hc.conn)
	update := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{}}}`
	if !h.Send([]byte(update), false) || !h.SendScanned([]byte(update), nil, "session/update", "s1", false) {
		t.Fatal("refused")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.streams["s1"]
	if st == nil || len(st.queue) != 2 || h.queued != 2 {
		t.Fatalf("stream s1 %+v, %d queued; want both updates on it", st, h.queued)
	}
}

// What routing costs the HTTP sink per message, with its own scan (Send)
// and with the relay's facts (SendScanned):
//
//	go test -run '^$' -bench HTTPSend -benchmem ./gateway/
func BenchmarkHTTPSend(b *testing.B) {
	sid := "ARfwi_FIkelQzhDujkhg-TUXZHvZjIQRwQ5nF80N2bqdStV2pTYgPVDmWnCPDkgiFUk"
	for _, size := range []int{300, 20 << 10} {
		text := strings.Repeat("lorem ipsum ", size/12)
		msg := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + sid +
			`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` + text + `"}}}}`)
		for _, scanned := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dB/scanned=%v", size, scanned), func(b *testing.B) {
				h := &httpConn{history: 1 << 20, streams: map[string]*sseStream{}, gone: map[string]int64{},
					replyTo: map[string]string{}, askedOn: map[string]string{}}
				h.link = link{s: &Server{}, t: h, maxMsgs: 1 << 20, maxBytes: 1 << 30, closeReq: make(chan struct{})}
				h.ctx, h.cancel = context.WithCancel(context.Background())
				defer h.cancel()
				st := h.stream(sid)
				var buf []byte
				b.SetBytes(int64(len(msg)))
				b.ReportAllocs()
				for b.Loop() {
					m := append(jsonrpc.GetBuffer(len(msg)), msg...)
					if scanned {
						h.SendScanned(m, nil, "session/update", sid, false)
					} else {
						h.Send(m, false)
					}
					var n, size int
					buf, n, size = h.takeEvents(st, buf[:0])
					h.mu.Lock()
					h.tookLocked(n, size)
					h.writing--
					h.mu.Unlock()
				}
			})
		}
	}
}

// A client that keeps reading is not cut off when an agent's burst passes
// its queue's message count on a path that cannot wait (wait false: a
// shared process or session); send_queue_bytes still bounds it.
func TestBurstPastMessageCountWhileReading(t *testing.T) {
	ts := slowClientServer(t) // send_queue_messages 8
	c := ts.dial("acp")
	c.initialize()
	conns := ts.wsConns()
	if len(conns) != 1 {
		t.Fatalf("%d WebSocket connections, want 1", len(conns))
	}
	const n = 2000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan int, 1)
	go func() {
		i := 0
		for ; i < n; i++ {
			if _, err := c.read(ctx); err != nil {
				break
			}
		}
		got <- i
	}()
	maxQueued := 0
	for i := range n {
		if !conns[0].Send(fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"_test/burst","params":{"n":%d}}`, i), false) {
			t.Fatalf("message %d refused: the reading client was cut off", i)
		}
		conns[0].mu.Lock()
		maxQueued = max(maxQueued, conns[0].queued)
		conns[0].mu.Unlock()
	}
	if r := <-got; r != n {
		t.Fatalf("the client read %d of %d messages", r, n)
	}
	if _, label, closing := conns[0].closeState(); closing {
		t.Fatalf("the reading client was closed (%s)", label)
	}
	t.Logf("at most %d messages queued (send_queue_messages 8)", maxQueued)
}
