package jaeger

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/acpgate/acpgate/test/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m, nil) }

// TestSmoke sends a parent and a child span over each OTLP protocol and
// reads them back through the query API: the harness works.
func TestSmoke(t *testing.T) {
	j := Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		proto string
		exp   func() (sdktrace.SpanExporter, error)
	}{
		{"http", func() (sdktrace.SpanExporter, error) {
			return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPHTTP()+"/v1/traces"))
		}},
		{"grpc", func() (sdktrace.SpanExporter, error) {
			return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(j.OTLPGRPC()))
		}},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			exp, err := tc.exp()
			if err != nil {
				t.Fatal(err)
			}
			service := "jaeger-smoke-" + tc.proto + "-" + harness.RandomHex(t, 4)
			res := resource.NewSchemaless(attribute.String("service.name", service), attribute.String("smoke.proto", tc.proto))
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
			pctx, parent := tp.Tracer("smoke").Start(ctx, "parent")
			_, child := tp.Tracer("smoke").Start(pctx, "child")
			child.SetAttributes(attribute.Int("n", 7))
			child.End()
			parent.End()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil { // flushes
				t.Fatal(err)
			}
			trs := j.Wait(t, service, 20*time.Second, func(trs []Trace) bool { return len(trs) == 1 && len(trs[0].Spans) == 2 })
			tr, err := j.Trace(trs[0].TraceID)
			if err != nil {
				t.Fatal(err)
			}
			p, okP := tr.Span("parent")
			c, okC := tr.Span("child")
			if !okP || !okC || c.Parent() != p.SpanID || p.Parent() != "" || tr.TraceID != parent.SpanContext().TraceID().String() {
				t.Fatalf("trace %+v", tr)
			}
			if v, _ := c.Tag("n"); v != float64(7) {
				t.Errorf("child's tag n = %v (%T)", v, v)
			}
			if pr := tr.Process(c); pr.ServiceName != service {
				t.Errorf("process %+v", pr)
			} else if v, _ := pr.Tag("smoke.proto"); v != tc.proto {
				t.Errorf("process tag smoke.proto = %v", v)
			}
			if _, err := j.Trace("0123456789abcdef0123456789abcdef"); err != ErrNotFound {
				t.Errorf("an unknown trace: %v", err)
			}
		})
	}
}

// TestVersion: Version is the release test/jaeger's go.mod requires (the
// cache file is named after it).
func TestVersion(t *testing.T) {
	b, err := os.ReadFile("../../jaeger/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\tgithub.com/jaegertracing/jaeger "+Version+" ") {
		t.Fatalf("test/jaeger/go.mod does not require github.com/jaegertracing/jaeger %s", Version)
	}
}
