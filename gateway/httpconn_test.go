package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acpgate/acpgate/gateway/config"
)

// httpClient speaks the Streamable-HTTP transport by hand.
type httpClient struct {
	t    *testing.T
	ts   *testServer
	hc   *http.Client
	conn string
}

func (c *httpClient) do(method string, hdr map[string]string, body string) (*http.Response, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+c.ts.addr+"/acp", strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s /acp: %v", method, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func (c *httpClient) post(hdr map[string]string, body string) (int, string) {
	c.t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if c.conn != "" {
		h[ConnectionIDHeader] = c.conn
	}
	for k, v := range hdr {
		h[k] = v
	}
	resp, b := c.do(http.MethodPost, h, body)
	return resp.StatusCode, b
}

// openHTTP opens a Streamable HTTP connection: initialize, which must
// answer 200.
func openHTTP(t *testing.T, ts *testServer) *httpClient {
	t.Helper()
	c := &httpClient{t: t, ts: ts, hc: &http.Client{}}
	resp, body := c.do(http.MethodPost, map[string]string{"Content-Type": "application/json"}, httpInit)
	if c.conn = resp.Header.Get(ConnectionIDHeader); resp.StatusCode != 200 {
		t.Fatalf("initialize: %d %q", resp.StatusCode, body)
	}
	return c
}

// sse opens a stream and returns its events' data, one per receive.
func (c *httpClient) sse(session string, lastID string) (<-chan string, func(), *http.Response) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.ts.addr+"/acp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(ConnectionIDHeader, c.conn)
	if session != "" {
		req.Header.Set(sessionIDHeader, session)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		c.t.Fatalf("GET /acp: %v", err)
	}
	out := make(chan string, 100)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		close(out)
		return out, func() {}, resp
	}
	go func() { // ends when the body ends (cancel or the connection's end)
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		var id string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				out <- id + " " + strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out, func() { cancel(); resp.Body.Close() }, resp
}

func next(t *testing.T, ch <-chan string) (id string, msg map[string]any) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the event stream ended")
		}
		id, data, _ := strings.Cut(ev, " ")
		if err := json.Unmarshal([]byte(data), &msg); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		return id, msg
	case <-time.After(15 * time.Second):
		t.Fatal("no event within 15 s")
	}
	return "", nil
}

const httpInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`

func TestHTTPTransportWire(t *testing.T) {
	ts := startServer(t, nil)
	defer ts.shutdown()
	c := &httpClient{t: t, ts: ts, hc: &http.Client{}}

	// Refusals before a connection exists.
	for _, tc := range []struct {
		name, ct, body string
		hdr            map[string]string
		status         int
		want           string
	}{
		{"wrong content type", "text/plain", httpInit, nil, 415, "Unsupported Media Type"},
		{"not JSON", "application/json", "this is not json", nil, 400, "Invalid JSON"},
		{"a batch", "application/json", "[" + httpInit + "]", nil, 400, `"code":-32600`},
		{"not an object", "application/json", "42", nil, 400, "Invalid JSON-RPC message"},
		{"no connection", "application/json", `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{}}`, nil, 400, "Missing Acp-Connection-Id"},
		{"unknown connection", "application/json", `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{}}`, map[string]string{ConnectionIDHeader: uuid.NewString()}, 404, "Unknown Acp-Connection-Id"},
		{"initialize on a connection", "application/json", httpInit, map[string]string{ConnectionIDHeader: uuid.NewString()}, 400, "Initialize not allowed on existing connection"},
		{"initialize with a null id", "application/json", `{"jsonrpc":"2.0","id":null,"method":"initialize","params":{"protocolVersion":1}}`, nil, 400, "must include an ID"},
	} {
		h := map[string]string{"Content-Type": tc.ct}
		for k, v := range tc.hdr {
			h[k] = v
		}
		resp, body := c.do(http.MethodPost, h, tc.body)
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, resp.StatusCode, body, tc.status, tc.want)
		}
	}
	if resp, body := c.do(http.MethodGet, map[string]string{ConnectionIDHeader: uuid.NewString()}, ""); resp.StatusCode != 406 {
		t.Errorf("GET without Accept: %d %q, want 406", resp.StatusCode, body)
	}
	for _, m := range []string{http.MethodOptions, http.MethodPut, http.MethodPatch, http.MethodHead} {
		if resp, _ := c.do(m, nil, ""); resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, POST, DELETE" {
			t.Errorf("%s /acp: %d (Allow %q), want 405", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}

	// initialize: 200, the answer in the body, a UUID connection id.
	resp, body := c.do(http.MethodPost, map[string]string{"Content-Type": "application/json"}, httpInit)
	c.conn = resp.Header.Get(ConnectionIDHeader)
	if _, err := uuid.Parse(c.conn); resp.StatusCode != 200 || err != nil || !strings.Contains(body, `"protocolVersion":1`) {
		t.Fatalf("initialize: %d %q %q", resp.StatusCode, c.conn, body)
	}
	// session/new before any stream: 202; its answer waits for the GET.
	if st, b := c.post(nil, `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`); st != 202 {
		t.Fatalf("session/new: %d %q", st, b)
	}
	events, stop, _ := c.sse("", "")
	id, m := next(t, events)
	res, _ := m["result"].(map[string]any)
	sid, _ := res["sessionId"].(string)
	if id != "1" || sid == "" || m["id"] != 2.0 {
		t.Fatalf("session/new answer on the connection stream: id %q %v", id, m)
	}
	// A second receiver of the same stream: 409.
	if _, _, r := c.sse("", ""); r.StatusCode != 409 {
		t.Errorf("second receiver: %d, want 409", r.StatusCode)
	}
	// Session header rules.
	prompt := `{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[{"type":"text","text":"hello over http"}]}}`
	if st, b := c.post(nil, prompt); st != 400 || b != "Missing Acp-Session-Id" {
		t.Errorf("prompt without Acp-Session-Id: %d %q", st, b)
	}
	if st, b := c.post(map[string]string{sessionIDHeader: "other"}, prompt); st != 400 || b != "Mismatched Acp-Session-Id" {
		t.Errorf("prompt with another Acp-Session-Id: %d %q", st, b)
	}
	sess, stopSess, _ := c.sse(sid, "")
	if st, b := c.post(map[string]string{sessionIDHeader: sid}, prompt); st != 202 {
		t.Fatalf("prompt: %d %q", st, b)
	}
	var text strings.Builder
	var lastID string
	for {
		id, m := next(t, sess)
		lastID = id
		if m["id"] == 3.0 {
			if r, _ := m["result"].(map[string]any); r["stopReason"] != "end_turn" {
				t.Fatalf("prompt answer %v", m)
			}
			break
		}
		p, _ := m["params"].(map[string]any)
		u, _ := p["update"].(map[string]any)
		if u["sessionUpdate"] == "agent_message_chunk" {
			ct, _ := u["content"].(map[string]any)
			s, _ := ct["text"].(string)
			text.WriteString(s)
		}
	}
	if text.String() != "You said: hello over http" {
		t.Errorf("streamed %q", text.String())
	}
	// A receiver that reconnects with Last-Event-ID gets what came after.
	stopSess()
	time.Sleep(50 * time.Millisecond)
	if st, _ := c.post(map[string]string{sessionIDHeader: sid}, strings.Replace(strings.Replace(prompt, `"id":3`, `"id":4`, 1), "hello over http", "again", 1)); st != 202 {
		t.Fatal("second prompt refused")
	}
	time.Sleep(300 * time.Millisecond)
	sess, stopSess, _ = c.sse(sid, lastID)
	var sawAnswer bool
	for !sawAnswer {
		id, m := next(t, sess)
		if id <= lastID && len(id) <= len(lastID) {
			t.Errorf("event %s replayed after Last-Event-ID %s", id, lastID)
		}
		sawAnswer = m["id"] == 4.0
	}
	stopSess()
	// DELETE ends the connection: the open stream ends, the id is gone.
	resp, _ = c.do(http.MethodDelete, map[string]string{ConnectionIDHeader: c.conn}, "")
	if resp.StatusCode != 202 {
		t.Errorf("DELETE: %d", resp.StatusCode)
	}
	select {
	case _, ok := <-events:
		if ok {
			for range events {
			}
		}
	case <-time.After(5 * time.Second):
		t.Error("the connection stream did not end after DELETE")
	}
	stop()
	if st, b := c.post(nil, `{"jsonrpc":"2.0","id":9,"method":"session/list","params":{}}`); st != 404 {
		t.Errorf("POST after DELETE: %d %q", st, b)
	}
	if resp, _ := c.do(http.MethodDelete, map[string]string{ConnectionIDHeader: c.conn}, ""); resp.StatusCode != 404 {
		t.Errorf("second DELETE: %d", resp.StatusCode)
	}
}

// A drain ends open event streams (net/http's Shutdown waits for them) once
// running prompts are done, instead of waiting for its deadline.
func TestHTTPStreamsEndOnShutdown(t *testing.T) {
	ts := startServer(t, nil)
	c := openHTTP(t, ts)
	events, stop, _ := c.sse("", "")
	defer stop()
	start := time.Now()
	ts.shutdown()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Shutdown took %s with an event stream open", took)
	}
	select {
	case <-events: // closed
	case <-time.After(5 * time.Second):
		t.Error("the event stream did not end with the drain")
	}
}

// What a connection's streams keep for Last-Event-ID is bounded across its
// streams; a rewind past what is kept is refused.
func TestSSEHistoryBudget(t *testing.T) {
	h := &httpConn{history: 100, streams: map[string]*sseStream{}, gone: map[string]int64{}}
	a, b := h.stream(""), h.stream("s1")
	for i := range 6 { // 6 × 30 bytes across two streams, 100 kept
		st := a
		if i%2 == 1 {
			st = b
		}
		ev := sseEvent{id: st.next, msg: []byte(strings.Repeat("x", 30))}
		st.next++
		h.keep(st, ev)
	}
	if h.kept > 100 || h.kept != a.sentSize+b.sentSize {
		t.Fatalf("kept %d (streams %d + %d), budget 100", h.kept, a.sentSize, b.sentSize)
	}
	// a sent ids 1..3 and keeps only the newest; b likewise.
	if _, ok := a.rewind(0, discard); ok {
		t.Error("a rewind to before the oldest kept event was allowed")
	}
	last := a.sent[len(a.sent)-1].id
	if n, ok := a.rewind(last-1, discard); !ok || n != 30 || len(a.queue) != 1 || a.queue[0].id != last {
		t.Errorf("rewind to %d: %d bytes, %v, queue %v", last-1, n, ok, a.queue)
	}
	if _, ok := b.rewind(b.next, discard); ok {
		t.Error("a rewind to an id never sent was allowed")
	}
}

// A session stream dropped while it keeps nothing (its kept events went to
// another stream's) still resumes: its ids go on where they stopped.
func TestSSEStreamDroppedWhileEmptyResumes(t *testing.T) {
	h := &httpConn{history: 100, streams: map[string]*sseStream{}, gone: map[string]int64{}}
	st := h.stream("s1")
	st.next = 5 // four events sent, none kept
	st.receiver = true
	h.release("s1", st)
	if h.streams["s1"] != nil {
		t.Fatal("an empty session stream was kept")
	}
	again := h.stream("s1")
	if again.next != 5 {
		t.Fatalf("the stream starts again at id %d, want 5", again.next)
	}
	if _, ok := again.rewind(4, discard); !ok {
		t.Error("Last-Event-ID 4 refused on a stream that lost nothing")
	}
}

func TestRouteFacts(t *testing.T) {
	h := &httpConn{}
	for _, c := range []struct {
		msg, id, method, sid string
		hasSID               bool
	}{
		{`{"jsonrpc":"2.0","id":7,"result":{"sessionId":"not-params"}}`, "7", "", "", false},
		{`{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionId":"nested"},"sessionId":"s1"}}`, "", "session/update", "s1", true},
		{`{"params":{"sessionId":5},"id":"x","method":"fs/read_text_file","jsonrpc":"2.0"}`, `"x"`, "fs/read_text_file", "", false},
		{`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"m"}}`, "null", "", "", false},
		{`{"jsonrpc":"2.0","method":"x","params":[1,2]}`, "", "x", "", false},
	} {
		id, method, sid, has := h.routeFacts([]byte(c.msg))
		if string(id) != c.id || method != c.method || sid != c.sid || has != c.hasSID {
			t.Errorf("%s: id %q method %q sid %q %v", c.msg, id, method, sid, has)
		}
	}
}

