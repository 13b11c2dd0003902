package proxy

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedSink is a resumed socket whose client does not read: its first
// Send that may wait (the replay's first message) blocks until open is
// closed. It records what it is sent.
type gatedSink struct {
	blocked chan struct{} // closed when the first waiting Send blocks
	open    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	got     []string
}

func (g *gatedSink) Send(msg []byte, wait bool) bool {
	if wait {
		g.once.Do(func() {
			close(g.blocked)
			<-g.open
		})
	}
	g.mu.Lock()
	g.got = append(g.got, string(msg))
	g.mu.Unlock()
	return true
}

func (g *gatedSink) Supersede() {}

// A resume replays with no lock held: while the resumed socket's client
// does not read, a delivery to the connection (what the agent's reader
// does for a turn that goes on) returns at once, and reaches the socket
// after the replay, exactly once.
func TestResumeReplaysWithNoLockHeld(t *testing.T) {
	r := testPool(t, "demo", nil)
	r.resume = SessionsConfig{DetachTimeout: time.Minute, ReplayBufferBytes: 1 << 20}
	c := newTestConn(t, r, "c")
	c.init(`{}`)
	for i := range 3 {
		id := fmt.Sprint(i + 1)
		c.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"_demo/echo","params":{"n":` + id + `}}`)
		if m := c.await(id, nil); m.Error != nil {
			t.Fatalf("echo: %s", m.raw)
		}
	}
	c.c.SocketEnded(c.s, false) // detached: kept for a resume
	conn, err := r.Resume("", "", "", c.c.token, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedSink{blocked: make(chan struct{}), open: make(chan struct{})}
	resumed := make(chan error, 1)
	go func() { resumed <- conn.Resume(g, 0) }()
	openGate := sync.OnceFunc(func() { close(g.open) })
	defer openGate() // a failed test does not leave the resume blocked
	select {
	case <-g.blocked:
	case err := <-resumed:
		t.Fatalf("the resume returned (%v) before its replay waited for the client", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the replay never reached the resumed socket")
	}
	delivered := make(chan struct{})
	go func() {
		conn.Deliver([]byte(`{"jsonrpc":"2.0","method":"_x/live","params":{}}`))
		close(delivered)
	}()
	select {
	case <-delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("a delivery waited for a resumed client that does not read")
	}
	if conn.Detached() {
		t.Error("the connection still counts as detached while its socket catches up")
	}
	openGate() // the client reads
	select {
	case err := <-resumed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the resume did not end once its client read")
	}
	g.mu.Lock()
	got := g.got
	g.mu.Unlock()
	// The greeting, the replay (initialize's answer and the 3 echoes), the
	// live message last, once.
	if len(got) != 6 || !strings.Contains(got[0], MethodResumed) || !strings.Contains(got[1], `"init"`) || !strings.Contains(got[5], "_x/live") {
		t.Fatalf("the resumed socket got %d messages: %q", len(got), got)
	}
	for i := 1; i <= 3; i++ {
		if want := fmt.Sprintf(`"n":%d`, i); !strings.Contains(got[1+i], want) {
			t.Errorf("message %d is %s; want the echo with %s", 1+i, got[1+i], want)
		}
	}
}
