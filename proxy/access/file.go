package access

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/acpgate/acpgate/internal/boltfile"
	"github.com/acpgate/acpgate/internal/logx"
	bolt "go.etcd.io/bbolt"
)

// ownersFile keeps Owners in an embedded database (bbolt), written by one
// goroutine so that Note never waits for the disk. Each record is the
// session's maker and its last use; records not used for the retention are
// deleted (at open, then every pruneEvery), and the file is compacted at
// open when that freed much of it.
type ownersFile struct {
	db     *bolt.DB
	path   string
	cfg    OwnersConfig
	log    *slog.Logger
	ch     chan ownerEntry
	done   chan struct{}
	closed bool          // Close has run: put drops (under Owners.mu)
	warn   *logx.Limiter // "falls behind", at most once a minute
}

type ownerEntry struct {
	k       ownerKey
	subject string
	used    int64
}

var ownersBucket = []byte("owners")

// ownersQueue bounds the entries waiting for the file; past it one is
// kept in memory only (and logged).
const ownersQueue = 4096

// pruneEvery is how often the writer deletes the records past retention.
func (c OwnersConfig) pruneEvery() time.Duration { return min(time.Hour, c.retention()/2) }

// OpenOwners is an Owners kept in the file at path too (created 0600), so
// that session/list knows who made a session after a restart. Records
// older than cfg.Retention are deleted now, and the file compacted if that
// freed more than half of it. Close it.
func OpenOwners(path string, log *slog.Logger, cfg OwnersConfig) (*Owners, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	db, err := boltfile.Open(path, "session owners file", ownersBucket)
	if err != nil {
		return nil, err
	}
	f := &ownersFile{db: db, path: path, cfg: cfg, log: log, ch: make(chan ownerEntry, ownersQueue), done: make(chan struct{}), warn: logx.NewLimiter(1, time.Minute)}
	deleted, err := f.prune(cfg.now())
	if err != nil {
		_ = f.db.Close()
		return nil, fmt.Errorf("session owners file %s: %w", path, err)
	}
	if deleted > 0 {
		if err := f.compact(); err != nil { // the file works uncompacted: its free pages are reused
			log.Warn("session owners file: compacting failed; it keeps its size", "err", err)
		}
		if f.db == nil { // closed for the rename, which failed
			if f.db, err = boltfile.Open(path, "session owners file", ownersBucket); err != nil {
				return nil, err
			}
		}
	}
	go f.write()
	return &Owners{cfg: cfg, file: f}, nil
}

// Close ends the file's writer once what waits is written. The zero Owners
// has nothing to close.
// Close may run more than once; a Note after it keeps the owner in
// memory only.
func (o *Owners) Close() error {
	if o.file == nil {
		return nil
	}
	o.mu.Lock()
	was := o.file.closed
	o.file.closed = true
	o.mu.Unlock()
	if was {
		return nil
	}
	close(o.file.ch) // no put sends any more: each runs under o.mu and checks closed
	<-o.file.done
	err := o.flushUses()
	if cerr := o.file.db.Close(); err == nil {
		err = cerr
	}
	return err
}

