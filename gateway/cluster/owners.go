package cluster

import (
	"errors"

	"github.com/redis/go-redis/v9"

	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Owners is the cluster's share of who made each session (access.Shared):
// one key per session, written behind the caller by one writer, read with
// a short bound so that a failing store only makes a session unknown.
type Owners struct {
	n         *Node
	retention time.Duration
	queue     chan ownerPut
	wg        sync.WaitGroup
	stop      chan struct{}
}

type ownerPut struct {
	key   string
	value string
}

// ownersGetTimeout bounds a read: a session/list waits at most this per
// session it does not know, and not at all while the store is failing.
const ownersGetTimeout = 300 * time.Millisecond

// NewOwners shares owners through n's store, each kept retention after
// its last use. Close stops its writer.
func (n *Node) NewOwners(retention time.Duration) *Owners {
	o := &Owners{n: n, retention: retention, queue: make(chan ownerPut, 4096), stop: make(chan struct{})}
	o.wg.Add(1)
	go o.write()
	return o
}

func ownerKey(scope, agentSID string) string { return prefix + "owner:" + scope + "\x00" + agentSID }

// Get implements access.Shared.
func (o *Owners) Get(scope, agentSID string) (string, int64) {
	if o.n.failing() {
		return "", 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), ownersGetTimeout)
	defer cancel()
	v, err := o.n.rdb.Get(ctx, ownerKey(scope, agentSID)).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			o.n.storeError("owners", err)
		}
		return "", 0
	}
	used, subject, ok := strings.Cut(v, ":")
	if !ok {
		return "", 0
	}
	u, _ := strconv.ParseInt(used, 10, 64)
	return subject, u
}

// Put implements access.Shared: queued, dropped (and counted) when the
// writer is that far behind.
func (o *Owners) Put(scope, agentSID, subject string, used int64) {
	select {
	case o.queue <- ownerPut{ownerKey(scope, agentSID), strconv.FormatInt(used, 10) + ":" + subject}:
	default:
		o.n.metrics.StoreErrors.WithLabelValues("owners_dropped").Inc()
	}
}

func (o *Owners) write() {
	defer o.wg.Done()
	for {
		select {
		case <-o.stop:
			return
		case p := <-o.queue:
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			if err := o.n.rdb.Set(ctx, p.key, p.value, o.retention).Err(); err != nil {
				o.n.storeError("owners", err)
			}
			cancel()
		}
	}
}

// Close stops the writer (what is queued is dropped: each replica's own
// memory or file still has it).
func (o *Owners) Close() {
	close(o.stop)
	o.wg.Wait()
}

// Rewrite writes every owner each yields, in batches, at once: what a
// store that lost its data (restarted empty) had.
func (o *Owners) Rewrite(ctx context.Context, each func(yield func(scope, agentSID, subject string, used int64))) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pipe := o.n.rdb.Pipeline()
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		if _, err := pipe.Exec(ctx); err != nil {
			o.n.storeError("owners", err)
		}
		n = 0
	}
	each(func(scope, agentSID, subject string, used int64) {
		pipe.Set(ctx, ownerKey(scope, agentSID), strconv.FormatInt(used, 10)+":"+subject, o.retention)
		if n++; n == 500 {
			flush()
		}
	})
	flush()
}
