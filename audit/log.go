package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Genesis is the prev of a trail's very first line.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Config configures a Log.
type Config struct {
	// File is the trail's path (JSON lines, appended, created 0600), or
	// "-" for standard output.
	File string
	// Buffer bounds the events waiting for the writer (0: 4096); past it
	// Record drops them.
	Buffer int
	// FlushEvery bounds how long a written event waits in memory (0: 1s).
	FlushEvery time.Duration
	// Hooks for metrics; nil ones are skipped. Written and WriteError are
	// called on the writer's goroutine, Dropped also on Record's.
	Written    func(event string) // an event reached the trail
	Dropped    func(n int)        // events lost: buffer full, or their write failed
	WriteError func()             // a write failed (the disk is full…)
}

// sink is where the lines go: a file, or standard output.
type sink interface {
	io.Writer
	Truncate(size int64) error
	Close() error
}

// stdout is standard output as a sink: it cannot be cut back nor closed.
type stdout struct{ io.Writer }

func (stdout) Truncate(int64) error { return errors.New("standard output cannot be truncated") }
func (stdout) Close() error         { return nil }

// Log is an audit trail being written. Record encodes an event on the
// caller's goroutine and queues it; one writer goroutine (ended by Close)
// chains the lines, appends them and flushes at least every FlushEvery.
// A write that fails is undone (the file is cut back to its last good
// size) and its events are dropped, so that the next line chains to the
// last line the file holds.
type Log struct {
	cfg     Config
	log     *slog.Logger
	queue   chan queued
	reopen  chan chan error
	done    chan struct{} // closed by Close: the writer drains and ends
	ended   chan struct{} // closed by the writer when it has ended
	closing sync.Once
	closed  atomic.Bool
	dropped atomic.Int64
	result  error // the writer's last flush or close error (read after ended)

	// The writer's own.
	out      sink
	size     int64  // bytes of out known good (lines fully written)
	last     string // hex SHA-256 of the last line written
	pending  []byte // lines chained but not yet written
	events   []string
	next     string // hex SHA-256 of the last pending line
	failures int    // write errors since the last one logged
	loggedAt time.Time
}

type queued struct {
	event string
	line  []byte // the line without its prev and closing brace
}

// Open opens (or creates) the trail and starts its writer. An existing
// file's trail goes on: its first new line chains to the file's last
// complete line; a last line cut off (no newline), which no crash-free
// write leaves, is cut away first (logged).
func Open(cfg Config, log *slog.Logger) (*Log, error) {
	if cfg.File == "" {
		return nil, errors.New("audit: no file")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.File == "-" {
		return start(cfg, log, stdout{os.Stdout}, 0, Genesis), nil
	}
	f, size, last, err := openFile(cfg.File, log)
	if err != nil {
		return nil, err
	}
	return start(cfg, log, f, size, last), nil
}

// start makes a Log writing to out, whose good size and last line's hash
// are given, and starts its writer.
func start(cfg Config, log *slog.Logger, out sink, size int64, last string) *Log {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 4096
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = time.Second
	}
	l := &Log{cfg: cfg, log: log, queue: make(chan queued, cfg.Buffer), reopen: make(chan chan error),
		done: make(chan struct{}), ended: make(chan struct{}), out: out, size: size, last: last, next: last}
	go l.write() // ends with Close
	return l
}

// openFile opens path for appending (created 0600) and finds its size and
// the hash of its last complete line (Genesis when it has none).
func openFile(path string, log *slog.Logger) (*os.File, int64, string, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, 0, "", err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return f, 0, Genesis, nil // a device (/dev/full…) or an empty file
	}
	last, whole, err := lastLine(path, st.Size())
	if err != nil {
		_ = f.Close()
		return nil, 0, "", fmt.Errorf("audit: reading the end of %s: %w", path, err)
	}
	if whole < st.Size() { // a write cut off by a crash: never a line of the trail
		log.Warn("audit file's last line is cut off; dropping it and chaining to the line before", "file", path,
			"dropped_bytes", st.Size()-whole)
		if err := f.Truncate(whole); err != nil {
			_ = f.Close()
			return nil, 0, "", fmt.Errorf("audit: cutting off the incomplete last line of %s: %w", path, err)
		}
	}
	return f, whole, last, nil
}

