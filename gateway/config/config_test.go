package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// problems parses data and returns the problems it reports (nil when the
// configuration is valid).
func problems(t *testing.T, data string) []Problem {
	t.Helper()
	cfg, err := Parse("test.yaml", []byte(data))
	if err == nil {
		if cfg == nil {
			t.Fatal("Parse returned neither a configuration nor an error")
		}
		return nil
	}
	if cfg != nil {
		t.Errorf("Parse returned a configuration together with an error")
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("Parse error is %T, want *config.Error: %v", err, err)
	}
	if ce.File != "test.yaml" {
		t.Errorf("Error.File = %q, want test.yaml", ce.File)
	}
	if len(ce.Problems) == 0 {
		t.Fatalf("*config.Error with no problems: %v", err)
	}
	return ce.Problems
}

func mustParse(t *testing.T, data string) *Config {
	t.Helper()
	cfg, err := Parse("test.yaml", []byte(data))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", data, err)
	}
	return cfg
}

// keyPos returns the 1-based line of the n-th (0-based) line of data that
// contains key+":", with the columns of the key and of its value.
func keyPos(t *testing.T, data, key string, n int) (line, keyCol, valCol int) {
	t.Helper()
	for i, l := range strings.Split(data, "\n") {
		j := strings.Index(l, key+":")
		if j < 0 {
			continue
		}
		if n > 0 {
			n--
			continue
		}
		v := j + len(key) + 1
		for v < len(l) && l[v] == ' ' {
			v++
		}
		return i + 1, j + 1, v + 1
	}
	t.Fatalf("key %q not in test data", key)
	return
}

