// Package cluster lets replicas of the gateway serve any session: an
// owner registry in Redis (which replica holds each live session and each
// connection), and signed envelopes for what one replica carries to
// another over its internal listener.
//
// The registry: every replica writes its own record (its name → the URL
// the others reach it at) and one record per session and connection it
// holds, each with the lease, renewed by a heartbeat every lease/3 and
// written again if Redis lost it. A record is taken only if free (SET NX),
// or by compare-and-set from a replica whose own record is gone (dead for
// a lease). Nothing else is kept in Redis for routing: a replica that
// cannot reach Redis goes on serving what it holds, and routes by the
// hints in connection IDs and resume tokens (<replica>.<random>) to the
// replicas it last saw.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/budget"
)

// Config is one replica's place in the cluster.
type Config struct {
	Name      string        // unique among the replicas (ValidName)
	Store     string        // redis:// URL
	Advertise string        // how the others reach its internal listener
	Key       []byte        // signs envelopes (32+ bytes)
	Lease     time.Duration // an owner's lease (default 5 s)
}

// DefaultLease is a lease when none is configured.
const DefaultLease = 5 * time.Second

// storeTimeout bounds one call to Redis: a cross-replica request whose
// route needs the store fails within it when the store is down.
const storeTimeout = time.Second

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)

// ValidName reports whether name can name a replica: it is the first part
// of connection IDs and resume tokens (<name>.<random>).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Kind is what an owner record names.
type Kind string

// Kinds of records.
const (
	KindSession Kind = "session"
	KindConn    Kind = "conn"
)

// Node is this replica in the cluster. Safe for concurrent use.
type Node struct {
	cfg       Config
	log       *slog.Logger
	rdb       *redis.Client
	storeName string // Store without its password
	sign      *signer
	metrics   *Metrics
	tracer    trace.Tracer // nil: no spans

	// Client carries envelopes to the other replicas.
	Client *http.Client

	mu    sync.Mutex
	held  map[string]time.Time // the records this replica holds (full keys) → since when pending (zero: confirmed)
	peers map[string]peerEntry // replica name → where it was last seen
	lost  map[string]string    // records another replica took, → its name

	storeFailed bool      // the last call to the store failed
	draining    bool      // SetDraining: the record says so, and this replica takes nothing new
	failedAt    time.Time // when a call to the store last failed

	fresh   map[string]struct{}     // records held but not yet written (guarded by mu)
	gone    map[string]struct{}     // records given up but not yet deleted (guarded by mu)
	onReset []func(context.Context) // run when the store is found to have lost this replica (OnReset)
	hooks   sync.WaitGroup          // onReset runs in flight
	ctx     context.Context         // Start's: ends at Close
	kick    chan struct{}           // 1-buffered: fresh records wait

	stop context.CancelFunc
	done chan struct{}
}

type peerEntry struct {
	url  string
	seen time.Time // the last time Redis had its record
}

// New connects (lazily) to cfg.Store. Start begins the heartbeat.
func New(cfg Config, log *slog.Logger, m *Metrics) (*Node, error) {
	if !ValidName(cfg.Name) {
		return nil, fmt.Errorf("cluster.name %q: want 1 to 63 of A-Z a-z 0-9 _ -", cfg.Name)
	}
	if len(cfg.Key) < 32 {
		return nil, errors.New("cluster key: need at least 32 bytes")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	rdb, name, err := budget.RedisClient(cfg.Store, "cluster.store", storeTimeout)
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	n := &Node{cfg: cfg, log: log.With("replica", cfg.Name), rdb: rdb, storeName: name, sign: newSigner(cfg.Key), metrics: m,
		held: map[string]time.Time{}, peers: map[string]peerEntry{}, lost: map[string]string{},
		fresh: map[string]struct{}{}, gone: map[string]struct{}{}, kick: make(chan struct{}, 1)}
	n.Client = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: false,
		ResponseHeaderTimeout: 0, DisableCompression: true,
	}}
	return n, nil
}

// Name is this replica's name.
func (n *Node) Name() string { return n.cfg.Name }

// StoreName is the store's URL without its password.
func (n *Node) StoreName() string { return n.storeName }

// Lease is the owner lease.
func (n *Node) Lease() time.Duration { return n.cfg.Lease }

// Metrics are the node's metrics.
func (n *Node) Metrics() *Metrics { return n.metrics }

// Start runs the heartbeat until Close.
func (n *Node) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.stop, n.done, n.ctx = cancel, make(chan struct{}), ctx
	n.heartbeat(ctx)
	go func() {
		defer close(n.done)
		t := time.NewTicker(n.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				n.heartbeat(ctx)
			case <-n.kick:
				n.flush(ctx)
			}
		}
	}()
}

