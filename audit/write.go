package audit

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// flushBytes: pending lines past it are written before the next tick.
const flushBytes = 256 << 10

// logEvery bounds how often write errors are logged (with a count).
const logEvery = time.Minute

// write is the writer goroutine: it chains queued lines, writes them at
// least every FlushEvery, reopens or takes a new key on request, and on
// Close writes what is left and gateway.stopped and closes the file.
func (l *Log) write() {
	defer close(l.ended)
	tick := time.NewTicker(l.cfg.FlushEvery)
	defer tick.Stop()
	for {
		select {
		case q := <-l.queue:
			l.add(q)
			if len(l.pending) >= flushBytes {
				l.flush()
			}
		case <-tick.C:
			l.flush()
		case req := <-l.ctl:
			if req.rekey { // events recorded before it keep the old key
				l.drain()
				l.rekey(req.key)
				req.reply <- nil
			} else {
				req.reply <- l.reopenFile()
			}
		case <-l.done:
			l.drain()
			l.takeFull()
			l.own()
			l.chain(EventStopped, encode(time.Now(), Event{Event: EventStopped}))
			err := l.flush()
			if cerr := l.out.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("audit: %w", cerr)
			}
			l.result = err
			return
		}
	}
}

// drain takes every queued line.
func (l *Log) drain() {
	for {
		select {
		case q := <-l.queue:
			l.add(q)
		default:
			return
		}
	}
}

// add chains a queued event, after the lines the trail owes first.
func (l *Log) add(q queued) {
	if q.lost > 0 {
		l.lose(GapQueueFull, q.lost)
	}
	l.own()
	line := q.line
	if l.cfg.Redact != nil {
		if r := l.cfg.Redact(string(line)); r != string(line) {
			line = []byte(r)
		}
	}
	l.chain(q.event, line)
	l.batch.events++
	l.takeFull()
}

// takeFull notes Record's drops that no queued event has taken: they came
// after the last one queued, so they are taken once the queue is empty.
func (l *Log) takeFull() {
	if len(l.queue) > 0 {
		return
	}
	if n := l.full.Swap(0); n > 0 {
		l.lose(GapQueueFull, n)
	}
}

// lose notes n events lost for reason (n < 0: an unknown number), for the
// next gap line.
func (l *Log) lose(reason string, n int64) {
	for i := range l.gaps {
		if g := &l.gaps[i]; g.reason == reason {
			if g.lost >= 0 && n >= 0 {
				g.lost += n
			} else {
				g.lost = -1
			}
			return
		}
	}
	l.gaps = append(l.gaps, gap{reason, n})
}

// rekey MACs the lines chained from now on under key, after an
// audit.key_changed line from the key of the last line chained.
func (l *Log) rekey(key []byte) {
	kid := KeyID(key)
	if kid == l.kid {
		return // the key in use, read again
	}
	if !l.keyOwed { // else the change owed still goes from the key before it
		l.oldKey, l.oldKid = l.key, l.kid
	}
	l.key, l.kid = key, kid
	// Before the run's gateway.started line is chained there is nothing
	// to vouch for: that line, under the new key, begins the run. Back to
	// the key of the last line chained, nothing changed.
	l.keyOwed = l.started && l.oldKid != kid
	if !l.keyOwed {
		l.oldKey, l.oldKid = nil, ""
	}
	l.own()
}

// own chains the lines the trail owes before its next event: the run's
// gateway.started line, then the key change owed, then a gap line for
// each reason events were lost since the last one.
func (l *Log) own() {
	if !l.started {
		fields := append([]Field{F("boot", l.boot)}, l.cfg.Start...)
		l.chain(EventStarted, encode(time.Now(), Event{Event: EventStarted, Fields: fields}))
		l.started, l.batch.started = true, true
		l.keyOwed, l.oldKey, l.oldKid = false, nil, "" // the run begins under the key in use
	}
	if l.keyOwed {
		line := encode(time.Now(), Event{Event: EventKeyChanged})
		if l.oldKid != "" { // old_kid is the writer's own: no Field sets it
			line = append(append(append(line, `,"old_kid":"`...), l.oldKid...), '"')
		}
		if !l.batch.keyChange {
			l.batch.keyChange, l.batch.keyFrom, l.batch.keyFromID = true, l.oldKey, l.oldKid
		}
		l.chainKeyed(EventKeyChanged, line, l.oldKey)
		l.keyOwed = false
	}
	for _, g := range l.gaps {
		fields := []Field{F("reason", g.reason)}
		if g.lost >= 0 {
			fields = append(fields, F("lost", g.lost))
		}
		l.chain(EventGap, encode(time.Now(), Event{Event: EventGap, Fields: fields}))
		l.batch.gaps = append(l.batch.gaps, g)
	}
	l.gaps = l.gaps[:0]
}

// chain numbers line (an encoded event without its closing brace), chains
// it to the one before, MACs it with a key, and holds it for flush.
func (l *Log) chain(event string, line []byte) { l.chainKeyed(event, line, nil) }