// findProblem returns the problem whose message contains substr.
func findProblem(t *testing.T, ps []Problem, substr string) Problem {
	t.Helper()
	var found []Problem
	for _, p := range ps {
		if strings.Contains(p.Msg, substr) {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one problem mentioning %q, got %d in:\n%s", substr, len(found), list(ps))
	}
	return found[0]
}

// wantAtKey checks that p points at key (its n-th occurrence in data): the
// key's line, and the column of the key or of its value.
func wantAtKey(t *testing.T, p Problem, data, key string, n int) {
	t.Helper()
	line, keyCol, valCol := keyPos(t, data, key, n)
	if p.Line != line {
		t.Errorf("problem %q: line %d, want %d (the line of %s)", p, p.Line, line, key)
	}
	if p.Column != keyCol && p.Column != valCol {
		t.Errorf("problem %q: column %d, want %d (the key %s) or %d (its value)", p, p.Column, keyCol, key, valCol)
	}
	if !strings.HasPrefix(p.String(), "line ") {
		t.Errorf("problem %q: String() does not start with its line", p)
	}
}

func list(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("  ")
		b.WriteString(p.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func TestDefaultValidates(t *testing.T) {
	cfg := Default()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
	if cfg.Listen != "127.0.0.1:8080" {
		t.Errorf("default listen %q", cfg.Listen)
	}
	if cfg.AllowUnauthenticated {
		t.Error("the default allows unauthenticated network access")
	}
	if len(cfg.Agent.Command) != 0 {
		t.Errorf("default agent command %q, want empty (the built-in demo agent)", cfg.Agent.Command)
	}
	// Default returns a fresh value each time: changing one does not change
	// the next.
	cfg.Pool.MaxProcesses = 99
	cfg.Listen = "x"
	if d := Default(); d.Pool.MaxProcesses == 99 || d.Listen == "x" {
		t.Error("Default() shares state between calls")
	}
}

// The example from the README and the issue.
const exampleYAML = `listen: 127.0.0.1:8080
shutdown_grace: 30s              # SIGTERM: how long running prompts may finish
agent:
  command: ["node", "agent.mjs"] # argv, no shell; default: the built-in demo agent
  env: {KEY: value}              # added to the agent's environment
  dir: /srv/agent                # its working directory
  stop_grace: 5s                 # SIGTERM to the agent's process group, then SIGKILL
  init_timeout: 60s
pool:
  min_idle: 1                    # initialized processes with no session kept ready
  max_processes: 16
  max_sessions_per_process: 32
  acquire_timeout: 30s           # how long a request waits for a free process
  idle_timeout: 5m               # idle processes beyond min_idle are stopped after this
limits:
  max_message_bytes: 16777216    # WebSocket message and agent stdio line limit
  send_queue_messages: 4096      # per client; a client that falls further behind
  send_queue_bytes: 67108864     #   is closed with 1008
websocket: {ping_interval: 30s, ping_timeout: 15s, write_timeout: 30s}
log: {level: info, format: text} # text or json
`

func TestExampleParses(t *testing.T) {
	cfg := mustParse(t, exampleYAML)
	want := Default()
	want.Agent.Command = []string{"node", "agent.mjs"}
	want.Agent.Env = map[string]string{"KEY": "value"}
	want.Agent.Dir = "/srv/agent"
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("example parsed to\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestNonDefaultValuesParse(t *testing.T) {
	data := `listen: "[::1]:9090"
shutdown_grace: 1m30s
agent:
  command:
    - npx
    - "@zed-industries/claude-code-acp"
  env:
    ANTHROPIC_LOG: debug
    EMPTY: ""
  dir: /tmp
  stop_grace: 250ms
  init_timeout: 2m
  usage: {cost_total: per_session}
pool:
  min_idle: 0
  max_processes: 3
  max_sessions_per_process: 7
  acquire_timeout: 1s
  idle_timeout: 1h
limits:
  max_message_bytes: 1048576
  send_queue_messages: 8
  send_queue_bytes: 2097152
websocket:
  ping_interval: 0s
  ping_timeout: 100ms
  write_timeout: 2s
log:
  level: debug
  format: json
`
	cfg := mustParse(t, data)
	want := Default() // fields the file does not set keep their defaults
	want.Listen = "[::1]:9090"
	want.ShutdownGrace = Duration(90 * time.Second)
	want.Agent = Agent{
		Command:     []string{"npx", "@zed-industries/claude-code-acp"},
		Env:         map[string]string{"ANTHROPIC_LOG": "debug", "EMPTY": ""},
		Dir:         "/tmp",
		InheritEnv:  want.Agent.InheritEnv,
		StopGrace:   Duration(250 * time.Millisecond),
		InitTimeout: Duration(2 * time.Minute),
		Usage:       AgentUsage{CostTotal: CostPerSession},
	}
	want.Pool.MinIdle = 0
	want.Pool.MaxProcesses = 3
	want.Pool.MaxSessionsPerProcess = 7
	want.Pool.AcquireTimeout = Duration(time.Second)
	want.Pool.IdleTimeout = Duration(time.Hour)
	want.Limits.MaxMessageBytes, want.Limits.SendQueueMessages, want.Limits.SendQueueBytes = 1<<20, 8, 2<<20
	want.WebSocket = WebSocket{PingInterval: 0, PingTimeout: Duration(100 * time.Millisecond), WriteTimeout: Duration(2 * time.Second)}
	want.Log = Log{Level: "debug", Format: "json"}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("parsed to\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestPartialFileKeepsDefaults(t *testing.T) {
	cfg := mustParse(t, "pool:\n  max_processes: 4\n")
	want := Default()
	want.Pool.MaxProcesses = 4
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("parsed to\n%+v\nwant the defaults with max_processes 4:\n%+v", cfg, want)
	}
}

func TestEmptyFileIsDefaults(t *testing.T) {
	for _, data := range []string{"", "\n", "  \n\n", "---\n"} {
		cfg := mustParse(t, data)
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("%q parsed to %+v, want the defaults", data, cfg)
		}
	}
}

// A file whose every line is commented out (a template, say) sets nothing,
// like an empty file.
func TestCommentOnlyFileIsDefaults(t *testing.T) {
	for _, data := range []string{"# nothing set yet\n", "# listen: 0.0.0.0:8080\n#pool:\n#  min_idle: 2\n"} {
		cfg, err := Parse("test.yaml", []byte(data))
		if err != nil {
			t.Errorf("%q: %v", data, err)
			continue
		}
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("%q parsed to %+v, want the defaults", data, cfg)
		}
	}
}

func TestUnknownKeys(t *testing.T) {
	cases := []struct {
		name, data, key string
	}{
		{"top level", "listen: 127.0.0.1:1\nlistne: 127.0.0.1:2\n", "listne"},
		{"nested flow", "pool: {max_proceses: 3}\n", "max_proceses"},
		{"nested block", "log:\n  level: info\n  colour: true\n", "colour"},
		{"deeper", "agent:\n  command: [x]\n  env: {A: b}\n  dirr: /tmp\n", "dirr"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := problems(t, tc.data)
			if len(ps) != 1 {
				t.Fatalf("want 1 problem, got %d:\n%s", len(ps), list(ps))
			}
			p := ps[0]
			if !strings.Contains(p.Msg, tc.key) {
				t.Errorf("problem %q does not name the key %q", p, tc.key)
			}
			line, _, _ := keyPos(t, tc.data, tc.key, 0)
			if p.Line != line {
				t.Errorf("problem %q: line %d, want %d", p, p.Line, line)
			}
			if !strings.HasPrefix(p.String(), "line ") {
				t.Errorf("problem %q: String() lacks the line", p)
			}
		})
	}
}

// Every problem in a file is reported at once: unknown keys, type errors and
// invalid values, each with its own line.
func TestAllProblemsReported(t *testing.T) {
	data := `listen: 127.0.0.1:8080
lisen: 0.0.0.0:1
pool:
  min_idle: 1
  max_proceses: 3
  max_sessions_per_process: many
limits:
  max_message_bytes: 100
  send_queue_messages: 0
log:
  level: loud
  formatt: json
`
	want := []struct {
		line   int
		substr string
	}{
		{2, "lisen"},
		{5, "max_proceses"},
		{6, "many"},
		{8, "limits.max_message_bytes"},
		{9, "limits.send_queue_messages"},
		{11, "log.level"},
		{12, "formatt"},
	}
	ps := problems(t, data)
	if len(ps) != len(want) {
		t.Fatalf("want %d problems, got %d:\n%s", len(want), len(ps), list(ps))
	}
	for _, w := range want {
		if p := findProblem(t, ps, w.substr); p.Line != w.line {
			t.Errorf("problem %q: line %d, want %d", p, p.Line, w.line)
		}
	}
	// The listing of the *Error names every problem with its line.
	_, err := Parse("test.yaml", []byte(data))
	msg := err.Error()
	if !strings.Contains(msg, "test.yaml: 7 problem") {
		t.Errorf("error does not count its problems:\n%s", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, fmt.Sprintf("test.yaml: line %d,", w.line)) {
			t.Errorf("error listing lacks line %d:\n%s", w.line, msg)
		}
	}
	if n := strings.Count(msg, "\n  test.yaml: line "); n != len(want) {
		t.Errorf("error lists %d located problems, want %d:\n%s", n, len(want), msg)
	}
}

func TestBadDurations(t *testing.T) {
	cases := []struct{ data, key, value string }{
		{"shutdown_grace: soon\n", "shutdown_grace", "soon"},
		{"agent:\n  stop_grace: 5\n", "stop_grace", "5"}, // no unit
		{"pool:\n  idle_timeout: 5 minutes\n", "idle_timeout", "5 minutes"},
		{"websocket: {ping_interval: 1x}\n", "ping_interval", "1x"},
	}
	for _, tc := range cases {
		ps := problems(t, tc.data)
		if len(ps) != 1 {
			t.Errorf("%q: want 1 problem, got %d:\n%s", tc.data, len(ps), list(ps))
			continue
		}
		p := ps[0]
		line, _, _ := keyPos(t, tc.data, tc.key, 0)
		if p.Line != line || !strings.Contains(p.Msg, `"`+tc.value+`"`) || !strings.Contains(p.Msg, "duration") {
			t.Errorf("%q: problem %q, want line %d naming %q as not a duration", tc.data, p, line, tc.value)
		}
	}
	// A duration that parses but is out of range is a validation problem.
	data := "agent:\n  init_timeout: 0s\nshutdown_grace: -1s\n"
	ps := problems(t, data)
	if len(ps) != 2 {
		t.Fatalf("want 2 problems, got %d:\n%s", len(ps), list(ps))
	}
	wantAtKey(t, findProblem(t, ps, "agent.init_timeout"), data, "init_timeout", 0)
	wantAtKey(t, findProblem(t, ps, "shutdown_grace"), data, "shutdown_grace", 0)
}

// A bad duration is one problem among others: it does not hide the rest of
// the file.
func TestBadDurationDoesNotHideOtherProblems(t *testing.T) {
	data := `pool:
  max_proceses: 3
shutdown_grace: soon
log:
  levle: debug
`
	ps := problems(t, data)
	if len(ps) != 3 {
		t.Fatalf("want 3 problems (lines 2, 3, 5), got %d:\n%s", len(ps), list(ps))
	}
	for i, line := range []int{2, 3, 5} {
		if ps[i].Line != line {
			t.Errorf("problem %d at line %d, want %d:\n%s", i, ps[i].Line, line, list(ps))
		}
	}
}

func TestSemanticProblemsCarryLocation(t *testing.T) {
	cases := []struct {
		name, data string
		key        string // the offending key
		msg        string // a substring of the problem
	}{
		{"min_idle over max_processes", "pool:\n  max_processes: 2\n  min_idle: 5\n", "min_idle", "pool.min_idle"},
		{"negative min_idle", "pool:\n  min_idle: -1\n", "min_idle", "pool.min_idle"},
		{"max_processes zero", "pool: {min_idle: 0, max_processes: 0}\n", "max_processes", "pool.max_processes"},
		{"max_message_bytes too small", "limits:\n  max_message_bytes: 1023\n", "max_message_bytes", "limits.max_message_bytes"},
		{"max_message_bytes too big", "limits:\n  send_queue_bytes: 4294967296\n  max_message_bytes: 1073741825\n", "max_message_bytes", "limits.max_message_bytes"},
		{"send_queue_bytes under max_message_bytes", "limits:\n  max_message_bytes: 2048\n  send_queue_bytes: 2047\n", "send_queue_bytes", "limits.send_queue_bytes"},
		{"bad log level", "log:\n  format: json\n  level: verbose\n", "level", "log.level"},
		{"bad log format", "log: {level: info, format: xml}\n", "format", "log.format"},
		{"bad listen", "listen: localhost\n", "listen", "not host:port"},
		{"bad port", "listen: 127.0.0.1:99999\n", "listen", "port"},
		{"empty program", "agent:\n  command: [\"\", x]\n", "command", "agent.command"},
		{"bad env name", "agent:\n  env: {\"A=B\": c}\n", "env", "agent.env"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := problems(t, tc.data)
			if len(ps) != 1 {
				t.Fatalf("want 1 problem, got %d:\n%s", len(ps), list(ps))
			}
			if !strings.Contains(ps[0].Msg, tc.msg) {
				t.Errorf("problem %q does not mention %q", ps[0], tc.msg)
			}
			wantAtKey(t, ps[0], tc.data, tc.key, 0)
		})
	}
}

