package audit

import (
	"bytes"
	"crypto/rand"
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
	// Key, if set, MACs every line (HMAC-SHA256, at least MinKeyBytes;
	// key.go); SetKey changes it.
	Key []byte
	// Start are fields of the gateway.started line each Open writes first
	// (the version…), after its boot ID.
	Start []Field
	// Redact, if set, returns an event's line with secrets taken out; the
	// writer applies it to each event before it chains it (off Record's
	// goroutine).
	Redact func(string) string
	// Hooks for metrics; nil ones are skipped. Written and WriteError are
	// called on the writer's goroutine, Dropped also on Record's.
	Written    func(event string) // a line reached the trail
	Dropped    func(n int)        // events lost: buffer full, or their write failed
	WriteError func()             // a write failed (the disk is full…)
}

// The lines the trail writes of itself.
const (
	// EventStarted is the first line an Open writes: "boot" is the ID of
	// this run, whose lines are numbered ("seq") from 1.
	EventStarted = "gateway.started"
	// EventStopped is the last line Close writes: a trail whose last line
	// is not one was not closed (a crash, SIGKILL), and the next Open
	// writes a gap of an unknown count.
	EventStopped = "gateway.stopped"
	// EventGap says events are missing before it: "lost" how many (absent:
	// unknown), "reason" why: GapQueueFull, GapWriteFailed or
	// GapUncleanShutdown.
	EventGap = "audit.gap"
	// EventKeyChanged says the lines after it are MACed under another key:
	// "old_kid" names the key before (absent: the lines before carry no
	// MAC), "kid" the new one. Its "mac_old" is the old key's MAC of the
	// line up to its kid, and its "mac" the new key's of the line up to
	// its mac_old: both keys vouch for the change, and Verify takes no
	// line under the old key after it.
	EventKeyChanged = "audit.key_changed"
)

// Why a gap's events were lost.
const (
	GapQueueFull       = "queue_full"       // Record found the writer Buffer events behind
	GapWriteFailed     = "write_failed"     // their write failed (a full disk…)
	GapUncleanShutdown = "unclean_shutdown" // the run before did not close the trail: what it held unwritten
)

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
// numbers and chains the lines, appends them and flushes at least every
// FlushEvery. A write that fails is undone (the file is cut back to its
// last good size) and its events are dropped, so that the next line chains
// to the last line the file holds. Events lost, to a full queue or a
// failed write, leave an audit.gap line saying how many and why, written
// before the next event (or at the next flush).
type Log struct {
	cfg     Config
	log     *slog.Logger
	queue   chan queued
	ctl     chan ctlReq
	done    chan struct{} // closed by Close: the writer drains and ends
	ended   chan struct{} // closed by the writer when it has ended
	closing sync.Once
	closed  atomic.Bool
	dropped atomic.Int64
	full    atomic.Int64 // events Record dropped that no queued event nor gap line has taken yet
	result  error        // the writer's last flush or close error (read after ended)

	// The writer's own.
	out     sink
	size    int64  // bytes of out known good (lines fully written)
	last    string // hex SHA-256 of the last line written
	lastSeq uint64 // seq of the last line written
	boot    string
	seq     uint64 // seq of the last line chained
	key     []byte // nil: lines carry no MAC
	kid     string
	// keyOwed: an audit.key_changed line from oldKey (the key of the last
	// line chained before it; nil: none) to key is owed.
	keyOwed  bool
	oldKey   []byte
	oldKid   string
	started  bool   // the gateway.started line is chained or written
	gaps     []gap  // losses no gap line chained says yet
	batch    batch  // what pending holds
	pending  []byte // lines chained but not yet written
	events   []string
	next     string // hex SHA-256 of the last pending line
	failures int    // write errors since the last one logged
	loggedAt time.Time
}

// gap is events lost: lost < 0 is an unknown number.
type gap struct {
	reason string
	lost   int64
}

// batch is what the pending lines hold beside events: given back to the
// writer when their write fails.
type batch struct {
	events  int   // recorded events
	started bool  // the gateway.started line
	gaps    []gap // gap lines
	// keyFrom is set when the batch holds an audit.key_changed line: the
	// key of the line before its first (nil: none), owed again if the
	// batch is lost.
	keyChange bool
	keyFrom   []byte
	keyFromID string
}

type queued struct {
	event string
	line  []byte // the line without its seq, prev and closing brace
	lost  int64  // events Record dropped just before this one
}

// ctlReq asks the writer to reopen the file, or to take a new key.
type ctlReq struct {
	rekey bool
	key   []byte
	reply chan error
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
	if len(cfg.Key) > 0 && len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("audit: the key has %d bytes, fewer than %d", len(cfg.Key), MinKeyBytes)
	}
	if cfg.File == "-" {
		return start(cfg, log, stdout{os.Stdout}, tail{hash: Genesis}), nil
	}
	f, end, err := openFile(cfg.File, log)
	if err != nil {
		return nil, err
	}
	return start(cfg, log, f, end), nil
}

// tail is what the file ends with.
type tail struct {
	size    int64  // of its complete lines
	hash    string // of its last line (Genesis: none)
	unclean bool   // the run that wrote it did not close it
}

