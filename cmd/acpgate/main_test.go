package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runCmd runs the CLI in-process and fails the test if it does not return
// within a few seconds (a command that should have been refused might be
// serving).
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(args, &out, &errb) }()
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("acpgate %s did not return within 10 s", strings.Join(args, " "))
	}
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersion(t *testing.T) {
	code, out, errOut := runCmd(t, "version")
	if code != 0 || !strings.HasPrefix(out, "acpgate ") || !strings.HasSuffix(out, "\n") || errOut != "" {
		t.Fatalf("version: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if v := strings.TrimSpace(strings.TrimPrefix(out, "acpgate ")); v == "" {
		t.Fatalf("version prints no version: %q", out)
	}
}

func TestVersionFromLdflags(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.8.7"
	if code, out, _ := runCmd(t, "version"); code != 0 || out != "acpgate v9.8.7\n" {
		t.Fatalf("version: code %d, stdout %q", code, out)
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := runCmd(t, "help")
	if code != 0 || !strings.Contains(out, "usage:") || !strings.Contains(out, "check-config") {
		t.Errorf("help: code %d, stdout %q", code, out)
	}
}

// run lists "-h" and "--help" as commands that print the usage and exit 0,
// but they start with "-" and so are parsed as flags of serve.
func TestHelpFlag(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		code, out, errOut := runCmd(t, arg)
		if code != 0 || !strings.Contains(out, "usage:") || !strings.Contains(out, "check-config") {
			t.Errorf("acpgate %s: code %d, stdout %q, stderr %q; want the usage on stdout and exit 0", arg, code, out, errOut)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	code, out, errOut := runCmd(t, "frobnicate", "--x")
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(errOut, `unknown command "frobnicate"`) || !strings.Contains(errOut, "usage:") {
		t.Errorf("stderr %q", errOut)
	}
	if out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
}

func TestCheckConfigGood(t *testing.T) {
	path := writeFile(t, "good.yaml", `listen: 127.0.0.1:8080
agent:
  command: ["node", "agent.mjs"]
  env: {KEY: value}
pool: {min_idle: 1, max_processes: 4}
limits: {max_message_bytes: 1048576}
`)
	code, out, errOut := runCmd(t, "check-config", "--config", path)
	if code != 0 || !strings.HasPrefix(out, path+": ok\n") || !strings.Contains(out, "effective policy") || errOut != "" {
		t.Fatalf("check-config good.yaml: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !strings.Contains(out, "\n/metrics and the admin API: on the main listener 127.0.0.1:8080 (a loopback address)\n") {
		t.Errorf("check-config does not say where /metrics and the admin API are served: %s", out)
	}
	if want := "running prompts get 30s (shutdown_grace) to finish before they are cancelled; once they have ended, each client gets up to 1s (shutdown_linger;"; !strings.Contains(out, want) {
		t.Errorf("check-config good.yaml: stdout %q does not tell the drain: %q", out, want)
	}
}

// check-config warns when policy.meta.allow lets _meta.claudeCode through
// (claude-code-acp turns it into SDK options), and not for a safe list.
func TestCheckConfigMetaWarning(t *testing.T) {
	for _, c := range []struct {
		allow string
		warn  bool
	}{{`["*"]`, true}, {`["claude*", "foo"]`, true}, {`["foo", "zed.dev/*"]`, false}} {
		path := writeFile(t, "meta.yaml", "listen: 127.0.0.1:8080\nagent: {command: [\"node\", \"agent.mjs\"]}\npolicy: {meta: {allow: "+c.allow+"}}\n")
		code, out, errOut := runCmd(t, "check-config", "--config", path)
		if code != 0 || errOut != "" {
			t.Fatalf("%s: code %d, stderr %q", c.allow, code, errOut)
		}
		warned := strings.Contains(out, "WARNING: agent \"default\": policy.meta.allow lets _meta.claudeCode through")
		if warned != c.warn || !strings.Contains(out, "meta:\n    allow:\n") {
			t.Errorf("%s: warned %v, want %v:\n%s", c.allow, warned, c.warn, out)
		}
	}
}

// check-config tells the linger cut to a shorter grace, and refuses one
// set above the grace.
func TestCheckConfigLinger(t *testing.T) {
	code, out, errOut := runCmd(t, "check-config", "--config", writeFile(t, "short.yaml", "shutdown_grace: 500ms\n"))
	if want := "each client gets up to 500ms (shutdown_linger 1s, cut to shutdown_grace;"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("check-config short.yaml: code %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	code, out, errOut = runCmd(t, "check-config", "--config", writeFile(t, "long.yaml", "shutdown_grace: 2s\nshutdown_linger: 3s\n"))
	if code != 1 || out != "" || !strings.Contains(errOut, "shutdown_linger: 3s must not exceed shutdown_grace (2s)") {
		t.Errorf("check-config long.yaml: code %d, stdout %q, stderr %q; want the linger refused", code, out, errOut)
	}
}

func TestCheckConfigBad(t *testing.T) {
	path := writeFile(t, "bad.yaml", `listen: 0.0.0.0:8080
pool:
  max_proceses: 3
  min_idle: 40
limits:
  max_message_bytes: 10
log: {level: chatty}
`)
	code, out, errOut := runCmd(t, "check-config", "--config", path)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, errOut)
	}
	if out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
	want := []struct {
		line   int
		substr string
	}{
		{1, "allow_unauthenticated"},
		{3, "max_proceses"},
		{4, "pool.min_idle"},
		{6, "limits.max_message_bytes"},
		{7, "log.level"},
	}
	if !strings.Contains(errOut, "5 problem") {
		t.Errorf("stderr does not count 5 problems:\n%s", errOut)
	}
	var located []string
	for _, l := range strings.Split(errOut, "\n") {
		if strings.Contains(l, path+": line ") {
			located = append(located, l)
		}
	}
	if len(located) != len(want) {
		t.Errorf("stderr lists %d problems with a line, want %d:\n%s", len(located), len(want), errOut)
	}
	for _, w := range want {
		prefix := path + ": line " + strconv.Itoa(w.line) + ","
		found := false
		for _, l := range located {
			if strings.Contains(l, prefix) && strings.Contains(l, w.substr) {
				found = true
			}
		}
		if !found {
			t.Errorf("stderr lacks %q ... %q:\n%s", prefix, w.substr, errOut)
		}
	}
}

func TestCheckConfigUsage(t *testing.T) {
	code, out, errOut := runCmd(t, "check-config")
	if code != 2 || !strings.Contains(errOut, "--config") || out != "" {
		t.Errorf("check-config without --config: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, _ := runCmd(t, "check-config", "--bogus"); code != 2 {
		t.Errorf("check-config --bogus: code %d, want 2", code)
	}
	code, _, errOut = runCmd(t, "check-config", "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != 1 || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("check-config of a missing file: code %d, stderr %q", code, errOut)
	}
}

// serve refuses a network address without authentication before it starts
// anything: it returns at once (runCmd would time out if it were serving).
func TestServeRefusesNonLoopbackWithoutAuth(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--listen", "0.0.0.0:0"},
		{"--listen", "0.0.0.0:0"}, // serve is the default command
		{"serve", "--listen", "[::]:0", "--log-level", "debug"},
	} {
		code, _, errOut := runCmd(t, args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, errOut)
		}
		if !strings.Contains(errOut, "allow-unauthenticated") {
			t.Errorf("%q: stderr does not mention --allow-unauthenticated:\n%s", args, errOut)
		}
		if strings.Contains(errOut, "listening") {
			t.Errorf("%q: it started listening:\n%s", args, errOut)
		}
	}
	// The same from a configuration file.
	path := writeFile(t, "net.yaml", "listen: 0.0.0.0:0\n")
	code, _, errOut := runCmd(t, "serve", "--config", path)
	if code != 2 || !strings.Contains(errOut, "allow_unauthenticated") || !strings.Contains(errOut, path+": line 1") {
		t.Errorf("serve --config net.yaml: exit %d, stderr:\n%s", code, errOut)
	}
}

func TestServeBadFlags(t *testing.T) {
	cases := [][]string{
		{"serve", "--no-such-flag"},
		{"serve", "stray"},
		{"serve", "--agent", `node "agent.mjs`},
		{"serve", "--agent", "   "},
		{"serve", "--log-level", "loud"},
		{"serve", "--log-format", "xml"},
		{"serve", "--listen", "nonsense"},
		{"serve", "--config", "/nonexistent/acpgate.yaml"},
	}
	for _, args := range cases {
		code, _, errOut := runCmd(t, args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, errOut)
		}
		if errOut == "" {
			t.Errorf("%q: nothing on stderr", args)
		}
	}
}

func TestLoadConfigFlagsOverrideFile(t *testing.T) {
	path := writeFile(t, "c.yaml", `listen: 127.0.0.1:1
agent: {command: [a, b]}
log: {level: warn, format: json}
`)
	cfg, err := loadConfig(serveFlags{config: path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:1" || !reflect.DeepEqual(cfg.Agent.Command, []string{"a", "b"}) || cfg.Log.Level != "warn" {
		t.Fatalf("file not applied: %+v", cfg)
	}
	cfg, err = loadConfig(serveFlags{
		config: path, listen: "0.0.0.0:2", allowUnauth: true,
		agent: `node 'my agent.mjs'`, logLevel: "debug", logFormat: "text",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "0.0.0.0:2" || !cfg.AllowUnauthenticated ||
		!reflect.DeepEqual(cfg.Agent.Command, []string{"node", "my agent.mjs"}) ||
		cfg.Log.Level != "debug" || cfg.Log.Format != "text" {
		t.Fatalf("flags do not override the file: %+v", cfg)
	}
	// A flag can also correct a file that alone does not validate: a
	// public address without tenants needs --allow-unauthenticated.
	public := writeFile(t, "public.yaml", "listen: 0.0.0.0:3\n")
	if _, err := loadConfig(serveFlags{config: public}, io.Discard); err == nil {
		t.Fatal("a public listen address without tenants was accepted")
	}
	if cfg, err = loadConfig(serveFlags{config: public, allowUnauth: true}, io.Discard); err != nil || !cfg.AllowUnauthenticated {
		t.Fatalf("--allow-unauthenticated over a public file: %v", err)
	}
}