// The websocket timeouts are three settings: a problem with one of them
// points at that one, not at the first key of the section.
func TestWebSocketProblemPointsAtOffendingKey(t *testing.T) {
	data := `websocket:
  ping_interval: 1s
  write_timeout: 1s
  ping_timeout: -1s
`
	ps := problems(t, data)
	if len(ps) != 1 {
		t.Fatalf("want 1 problem, got %d:\n%s", len(ps), list(ps))
	}
	wantAtKey(t, ps[0], data, "ping_timeout", 0)
}

// timeouts.write bounds a client's writes on both transports;
// websocket.write_timeout, its older name, still sets it when it is not
// given, and a negative one points at its key.
func TestWriteTimeoutNeutral(t *testing.T) {
	for _, tc := range []struct {
		data string
		want time.Duration
	}{
		{"", 30 * time.Second},
		{"websocket: {write_timeout: 2s}\n", 2 * time.Second},
		{"timeouts: {write: 5s}\n", 5 * time.Second},
		{"timeouts: {write: 5s}\nwebsocket: {write_timeout: 2s}\n", 5 * time.Second},
		{"timeouts: {write: 0s}\nwebsocket: {write_timeout: 2s}\n", 2 * time.Second},
	} {
		cfg := mustParse(t, tc.data)
		if got := cfg.Timeouts.WriteTimeout(cfg.WebSocket); got != tc.want {
			t.Errorf("%q: write timeout %v, want %v", tc.data, got, tc.want)
		}
	}
	c := Default()
	if _, err := c.ApplyEnv([]string{"ACPGATE_TIMEOUTS_WRITE=7s"}); err != nil || c.Timeouts.WriteTimeout(c.WebSocket) != 7*time.Second {
		t.Errorf("ACPGATE_TIMEOUTS_WRITE=7s: %v, write timeout %v", err, c.Timeouts.WriteTimeout(c.WebSocket))
	}
	data := "timeouts:\n  write: -1s\n"
	ps := problems(t, data)
	if len(ps) != 1 {
		t.Fatalf("want 1 problem, got %d:\n%s", len(ps), list(ps))
	}
	wantAtKey(t, ps[0], data, "write", 0)
}