// openAppend opens path for appending, creating it 0600.
func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return f, nil
}

// lastLine returns the hash of the last complete line of the file (of the
// given size; Genesis when it has none), and where the complete lines end
// (below size when a cut-off line, without its newline, follows them).
func lastLine(path string, size int64) (hash string, whole int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	end, err := newlineBefore(f, size)
	if err != nil || end < 0 {
		return Genesis, 0, err
	}
	begin, err := newlineBefore(f, end)
	if err != nil {
		return "", 0, err
	}
	line := make([]byte, end-begin-1)
	if _, err := f.ReadAt(line, begin+1); err != nil {
		return "", 0, err
	}
	return sum(line), end + 1, nil
}

// newlineBefore is the offset of the last newline of f before offset
// before, or -1.
func newlineBefore(f *os.File, before int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for off := before; off > 0; {
		n := min(int64(len(buf)), off)
		off -= n
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return off + int64(i), nil
		}
	}
	return -1, nil
}

// sum is the hex SHA-256 of a line (without its newline).
func sum(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}

// Record queues ev, with the time now; when the writer is behind by
// Buffer events (the disk stalls) or the Log is closed, ev is dropped and
// counted. It never blocks.
func (l *Log) Record(ev Event) {
	if l.closed.Load() {
		l.drop(1)
		return
	}
	select {
	case l.queue <- queued{event: ev.Event, line: encode(time.Now(), ev)}:
	default:
		l.drop(1)
	}
}

func (l *Log) drop(n int) {
	l.dropped.Add(int64(n))
	if l.cfg.Dropped != nil {
		l.cfg.Dropped(n)
	}
}

// Dropped returns how many events were lost (buffer full, write failed,
// recorded after Close).
func (l *Log) Dropped() int64 { return l.dropped.Load() }

// common are the keys the writer and Event's own fields write; a Field
// with one of them is left out.
var common = map[string]bool{"ts": true, "event": true, "tenant": true, "subject": true, "agent": true,
	"conn": true, "session": true, "prev": true}

// encode writes ev as a line up to its prev: {"ts":…,"event":…, …
// (without the closing brace).
func encode(ts time.Time, ev Event) []byte {
	b := make([]byte, 0, 256)
	b = append(b, `{"ts":"`...)
	b = ts.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000000Z07:00")
	b = append(b, `","event":`...)
	b = appendJSON(b, ev.Event)
	for _, f := range [...]struct{ k, v string }{{"tenant", ev.Tenant}, {"subject", ev.Subject}, {"agent", ev.Agent},
		{"conn", ev.Conn}, {"session", ev.Session}} {
		if f.v != "" {
			b = append(b, `,"`+f.k+`":`...)
			b = appendJSON(b, f.v)
		}
	}
	for _, f := range ev.Fields {
		if common[f.Key] {
			continue
		}
		b = append(b, ',')
		b = appendJSON(b, f.Key)
		b = append(b, ':')
		b = appendJSON(b, f.Value)
	}
	return b
}

// appendJSON appends v as JSON; a value encoding/json refuses is written
// as a string saying so.
func appendJSON(b []byte, v any) []byte {
	j, err := json.Marshal(v)
	if err != nil {
		j, _ = json.Marshal("(not encodable: " + strings.TrimPrefix(err.Error(), "json: ") + ")")
	}
	return append(b, j...)
}

// Reopen opens the file afresh (after logrotate moved it): the new file's
// first line chains to the last line written to the old one. Lines not
// yet written go to the old file first. With standard output it does
// nothing.
func (l *Log) Reopen() error {
	if l.cfg.File == "-" {
		return nil
	}
	reply := make(chan error, 1)
	select {
	case l.reopen <- reply:
		return <-reply
	case <-l.ended:
		return errors.New("audit: the trail is closed")
	}
}

// Close writes what is queued, closes the file and ends the writer.
// Events recorded after it are dropped.
func (l *Log) Close() error {
	l.closing.Do(func() {
		l.closed.Store(true)
		close(l.done)
	})
	<-l.ended
	return l.result
}
