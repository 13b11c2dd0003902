// Package gateway is acpgate's HTTP surface: the /acp WebSocket endpoint,
// health and readiness probes, and connection draining. The ACP logic
// itself lives in package proxy.
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/web"
)

// Options configures a Server.
type Options struct {
	Config *config.Config
	// AgentCommand is the agent argv to run (the config's, or the built-in
	// demo agent's); Supervisor the argv prefix of acpgate's supervisor.
	AgentCommand []string
	Supervisor   []string
	Version      string
	Logger       *slog.Logger
}

// Server is a running gateway.
type Server struct {
	cfg     *config.Config
	log     *slog.Logger
	relay   *proxy.Relay
	authn   *auth.Authenticator // nil: no authentication (no tenants)
	http    *http.Server
	started atomic.Bool
	drain   atomic.Bool

	mu          sync.Mutex
	conns       map[*wsConn]struct{}
	tenantConns map[string]int // open connections per tenant
	wg          sync.WaitGroup // one per WebSocket connection
}

// newSealer seals session IDs with the configured keys, or with a random
// key (IDs then die with the process).
func newSealer(cfg *config.Config, log *slog.Logger) (*proxy.Sealer, error) {
	keys, err := cfg.SessionKeys()
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Warn("no session_key_file configured: using a random key; session IDs will not survive a restart " +
			"or work across replicas (acpgate keygen > session.key)")
		return proxy.NewRandomSealer(), nil
	}
	return proxy.NewSealer(keys...)
}

func newAuthenticator(cfg *config.Config, log *slog.Logger) (*auth.Authenticator, error) {
	ac := auth.Config{AllowedOrigins: cfg.Auth.AllowedOrigins, TicketTTL: cfg.Auth.TicketTTL.D()}
	for _, t := range cfg.Tenants {
		ac.Tenants = append(ac.Tenants, auth.TenantTokens{Name: t.Name, TokensSHA256: t.TokensSHA256})
	}
	if j := cfg.Auth.JWT; j != nil {
		ac.JWT = &auth.JWTConfig{Issuer: j.Issuer, Audience: j.Audience, JWKSFile: j.JWKSFile, JWKSURL: j.JWKSURL,
			HS256SecretFile: j.HS256SecretFile, TenantClaim: j.TenantClaim}
	}
	return auth.New(ac, log)
}

// New builds a server and starts its agent pool.
func New(opts Options) (*Server, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(opts.AgentCommand) == 0 {
		return nil, errors.New("no agent command")
	}
	sealer, err := newSealer(cfg, log)
	if err != nil {
		return nil, err
	}
	var tenants []proxy.TenantConfig
	for _, t := range cfg.Tenants {
		tenants = append(tenants, proxy.TenantConfig{Name: t.Name, Root: t.Root, VirtualRoot: t.VirtualRoot, MaxSessions: t.MaxSessions})
	}
	var authn *auth.Authenticator
	if cfg.AuthEnabled() {
		if authn, err = newAuthenticator(cfg, log); err != nil {
			return nil, err
		}
	}
	relay, err := proxy.NewRelay(proxy.Config{
		Pool: proxy.PoolConfig{
			Agent: proxy.AgentConfig{
				Command:     opts.AgentCommand,
				Env:         cfg.Agent.Env,
				Dir:         cfg.Agent.Dir,
				Supervisor:  opts.Supervisor,
				StopGrace:   cfg.Agent.StopGrace.D(),
				InitTimeout: cfg.Agent.InitTimeout.D(),
			},
			MinIdle:               cfg.Pool.MinIdle,
			MaxProcesses:          cfg.Pool.MaxProcesses,
			MaxSessionsPerProcess: cfg.Pool.MaxSessionsPerProcess,
			MaxMessageBytes:       cfg.Limits.MaxMessageBytes,
			AcquireTimeout:        cfg.Pool.AcquireTimeout.D(),
			IdleTimeout:           cfg.Pool.IdleTimeout.D(),
			DefaultProfile:        proxy.Profile{Version: 1, FsRead: true, FsWrite: true},
			ClientVersion:         opts.Version,
		},
		ClientCaps:     proxy.AllCapabilities,
		Sealer:         sealer,
		Tenants:        tenants,
		IsolateTenants: cfg.AuthEnabled() && cfg.Pool.Isolation == "tenant",
	}, log)
	if err != nil {
		if authn != nil {
			authn.Close()
		}
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, relay: relay, authn: authn, conns: map[*wsConn]struct{}{}, tenantConns: map[string]int{}}
	r := chi.NewRouter()
	r.Get("/acp", s.handleACP)
	if authn != nil {
		r.Handle("/v1/tickets", authn.TicketsHandler())
	}
	r.Get("/healthz", s.handleHealth)
	r.Get("/readyz", s.handleReady)
	r.Handle("/*", web.Handler())
	s.http = &http.Server{
		Handler:           r,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.started.Store(true)
	s.log.Info("listening", "addr", ln.Addr().String())
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Handler returns the HTTP handler (for tests that bring their own server).
func (s *Server) Handler() http.Handler { return s.http.Handler }

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// handleReady is not ready while starting, while the pool cannot produce an
// initialized agent, and while draining.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case s.drain.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("draining\n"))
	case !s.started.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("starting\n"))
	case !s.relay.Pool().Ready():
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("no agent ready\n"))
	default:
		_, _ = w.Write([]byte("ready\n"))
	}
}

// Shutdown drains the gateway: it turns not-ready, stops accepting, closes
// every WebSocket with 1001 (going away) and stops every agent process.
func (s *Server) Shutdown(ctx context.Context) error {
	s.drain.Store(true)
	err := s.http.Shutdown(ctx) // hijacked WebSockets are not waited for here
	s.mu.Lock()
	for c := range s.conns {
		c.goingAway()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if rerr := s.relay.Close(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if s.authn != nil {
		s.authn.Close()
	}
	return err
}

// Relay returns the ACP relay (tests and metrics).
func (s *Server) Relay() *proxy.Relay { return s.relay }

func newConnID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}
