// Package redistest runs a real redis-server (Debian's) on a loopback port
// for a test: started, killed and started again on the same port, gone
// when the test ends.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv makes a missing redis-server a failure rather than a skip
// (as in CI, which installs it).
const RequireEnv = "ACPGATE_REQUIRE_REDIS"

// Server is a redis-server of the test's.
type Server struct {
	t    testing.TB
	bin  string
	Port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	dir  string
}

// Start starts redis-server on a free loopback port, or skips the test
// when there is none (fails with ACPGATE_REQUIRE_REDIS=1).
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server not found (Debian: apt-get install redis-server)"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s (%s=1, so this is a failure)", msg, RequireEnv)
		}
		t.Skipf("%s; skipping (set %s=1 to make this a failure)", msg, RequireEnv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{t: t, bin: bin, Port: port, dir: t.TempDir()}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// URL is the server's redis:// URL, database db.
func (s *Server) URL(db int) string { return fmt.Sprintf("redis://127.0.0.1:%d/%d", s.Port, db) }

// Restart starts the server again (after Kill) on the same port, with an
// empty data set, and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatal("redistest: Restart of a running server")
	}
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "yes")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(s.Port) == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: redis-server on port %d did not answer within 10 s", s.Port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// ping sends PING and reads +PONG.
func ping(port int) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING: %q", line)
	}
	return nil
}
