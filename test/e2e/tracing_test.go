package e2e

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/jaeger"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// otelOff clears the OTEL_* variables the test may run with: they would
// turn tracing on.
var otelOff = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL=",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=", "OTEL_EXPORTER_OTLP_HEADERS=", "OTEL_EXPORTER_OTLP_TRACES_HEADERS=",
	"OTEL_RESOURCE_ATTRIBUTES=", "OTEL_SERVICE_NAME=", "OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER="}

// tracedGateway is a gateway exporting to a fresh Jaeger as service, with
// a short batch delay.
func tracedGateway(t *testing.T, j *jaeger.Jaeger, service string, o gwOpts) *gateway {
	t.Helper()
	o.env = append(append(append([]string(nil), otelOff...), "OTEL_EXPORTER_OTLP_ENDPOINT="+j.OTLPHTTP(),
		"OTEL_SERVICE_NAME="+service, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=e2e"), o.env...)
	return startGateway(t, o)
}

// agentsWithEnv are the gateway's descendants whose environment holds kv.
func agentsWithEnv(g *gateway, kv string) []int {
	below := proctree.Subtree(proctree.Table(), g.Cmd.Process.Pid)
	var pids []int
	for _, pid := range proctree.WithEnv(kv) {
		if _, ok := below[pid]; ok {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestTracingJaeger runs the gateway against Jaeger: the agents get the
// endpoint and their resource attributes; the gateway's spans, once it
// makes some, carry its resource.
func TestTracingJaeger(t *testing.T) {
	j := jaeger.Start(t)
	service := "acpgate-e2e-" + harness.RandomHex(t, 4)
	g := tracedGateway(t, j, service, gwOpts{})
	if g.CountLogs("tracing on", "protocol", "http/protobuf") != 1 {
		t.Errorf("no \"tracing on\" in the log")
	}
	c, sid := dialSession(t, g, t.TempDir())
	promptOK(t, c, sid, "hello")
	for _, kv := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLPHTTP(), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=e2e,acpgate.agent=default", "OTEL_SERVICE_NAME="} {
		if len(agentsWithEnv(g, kv)) == 0 {
			t.Errorf("no agent process has %s", kv)
		}
	}
	c.Close()
	g.Stop(syscall.SIGTERM) // flushes
	trs, err := j.Traces(service)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range trs {
		for _, s := range tr.Spans {
			p := tr.Process(s)
			for _, k := range []string{"service.version", "service.instance.id", "deployment.environment"} {
				if _, ok := p.Tag(k); !ok {
					t.Errorf("span %s: the gateway's resource lacks %s: %+v", s.OperationName, k, p)
				}
			}
		}
	}
}

// TestTracingOff: with no endpoint nothing is exported, no connection is
// made (to the SDK's default ports either) and agents get no OTEL_*
// variables of the gateway's.
func TestTracingOff(t *testing.T) {
	var accepted atomic.Int32
	for _, addr := range []string{"127.0.0.1:4317", "127.0.0.1:4318"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("%s is taken (%v); the check needs it", addr, err)
		}
		done := make(chan struct{})
		go func() { // ends when the cleanup closes ln
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		t.Cleanup(func() { ln.Close(); <-done })
	}
	g := startGateway(t, gwOpts{env: otelOff})
	c, sid := dialSession(t, g, t.TempDir())
	promptOK(t, c, sid, "hello")
	if pids := agentsWithEnv(g, "OTEL_RESOURCE_ATTRIBUTES=acpgate.agent=default"); len(pids) > 0 {
		t.Errorf("agents %v got tracing variables with tracing off", pids)
	}
	c.Close()
	g.Stop(syscall.SIGTERM)
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections to the OTLP ports with tracing off", n)
	}
	if strings.Contains(g.LogText(), "tracing on") {
		t.Error("the log says tracing is on")
	}
}

// TestTracingTurnStory: a turn whose prompt carries the client's trace
// context, with a tool call, a permission and a write the gateway's
// stand-in makes, appears in Jaeger under the client's trace: the turn's
// span (the client's span its parent) and, under it, the time to the
// first update, the permission request, the tool call and the stand-in's
// write. The agent gets a traceparent of that trace naming the turn's
// span. A turn without one makes a trace of its own. The same over a
// WebSocket (params._meta.traceparent) and over Streamable HTTP (the
// POST's traceparent header; params._meta.traceparent wins over it).
func TestTracingTurnStory(t *testing.T) {
	j := jaeger.Start(t)
	for _, tt := range []struct {
		name, transport string // transport: the spans' acpgate.transport
		dial            func(*testing.T, *gateway) traceClient
	}{
		{"websocket", "websocket", dialTraceWS},
		{"http header", "http", func(t *testing.T, g *gateway) traceClient { return dialTraceHTTP(t, g, false) }},
		{"http _meta over the header", "http", func(t *testing.T, g *gateway) traceClient { return dialTraceHTTP(t, g, true) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			service := "acpgate-e2e-" + harness.RandomHex(t, 4)
			g := tracedGateway(t, j, service, gwOpts{})
			turnStory(t, j, g, service, tt.dial(t, g), tt.transport)
		})
	}
}

// traceClient is a client of one session, with no file access (the
// gateway stands in), over one transport.
type traceClient interface {
	// request sends a request with the trace context traceparent ("":
	// none) as the transport carries it, and returns its id.
	request(method string, params map[string]any, traceparent string) int
	Respond(id json.RawMessage, result any)
	// Next is the next message for the client, failing the test after
	// timeout.
	Next(timeout time.Duration) rpcMsg
	// opened: the session sid is open.
	opened(sid string)
	connectionID() string
	Close()
}

func w3cTraceparent(traceID, spanID string) string { return "00-" + traceID + "-" + spanID + "-01" }

// withTraceparent is params with _meta.traceparent set.
func withTraceparent(params map[string]any, traceparent string) map[string]any {
	p := maps.Clone(params)
	p["_meta"] = map[string]any{"traceparent": traceparent}
	return p
}

// awaitTrace reads c until the answer to id (see acpclient.Client.Await).
func awaitTrace(t *testing.T, c traceClient, id int, other func(rpcMsg)) rpcMsg {
	t.Helper()
	deadline := time.Now().Add(turn)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("no response to request %d within %s", id, turn)
		}
		m := c.Next(left)
		if answer, unexpected := acpclient.AwaitStep(m, id, other); answer {
			return m
		} else if unexpected {
			t.Fatalf("unexpected message while waiting for %d: %s", id, m.Raw)
		}
	}
}

// turnStory runs the traced turn, an untraced one and a refused traced
// request on c, then checks what Jaeger and the gateway's log have of
// them. transport is the spans' acpgate.transport.
func turnStory(t *testing.T, j *jaeger.Jaeger, g *gateway, service string, c traceClient, transport string) {
	newTrace, newSpan := harness.RandomHex(t, 16), harness.RandomHex(t, 8)
	m := awaitTrace(t, c, c.request("session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}, w3cTraceparent(newTrace, newSpan)), nil)
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("session/new: %s", m.Raw)
	}
	c.opened(sid)
	traceID, clientSpan := harness.RandomHex(t, 16), harness.RandomHex(t, 8)
	pid := c.request("session/prompt", textPrompt(sid, "write out.txt traced"), w3cTraceparent(traceID, clientSpan))
	var perm rpcMsg
	for deadline := time.Now().Add(turn); perm.Method != "session/request_permission"; {
		if time.Now().After(deadline) {
			t.Fatalf("no permission request within %s", turn)
		}
		perm = c.Next(time.Until(deadline))
	}
	c.Respond(perm.ID, allow)
	if r := stopReason(t, awaitTrace(t, c, pid, func(rpcMsg) {})); r != "end_turn" {
		t.Fatalf("the traced turn ended %q", r)
	}
	onUpdate, _ := collectText(t, sid)
	if r := stopReason(t, awaitTrace(t, c, c.request("session/prompt", textPrompt(sid, "no traceparent here"), ""), onUpdate)); r != "end_turn" {
		t.Fatalf("the untraced turn ended %q", r)
	}
	// A log line about a traced request carries its trace.
	refusedTrace := harness.RandomHex(t, 16)
	if m := awaitTrace(t, c, c.request("_nope/x", map[string]any{}, w3cTraceparent(refusedTrace, clientSpan)), nil); m.Error == nil {
		t.Fatalf("_nope/x was not refused: %s", m.Raw)
	}
	g.WaitLog(t, "refused by policy", "trace_id", refusedTrace, 10*time.Second)
	for _, l := range g.Logs() {
		if l["msg"] == "refused by policy" && l["trace_id"] == refusedTrace && l["conn"] != c.connectionID() {
			t.Errorf("the log line of the refused request names connection %v, want %s: %v", l["conn"], c.connectionID(), l)
		}
	}
	c.Close()

	var tr jaeger.Trace
	j.Wait(t, service, 20*time.Second, func([]jaeger.Trace) bool {
		var err error
		tr, err = j.Trace(traceID)
		_, standIn := tr.Span("acpgate.fs_standin")
		_, turn := tr.Span("session/prompt") // ends last
		return err == nil && standIn && turn
	})
	turnSpan, ok := tr.Span("session/prompt")
	if !ok || turnSpan.Parent() != clientSpan {
		t.Fatalf("no session/prompt span under the client's span %s: %+v", clientSpan, tr.Spans)
	}
	for k, want := range map[string]any{"rpc.system": "jsonrpc", "rpc.method": "session/prompt", "acpgate.session": sid, "acpgate.transport": transport} {
		if v, _ := turnSpan.Tag(k); v != want {
			t.Errorf("session/prompt: %s = %v, want %v", k, v, want)
		}
	}
	for _, op := range []string{"acpgate.first_update", "session/request_permission", "acpgate.tool_call", "acpgate.fs_standin"} {
		s, ok := tr.Span(op)
		if !ok {
			t.Errorf("no %s span in the turn's trace", op)
			continue
		}
		if p := s.Parent(); p != turnSpan.SpanID && op != "acpgate.fs_standin" {
			t.Errorf("%s: parent %s, want the turn's span %s", op, p, turnSpan.SpanID)
		}
	}
	if s, ok := tr.Span("acpgate.tool_call"); ok {
		if v, _ := s.Tag("acpgate.tool_call.kind"); v != "edit" {
			t.Errorf("the tool call's kind: %v, want edit", v)
		}
	}
	want, got := "traceparent 00-"+traceID+"-"+turnSpan.SpanID+"-", false
	for _, l := range g.Logs() {
		if line, _ := l["line"].(string); l["msg"] == "agent stderr" && strings.Contains(line, want) {
			got = true
		}
	}
	if !got {
		t.Errorf("the agent did not get a traceparent naming the turn's span (%s)", want)
	}

	trs := j.Wait(t, service, 20*time.Second, func(trs []jaeger.Trace) bool {
		prompts, opened := 0, false
		for _, tr := range trs {
			if s, ok := tr.Span("session/prompt"); ok && tr.TraceID != traceID && s.Parent() == "" {
				if v, _ := s.Tag("acpgate.transport"); v == transport {
					prompts++
				}
			}
			if s, ok := tr.Span("session/new"); ok && tr.TraceID == newTrace && s.Parent() == newSpan {
				opened = true
			}
		}
		return prompts >= 1 && opened
	})
	t.Logf("%d traces of %s", len(trs), service)

	// An OpenMetrics scrape: the latency histograms' exemplars name traces
	// Jaeger has.
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ex := regexp.MustCompile(`(?m)^acpgate_(?:request_duration|prompt_first_update)_seconds_bucket\{[^}]*\} \d+ # \{trace_id="([0-9a-f]{32})"\}`).FindAllSubmatch(body, -1)
	if len(ex) == 0 {
		t.Fatalf("no trace_id exemplar in the OpenMetrics scrape (%s)", resp.Header.Get("Content-Type"))
	}
	if _, err := j.Trace(string(ex[0][1])); err != nil {
		t.Errorf("the exemplar's trace %s: %v", ex[0][1], err)
	}
}

// wsTraceClient is a traceClient over a WebSocket: the trace context goes
// in params._meta.
type wsTraceClient struct{ *client }

func dialTraceWS(t *testing.T, g *gateway) traceClient {
	c := dial(t, g)
	c.Initialize("e2e", false) // no file access: the gateway stands in
	return wsTraceClient{c}
}

func (c wsTraceClient) request(method string, params map[string]any, traceparent string) int {
	c.T.Helper()
	if traceparent != "" {
		params = withTraceparent(params, traceparent)
	}
	return c.Request(method, params)
}

func (c wsTraceClient) opened(string) {}

func (c wsTraceClient) connectionID() string { return c.ConnID }

// httpTraceClient is a traceClient over Streamable HTTP: each message a
// POST (a request's answer comes on an event stream), read from the
// connection's event stream and, once the session is open, the session's.
// The trace context goes in the POST's traceparent header, or with meta
// in params._meta, the header naming another trace.
type httpTraceClient struct {
	*httpPeer
	meta   bool
	ctx    context.Context // the event streams'
	id     int             // the last request's
	sid    string
	events chan string // the streams' data lines
}

func dialTraceHTTP(t *testing.T, g *gateway, meta bool) traceClient {
	c := dialHTTPClient(t, g, "")
	c.meta = meta
	return c
}

// dialHTTPClient initializes a Streamable-HTTP connection with token (""
// = none) and listens to its connection stream. Its streams end, and its
// idle HTTP connections close, when the test ends.
func dialHTTPClient(t *testing.T, g *gateway, token string) *httpTraceClient {
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	c := &httpTraceClient{httpPeer: &httpPeer{t: t, g: g, hc: hc, token: token}, id: 1, events: make(chan string, 1000)}
	c.initialize() // id 1, no file access: the gateway stands in
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.ctx = ctx
	c.listen("")
	return c
}

// listen GETs the event stream of session ("": the connection's).
func (c *httpTraceClient) listen(session string) {
	c.t.Helper()
	resp, events := c.stream(c.ctx, session)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET the event stream of %q: %d", session, resp.StatusCode)
	}
	go func() { // ends with the stream
		for d := range events {
			select {
			case c.events <- d:
			case <-c.ctx.Done():
			}
		}
	}()
}

func (c *httpTraceClient) post(v any, hdr map[string]string) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	if resp, body := c.req(http.MethodPost, string(b), hdr); resp.StatusCode != http.StatusAccepted {
		c.t.Fatalf("POST %s: %d %q", b, resp.StatusCode, body)
	}
}

