package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// Tracing (Config.Tracing): a span per client request, named by its
// method, with children for what a turn waits on: a pool process, the
// agent's first update, each agent request to the client, the file
// stand-in, each tool call. Session updates are counted on the turn's span.
// A client's params._meta.traceparent (or a POST's traceparent header) is
// the request span's parent; the request the agent gets names the span in
// its own _meta.traceparent. With tracing off nothing here runs: every
// span is nil.

// TracerName names the relay's tracer (its instrumentation scope).
const TracerName = "github.com/acpgate/acpgate/proxy"

// Span names besides the request spans (named by their method).
const (
	SpanPoolWait  = "acpgate.pool.wait"
	SpanFsStandIn = "acpgate.fs_standin"
)

// Span attributes.
const (
	attrRPCSystem    = "rpc.system"
	attrRPCMethod    = "rpc.method"
	attrRequestID    = "rpc.jsonrpc.request_id"
	attrErrorCode    = "rpc.jsonrpc.error_code"
	attrErrorMessage = "rpc.jsonrpc.error_message"
	attrTenant       = "acpgate.tenant"
	attrAgent        = "acpgate.agent"
	attrProcess      = "acpgate.process"
	attrSession      = "acpgate.session"
	attrTransport    = "acpgate.transport"
	attrOutcome      = "acpgate.outcome"
)

// Labels of the trace context fields located in a client's params._meta.
const (
	labelTraceparent = "_meta.traceparent"
	labelTracestate  = "_meta.tracestate"
)

var (
	specMeta = &jsonrpc.Spec{Kind: jsonrpc.FieldMeta, Label: "_meta", Fields: fields{
		"traceparent": {Kind: jsonrpc.FieldTag, Label: labelTraceparent},
		"tracestate":  {Kind: jsonrpc.FieldTag, Label: labelTracestate},
	}}
	// metaSpecs: each spec of client params (paramsSpec with paths) with
	// params._meta located too.
	metaSpecs = func() map[*jsonrpc.Spec]*jsonrpc.Spec {
		out := map[*jsonrpc.Spec]*jsonrpc.Spec{}
		add := func(s *jsonrpc.Spec) {
			if out[s] == nil {
				c := *s
				c.Fields = maps.Clone(s.Fields)
				if c.Fields == nil {
					c.Fields = fields{}
				}
				c.Fields["_meta"] = specMeta
				out[s] = &c
			}
		}
		for _, s := range []*jsonrpc.Spec{specSessionParam, specCancelRequest, specElicitation, specUpdate} {
			add(s)
		}
		for _, s := range pathParams {
			add(s)
		}
		return out
	}()
	w3c = propagation.TraceContext{}
)

// tracerOf is the relay's tracer from Config.Tracing (nil: off).
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// traceParent is the trace context a client message names: its
// params._meta (traceparent, tracestate), else parent (a POST's header).
func traceParent(m *jsonrpc.Message, parent trace.SpanContext) trace.SpanContext {
	idx := metaIndex(m)
	if idx < 0 {
		return parent
	}
	var tp, ts string
	for _, f := range m.Fields[idx+1:] {
		if f.Kind != jsonrpc.FieldTag || f.Parent != idx {
			continue
		}
		if v, ok := m.String(f); ok && f.Label == labelTraceparent {
			tp = v
		} else if ok && f.Label == labelTracestate {
			ts = v
		}
	}
	if sc := ParseTraceparent(tp, ts); sc.IsValid() {
		return sc
	}
	return parent
}

// metaIndex is the index in m.Fields of params._meta (-1: none).
func metaIndex(m *jsonrpc.Message) int {
	for i, f := range m.Fields {
		if f.Kind == jsonrpc.FieldMeta && f.Parent == -1 {
			return i
		}
	}
	return -1
}

// ParseTraceparent reads a W3C traceparent (and tracestate) header value
// for HandleScannedTrace; an invalid one is the zero SpanContext.
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

