package tracing

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/acpgate/acpgate/proxy/observe"
)

func TestTruncate(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("x", MaxValue), strings.Repeat("x", MaxValue+1),
		strings.Repeat("é", MaxValue), strings.Repeat("€", MaxValue), strings.Repeat("😀", MaxValue)} {
		got := Truncate(s)
		if len(got) > MaxValue || !utf8.ValidString(got) {
			t.Errorf("Truncate of %d bytes = %d bytes, valid UTF-8 %v", len(s), len(got), utf8.ValidString(got))
		}
		if len(s) <= MaxValue && got != s {
			t.Errorf("Truncate changed %q of %d bytes", got, len(s))
		}
		if len(s) > MaxValue && (!strings.HasSuffix(got, "…") || !strings.HasPrefix(s, strings.TrimSuffix(got, "…")) || len(got) < MaxValue-3) {
			t.Errorf("Truncate of %d bytes = %.20q… of %d bytes", len(s), got, len(got))
		}
	}
}

// A turn keeps at most maxOpenTools tool spans open, however many tool
// calls its agent starts without ending them.
func TestTurnBoundsOpenToolSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")
	_, span := tracer.Start(context.Background(), "session/prompt")
	turn := &observe.Turn{Start: time.Now(), Span: span}
	tr := New(tracer)
	tr.Observe(&observe.Event{Kind: observe.TurnStarted, Turn: turn})
	for i := range 2 * maxOpenTools {
		params := fmt.Sprintf(`{"update":{"sessionUpdate":"tool_call","toolCallId":"t%d"}}`, i)
		tr.Observe(&observe.Event{Kind: observe.Update, Turn: turn, UpdateKind: []byte("tool_call"), Params: []byte(params)})
	}
	tr.Observe(&observe.Event{Kind: observe.TurnEnded, Turn: turn})
	n := 0
	for _, s := range rec.Ended() {
		if s.Name() == SpanToolCall {
			n++
		}
	}
	if n != maxOpenTools {
		t.Fatalf("%d tool spans for %d open tool calls, want %d", n, 2*maxOpenTools, maxOpenTools)
	}
}
