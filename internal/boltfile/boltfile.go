// Package boltfile opens the embedded databases (bbolt) the gateway keeps
// local state in: created 0600 in a directory made 0700 if missing, with
// its buckets, one process at a time.
package boltfile

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// lockWait is how long Open waits for another process to let go of the
// file before it fails.
const lockWait = 5 * time.Second

// Open opens (or creates) the database at path with the named buckets;
// what names the file in errors ("budget ledger").
func Open(path, what string, buckets ...[]byte) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return db, nil
}
