// Package tracing checks the gateway's OpenTelemetry set-up against a real
// trace backend, Jaeger v2 (test/internal/jaeger): what the gateway's
// tracer provider exports arrives, over either protocol, with the
// gateway's resource.
package tracing

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/acpgate/acpgate/gateway"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/jaeger"
)

func TestMain(m *testing.M) { harness.Main(m, nil) }

// otelVars would steer the set-up; the test clears them.
var otelVars = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER"}

func TestGatewayExportsToJaeger(t *testing.T) {
	j := jaeger.Start(t)
	for _, tc := range []struct {
		name, protocol, endpoint string
		env                      bool // OTEL_* variables, not the file
	}{
		{"file/http", "http/protobuf", j.OTLPHTTP(), false},
		{"file/grpc", "grpc", j.OTLPGRPC(), false},
		{"env/http", "http/protobuf", j.OTLPHTTP(), true},
		{"env/grpc", "grpc", j.OTLPGRPC(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range otelVars {
				t.Setenv(k, "")
			}
			service := "acpgate-tracing-" + harness.RandomHex(t, 4)
			t.Setenv("OTEL_SERVICE_NAME", service)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
			cfg := config.Default()
			cfg.Listen = "127.0.0.1:0"
			cfg.Pool.MinIdle = 0
			if tc.env {
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
				t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			} else {
				cfg.Observability.Tracing = config.Tracing{Endpoint: tc.endpoint, Protocol: tc.protocol}
			}
			if !probe(t, cfg) {
				t.Fatal("the span was not sampled")
			}
			trs := j.Wait(t, service, 20*time.Second, func(trs []jaeger.Trace) bool { return len(trs) == 1 })
			sp, ok := trs[0].Span("probe")
			if !ok {
				t.Fatalf("no span probe: %+v", trs[0])
			}
			p := trs[0].Process(sp)
			host, _ := os.Hostname()
			for k, want := range map[string]any{"service.version": "v0.0.0-test", "deployment.environment": "test"} {
				if v, _ := p.Tag(k); v != want {
					t.Errorf("resource %s = %v, want %v", k, v, want)
				}
			}
			if v, _ := p.Tag("service.instance.id"); v == nil || host == "" || len(v.(string)) <= len(host) {
				t.Errorf("resource service.instance.id = %v (host %s)", v, host)
			}
		})
	}
	t.Run("sampler from the environment", func(t *testing.T) {
		for _, k := range otelVars {
			t.Setenv(k, "")
		}
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", j.OTLPHTTP())
		t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
		cfg := config.Default()
		cfg.Listen, cfg.Pool.MinIdle = "127.0.0.1:0", 0
		if probe(t, cfg) {
			t.Fatal("OTEL_TRACES_SAMPLER=always_off, yet the span was sampled")
		}
	})
}

// probe builds a gateway with cfg, makes one span "probe" with its tracer
// provider and shuts the gateway down (which flushes). It reports whether
// the span was sampled.
func probe(t *testing.T, cfg *config.Config) bool {
	t.Helper()
	s, err := gateway.New(gateway.Options{Config: cfg, DemoAgent: []string{"false"}, Version: "v0.0.0-test",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tp := s.TracerProvider()
	if tp == nil {
		t.Fatal("no tracer provider with an endpoint")
	}
	_, span := tp.Tracer("test").Start(context.Background(), "probe")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	return span.SpanContext().IsSampled()
}
