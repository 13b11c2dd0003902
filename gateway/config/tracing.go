package config

import (
	"net"
	"net/url"
	"strings"
)

// Tracing configures the OpenTelemetry trace exporter. The standard
// OTEL_EXPORTER_OTLP_* variables turn it on as well; Endpoint, when set,
// wins over them.
type Tracing struct {
	// Endpoint is the OTLP receiver: a URL (http://collector:4318) or
	// host:port (plain http). "" = the OTEL_* variables decide.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http/protobuf" (the default) or "grpc".
	Protocol string `yaml:"protocol"`
	// Headers are sent with every export (an API key, say); none:
	// OTEL_EXPORTER_OTLP_HEADERS applies.
	Headers map[string]string `yaml:"headers"`
}

// TracingProtocols are the OTLP protocols the gateway speaks.
var TracingProtocols = []string{"http/protobuf", "grpc"}

// TracingURL is Endpoint as a URL: host:port becomes http://host:port.
func (t Tracing) TracingURL() string {
	if t.Endpoint == "" || strings.Contains(t.Endpoint, "://") {
		return t.Endpoint
	}
	return "http://" + t.Endpoint
}

// validate checks observability.tracing.
func (t *Tracing) validate(add addFunc) {
	if p := t.Protocol; p != "" && p != "http/protobuf" && p != "grpc" {
		add("observability.tracing.protocol", "%q is not one of %s", p, strings.Join(TracingProtocols, ", "))
	}
	if t.Endpoint == "" {
		if len(t.Headers) > 0 || t.Protocol != "" {
			add("observability.tracing.endpoint", "must be set with protocol or headers")
		}
		return
	}
	if !strings.Contains(t.Endpoint, "://") {
		if _, _, err := net.SplitHostPort(t.Endpoint); err != nil {
			add("observability.tracing.endpoint", "%q is neither a URL nor host:port: %v", t.Endpoint, err)
		}
		return
	}
	u, err := url.Parse(t.Endpoint)
	switch {
	case err != nil:
		add("observability.tracing.endpoint", "%q is not a URL: %v", t.Endpoint, err)
	case u.Scheme != "http" && u.Scheme != "https":
		add("observability.tracing.endpoint", "%q: the scheme must be http or https", t.Endpoint)
	case u.Host == "":
		add("observability.tracing.endpoint", "%q has no host", t.Endpoint)
	}
}