// chainKeyed is chain; with oldKey (a key change's) the line carries
// mac_old, oldKey's MAC of it up to its kid, before its mac, which then
// covers mac_old too.
func (l *Log) chainKeyed(event string, line, oldKey []byte) {
	l.seq++
	start := len(l.pending)
	l.pending = append(l.pending, line...)
	l.pending = append(l.pending, `,"seq":`...)
	l.pending = strconv.AppendUint(l.pending, l.seq, 10)
	l.pending = append(l.pending, `,"prev":"`...)
	l.pending = append(l.pending, l.next...)
	l.pending = append(l.pending, '"')
	if l.key != nil {
		l.pending = append(l.pending, `,"kid":"`...)
		l.pending = append(l.pending, l.kid...)
		l.pending = append(l.pending, '"')
		if oldKey != nil {
			macOld := lineMAC(oldKey, l.pending[start:])
			l.pending = append(l.pending, `,"mac_old":"`...)
			l.pending = append(l.pending, macOld...)
			l.pending = append(l.pending, '"')
		}
		mac := lineMAC(l.key, l.pending[start:])
		l.pending = append(l.pending, `,"mac":"`...)
		l.pending = append(l.pending, mac...)
		l.pending = append(l.pending, '"')
	}
	l.pending = append(l.pending, '}')
	l.next = sum(l.pending[start:])
	l.pending = append(l.pending, '\n')
	l.events = append(l.events, event)
}

// flush writes the pending lines, after a gap line for events lost since
// the last. On an error they are dropped, the file is cut back to its last
// good size and the chain and numbering go on from the last line it holds;
// the next write says what was lost.
func (l *Log) flush() error {
	l.takeFull()
	l.own()
	if len(l.pending) == 0 {
		return nil
	}
	l.size = l.fileSize() // what a cut-back after a failed write goes back to
	n, err := l.out.Write(l.pending)
	if err == nil {
		l.size += int64(n)
		l.last, l.lastSeq = l.next, l.seq
		if !l.keyOwed {
			l.oldKey = nil // retired: none of its lines are pending
		}
		if l.cfg.Written != nil {
			for _, ev := range l.events {
				l.cfg.Written(ev)
			}
		}
	} else {
		err = fmt.Errorf("audit: writing %d lines: %w", len(l.events), err)
		if n > 0 {
			if terr := l.out.Truncate(l.size); terr != nil {
				err = errors.Join(err, fmt.Errorf("audit: cutting the file back to its last complete line: %w", terr))
			}
		}
		l.failed(err)
	}
	l.pending = l.pending[:0]
	clear(l.events)
	l.events = l.events[:0]
	l.batch = batch{gaps: l.batch.gaps[:0]}
	return err
}

// failed counts a failed write and logs it, at most once per logEvery
// (with how many failed since).
// The batch's events are lost; its own lines (gateway.started, gap lines)
// are owed again.
func (l *Log) failed(err error) {
	b := l.batch
	l.drop(b.events)
	l.next, l.seq = l.last, l.lastSeq
	l.started = l.started && !b.started
	if b.keyChange && l.started { // the key change is owed again, from the key the file's lines end under
		l.oldKey, l.oldKid = b.keyFrom, b.keyFromID
		l.keyOwed = l.oldKid != l.kid
	}
	gaps := l.gaps
	l.gaps = nil
	for _, g := range b.gaps {
		l.lose(g.reason, g.lost)
	}
	for _, g := range gaps {
		l.lose(g.reason, g.lost)
	}
	if b.events > 0 {
		l.lose(GapWriteFailed, int64(b.events))
	}
	if l.cfg.WriteError != nil {
		l.cfg.WriteError()
	}
	l.failures++
	if now := time.Now(); now.Sub(l.loggedAt) >= logEvery {
		l.log.Error("audit trail write failed; its events are lost", "file", l.cfg.File, "err", err,
			"failures", l.failures, "dropped_total", l.dropped.Load())
		l.loggedAt, l.failures = now, 0
	}
}

// reopenFile writes the queued and pending lines to the old file, then opens the
// path afresh; the chain goes on from the last line written. If the path
// cannot be opened the old file stays.
func (l *Log) reopenFile() error {
	l.drain()
	_ = l.flush() // counted and logged
	f, err := openAppend(l.cfg.File)
	if err != nil {
		return err // the caller logs it
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	_ = l.out.Close()
	l.out, l.size = f, st.Size()
	return nil
}

// fileSize is the size of the file written to now, which logrotate's
// copytruncate may have cut since the last write (l.size when it cannot
// tell: standard output, a device).
func (l *Log) fileSize() int64 {
	st, ok := l.out.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return l.size
	}
	if fi, err := st.Stat(); err == nil && fi.Mode().IsRegular() {
		return fi.Size()
	}
	return l.size
}
