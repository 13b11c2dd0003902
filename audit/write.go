package audit

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// flushBytes: pending lines past it are written before the next tick.
const flushBytes = 256 << 10

// logEvery bounds how often write errors are logged (with a count).
const logEvery = time.Minute

// write is the writer goroutine: it chains queued lines, writes them at
// least every FlushEvery, reopens on request, and on Close writes what is
// left and closes the file.
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
		case reply := <-l.reopen:
			reply <- l.reopenFile()
		case <-l.done:
			l.drain()
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

// add chains a queued line to the one before and holds it for flush.
func (l *Log) add(q queued) {
	start := len(l.pending)
	l.pending = append(l.pending, q.line...)
	l.pending = append(l.pending, `,"prev":"`...)
	l.pending = append(l.pending, l.next...)
	l.pending = append(l.pending, `"}`...)
	l.next = sum(l.pending[start:])
	l.pending = append(l.pending, '\n')
	l.events = append(l.events, q.event)
}

// flush writes the pending lines. On an error they are dropped, the file
// is cut back to its last good size and the chain goes on from the last
// line it holds.
func (l *Log) flush() error {
	if len(l.pending) == 0 {
		return nil
	}
	l.size = l.fileSize() // what a cut-back after a failed write goes back to
	n, err := l.out.Write(l.pending)
	if err == nil {
		l.size += int64(n)
		l.last = l.next
		if l.cfg.Written != nil {
			for _, ev := range l.events {
				l.cfg.Written(ev)
			}
		}
	} else {
		err = fmt.Errorf("audit: writing %d events: %w", len(l.events), err)
		if n > 0 {
			if terr := l.out.Truncate(l.size); terr != nil {
				err = errors.Join(err, fmt.Errorf("audit: cutting the file back to its last complete line: %w", terr))
			}
		}
		l.failed(err, len(l.events))
		l.next = l.last
	}
	l.pending = l.pending[:0]
	clear(l.events)
	l.events = l.events[:0]
	return err
}

// failed counts a failed write and logs it, at most once per logEvery
// (with how many failed since).
func (l *Log) failed(err error, events int) {
	l.drop(events)
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
