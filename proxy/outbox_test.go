package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
)

// recSink records what it is sent.
type recSink struct{ got []string }

func (r *recSink) Send(msg []byte, _ bool) bool { r.got = append(r.got, string(msg)); return true }
func (r *recSink) Supersede()                   {}

func msgN(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }

func TestOutboxReplaysAfterReceived(t *testing.T) {
	s1 := &recSink{}
	o := &outbox{limit: 1 << 20, sink: s1}
	for i := 1; i <= 5; i++ {
		o.deliver(msgN(i), nil, false)
	}
	// The socket dies; two more arrive while detached.
	o.mu.Lock()
	o.sink = nil
	o.mu.Unlock()
	for i := 6; i <= 7; i++ {
		if o.deliver(msgN(i), nil, false) {
			t.Fatal("overflow with room to spare")
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, tc := range []struct {
		received int64
		ok       bool
	}{{-1, false}, {0, true}, {3, true}, {7, true}, {8, false}} {
		if got := o.canResumeLocked(tc.received); got != tc.ok {
			t.Errorf("canResume(%d) = %v, want %v", tc.received, got, tc.ok)
		}
	}
	s2 := &recSink{}
	o.replayLocked(s2, 3) // the client had read 3 of the 5 sent before the drop
	want := []string{`{"n":4}`, `{"n":5}`, `{"n":6}`, `{"n":7}`}
	if strings.Join(s2.got, " ") != strings.Join(want, " ") {
		t.Fatalf("replayed %v, want %v", s2.got, want)
	}
}

func TestOutboxAckForgetsWhatTheClientRead(t *testing.T) {
	s := &recSink{}
	o := &outbox{limit: 1 << 20, sink: s}
	for i := 1; i <= 10; i++ {
		o.deliver(msgN(i), nil, false)
	}
	o.mu.Lock()
	o.ackLocked(6) // a pong after 6 written messages
	if o.canResumeLocked(5) || !o.canResumeLocked(6) {
		t.Error("after an ack of 6, a resume from 5 must be refused and from 6 served")
	}
	if n := len(o.kept) - o.first; n != 4 {
		t.Errorf("%d messages kept after the ack, want 4", n)
	}
	// A resumed socket: the _acpgate/resumed notification is its first
	// write and is not numbered.
	s2 := &recSink{}
	o.sink = s2
	o.replayLocked(s2, 8)
	o.ackLocked(2) // the notification and message 9
	if o.canResumeLocked(8) || !o.canResumeLocked(9) {
		t.Errorf("after the resumed socket acked 2 writes: acked %d", o.acked)
	}
	o.mu.Unlock()
}

func TestOutboxOverflowOnlyWhileDetached(t *testing.T) {
	s := &recSink{}
	big := []byte(strings.Repeat("x", 600))
	o := &outbox{limit: 2048, sink: s}
	for range 20 { // attached: old copies are dropped, no overflow
		if o.deliver(append([]byte(nil), big...), nil, false) {
			t.Fatal("overflow while attached")
		}
	}
	if o.keptBytes() > 2048+1024 {
		t.Fatalf("%d bytes kept over a 2048 limit", o.keptBytes())
	}
	o.mu.Lock()
	o.sink = nil
	o.mu.Unlock()
	overflow := false
	for range 20 {
		overflow = o.deliver(append([]byte(nil), big...), nil, false) || overflow
	}
	if !overflow {
		t.Fatal("no overflow after 12 KB while detached with a 2 KB buffer")
	}
	o.mu.Lock()
	if o.canResumeLocked(o.sent - 1) {
		t.Error("a resume after an overflow must be refused")
	}
	o.mu.Unlock()
	o.release()
	if o.keptBytes() != 0 {
		t.Fatal("release kept bytes")
	}
}

func TestOutboxSinceFiltersBySession(t *testing.T) {
	o := &outbox{limit: 1 << 20}
	a, b := &Session{}, &Session{}
	o.deliver(msgN(1), a, false)
	o.deliver(msgN(2), b, false)
	o.deliver(msgN(3), a, false)
	o.deliver(msgN(4), nil, false)
	o.mu.Lock()
	got := o.sinceLocked(a, 1)
	o.mu.Unlock()
	if len(got) != 1 || string(got[0]) != `{"n":3}` {
		t.Fatalf("since(a, 1) = %q", got)
	}
}

func TestWithResumeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"protocolVersion":1}`, `{"_meta":{"acpgate":{"resumeToken":"T"}},"protocolVersion":1}`},
		{`{}`, `{"_meta":{"acpgate":{"resumeToken":"T"}}}`},
		{`{"a":1,"_meta":{"x":true}}`, `{"a":1,"_meta":{"acpgate":{"resumeToken":"T"},"x":true}}`},
		{`{"_meta": { }, "b": 2}`, `{"_meta": {"acpgate":{"resumeToken":"T"} }, "b": 2}`},
		{`{"_meta":null}`, `{"_meta":null}`},                                                                       // not an object: left alone
		{`{"_meta":{"acpgate":{"x":1}}}`, `{"_meta":{"acpgate":{"x":1}}}`},                                         // the agent's own key stays
		{`{"s":"_meta","n":{"_meta":1}}`, `{"_meta":{"acpgate":{"resumeToken":"T"}},"s":"_meta","n":{"_meta":1}}`}, // only the top level counts
	} {
		if got := string(acp.WithAcpgateMeta([]byte(tc.in), "T", "")); got != tc.want {
			t.Errorf("acp.WithAcpgateMeta(%s, T) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// writtenSink is a recSink that says how many messages it has written.
type writtenSink struct {
	recSink
	written int64
}

func (w *writtenSink) Written() int64 { return w.written }

// A kept message dropped for room goes back to the buffer pool only once
// the sink has written it; one it may still be writing is left alone.
func TestOutboxPoolsOnlyWrittenMessagesItDrops(t *testing.T) {
	s := &writtenSink{}
	var pooled []string
	o := &outbox{limit: 4 * 512, sink: s, put: func(b []byte) { pooled = append(pooled, string(b)) }} // room for 4
	for i := 1; i <= 6; i++ {
		o.deliver(append(make([]byte, 0, 512), msgN(i)...), nil, false)
	}
	if len(pooled) != 0 {
		t.Fatalf("pooled %v, dropped before the sink wrote them", pooled)
	}
	s.written = 8 // the sink has written everything so far, and 2 more to come
	for i := 7; i <= 10; i++ {
		o.deliver(append(make([]byte, 0, 512), msgN(i)...), nil, false)
	}
	// Dropped for 7..10: 3..6, all written (1 and 2 went unwritten).
	if want := `{"n":3} {"n":4} {"n":5} {"n":6}`; strings.Join(pooled, " ") != want {
		t.Fatalf("pooled %v, want %s", pooled, want)
	}
}
