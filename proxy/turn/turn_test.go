package turn

import (
	"testing"
	"time"
)

// client stands for a connection; prompt for a prompt request.
type client struct{ name string }

type prompt struct {
	by    *client
	ended bool
}

func (p *prompt) Ended() bool     { return p.ended }
func (p *prompt) Client() *client { return p.by }

type testTurn = Turn[*client, *prompt]

func queued(p *prompt) Queued[*prompt] { return Queued[*prompt]{Prompt: p, Line: []byte("line")} }

func pendingAll(*prompt) bool { return true }

func mustTake(t *testing.T, tu *testTurn, p *prompt, wantNow bool) {
	t.Helper()
	now, full := tu.Take(queued(p), true)
	if now != wantNow || full != nil {
		t.Fatalf("Take(%s's prompt) = now %v, full %v; want now %v, not full", p.by.name, now, full, wantNow)
	}
}

func TestOwnSecondPromptJoinsTurn(t *testing.T) {
	a := &client{"a"}
	var tu testTurn
	p1, p2 := &prompt{by: a}, &prompt{by: a}
	mustTake(t, &tu, p1, true)
	mustTake(t, &tu, p2, true) // its own turn goes on
	if !tu.IsRunning(p1) || !tu.IsRunning(p2) {
		t.Fatal("both of a's prompts should run")
	}
	if _, ok, n := tu.Done(p1, pendingAll); ok || n != 0 {
		t.Fatalf("Done(first) = ok %v, dequeued %d: the turn goes on with the second", ok, n)
	}
	if !tu.InFlight() || tu.Name() != "running" {
		t.Fatal("a's second prompt still runs")
	}
	if _, ok, _ := tu.Done(p2, pendingAll); ok {
		t.Fatal("nothing waited")
	}
	if tu.InFlight() || tu.Name() != "idle" {
		t.Fatal("the turn ended")
	}
	// Nobody's turn now: another client's prompt runs at once.
	mustTake(t, &tu, &prompt{by: &client{"b"}}, true)
}

func TestOtherClientWaits(t *testing.T) {
	a, b := &client{"a"}, &client{"b"}
	var tu testTurn
	pa, pb := &prompt{by: a}, &prompt{by: b}
	mustTake(t, &tu, pa, true)
	mustTake(t, &tu, pb, false)
	if tu.IsRunning(pb) {
		t.Fatal("a waiting prompt does not run")
	}
	next, ok, n := tu.Done(pa, pendingAll)
	if !ok || next.Prompt != pb || string(next.Line) != "line" || n != 1 {
		t.Fatalf("Done = %v, ok %v, dequeued %d; want b's prompt", next.Prompt, ok, n)
	}
	if !tu.IsRunning(pb) {
		t.Fatal("b's prompt runs now")
	}
	// The turn is b's: its own second prompt joins it, a's waits.
	mustTake(t, &tu, &prompt{by: b}, true)
	mustTake(t, &tu, &prompt{by: a}, false)
}

func TestQueueBounded(t *testing.T) {
	a, b := &client{"a"}, &client{"b"}
	var tu testTurn
	mustTake(t, &tu, &prompt{by: a}, true)
	for range MaxQueued {
		mustTake(t, &tu, &prompt{by: b}, false)
	}
	if now, full := tu.Take(queued(&prompt{by: b}), true); now || full != ErrTooMany {
		t.Fatalf("Take with %d waiting = now %v, full %v; want full", MaxQueued, now, full)
	}
	// The running client's own prompt still joins its turn.
	mustTake(t, &tu, &prompt{by: a}, true)
	if got := tu.DropQueued(nil); len(got) != MaxQueued {
		t.Fatalf("%d waited, want %d", len(got), MaxQueued)
	}
}

