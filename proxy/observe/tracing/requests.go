package tracing

import (
	"context"
	"encoding/json"
	"log/slog"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// The spans of requests: a span per client request, named by its method,
// with children for what a turn waits on (a pool process, each agent
// request to the client, the file stand-in). Every function here takes a
// nil span (tracing off, or not traced) and then does nothing.

// Span names besides the request spans (named by their method).
const (
	SpanPoolWait  = "acpgate.pool.wait"
	SpanFsStandIn = "acpgate.fs_standin"
)

// Span attributes.
const (
	AttrRPCSystem    = "rpc.system"
	AttrRPCMethod    = "rpc.method"
	AttrRequestID    = "rpc.jsonrpc.request_id"
	AttrErrorCode    = "rpc.jsonrpc.error_code"
	AttrErrorMessage = "rpc.jsonrpc.error_message"
	AttrTenant       = "acpgate.tenant"
	AttrAgent        = "acpgate.agent"
	AttrProcess      = "acpgate.process"
	AttrSession      = "acpgate.session"
	AttrTransport    = "acpgate.transport"
	AttrOutcome      = "acpgate.outcome"

	// AttrSessionUnknown marks a request naming a session ID the gateway
	// did not issue (the ID itself is not recorded).
	AttrSessionUnknown = "acpgate.session.unknown"
)

// MaxValue bounds, in bytes, each string value put on a span here: a
// client or an agent chooses most of them.
const MaxValue = 256

// Truncate is s cut to at most MaxValue bytes, on a rune boundary, ending
// in "…" when cut.
func Truncate(s string) string {
	if len(s) <= MaxValue {
		return s
	}
	n := MaxValue - len("…")
	for i := 1; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return s[:n] + "…"
}

// String is a string attribute, its value truncated (Truncate).
func String(key, value string) attribute.KeyValue {
	return attribute.String(key, Truncate(value))
}

var w3c = propagation.TraceContext{}

// ParseTraceparent reads a W3C traceparent (and tracestate) value; an
// invalid one is the zero SpanContext.
func ParseTraceparent(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		carrier["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier))
}

// Traceparent is span's W3C traceparent, as a JSON string.
func Traceparent(span trace.Span) []byte {
	sc := span.SpanContext()
	tp := make([]byte, 0, 64)
	tp = append(tp, `"00-`...)
	tp = append(tp, sc.TraceID().String()...)
	tp = append(tp, '-')
	tp = append(tp, sc.SpanID().String()...)
	tp = append(tp, '-')
	tp = append(tp, sc.TraceFlags().String()...)
	return append(tp, '"')
}

// Request is the identity of a client request's span.
type Request struct {
	Method, ID               string
	Tenant, Agent, Transport string
}

// StartRequest starts the span of a client request, a child of parent
// (the context the client names; invalid: none). tracer nil: tracing off.
func StartRequest(tracer trace.Tracer, parent trace.SpanContext, r Request) trace.Span {
	if tracer == nil {
		return nil
	}
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	_, span := tracer.Start(ctx, Truncate(r.Method), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String(AttrRPCSystem, "jsonrpc"),
		String(AttrRPCMethod, r.Method),
		String(AttrRequestID, r.ID),
		String(AttrTenant, r.Tenant),
		String(AttrAgent, r.Agent),
		String(AttrTransport, r.Transport),
	))
	return span
}

// Child starts a span under parent (nil: tracing off, or no parent).
func Child(tracer trace.Tracer, parent trace.Span, name string, opts ...trace.SpanStartOption) trace.Span {
	if tracer == nil || parent == nil {
		return nil
	}
	_, s := tracer.Start(trace.ContextWithSpan(context.Background(), parent), name, opts...)
	return s
}

// AgentRequest starts the span of an agent request to the client, under
// its turn's span (nil: tracing off, or no turn traced).
func AgentRequest(tracer trace.Tracer, turn trace.Span, method, id, session string) trace.Span {
	return Child(tracer, turn, Truncate(method), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(AttrRPCSystem, "jsonrpc"),
		String(AttrRPCMethod, method),
		String(AttrRequestID, id),
		String(AttrSession, session),
	))
}