// startSpan starts the span of client request m (nil: tracing off, or not
// a request), a child of the context the client names.
func (cr *clientReader) startSpan(m *jsonrpc.Message) trace.Span {
	c := cr.c
	t := c.relay.tracer
	if t == nil || m.Kind != jsonrpc.KindRequest {
		return nil
	}
	ctx := context.Background()
	if sc := traceParent(m, cr.traceParent); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	_, span := t.Start(ctx, m.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String(attrRPCSystem, "jsonrpc"),
		attribute.String(attrRPCMethod, m.Method),
		attribute.String(attrRequestID, string(m.ID)),
		attribute.String(attrTenant, c.tenant),
		attribute.String(attrAgent, c.ag.name),
		attribute.String(attrTransport, c.transport),
	))
	return span
}

// routedSpan adds what routing chose to a request's span.
func routedSpan(span trace.Span, rt *routed, m *jsonrpc.Message) {
	if span == nil {
		return
	}
	if rt.link != nil && rt.link.p != nil {
		span.SetAttributes(attribute.String(attrProcess, rt.link.p.String()))
	}
	s := rt.sess
	if s == nil {
		s = rt.h.attach
	}
	if s != nil {
		span.SetAttributes(attribute.String(attrSession, s.GatewayID))
	} else if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		if id, ok := m.String(f); ok {
			span.SetAttributes(attribute.String(attrSession, id))
		}
	}
}

// failSpan ends a request's span that ended in the gateway with code.
func failSpan(span trace.Span, code int, msg string) {
	if span == nil {
		return
	}
	spanError(span, code, msg)
	span.End()
}

// gatewaySpan ends a request's span the gateway answered itself (an
// error, a take-over, a lost session closed).
func gatewaySpan(span trace.Span) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String(attrOutcome, "answered_by_gateway"))
	span.End()
}

func spanError(span trace.Span, code int, msg string) {
	span.SetAttributes(attribute.Int(attrErrorCode, code), attribute.String(attrErrorMessage, msg))
	span.SetStatus(codes.Error, msg)
}

// answerSpan records an error answer's code and message on span.
func answerSpan(span trace.Span, m *jsonrpc.Message) {
	if span == nil || !m.IsError {
		return
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(m.Payload, &e)
	spanError(span, e.Code, e.Message)
}

// traceparentEdit sets the forwarded request's params._meta.traceparent to
// span: the value replaced, the key added to _meta, or _meta added to
// params. Everything else in _meta passes as it is. No edit: params is not
// an object, or its _meta is not one.
func traceparentEdit(m *jsonrpc.Message, span trace.Span) (jsonrpc.Edit, bool) {
	if span == nil {
		return jsonrpc.Edit{}, false
	}
	sc := span.SpanContext()
	tp := make([]byte, 0, 64)
	tp = append(tp, `"00-`...)
	tp = append(tp, sc.TraceID().String()...)
	tp = append(tp, '-')
	tp = append(tp, sc.SpanID().String()...)
	tp = append(tp, '-')
	tp = append(tp, sc.TraceFlags().String()...)
	tp = append(tp, '"')
	idx := metaIndex(m)
	if idx < 0 {
		if len(m.Payload) == 0 || m.Payload[0] != '{' {
			return jsonrpc.Edit{}, false
		}
		at := m.PayloadPos[0] + 1
		repl := append(append([]byte(`"_meta":{"traceparent":`), tp...), '}')
		if !emptyObject(m.Payload) {
			repl = append(repl, ',')
		}
		return jsonrpc.Edit{Start: at, End: at, Repl: repl}, true
	}
	for _, f := range m.Fields[idx+1:] {
		if f.Parent == idx && f.Label == labelTraceparent {
			return jsonrpc.Edit{Start: f.Start, End: f.End, Repl: tp}, true
		}
	}
	meta := m.Fields[idx]
	if m.Raw[meta.Start] != '{' {
		return jsonrpc.Edit{}, false
	}
	repl := append([]byte(`"traceparent":`), tp...)
	if !emptyObject(m.Raw[meta.Start:meta.End]) {
		repl = append(repl, ',')
	}
	return jsonrpc.Edit{Start: meta.Start + 1, End: meta.Start + 1, Repl: repl}, true
}

// emptyObject reports whether obj, a JSON object's text, has no members.
func emptyObject(obj []byte) bool {
	for _, b := range obj[1 : len(obj)-1] {
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			return false
		}
	}
	return true
}

