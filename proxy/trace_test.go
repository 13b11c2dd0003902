package proxy

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/internal/syncbuf"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
)

// The turn's children and their attributes, as package tracing names them.
const (
	SpanFirstUpdate = tracing.SpanFirstUpdate
	SpanToolCall    = tracing.SpanToolCall
	SpanPoolWait    = tracing.SpanPoolWait
	attrErrorCode   = tracing.AttrErrorCode
	attrProcess     = tracing.AttrProcess
	attrRPCMethod   = tracing.AttrRPCMethod
	attrRPCSystem   = tracing.AttrRPCSystem
	attrRequestID   = tracing.AttrRequestID
	attrSession     = tracing.AttrSession
	attrUpdates     = "acpgate.session.updates"
	attrToolCallID  = "acpgate.tool_call.id"
	attrToolKind    = "acpgate.tool_call.kind"
	attrToolTitle   = "acpgate.tool_call.title"
	attrToolStatus  = "acpgate.tool_call.status"
)

// tracedAgent answers a prompt with a tool call (titled the prompt's
// _meta.toolTitle, if any), a permission request about it, the tool call's
// completion and a chunk; its result carries the prompt line as the agent
// read it (_meta.line). _demo/fail is an error.
func tracedAgent() {
	out := bufio.NewWriter(os.Stdout)
	var promptID json.RawMessage
	var promptLine string
	update := func(u string) {
		fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":%s}}`+"\n", u)
	}
	serveLines(func(m agentLine) {
		defer out.Flush()
		if answerSetup(out, m) {
			return
		}
		switch m.Method {
		case "session/prompt":
			promptID, promptLine = m.ID, string(m.raw)
			var p struct {
				Params struct {
					Meta struct {
						ToolTitle string `json:"toolTitle"`
					} `json:"_meta"`
				} `json:"params"`
			}
			_ = json.Unmarshal(m.raw, &p)
			title, _ := json.Marshal(cmp.Or(p.Params.Meta.ToolTitle, "Edit main.go"))
			update(`{"sessionUpdate":"tool_call","toolCallId":"t1","title":` + string(title) + `,"kind":"edit","status":"pending"}`)
			fmt.Fprintln(out, `{"jsonrpc":"2.0","id":"perm1","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1"},"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}}`)
		case "_demo/fail":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32042,"message":"nope"}}`+"\n", m.ID)
		case "": // the permission request's answer
			update(`{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed"}`)
			update(`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"done"}}`)
			q, _ := json.Marshal(promptLine)
			a, _ := json.Marshal(string(m.raw))
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"stopReason":"end_turn","_meta":{"line":%s,"answer":%s}}}`+"\n", promptID, q, a)
		}
	})
}

// tracedRelay is a relay on the traced agent, recording its spans (rec
// nil: tracing off).
func tracedRelay(t *testing.T, on bool) (*Relay, *tracetest.SpanRecorder) {
	t.Helper()
	if !on {
		return testPool(t, "traced", nil), nil
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return testPool(t, "traced", nil, func(c *Config) { c.Tracing = tp; allowMeta(c, "toolTitle") }), rec
}

// allowMeta lets the _meta keys through to the test agent (policy.meta):
// "toolTitle" is the traced agent's knob.
func allowMeta(c *Config, keys ...string) {
	pol := *c.Tenants[0].Policy
	pol.Meta.Allow = keys
	c.Tenants[0].Policy = &pol
}

// promptLine runs a prompt (params as given, sessionId added first),
// answers its permission request and returns the prompt line the agent
// read.
func promptLine(t *testing.T, tc *testConn, sid, params string) string {
	t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"` + sid + `",` + params + `}}`)
	m := tc.await("9", func(m msg) {
		if m.Method == acp.RequestPermission {
			tc.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`)
		}
	})
	var res struct {
		Meta struct {
			Line string `json:"line"`
		} `json:"_meta"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Meta.Line == "" {
		t.Fatalf("prompt: %s", m.raw)
	}
	return res.Meta.Line
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %q ended", name)
	return nil
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestTraceTurn(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	sid := tc.newSession("1")
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	line := promptLine(t, tc, sid, `"prompt":[],"_meta":{"traceparent":"`+parent+`","tracestate":"k=v"}`)

	p := spanNamed(t, rec, acp.SessionPrompt)
	if got := p.Parent().SpanID().String(); got != "b7ad6b7169203331" || p.SpanContext().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("prompt span's parent = %s in trace %s", got, p.SpanContext().TraceID())
	}
	if ts := p.SpanContext().TraceState().Get("k"); ts != "v" {
		t.Errorf("tracestate k = %q", ts)
	}
	a := attrs(p)
	want := map[attribute.Key]string{attrRPCSystem: "jsonrpc", attrRPCMethod: acp.SessionPrompt, attrRequestID: "9", attrSession: sid}
	for k, v := range want {
		if a[k].AsString() != v {
			t.Errorf("%s = %q, want %q", k, a[k].AsString(), v)
		}
	}
	if a[attrProcess].AsString() == "" {
		t.Error("no process attribute")
	}
	if n := a[attrUpdates].AsInt64(); n != 3 {
		t.Errorf("updates = %d, want 3", n)
	}
	// The agent got the gateway's span as its parent; tracestate passed.
	wantTP := fmt.Sprintf(`"traceparent":"00-%s-%s-01","tracestate":"k=v"`, p.SpanContext().TraceID(), p.SpanContext().SpanID())
	if !strings.Contains(line, wantTP) {
		t.Errorf("agent read %s, want %s in it", line, wantTP)
	}
	isChild := func(name string) sdktrace.ReadOnlySpan {
		s := spanNamed(t, rec, name)
		if s.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the prompt's span", name)
		}
		return s
	}
	isChild(SpanFirstUpdate)
	perm := isChild(acp.RequestPermission)
	if perm.EndTime().Sub(perm.StartTime()) <= 0 || perm.Status().Code == codes.Error {
		t.Errorf("permission span: %v, status %v", perm.EndTime().Sub(perm.StartTime()), perm.Status())
	}
	tool := attrs(isChild(SpanToolCall))
	if tool[attrToolCallID].AsString() != "t1" || tool[attrToolKind].AsString() != "edit" ||
		tool[attrToolTitle].AsString() != "Edit main.go" || tool[attrToolStatus].AsString() != "completed" {
		t.Errorf("tool call span attributes: %v", tool)
	}
	newSpan := spanNamed(t, rec, acp.SessionNew)
	wait := spanNamed(t, rec, SpanPoolWait)
	if wait.Parent().SpanID() != newSpan.SpanContext().SpanID() {
		t.Error("the pool wait is not a child of session/new")
	}
	if newSpan.Parent().IsValid() {
		t.Error("session/new without a traceparent has a parent")
	}
}

// TestTraceClientSessionIDsBounded: a session/attach and a session/detach
// naming an ID the gateway did not issue, a 1 MiB one or a short guess,
// put neither the ID nor any value over 256 bytes on their spans.
func TestTraceClientSessionIDsBounded(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	for i, sid := range []string{strings.Repeat("A", 1<<20), "nope"} {
		for j, method := range []string{acp.SessionAttach, acp.SessionDetach} {
			id := strconv.Itoa(10*i + j)
			tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"` + method + `","params":{"sessionId":"` + sid + `"}}`)
			if m := tc.await(id, nil); m.Error == nil {
				t.Fatalf("%s of an unknown session: %s", method, m.raw)
			}
		}
	}
	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == acp.SessionAttach || s.Name() == acp.SessionDetach {
			spans = append(spans, s)
		}
	}
	if len(spans) != 4 {
		t.Fatalf("%d spans of session/attach and session/detach ended", len(spans))
	}
	for _, s := range spans {
		a := attrs(s)
		if v, ok := a[attrSession]; ok {
			t.Errorf("%s's span names the session %.40q", s.Name(), v.AsString())
		}
		if !a[tracing.AttrSessionUnknown].AsBool() {
			t.Errorf("%s's span does not say the session is unknown: %v", s.Name(), s.Attributes())
		}
		for _, kv := range s.Attributes() {
			if n := len(kv.Value.String()); n > tracing.MaxValue {
				t.Errorf("%s's span: %s of %d bytes", s.Name(), kv.Key, n)
			}
		}
		if n := len(s.Status().Description); n > tracing.MaxValue {
			t.Errorf("%s's span: a status of %d bytes", s.Name(), n)
		}
	}
}

// TestTraceToolTitleBounded: an agent's 1 KiB tool call title is cut on
// the tool call's span, on a rune boundary.
func TestTraceToolTitleBounded(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	sid := tc.newSession("1")
	title := strings.Repeat("é", 512) // 1 KiB
	promptLine(t, tc, sid, `"prompt":[],"_meta":{"toolTitle":"`+title+`"}`)
	got := attrs(spanNamed(t, rec, SpanToolCall))[attrToolTitle].AsString()
	if len(got) > tracing.MaxValue || !utf8.ValidString(got) || !strings.HasPrefix(title, strings.TrimSuffix(got, "…")) || len(got) < tracing.MaxValue-4 {
		t.Errorf("title of %d bytes on the span: %.40q…", len(got), got)
	}
}

func TestTraceWithoutParentStartsATrace(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	sid := tc.newSession("1")
	line := promptLine(t, tc, sid, `"prompt":[]`)
	p := spanNamed(t, rec, acp.SessionPrompt)
	if p.Parent().IsValid() {
		t.Errorf("prompt span has parent %s", p.Parent().SpanID())
	}
	want := fmt.Sprintf(`"params":{"_meta":{"traceparent":"00-%s-%s-01"},"sessionId":"s1","prompt":[]}}`, p.SpanContext().TraceID(), p.SpanContext().SpanID())
	if !strings.Contains(line, want) {
		t.Errorf("agent read %s, want %s in it", line, want)
	}
}

func TestTraceErrorAnswer(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	tc.send(`{"jsonrpc":"2.0","id":5,"method":"_demo/fail","params":{}}`)
	if m := tc.await("5", nil); m.Error == nil || m.Error.Code != -32042 {
		t.Fatalf("answer: %s", m.raw)
	}
	s := spanNamed(t, rec, "_demo/fail")
	if s.Status().Code != codes.Error || attrs(s)[attrErrorCode].AsInt64() != -32042 {
		t.Errorf("status %v, attributes %v", s.Status(), s.Attributes())
	}
}

// The header of a Streamable HTTP POST is the parent of a request that
// names none in its _meta.
func TestTraceHeaderParent(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	var sc jsonrpc.Scanner
	var m jsonrpc.Message
	if err := ScanClient(&sc, []byte(`{"jsonrpc":"2.0","id":5,"method":"_demo/fail","params":{}}`), &m); err != nil {
		t.Fatal(err)
	}
	parent := tracing.ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "")
	tc.c.HandleScannedTrace(tc.s, &m, parent)
	tc.await("5", nil)
	if s := spanNamed(t, rec, "_demo/fail"); s.Parent().SpanID() != parent.SpanID() {
		t.Errorf("parent = %s", s.Parent().SpanID())
	}
}

// With tracing off the agent reads the prompt as the client sent it, but
// for the id, the session ID and the _meta members policy.meta does not
// allow ("x", unless the list names it).
func TestTraceOffPassesMetaAsItIs(t *testing.T) {
	tp := `"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b"`
	for _, allow := range [][]string{nil, {"x"}} {
		r := testPool(t, "traced", nil, func(c *Config) { allowMeta(c, allow...) })
		tc := newTestConn(t, r, "c1")
		tc.init(`{}`)
		sid := tc.newSession("1")
		params := `"prompt":[],"_meta":{ "x" : 1 ,` + tp + `}`
		line := promptLine(t, tc, sid, params)
		id := regexp.MustCompile(`"id":(\d+)`).FindStringSubmatch(line)
		want := `{"jsonrpc":"2.0","id":` + id[1] + `,"method":"session/prompt","params":{"sessionId":"s1",` + params + `}}`
		if allow == nil {
			want = `{"jsonrpc":"2.0","id":` + id[1] + `,"method":"session/prompt","params":{"sessionId":"s1","prompt":[],"_meta":{ ` + tp + `}}}`
		}
		if line != want {
			t.Errorf("allow %q: agent read\n%s\nwant\n%s", allow, line, want)
		}
	}
}

// With tracing on, a _meta whose members all go gets the traceparent
// alone, valid JSON: the removals and the insertion are spliced together.
func TestTraceMetaEmptiedGetsTraceparent(t *testing.T) {
	r, rec := tracedRelay(t, true)
	tc := newTestConn(t, r, "c1")
	tc.init(`{}`)
	sid := tc.newSession("1")
	line := promptLine(t, tc, sid, `"prompt":[],"_meta":{"claudeCode":{"options":{"executableArgs":["-e","x"]}}}`)
	p := spanNamed(t, rec, acp.SessionPrompt)
	want := fmt.Sprintf(`"params":{"sessionId":"s1","prompt":[],"_meta":{"traceparent":"00-%s-%s-01"}}}`, p.SpanContext().TraceID(), p.SpanContext().SpanID())
	if !strings.HasSuffix(line, want) {
		t.Errorf("agent read %s, want it to end %s", line, want)
	}
}

func TestTraceparentEdit(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3},
		SpanID:     trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled,
	})
	span := trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), sc))
	tp := `"traceparent":"00-01020300000000000000000000000000-0405060000000000-01"`
	for _, c := range []struct{ params, want string }{
		{`{"sessionId":"x"}`, `{` + `"_meta":{` + tp + `},"sessionId":"x"}`},
		{`{ }`, `{"_meta":{` + tp + `} }`},
		{`{"_meta":{}}`, `{"_meta":{` + tp + `}}`},
		{`{"_meta":{"a":[1]}}`, `{"_meta":{` + tp + `,"a":[1]}}`},
		{`{"_meta":{"traceparent":"old","b":2}}`, `{"_meta":{` + tp + `,"b":2}}`},
		{`{"_meta":null}`, `{"_meta":null}`},
		{`[1]`, `[1]`},
	} {
		var s jsonrpc.Scanner
		var m jsonrpc.Message
		raw := `{"jsonrpc":"2.0","id":1,"method":"_x/y","params":` + c.params + `}`
		if err := ScanClient(&s, []byte(raw), &m); err != nil {
			t.Fatal(err)
		}
		var edits []jsonrpc.Edit
		if e, ok := tracing.ParentEdit(&m, span, false); ok {
			edits = append(edits, e)
		}
		got := string(jsonrpc.Splice(nil, m.Raw, edits))
		if want := `{"jsonrpc":"2.0","id":1,"method":"_x/y","params":` + c.want + `}`; got != want {
			t.Errorf("%s:\n got %s\nwant %s", c.params, got, want)
		}
	}
}

type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }

// traceTurnForBench makes the session's updates count on a traced turn, as
// a prompt's would: tracing on, every span sampled, exported nowhere.
func traceTurnForBench(b *testing.B) func(*Relay, *Session) {
	return func(r *Relay, s *Session) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(nopExporter{}))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		r.tracer = tracing.TracerOf(tp, TracerName)
		ag := s.side.ag
		ag.obs = r.observers(ag, nil)
		_, span := r.tracer.Start(context.Background(), acp.SessionPrompt)
		b.Cleanup(func() { span.End() })
		t := &observe.Turn{Start: time.Now(), Span: span}
		s.turn.Cur.Store(t)
		ag.obs.Observe(&observe.Event{Kind: observe.TurnStarted, Session: s.info, Turn: t})
	}
}

func BenchmarkRouteSessionUpdate300BTraced(b *testing.B) {
	benchFanOut(b, 160, 0, 0, 0, traceTurnForBench(b))
}

func BenchmarkRouteSessionUpdate20KBTraced(b *testing.B) {
	benchFanOut(b, 20000, 0, 0, 0, traceTurnForBench(b))
}

// BenchmarkTurnTraceUpdate is what tracing adds to one session/update of a
// traced turn (not a tool call): the count, and the kind's look-up that
// metering shares with it.
func BenchmarkTurnTraceUpdate(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(nopExporter{}))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tracing.TracerOf(tp, TracerName))
	_, span := tracing.TracerOf(tp, TracerName).Start(context.Background(), acp.SessionPrompt)
	b.Cleanup(func() { span.End() })
	turn := &observe.Turn{Start: time.Now(), Span: span}
	tr.Observe(&observe.Event{Kind: observe.TurnStarted, Turn: turn})
	var sc jsonrpc.Scanner
	var m jsonrpc.Message
	line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}`)
	if err := sc.Scan(line, &m, func(*jsonrpc.Message) *jsonrpc.Spec { return acp.SpecUpdate }); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		tr.Observe(&observe.Event{Kind: observe.Update, Turn: turn, UpdateKind: acp.UpdateKind(&m), Params: m.Payload})
	}
}

