package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Every goroutine a test starts must end with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func event(i int) Event {
	return Event{Event: "prompt.started", Tenant: "acme", Subject: "alice", Agent: "default", Conn: "c1",
		Session: fmt.Sprintf("s%d", i), Fields: []Field{F("turn", i), F("stop", "end_turn")}}
}

func recordN(l *Log, from, to int) {
	for i := from; i < to; i++ {
		l.Record(event(i))
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// mustVerify verifies files, which must hold want lines intact, and
// returns the report.
func mustVerify(t *testing.T, want int, files ...string) *Report {
	t.Helper()
	rep, err := Verify(files, nil)
	if err != nil || rep.Lines != want {
		t.Fatalf("Verify %v: %d lines, %v; want %d intact", files, rep.Lines, err, want)
	}
	return rep
}

func TestLineAndChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 3)
	l.Record(Event{Event: "session.closed", Fields: []Field{F("prev", "forged"), F("ts", 1), F("ch", make(chan int))}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v, %v; want mode 0600", st, err)
	}
	lines := readLines(t, path)
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6 (started, 4 events, stopped):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var started struct{ Event, Boot, Prev string }
	if err := json.Unmarshal([]byte(lines[0]), &started); err != nil || started.Event != EventStarted || len(started.Boot) != 32 ||
		started.Prev != Genesis || !strings.Contains(lines[0], `"seq":1,`) {
		t.Errorf("line 1 = %s; want gateway.started with a boot ID, seq 1, chained to Genesis", lines[0])
	}
	if !strings.Contains(lines[5], `"event":"`+EventStopped+`"`) || !strings.Contains(lines[5], `"seq":6,`) {
		t.Errorf("line 6 = %s; want gateway.stopped, seq 6", lines[5])
	}
	want := `,"event":"prompt.started","tenant":"acme","subject":"alice","agent":"default","conn":"c1","session":"s0",` +
		`"turn":0,"stop":"end_turn","seq":2,"prev":"` + sum([]byte(lines[0])) + `"}`
	if !strings.HasPrefix(lines[1], `{"ts":"`) || !strings.HasSuffix(lines[1], want) {
		t.Errorf("line 2 = %s\nwant {\"ts\":…%s", lines[1], want)
	}
	var v struct{ TS, Prev string }
	if err := json.Unmarshal([]byte(lines[1]), &v); err != nil {
		t.Fatal(err)
	}
	if ts, err := time.Parse(time.RFC3339Nano, v.TS); err != nil || len(v.TS) != len("2006-01-02T15:04:05.000000000Z") ||
		time.Since(ts) > time.Minute {
		t.Errorf("ts %q: %v", v.TS, err)
	}
	for i := 1; i < len(lines); i++ {
		if !strings.HasSuffix(lines[i], fmt.Sprintf(`,"seq":%d,"prev":"%s"}`, i+1, sum([]byte(lines[i-1])))) {
			t.Errorf("line %d does not chain to line %d: %s", i+1, i, lines[i])
		}
	}
	last := lines[4]
	if !strings.Contains(last, `"ch":"(not encodable: unsupported type: chan int)"`) ||
		strings.Contains(last, "forged") || strings.Contains(last, `"ts":1`) || strings.Contains(last, `"tenant"`) {
		t.Errorf("line 5 = %s; want the common keys unset and the reserved fields left out", last)
	}
	if rep := mustVerify(t, 6, path); rep.Head != "" || len(rep.Gaps) != 0 || rep.Unnumbered != 0 {
		t.Errorf("Verify of a whole trail: %+v", rep)
	}
	if h, err := Last([]string{path}); err != nil || h != sum([]byte(lines[5])) {
		t.Errorf("Last = %s, %v", h, err)
	}
}

// A trail reopened after a restart chains to its last line.
func TestOpenExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	for i := range 3 {
		l, err := Open(Config{File: path}, nil)
		if err != nil {
			t.Fatal(err)
		}
		recordN(l, 2*i, 2*i+2)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if rep := mustVerify(t, 12, path); len(rep.Gaps) != 0 { // three runs: started, 2 events, stopped
		t.Errorf("gaps in a trail closed each time: %v", rep.Gaps)
	}
}

// A last line cut off (a crash in the middle of a write) is dropped at the
// next open, and the next line chains to the one before it: Verify points
// at the cut line before, and passes the trail after, which shows the
// unclean end as a gap of an unknown count.
func TestOpenCutOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path) // started, 3 events, stopped
	if err := os.WriteFile(path, []byte(lines[0]+"\n"+lines[1]+"\n"+lines[2]+"\n"+lines[3][:20]), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify([]string{path}, nil); err == nil || !strings.Contains(err.Error(), "line 4: cut off") {
		t.Fatalf("Verify: %v; want line 4 cut off", err)
	}
	var logs bytes.Buffer
	l, err = Open(Config{File: path}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 3, 4)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "cut off") {
		t.Errorf("no warning logged: %s", logs.String())
	}
	got := readLines(t, path)
	if len(got) != 7 || got[2] != lines[2] || !strings.HasSuffix(got[3], `"prev":"`+sum([]byte(lines[2]))+`"}`) ||
		!strings.Contains(got[3], EventStarted) || !strings.Contains(got[4], `"event":"audit.gap","reason":"unclean_shutdown","seq":2,`) {
		t.Fatalf("after reopening: %q", got)
	}
	rep := mustVerify(t, 7, path)
	if len(rep.Gaps) != 1 || rep.Gaps[0] != (Gap{File: path, Line: 5, Lost: -1, Reason: GapUncleanShutdown}) {
		t.Errorf("gaps %v; want the unclean shutdown at line 5", rep.Gaps)
	}
}

