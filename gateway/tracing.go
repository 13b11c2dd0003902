package gateway

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redact"
)

// tracing is where traces go, from observability.tracing or the standard
// OTEL_EXPORTER_OTLP_* variables (the file's endpoint wins). A nil
// *tracing is tracing off: no exporter, no goroutine, no connection.
type tracing struct {
	cfg      *config.Tracing // nil: the OTEL_* variables configure the exporter
	protocol string          // grpc, http/protobuf or http/json
	// agentVars are the exporter's OTEL_* variables agent processes get;
	// attrs is the operator's OTEL_RESOURCE_ATTRIBUTES.
	agentVars map[string]string
	attrs     string
	tp        *sdktrace.TracerProvider // startTracing's; nil in a tracing only read (newTracing)
}

// Variables of the OTel specification the gateway reads itself (the SDK
// reads the rest: headers, timeouts, sampler, batch processor).
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envHeaders        = "OTEL_EXPORTER_OTLP_HEADERS"
	envTracesHeaders  = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
	envAttributes     = "OTEL_RESOURCE_ATTRIBUTES"
	envServiceName    = "OTEL_SERVICE_NAME"
)

// newTracing reads where traces go; nil when tracing is off: no endpoint,
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none.
func newTracing(cfg *config.Config, getenv func(string) string) (*tracing, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return nil, nil
	}
	t := &tracing{agentVars: map[string]string{}, attrs: getenv(envAttributes)}
	if getenv(envServiceName) != "" {
		t.agentVars[envServiceName] = "" // the gateway's name, inherited, would make agents' spans its own
	}
	if c := cfg.Observability.Tracing; c.Endpoint != "" {
		t.cfg = &c
		t.protocol = cmp.Or(c.Protocol, "http/protobuf")
		t.agentVars[envEndpoint] = c.TracingURL()
		t.agentVars[envProtocol] = t.protocol
		if len(c.Headers) > 0 {
			t.agentVars[envHeaders] = encodeList(c.Headers)
		} else {
			t.copyEnv(getenv, envHeaders, envTracesHeaders)
		}
		return t, nil
	}
	if getenv(envEndpoint) == "" && getenv(envTracesEndpoint) == "" {
		return nil, nil
	}
	t.protocol = cmp.Or(getenv(envTracesProtocol), getenv(envProtocol), "http/protobuf")
	switch t.protocol {
	case "grpc", "http/protobuf", "http/json":
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q is not grpc, http/protobuf or http/json", t.protocol)
	}
	t.copyEnv(getenv, envEndpoint, envTracesEndpoint, envHeaders, envTracesHeaders)
	t.agentVars[envProtocol] = t.protocol
	return t, nil
}

// copyEnv passes the variables that are set on to agents.
func (t *tracing) copyEnv(getenv func(string) string, keys ...string) {
	for _, k := range keys {
		if v := getenv(k); v != "" {
			t.agentVars[k] = v
		}
	}
}

// startTracing reads where traces go and builds the tracer provider; nil
// when tracing is off.
func startTracing(cfg *config.Config, version string, red *redact.Redactor, log *slog.Logger) (*tracing, error) {
	t, err := newTracing(cfg, os.Getenv)
	if t == nil || err != nil {
		return nil, err
	}
	if t.tp, err = t.provider(context.Background(), version, red, log); err != nil {
		return nil, err
	}
	log.Info("tracing on", "protocol", t.protocol, "endpoint_from", map[bool]string{true: "observability.tracing", false: "OTEL_* variables"}[t.cfg != nil])
	return t, nil
}

// agentEnv is the OTEL_* environment of a process of agent for tenant (""
// = a process of no one tenant): the gateway's exporter settings, and
// resource attributes naming the agent and tenant after the operator's.
// Nil when tracing is off.
func (t *tracing) agentEnv(agent, tenant string) map[string]string {
	if t == nil {
		return nil
	}
	env := maps.Clone(t.agentVars)
	attrs := []string{"acpgate.agent=" + escapeValue(agent)}
	if tenant != "" {
		attrs = append(attrs, "acpgate.tenant="+escapeValue(tenant))
	}
	if t.attrs != "" {
		attrs = append([]string{t.attrs}, attrs...)
	}
	env[envAttributes] = strings.Join(attrs, ",")
	return env
}