// start makes a Log writing to out, which ends as end says, and starts its
// writer; its first line (gateway.started) is written before it returns,
// unless the write fails (then it goes with the next write).
func start(cfg Config, log *slog.Logger, out sink, end tail) *Log {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 4096
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = time.Second
	}
	l := &Log{cfg: cfg, log: log, queue: make(chan queued, cfg.Buffer), ctl: make(chan ctlReq),
		done: make(chan struct{}), ended: make(chan struct{}), out: out, size: end.size, last: end.hash, next: end.hash,
		boot: newBootID()}
	if len(cfg.Key) > 0 {
		l.key, l.kid = cfg.Key, KeyID(cfg.Key)
	}
	if end.unclean {
		l.gaps = []gap{{GapUncleanShutdown, -1}}
	}
	_ = l.flush() // counted and logged
	go l.write()  // ends with Close
	return l
}

// newBootID is a random ID for one run of the trail's writer.
func newBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// openFile opens path for appending (created 0600) and reads how it ends.
func openFile(path string, log *slog.Logger) (*os.File, tail, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, tail{}, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return f, tail{hash: Genesis}, nil // a device (/dev/full…) or an empty file
	}
	end, line, err := lastLine(path, st.Size())
	if err != nil {
		_ = f.Close()
		return nil, tail{}, fmt.Errorf("audit: reading the end of %s: %w", path, err)
	}
	end.unclean = uncleanEnd(line)
	if end.size < st.Size() { // a write cut off by a crash: never a line of the trail
		log.Warn("audit file's last line is cut off; dropping it and chaining to the line before", "file", path,
			"dropped_bytes", st.Size()-end.size)
		if err := f.Truncate(end.size); err != nil {
			_ = f.Close()
			return nil, tail{}, fmt.Errorf("audit: cutting off the incomplete last line of %s: %w", path, err)
		}
		end.unclean = true
	}
	return f, end, nil
}

// uncleanEnd reports whether line, a trail's last, shows that the run
// that wrote it did not close the trail: a numbered line other than
// gateway.started. A line without seq (an acpgate before them) tells
// nothing.
func uncleanEnd(line []byte) bool {
	var v struct {
		Event string
		Seq   *uint64
	}
	if json.Unmarshal(line, &v) != nil {
		return true
	}
	return v.Seq != nil && v.Event != EventStopped
}

// openAppend opens path for appending, creating it 0600.
func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return f, nil
}

// lastLine returns the last complete line of the file (of the given size),
// its hash (Genesis when it has none) and where the complete lines end
// (below size when a cut-off line, without its newline, follows them).
func lastLine(path string, size int64) (end tail, line []byte, err error) {
	f, err := os.Open(path)
	if err != nil {
		return tail{}, nil, err
	}
	defer f.Close()
	nl, err := newlineBefore(f, size)
	if err != nil || nl < 0 {
		return tail{hash: Genesis}, nil, err
	}
	begin, err := newlineBefore(f, nl)
	if err != nil {
		return tail{}, nil, err
	}
	line = make([]byte, nl-begin-1)
	if _, err := f.ReadAt(line, begin+1); err != nil {
		return tail{}, nil, err
	}
	return tail{size: nl + 1, hash: sum(line)}, line, nil
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
// counted (and, unless closed, said by a gap line). It never blocks.
func (l *Log) Record(ev Event) {
	if l.closed.Load() {
		l.drop(1)
		return
	}
	q := queued{event: ev.Event, line: encode(time.Now(), ev), lost: l.full.Swap(0)}
	select {
	case l.queue <- q:
	default:
		l.full.Add(q.lost + 1)
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
	"conn": true, "session": true, "seq": true, "prev": true, "kid": true, "mac": true, "old_kid": true, "mac_old": true}

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
	return l.control(ctlReq{})
}

// SetKey MACs the lines chained from now on under key (at least
// MinKeyBytes); each line names its key (kid). A key other than the one
// in use is a key change: the next line is audit.key_changed, MACed under
// both the old key and the new, after which no line is MACed under the
// old key. The key in use again changes nothing.
func (l *Log) SetKey(key []byte) error {
	if len(key) == 0 {
		return errNoKey
	}
	if len(key) < MinKeyBytes {
		return fmt.Errorf("audit: the key has %d bytes, fewer than %d", len(key), MinKeyBytes)
	}
	return l.control(ctlReq{rekey: true, key: bytes.Clone(key)})
}

// control hands req to the writer and waits for its answer.
func (l *Log) control(req ctlReq) error {
	req.reply = make(chan error, 1)
	select {
	case l.ctl <- req:
		return <-req.reply
	case <-l.ended:
		return errors.New("audit: the trail is closed")
	}
}

// Close writes what is queued and a last line, gateway.stopped, closes
// the file and ends the writer. Events recorded after it are dropped (and
// no gap line can say so).
func (l *Log) Close() error {
	l.closing.Do(func() {
		l.closed.Store(true)
		close(l.done)
	})
	<-l.ended
	return l.result
}