// childSpan starts a span under parent (nil: tracing off, none).
func (r *Relay) childSpan(parent trace.Span, name string, opts ...trace.SpanStartOption) trace.Span {
	if r.tracer == nil || parent == nil {
		return nil
	}
	_, s := r.tracer.Start(trace.ContextWithSpan(context.Background(), parent), name, opts...)
	return s
}

// poolWait starts the span of a wait for a pool process under the request
// span ctx carries (nil: none); end it with endWait.
func (r *Relay) poolWait(ctx context.Context) trace.Span {
	if r.tracer == nil {
		return nil
	}
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return nil
	}
	_, s := r.tracer.Start(ctx, SpanPoolWait)
	return s
}

func endWait(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

// endSpan ends a request's span: its turn's too, if it is a traced prompt.
// An answer (answerSpan) has set its status; ended unanswered, it gets
// the reason given.
func (r *outReq) endSpan() {
	if r.span == nil {
		return
	}
	if !r.answered {
		r.span.SetStatus(codes.Error, "ended without the agent's answer")
	}
	r.span.End()
}

// agentReqSpan starts the span of an agent request to the client, under
// the session's turn (nil: tracing off, or no turn traced).
func (r *Relay) agentReqSpan(s *Session, m *jsonrpc.Message) trace.Span {
	turn := turnSpan(s.curTurn())
	if r.tracer == nil || turn == nil {
		return nil
	}
	return r.childSpan(turn, m.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(attrRPCSystem, "jsonrpc"),
		attribute.String(attrRPCMethod, m.Method),
		attribute.String(attrRequestID, string(m.ID)),
		attribute.String(attrSession, s.GatewayID),
	))
}

// fsSpan starts the span of the file stand-in serving m.
func (r *Relay) fsSpan(s *Session, m *jsonrpc.Message) trace.Span {
	turn := turnSpan(s.curTurn())
	if r.tracer == nil || turn == nil {
		return nil
	}
	return r.childSpan(turn, SpanFsStandIn, trace.WithAttributes(attribute.String(attrRPCMethod, m.Method)))
}

// endFsSpan ends the stand-in's span with its outcome.
func endFsSpan(s trace.Span, outcome string, code int) {
	if s == nil {
		return
	}
	s.SetAttributes(attribute.String(attrOutcome, outcome))
	if code != 0 {
		s.SetAttributes(attribute.Int(attrErrorCode, code))
		s.SetStatus(codes.Error, outcome)
	}
	s.End()
}

// observeLatency records v in a latency histogram, with the trace of span (nil:
// none) as its exemplar when that is sampled, so that a latency on a
// dashboard leads to the trace behind it (exemplars are exposed when
// /metrics is scraped as OpenMetrics).
func observeLatency(o prometheus.Observer, v float64, span trace.Span) {
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

// withTrace is log with the trace_id and span_id of span (nil, or not
// sampled and not from a client's trace: log itself), for lines about the
// request it traces.
func withTrace(log *slog.Logger, span trace.Span) *slog.Logger {
	if span == nil {
		return log
	}
	sc := span.SpanContext()
	if !sc.IsValid() {
		return log
	}
	return log.With("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
}

// spanSession names the session of the request in hand on its span, if it
// is traced (c.handleMu held): for requests the gateway answers itself.
func (cr *clientReader) spanSession(id string) {
	if cr.rspan != nil {
		cr.rspan.SetAttributes(attribute.String(attrSession, id))
	}
}

// turnLog is log with the trace of the session's traced turn, if one runs
// (s may be nil): for a line about what the agent does in that turn.
func (s *Session) turnLog(log *slog.Logger) *slog.Logger {
	return withTrace(log, turnSpan(s.curTurn()))
}

// turnSpan is the span of a traced turn (nil: t is nil, or not traced).
func turnSpan(t *observe.Turn) trace.Span {
	if t == nil {
		return nil
	}
	return t.Span
}

// reqLog is the log for a line about the client request in hand: with its
// trace during handleCall, else the connection's (c.handleMu held).
func (cr *clientReader) reqLog() *slog.Logger {
	c := cr.c
	if cr.rspan == nil {
		return c.log
	}
	if cr.rlog == nil {
		cr.rlog = withTrace(c.log, cr.rspan)
	}
	return cr.rlog
}