// flushUses writes the last uses the file has not had yet (Note writes a
// use at most every touchEvery), so that a restart counts the retention
// from each session's last use. The writer has ended.
func (o *Owners) flushUses() error {
	o.mu.Lock()
	var dirty []ownerEntry
	for scope, so := range o.scopes {
		for sid, rec := range so.m {
			if rec.used > rec.stored {
				dirty = append(dirty, ownerEntry{ownerKey{scope, sid}, rec.subject, rec.used})
				rec.stored = rec.used
			}
		}
	}
	o.mu.Unlock()
	if len(dirty) == 0 {
		return nil
	}
	err := o.file.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(ownersBucket)
		for _, e := range dirty {
			if err := b.Put(e.k.bytes(), encodeOwner(e.subject, e.used)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("session owners file: writing the last uses: %w", err)
	}
	return nil
}

func (k ownerKey) bytes() []byte { return []byte(k.scope + "\x00" + k.agentSID) }

// A record is 0x00, the last use (unix seconds, 8 bytes big-endian), the
// subject. A file written before last uses were kept holds the subject
// alone (it never starts with 0x00): its last use counts as the first
// open that reads it.
func encodeOwner(subject string, used int64) []byte {
	b := make([]byte, 9, 9+len(subject))
	binary.BigEndian.PutUint64(b[1:], uint64(used))
	return append(b, subject...)
}

func decodeOwner(v []byte) (subject string, used int64, legacy bool) {
	if len(v) >= 9 && v[0] == 0 {
		return string(v[9:]), int64(binary.BigEndian.Uint64(v[1:9])), false
	}
	return string(v), 0, true
}

// put queues an owner for the file (Owners.mu held); false: it was not.
func (f *ownersFile) put(k ownerKey, subject string, used int64) bool {
	if f.closed {
		return false
	}
	select {
	case f.ch <- ownerEntry{k, subject, used}:
		return true
	default:
		if f.warn.Allow() {
			f.log.Warn("session owners file falls behind: owners are kept in memory only", "scope", k.scope)
		}
		return false
	}
}

// write writes what Note queued, a batch per transaction, and deletes the
// records past retention every pruneEvery.
func (f *ownersFile) write() {
	defer close(f.done)
	tick := time.NewTicker(f.cfg.pruneEvery())
	defer tick.Stop()
	for {
		var e ownerEntry
		select {
		case <-tick.C:
			if _, err := f.prune(f.cfg.now()); err != nil {
				f.log.Error("session owners file: deleting the records past retention failed", "err", err)
			}
			continue
		case next, ok := <-f.ch:
			if !ok {
				return
			}
			e = next
		}
		batch := []ownerEntry{e}
		for more := true; more && len(batch) < 256; {
			select {
			case e, ok := <-f.ch:
				if !ok {
					more = false
					break
				}
				batch = append(batch, e)
			default:
				more = false
			}
		}
		now := f.cfg.now()
		err := f.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(ownersBucket)
			for _, e := range batch {
				subject, used := e.subject, e.used
				// (no legacy record is left: OpenOwners's prune stamped them)
				if old, oldUsed, _ := decodeOwner(b.Get(e.k.bytes())); old != "" && old != subject && now.Sub(time.Unix(oldUsed, 0)) <= f.cfg.retention() {
					subject = old // a session's maker never changes while it is remembered
				}
				if err := b.Put(e.k.bytes(), encodeOwner(subject, used)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			f.log.Error("session owners file: a write failed; those owners are kept in memory only", "entries", len(batch), "err", err)
		}
	}
}

// prune deletes the records not used for the retention, and gives the
// records of a file of before last uses the last use now.
func (f *ownersFile) prune(now time.Time) (deleted int, err error) {
	err = f.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(ownersBucket)
		var drop, stamp [][]byte
		var stamped []string
		err := b.ForEach(func(k, v []byte) error {
			subject, used, legacy := decodeOwner(v)
			switch {
			case legacy:
				stamp, stamped = append(stamp, k), append(stamped, subject)
			case now.Sub(time.Unix(used, 0)) > f.cfg.retention():
				drop = append(drop, k)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		for i, k := range stamp {
			if err := b.Put(k, encodeOwner(stamped[i], now.Unix())); err != nil {
				return err
			}
		}
		deleted = len(drop)
		return nil
	})
	if deleted > 0 && err == nil {
		f.log.Info("session owners file: forgot the sessions not used within the retention", "deleted", deleted, "retention", f.cfg.retention())
	}
	return deleted, err
}

// compact rewrites the file without its free pages when they are more than
// half of it (a bbolt file never shrinks by itself), and reopens it.
func (f *ownersFile) compact() error {
	st := f.db.Stats()
	free := st.FreePageN + st.PendingPageN
	fi, err := os.Stat(f.path)
	if err != nil {
		return err
	}
	if int64(free)*int64(f.db.Info().PageSize)*2 < fi.Size() {
		return nil
	}
	tmp := f.path + ".compact"
	_ = os.Remove(tmp)
	dst, err := boltfile.Open(tmp, "session owners file (compacting)")
	if err != nil {
		return err
	}
	err = bolt.Compact(dst, f.db, 1<<20)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	cerr := f.db.Close()
	f.db = nil
	if cerr != nil {
		_ = os.Remove(tmp)
		return cerr
	}
	if err := os.Rename(tmp, f.path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	db, err := boltfile.Open(f.path, "session owners file", ownersBucket)
	if err != nil {
		return err // f.db is nil: OpenOwners tries once more, and fails
	}
	f.db = db
	f.log.Info("session owners file: compacted", "bytes_before", fi.Size())
	return nil
}

// get is the record of k (subject "": none). Records of before last uses
// were all stamped by the prune OpenOwners runs before any get.
func (f *ownersFile) get(k ownerKey) (subject string, used int64) {
	err := f.db.View(func(tx *bolt.Tx) error {
		subject, used, _ = decodeOwner(tx.Bucket(ownersBucket).Get(k.bytes()))
		return nil
	})
	if err != nil {
		f.log.Error("session owners file: a read failed", "err", err)
	}
	return subject, used
}
