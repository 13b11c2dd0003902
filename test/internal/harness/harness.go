// Package harness is what the test suites that run the real acpgate binary
// share: building it, TestMain's goroutine-leak check, skipping (or failing)
// when a tool is missing, and small helpers for files, ports and buffers.
// Gateway processes are in gateway.go.
package harness

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/internal/syncbuf"
)

// Main runs the tests, then, if they passed, fails the run on a leaked
// goroutine; it calls cleanup (if set) and exits.
func Main(m *testing.M, cleanup func()) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	if cleanup != nil {
		cleanup()
	}
	os.Exit(code)
}

// Build compiles ./cmd/acpgate into dir/acpgate and returns its path. With
// race the race detector is on, unless ACPGATE_E2E_NORACE is set; flags go
// to go build as they are (e.g. "-ldflags", "-X main.version=…").
func Build(dir string, race bool, flags ...string) (string, error) {
	bin := filepath.Join(dir, "acpgate")
	if race && os.Getenv("ACPGATE_E2E_NORACE") == "" {
		flags = append([]string{"-race"}, flags...)
	}
	return bin, goBuild(bin, "github.com/acpgate/acpgate/cmd/acpgate", flags...)
}

// BuildFakeAgent compiles test/fakeagent, the misbehaving agent, to path.
func BuildFakeAgent(path string) error {
	return goBuild(path, "github.com/acpgate/acpgate/test/fakeagent")
}

func goBuild(out, pkg string, flags ...string) error {
	args := append(append([]string{"build", "-o", out}, flags...), pkg)
	if b, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// Prebuilt is ACPGATE_E2E_BIN, a gateway built beforehand (e.g. an older
// build to compare against), made absolute; "" when unset.
func Prebuilt() (string, error) {
	bin := os.Getenv("ACPGATE_E2E_BIN")
	if bin == "" {
		return "", nil
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", fmt.Errorf("ACPGATE_E2E_BIN: %w", err)
	}
	return abs, nil
}

// Missing skips the test for a missing prerequisite, or fails it when one
// of requireEnvs (e.g. ACPGATE_REQUIRE_OPS) is "1", as in CI.
func Missing(t testing.TB, msg string, requireEnvs ...string) {
	t.Helper()
	for _, env := range requireEnvs {
		if os.Getenv(env) == "1" {
			t.Fatalf("%s (%s=1, so this is a failure)", msg, env)
		}
	}
	t.Skipf("%s; skipping (set %s=1 to make this a failure)", msg, strings.Join(requireEnvs, "=1 or "))
}

// Node returns the path of a node binary of at least version 20.
func Node() (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("node --version: %w", err)
	}
	v := strings.TrimSpace(string(out))
	if major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 2)[0]); major < 20 {
		return "", fmt.Errorf("node %s is too old (need >= 20)", v)
	}
	return node, nil
}

// WriteFile writes data to path with mode, failing the test on error.
func WriteFile(t testing.TB, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// RandomHex is n random bytes in hex.
func RandomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// FreeAddr is a loopback address (127.0.0.1) with a port that was free a
// moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l := Listen(t)
	defer l.Close()
	return l.Addr().String()
}

// Listen listens on a free port of 127.0.0.1, failing the test on error.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// EnvWithout is the test's environment without the variables whose names
// (NAME=value) start with prefix.
func EnvWithout(prefix string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, prefix) {
			env = append(env, kv)
		}
	}
	return env
}

// Diverge describes where got departs from want: both lengths, the first
// byte that differs and some context around it on each side.
func Diverge(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	ctx := func(s string) string { return s[max(0, i-24):min(len(s), i+24)] }
	return fmt.Sprintf("got %d bytes, want %d; they differ at byte %d: got …%q…, want …%q…", len(got), len(want), i, ctx(got), ctx(want))
}

// Bounded calls f(0) … f(n-1), each on a goroutine of its own with at most
// limit running at once, and returns when all have returned.
func Bounded(n, limit int, f func(i int)) {
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// SyncBuffer is a bytes.Buffer that goroutines may write to while the test
// reads it (syncbuf.Buffer).
type SyncBuffer = syncbuf.Buffer