// Close stops the heartbeat and gives up every record this replica holds
// (a clean stop frees its sessions at once, not a lease later).
func (n *Node) Close() {
	if n.stop != nil {
		n.stop()
		<-n.done
		n.hooks.Wait()
	}
	n.mu.Lock()
	keys := make([]string, 0, len(n.held)+len(n.gone)+1)
	for k := range n.held {
		keys = append(keys, k)
	}
	for k := range n.gone {
		keys = append(keys, k)
	}
	n.held, n.gone = map[string]time.Time{}, map[string]struct{}{}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	keys = append(keys, replicaKey(n.cfg.Name))
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 500)]
		keys = keys[len(batch):]
		if err := releaseScript.Run(ctx, n.rdb, batch, n.cfg.Name).Err(); err != nil && !errors.Is(err, redis.Nil) {
			n.storeError("release", err)
			break
		}
	}
	_ = n.rdb.Close()
	n.Client.CloseIdleConnections()
}

const prefix = "acpgate:cluster:"

func replicaKey(name string) string { return prefix + "replica:" + name }

func drainingKey(name string) string { return prefix + "draining:" + name }

// RecordKey is the registry key of a record of kind named id.
func RecordKey(kind Kind, id string) string { return prefix + string(kind) + ":" + id }

// SessionID is the registry name of a session: its tenant (the scope of
// its sealed ID) and agent, and the ID clients name it by.
func SessionID(tenant, agent, gatewayID string) string {
	return tenant + "\x00" + agent + "\x00" + gatewayID
}

