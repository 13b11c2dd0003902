package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// Config configures a Relay.
type Config struct {
	Pool PoolConfig
	// ClientCaps caps what agents may be told about clients (and so what
	// they may ask of them): a client's own capabilities are intersected
	// with it.
	ClientCaps Profile
	// Sealer seals session IDs; nil = a random key per gateway process.
	Sealer *Sealer
	// Tenants lists who may connect; none = one anonymous tenant "" with
	// no path mapping.
	Tenants []TenantConfig
	// IsolateTenants keeps each tenant on agent processes of its own.
	IsolateTenants bool
}

// Relay multiplexes client connections onto the agent pool. It is the ACP
// core: it knows nothing of HTTP or WebSockets.
type Relay struct {
	pool    *Pool
	sealer  *Sealer
	log     *slog.Logger
	caps    Profile
	isolate bool
	tenants map[string]*tenant
	ctx     context.Context
	cancel  context.CancelFunc

	mu    sync.Mutex
	conns map[*Conn]struct{}
}

// NewRelay starts the agent pool. Close stops it.
func NewRelay(cfg Config, log *slog.Logger) (*Relay, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sealer := cfg.Sealer
	if sealer == nil {
		sealer = NewRandomSealer()
	}
	tenants := map[string]*tenant{}
	if len(cfg.Tenants) == 0 {
		cfg.Tenants = []TenantConfig{{}}
	}
	for _, tc := range cfg.Tenants {
		t, err := newTenant(tc)
		if err != nil {
			return nil, err
		}
		if t.mapper != nil {
			cfg.Pool.mapPaths = true
		}
		tenants[tc.Name] = t
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Relay{
		pool:    NewPool(cfg.Pool, log),
		sealer:  sealer,
		log:     log,
		caps:    cfg.ClientCaps,
		isolate: cfg.IsolateTenants,
		tenants: tenants,
		ctx:     ctx,
		cancel:  cancel,
		conns:   map[*Conn]struct{}{},
	}, nil
}

// Pool returns the agent pool.
func (r *Relay) Pool() *Pool { return r.pool }

// NewConn registers a client connection of a configured tenant. The caller
// feeds it the client's messages with Handle and calls Close when the
// client is gone.
func (r *Relay) NewConn(info ConnInfo, sink Sink) (*Conn, error) {
	ten := r.tenants[info.Tenant]
	if ten == nil {
		return nil, fmt.Errorf("unknown tenant %q", info.Tenant)
	}
	log := info.Log
	if log == nil {
		log = r.log.With("conn", info.ID)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &Conn{
		relay:      r,
		id:         info.ID,
		tenant:     info.Tenant,
		ten:        ten,
		sink:       sink,
		log:        log,
		ctx:        ctx,
		cancel:     cancel,
		sessions:   map[string]*Session{},
		clientReqs: map[string]*outReq{},
		agentReqs:  map[int64]*inReq{},
	}
	c.sc.Methods = knownMethods
	c.resolve = c.specFor
	r.mu.Lock()
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	return c, nil
}

func (r *Relay) connClosed(c *Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// Conns returns the number of open client connections.
func (r *Relay) Conns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// profileFor is the profile a client gets: its own capabilities within
// what the deployment allows.
func (r *Relay) profileFor(c *Conn, initParams []byte) (Profile, error) {
	p, err := clientProfile(initParams)
	if err != nil {
		return Profile{}, err
	}
	p = p.Intersect(r.caps)
	if r.isolate {
		p.Tenant = c.tenant
	}
	return p, nil
}

// initResult is the initialize result a client gets from the process's
// cached answer.
func (r *Relay) initResult(p *agentProc) []byte { return p.init.result }

// Close cancels waiting requests and stops every agent process.
func (r *Relay) Close(ctx context.Context) error {
	r.cancel()
	return r.pool.Close(ctx)
}
