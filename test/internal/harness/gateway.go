package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/gwlog"
)

// Options says how to run a gateway.
type Options struct {
	Argv []string // the command: the binary (after any wrapper) and its arguments
	Env  []string // its whole environment
	Dir  string   // its working directory; "" = the test's
	// Setpgid puts it in a process group of its own, which Kill ends.
	Setpgid bool
	Listen  time.Duration // how long to wait for its "listening" line; 0 = 20 s
	Stop    time.Duration // how long Stop waits before SIGKILL; 0 = 20 s
	// CheckExit fails the test when the gateway exited with an error of
	// its own (66: a data race) rather than by a signal the test sent.
	CheckExit bool
	// Log, if set, is given every log line as written, and the stdout.
	Log io.Writer
}

// Gateway is one running acpgate process. Its stderr is read as JSON log
// records. When the test ends it is stopped with SIGTERM; a "DATA RACE" in
// its log fails the test, and a failed test logs the gateway's log.
type Gateway struct {
	Cmd  *exec.Cmd
	Addr string // the address of its "listening" line

	t       testing.TB
	stop    time.Duration
	done    chan struct{}
	exitErr error

	mu          sync.Mutex
	logs        []map[string]any
	metricsAddr string
}

// Start runs a gateway and waits for its "listening" line, failing the test
// when it exits first or does not listen in time.
func Start(t testing.TB, o Options) *Gateway {
	t.Helper()
	if o.Listen == 0 {
		o.Listen = 20 * time.Second
	}
	if o.Stop == 0 {
		o.Stop = 20 * time.Second
	}
	g := &Gateway{t: t, stop: o.Stop, done: make(chan struct{})}
	g.Cmd = exec.Command(o.Argv[0], o.Argv[1:]...)
	g.Cmd.Env, g.Cmd.Dir = o.Env, o.Dir
	if o.Log != nil {
		g.Cmd.Stdout = o.Log
		g.Cmd.WaitDelay = 10 * time.Second // for a child that keeps stdout open
	}
	if o.Setpgid {
		g.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	stderr, err := g.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	go func() { // ends when the gateway's stderr closes
		gwlog.Read(stderr, func(rec map[string]any, line []byte) {
			if o.Log != nil {
				fmt.Fprintf(o.Log, "%s\n", line)
			}
			g.mu.Lock()
			g.logs = append(g.logs, rec)
			if rec["msg"] == "serving metrics" {
				g.metricsAddr, _ = rec["addr"].(string)
			}
			g.mu.Unlock()
			if addr, ok := rec["addr"].(string); ok && rec["msg"] == "listening" {
				select {
				case addrCh <- addr:
				default:
				}
			}
		})
		g.exitErr = g.Cmd.Wait()
		close(g.done)
	}()
	// Registered before the wait, so that a gateway that never listens is
	// stopped too.
	t.Cleanup(func() {
		g.Stop(syscall.SIGTERM)
		killed := g.Cmd.ProcessState != nil && !g.Cmd.ProcessState.Exited() // by the test itself
		if o.CheckExit && g.exitErr != nil && !killed {
			t.Errorf("gateway exited with %v (66 = data race)", g.exitErr)
		}
		if strings.Contains(g.LogText(), "DATA RACE") {
			t.Errorf("the gateway reported a data race")
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.LogText())
		}
	})
	select {
	case g.Addr = <-addrCh:
	case <-g.done:
		t.Fatalf("gateway exited before listening: %v", g.exitErr)
	case <-time.After(o.Listen):
		t.Fatalf("gateway did not listen within %s", o.Listen)
	}
	return g
}

// Done is closed when the process has exited.
func (g *Gateway) Done() <-chan struct{} { return g.done }

// ExitErr is what Wait returned; read it after Done.
func (g *Gateway) ExitErr() error { return g.exitErr }

// ExitCode is the exit status (-1 for a signal); read it after Done.
func (g *Gateway) ExitCode() int { return g.Cmd.ProcessState.ExitCode() }

// Stop signals the gateway and waits for it to exit, with SIGKILL (an
// error) after the Options' Stop time.
func (g *Gateway) Stop(sig syscall.Signal) { g.StopWithin(sig, g.stop) }

// StopWithin is Stop with its own wait.
func (g *Gateway) StopWithin(sig syscall.Signal, wait time.Duration) {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.Cmd.Process.Signal(sig)
	select {
	case <-g.done:
	case <-time.After(wait):
		g.t.Errorf("gateway did not exit within %s of %v", wait, sig)
		g.Kill()
		<-g.done
	}
}

// Kill sends SIGKILL to the gateway, and to its process group when it has
// one of its own.
func (g *Gateway) Kill() {
	if a := g.Cmd.SysProcAttr; a != nil && a.Setpgid {
		_ = syscall.Kill(-g.Cmd.Process.Pid, syscall.SIGKILL)
		return
	}
	_ = g.Cmd.Process.Kill()
}

// MetricsAddr is the address of its "serving metrics" line ("" if none).
func (g *Gateway) MetricsAddr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.metricsAddr
}

// Logs is a copy of the log records so far.
func (g *Gateway) Logs() []map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]map[string]any(nil), g.logs...)
}

// LogText is the log so far, a JSON record a line.
func (g *Gateway) LogText() string {
	var b strings.Builder
	for _, r := range g.Logs() {
		j, _ := json.Marshal(r)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// CountLogs counts the log records with msg and, if key is set, key=value.
func (g *Gateway) CountLogs(msg, key, value string) int {
	n := 0
	for _, r := range g.Logs() {
		if r["msg"] == msg && (key == "" || fmt.Sprint(r[key]) == value) {
			n++
		}
	}
	return n
}

// WaitLog waits until a record with msg (and key=value) has been logged.
func (g *Gateway) WaitLog(t testing.TB, msg, key, value string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for g.CountLogs(msg, key, value) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no log %q %s=%s within %s", msg, key, value, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitLogs waits until msg has been logged n times.
func (g *Gateway) WaitLogs(t testing.TB, msg string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for g.CountLogs(msg, "", "") < n {
		if time.Now().After(deadline) {
			t.Fatalf("log %q not seen %d times within %s", msg, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
