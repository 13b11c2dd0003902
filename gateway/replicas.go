package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/cluster"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy/observe"
)

// replicas is this gateway's part in a cluster (cluster:): the owner
// registry's records of what it holds, the internal listener on which the
// other replicas carry requests to it, and the forwarding of what lands
// here but is held elsewhere. nil without cluster:.
type replicas struct {
	s      *Server
	node   *cluster.Node
	log    *slog.Logger
	http   *http.Server    // the internal listener's server
	shared *cluster.Owners // the owners the replicas share

	// ctx ends when the replica leaves the cluster: tunnels close.
	ctx     context.Context
	stop    context.CancelFunc
	tunnels sync.WaitGroup

	bridges sync.Map // connection ID → *connBridges
}

// newReplicas joins the cluster cfg.Cluster describes (nil: none).
func newReplicas(s *Server, cfg *config.Config, reg prometheus.Registerer) (*replicas, error) {
	if cfg.Cluster == nil {
		return nil, nil
	}
	key, err := cfg.ClusterKey()
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	cl := cfg.Cluster
	node, err := cluster.New(cluster.Config{Name: cl.ReplicaName(), Store: cl.Store, Advertise: cl.AdvertiseURL(), Key: key,
		Lease: cl.Lease.D()}, s.log, cluster.NewMetrics(reg))
	if err != nil {
		return nil, err
	}
	rp := &replicas{s: s, node: node, log: s.log.With("replica", node.Name())}
	rp.ctx, rp.stop = context.WithCancel(context.Background())
	rp.http = &http.Server{Handler: rp.routes(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	return rp, nil
}

// name is this replica's name ("" outside a cluster).
func (rp *replicas) name() string {
	if rp == nil {
		return ""
	}
	return rp.node.Name()
}

// Observe keeps the registry's records of the sessions live here: one
// from a session's start (made or loaded here) to its end. The heartbeat
// writes them: nothing on the session's path waits for the store.
func (rp *replicas) Observe(e *observe.Event) {
	id := cluster.SessionID(e.Session.Tenant, e.Session.Agent, e.Session.ID)
	switch e.Kind {
	case observe.SessionCreated, observe.SessionLoaded:
		rp.node.Hold(cluster.KindSession, id)
	case observe.SessionClosed, observe.SessionLost:
		rp.node.Release(cluster.KindSession, id) // never waits for the store
	}
}

// Wants implements observe.Selective.
func (rp *replicas) Wants(k observe.Kind) bool {
	return k == observe.SessionCreated || k == observe.SessionLoaded || k == observe.SessionClosed || k == observe.SessionLost
}

// Elsewhere implements proxy.Cluster: the live replica other than this
// one that holds the session, from the registry ("" when none, or when
// the store cannot say).
func (rp *replicas) Elsewhere(tenant, agent, gwID string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	holder, err := rp.node.Owner(ctx, cluster.KindSession, cluster.SessionID(tenant, agent, gwID))
	if err != nil || holder == "" || holder == rp.name() {
		return ""
	}
	if _, live, err := rp.node.Peer(ctx, holder); err != nil || !live {
		return ""
	}
	return holder
}

// Ended implements proxy.Cluster: an administrator's end, kept in the
// store (noteEnded) so that every replica, restarted or not, refuses the
// session as ended.
func (rp *replicas) Ended(gwID string) bool { return rp.node.Ended(gwID) }

// noteEnded keeps an administrator's end of session gwID in the store.
func (rp *replicas) noteEnded(gwID string) {
	if rp != nil {
		rp.node.NoteEnded(gwID)
	}
}

// identityKey carries the identity a verified envelope names.
type identityKey struct{}

// forwardedIdentity is the caller another replica authenticated and
// signed for, on a request of the internal listener.
func forwardedIdentity(r *http.Request) (auth.Identity, bool) {
	id, ok := r.Context().Value(identityKey{}).(auth.Identity)
	return id, ok
}

// maxEnvelopeBody bounds what the internal listener reads of a forwarded
// request's body before checking its signature.
const maxEnvelopeBody = 64 << 20

// routes is the internal listener: what other replicas carry here, each
// request checked for its envelope first.
func (rp *replicas) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(rp.verify)
	for _, path := range []string{cluster.Prefix + "/acp", cluster.Prefix + "/acp/{agent}"} {
		r.Get(path, func(w http.ResponseWriter, r *http.Request) {
			if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				rp.s.handleACP(w, r)
				return
			}
			rp.s.handleSSE(w, r)
		})
		r.Post(path, rp.s.handleHTTPPost)
		r.Delete(path, rp.s.handleHTTPDelete)
	}
	rp.adminRoutes(r)
	return r
}

