// Package tracing puts what happens in a session's turn on the turn's span
// (the span of its session/prompt request): the agent's first update, a
// span for each tool call from tool_call to its final tool_call_update, and
// the count of updates. Turns that are not traced cost a map look-up.
package tracing

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/observe"
)

// Span names and attributes of a turn's children.
const (
	SpanFirstUpdate = "acpgate.first_update"
	SpanToolCall    = "acpgate.tool_call"

	attrUpdates    = "acpgate.session.updates"
	attrToolCallID = "acpgate.tool_call.id"
	attrToolKind   = "acpgate.tool_call.kind"
	attrToolTitle  = "acpgate.tool_call.title"
	attrToolStatus = "acpgate.tool_call.status"
)

// Turns traces turns as an observer.
type Turns struct {
	tracer trace.Tracer
	turns  sync.Map // *observe.Turn → *turnTrace, from TurnStarted to TurnEnded
}

// New traces turns with tracer.
func New(tracer trace.Tracer) *Turns { return &Turns{tracer: tracer} }

// Wants says which events it takes (observe.Set).
func (t *Turns) Wants(k observe.Kind) bool {
	return k == observe.TurnStarted || k == observe.Update || k == observe.TurnEnded
}

// Observe follows a traced turn.
func (t *Turns) Observe(e *observe.Event) {
	if e.Turn == nil || e.Turn.Span == nil {
		return
	}
	switch e.Kind {
	case observe.TurnStarted:
		t.turns.Store(e.Turn, &turnTrace{tracer: t.tracer, span: e.Turn.Span, sent: e.Turn.Start})
	case observe.Update:
		if tt, ok := t.turns.Load(e.Turn); ok {
			tt.(*turnTrace).update(e.Params, e.UpdateKind)
		}
	case observe.TurnEnded:
		if tt, ok := t.turns.LoadAndDelete(e.Turn); ok {
			tt.(*turnTrace).end()
		}
	}
}

// maxOpenTools bounds the tool spans one turn keeps open: past it, a tool
// call an agent starts gets no span (its updates still count).
const maxOpenTools = 256

// turnTrace is what a turn's span gathers while it runs: the updates, the
// first one's arrival, the tool calls not yet final.
type turnTrace struct {
	tracer  trace.Tracer
	span    trace.Span
	sent    time.Time
	updates atomic.Int64
	first   atomic.Bool
	mu      sync.Mutex
	tools   map[string]trace.Span // by toolCallId, until final
	ended   bool                  // the turn's span has ended: no more tool spans
}

func (t *turnTrace) child(name string, opts ...trace.SpanStartOption) trace.Span {
	_, s := t.tracer.Start(trace.ContextWithSpan(context.Background(), t.span), name, opts...)
	return s
}

// update counts a session/update (params, kind: its sessionUpdate tag) on
// the turn's span: a tool_call starts a tool span, a tool_call_update with
// a final status ends it.
func (t *turnTrace) update(params, kind []byte) {
	t.updates.Add(1)
	if t.first.CompareAndSwap(false, true) {
		t.child(SpanFirstUpdate, trace.WithTimestamp(t.sent)).End()
	}
	if string(kind) != "tool_call" && string(kind) != "tool_call_update" {
		return
	}
	var p struct {
		Update struct {
			ToolCallID string `json:"toolCallId"`
			Kind       string `json:"kind"`
			Title      string `json:"title"`
			Status     string `json:"status"`
		} `json:"update"`
	}
	if json.Unmarshal(params, &p) != nil || p.Update.ToolCallID == "" {
		return
	}
	u := p.Update
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	span := t.tools[u.ToolCallID]
	if span == nil && string(kind) == "tool_call" && len(t.tools) < maxOpenTools {
		span = t.child(SpanToolCall, trace.WithAttributes(String(attrToolCallID, u.ToolCallID)))
		if t.tools == nil {
			t.tools = map[string]trace.Span{}
		}
		t.tools[u.ToolCallID] = span
	}
	if span == nil {
		return
	}
	if u.Kind != "" {
		span.SetAttributes(String(attrToolKind, u.Kind))
	}
	if u.Title != "" {
		span.SetAttributes(String(attrToolTitle, u.Title))
	}
	if u.Status != "" {
		span.SetAttributes(String(attrToolStatus, u.Status))
	}
	if u.Status == "completed" || u.Status == "failed" {
		if u.Status == "failed" {
			span.SetStatus(codes.Error, "the tool call failed")
		}
		span.End()
		delete(t.tools, u.ToolCallID)
	}
}

// end ends the tool spans still open (the turn ended first) and sets the
// update count.
func (t *turnTrace) end() {
	t.mu.Lock()
	for _, s := range t.tools {
		s.SetAttributes(attribute.String(attrToolStatus, "unfinished"))
		s.End()
	}
	t.tools, t.ended = nil, true
	t.mu.Unlock()
	t.span.SetAttributes(attribute.Int64(attrUpdates, t.updates.Load()))
}