// go test -run '^$' -bench RouteFacts ./gateway/
func BenchmarkRouteFacts(b *testing.B) {
	msg := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"ARfwi_FIkelQzhDujkhg-TUXZHvZjIQRwQ5nF80N2bqdStV2pTYgPVDmWnCPDkgiFUk","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` + strings.Repeat("lorem ipsum ", 12) + `"}}}}`)
	h := &httpConn{}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		h.routeFacts(msg)
	}
}

// A drain delivers a Streamable-HTTP prompt's last answer before it ends the
// connection: a turn cancelled when shutdown_grace runs out gets its
// "cancelled" answer on its session stream, and the connection stream (whose
// end the SDK takes for the end of the connection) ends only after that
// answer has gone out and the connection has been quiet for httpQuiet.
func TestHTTPDrainDeliversTheLastAnswer(t *testing.T) {
	ts := startServer(t, func(c *config.Config) { c.ShutdownGrace = config.Duration(300 * time.Millisecond) })
	c := openHTTP(t, ts)
	events, stop, _ := c.sse("", "")
	defer stop()
	if st, b := c.post(nil, `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`); st != 202 {
		t.Fatalf("session/new: %d %q", st, b)
	}
	_, m := next(t, events)
	res, _ := m["result"].(map[string]any)
	sid, _ := res["sessionId"].(string)
	if sid == "" {
		t.Fatalf("session/new answer %v", m)
	}
	sess, stopSess, _ := c.sse(sid, "")
	defer stopSess()
	prompt := `{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[{"type":"text","text":"slow"}]}}`
	if st, b := c.post(map[string]string{sessionIDHeader: sid}, prompt); st != 202 {
		t.Fatalf("prompt: %d %q", st, b)
	}
	next(t, sess)    // the turn runs
	var ta time.Time // when the session stream brought the answer
	sessEnd, connEnd := make(chan struct{}), make(chan time.Time, 1)
	go func() {
		defer close(sessEnd)
		for ev := range sess {
			if strings.Contains(ev, `"id":3,"result":{"stopReason":"cancelled"}`) {
				ta = time.Now()
			}
		}
	}()
	go func() {
		for range events {
		}
		connEnd <- time.Now()
	}()
	ts.shutdown()
	select {
	case <-sessEnd:
	case <-time.After(10 * time.Second):
		t.Fatal("the session stream did not end with the drain")
	}
	if ta.IsZero() {
		t.Fatal(`the session stream ended without the prompt's answer {"stopReason":"cancelled"}`)
	}
	var tc time.Time
	select {
	case tc = <-connEnd:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection stream did not end with the drain")
	}
	// The client's own delays only shorten what it sees of httpQuiet.
	if d := tc.Sub(ta); d < httpQuiet/3 {
		t.Errorf("the connection stream ended %s after the last answer arrived; want about %s", d, httpQuiet)
	}
}