// A log line about a traced request carries its trace: the initialize's,
// and a session/attach's, which the gateway answers itself and which has a
// span of its own, as session/detach has; a refused attach's span says so.
func TestTraceLogLines(t *testing.T) {
	r, rec := tracedRelay(t, true)
	var logs syncbuf.Buffer
	tc := connWith(t, r, ConnInfo{ID: "c1", Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	call := func(id, method, params, traceID string) msg {
		t.Helper()
		tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"` + method + `","params":{` + params + `"_meta":{"traceparent":"00-` + traceID + `-b7ad6b7169203331-01"}}}`)
		return tc.await(id, nil)
	}
	const initTrace, attachTrace, detachTrace, refusedTrace = "0af7651916cd43dd8448eb211c80319c",
		"1bf7651916cd43dd8448eb211c80319d", "2cf7651916cd43dd8448eb211c80319e", "3df7651916cd43dd8448eb211c80319f"
	if m := call("1", acp.Initialize, `"protocolVersion":1,"clientCapabilities":{},`, initTrace); m.Error != nil {
		t.Fatalf("initialize: %s", m.raw)
	}
	owner := newTestConn(t, r, "c0")
	owner.init(`{}`)
	sid := owner.newSession("3")
	if m := call("2", acp.SessionAttach, `"sessionId":"`+sid+`",`, attachTrace); m.Error != nil {
		t.Fatalf("attach: %s", m.raw)
	}
	if m := call("4", acp.SessionDetach, `"sessionId":"`+sid+`",`, detachTrace); m.Error != nil {
		t.Fatalf("detach: %s", m.raw)
	}
	if m := call("5", acp.SessionAttach, `"sessionId":"nope",`, refusedTrace); m.Error == nil {
		t.Fatalf("attach to an unknown session: %s", m.raw)
	}
	inTrace := func(traceID string) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() == traceID {
				return s
			}
		}
		t.Fatalf("no span ended in trace %s", traceID)
		return nil
	}
	lines := map[string]map[string]any{}
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) == nil {
			lines[v["msg"].(string)] = v
		}
	}
	for msg, span := range map[string]sdktrace.ReadOnlySpan{
		"initialized":           inTrace(initTrace),
		"attached to a session": inTrace(attachTrace),
	} {
		l, ok := lines[msg]
		if !ok {
			t.Errorf("no log line %q in\n%s", msg, logs.String())
			continue
		}
		if l["trace_id"] != span.SpanContext().TraceID().String() || l["span_id"] != span.SpanContext().SpanID().String() {
			t.Errorf("%q: trace_id %v span_id %v, want %s %s", msg, l["trace_id"], l["span_id"], span.SpanContext().TraceID(), span.SpanContext().SpanID())
		}
	}
	for traceID, name := range map[string]string{attachTrace: acp.SessionAttach, detachTrace: acp.SessionDetach} {
		s := inTrace(traceID)
		if s.Name() != name || attrs(s)[attrSession].AsString() != sid || s.Status().Code == codes.Error {
			t.Errorf("%s's span: %s, session %q, status %v", name, s.Name(), attrs(s)[attrSession].AsString(), s.Status())
		}
	}
	if s := inTrace(refusedTrace); s.Status().Code != codes.Error || attrs(s)[attrErrorCode].AsInt64() != jsonrpc.CodeNotFound {
		t.Errorf("the refused attach's span: status %v, attributes %v", s.Status(), s.Attributes())
	}
}

// benchEcho is a client request's round trip through the relay to the demo
// agent and back: _demo/echo, with tracing off or on (every span sampled,
// batched to an exporter that drops them).
func benchEcho(b *testing.B, traced bool) {
	var opts []func(*Config)
	if traced {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(nopExporter{}))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		opts = append(opts, func(c *Config) { c.Tracing = tp })
	}
	r := testPool(b, "demo", nil, opts...)
	tc := newTestConn(b, r, "c1")
	tc.init(`{}`)
	sid := tc.newSession("1")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := strconv.Itoa(i + 10)
		tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"_demo/echo","params":{"n":` + id + `,"sessionId":"` + sid + `"}}`)
		if m := tc.await(id, nil); m.Error != nil {
			b.Fatalf("echo: %s", m.raw)
		}
	}
}

