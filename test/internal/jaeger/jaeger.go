// Package jaeger runs Jaeger v2 (test/jaeger, a module of its own) as the
// trace backend of tests: its in-memory store, OTLP over HTTP and gRPC on
// free loopback ports, and its query API to read the traces back.
package jaeger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// Version is the Jaeger release test/jaeger's go.mod names.
const Version = "v1.76.0"

// RequireEnv, set to "1", makes a Jaeger that cannot be built a failure
// rather than a skip (CI sets it once it has built the binary).
const RequireEnv = "ACPGATE_REQUIRE_JAEGER"

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// Binary is the path of the Jaeger binary: $ACPGATE_JAEGER_BIN if set,
// else jaeger-<Version> in the user's cache directory ($XDG_CACHE_HOME or
// ~/.cache, under acpgate/). A missing binary is built there from
// test/jaeger (some minutes, once). The test is skipped when that fails,
// unless ACPGATE_REQUIRE_JAEGER=1.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { builtPath, buildErr = build() })
	if buildErr != nil {
		harness.Missing(t, "jaeger: "+buildErr.Error(), RequireEnv)
	}
	return builtPath
}

// CachePath is where Binary keeps the binary.
func CachePath() (string, error) {
	if p := os.Getenv("ACPGATE_JAEGER_BIN"); p != "" {
		return filepath.Abs(p)
	}
	dir := os.Getenv("XDG_CACHE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory: %w", err)
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "acpgate", "jaeger-"+Version), nil
}