// A Streamable-HTTP connection is its credential subject's: another token
// of the same tenant naming it gets the 404 of an unknown connection, on
// every method.
func TestHTTPConnectionIsItsSubjects(t *testing.T) {
	root := t.TempDir()
	var hashes []string
	for _, tok := range []string{"tok", "tok2"} {
		sum := sha256.Sum256([]byte(tok))
		hashes = append(hashes, hex.EncodeToString(sum[:]))
	}
	ts := startServer(t, func(c *config.Config) {
		c.Tenants = []config.Tenant{{Name: "acme", TokensSHA256: hashes, Root: root}}
		c.Sandbox.Mode = "off"
	})
	defer ts.shutdown()
	c := &httpClient{t: t, ts: ts, hc: &http.Client{}}
	as := func(tok string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + tok}
	}
	resp, body := c.do(http.MethodPost, map[string]string{"Content-Type": "application/json", "Authorization": "Bearer tok"}, httpInit)
	if c.conn = resp.Header.Get(ConnectionIDHeader); resp.StatusCode != 200 {
		t.Fatalf("initialize: %d %q", resp.StatusCode, body)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}`
	if st, b := c.post(as("tok2"), list); st != 404 || b != "Unknown Acp-Connection-Id" {
		t.Errorf("POST with the tenant's other token: %d %q", st, b)
	}
	get := map[string]string{"Authorization": "Bearer tok2", "Accept": "text/event-stream", ConnectionIDHeader: c.conn}
	if resp, b := c.do(http.MethodGet, get, ""); resp.StatusCode != 404 || b != "Unknown Acp-Connection-Id" {
		t.Errorf("GET with the tenant's other token: %d %q", resp.StatusCode, b)
	}
	del := map[string]string{"Authorization": "Bearer tok2", ConnectionIDHeader: c.conn}
	if resp, b := c.do(http.MethodDelete, del, ""); resp.StatusCode != 404 {
		t.Errorf("DELETE with the tenant's other token: %d %q", resp.StatusCode, b)
	}
	if st, b := c.post(as("tok"), list); st != 202 {
		t.Errorf("POST with the connection's own token: %d %q", st, b)
	}
}

// discard is a giveBack that keeps the buffer out of the pool.
func discard([]byte) {}

// Both transports' writers are bounded by timeouts.write, over
// websocket.write_timeout, its older name.
func TestWriteTimeoutBothTransports(t *testing.T) {
	ts := startServer(t, func(c *config.Config) {
		c.Timeouts.Write = config.Duration(3 * time.Second)
		c.WebSocket.WriteTimeout = config.Duration(10 * time.Second)
	})
	openHTTP(t, ts)
	ws := ts.dial(Subprotocol)
	ws.initialize()
	links, _ := ts.s.links.linksOf("")
	kinds := map[string]time.Duration{}
	for _, l := range links {
		kinds[l.kind] = l.writeWait
	}
	if len(kinds) != 2 || kinds["http"] != 3*time.Second || kinds["websocket"] != 3*time.Second {
		t.Fatalf("write timeouts by transport: %v, want 3s for http and websocket", kinds)
	}
}
