package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/cluster"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/access"
	spans "github.com/acpgate/acpgate/proxy/observe/tracing"
)

// start begins the heartbeat (nil: no cluster).
func (rp *replicas) start(tp trace.TracerProvider) {
	if rp == nil {
		return
	}
	rp.node.SetTracer(spans.TracerOf(tp, "acpgate/cluster"))
	rp.node.Start()
}

// share makes own, this replica's session owners, shared with the other
// replicas: what it does not know is read from the store, what it notes
// is written there, and all of it (with the administrators' ends this
// replica remembers) is written again when the store lost its data.
func (rp *replicas) share(own *access.Owners) {
	cfg := rp.s.config()
	retention := cfg.Sessions.OwnersRetention.D()
	if retention <= 0 {
		retention = access.DefaultOwnersRetention
	}
	rp.shared = rp.node.NewOwners(retention)
	own.Share(rp.shared)
	rp.node.OnReset(func(ctx context.Context) {
		rp.shared.Rewrite(ctx, func(yield func(scope, agentSID, subject string, used int64)) { own.Range(yield) })
		if r := rp.s.relay; r != nil { // the administrators' ends it remembers, too
			for _, id := range r.AdminEnded() {
				if ctx.Err() != nil {
					return
				}
				rp.node.NoteEnded(id)
			}
		}
	})
}

// adminTimeout bounds the whole of a fanned-out admin call: a replica that
// does not answer within it is reported unreachable.
const adminTimeout = 2 * time.Second

// adminList is a list answer: its items, and the replicas that did not
// answer, if any.
func adminList[T any](key string, items []T, unreachable []string) map[string]any {
	out := map[string]any{key: items}
	if len(unreachable) > 0 {
		out["unreachable"] = unreachable
	}
	return out
}

// gatherAdmin asks every other live replica for its list (what: sessions
// or connections; query: the caller's filter) and returns their items,
// and the replicas that did not answer. Outside a cluster: nothing.
func gatherAdmin[T any](ctx context.Context, rp *replicas, what, query string, who auth.Identity) ([]T, []string) {
	if rp == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	peers, err := rp.node.Replicas(ctx)
	if err != nil {
		return nil, []string{"(" + err.Error() + ")"}
	}
	var (
		mu          sync.Mutex
		items       []T
		unreachable []string
		wg          sync.WaitGroup
	)
	path := cluster.Prefix + "/admin/" + what
	if query != "" {
		path += "?" + query
	}
	for name := range peers {
		if name == rp.name() {
			continue
		}
		wg.Go(func() {
			var got map[string][]T
			err := rp.call(ctx, name, "admin_list", http.MethodGet, path, who, &got)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rp.log.Warn("cluster: a replica did not answer an admin list", "peer", name, "err", err)
				unreachable = append(unreachable, name)
				return
			}
			items = append(items, got[what]...)
		})
	}
	wg.Wait()
	slices.Sort(unreachable)
	return items, unreachable
}

// call carries an admin call to replica name and decodes its JSON answer
// into out; a status other than 200 is an error (*peerStatus).
func (rp *replicas) call(ctx context.Context, name, op, method, path string, who auth.Identity, out any) error {
	resp, _, err := rp.node.Do(ctx, cluster.Request{Replica: name, Op: op, Method: method, Path: path,
		Env: cluster.Envelope{Op: op, Subject: who.Subject, Reply: "admin"}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading replica %s's answer: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &peerStatus{code: resp.StatusCode, body: body}
	}
	return json.Unmarshal(body, out)
}

// peerStatus is a replica's answer other than 200.
type peerStatus struct {
	code int
	body []byte
}

func (e *peerStatus) Error() string { return fmt.Sprintf("status %d: %s", e.code, e.body) }

// endElsewhere ends a session or closes a connection (what: sessions or
// connections) another replica holds: the one its ID names (a
// connection's "<replica>.<uuid>"), else each live replica in turn until
// one has it. notHere is this replica's own not-found error, returned when
// none has it.
func (rp *replicas) endElsewhere(ctx context.Context, what, id string, who auth.Identity, notHere error) (proxy.Owner, error) {
	if rp == nil {
		return proxy.Owner{}, notHere
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	var names []string
	if hint := cluster.Hint(id); what == "connections" && hint != "" && hint != rp.name() {
		names = []string{hint}
	} else {
		peers, err := rp.node.Replicas(ctx)
		if err != nil {
			return proxy.Owner{}, err
		}
		for name := range peers {
			if name != rp.name() {
				names = append(names, name)
			}
		}
		slices.Sort(names)
	}
	op := "admin_end"
	if what == "connections" {
		op = "admin_close"
	}
	var firstErr error
	for _, name := range names {
		var got proxy.Owner
		err := rp.call(ctx, name, op, http.MethodDelete, cluster.Prefix+"/admin/"+what+"/"+url.PathEscape(id), who, &got)
		var ps *peerStatus
		switch {
		case err == nil:
			return got, nil
		case errors.As(err, &ps) && ps.code == http.StatusNotFound:
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("replica %s: %w", name, err)
			}
		}
	}
	if firstErr != nil {
		return proxy.Owner{}, firstErr
	}
	return proxy.Owner{}, notHere
}

// adminRoutes are the admin calls another replica carries here: this
// replica's part of a list, and an end or close of what it holds. The
// replica the administrator called checks them and writes the audit trail.
func (rp *replicas) adminRoutes(r chi.Router) {
	p := cluster.Prefix + "/admin/"
	list := func(what string, local func(a *adminAPI, tenant string, all bool) any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			a := rp.s.admin
			if a == nil {
				writeJSONError(w, http.StatusNotFound, "not_found", "no admin API on this replica")
				return
			}
			tenant, all := tenantFilter(r)
			writeJSON(w, http.StatusOK, map[string]any{what: local(a, tenant, all)})
		}
	}
	r.Get(p+"sessions", list("sessions", func(a *adminAPI, tenant string, all bool) any { return a.localSessions(tenant, all) }))
	r.Get(p+"connections", list("connections", func(a *adminAPI, tenant string, all bool) any { return a.localConns(tenant, all) }))
	r.Delete(p+"sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		who, _ := forwardedIdentity(r)
		owner, err := rp.s.relay.EndSession(chi.URLParam(r, "id"), who.Subject)
		rp.answerAdmin(w, owner, err)
	})
	r.Delete(p+"connections/{id}", func(w http.ResponseWriter, r *http.Request) {
		who, _ := forwardedIdentity(r)
		id := chi.URLParam(r, "id")
		owner, err := rp.s.relay.CloseConn(id, who.Subject, func() {
			links, _ := rp.s.links.linksOf("")
			for _, l := range links {
				if l.id == id {
					l.closeWith(adminCloseReason, "admin_closed")
				}
			}
		})
		rp.answerAdmin(w, owner, err)
	})
}

func (rp *replicas) answerAdmin(w http.ResponseWriter, owner proxy.Owner, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, owner)
	case errors.Is(err, proxy.ErrNoSuchSession), errors.Is(err, proxy.ErrNoSuchConn):
		writeJSONError(w, http.StatusNotFound, "not_found", err.Error())
	default:
		rp.log.Error("cluster: an admin call from another replica failed", "err", err)
		writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
	}
}