// A trail whose last line is not gateway.stopped (the run before was
// killed) gets a gap of an unknown count at the next open; one of an
// acpgate before seq numbers does not.
func TestOpenAfterCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 2)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	killed := strings.Join(lines[:3], "\n") + "\n" // as if killed before its close
	if err := os.WriteFile(path, []byte(killed), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err = Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, 6, path); len(rep.Gaps) != 1 || rep.Gaps[0].Line != 5 || rep.Gaps[0].Lost != -1 ||
		rep.Gaps[0].String() != path+": line 5: gap: an unknown number of events lost (unclean_shutdown)" {
		t.Errorf("gaps %v; want one of an unknown count at line 5", rep.Gaps)
	}

	old := filepath.Join(t.TempDir(), "old.jsonl")
	line := `{"ts":"2026-01-01T00:00:00.000000000Z","event":"x","prev":"` + Genesis + `"}`
	if err := os.WriteFile(old, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err = Open(Config{File: old}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, 3, old); len(rep.Gaps) != 0 || rep.Unnumbered != 1 {
		t.Errorf("an older trail: %+v; want no gap, one line without seq", rep)
	}
}

// Reopen (after logrotate moved the file): the new file's first line
// chains to the old file's last.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 3)
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err != nil { // the pending lines go to the old file
		t.Fatal(err)
	}
	recordN(l, 3, 5)
	if err := l.Reopen(); err != nil { // a reopen without a rotation changes nothing
		t.Fatal(err)
	}
	recordN(l, 5, 6)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(readLines(t, path+".1")); n != 4 {
		t.Fatalf("old file: %d lines, want 4 (started, 3 events)", n)
	}
	mustVerify(t, 8, path+".1", path)
	if rep := mustVerify(t, 4, path); !strings.Contains(rep.Head, "line 1 chains to a line not given") {
		t.Errorf("Verify of the new file alone: head %q", rep.Head)
	}
	if _, err := Verify([]string{path, path + ".1"}, nil); err == nil ||
		!strings.HasPrefix(err.Error(), path+".1: line 1: prev is not the SHA-256 of the last line of "+path+" (line 4)") {
		t.Errorf("Verify out of order: %v", err)
	}
	if err := l.Reopen(); err == nil {
		t.Error("Reopen after Close: no error")
	}
	l.Record(event(9))
	if l.Dropped() != 1 {
		t.Errorf("Record after Close: dropped %d, want 1", l.Dropped())
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestReopenFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "audit.jsonl")
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 1)
	if err := os.Rename(filepath.Dir(path), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err == nil {
		t.Fatal("Reopen into a missing directory: no error")
	}
	recordN(l, 1, 2) // to the old file, still open
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, 4, filepath.Join(dir, "moved", "audit.jsonl"))
}

