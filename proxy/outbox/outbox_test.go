package outbox

import (
	"fmt"
	"strings"
	"testing"
)

// recSink records what it is sent.
type recSink struct{ got []string }

func (r *recSink) Send(msg []byte, _ bool) bool { r.got = append(r.got, string(msg)); return true }
func (r *recSink) Supersede()                   {}

// session stands for what a kept message is about.
type session struct{ name string }

func msgN(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }

// greeting is the message a resumed socket gets first.
const greeting = `{"resumed":true}`

func TestOutboxReplaysAfterReceived(t *testing.T) {
	s1 := &recSink{}
	o := &Box[*session]{limit: 1 << 20, sink: s1}
	for i := 1; i <= 5; i++ {
		o.Deliver(msgN(i), nil, false)
	}
	// The socket dies; two more arrive while detached.
	o.Lock()
	o.DetachLocked()
	o.Unlock()
	for i := 6; i <= 7; i++ {
		if o.Deliver(msgN(i), nil, false) {
			t.Fatal("overflow with room to spare")
		}
	}
	o.Lock()
	defer o.Unlock()
	for _, tc := range []struct {
		received int64
		ok       bool
	}{{-1, false}, {0, true}, {3, true}, {7, true}, {8, false}} {
		if got := o.CanResumeLocked(tc.received); got != tc.ok {
			t.Errorf("canResume(%d) = %v, want %v", tc.received, got, tc.ok)
		}
	}
	s2 := &recSink{}
	if o.ResumeLocked(s2, 3, []byte(greeting)) { // the client had read 3 of the 5 sent before the drop
		t.Error("a detached box superseded a sink")
	}
	if len(s2.got) != 1 {
		t.Fatalf("ResumeLocked handed %v, want the greeting alone (the replay is CatchUp's)", s2.got)
	}
	o.Unlock()
	o.CatchUp(s2)
	o.Lock()
	if len(s2.got) == 0 || s2.got[0] != greeting {
		t.Fatalf("resumed socket got %v, want the greeting first", s2.got)
	}
	want := []string{`{"n":4}`, `{"n":5}`, `{"n":6}`, `{"n":7}`}
	if strings.Join(s2.got[1:], " ") != strings.Join(want, " ") {
		t.Fatalf("replayed %v, want %v", s2.got[1:], want)
	}
	if o.SinkLocked() != s2 {
		t.Error("the resumed socket is not the box's sink")
	}
}

func TestOutboxAckForgetsWhatTheClientRead(t *testing.T) {
	s := &recSink{}
	o := &Box[*session]{limit: 1 << 20, sink: s}
	for i := 1; i <= 10; i++ {
		o.Deliver(msgN(i), nil, false)
	}
	o.Lock()
	o.AckLocked(6) // a pong after 6 written messages
	if o.CanResumeLocked(5) || !o.CanResumeLocked(6) {
		t.Error("after an ack of 6, a resume from 5 must be refused and from 6 served")
	}
	if n := len(o.kept) - o.first; n != 4 {
		t.Errorf("%d messages kept after the ack, want 4", n)
	}
	// A resumed socket: the greeting is its first write and is not
	// numbered.
	s2 := &recSink{}
	if !o.ResumeLocked(s2, 8, []byte(greeting)) {
		t.Error("the resume did not supersede the live socket")
	}
	o.Unlock()
	o.CatchUp(s2)
	o.Lock()
	o.AckLocked(2) // the greeting and message 9
	if o.CanResumeLocked(8) || !o.CanResumeLocked(9) {
		t.Errorf("after the resumed socket acked 2 writes: acked %d", o.acked)
	}
	o.Unlock()
}

func TestOutboxOverflowOnlyWhileDetached(t *testing.T) {
	s := &recSink{}
	big := []byte(strings.Repeat("x", 600))
	o := &Box[*session]{}
	o.Init(s, 2048)
	for range 20 { // attached: old copies are dropped, no overflow
		if o.Deliver(append([]byte(nil), big...), nil, false) {
			t.Fatal("overflow while attached")
		}
	}
	if o.KeptBytes() > 2048+1024 {
		t.Fatalf("%d bytes kept over a 2048 limit", o.KeptBytes())
	}
	o.Lock()
	o.DetachLocked()
	o.Unlock()
	overflow := false
	for range 20 {
		overflow = o.Deliver(append([]byte(nil), big...), nil, false) || overflow
	}
	if !overflow {
		t.Fatal("no overflow after 12 KB while detached with a 2 KB buffer")
	}
	o.Lock()
	if o.CanResumeLocked(o.SentLocked() - 1) {
		t.Error("a resume after an overflow must be refused")
	}
	o.Unlock()
	o.Release()
	if o.KeptBytes() != 0 {
		t.Fatal("release kept bytes")
	}
	if o.Limit() != 0 {
		t.Fatal("a released box still keeps messages")
	}
}

