package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// TestTracingTurnStory: a turn whose prompt carries the client's
// traceparent, with a tool call, a permission and a write the gateway's
// stand-in makes, appears in Jaeger under the client's trace: the turn's
// span (the client's span its parent) and, under it, the time to the
// first update, the permission request, the tool call and the stand-in's
// write. The agent gets a traceparent of that trace naming the turn's
// span. A turn without one makes a trace of its own; over Streamable HTTP
// a POST's traceparent header is the parent.
func TestTracingTurnStory(t *testing.T) {
	j := jaeger.Start(t)
	service := "acpgate-e2e-" + harness.RandomHex(t, 4)
	g := tracedGateway(t, j, service, gwOpts{})
	c := dial(t, g)
	c.Initialize("e2e", false) // no file access: the gateway stands in
	sid := c.newSession(t.TempDir())
	traceID, clientSpan := harness.RandomHex(t, 16), harness.RandomHex(t, 8)
	params := textPrompt(sid, "write out.txt traced")
	params["_meta"] = map[string]any{"traceparent": "00-" + traceID + "-" + clientSpan + "-01"}
	pid := c.Request("session/prompt", params)
	msgs := readUntil(t, c, "the permission request", turn, isMethod("session/request_permission"))
	c.Respond(msgs[len(msgs)-1].ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": "allow"}})
	if r := stopReason(t, c.Await(pid, turn, func(rpcMsg) {})); r != "end_turn" {
		t.Fatalf("the traced turn ended %q", r)
	}
	promptOK(t, c, sid, "no traceparent here")
	// A log line about a traced request carries its trace.
	refusedTrace := harness.RandomHex(t, 16)
	if m := c.Call("_nope/x", map[string]any{"_meta": map[string]string{"traceparent": "00-" + refusedTrace + "-" + clientSpan + "-01"}}, turn); m.Error == nil {
		t.Fatalf("_nope/x was not refused: %s", m.Raw)
	}
	g.WaitLog(t, "refused by policy", "trace_id", refusedTrace, 10*time.Second) // the log line about it carries its trace

	hp := &httpPeer{t: t, g: g, hc: &http.Client{}}
	hp.initialize()
	httpTrace, httpSpan := harness.RandomHex(t, 16), harness.RandomHex(t, 8)
	if resp, body := hp.req(http.MethodPost, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`, t.TempDir()),
		map[string]string{"traceparent": "00-" + httpTrace + "-" + httpSpan + "-01"}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST session/new: %d %q", resp.StatusCode, body)
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
	for k, want := range map[string]any{"rpc.system": "jsonrpc", "rpc.method": "session/prompt", "acpgate.session": sid, "acpgate.transport": "websocket"} {
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
		prompts, httpNew := 0, false
		for _, tr := range trs {
			if s, ok := tr.Span("session/prompt"); ok && tr.TraceID != traceID && s.Parent() == "" {
				prompts++
			}
			if s, ok := tr.Span("session/new"); ok && tr.TraceID == httpTrace && s.Parent() == httpSpan {
				httpNew = true
			}
		}
		return prompts >= 1 && httpNew
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