func TestStdout(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	old := os.Stdout
	os.Stdout = f
	l, err := Open(Config{File: "-"}, nil)
	os.Stdout = old
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 2)
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	recordN(l, 2, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(nil); err != nil {
		t.Fatalf("Close closed standard output: %v", err)
	}
	mustVerify(t, 5, f.Name())
}

// Lines wait at most FlushEvery before they are written.
func TestFlushEvery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(Config{File: path, FlushEvery: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recordN(l, 0, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, _ := os.ReadFile(path); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the line was not written within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeSink is a file in memory whose writes can stall or fail.
type fakeSink struct {
	mu      sync.Mutex
	data    []byte
	fail    bool          // writes write half and fail with ENOSPC
	stall   chan struct{} // writes wait until it is closed
	stalled chan struct{} // gets one value per write waiting
}

var errNoSpace = errors.New("no space left on device")

func (s *fakeSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	stall := s.stall
	s.mu.Unlock()
	if stall != nil {
		s.stalled <- struct{}{}
		<-stall
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		s.data = append(s.data, p[:len(p)/2]...)
		return len(p) / 2, errNoSpace
	}
	s.data = append(s.data, p...)
	return len(p), nil
}

func (s *fakeSink) Truncate(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = s.data[:n]
	return nil
}

func (s *fakeSink) Close() error { return nil }

func (s *fakeSink) setFail(b bool) {
	s.mu.Lock()
	s.fail = b
	s.mu.Unlock()
}

// counters counts a Log's hooks.
type counters struct {
	written, dropped, errors atomic.Int64
	errorCh                  chan struct{}
}

func (c *counters) config(cfg Config) Config {
	c.errorCh = make(chan struct{}, 16)
	cfg.Written = func(string) { c.written.Add(1) }
	cfg.Dropped = func(n int) { c.dropped.Add(int64(n)) }
	cfg.WriteError = func() {
		c.errors.Add(1)
		select {
		case c.errorCh <- struct{}{}:
		default:
		}
	}
	return cfg
}

// A stalled disk: Record does not block; what does not fit is dropped,
// counted, and said by a gap line once the trail writes again.
func TestBufferFull(t *testing.T) {
	sink := &fakeSink{stalled: make(chan struct{}, 100)}
	var c counters
	l := start(c.config(Config{File: "fake", Buffer: 4, FlushEvery: time.Millisecond}), slog.New(slog.DiscardHandler), sink, tail{hash: Genesis})
	stall := make(chan struct{})
	sink.mu.Lock()
	sink.stall = stall
	sink.mu.Unlock()
	recordN(l, 0, 1)
	<-sink.stalled // the writer waits on the disk
	done := make(chan struct{})
	go func() { // ends after its Records, bounded by the test's wait
		defer close(done)
		recordN(l, 1, 101)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a stalled disk")
	}
	close(stall)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// started, 5 events, the gap, stopped
	if d := l.Dropped(); d != 96 || d != c.dropped.Load() || c.written.Load() != 8 {
		t.Errorf("dropped %d (hook %d), written %d; want 96 dropped (the buffer holds 4), 8 lines written", d, c.dropped.Load(), c.written.Load())
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, sink.data, 0o600); err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, 8, path)
	if len(rep.Gaps) != 1 || rep.Gaps[0] != (Gap{File: path, Line: 7, Lost: 96, Reason: GapQueueFull}) {
		t.Errorf("gaps %v; want 96 lost to a full queue at line 7", rep.Gaps)
	}
}

// A write that fails is counted and undone; the next line chains to the
// last line written, after a gap line saying how many events were lost.
func TestWriteError(t *testing.T) {
	sink := &fakeSink{}
	var c counters
	var logs bytes.Buffer
	l := start(c.config(Config{File: "fake", FlushEvery: time.Millisecond}), slog.New(slog.NewTextHandler(&logs, nil)), sink, tail{hash: Genesis})
	recordN(l, 0, 2)
	waitFor(t, func() bool { return c.written.Load() == 3 }) // started and two events
	sink.setFail(true)
	for i := 2; i < 4; i++ { // two events lost, one error logged
		recordN(l, i, i+1)
		waitFor(t, func() bool { return c.dropped.Load() == int64(i-1) })
	}
	sink.setFail(false)
	recordN(l, 4, 5)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The gap line is tried again at each flush while writes fail.
	if c.errors.Load() < 2 || c.dropped.Load() != 2 || c.written.Load() != 6 {
		t.Errorf("write errors %d, dropped %d, written %d; want 2 or more, 2, 6", c.errors.Load(), c.dropped.Load(), c.written.Load())
	}
	if n := strings.Count(logs.String(), "audit trail write failed"); n != 1 {
		t.Errorf("%d write errors logged, want 1 a minute:\n%s", n, logs.String())
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, sink.data, 0o600); err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, 6, path)
	if len(rep.Gaps) != 1 || rep.Gaps[0] != (Gap{File: path, Line: 4, Lost: 2, Reason: GapWriteFailed}) {
		t.Errorf("gaps %v; want 2 lost to failed writes at line 4", rep.Gaps)
	}
	if lines := readLines(t, path); !strings.Contains(lines[4], `"session":"s4"`) || !strings.Contains(lines[4], `"seq":5,`) {
		t.Errorf("line 5 = %s, want s4's, seq 5", lines[4])
	}
}

// /dev/full: every write fails with ENOSPC; Record goes on without
// blocking, and the errors are counted.
func TestDevFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	var c counters
	l, err := Open(c.config(Config{File: "/dev/full", FlushEvery: time.Millisecond}), nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 1)
	select {
	case <-c.errorCh:
	case <-time.After(5 * time.Second):
		t.Fatal("no write error counted")
	}
	recordN(l, 1, 1000)
	if err := l.Close(); err != nil && !strings.Contains(err.Error(), "no space") {
		t.Fatal(err)
	}
	if c.written.Load() != 0 || c.dropped.Load() != 1000 {
		t.Errorf("written %d, dropped %d; want 0 and 1000", c.written.Load(), c.dropped.Load())
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Stat makes fakeSink a regular file of its size (fileSize).
func (s *fakeSink) Stat() (os.FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fakeInfo(len(s.data)), nil
}

type fakeInfo int64

func (fi fakeInfo) Name() string       { return "fake" }
func (fi fakeInfo) Size() int64        { return int64(fi) }
func (fi fakeInfo) Mode() os.FileMode  { return 0o600 }
func (fi fakeInfo) ModTime() time.Time { return time.Time{} }
func (fi fakeInfo) IsDir() bool        { return false }
func (fi fakeInfo) Sys() any           { return nil }

// logrotate's copytruncate copies the file and cuts it to nothing without
// a reopen; a write that fails afterwards is undone back to that, not to
// the size before the cut, and the trail's two parts verify in order.
func TestCopyTruncateThenWriteError(t *testing.T) {
	sink := &fakeSink{}
	var c counters
	l := start(c.config(Config{File: "fake", FlushEvery: time.Millisecond}), slog.New(slog.DiscardHandler), sink, tail{hash: Genesis})
	recordN(l, 0, 2)
	waitFor(t, func() bool { return c.written.Load() == 3 })
	sink.mu.Lock()
	rotated := sink.data
	sink.data = nil // copytruncate
	sink.fail = true
	sink.mu.Unlock()
	recordN(l, 2, 3)
	select {
	case <-c.errorCh:
	case <-time.After(5 * time.Second):
		t.Fatal("no write error counted")
	}
	sink.setFail(false)
	recordN(l, 3, 4)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	old, cur := filepath.Join(dir, "audit.jsonl.1"), filepath.Join(dir, "audit.jsonl")
	if err := os.WriteFile(old, rotated, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cur, sink.data, 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, 6, old, cur); len(rep.Gaps) != 1 || rep.Gaps[0].Lost != 1 || rep.Gaps[0].File != cur {
		t.Errorf("gaps %v; want one event lost at the start of %s", rep.Gaps, cur)
	}
}
