package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/budget"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy"
)

// adminAPI is the admin API: list the connections and sessions, end a
// session, close a connection. It is served on the operations listener
// when one is set (OpsHandler), else on the main one, to administrators
// only. A nil *adminAPI is none (admin unset).
type adminAPI struct {
	// Static after construction.
	admins *auth.Admins
	relay  *proxy.Relay
	links  *linkRegistry
	audit  *auditTrail
	budget *budget.Ledger
	log    *slog.Logger
	// replicas: in a cluster, lists span every live replica and an end
	// or close reaches the one that holds it (nil: this gateway alone).
	replicas *replicas
}

// newAdmins is the admin API's credential check (nil: no admin API).
func newAdmins(cfg *config.Config, authn *auth.Authenticator, log *slog.Logger) (*auth.Admins, error) {
	if !cfg.Admin.Enabled() {
		return nil, nil
	}
	ac := auth.AdminConfig{TokensSHA256: cfg.Admin.TokensSHA256}
	if j := cfg.Admin.JWTClaim; j != nil {
		ac.JWTClaim, ac.JWTValue = j.Claim, j.Value
	}
	a, err := auth.NewAdmins(ac, authn, log)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return a, nil
}

// adminReloadable says why next's admin settings need a restart ("" if
// they reload: only the tokens change).
func adminReloadable(cur, next *config.Config) string {
	switch {
	case cur.Admin.Enabled() != next.Admin.Enabled():
		return "turning the admin API on or off needs a restart"
	case !reflect.DeepEqual(cur.Admin.JWTClaim, next.Admin.JWTClaim):
		return "admin.jwt_claim needs a restart"
	}
	return ""
}

// prepare checks a reload's admin tokens (nil without an admin API).
func (a *adminAPI) prepare(next *config.Config) (*auth.AdminTokens, error) {
	if a == nil {
		return nil, nil
	}
	return auth.ParseAdminTokens(next.Admin.TokensSHA256)
}

// setTokens swaps in the admin tokens prepare checked.
func (a *adminAPI) setTokens(t *auth.AdminTokens) {
	if a != nil {
		a.admins.SetTokens(t)
	}
}

// OpsHandler serves the operations listener (observability.metrics_listen):
// /metrics, and the admin API when it is configured.
func (s *Server) OpsHandler() http.Handler {
	r := chi.NewRouter()
	r.Handle("/metrics", s.MetricsHandler())
	s.admin.routes(r)
	return r
}

// routes mounts the admin API on r, if it is configured.
func (a *adminAPI) routes(r chi.Router) {
	if a == nil {
		return
	}
	r.Get("/v1/admin/connections", a.check(a.listConns))
	r.Get("/v1/admin/sessions", a.check(a.listSessions))
	r.Delete("/v1/admin/sessions/{id}", a.check(a.endSession))
	r.Delete("/v1/admin/connections/{id}", a.check(a.closeConn))
	r.Get("/v1/admin/budgets", a.check(a.listBudgets))
	r.Post("/v1/admin/budgets/{tenant}/reset", a.check(a.resetBudget))
	// Any other path under it (or a method a path lacks): the admins'
	// check first, then a 404 that the trail records as admin.failed.
	r.HandleFunc("/v1/admin/*", a.check(a.unknownCall))
}

// unknownCall answers a call the admin API does not have.
func (a *adminAPI) unknownCall(w http.ResponseWriter, r *http.Request, _ auth.Identity) {
	writeJSONError(w, http.StatusNotFound, "not_found", "no such admin call: "+r.Method+" "+boundedPath(r.URL.Path))
}

// maxAuditPath bounds a path as the trail and an error message give it.
const maxAuditPath = 256

// boundedPath is p cut to maxAuditPath bytes (and valid UTF-8), with "…"
// when cut: a caller's path cannot grow the trail's lines.
func boundedPath(p string) string {
	if len(p) <= maxAuditPath {
		return strings.ToValidUTF8(p, "\uFFFD")
	}
	return strings.ToValidUTF8(p[:maxAuditPath], "") + "…"
}

