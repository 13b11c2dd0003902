package proxy

import (
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
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

// startSpan starts the span of client request m (nil: tracing off, or not
// a request), a child of the context the client names.
func (cr *clientReader) startSpan(m *jsonrpc.Message) trace.Span {
	c := cr.c
	if c.relay.tracer == nil || m.Kind != jsonrpc.KindRequest {
		return nil
	}
	return tracing.StartRequest(c.relay.tracer, tracing.ParentOf(m, cr.traceParent), tracing.Request{Method: m.Method,
		ID: string(m.ID), Tenant: c.tenant, Agent: c.ag.name, Transport: c.transport})
}

// endRequestSpan ends the span of the request in hand (handleCall) unless
// an outReq carries it (its end ends it): the gateway answered the request
// itself (with an error, answerError recorded it on the span).
func (cr *clientReader) endRequestSpan() {
	if !cr.rcarried {
		tracing.AnsweredByGateway(cr.rspan)
	}
	cr.rspan, cr.rlog, cr.rcarried = nil, nil, false
}

// routedSpan adds what routing chose to a request's span.
func (cr *clientReader) routedSpan(span trace.Span, rt *routed, m *jsonrpc.Message) {
	if span == nil {
		return
	}
	if rt.side != nil && rt.side.p != nil {
		span.SetAttributes(tracing.String(tracing.AttrProcess, rt.side.p.String()))
	}
	s := rt.sess
	if s == nil {
		s = rt.h.loaded
	}
	if s != nil {
		span.SetAttributes(tracing.String(tracing.AttrSession, s.GatewayID))
	} else if f, ok := m.FieldOf(jsonrpc.FieldSessionID, -1); ok {
		id, _ := m.String(f)
		cr.spanSessionID(span, id)
	}
}

// answerSpan records the agent's answer m on the request's span: an
// error, the session a request created (nil: none).
func (r *outReq) answerSpan(m *jsonrpc.Message, created *Session) {
	if r.span == nil {
		return
	}
	r.answered = true
	if m.IsError {
		tracing.Answer(r.span, m.Payload)
	}
	if created != nil {
		tracing.Set(r.span, tracing.AttrSession, created.GatewayID)
	}
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
// the session's turn (nil: tracing off, or no turn traced; s may be nil).
func (r *Relay) agentReqSpan(s *Session, m *jsonrpc.Message) trace.Span {
	turn := tracing.TurnSpan(s.curTurn())
	if turn == nil {
		return nil
	}
	return tracing.AgentRequest(r.tracer, turn, m.Method, string(m.ID), s.GatewayID)
}

// fsSpan starts the span of the file stand-in serving m.
func (r *Relay) fsSpan(s *Session, m *jsonrpc.Message) trace.Span {
	return tracing.Child(r.tracer, tracing.TurnSpan(s.curTurn()), tracing.SpanFsStandIn,
		trace.WithAttributes(tracing.String(tracing.AttrRPCMethod, m.Method)))
}

// spanSession names the session of the request in hand on its span, if it
// is traced (c.handleMu held): for requests the gateway answers itself.
func (cr *clientReader) spanSession(id string) {
	cr.spanSessionID(cr.rspan, id)
}

// spanSessionID names session id on span (nil: not traced) only if it
// opens in c's scope: an ID the gateway issued. Any other, a client's
// guess of any size, is only marked unknown.
func (cr *clientReader) spanSessionID(span trace.Span, id string) {
	c := cr.c
	if span == nil {
		return
	}
	if _, err := c.relay.sealer.Open(c.scope, id); err != nil {
		span.SetAttributes(attribute.Bool(tracing.AttrSessionUnknown, true))
		return
	}
	span.SetAttributes(tracing.String(tracing.AttrSession, id))
}

// turnLog is log with the trace of the session's traced turn, if one runs
// (s may be nil): for a line about what the agent does in that turn.
func (s *Session) turnLog(log *slog.Logger) *slog.Logger {
	return tracing.WithTrace(log, tracing.TurnSpan(s.curTurn()))
}

// reqLog is the log for a line about the client request in hand: with its
// trace during handleCall, else the connection's (c.handleMu held).
func (cr *clientReader) reqLog() *slog.Logger {
	c := cr.c
	if cr.rspan == nil {
		return c.log
	}
	if cr.rlog == nil {
		cr.rlog = tracing.WithTrace(c.log, cr.rspan)
	}
	return cr.rlog
}