// build builds the binary into CachePath unless it is there.
func build() (string, error) {
	bin, err := CachePath()
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
		return bin, nil
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, "github.com/jaegertracing/jaeger/cmd/jaeger")
	cmd.Dir = filepath.Join(strings.TrimSpace(string(root)), "test", "jaeger")
	fmt.Fprintf(os.Stderr, "jaeger: building %s into %s (some minutes, once)\n", Version, bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("cannot build it (go build in %s: %v)\n%s", cmd.Dir, err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// Jaeger is a running Jaeger.
type Jaeger struct {
	cmd                *exec.Cmd
	logPath            string
	otlpHTTP, otlpGRPC string // host:port
	query              string // host:port of the query HTTP API
	http               *http.Client
}

// config is Jaeger's configuration (OTel Collector style): the memory
// store, the OTLP receiver and the query API, every port a free loopback
// one; no internal metrics server, no traces of its own.
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    enable_tracing: false # its own spans would go to localhost:4317
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// Start runs Jaeger until the test ends and waits until it takes spans
// and answers queries.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	j := &Jaeger{otlpHTTP: harness.FreeAddr(t), otlpGRPC: harness.FreeAddr(t), query: harness.FreeAddr(t),
		logPath: filepath.Join(dir, "jaeger.log"), http: &http.Client{Timeout: 5 * time.Second}}
	cfgPath := filepath.Join(dir, "jaeger.yaml")
	harness.WriteFile(t, cfgPath, fmt.Sprintf(config, j.query, harness.FreeAddr(t), j.otlpGRPC, j.otlpHTTP), 0o600)
	logf, err := os.Create(j.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	j.cmd = exec.Command(bin, "--config", cfgPath)
	j.cmd.Stdout, j.cmd.Stderr = logf, logf // files: no copying goroutines
	j.cmd.Env = harness.EnvWithout("OTEL_")
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("start jaeger: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- j.cmd.Wait() }() // ends when Jaeger exits (at the latest, the cleanup's kill)
	t.Cleanup(func() {
		j.http.CloseIdleConnections()
		_ = j.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = j.cmd.Process.Kill()
			<-exited
		}
		j.http.CloseIdleConnections()
		if t.Failed() {
			t.Logf("jaeger log:\n%s", j.Log())
		}
	})
	if err := j.waitReady(exited, time.Minute); err != nil {
		t.Fatalf("jaeger: %v\n%s", err, j.Log())
	}
	return j
}

// waitReady waits until the OTLP ports accept connections and the query
// API answers.
func (j *Jaeger) waitReady(exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("exited before it was ready: %v", err)
		default:
		}
		if j.ready() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (j *Jaeger) ready() bool {
	for _, addr := range []string{j.otlpHTTP, j.otlpGRPC} {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	resp, err := j.http.Get("http://" + j.query + "/api/services")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Log is what Jaeger wrote so far.
func (j *Jaeger) Log() string {
	b, _ := os.ReadFile(j.logPath)
	return string(b)
}

// OTLPHTTP is the OTLP/HTTP endpoint, a base URL as
// OTEL_EXPORTER_OTLP_ENDPOINT takes it (http://127.0.0.1:port).
func (j *Jaeger) OTLPHTTP() string { return "http://" + j.otlpHTTP }

// OTLPGRPC is the OTLP/gRPC endpoint (http://127.0.0.1:port).
func (j *Jaeger) OTLPGRPC() string { return "http://" + j.otlpGRPC }

// QueryURL is the base URL of the query API (and UI).
func (j *Jaeger) QueryURL() string { return "http://" + j.query }

// Trace is a trace as the query API returns it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	Tags          []KeyValue  `json:"tags"`
	ProcessID     string      `json:"processID"`
}

// Reference links a span to another: RefType CHILD_OF names the parent.
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is a tag: Type is string, bool, int64, float64 or binary.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Process is the service that reported spans: its resource.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Parent is the span's CHILD_OF parent's ID; "" for a root.
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Tag is the value of the span's tag key.
func (s Span) Tag(key string) (any, bool) { return tag(s.Tags, key) }

// Tag is the value of the process's tag key (a resource attribute).
func (p Process) Tag(key string) (any, bool) { return tag(p.Tags, key) }

// Process is the process that reported s.
func (tr Trace) Process(s Span) Process { return tr.Processes[s.ProcessID] }

// Span is the span of tr named op; false if there is none.
func (tr Trace) Span(op string) (Span, bool) {
	for _, s := range tr.Spans {
		if s.OperationName == op {
			return s, true
		}
	}
	return Span{}, false
}

func tag(kvs []KeyValue, key string) (any, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Traces are the recent traces with spans of service.
func (j *Jaeger) Traces(service string) ([]Trace, error) {
	return j.get("/api/traces?" + url.Values{"service": {service}, "limit": {"1000"}, "lookback": {"1h"}}.Encode())
}

// Trace is the trace with that ID.
func (j *Jaeger) Trace(id string) (Trace, error) {
	trs, err := j.get("/api/traces/" + url.PathEscape(id))
	if err != nil {
		return Trace{}, err
	}
	if len(trs) != 1 {
		return Trace{}, fmt.Errorf("trace %s: %d traces in the answer", id, len(trs))
	}
	return trs[0], nil
}

// ErrNotFound is a query for a trace Jaeger does not have.
var ErrNotFound = errors.New("jaeger: not found")

func (j *Jaeger) get(path string) ([]Trace, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL()+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jaeger query %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, ErrNotFound
	}
	var body struct {
		Data   []Trace `json:"data"`
		Errors []struct {
			Msg string `json:"msg"`
		} `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("jaeger query %s: %s: %w", path, resp.Status, err)
	}
	if resp.StatusCode != http.StatusOK || len(body.Errors) > 0 {
		return nil, fmt.Errorf("jaeger query %s: %s %v", path, resp.Status, body.Errors)
	}
	return body.Data, nil
}

// Wait polls until cond holds for service's traces, for up to timeout.
func (j *Jaeger) Wait(t testing.TB, service string, timeout time.Duration, cond func([]Trace) bool) []Trace {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		trs, err := j.Traces(service)
		if err == nil && cond(trs) {
			return trs
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger: traces of %q not as expected after %v (last error %v): %d traces", service, timeout, err, len(trs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
