package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/acpgate/acpgate/gateway/config"
)

// otelVars are the variables that turn tracing on or shape it; the tests
// clear them so that the environment they run in does not count.
var otelVars = []string{envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol, envHeaders, envTracesHeaders,
	envAttributes, "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER",
	"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT",
	"OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"}

func clearOTel(t *testing.T) {
	for _, k := range otelVars {
		t.Setenv(k, "")
	}
}

func TestTracingOffByDefault(t *testing.T) {
	clearOTel(t)
	// The SDK's default endpoint: an exporter made by mistake would
	// connect here.
	ln, err := net.Listen("tcp", "127.0.0.1:4318")
	if err != nil {
		t.Skipf("127.0.0.1:4318 is taken (%v); the check needs it", err)
	}
	var accepted atomic.Int32
	done := make(chan struct{})
	go func() {
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
	ts := startServer(t, nil)
	if tp := ts.s.TracerProvider(); tp != nil {
		t.Fatalf("TracerProvider = %T, want nil", tp)
	}
	if ts.s.tracing != nil {
		t.Fatal("tracing set up with no endpoint")
	}
	c := ts.dial()
	c.initialize()
	c.prompt(c.newSession(), "hello")
	ts.shutdown()
	ln.Close()
	<-done
	if n := accepted.Load(); n != 0 {
		t.Fatalf("%d connections to the default OTLP port with tracing off", n)
	}
}

func TestTracingFromConfigExportsOnShutdown(t *testing.T) {
	clearOTel(t)
	t.Setenv("OTEL_SERVICE_NAME", "gw-test")
	got := make(chan *http.Request, 10)
	otlp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r
	}))
	defer otlp.Close()
	ts := startServer(t, func(c *config.Config) {
		c.Observability.Tracing = config.Tracing{Endpoint: otlp.URL + "/base", Headers: map[string]string{"X-Key": "a b"}}
	})
	tp := ts.s.TracerProvider()
	if tp == nil {
		t.Fatal("no tracer provider with an endpoint")
	}
	cfg := ts.s.config()
	spec, err := ts.s.agents.spec(cfg, cfg.AgentList()[0])
	if err != nil {
		t.Fatal(err)
	}
	if env := spec.Pool.Agent.Env; env[envEndpoint] != otlp.URL+"/base" || env["ACPGATE_TEST_AGENT"] != "demo" ||
		env[envHeaders] != "X-Key=a%20b" || env[envAttributes] != "acpgate.agent="+cfg.AgentList()[0].Name {
		t.Errorf("agent env = %v", env)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "one")
	span.End()
	ts.shutdown() // flushes
	select {
	case r := <-got:
		if r.URL.Path != "/base/v1/traces" || r.Header.Get("X-Key") != "a b" {
			t.Fatalf("export to %s with X-Key %q", r.URL.Path, r.Header.Get("X-Key"))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown exported nothing")
	}
}