func TestNonLoopbackNeedsAllowUnauthenticated(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:8080", "[::]:8080", ":8080", "192.0.2.1:80", "example.com:80"} {
		data := "listen: \"" + listen + "\"\n"
		ps := problems(t, data)
		if len(ps) != 1 {
			t.Errorf("%s: want 1 problem, got %d:\n%s", listen, len(ps), list(ps))
			continue
		}
		if !strings.Contains(ps[0].Msg, "allow_unauthenticated") {
			t.Errorf("%s: problem %q does not say how to allow it", listen, ps[0])
		}
		wantAtKey(t, ps[0], data, "listen", 0)

		cfg := mustParse(t, data+"allow_unauthenticated: true\n")
		if cfg.Listen != listen || !cfg.AllowUnauthenticated {
			t.Errorf("%s with allow_unauthenticated: got listen %q allow %v", listen, cfg.Listen, cfg.AllowUnauthenticated)
		}
	}
	// The same rule holds for a configuration built in code.
	cfg := Default()
	cfg.Listen = "0.0.0.0:0"
	err := cfg.Validate()
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || !strings.Contains(err.Error(), "allow-unauthenticated") {
		t.Fatalf("Validate of 0.0.0.0:0: %v", err)
	}
	if p := ce.Problems[0]; p.Line != 0 || p.Column != 0 {
		t.Errorf("a problem of a configuration built in code has a location: %+v", p)
	}
	cfg.AllowUnauthenticated = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate with AllowUnauthenticated: %v", err)
	}
}

