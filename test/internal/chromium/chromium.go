// Package chromium runs the Node scripts that drive Debian's chromium with
// playwright-core (test/browser/e2e.mjs, test/scale/browser.mjs) and relays
// their requests to the Go test: a script asks for an action by printing
// "@@harness ACTION" and waits for "ok" or "error" on its stdin. The
// scripts' side of this, and the browser's launch, is launch.mjs here.
package chromium

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// Path is Debian's chromium.
const Path = "/usr/bin/chromium"

// Require returns node's path, skipping the test (failing it when one of
// requireEnvs is "1") when node, chromium or playwright-core in
// nodeModules is missing.
func Require(t testing.TB, nodeModules string, requireEnvs ...string) string {
	t.Helper()
	if _, err := os.Stat(Path); err != nil {
		harness.Missing(t, fmt.Sprintf("browser: %s is missing (apt-get install -y chromium)", Path), requireEnvs...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		harness.Missing(t, "browser: node is not on PATH", requireEnvs...)
	}
	if _, err := os.Stat(filepath.Join(nodeModules, "playwright-core", "package.json")); err != nil {
		harness.Missing(t, "browser: test/browser/node_modules/playwright-core is missing (cd test/browser && npm ci)", requireEnvs...)
	}
	return node
}

// Script is one run of a script.
type Script struct {
	Node   string
	Args   []string // the script and its arguments
	Env    []string // added to the test's environment
	OutDir string   // for screenshots: ACPGATE_BROWSER_OUT, created
	// OnAction carries out an action; nil: the script may ask for none.
	OnAction func(action string) error
}

// Result is how a run ended.
type Result struct {
	Err       error  // the script's exit
	ActionErr error  // the actions that failed, joined
	Stderr    string // the script's stderr
	Took      time.Duration
}

// Run runs the script in a process group of its own, logging its output
// and carrying out its actions. When ctx ends the script and the browser
// it started are killed.
func Run(t testing.TB, ctx context.Context, s Script) Result {
	t.Helper()
	if err := os.MkdirAll(s.OutDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, s.Node, s.Args...)
	cmd.Env = append(append(os.Environ(), "ACPGATE_BROWSER_OUT="+s.OutDir, "ACPGATE_CHROMIUM="+Path), s.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr harness.SyncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var res Result
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		action, ok := strings.CutPrefix(line, "@@harness ")
		if !ok {
			t.Log(line)
			continue
		}
		t.Logf("harness: %s", action)
		reply := "ok"
		err := errors.New("this scenario takes no harness actions")
		if s.OnAction != nil {
			err = s.OnAction(action)
		}
		if err != nil {
			res.ActionErr = errors.Join(res.ActionErr, fmt.Errorf("%s: %w", action, err))
			reply = "error"
		}
		if _, err := io.WriteString(stdin, reply+"\n"); err != nil {
			t.Errorf("writing to the script: %v", err)
		}
	}
	_ = stdin.Close()
	res.Err = cmd.Wait()
	res.Stderr = stderr.String()
	res.Took = time.Since(start).Round(time.Millisecond)
	return res
}
