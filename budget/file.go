package budget

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/acpgate/acpgate/internal/boltfile"
	bolt "go.etcd.io/bbolt"
)

// File is a store in an embedded database file (bbolt): it survives a
// restart; one gateway process holds it at a time.
type File struct {
	path   string
	db     *bolt.DB
	pruned time.Time // when old periods were last deleted (in an Add's transaction)
}

// pruneEvery is how often an Add also deletes the periods past keepPeriods.
const pruneEvery = time.Hour

var (
	spentBucket = []byte("spent")
	keptBucket  = []byte("kept") // the sessions' kept values, by keptKey: a keptValue
)

// keepPeriods is how long past its end a period's entry stays in a file.
const keepPeriods = 45 * 24 * time.Hour

// OpenFile opens (or creates, 0600) the ledger file at path. A second
// process that opens it waits up to 5 s for the first to let go, then
// fails.
func OpenFile(path string) (*File, error) {
	db, err := boltfile.Open(path, "budget ledger", spentBucket, keptBucket)
	if err != nil {
		return nil, err
	}
	return &File{path: path, db: db}, nil
}

func (f *File) Name() string { return "file:" + f.path }

// entry is a key's value in the file.
type entry struct {
	Spent
	Next time.Time `json:"next"` // when its period ends
}

func (f *File) Get(_ context.Context, key Key) (Spent, error) {
	var e entry
	err := f.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(spentBucket).Get([]byte(key.String())); v != nil {
			return json.Unmarshal(v, &e)
		}
		return nil
	})
	if err != nil {
		return Spent{}, fmt.Errorf("budget ledger %s: %w", f.path, err)
	}
	return e.Spent, nil
}

func (f *File) Add(_ context.Context, key Key, add Spent, marks []Mark, next time.Time) (Spent, error) {
	var e entry
	err := f.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(spentBucket)
		k := []byte(key.String())
		if v := b.Get(k); v != nil {
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("entry %s: %w", k, err)
			}
		}
		e.add(add)
		if err := addMarks(tx.Bucket(keptBucket), key.Tenant, marks, &e.Spent); err != nil {
			return err
		}
		e.Next = next
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := b.Put(k, v); err != nil {
			return err
		}
		if now := time.Now(); now.Sub(f.pruned) > pruneEvery { // a write at a time: bbolt serialises them
			f.pruned = now
			if err := pruneKept(tx.Bucket(keptBucket), now); err != nil {
				return err
			}
			return prune(b, now)
		}
		return nil
	})
	if err != nil {
		return Spent{}, fmt.Errorf("budget ledger %s: %w", f.path, err)
	}
	return e.Spent, nil
}

// addMarks adds to s what each mark counts against its session's kept
// value in b, and keeps the new value (counted), in the caller's
// transaction.
func addMarks(b *bolt.Bucket, tenant string, marks []Mark, s *Spent) error {
	now := time.Now()
	for _, mk := range marks {
		k := []byte(keptKey(tenant, mk))
		var was keptValue
		v := b.Get(k)
		if v != nil {
			if err := json.Unmarshal(v, &was); err != nil {
				return fmt.Errorf("kept value %q: %w", k, err)
			}
		}
		inc, keep := counted(was.Total, v != nil, mk)
		if !keep {
			continue
		}
		nv, err := json.Marshal(keptValue{Total: mk.Total, Seen: now})
		if err != nil {
			return err
		}
		if err := b.Put(k, nv); err != nil {
			return err
		}
		s.addCost(mk.Currency, inc)
	}
	return nil
}

// pruneKept deletes the kept values last reported keepPeriods ago.
func pruneKept(b *bolt.Bucket, now time.Time) error {
	var old [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var kv keptValue
		if json.Unmarshal(v, &kv) == nil && now.Sub(kv.Seen) > keepPeriods {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return err
}

// prune deletes the entries whose period ended keepPeriods ago.
func prune(b *bolt.Bucket, now time.Time) error {
	var old [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var e entry
		if json.Unmarshal(v, &e) == nil && !e.Next.IsZero() && now.Sub(e.Next) > keepPeriods {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return err
}

func (f *File) Reset(_ context.Context, key Key) error {
	err := f.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(spentBucket).Delete([]byte(key.String())) })
	if err != nil {
		return fmt.Errorf("budget ledger %s: %w", f.path, err)
	}
	return nil
}

func (f *File) Close() error { return f.db.Close() }