func TestDoneSkipsEndedAndNotPending(t *testing.T) {
	a, b, c, d := &client{"a"}, &client{"b"}, &client{"c"}, &client{"d"}
	var tu testTurn
	pa := &prompt{by: a}
	mustTake(t, &tu, pa, true)
	ended, failed, waits := &prompt{by: b}, &prompt{by: c}, &prompt{by: d}
	for _, p := range []*prompt{ended, failed, waits} {
		mustTake(t, &tu, p, false)
	}
	ended.ended = true
	pending := func(p *prompt) bool { return p != failed }
	next, ok, n := tu.Done(pa, pending)
	if !ok || next.Prompt != waits || n != 3 {
		t.Fatalf("Done = %v, ok %v, dequeued %d; want d's prompt after 3", next.Prompt, ok, n)
	}
	// The skipped prompts were never counted: their end changes nothing.
	for _, p := range []*prompt{ended, failed} {
		if _, ok, n := tu.Done(p, pendingAll); ok || n != 0 || !tu.IsRunning(waits) {
			t.Fatal("a prompt that ended waiting ended d's turn")
		}
	}
	if _, ok, n := tu.Done(waits, pendingAll); ok || n != 0 || tu.InFlight() {
		t.Fatal("d's turn should end with nothing waiting")
	}
}

func TestDoneWithNothingPending(t *testing.T) {
	a, b := &client{"a"}, &client{"b"}
	var tu testTurn
	pa, pb := &prompt{by: a}, &prompt{by: b}
	mustTake(t, &tu, pa, true)
	mustTake(t, &tu, pb, false)
	pb.ended = true
	if _, ok, n := tu.Done(pa, pendingAll); ok || n != 1 {
		t.Fatalf("Done = ok %v, dequeued %d; want none started, 1 dequeued", ok, n)
	}
	if tu.InFlight() {
		t.Fatal("no turn is in flight")
	}
	mustTake(t, &tu, &prompt{by: b}, true)
}

func TestDropQueuedByClient(t *testing.T) {
	a, b, c := &client{"a"}, &client{"b"}, &client{"c"}
	var tu testTurn
	mustTake(t, &tu, &prompt{by: a}, true)
	b1, c1, b2 := &prompt{by: b}, &prompt{by: c}, &prompt{by: b}
	for _, p := range []*prompt{b1, c1, b2} {
		mustTake(t, &tu, p, false)
	}
	got := tu.DropQueued(b)
	if len(got) != 2 || got[0].Prompt != b1 || got[1].Prompt != b2 {
		t.Fatalf("DropQueued(b) = %v", got)
	}
	if got := tu.DropQueued(b); len(got) != 0 {
		t.Fatalf("b's prompts were taken already: %v", got)
	}
	got = tu.DropQueued(nil)
	if len(got) != 1 || got[0].Prompt != c1 {
		t.Fatalf("DropQueued(nil) = %v; want c's prompt", got)
	}
}

func TestStartedUnshared(t *testing.T) {
	a := &client{"a"}
	var tu testTurn
	if p, running, last := tu.Since(); p != nil || running || !last.IsZero() {
		t.Fatal("a new turn is idle")
	}
	gone := &prompt{by: a, ended: true}
	tu.Started(gone)
	if running, _, _ := tu.Found(); running {
		t.Fatal("an ended prompt does not start a turn")
	}
	p := &prompt{by: a}
	tu.Started(p)
	if tu.IsRunning(p) {
		t.Fatal("Started does not count the prompt")
	}
	if got, running, _ := tu.Since(); got != p || !running {
		t.Fatalf("Since = %v, %v; want p running", got, running)
	}
	before := time.Now()
	if _, ok, _ := tu.Done(p, pendingAll); ok {
		t.Fatal("nothing waited")
	}
	if got, running, last := tu.Since(); got != nil || running || last.Before(before) {
		t.Fatalf("Since = %v, %v, %v; want idle, ended now", got, running, last)
	}
}

func TestEnding(t *testing.T) {
	a, b := &client{"a"}, &client{"b"}
	var tu testTurn
	mustTake(t, &tu, &prompt{by: a}, true)
	mustTake(t, &tu, &prompt{by: b}, false)
	if q, running := tu.Ending(false); len(q) != 0 || !running {
		t.Fatalf("Ending(false) = %d queued, running %v", len(q), running)
	}
	if q, running := tu.Ending(true); len(q) != 1 || !running {
		t.Fatalf("Ending(true) = %d queued, running %v", len(q), running)
	}
	if q, _ := tu.Ending(true); len(q) != 0 {
		t.Fatal("the queue was taken")
	}
}

