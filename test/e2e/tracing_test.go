package e2e

import (
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/jaeger"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// otelOff clears the OTEL_* variables the test may run with: they would
// turn tracing on.
var otelOff = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL=",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=", "OTEL_EXPORTER_OTLP_HEADERS=", "OTEL_EXPORTER_OTLP_TRACES_HEADERS=",
	"OTEL_RESOURCE_ATTRIBUTES=", "OTEL_SERVICE_NAME=", "OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER="}

// tracedGateway is a gateway exporting to a fresh Jaeger as service, with
// a short batch delay.
func tracedGateway(t *testing.T, j *jaeger.Jaeger, service string, o gwOpts) *gateway {
	t.Helper()
	o.env = append(append(append([]string(nil), otelOff...), "OTEL_EXPORTER_OTLP_ENDPOINT="+j.OTLPHTTP(),
		"OTEL_SERVICE_NAME="+service, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=e2e"), o.env...)
	return startGateway(t, o)
}

// agentsWithEnv are the gateway's descendants whose environment holds kv.
func agentsWithEnv(g *gateway, kv string) []int {
	below := proctree.Subtree(proctree.Table(), g.Cmd.Process.Pid)
	var pids []int
	for _, pid := range proctree.WithEnv(kv) {
		if _, ok := below[pid]; ok {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestTracingJaeger runs the gateway against Jaeger: the agents get the
// endpoint and their resource attributes; the gateway's spans, once it
// makes some, carry its resource.
func TestTracingJaeger(t *testing.T) {
	j := jaeger.Start(t)
	service := "acpgate-e2e-" + harness.RandomHex(t, 4)
	g := tracedGateway(t, j, service, gwOpts{})
	if g.CountLogs("tracing on", "protocol", "http/protobuf") != 1 {
		t.Errorf("no \"tracing on\" in the log")
	}
	c, sid := dialSession(t, g, t.TempDir())
	promptOK(t, c, sid, "hello")
	for _, kv := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLPHTTP(), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=e2e,acpgate.agent=default", "OTEL_SERVICE_NAME="} {
		if len(agentsWithEnv(g, kv)) == 0 {
			t.Errorf("no agent process has %s", kv)
		}
	}
	c.Close()
	g.Stop(syscall.SIGTERM) // flushes
	trs, err := j.Traces(service)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range trs {
		for _, s := range tr.Spans {
			p := tr.Process(s)
			for _, k := range []string{"service.version", "service.instance.id", "deployment.environment"} {
				if _, ok := p.Tag(k); !ok {
					t.Errorf("span %s: the gateway's resource lacks %s: %+v", s.OperationName, k, p)
				}
			}
		}
	}
}

// TestTracingOff: with no endpoint nothing is exported, no connection is
// made (to the SDK's default ports either) and agents get no OTEL_*
// variables of the gateway's.
func TestTracingOff(t *testing.T) {
	var accepted atomic.Int32
	for _, addr := range []string{"127.0.0.1:4317", "127.0.0.1:4318"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("%s is taken (%v); the check needs it", addr, err)
		}
		done := make(chan struct{})
		go func() { // ends when the cleanup closes ln
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
		t.Cleanup(func() { ln.Close(); <-done })
	}
	g := startGateway(t, gwOpts{env: otelOff})
	c, sid := dialSession(t, g, t.TempDir())
	promptOK(t, c, sid, "hello")
	if pids := agentsWithEnv(g, "OTEL_RESOURCE_ATTRIBUTES=acpgate.agent=default"); len(pids) > 0 {
		t.Errorf("agents %v got tracing variables with tracing off", pids)
	}
	c.Close()
	g.Stop(syscall.SIGTERM)
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections to the OTLP ports with tracing off", n)
	}
	if strings.Contains(g.LogText(), "tracing on") {
		t.Error("the log says tracing is on")
	}
}