// PoolWait starts the span of a wait for a pool process under the request
// span ctx carries (nil: none); end it with EndWait.
func PoolWait(tracer trace.Tracer, ctx context.Context) trace.Span {
	if tracer == nil || !trace.SpanFromContext(ctx).SpanContext().IsValid() {
		return nil
	}
	_, s := tracer.Start(ctx, SpanPoolWait)
	return s
}

// EndWait ends a wait's span, failed with err if not nil.
func EndWait(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, Truncate(err.Error()))
	}
	s.End()
}

// Set sets a string attribute on span, its value truncated.
func Set(span trace.Span, key, value string) {
	if span != nil {
		span.SetAttributes(String(key, value))
	}
}

// Error records a JSON-RPC error on span, its message truncated.
func Error(span trace.Span, code int, msg string) {
	msg = Truncate(msg)
	span.SetAttributes(attribute.Int(AttrErrorCode, code), attribute.String(AttrErrorMessage, msg))
	span.SetStatus(codes.Error, msg)
}

// Fail ends a request's span that ended in the gateway with code.
func Fail(span trace.Span, code int, msg string) {
	if span == nil {
		return
	}
	Error(span, code, msg)
	span.End()
}

// AnsweredByGateway ends a request's span the gateway answered itself (an
// error, a take-over, a lost session closed).
func AnsweredByGateway(span trace.Span) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String(AttrOutcome, "answered_by_gateway"))
	span.End()
}

// Answer records an error answer's code and message (errPayload: the
// answer's error object; nil: not an error) on span.
func Answer(span trace.Span, errPayload []byte) {
	if span == nil || errPayload == nil {
		return
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(errPayload, &e)
	Error(span, e.Code, e.Message)
}

// EndOutcome ends span with its outcome; code not 0 marks it failed.
func EndOutcome(s trace.Span, outcome string, code int) {
	if s == nil {
		return
	}
	outcome = Truncate(outcome)
	s.SetAttributes(attribute.String(AttrOutcome, outcome))
	if code != 0 {
		s.SetAttributes(attribute.Int(AttrErrorCode, code))
		s.SetStatus(codes.Error, outcome)
	}
	s.End()
}

// ObserveLatency records v in a latency histogram, with the trace of span
// (nil: none) as its exemplar when that is sampled, so that a latency on a
// dashboard leads to the trace behind it (exemplars are exposed when
// /metrics is scraped as OpenMetrics).
func ObserveLatency(o prometheus.Observer, v float64, span trace.Span) {
	if span != nil {
		if sc := span.SpanContext(); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
				return
			}
		}
	}
	o.Observe(v)
}

// WithTrace is log with the trace_id and span_id of span (nil, or not
// sampled and not from a client's trace: log itself), for lines about the
// request it traces.
func WithTrace(log *slog.Logger, span trace.Span) *slog.Logger {
	if span == nil {
		return log
	}
	sc := span.SpanContext()
	if !sc.IsValid() {
		return log
	}
	return log.With("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
}

// TracerOf is the tracer called name of tp (nil: tracing off).
func TracerOf(tp trace.TracerProvider, name string) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(name)
}

// ParentEdit sets a forwarded request's params._meta.traceparent to span
// (nil: no edit). metaEmptied: other edits remove every member of _meta
// (acp.TraceparentEdit).
func ParentEdit(m *jsonrpc.Message, span trace.Span, metaEmptied bool) (jsonrpc.Edit, bool) {
	if span == nil {
		return jsonrpc.Edit{}, false
	}
	return acp.TraceparentEdit(m, Traceparent(span), metaEmptied)
}

// ParentOf is the trace context a client message names: its params._meta
// (traceparent, tracestate), else parent (a POST's header).
func ParentOf(m *jsonrpc.Message, parent trace.SpanContext) trace.SpanContext {
	if sc := ParseTraceparent(acp.TraceContext(m)); sc.IsValid() {
		return sc
	}
	return parent
}

// TurnSpan is the span of a traced turn (nil: t is nil, or not traced).
func TurnSpan(t *observe.Turn) trace.Span {
	if t == nil {
		return nil
	}
	return t.Span
}