func BenchmarkEcho(b *testing.B)       { benchEcho(b, false) }
func BenchmarkEchoTraced(b *testing.B) { benchEcho(b, true) }

// tracedV2Agent speaks ACP v2: a prompt is acknowledged at once
// ({messageId}), then runs 200 ms (state running, a chunk) and ends with
// the session's idle state_update.
func tracedV2Agent() {
	out := bufio.NewWriter(os.Stdout)
	serveLines(func(m agentLine) {
		defer out.Flush()
		update := func(u string) {
			fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":%s}}`+"\n", u)
		}
		switch m.Method {
		case "initialize":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":2,"info":{"name":"t","version":"0"},"capabilities":{"session":{}}}}`+"\n", m.ID)
		case "session/new":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"s1"}}`+"\n", m.ID)
		case "session/prompt":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"messageId":"m1"}}`+"\n", m.ID)
			update(`{"sessionUpdate":"state_update","state":"running"}`)
			update(`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"working"}}`)
			out.Flush()
			time.Sleep(200 * time.Millisecond)
			update(`{"sessionUpdate":"state_update","state":"idle","stopReason":"end_turn"}`)
		}
	})
}

// A v2 turn's span runs from the prompt to the session's idle
// state_update, not to the prompt's acknowledgement: no session/prompt
// span has ended when the acknowledgement arrives, and the span that ends
// by the idle update lasts the turn's 200 ms.
func TestTraceV2TurnEndsAtIdle(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	r := testPool(t, "traced-v2", nil, func(c *Config) { c.Tracing = tp })
	tc := newTestConn(t, r, "c1")
	tc.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":2,"info":{"name":"c","version":"0"},"capabilities":{}}}`)
	if m := tc.await(`"init"`, nil); m.Error != nil {
		t.Fatalf("initialize: %s", m.raw)
	}
	sid := tc.newSession("1")
	tc.send(`{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[]}}`)
	if m := tc.await("9", nil); m.Error != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	acked := time.Now()
	for _, s := range rec.Ended() {
		if s.Name() == acp.SessionPrompt {
			t.Fatalf("the prompt's span ended at its acknowledgement")
		}
	}
	for {
		m := tc.next()
		if m.Method == acp.SessionUpdate && strings.Contains(string(m.Params), `"idle"`) {
			break
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var p sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Name() == acp.SessionPrompt {
				p = s
			}
		}
		if p != nil {
			if d := p.EndTime().Sub(p.StartTime()); d < 150*time.Millisecond || p.EndTime().Before(acked) {
				t.Errorf("the v2 turn's span lasted %v (ended %v after the acknowledgement), want the turn's 200 ms", d, p.EndTime().Sub(acked))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session/prompt span ended after the idle update")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Every client request's span ends, whichever way the request ends:
// answered by the agent, by the gateway (an attach refused, an unknown
// session, a malformed attach), or the initialize the gateway answers
// itself. Those the gateway answers say so.
func TestRequestSpansEndOnce(t *testing.T) {
	r, rec := tracedRelay(t, true)
	c := newTestConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	for i, req := range []string{
		`{"jsonrpc":"2.0","id":2,"method":"session/attach","params":{"sessionId":"nope"}}`,
		`{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"nope","prompt":[]}}`,
		`{"jsonrpc":"2.0","id":4,"method":"session/attach","params":{}}`,
		`{"jsonrpc":"2.0","id":5,"method":"_demo/fail","params":{"sessionId":"` + sid + `"}}`, // the agent's error
	} {
		c.send(req)
		if m := c.await(strconv.Itoa(i+2), nil); m.Error == nil {
			t.Fatalf("%s: answered %s, want an error", req, m.raw)
		}
	}
	waitFor(t, "the spans to end", func() bool { return len(requestSpans(rec.Ended())) >= 6 })
	started, ended := requestSpans(rec.Started()), requestSpans(rec.Ended())
	if len(started) != 6 || len(ended) != 6 {
		t.Fatalf("%d request spans started, %d ended; want 6 and 6", len(started), len(ended))
	}
	byGateway := 0
	for _, s := range ended {
		for _, a := range s.Attributes() {
			if string(a.Key) == tracing.AttrOutcome && a.Value.AsString() == "answered_by_gateway" {
				byGateway++
			}
		}
	}
	if byGateway != 4 { // initialize and the three refused
		t.Fatalf("%d spans answered by the gateway, want 4", byGateway)
	}
}

// requestSpans are the client requests' spans among spans (the server
// kind: an agent request's is the client kind, a turn's waits internal).
func requestSpans[S interface{ SpanKind() trace.SpanKind }](spans []S) []S {
	var out []S
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindServer {
			out = append(out, s)
		}
	}
	return out
}