func TestEndedWhileDetached(t *testing.T) {
	var tu testTurn
	tu.EndedWhileDetached("end_turn")
	if running, ended, stop := tu.Found(); running || !ended || stop != "end_turn" {
		t.Fatalf("Found = %v, %v, %q", running, ended, stop)
	}
	tu.Taken()
	if _, ended, stop := tu.Found(); ended || stop != "" {
		t.Fatal("Taken forgets it")
	}
}

// A client's turns, one after another, allocate nothing once the turn
// has run one.
func TestTakeDoneAllocs(t *testing.T) {
	a := &client{"a"}
	var tu testTurn
	p := &prompt{by: a}
	q := queued(p)
	allocs := testing.AllocsPerRun(100, func() {
		tu.Take(q, true)
		tu.Done(p, pendingAll)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations a turn", allocs)
	}
}

// The queue is bounded in bytes too: a line that would take it past
// MaxQueuedBytes is refused (ErrTooBig), and what leaves the queue frees
// its bytes.
func TestQueueBoundedInBytes(t *testing.T) {
	var tu testTurn
	a, b := &client{"a"}, &client{"b"}
	mustTake(t, &tu, &prompt{by: a}, true)
	half := make([]byte, MaxQueuedBytes/2)
	for range 2 {
		if now, full := tu.Take(Queued[*prompt]{Prompt: &prompt{by: b}, Line: half}, true); now || full != nil {
			t.Fatalf("Take of half the bound = now %v, %v; want it waiting", now, full)
		}
	}
	if _, full := tu.Take(Queued[*prompt]{Prompt: &prompt{by: b}, Line: []byte("x")}, true); full != ErrTooBig {
		t.Fatalf("Take past the bound: %v, want ErrTooBig", full)
	}
	if got := tu.DropQueued(b); len(got) != 2 {
		t.Fatalf("dropped %d, want 2", len(got))
	}
	if now, full := tu.Take(Queued[*prompt]{Prompt: &prompt{by: b}, Line: half}, true); now || full != nil {
		t.Fatalf("Take after the queue emptied = now %v, %v; want it waiting", now, full)
	}
}

// A prompt that may not wait (its connection has no room) is refused with
// ErrNoRoom when it would wait, and runs when it would run.
func TestTakeWithoutRoomToWait(t *testing.T) {
	var tu testTurn
	a, b := &client{"a"}, &client{"b"}
	if now, full := tu.Take(queued(&prompt{by: a}), false); !now || full != nil {
		t.Fatalf("an idle turn without room to wait: now %v, %v; want it to run", now, full)
	}
	if now, full := tu.Take(queued(&prompt{by: b}), false); now || full != ErrNoRoom {
		t.Fatalf("another's prompt without room to wait: now %v, %v; want ErrNoRoom", now, full)
	}
}

// A v2 turn the agent reports requires_action says so while it is in
// flight; the report is forgotten when the turn ends.
func TestRequiresAction(t *testing.T) {
	a := &client{"a"}
	var tu testTurn
	tu.RequiresAction(true) // no turn in flight: nothing to say
	if got := tu.Name(); got != "idle" {
		t.Fatalf("Name() = %q with no turn, want idle", got)
	}
	p := &prompt{by: a}
	mustTake(t, &tu, p, true)
	if got := tu.Name(); got != "running" {
		t.Fatalf("Name() = %q for a new turn, want running (an earlier report is forgotten)", got)
	}
	tu.RequiresAction(true)
	if got := tu.Name(); got != "requires_action" {
		t.Fatalf("Name() = %q, want requires_action", got)
	}
	tu.RequiresAction(false)
	if got := tu.Name(); got != "running" {
		t.Fatalf("Name() = %q after the agent runs again, want running", got)
	}
	tu.RequiresAction(true)
	tu.Done(p, pendingAll)
	q := &prompt{by: a}
	mustTake(t, &tu, q, true)
	if got := tu.Name(); got != "running" {
		t.Fatalf("Name() = %q for the next turn, want running", got)
	}
}
