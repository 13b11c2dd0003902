package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/internal/redact"
)

// TestRedactingExporter: a secret in a span's name, attributes, events or
// status never reaches the exporter; a span without one passes as it is.
func TestRedactingExporter(t *testing.T) {
	const secret = "sk-span-secret-0123456789"
	r := &redact.Redactor{}
	r.Set([]redact.Secret{{Source: "test", Value: secret}})
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(redactingExporter{SpanExporter: mem, r: r}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("test")
	_, clean := tr.Start(context.Background(), "clean", trace.WithAttributes(attribute.String("k", "v")))
	clean.End()
	_, s := tr.Start(context.Background(), "name "+secret)
	s.SetAttributes(attribute.String("line", "key="+secret), attribute.StringSlice("list", []string{"a", secret}),
		attribute.Int("n", 7))
	s.RecordError(errors.New("agent said " + secret))
	s.AddEvent("event " + secret)
	s.End()
	spans := mem.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans exported, want 2", len(spans))
	}
	all := fmt.Sprintf("%+v", spans)
	if strings.Contains(all, secret) {
		t.Errorf("the secret was exported: %s", all)
	}
	got := spans[1]
	if got.Name != "name "+redact.Mark {
		t.Errorf("name %q", got.Name)
	}
	want := map[string]string{"line": "key=" + redact.Mark, "list": `["a","` + redact.Mark + `"]`, "n": "7"}
	for _, kv := range got.Attributes {
		if w, ok := want[string(kv.Key)]; ok && kv.Value.String() != w {
			t.Errorf("attribute %s = %s, want %s", kv.Key, kv.Value.String(), w)
		}
	}
	if len(got.Events) != 2 || !strings.Contains(fmt.Sprint(got.Events[0].Attributes), "agent said "+redact.Mark) ||
		got.Events[1].Name != "event "+redact.Mark {
		t.Errorf("events: %+v", got.Events)
	}
	if spans[0].Name != "clean" || len(spans[0].Attributes) != 1 {
		t.Errorf("the clean span changed: %+v", spans[0])
	}
}
