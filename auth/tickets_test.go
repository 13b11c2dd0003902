package auth

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTicketFormat(t *testing.T) {
	clock := newFakeClock()
	a := newAuth(t, Config{Clock: clock.Now})
	seen := map[string]bool{}
	for range 50 {
		tk, exp, err := a.IssueTicket(Identity{Tenant: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := base64.RawURLEncoding.DecodeString(tk)
		if err != nil || len(raw) != 32 {
			t.Fatalf("ticket %q is not 32 bytes of base64url: %v", tk, err)
		}
		if seen[tk] {
			t.Fatal("duplicate ticket")
		}
		seen[tk] = true
		if !exp.Equal(clock.Now().Add(defaultTicketTTL)) {
			t.Fatalf("expires %v, want now+30s", exp)
		}
	}
}

func TestTicketSingleUse(t *testing.T) {
	a := newAuth(t, Config{})
	tk, _, _ := a.IssueTicket(Identity{Tenant: "alpha", Method: MethodBearer})
	id, err := a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantOK(t, id, err, "alpha", MethodTicket)
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantErr(t, err, 401, ReasonTicketReused)
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantErr(t, err, 401, ReasonTicketReused)
}

func TestTicketExpiry(t *testing.T) {
	clock := newFakeClock()
	a := newAuth(t, Config{Clock: clock.Now, TicketTTL: 10 * time.Second})
	tk, exp, _ := a.IssueTicket(Identity{Tenant: "alpha"})
	if !exp.Equal(clock.Now().Add(10 * time.Second)) {
		t.Fatalf("expires %v", exp)
	}
	clock.Advance(9 * time.Second)
	tk2, _, _ := a.IssueTicket(Identity{Tenant: "alpha"})
	id, err := a.Upgrade(wsReq("/acp?ticket=" + tk2))
	wantOK(t, id, err, "alpha", MethodTicket)
	clock.Advance(time.Second) // exactly at expiry
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantErr(t, err, 401, ReasonTicketExpired)
	// Still reported as expired for a while, then forgotten (purged).
	clock.Advance(5 * time.Second)
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantErr(t, err, 401, ReasonTicketExpired)
	clock.Advance(10 * time.Second)
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantErr(t, err, 401, ReasonInvalidToken)
	clock.Advance(5 * time.Second) // tk2 (used) is gone too, purged on the next access
	_, err = a.Upgrade(wsReq("/acp?ticket=" + tk2))
	wantErr(t, err, 401, ReasonInvalidToken)
	if n := a.tickets.len(); n != 0 {
		t.Fatalf("%d tickets left after purge", n)
	}
}

func TestTicketTenantBinding(t *testing.T) {
	a := newAuth(t, Config{})
	tk, _, _ := a.IssueTicket(Identity{Tenant: "beta", Method: MethodJWT, Subject: "user-7"})
	// Nothing in the request can name another tenant.
	id, err := a.Upgrade(wsReq("/acp?tenant=alpha&ticket="+tk, hdr{"X-Tenant", "alpha"}))
	wantOK(t, id, err, "beta", MethodTicket)
	if id.Subject != "user-7" {
		t.Fatalf("subject %q not carried over", id.Subject)
	}
	// A ticket cannot be issued for an unknown tenant.
	_, _, err = a.IssueTicket(Identity{Tenant: "nobody"})
	wantErr(t, err, 403, ReasonUnknownTenant)
	_, _, err = a.IssueTicket(Identity{})
	wantErr(t, err, 403, ReasonUnknownTenant)
}

func TestTicketCapacity(t *testing.T) {
	clock := newFakeClock()
	a := newAuth(t, Config{Clock: clock.Now, MaxTickets: 3, TicketTTL: 30 * time.Second})
	var tks []string
	for range 3 {
		tk, _, err := a.IssueTicket(Identity{Tenant: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	_, _, err := a.IssueTicket(Identity{Tenant: "alpha"})
	wantErr(t, err, http.StatusServiceUnavailable, ReasonTicketsFull)
	// Used tickets still count until they expire.
	id, err := a.Upgrade(wsReq("/acp?ticket=" + tks[0]))
	wantOK(t, id, err, "alpha", MethodTicket)
	_, _, err = a.IssueTicket(Identity{Tenant: "alpha"})
	wantErr(t, err, http.StatusServiceUnavailable, ReasonTicketsFull)
	// Once they expire the table frees up at once (no retention when full).
	clock.Advance(30 * time.Second)
	if _, _, err := a.IssueTicket(Identity{Tenant: "alpha"}); err != nil {
		t.Fatal(err)
	}
	if n := a.tickets.len(); n != 1 {
		t.Fatalf("table holds %d, want 1", n)
	}
}

func TestTicketTableStaysBounded(t *testing.T) {
	clock := newFakeClock()
	a := newAuth(t, Config{Clock: clock.Now, TicketTTL: 5 * time.Second})
	for range 2000 {
		if _, _, err := a.IssueTicket(Identity{Tenant: "alpha"}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(100 * time.Millisecond)
	}
	// Alive for 5s plus 5s retention at one per 100ms: about 100.
	if n := a.tickets.len(); n > 101 {
		t.Fatalf("table holds %d tickets", n)
	}
	if n := len(a.tickets.queue); n > 101 {
		t.Fatalf("queue holds %d tickets", n)
	}
}

func TestTicketConcurrentRedeem(t *testing.T) {
	a := newAuth(t, Config{})
	const n = 50
	tks := make([]string, n)
	for i := range tks {
		tks[i], _, _ = a.IssueTicket(Identity{Tenant: "alpha"})
	}
	var ok, reused atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		for _, tk := range tks {
			wg.Go(func() {
				_, err := a.Upgrade(wsReq("/acp?ticket=" + tk))
				if err == nil {
					ok.Add(1)
				} else if e, _ := err.(*Error); e != nil && e.Reason == ReasonTicketReused {
					reused.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if ok.Load() != n || reused.Load() != 3*n {
		t.Fatalf("ok %d reused %d, want %d and %d", ok.Load(), reused.Load(), n, 3*n)
	}
}

type ticketResp struct {
	Ticket    string `json:"ticket"`
	ExpiresAt string `json:"expires_at"`
	Error     string `json:"error"`
	Message   string `json:"message"`
}

func serve(t *testing.T, h http.Handler, r *http.Request) (*httptest.ResponseRecorder, ticketResp) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if got := w.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("%s %s: Cache-Control %q", r.Method, r.URL, got)
	}
	var body ticketResp
	if w.Code != http.StatusNoContent {
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", w.Body.String(), err)
		}
	}
	return w, body
}

func postReq(hs ...hdr) *http.Request {
	r := wsReq("/v1/tickets", hs...)
	r.Method = http.MethodPost
	return r
}

func TestTicketsHandler(t *testing.T) {
	clock := newFakeClock()
	a := newAuth(t, Config{Clock: clock.Now, AllowedOrigins: []string{"https://ide.example.com"}})
	h := a.TicketsHandler()

	w, body := serve(t, h, postReq(bearer(tokBeta)))
	if w.Code != http.StatusCreated || body.Ticket == "" {
		t.Fatalf("POST: %d %+v", w.Code, body)
	}
	exp, err := time.Parse(time.RFC3339, body.ExpiresAt)
	if err != nil || !exp.Equal(clock.Now().Add(30*time.Second)) {
		t.Fatalf("expires_at %q: %v", body.ExpiresAt, err)
	}
	if w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS header without an Origin")
	}
	id, err := a.Upgrade(wsReq("/acp?ticket=" + body.Ticket))
	wantOK(t, id, err, "beta", MethodTicket)

	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		r := postReq(bearer(tokBeta))
		r.Method = m
		w, body := serve(t, h, r)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "POST" || body.Error == "" {
			t.Errorf("%s: %d Allow=%q %+v", m, w.Code, w.Header().Get("Allow"), body)
		}
	}

	w, body = serve(t, h, postReq())
	if w.Code != 401 || body.Error != ReasonMissingToken || body.Message == "" ||
		!strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no token: %d %+v %q", w.Code, body, w.Header().Get("WWW-Authenticate"))
	}
	w, body = serve(t, h, postReq(bearer("wrong")))
	if w.Code != 401 || body.Error != ReasonInvalidToken || !strings.Contains(w.Header().Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Fatalf("wrong token: %d %+v", w.Code, body)
	}
	w, body = serve(t, h, postReq(bearer(tokBeta), bearer(tokBeta)))
	if w.Code != 400 || body.Error != ReasonMultipleTokens {
		t.Fatalf("two tokens: %d %+v", w.Code, body)
	}
	w, body = serve(t, h, postReq(bearer(tokBeta), originH("https://evil.example.net")))
	if w.Code != 403 || body.Error != ReasonOriginNotAllowed || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("bad origin: %d %+v", w.Code, body)
	}
	// The web client on the gateway's own origin: no CORS needed.
	w, _ = serve(t, h, postReq(bearer(tokBeta), originH("https://gw.example.com")))
	if w.Code != 201 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("same origin: %d", w.Code)
	}
	// An allowed cross origin gets CORS headers, and its preflight passes.
	w, _ = serve(t, h, postReq(bearer(tokBeta), originH("https://ide.example.com")))
	if w.Code != 201 || w.Header().Get("Access-Control-Allow-Origin") != "https://ide.example.com" {
		t.Fatalf("cross origin: %d %v", w.Code, w.Header())
	}
	pre := postReq(originH("https://ide.example.com"), hdr{"Access-Control-Request-Method", "POST"},
		hdr{"Access-Control-Request-Headers", "authorization"})
	pre.Method = http.MethodOptions
	w, _ = serve(t, h, pre)
	if w.Code != http.StatusNoContent || w.Header().Get("Access-Control-Allow-Origin") != "https://ide.example.com" ||
		!strings.Contains(w.Header().Get("Access-Control-Allow-Headers"), "Authorization") ||
		w.Header().Get("Access-Control-Allow-Methods") != "POST" {
		t.Fatalf("preflight: %d %v", w.Code, w.Header())
	}
	pre = postReq(originH("https://evil.example.net"), hdr{"Access-Control-Request-Method", "POST"})
	pre.Method = http.MethodOptions
	w, body = serve(t, h, pre)
	if w.Code != http.StatusForbidden || body.Error != ReasonOriginNotAllowed {
		t.Fatalf("bad preflight: %d %+v", w.Code, body)
	}
}

func TestTicketsHandlerFull(t *testing.T) {
	a := newAuth(t, Config{MaxTickets: 1})
	h := a.TicketsHandler()
	if w, _ := serve(t, h, postReq(bearer(tokAlpha))); w.Code != 201 {
		t.Fatal(w.Code)
	}
	w, body := serve(t, h, postReq(bearer(tokAlpha)))
	if w.Code != http.StatusServiceUnavailable || body.Error != ReasonTicketsFull || w.Header().Get("Retry-After") == "" {
		t.Fatalf("full: %d %+v", w.Code, body)
	}
}

func TestWriteErrorNonAuth(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, errString("secret detail"))
	if w.Code != 500 || strings.Contains(w.Body.String(), "secret") {
		t.Fatalf("%d %q", w.Code, w.Body.String())
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// len is the number of tickets the store holds.
func (s *ticketStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