func TestLoopbackListenAccepted(t *testing.T) {
	for _, listen := range []string{"localhost:8080", "127.0.0.1:0", "[::1]:8080", "127.0.0.2:80", "localhost:0"} {
		cfg := mustParse(t, "listen: \""+listen+"\"\n")
		if cfg.Listen != listen || cfg.AllowUnauthenticated {
			t.Errorf("%s: got listen %q allow %v", listen, cfg.Listen, cfg.AllowUnauthenticated)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	cases := map[string]bool{
		"localhost":             true,
		"127.0.0.1":             true,
		"127.1.2.3":             true,
		"::1":                   true,
		"0.0.0.0":               false,
		"::":                    false,
		"":                      false,
		"10.0.0.1":              false,
		"[::1]":                 false, // a host, not a host:port: brackets are gone by then
		"localhost.example.com": false,
	}
	for host, want := range cases {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestSyntaxError(t *testing.T) {
	data := "listen: 127.0.0.1:8080\npool: [\n"
	ps := problems(t, data)
	if len(ps) != 1 || ps[0].Line == 0 {
		t.Fatalf("want 1 problem with a line, got:\n%s", list(ps))
	}
}

func TestDuplicateKey(t *testing.T) {
	data := "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n"
	ps := problems(t, data)
	if len(ps) != 1 || ps[0].Line == 0 || !strings.Contains(ps[0].Msg, "listen") {
		t.Fatalf("want 1 problem about listen with a line, got:\n%s", list(ps))
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(exampleYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agent.Dir != "/srv/agent" {
		t.Errorf("agent.dir %q", cfg.Agent.Dir)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("pool: {max_proceses: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadFile(bad)
	var ce *Error
	if !errors.As(err, &ce) || ce.File != bad || !strings.Contains(err.Error(), bad+": line 1") {
		t.Errorf("LoadFile(bad): %v", err)
	}

	_, err = LoadFile(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing): %v, want a wrapped os.ErrNotExist", err)
	}
}

func TestDurationMarshal(t *testing.T) {
	v, err := Duration(90 * time.Second).MarshalYAML()
	if err != nil || v != "1m30s" {
		t.Fatalf("MarshalYAML = %v, %v", v, err)
	}
	if Duration(time.Second).D() != time.Second {
		t.Fatal("D()")
	}
}

func TestOverlappingTenantRootsRefused(t *testing.T) {
	dir := t.TempDir()
	sub := dir + "/inner"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	hash := strings.Repeat("ab", 32)
	yamlText := "tenants:\n" +
		"  - {name: a, tokens_sha256: [" + hash + "], root: " + dir + "}\n" +
		"  - {name: b, tokens_sha256: [" + hash + "], root: " + sub + "}\n" +
		"  - {name: c, tokens_sha256: [" + hash + "], root: " + dir + "/}\n"
	_, err := Parse("t.yaml", []byte(yamlText))
	if err == nil || strings.Count(err.Error(), "overlaps") != 3 {
		t.Fatalf("overlapping roots: %v", err)
	}
}

// observability.ops_on_main_listener: refused beside metrics_listen (it
// would do nothing); OpsWhere says where /metrics and the admin API go.
func TestOpsOnMainListener(t *testing.T) {
	data := "observability:\n  metrics_listen: 127.0.0.1:9090\n  ops_on_main_listener: true\n"
	ps := problems(t, data)
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "has no effect with observability.metrics_listen set") {
		t.Fatalf("ops_on_main_listener with metrics_listen: %s", list(ps))
	}
	wantAtKey(t, ps[0], data, "ops_on_main_listener", 0)
	if Default().Observability.OpsOnMainListener {
		t.Error("ops_on_main_listener defaults to true")
	}
	for _, c := range []struct{ yaml, want string }{
		{"", "on the main listener 127.0.0.1:8080 (a loopback address)"},
		{"listen: 0.0.0.0:8080\nallow_unauthenticated: true\n", "not served: the main listener 0.0.0.0:8080 is not a loopback address"},
		{"listen: 0.0.0.0:8080\nallow_unauthenticated: true\nobservability: {ops_on_main_listener: true}\n", "NOT a loopback address (observability.ops_on_main_listener: true)"},
		{"listen: 0.0.0.0:8080\nallow_unauthenticated: true\nobservability: {metrics_listen: 127.0.0.1:9090}\n", "on observability.metrics_listen 127.0.0.1:9090"},
	} {
		if got := mustParse(t, c.yaml).OpsWhere(); !strings.Contains(got, c.want) {
			t.Errorf("%q: OpsWhere %q, want %q in it", c.yaml, got, c.want)
		}
	}
}

// shutdown_linger defaults to 1s and runs within shutdown_grace: the
// default is cut to a shorter grace, an explicit linger longer than the
// grace or negative is refused at its key.
func TestShutdownLinger(t *testing.T) {
	for _, tc := range []struct {
		data string
		want time.Duration
	}{
		{"listen: 127.0.0.1:0\n", time.Second},
		{"shutdown_grace: 300ms\n", 300 * time.Millisecond},
		{"shutdown_grace: 0s\n", 0},
		{"shutdown_linger: 0s\n", 0},
		{"shutdown_grace: 5s\nshutdown_linger: 5s\n", 5 * time.Second},
	} {
		c, err := Parse("test.yaml", []byte(tc.data))
		if err != nil {
			t.Fatalf("%q: %v", tc.data, err)
		}
		if got := c.Linger(); got != tc.want {
			t.Errorf("%q: Linger() = %s, want %s", tc.data, got, tc.want)
		}
	}
	for _, data := range []string{"shutdown_linger: -1s\n", "shutdown_grace: 2s\nshutdown_linger: 3s\n"} {
		ps := problems(t, data)
		if len(ps) != 1 {
			t.Fatalf("%q: want 1 problem, got %d:\n%s", data, len(ps), list(ps))
		}
		wantAtKey(t, findProblem(t, ps, "shutdown_linger"), data, "shutdown_linger", 0)
	}
}