func TestTracingAgentEnv(t *testing.T) {
	clearOTel(t)
	t.Setenv(envEndpoint, "http://collector:4318")
	t.Setenv(envAttributes, "deployment.environment=prod")
	t.Setenv(envHeaders, "api-key=secret")
	t.Setenv(envServiceName, "gateway")
	tr, err := newTracing(config.Default(), os.Getenv)
	if err != nil || tr == nil {
		t.Fatalf("newTracing = %v, %v", tr, err)
	}
	env := tr.agentEnv("claude", "acme corp")
	want := map[string]string{
		envEndpoint:    "http://collector:4318",
		envProtocol:    "http/protobuf",
		envHeaders:     "api-key=secret",
		envServiceName: "",
		envAttributes:  "deployment.environment=prod,acpgate.agent=claude,acpgate.tenant=acme%20corp",
	}
	for k, v := range want {
		if got, ok := env[k]; !ok || got != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if len(env) != len(want) {
		t.Errorf("env = %v", env)
	}
	// The agent's own configuration wins.
	merged := withTracingEnv(env, map[string]string{envEndpoint: "http://mine:4318", "X": "1"})
	if merged[envEndpoint] != "http://mine:4318" || merged["X"] != "1" || merged[envProtocol] != "http/protobuf" {
		t.Errorf("merged = %v", merged)
	}
	if e := tr.agentEnv("claude", ""); strings.Contains(e[envAttributes], "tenant") {
		t.Errorf("no tenant, yet %s", e[envAttributes])
	}
	var off *tracing
	if off.agentEnv("a", "t") != nil || withTracingEnv(nil, map[string]string{"X": "1"})["X"] != "1" {
		t.Error("tracing off changed the environment")
	}
}

func TestTracingSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		cfg  config.Tracing
		on   bool
		prot string
		err  bool
	}{
		{name: "nothing"},
		{name: "traces endpoint", env: map[string]string{envTracesEndpoint: "http://c:4318/v1/traces"}, on: true, prot: "http/protobuf"},
		{name: "grpc", env: map[string]string{envEndpoint: "http://c:4317", envProtocol: "grpc"}, on: true, prot: "grpc"},
		{name: "traces protocol first", env: map[string]string{envEndpoint: "http://c:4317", envProtocol: "http/json",
			envTracesProtocol: "grpc"}, on: true, prot: "grpc"},
		{name: "bad protocol", env: map[string]string{envEndpoint: "http://c:4317", envProtocol: "thrift"}, err: true},
		{name: "disabled", env: map[string]string{envEndpoint: "http://c:4318", "OTEL_SDK_DISABLED": "true"}},
		{name: "exporter none", env: map[string]string{envEndpoint: "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "config", cfg: config.Tracing{Endpoint: "c:4317", Protocol: "grpc"}, on: true, prot: "grpc"},
		{name: "config wins", env: map[string]string{envEndpoint: "http://env:4318", envHeaders: "k=v"}, cfg: config.Tracing{Endpoint: "http://file:4318"},
			on: true, prot: "http/protobuf"},
	} {
		cfg := config.Default()
		cfg.Observability.Tracing = tc.cfg
		tr, err := newTracing(cfg, func(k string) string { return tc.env[k] })
		if (err != nil) != tc.err || (tr != nil) != tc.on {
			t.Errorf("%s: newTracing = %+v, %v", tc.name, tr, err)
			continue
		}
		if tr != nil && tr.protocol != tc.prot {
			t.Errorf("%s: protocol %q, want %q", tc.name, tr.protocol, tc.prot)
		}
		if e := tr.agentEnv("a", ""); tc.name == "config wins" && (e[envEndpoint] != "http://file:4318" || e[envHeaders] != "k=v") {
			t.Errorf("%s: agents get %v", tc.name, tr.agentEnv("a", ""))
		}
	}
}

// TestTracingSandboxedAgentEnv: with the sandbox a process serves one
// tenant, named in its resource attributes; the agent's env still wins.
func TestTracingSandboxedAgentEnv(t *testing.T) {
	clearOTel(t)
	t.Setenv(envEndpoint, "http://collector:4318")
	cfg := config.Default()
	cfg.Tenants = []config.Tenant{{Name: "acme", Root: t.TempDir()}, {Name: "globex", Root: t.TempDir()}}
	cfg.Sandbox.Home = t.TempDir()
	cfg.Agent.Env = map[string]string{envProtocol: "grpc"}
	tr, err := newTracing(cfg, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	l := &launcher{log: slog.New(slog.DiscardHandler)}
	l.cfg.Store(cfg)
	l.setTracing(tr)
	launch, err := l.launch(config.DefaultAgentName, "", "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{envEndpoint + "=http://collector:4318", envProtocol + "=grpc",
		envAttributes + "=acpgate.agent=default,acpgate.tenant=acme"} {
		if !slices.Contains(launch.Env, want) {
			t.Errorf("environment lacks %s: %v", want, launch.Env)
		}
	}
}

// TestTracingProviderBoundsSpans: the gateway's provider bounds a span,
// whatever is put on it: a value's length, the count of attributes and of
// events.
func TestTracingProviderBoundsSpans(t *testing.T) {
	clearOTel(t)
	otlp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer otlp.Close()
	cfg := config.Default()
	cfg.Observability.Tracing = config.Tracing{Endpoint: otlp.URL}
	tr, err := newTracing(cfg, os.Getenv)
	if err != nil || tr == nil {
		t.Fatalf("newTracing = %v, %v", tr, err)
	}
	tp, err := tr.provider(context.Background(), "test", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tp.Shutdown(context.Background()) }()
	rec := tracetest.NewSpanRecorder()
	tp.RegisterSpanProcessor(rec)
	_, span := tp.Tracer("test").Start(context.Background(), "big")
	span.SetAttributes(attribute.String("big", strings.Repeat("x", 1<<20)))
	for i := range 1000 {
		span.SetAttributes(attribute.Int("n"+strconv.Itoa(i), i))
		span.AddEvent("e")
	}
	span.End()
	s := rec.Ended()[0]
	if n := len(s.Attributes()); n > 32 {
		t.Errorf("%d attributes kept", n)
	}
	for _, kv := range s.Attributes() {
		if kv.Key == "big" && len(kv.Value.AsString()) > 256 {
			t.Errorf("a value of %d bytes kept", len(kv.Value.AsString()))
		}
	}
	if n := len(s.Events()); n > 16 {
		t.Errorf("%d events kept", n)
	}
}

// TestTracingSpanLimitsFromEnv: a limit variable the operator sets wins
// over the gateway's bound; an invalid one does not count.
func TestTracingSpanLimitsFromEnv(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	want := sdktrace.SpanLimits{AttributeValueLengthLimit: 256, AttributeValueDepthLimit: sdktrace.DefaultAttributeValueDepthLimit,
		AttributeCountLimit: 32, EventCountLimit: 16, LinkCountLimit: 8, AttributePerEventCountLimit: 16, AttributePerLinkCountLimit: 16}
	if got := spanLimits(getenv); got != want {
		t.Errorf("limits = %+v, want %+v", got, want)
	}
	env["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"] = "1024"
	env["OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"] = "64"
	env["OTEL_ATTRIBUTE_COUNT_LIMIT"] = "8" // the span variable comes first
	env["OTEL_SPAN_EVENT_COUNT_LIMIT"] = "many"
	want.AttributeValueLengthLimit, want.AttributeCountLimit = 1024, 64
	if got := spanLimits(getenv); got != want {
		t.Errorf("limits = %+v, want %+v", got, want)
	}
}