func (c *httpTraceClient) request(method string, params map[string]any, traceparent string) int {
	c.t.Helper()
	c.id++
	hdr := map[string]string{}
	if sid, ok := params["sessionId"].(string); ok {
		hdr["Acp-Session-Id"] = sid
	}
	switch {
	case traceparent != "" && c.meta:
		params = withTraceparent(params, traceparent)
		hdr["traceparent"] = w3cTraceparent(harness.RandomHex(c.t, 16), harness.RandomHex(c.t, 8))
	case traceparent != "":
		hdr["traceparent"] = traceparent
	}
	c.post(acpclient.Request(c.id, method, params), hdr)
	return c.id
}

func (c *httpTraceClient) Respond(id json.RawMessage, result any) {
	c.t.Helper()
	c.post(acpclient.Response(id, result), map[string]string{"Acp-Session-Id": c.sid})
}

func (c *httpTraceClient) Next(timeout time.Duration) rpcMsg {
	c.t.Helper()
	m, ok := c.recv(timeout)
	if !ok {
		c.t.Fatalf("no event within %s", timeout)
	}
	return m
}

// recv is the next event of the connection's streams, if one comes within
// timeout.
func (c *httpTraceClient) recv(timeout time.Duration) (rpcMsg, bool) {
	c.t.Helper()
	select {
	case d := <-c.events:
		var m rpcMsg
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			c.t.Fatalf("event %q: %v", d, err)
		}
		m.Raw = []byte(d)
		return m, true
	case <-time.After(timeout):
		return rpcMsg{}, false
	}
}

func (c *httpTraceClient) opened(sid string) {
	c.t.Helper()
	c.sid = sid
	c.listen(sid)
}

func (c *httpTraceClient) connectionID() string { return c.conn }

// Close DELETEs the connection.
func (c *httpTraceClient) Close() {
	c.t.Helper()
	if resp, body := c.req(http.MethodDelete, "", nil); resp.StatusCode != http.StatusAccepted {
		c.t.Errorf("DELETE: %d %q", resp.StatusCode, body)
	}
}