// Scripts. A record's value is its owner's name; a replica's record holds
// its URL.
var (
	// claim: KEYS[1] the record, ARGV[1] me, ARGV[2] lease ms. Taken if
	// free or mine; from a replica whose record is gone (CAS on its
	// name); else the holder's name is returned.
	claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
if redis.call('EXISTS', 'acpgate:cluster:replica:' .. v) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return '+' .. v
end
return v`)
	// renew: every KEYS[i] set to ARGV[1] for ARGV[2] ms if free or mine;
	// returns, for each key another holds, key then holder.
	renewScript = redis.NewScript(`
local lost = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if (not v) or v == ARGV[1] then
    redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
  else
    table.insert(lost, k)
    table.insert(lost, v)
  end
end
return lost`)
	// release: every KEYS[i] deleted if mine (a replica record: if any).
	releaseScript = redis.NewScript(`
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v == ARGV[1] or string.sub(k, 1, 24) == 'acpgate:cluster:replica:' then
    redis.call('DEL', k)
  end
end
return 0`)
)

// heartbeat writes this replica's record and renews every record it holds.
func (n *Node) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := n.rdb.Set(ctx, replicaKey(n.cfg.Name), n.cfg.Advertise, n.cfg.Lease).Err(); err != nil {
		n.storeError("heartbeat", err)
		return
	}
	n.mu.Lock()
	draining := n.draining
	n.mu.Unlock()
	if draining {
		if err := n.rdb.Set(ctx, drainingKey(n.cfg.Name), "1", n.cfg.Lease).Err(); err != nil {
			n.storeError("heartbeat", err)
		}
	}
	added, err := n.rdb.SAdd(ctx, prefix+"replicas", n.cfg.Name).Result()
	if err != nil {
		n.storeError("heartbeat", err)
		return
	}
	if added == 1 {
		// The store did not know this replica: it is new, or the store
		// lost its data (restarted empty). What only writes once is
		// written again.
		n.mu.Lock()
		hooks := n.onReset
		n.mu.Unlock()
		for _, h := range hooks {
			n.hooks.Add(1)
			go func() { // ends with h, which ends with ctx (Close)
				defer n.hooks.Done()
				h(n.ctx)
			}()
		}
	}
	n.mu.Lock()
	keys := make([]string, 0, len(n.held))
	var stale []string
	for k, pending := range n.held {
		if !pending.IsZero() && time.Since(pending) > pendingClaim {
			delete(n.held, k) // claimed for a load that never made the session live here
			stale = append(stale, k)
			continue
		}
		keys = append(keys, k)
	}
	n.mu.Unlock()
	if len(stale) > 0 {
		if err := releaseScript.Run(ctx, n.rdb, stale, n.cfg.Name).Err(); err != nil && !errors.Is(err, redis.Nil) {
			n.storeError("release", err)
		}
	}
	if n.renew(ctx, keys) {
		n.storeOK()
	}
}

// renew writes keys as this replica's, for a lease, unless another
// replica holds one (then it is this replica's no longer). It reports
// whether the store took them all.
func (n *Node) renew(ctx context.Context, keys []string) bool {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	lease := n.cfg.Lease.Milliseconds()
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 500)]
		keys = keys[len(batch):]
		res, err := renewScript.Run(ctx, n.rdb, batch, n.cfg.Name, lease).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			n.storeError("heartbeat", err)
			return false
		}
		for i := 0; i+1 < len(res); i += 2 {
			n.log.Warn("cluster: another replica holds a record this one held", "record", res[i], "holder", res[i+1])
			n.mu.Lock()
			delete(n.held, res[i])
			n.lost[res[i]] = res[i+1]
			n.mu.Unlock()
		}
	}
	return true
}

// storeError counts and logs (once per outage) a failed call to the store.
func (n *Node) storeError(op string, err error) {
	n.metrics.StoreErrors.WithLabelValues(op).Inc()
	n.mu.Lock()
	first := !n.storeFailed
	n.storeFailed, n.failedAt = true, time.Now()
	n.mu.Unlock()
	if first {
		n.log.Warn("cluster store unavailable: serving what this replica holds", "store", n.storeName, "op", op, "err", err)
	}
}

func (n *Node) storeOK() {
	n.mu.Lock()
	was := n.storeFailed
	n.storeFailed = false
	n.mu.Unlock()
	if was {
		n.log.Info("cluster store back: records written again", "store", n.storeName)
	}
}

// failing reports whether a call to the store failed in the last 2 s and
// none succeeded since: optional reads skip it meanwhile.
func (n *Node) failing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.storeFailed && time.Since(n.failedAt) < 2*time.Second
}

// StoreError is a failure of the store, as a client is told.
type StoreError struct {
	Store string
	Err   error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("the cluster store %s is unavailable: %v", e.Store, e.Err)
}
func (e *StoreError) Unwrap() error { return e.Err }

// Claim makes this replica the owner of the record (kind, id), for a
// load about to make it live here: taken if free or this replica's, or
// from a replica that is gone. It returns the holder ("" and nil: this
// replica holds it now, until Hold confirms it or pendingClaim runs out).
func (n *Node) Claim(ctx context.Context, kind Kind, id string) (holder string, err error) {
	key := RecordKey(kind, id)
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	v, err := claimScript.Run(ctx, n.rdb, []string{key}, n.cfg.Name, n.cfg.Lease.Milliseconds()).Text()
	if err != nil {
		n.storeError("claim", err)
		return "", &StoreError{n.storeName, err}
	}
	if v == n.cfg.Name || strings.HasPrefix(v, "+") {
		if strings.HasPrefix(v, "+") {
			n.metrics.Takeovers.Inc()
			n.log.Info("cluster: took over a record from a replica that is gone", "kind", kind, "from", v[1:])
		}
		n.mu.Lock()
		if _, ok := n.held[key]; !ok {
			n.held[key] = time.Now() // pending until Hold confirms it
		}
		n.mu.Unlock()
		return "", nil
	}
	return v, nil
}

// pendingClaim is how long a Claim holds a record Hold has not confirmed
// (a load that failed): the heartbeat then gives it up.
const pendingClaim = 30 * time.Second

// OnReset runs fn (on a goroutine of its own, with a context that ends at
// Close) whenever a heartbeat finds that the store did not know this
// replica: at its first heartbeat, and after the store lost its data.
// Records this replica holds are renewed anyway; fn writes again what is
// written only once. Call it before Start.
func (n *Node) OnReset(fn func(context.Context)) {
	n.mu.Lock()
	n.onReset = append(n.onReset, fn)
	n.mu.Unlock()
}

// Hold records (kind, id) as this replica's without asking: the heartbeat
// writes it (a session made here is nobody else's).
func (n *Node) Hold(kind Kind, id string) { n.hold(RecordKey(kind, id)) }

func (n *Node) hold(key string) {
	n.mu.Lock()
	n.held[key] = time.Time{}
	delete(n.lost, key)
	delete(n.gone, key)
	n.fresh[key] = struct{}{}
	n.mu.Unlock()
	n.kickLoop()
}

// flush writes the records held since the last write, and deletes those
// given up, at once: the other replicas find a session within a round
// trip of its start, not a heartbeat later, and a session that ended is
// free as soon.
func (n *Node) flush(ctx context.Context) {
	n.mu.Lock()
	keys := make([]string, 0, len(n.fresh))
	for k := range n.fresh {
		if _, ok := n.held[k]; ok {
			keys = append(keys, k)
		}
	}
	gone := make([]string, 0, len(n.gone))
	for k := range n.gone {
		gone = append(gone, k)
	}
	n.fresh, n.gone = map[string]struct{}{}, map[string]struct{}{}
	n.mu.Unlock()
	n.renew(ctx, keys)
	if len(gone) > 0 {
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		defer cancel()
		if err := releaseScript.Run(rctx, n.rdb, gone, n.cfg.Name).Err(); err != nil && !errors.Is(err, redis.Nil) {
			n.storeError("release", err)
		}
	}
}

// Release gives up the record (kind, id), if this replica holds it. It
// never waits for the store: the node's loop deletes it at once (Close,
// if the loop has stopped).
func (n *Node) Release(kind Kind, id string) {
	key := RecordKey(kind, id)
	n.mu.Lock()
	_, ok := n.held[key]
	delete(n.held, key)
	delete(n.lost, key)
	delete(n.fresh, key)
	if ok {
		n.gone[key] = struct{}{}
	}
	n.mu.Unlock()
	if ok {
		n.kickLoop()
	}
}

// kickLoop wakes the node's loop to flush.
func (n *Node) kickLoop() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Owner is who holds the record (kind, id): "" when nobody does.
func (n *Node) Owner(ctx context.Context, kind Kind, id string) (string, error) {
	key := RecordKey(kind, id)
	n.mu.Lock()
	_, mine := n.held[key]
	n.mu.Unlock()
	if mine {
		return n.cfg.Name, nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	v, err := n.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		n.storeError("lookup", err)
		return "", &StoreError{n.storeName, err}
	}
	return v, nil
}

// Peer is the URL of replica name's internal listener and whether it is
// live (its record is in the store). With the store down, the URL last
// seen is returned as live: the request then fails or not on its own.
func (n *Node) Peer(ctx context.Context, name string) (url string, live bool, err error) {
	n.mu.Lock()
	p, ok := n.peers[name]
	n.mu.Unlock()
	if ok && time.Since(p.seen) < n.cfg.Lease/3 {
		return p.url, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	v, err := n.rdb.Get(ctx, replicaKey(name)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return p.url, false, nil
	case err != nil:
		n.storeError("lookup", err)
		if ok {
			return p.url, true, nil
		}
		return "", false, &StoreError{n.storeName, err}
	}
	n.mu.Lock()
	n.peers[name] = peerEntry{url: v, seen: time.Now()}
	n.mu.Unlock()
	return v, true, nil
}

// Replicas is every live replica, this one included, by name → URL.
func (n *Node) Replicas(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	names, err := n.rdb.SMembers(ctx, prefix+"replicas").Result()
	if err != nil {
		n.storeError("lookup", err)
		return nil, &StoreError{n.storeName, err}
	}
	out := map[string]string{n.cfg.Name: n.cfg.Advertise}
	if len(names) == 0 {
		return out, nil
	}
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = replicaKey(name)
	}
	vals, err := n.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		n.storeError("lookup", err)
		return nil, &StoreError{n.storeName, err}
	}
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[names[i]] = s
		}
	}
	n.metrics.Replicas.Set(float64(len(out)))
	return out, nil
}

// Hint is the replica named by a connection ID or resume token
// ("<replica>.<random>"), or "".
func Hint(id string) string {
	name, _, ok := strings.Cut(id, ".")
	if !ok || !ValidName(name) {
		return ""
	}
	return name
}

// endedTTL is how long an administrator's end of a session is kept.
const endedTTL = 30 * 24 * time.Hour

func endedKey(gwID string) string { return prefix + "ended:" + gwID }

// NoteEnded keeps that an administrator ended the session clients name
// gwID (a failing store is logged and counted: this replica still
// remembers it).
func (n *Node) NoteEnded(gwID string) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := n.rdb.Set(ctx, endedKey(gwID), "1", endedTTL).Err(); err != nil {
		n.storeError("ended", err)
	}
}

// Ended reports whether an administrator ended gwID on any replica (false
// while the store fails: each replica still remembers its own).
func (n *Node) Ended(gwID string) bool {
	if n.failing() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	v, err := n.rdb.Exists(ctx, endedKey(gwID)).Result()
	if err != nil {
		n.storeError("ended", err)
		return false
	}
	return v > 0
}

// SetDraining marks this replica draining in the store (renewed by the
// heartbeat): the others hand it nothing new, and Successor names another.
func (n *Node) SetDraining() {
	n.mu.Lock()
	n.draining = true
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := n.rdb.Set(ctx, drainingKey(n.cfg.Name), "1", n.cfg.Lease).Err(); err != nil {
		n.storeError("heartbeat", err)
	}
}

// Draining reports whether SetDraining was called.
func (n *Node) Draining() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.draining
}

// Successor names a live replica other than this one that is not
// draining, to take what this draining replica would otherwise start
// itself ("" when there is none, or the store cannot say). The choice
// spreads over the candidates.
func (n *Node) Successor(ctx context.Context) string {
	peers, err := n.Replicas(ctx)
	if err != nil {
		return ""
	}
	var names []string
	for name := range peers {
		if name != n.cfg.Name {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = drainingKey(name)
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	vals, err := n.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		n.storeError("lookup", err)
		return ""
	}
	var ok []string
	for i, v := range vals {
		if v == nil {
			ok = append(ok, names[i])
		}
	}
	if len(ok) == 0 {
		return ""
	}
	return ok[int(time.Now().UnixNano()%int64(len(ok)))]
}
