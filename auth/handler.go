package auth

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// TicketsHandler serves POST /v1/tickets: it authenticates the request with
// Bearer and answers 201 {"ticket": "...", "expires_at": "<RFC 3339>"}.
// Failures get a JSON body {"error": reason, "message": text} with 400, 401
// (plus WWW-Authenticate), 403, 503 (table full), or 405 for methods other
// than POST. Every response carries Cache-Control: no-store.
//
// CORS: a browser page on an AllowedOrigins origin (not the gateway's own)
// gets Access-Control-Allow-Origin for that origin; its preflight (OPTIONS
// with Access-Control-Request-Method) is answered 204, or 403 for an origin
// that is not allowed. No cookies are involved, so credentials mode is not
// enabled.
func (a *Authenticator) TicketsHandler() http.Handler {
	return http.HandlerFunc(a.serveTickets)
}

func (a *Authenticator) serveTickets(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if origin, ok := a.isAllowedCrossOrigin(r); ok {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	h.Add("Vary", "Origin")
	switch {
	case r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "":
		a.preflight(w, r)
		return
	case r.Method != http.MethodPost:
		h.Set("Allow", "POST")
		writeJSON(w, http.StatusMethodNotAllowed, errorBody{"method_not_allowed", "use POST"})
		return
	}
	id, err := a.Bearer(r)
	if err != nil {
		WriteError(w, err)
		return
	}
	ticket, expires, err := a.IssueTicket(id)
	if err != nil {
		a.logFailure(r, err)
		WriteError(w, err)
		return
	}
	a.log.Debug("ticket issued", "tenant", id.Tenant, "method", id.Method, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusCreated, struct {
		Ticket    string `json:"ticket"`
		ExpiresAt string `json:"expires_at"`
	}{ticket, expires.UTC().Format(time.RFC3339)})
}

// CORS applies the tickets endpoint's CORS rules to another JSON endpoint
// that authenticates like /acp (GET /v1/agents): an allowed cross origin
// gets Access-Control-Allow-Origin, and a preflight is answered (204, or
// 403 for an origin not allowed), in which case CORS returns true and the
// caller is done.
func (a *Authenticator) CORS(w http.ResponseWriter, r *http.Request, methods string) bool {
	h := w.Header()
	if origin, ok := a.isAllowedCrossOrigin(r); ok {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	h.Add("Vary", "Origin")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	if err := a.checkOrigin(r); err != nil {
		a.logFailure(r, err)
		WriteError(w, err)
		return true
	}
	h.Set("Access-Control-Allow-Methods", methods)
	h.Set("Access-Control-Allow-Headers", "Authorization")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

func (a *Authenticator) preflight(w http.ResponseWriter, r *http.Request) {
	if err := a.checkOrigin(r); err != nil {
		a.logFailure(r, err)
		WriteError(w, err)
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "POST")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// WriteError writes an authentication failure as JSON {"error": reason,
// "message": text} with its status, Cache-Control: no-store, and on 401 a
// WWW-Authenticate: Bearer challenge (plus Retry-After on 503). An error that
// is not an *Error is written as 500 without its text. The gateway can use
// it for refused WebSocket upgrades too.
func WriteError(w http.ResponseWriter, err error) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	var e *Error
	if !errors.As(err, &e) {
		writeJSON(w, http.StatusInternalServerError, errorBody{"internal", "internal error"})
		return
	}
	switch e.Status {
	case http.StatusUnauthorized:
		if e.Reason == ReasonMissingToken {
			h.Set("WWW-Authenticate", `Bearer realm="acpgate"`)
		} else {
			h.Set("WWW-Authenticate", `Bearer realm="acpgate", error="invalid_token"`)
		}
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", strconv.Itoa(5))
	}
	writeJSON(w, e.Status, errorBody{e.Reason, e.Message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