// statusWriter notes the status a handler answers with.
type statusWriter struct {
	http.ResponseWriter
	status int // 0: none written yet (a Write makes it 200)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// adminHandler serves an administrator, who.
type adminHandler func(w http.ResponseWriter, r *http.Request, who auth.Identity)

// check lets only administrators through to h: a tenant's credential gets
// 403, none or an unknown one 401. Each refusal is audited (admin.denied),
// and so is each call of an administrator that fails (admin.failed: a
// 4xx or 5xx, with the method, path and status).
func (a *adminAPI) check(h adminHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, err := a.admins.Check(r)
		if err != nil {
			var ae *auth.Error
			if !errors.As(err, &ae) {
				ae = &auth.Error{Status: http.StatusUnauthorized, Reason: auth.ReasonInvalidToken, Message: "not authenticated"}
			}
			a.audit.adminDenied(r, ae.Reason)
			if ae.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="acpgate admin"`)
			}
			writeJSONError(w, ae.Status, ae.Reason, ae.Message)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r, who)
		if sw.status >= http.StatusBadRequest {
			a.audit.adminFailed(r, who.Subject, sw.status)
		}
	}
}

// adminConn is a connection as GET /v1/admin/connections lists it.
type adminConn struct {
	ID         string     `json:"id"`
	Tenant     string     `json:"tenant"`
	Subject    string     `json:"subject"`
	Agent      string     `json:"agent"`
	Transport  string     `json:"transport"`
	Remote     string     `json:"remote"`
	Opened     time.Time  `json:"opened"`
	State      string     `json:"state"` // attached or detached
	DetachedAt *time.Time `json:"detachedAt,omitempty"`
	Sessions   []string   `json:"sessions"`
	Replica    string     `json:"replica,omitempty"` // the replica that holds it (in a cluster)
}

// listConns lists the open connections (?tenant= filters).
func (a *adminAPI) listConns(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	tenant, all := tenantFilter(r)
	out := a.localConns(tenant, all)
	others, unreachable := gatherAdmin[adminConn](r.Context(), a.replicas, "connections", r.URL.RawQuery, who)
	out = append(out, others...)
	a.audit.record(audit.Event{Event: "admin.connections.listed", Subject: who.Subject, Tenant: tenant,
		Fields: []audit.Field{audit.F("count", len(out))}})
	writeJSON(w, http.StatusOK, adminList("connections", out, unreachable))
}

// localConns is this replica's connections (tenant: the filter, unless all).
func (a *adminAPI) localConns(tenant string, all bool) []adminConn {
	links, _ := a.links.linksOf("")
	byID := make(map[string]*link, len(links))
	for _, l := range links {
		byID[l.id] = l
	}
	out := []adminConn{}
	for _, c := range a.relay.ConnSnapshots() {
		if !all && c.Tenant != tenant {
			continue
		}
		ac := adminConn{ID: c.ID, Tenant: c.Tenant, Subject: c.Subject, Agent: c.Agent, Transport: c.Transport,
			Remote: c.Remote, Opened: c.Opened.UTC(), State: "attached", Sessions: c.Sessions}
		if l := byID[c.ID]; l != nil { // the socket it has now
			ac.Transport, ac.Remote = l.kind, l.remote
		}
		if c.Detached {
			ac.State, ac.DetachedAt = "detached", optTime(c.DetachedAt)
		}
		ac.Replica = a.replicas.name()
		out = append(out, ac)
	}
	return out
}

// adminSession is a session as GET /v1/admin/sessions lists it.
type adminSession struct {
	ID          string             `json:"id"`
	Tenant      string             `json:"tenant"`
	Agent       string             `json:"agent"`
	Parent      string             `json:"parent,omitempty"` // a subagent's child session: its parent
	Clients     int                `json:"clients"`
	State       string             `json:"state"` // idle, running or detached
	Since       time.Time          `json:"since"` // when it entered that state
	TurnStarted *time.Time         `json:"turnStarted,omitempty"`
	Tokens      map[string]int64   `json:"tokens"`
	Cost        map[string]float64 `json:"cost"`
	Replica     string             `json:"replica,omitempty"` // the replica that holds it (in a cluster)
}

// listSessions lists the live sessions (?tenant= filters).
func (a *adminAPI) listSessions(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	tenant, all := tenantFilter(r)
	out := a.localSessions(tenant, all)
	others, unreachable := gatherAdmin[adminSession](r.Context(), a.replicas, "sessions", r.URL.RawQuery, who)
	out = append(out, others...)
	a.audit.record(audit.Event{Event: "admin.sessions.listed", Subject: who.Subject, Tenant: tenant,
		Fields: []audit.Field{audit.F("count", len(out))}})
	writeJSON(w, http.StatusOK, adminList("sessions", out, unreachable))
}

// localSessions is this replica's live sessions (tenant: the filter,
// unless all).
func (a *adminAPI) localSessions(tenant string, all bool) []adminSession {
	out := []adminSession{}
	for _, ss := range a.relay.SessionSnapshots(tenant, all) {
		as := adminSession{ID: ss.ID, Tenant: ss.Tenant, Agent: ss.Agent, Parent: ss.Parent, Clients: ss.Clients, State: ss.State,
			Since: ss.Since.UTC(), TurnStarted: optTime(ss.TurnStarted), Tokens: ss.Usage.Tokens, Cost: ss.Usage.Cost}
		if as.Tokens == nil {
			as.Tokens = map[string]int64{}
		}
		if as.Cost == nil {
			as.Cost = map[string]float64{}
		}
		as.Replica = a.replicas.name()
		out = append(out, as)
	}
	return out
}

// endSession ends a session for every client, its running turn
// cancelled.
func (a *adminAPI) endSession(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	id := chi.URLParam(r, "id")
	owner, err := a.relay.EndSession(id, who.Subject)
	if errors.Is(err, proxy.ErrNoSuchSession) {
		owner, err = a.replicas.endElsewhere(r.Context(), "sessions", id, who, err)
	}
	if err == nil {
		a.replicas.noteEnded(id)
	}
	if a.failed(w, err, proxy.ErrNoSuchSession, "no such session", "session", id) {
		return
	}
	a.audit.record(audit.Event{Event: "admin.session.ended", Subject: who.Subject, Tenant: owner.Tenant, Agent: owner.Agent, Session: id})
	writeJSON(w, http.StatusOK, map[string]string{"sessionId": id, "status": "ended"})
}

// closeConn closes a connection for good: its socket with 1008
// "closed by an administrator" (an HTTP connection's streams end), and its
// resume token is refused.
func (a *adminAPI) closeConn(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	id := chi.URLParam(r, "id")
	// The sockets close with 1008 first, so that the close is counted and
	// audited as admin_closed, not as the proxy connection's own end.
	closeSockets := func() {
		links, _ := a.links.linksOf("")
		for _, l := range links {
			if l.id == id {
				l.closeWith(adminCloseReason, "admin_closed")
			}
		}
	}
	owner, err := a.relay.CloseConn(id, who.Subject, closeSockets)
	if errors.Is(err, proxy.ErrNoSuchConn) {
		owner, err = a.replicas.endElsewhere(r.Context(), "connections", id, who, err)
	}
	if a.failed(w, err, proxy.ErrNoSuchConn, "no such connection", "conn", id) {
		return
	}
	a.audit.record(audit.Event{Event: "admin.connection.closed", Subject: who.Subject, Tenant: owner.Tenant, Agent: owner.Agent, Conn: id})
	writeJSON(w, http.StatusOK, map[string]string{"connectionId": id, "status": "closed"})
}

// listBudgets lists every budgeted tenant's budget: period, its start and
// reset, what was spent and the limits, whether a cap is reached. A
// failing store is 503, naming it.
func (a *adminAPI) listBudgets(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	st, err := a.budget.Statuses(r.Context())
	if err != nil {
		a.log.Error("admin: budgets not read", "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "store_unavailable", err.Error())
		return
	}
	if st == nil {
		st = []budget.Status{}
	}
	a.audit.record(audit.Event{Event: "admin.budgets.listed", Subject: who.Subject, Fields: []audit.Field{audit.F("count", len(st))}})
	writeJSON(w, http.StatusOK, map[string]any{"budgets": st})
}

// resetBudget forgets what a tenant spent this period (budget.reset in
// the audit trail, by the administrator); 404 for a tenant without a
// budget.
func (a *adminAPI) resetBudget(w http.ResponseWriter, r *http.Request, who auth.Identity) {
	tenant := chi.URLParam(r, "tenant")
	err := a.budget.Reset(r.Context(), tenant, who.Subject)
	switch {
	case errors.Is(err, budget.ErrNoBudget):
		writeJSONError(w, http.StatusNotFound, "not_found", "no such tenant with a budget")
		return
	case err != nil:
		a.log.Error("admin: budget not reset", "tenant", tenant, "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "store_unavailable", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"tenant": tenant, "status": "reset"})
}

// failed answers an admin action that failed: 404 (notFound says
// what) when err is unknown, 500 (logged with key and id) for any other
// error. It reports whether it answered.
func (a *adminAPI) failed(w http.ResponseWriter, err, unknown error, notFound, key, id string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, unknown):
		writeJSONError(w, http.StatusNotFound, "not_found", notFound)
	default:
		a.log.Error("admin: the action failed", key, id, "err", err)
		writeJSONError(w, http.StatusInternalServerError, "internal", "internal error")
	}
	return true
}

// adminCloseReason is the close reason of a connection an administrator
// closed (WebSocket 1008).
const adminCloseReason = "closed by an administrator"

// tenantFilter is the ?tenant= filter: all when absent.
func tenantFilter(r *http.Request) (tenant string, all bool) {
	q := r.URL.Query()
	if !q.Has("tenant") {
		return "", true
	}
	return q.Get("tenant"), false
}

// optTime is t in UTC, or nil when zero.
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