// withTracingEnv is an agent's environment: the tracing variables, under
// the ones the operator configured for the agent (those win).
func withTracingEnv(tracingEnv, agentEnv map[string]string) map[string]string {
	if len(tracingEnv) == 0 {
		return agentEnv
	}
	env := maps.Clone(tracingEnv)
	maps.Copy(env, agentEnv)
	return env
}

// provider builds the SDK's tracer provider: the OTLP exporter behind a
// batch span processor (OTEL_BSP_* apply), the sampler of
// OTEL_TRACES_SAMPLER (the SDK reads it, as no sampler is given), the
// span limits (spanLimits) and a resource naming this replica. Its
// Shutdown flushes.
func (t *tracing) provider(ctx context.Context, version string, red *redact.Redactor, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	exp, err := t.exporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if red != nil { // no secret leaves in a span
		exp = redactingExporter{SpanExporter: exp, r: red}
	}
	res, err := tracingResource(ctx, version)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: export failed", "err", err) }))
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithRawSpanLimits(spanLimits(os.Getenv))), nil
}

// spanLimits bounds what one span holds, whatever a client or an agent
// sends: the SDK's defaults leave a value's length unlimited. A limit
// variable of the OTel specification that is set wins, as the SDK reads
// it (a negative value: unlimited); an invalid one is ignored.
func spanLimits(getenv func(string) string) sdktrace.SpanLimits {
	limit := func(def int, keys ...string) int {
		for _, k := range keys {
			if v := getenv(k); v != "" {
				if n, err := strconv.Atoi(v); err == nil {
					return n
				}
				return def
			}
		}
		return def
	}
	return sdktrace.SpanLimits{
		AttributeValueLengthLimit:   limit(256, "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"),
		AttributeValueDepthLimit:    sdktrace.DefaultAttributeValueDepthLimit,
		AttributeCountLimit:         limit(32, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"),
		EventCountLimit:             limit(16, "OTEL_SPAN_EVENT_COUNT_LIMIT"),
		LinkCountLimit:              limit(8, "OTEL_SPAN_LINK_COUNT_LIMIT"),
		AttributePerEventCountLimit: limit(16, "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT"),
		AttributePerLinkCountLimit:  limit(16, "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"),
	}
}

// exporter is the OTLP span exporter. Neither kind connects before its
// first export.
func (t *tracing) exporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if t.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if t.cfg != nil {
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.cfg.TracingURL()))
			if len(t.cfg.Headers) > 0 { // else OTEL_EXPORTER_OTLP_HEADERS applies
				opts = append(opts, otlptracegrpc.WithHeaders(t.cfg.Headers))
			}
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	if t.cfg != nil {
		u, err := url.Parse(t.cfg.TracingURL())
		if err != nil {
			return nil, err
		}
		u.Path = path.Join("/", u.Path, "v1/traces") // a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		if len(t.cfg.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(t.cfg.Headers))
		}
	}
	return otlptracehttp.New(ctx, opts...)
}

// tracingResource names the gateway: service.name acpgate, its version
// and this replica (the host name: a pod's name), under what
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say.
func tracingResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", "acpgate"), attribute.String("service.version", version)}
	if host, err := os.Hostname(); err == nil {
		attrs = append(attrs, attribute.String("service.instance.id", fmt.Sprintf("%s/%d", host, os.Getpid())))
	}
	return resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
}

// TracerProvider is the gateway's tracer provider; nil when tracing is
// off.
func (s *Server) TracerProvider() trace.TracerProvider {
	if s.tracing == nil || s.tracing.tp == nil {
		return nil
	}
	return s.tracing.tp
}

// close flushes the spans still queued and stops the exporter, within 5s
// even when ctx ended (a drain that took all its time still gets its spans
// out). A nil t does nothing.
func (t *tracing) close(ctx context.Context, log *slog.Logger) {
	if t == nil || t.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: the last spans were not exported", "err", err)
	}
}

// encodeList is vars as an OTEL_* list: k=v pairs joined by commas, each
// value percent-encoded.
func encodeList(vars map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(vars)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + escapeValue(vars[k]))
	}
	return b.String()
}

// escapeValue percent-encodes v for an OTEL_* list.
func escapeValue(v string) string { return strings.ReplaceAll(url.QueryEscape(v), "+", "%20") }