func TestOutboxSinceFiltersBySession(t *testing.T) {
	o := &Box[*session]{limit: 1 << 20}
	a, b := &session{"a"}, &session{"b"}
	o.Deliver(msgN(1), a, false)
	o.Deliver(msgN(2), b, false)
	o.Deliver(msgN(3), a, false)
	o.Deliver(msgN(4), nil, false)
	o.Lock()
	got := o.SinceLocked(a, 1)
	o.Unlock()
	if len(got) != 1 || string(got[0]) != `{"n":3}` {
		t.Fatalf("since(a, 1) = %q", got)
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
	o := &Box[*session]{limit: 4 * 512, sink: s, put: func(b []byte) { pooled = append(pooled, string(b)) }} // room for 4
	for i := 1; i <= 6; i++ {
		o.Deliver(append(make([]byte, 0, 512), msgN(i)...), nil, false)
	}
	if len(pooled) != 0 {
		t.Fatalf("pooled %v, dropped before the sink wrote them", pooled)
	}
	s.written = 8 // the sink has written everything so far, and 2 more to come
	for i := 7; i <= 10; i++ {
		o.Deliver(append(make([]byte, 0, 512), msgN(i)...), nil, false)
	}
	// Dropped for 7..10: 3..6, all written (1 and 2 went unwritten).
	if want := `{"n":3} {"n":4} {"n":5} {"n":6}`; strings.Join(pooled, " ") != want {
		t.Fatalf("pooled %v, want %s", pooled, want)
	}
}

// hookSink is a sink whose Send runs a hook first (a delivery racing the
// catch-up) and refuses once refuseAt messages came.
type hookSink struct {
	recSink
	hook     func(n int)
	refuseAt int
}

func (h *hookSink) Send(msg []byte, wait bool) bool {
	if h.refuseAt > 0 && len(h.got) >= h.refuseAt {
		return false
	}
	h.recSink.Send(msg, wait)
	if h.hook != nil {
		h.hook(len(h.got))
	}
	return true
}

// What arrives while a resumed socket catches up waits behind the replay:
// every message once, in order, with the Box unlocked while the sink
// takes each one (the hook delivers from inside Send, which would
// deadlock if CatchUp held the lock).
func TestOutboxCatchUpQueuesArrivalsBehindReplay(t *testing.T) {
	o := &Box[*session]{limit: 1 << 20, sink: &recSink{}}
	for i := 1; i <= 5; i++ {
		o.Deliver(msgN(i), nil, false)
	}
	o.Lock()
	o.DetachLocked()
	o.Unlock()
	s2 := &hookSink{}
	next := 6
	s2.hook = func(n int) {
		if n >= 2 && n <= 5 { // while the replay is under way (not the greeting, sent locked): two arrive per message taken
			for range 2 {
				if o.Deliver(msgN(next), nil, false) {
					t.Error("overflow with room to spare")
				}
				next++
			}
		}
	}
	o.Lock()
	o.ResumeLocked(s2, 2, []byte(greeting))
	if !o.catching {
		t.Error("a resumed sink is not catching up")
	}
	o.Unlock()
	o.CatchUp(s2)
	o.Lock()
	if o.catching {
		t.Error("still catching up after CatchUp returned")
	}
	o.Unlock()
	o.Deliver(msgN(next), nil, false) // live again: handed at once
	var want []string
	for i := 3; i <= next; i++ {
		want = append(want, string(msgN(i)))
	}
	if got := strings.Join(s2.got[1:], " "); got != strings.Join(want, " ") {
		t.Fatalf("resumed socket got %s, want %s", got, strings.Join(want, " "))
	}
}

// A resumed socket that refuses a message (its socket is closing) stops
// the catch-up; what is left stays kept, and a detach then makes a
// take-over start from the last message the socket was handed.
func TestOutboxCatchUpStopsWhenSinkRefuses(t *testing.T) {
	o := &Box[*session]{limit: 1 << 20}
	for i := 1; i <= 6; i++ {
		o.Deliver(msgN(i), nil, false)
	}
	s := &hookSink{refuseAt: 3} // the greeting and two messages
	o.Lock()
	o.ResumeLocked(s, 0, []byte(greeting))
	o.Unlock()
	o.CatchUp(s)
	if len(s.got) != 3 {
		t.Fatalf("sink took %v, want the greeting and 2 messages", s.got)
	}
	o.Deliver(msgN(7), nil, false)
	o.Lock()
	defer o.Unlock()
	if !o.catching || len(s.got) != 3 {
		t.Fatal("a delivery reached a socket that refused its catch-up")
	}
	if h := o.HandedLocked(); h != 3 { // 1, 2, and the 3rd it refused
		t.Errorf("handed %d, want 3", h)
	}
	o.DetachLocked()
	if o.catching || !o.CanResumeLocked(2) {
		t.Error("after the detach the box must be resumable from what the socket got")
	}
}

// More arriving during a catch-up than the replay buffer holds drops
// messages the resumed socket never got: an overflow, which ends the
// catch-up and which the delivery reports.
func TestOutboxCatchUpOverflow(t *testing.T) {
	big := func() []byte { return append(make([]byte, 0, 600), strings.Repeat("x", 600)...) }
	o := &Box[*session]{}
	o.Init(nil, 4096)
	for range 4 {
		o.Deliver(big(), nil, false)
	}
	overflow := false
	s := &hookSink{}
	s.hook = func(n int) {
		if n == 2 { // the first replayed message: a burst arrives
			for range 10 {
				overflow = o.Deliver(big(), nil, false) || overflow
			}
		}
	}
	o.Lock()
	o.ResumeLocked(s, 0, []byte(greeting))
	o.Unlock()
	o.CatchUp(s)
	if !overflow {
		t.Fatal("no overflow reported for messages dropped before the resumed socket got them")
	}
	if len(s.got) != 2 {
		t.Fatalf("the catch-up went on past an overflow: %d sent", len(s.got))
	}
}