// verify lets through only a request whose envelope is signed with the
// cluster key, fresh and not seen before; the identity it names is the
// caller's from then on.
func (rp *replicas) verify(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxEnvelopeBody+1))
		if err != nil || len(body) > maxEnvelopeBody {
			http.Error(w, "cannot read the request body", http.StatusBadRequest)
			return
		}
		env, err := rp.node.Verify(r, body)
		if err != nil {
			rp.node.Metrics().ForwardErrors.WithLabelValues(r.Header.Get("Acpgate-Cluster-Op"), "refused_here").Inc()
			rp.log.Warn("cluster: refused a request from another replica", "err", err, "remote", r.RemoteAddr)
			cluster.Refuse(w, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		who := auth.Identity{Tenant: env.Tenant, Subject: env.Subject, Method: "cluster"}
		ctx := context.WithValue(r.Context(), identityKey{}, who)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// httpOp is the metrics' op of a forwarded Streamable HTTP request.
func httpOp(method string) string {
	switch method {
	case http.MethodPost:
		return "http_post"
	case http.MethodDelete:
		return "http_delete"
	}
	return "http_sse"
}

// forwardHTTP carries a Streamable HTTP request that names a connection
// another replica holds (its Acp-Connection-Id: "<replica>.<uuid>") to
// it, and copies its answer back: a POST's status, an event stream as it
// flows. It reports whether it took the request. A POST is retried on a
// transport error with the same envelope: the holder executes it once.
func (s *Server) forwardHTTP(w http.ResponseWriter, r *http.Request, who auth.Identity) bool {
	rp := s.replicas
	if rp == nil {
		return false
	}
	if _, forwarded := forwardedIdentity(r); forwarded {
		return false // one hop only
	}
	id := r.Header.Get(ConnectionIDHeader)
	holder := cluster.Hint(id)
	if holder == "" || holder == rp.name() || s.links.httpConn(id) != nil {
		return false
	}
	var body []byte
	if r.Method == http.MethodPost {
		var ok bool
		if body, ok = s.readPost(w, r); !ok {
			return true
		}
	}
	op := httpOp(r.Method)
	h := http.Header{}
	for _, k := range []string{"Content-Type", "Accept", ConnectionIDHeader, sessionIDHeader, "Last-Event-ID", "traceparent", "tracestate",
		"Mcp-Protocol-Version", "Acp-Protocol-Version"} {
		if v := r.Header.Values(k); len(v) > 0 {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	path := cluster.Prefix + r.URL.Path
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	ctx := r.Context()
	if sc := postTrace(r); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	resp, delivered, err := rp.node.Do(ctx, cluster.Request{Replica: holder, Op: op, Method: r.Method, Path: path, Header: h, Body: body,
		Env: cluster.Envelope{Op: op, Tenant: who.Tenant, Subject: who.Subject, Reply: id}, Retry: r.Method != http.MethodGet})
	if err != nil {
		rp.log.Info("cluster: cannot carry a request to the replica that holds its connection", "conn", id, "op", op, "err", err)
		plain(w, http.StatusServiceUnavailable, fmt.Sprintf("Acp-Connection-Id %s: %v", id, err))
		return true
	}
	if delivered {
		w.WriteHeader(http.StatusAccepted)
		return true
	}
	defer resp.Body.Close()
	copyResponse(w, resp)
	return true
}

// copyResponse writes resp to w: a body of known length at once, an event
// stream as it arrives, each read flushed, so that its events go out one
// by one.
func copyResponse(w http.ResponseWriter, resp *http.Response) {
	for _, k := range []string{"Content-Type", "Cache-Control", "X-Accel-Buffering", "Allow", ConnectionIDHeader, sessionIDHeader} {
		if v := resp.Header.Values(k); len(v) > 0 {
			w.Header()[http.CanonicalHeaderKey(k)] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	if resp.ContentLength >= 0 { // a POST's 202, an error, an initialize's answer
		_, _ = io.Copy(w, resp.Body)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	bp := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(bp)
	buf := *bp
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if ferr := rc.Flush(); ferr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// streamBufs are the buffers event streams are carried through.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ServeCluster serves the internal listener on ln until Shutdown. Without
// cluster: it returns at once.
func (s *Server) ServeCluster(ln net.Listener) error {
	if s.replicas == nil {
		return nil
	}
	s.replicas.log.Info("cluster: internal listener", "addr", ln.Addr().String(), "store", s.replicas.node.StoreName())
	err := s.replicas.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// drain tells the other replicas this one is draining: they hand it
// nothing new, and a load of a session live nowhere that reaches it is
// carried to one that stays.
func (rp *replicas) drain() {
	if rp != nil {
		rp.node.SetDraining()
	}
}

// close leaves the cluster: the internal listener closes (after the
// connections it served have ended) and every record this replica holds
// is given up.
func (rp *replicas) close(ctx context.Context) {
	if rp == nil {
		return
	}
	rp.stop()
	rp.tunnels.Wait()
	_ = rp.http.Shutdown(ctx)
	if rp.shared != nil {
		rp.shared.Close()
	}
	rp.node.Close()
}
