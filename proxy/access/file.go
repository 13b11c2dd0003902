package access

import (
	"log/slog"
	"time"

	"github.com/acpgate/acpgate/internal/boltfile"
	"github.com/acpgate/acpgate/internal/logx"
	bolt "go.etcd.io/bbolt"
)

// ownersFile keeps Owners in an embedded database (bbolt), written by one
// goroutine so that Note never waits for the disk.
type ownersFile struct {
	db     *bolt.DB
	log    *slog.Logger
	ch     chan ownerEntry
	done   chan struct{}
	closed bool          // Close has run: put drops (under Owners.mu)
	warn   *logx.Limiter // "falls behind", at most once a minute
}

type ownerEntry struct {
	k       ownerKey
	subject string
}

var ownersBucket = []byte("owners")

// ownersQueue bounds the entries waiting for the file; past it one is
// kept in memory only (and logged).
const ownersQueue = 4096

// OpenOwners is an Owners kept in the file at path too (created 0600), so
// that session/list knows who made a session after a restart. Close it.
func OpenOwners(path string, log *slog.Logger) (*Owners, error) {
	db, err := boltfile.Open(path, "session owners file", ownersBucket)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &ownersFile{db: db, log: log, ch: make(chan ownerEntry, ownersQueue), done: make(chan struct{}), warn: logx.NewLimiter(1, time.Minute)}
	go f.write()
	return &Owners{file: f}, nil
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
	return o.file.db.Close()
}

func (k ownerKey) bytes() []byte { return []byte(k.scope + "\x00" + k.agentSID) }

// put queues an owner for the file (Owners.mu held).
func (f *ownersFile) put(k ownerKey, subject string) {
	if f.closed {
		return
	}
	select {
	case f.ch <- ownerEntry{k, subject}:
	default:
		if f.warn.Allow() {
			f.log.Warn("session owners file falls behind: owners are kept in memory only", "scope", k.scope)
		}
	}
}

// write writes what Note queued, a batch per transaction.
func (f *ownersFile) write() {
	defer close(f.done)
	for e := range f.ch {
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
		err := f.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(ownersBucket)
			for _, e := range batch {
				if b.Get(e.k.bytes()) == nil {
					if err := b.Put(e.k.bytes(), []byte(e.subject)); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			f.log.Error("session owners file: a write failed; those owners are kept in memory only", "entries", len(batch), "err", err)
		}
	}
}

func (f *ownersFile) get(k ownerKey) string {
	var subject string
	err := f.db.View(func(tx *bolt.Tx) error {
		subject = string(tx.Bucket(ownersBucket).Get(k.bytes()))
		return nil
	})
	if err != nil {
		f.log.Error("session owners file: a read failed", "err", err)
	}
	return subject
}
