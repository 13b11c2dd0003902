package config

import (
	"strings"
	"testing"
)

func TestTracingValidate(t *testing.T) {
	for _, tc := range []struct {
		tr   Tracing
		want string // "" = valid
	}{
		{Tracing{}, ""},
		{Tracing{Endpoint: "http://collector:4318"}, ""},
		{Tracing{Endpoint: "https://collector.example/otlp", Headers: map[string]string{"k": "v"}}, ""},
		{Tracing{Endpoint: "collector:4317", Protocol: "grpc"}, ""},
		{Tracing{Endpoint: "collector", Protocol: "grpc"}, "neither a URL nor host:port"},
		{Tracing{Endpoint: "ftp://collector:21"}, "scheme"},
		{Tracing{Endpoint: "http://"}, "no host"},
		{Tracing{Endpoint: "http://c:4318", Protocol: "http/json"}, "observability.tracing.protocol"},
		{Tracing{Protocol: "grpc"}, "must be set"},
	} {
		c := Default()
		c.Observability.Tracing = tc.tr
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.tr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: err = %v, want %q", tc.tr, err, tc.want)
		}
	}
	if u := (Tracing{Endpoint: "c:4318"}).TracingURL(); u != "http://c:4318" {
		t.Errorf("TracingURL = %q", u)
	}
}
