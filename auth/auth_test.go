package auth

import (
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestBearerHeader(t *testing.T) {
	a := newAuth(t, Config{})
	id, err := a.Upgrade(wsReq("/acp", bearer(tokAlpha)))
	wantOK(t, id, err, "alpha", MethodBearer)
	id, err = a.Upgrade(wsReq("/acp", hdr{"Authorization", "bearer   " + tokBeta + " "}))
	wantOK(t, id, err, "beta", MethodBearer)
	id, err = a.Bearer(wsReq("/v1/tickets", bearer(tokAlpha2)))
	wantOK(t, id, err, "alpha", MethodBearer)
}

func TestEveryStoredHashMatchesItsTenant(t *testing.T) {
	tenants := []TenantTokens{}
	for i := range 20 {
		name := "t" + string(rune('a'+i))
		tenants = append(tenants, TenantTokens{Name: name, TokensSHA256: []string{sha("tok-" + name + "-1"), sha("tok-" + name + "-2")}})
	}
	a := newAuth(t, Config{Tenants: tenants})
	for _, tt := range tenants {
		for _, n := range []string{"-1", "-2"} {
			id, err := a.Upgrade(wsReq("/acp", bearer("tok-"+tt.Name+n)))
			wantOK(t, id, err, tt.Name, MethodBearer)
		}
	}
	_, err := a.Upgrade(wsReq("/acp", bearer("tok-ta-3")))
	wantErr(t, err, 401, ReasonInvalidToken)
}

func TestSubprotocolCarrier(t *testing.T) {
	a := newAuth(t, Config{})
	for _, hs := range [][]hdr{
		{proto("acp.bearer." + tokAlpha)},
		{proto("acp, acp.bearer." + tokAlpha)},
		{proto("acp.bearer." + tokAlpha + ", acp")},
		{proto("chat"), proto("acp , acp.bearer." + tokAlpha + " ,x")},
		{proto("ACP.Bearer." + tokAlpha)},
	} {
		id, err := a.Upgrade(wsReq("/acp", hs...))
		wantOK(t, id, err, "alpha", MethodSubprotocol)
	}
	// Other protocols alone are no credential.
	_, err := a.Upgrade(wsReq("/acp", proto("acp, acp.bearer")))
	wantErr(t, err, 401, ReasonMissingToken)
	_, err = a.Upgrade(wsReq("/acp", proto("acp, acp.bearer.")))
	wantErr(t, err, 401, ReasonInvalidToken)
	_, err = a.Upgrade(wsReq("/acp", proto("acp, acp.bearer.nope")))
	wantErr(t, err, 401, ReasonInvalidToken)
	// Bearer (plain HTTP) ignores the subprotocol carrier.
	_, err = a.Bearer(wsReq("/v1/tickets", proto("acp.bearer."+tokAlpha)))
	wantErr(t, err, 401, ReasonMissingToken)
}

func TestTicketCarrier(t *testing.T) {
	a := newAuth(t, Config{})
	tk, _, err := a.IssueTicket(Identity{Tenant: "beta", Method: MethodBearer})
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.Upgrade(wsReq("/acp?ticket=" + tk))
	wantOK(t, id, err, "beta", MethodTicket)
	// Bearer does not take tickets.
	tk2, _, _ := a.IssueTicket(Identity{Tenant: "beta"})
	_, err = a.Bearer(wsReq("/v1/tickets?ticket=" + tk2))
	wantErr(t, err, 401, ReasonMissingToken)
	_, err = a.Bearer(wsReq("/v1/tickets", bearer(tk2)))
	wantErr(t, err, 401, ReasonInvalidToken)
	// A ticket is not a bearer token on /acp either.
	_, err = a.Upgrade(wsReq("/acp", bearer(tk2)))
	wantErr(t, err, 401, ReasonInvalidToken)
}

func TestWrongAndMissingTokens(t *testing.T) {
	a := newAuth(t, Config{})
	_, err := a.Upgrade(wsReq("/acp"))
	e := wantErr(t, err, 401, ReasonMissingToken)
	if !strings.Contains(e.Message, "ticket") {
		t.Errorf("upgrade message should name every carrier: %q", e.Message)
	}
	_, err = a.Bearer(wsReq("/v1/tickets"))
	wantErr(t, err, 401, ReasonMissingToken)
	_, err = a.Upgrade(wsReq("/acp", bearer("wrong")))
	wantErr(t, err, 401, ReasonInvalidToken)
	_, err = a.Upgrade(wsReq("/acp", hdr{"Authorization", "Bearer"}))
	wantErr(t, err, 401, ReasonInvalidToken)
	_, err = a.Upgrade(wsReq("/acp", bearer(strings.ToUpper(tokAlpha))))
	wantErr(t, err, 401, ReasonInvalidToken)
	_, err = a.Upgrade(wsReq("/acp?ticket="))
	wantErr(t, err, 401, ReasonInvalidToken)
	_, err = a.Upgrade(wsReq("/acp?ticket=" + strings.Repeat("A", ticketLen)))
	wantErr(t, err, 401, ReasonInvalidToken)
	// A non-Bearer Authorization header is not a carrier.
	_, err = a.Upgrade(wsReq("/acp", hdr{"Authorization", "Basic " + tokAlpha}))
	e = wantErr(t, err, 401, ReasonMissingToken)
	if !strings.Contains(e.Message, "Bearer was ignored") {
		t.Errorf("message should mention the ignored scheme: %q", e.Message)
	}
	id, err := a.Upgrade(wsReq("/acp", hdr{"Authorization", "Basic dXNlcjpwYXNz"}, proto("acp, acp.bearer."+tokAlpha)))
	wantOK(t, id, err, "alpha", MethodSubprotocol)
}

func TestTokenInTwoCarriers(t *testing.T) {
	a := newAuth(t, Config{})
	tk, _, _ := a.IssueTicket(Identity{Tenant: "alpha"})
	q := "/acp?ticket=" + tk
	cases := map[string]*http.Request{
		"bearer+subprotocol": wsReq("/acp", bearer(tokAlpha), proto("acp, acp.bearer."+tokAlpha)),
		"bearer+ticket":      wsReq(q, bearer(tokAlpha)),
		"subprotocol+ticket": wsReq(q, proto("acp.bearer."+tokAlpha)),
		"two bearers":        wsReq("/acp", bearer(tokAlpha), bearer(tokBeta)),
		"two subprotocols":   wsReq("/acp", proto("acp.bearer."+tokAlpha+", acp.bearer."+tokBeta)),
		"two tickets":        wsReq(q + "&ticket=" + tk),
		"one bad, one good":  wsReq("/acp", bearer("junk"), proto("acp.bearer."+tokAlpha)),
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := a.Upgrade(r)
			wantErr(t, err, http.StatusBadRequest, ReasonMultipleTokens)
		})
	}
	_, err := a.Bearer(wsReq("/v1/tickets", bearer(tokAlpha), bearer(tokAlpha)))
	wantErr(t, err, http.StatusBadRequest, ReasonMultipleTokens)
	// The refused ticket was not consumed.
	id, err := a.Upgrade(wsReq(q))
	wantOK(t, id, err, "alpha", MethodTicket)
}

func TestStripTokenProtocols(t *testing.T) {
	for _, c := range []struct {
		hs   []hdr
		want []string
	}{
		{nil, nil},
		{[]hdr{proto("acp")}, []string{"acp"}},
		{[]hdr{proto("acp.bearer.secret")}, nil},
		{[]hdr{proto("acp, acp.bearer.secret")}, []string{"acp"}},
		{[]hdr{proto(" chat ,ACP.BEARER.secret, acp "), proto("acp.bearer.x,v2")}, []string{"chat", "acp", "v2"}},
		{[]hdr{proto("acp.bearerish, acp.bearer")}, []string{"acp.bearerish", "acp.bearer"}},
	} {
		got := StripTokenProtocols(wsReq("/acp", c.hs...))
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: got %q, want %q", c.hs, got, c.want)
		}
		for _, p := range got {
			if strings.Contains(p, "secret") {
				t.Errorf("token leaked: %q", got)
			}
		}
	}
}

func TestOriginPolicy(t *testing.T) {
	a := newAuth(t, Config{AllowedOrigins: []string{
		"https://ide.example.com",
		"http://localhost:3000",
		"https://*.apps.example.org",
		"vscode-webview://abc123",
		"https://[2001:db8::1]:8443",
	}})
	cases := []struct {
		origin, host string
		ok           bool
	}{
		{"", gwHost, true}, // no Origin: non-browser tool
		{"https://ide.example.com", gwHost, true},
		{"HTTPS://IDE.Example.COM", gwHost, true},
		{"https://ide.example.com:443", gwHost, true}, // explicit default port
		{"https://ide.example.com:8443", gwHost, false},
		{"http://ide.example.com", gwHost, false},
		{"https://ide.example.com.evil.com", gwHost, false},
		{"https://evil-ide.example.com", gwHost, false},
		{"http://localhost:3000", gwHost, true},
		{"http://localhost:3001", gwHost, false},
		{"http://localhost", gwHost, false},
		{"vscode-webview://abc123", gwHost, true},
		{"vscode-webview://abc124", gwHost, false},
		{"https://[2001:db8::1]:8443", gwHost, true},
		{"https://[2001:DB8::1]:8443", gwHost, true},
		// wildcards
		{"https://a.apps.example.org", gwHost, true},
		{"https://A.B.Apps.Example.ORG", gwHost, true},
		{"https://apps.example.org", gwHost, false},
		{"https://.apps.example.org", gwHost, false},
		{"http://a.apps.example.org", gwHost, false},
		{"https://a.apps.example.org:8443", gwHost, false},
		{"https://evilapps.example.org", gwHost, false},
		{"https://a.apps.example.org.evil.net", gwHost, false},
		// same origin: the gateway's own web client
		{"https://gw.example.com", gwHost, true},
		{"http://gw.example.com", gwHost, true},
		{"https://GW.example.com", gwHost, true},
		{"http://gw.example.com:8080", "gw.example.com:8080", true},
		{"http://GW.EXAMPLE.COM:8080", "gw.example.com:8080", true},
		{"http://gw.example.com:8081", "gw.example.com:8080", false},
		{"http://gw.example.com", "gw.example.com:8080", false},
		{"http://gw.example.com:8080", gwHost, false},
		{"https://gw.example.com", "gw.example.com:443", true},
		{"http://127.0.0.1:8080", "127.0.0.1:8080", true},
		{"http://[::1]:8080", "[::1]:8080", true},
		{"ws://gw.example.com", gwHost, false}, // same host, not a web origin
		{"https://other.example.com", gwHost, false},
		// malformed
		{"null", gwHost, false},
		{"gw.example.com", gwHost, false},
		{"https://gw.example.com/", gwHost, false},
		{"https://user@gw.example.com", gwHost, false},
		{"https://gw.example.com:0", gwHost, false},
		{"https://gw.example.com:99999", gwHost, false},
		{"https://", gwHost, false},
	}
	for _, c := range cases {
		hs := []hdr{bearer(tokAlpha)}
		if c.origin != "" {
			hs = append(hs, originH(c.origin))
		}
		r := wsReq("/acp", hs...)
		r.Host = c.host
		id, err := a.Upgrade(r)
		if c.ok {
			if err != nil {
				t.Errorf("origin %q host %q: want allowed, got %v", c.origin, c.host, err)
			} else if id.Tenant != "alpha" {
				t.Errorf("origin %q: identity %+v", c.origin, id)
			}
			continue
		}
		if err == nil {
			t.Errorf("origin %q host %q: want refused", c.origin, c.host)
			continue
		}
		wantErr(t, err, http.StatusForbidden, ReasonOriginNotAllowed)
	}
	// Origin is checked first: even without a token, a bad origin is 403,
	// and the Bearer path applies it too.
	_, err := a.Upgrade(wsReq("/acp", originH("https://evil.com")))
	wantErr(t, err, http.StatusForbidden, ReasonOriginNotAllowed)
	_, err = a.Bearer(wsReq("/v1/tickets", originH("https://evil.com"), bearer(tokAlpha)))
	wantErr(t, err, http.StatusForbidden, ReasonOriginNotAllowed)
	// Two Origin headers are refused.
	_, err = a.Upgrade(wsReq("/acp", originH("https://ide.example.com"), originH("https://ide.example.com"), bearer(tokAlpha)))
	wantErr(t, err, http.StatusForbidden, ReasonOriginNotAllowed)
	// A tenant's token does not help a missing token.
	_, err = a.Upgrade(wsReq("/acp", originH("https://ide.example.com")))
	wantErr(t, err, 401, ReasonMissingToken)
}

func TestOriginNoAllowList(t *testing.T) {
	a := newAuth(t, Config{})
	_, err := a.Upgrade(wsReq("/acp", originH("https://ide.example.com"), bearer(tokAlpha)))
	wantErr(t, err, 403, ReasonOriginNotAllowed)
	id, err := a.Upgrade(wsReq("/acp", originH("https://gw.example.com"), bearer(tokAlpha)))
	wantOK(t, id, err, "alpha", MethodBearer)
}

func TestUpdateTenants(t *testing.T) {
	a := newAuth(t, Config{})
	tk, _, _ := a.IssueTicket(Identity{Tenant: "beta"})
	err := a.UpdateTenants([]TenantTokens{{Name: "alpha", TokensSHA256: []string{sha("new-token")}}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.Upgrade(wsReq("/acp", bearer("new-token")))
	wantOK(t, id, err, "alpha", MethodBearer)
	_, err = a.Upgrade(wsReq("/acp", bearer(tokAlpha)))
	wantErr(t, err, 401, ReasonInvalidToken)
	// A ticket of a removed tenant stops working.
	_, err = a.Upgrade(wsReq("/acp?ticket=" + url.QueryEscape(tk)))
	wantErr(t, err, 403, ReasonUnknownTenant)
	// A bad table is refused and the old one stays.
	if err := a.UpdateTenants([]TenantTokens{{Name: "x", TokensSHA256: []string{"zz"}}}); err == nil {
		t.Fatal("bad table accepted")
	}
	id, err = a.Upgrade(wsReq("/acp", bearer("new-token")))
	wantOK(t, id, err, "alpha", MethodBearer)
}

func TestErrorString(t *testing.T) {
	e := &Error{Status: 401, Reason: ReasonInvalidToken, Message: "the bearer token is not valid"}
	if got := e.Error(); !strings.Contains(got, ReasonInvalidToken) || !strings.Contains(got, e.Message) {
		t.Fatalf("Error() = %q", got)
	}
}

// A static token's subject is "token:" and the first 16 hex digits of its
// SHA-256, whichever carrier brings it and in the tickets issued for it:
// the start of its configured hash, so it survives restarts and reloads;
// never the token.
func TestStaticTokenSubject(t *testing.T) {
	a := newAuth(t, Config{})
	want := "token:" + sha(tokAlpha)[:16]
	subject := func(id Identity, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(id.Subject, tokAlpha) {
			t.Fatalf("the subject %q holds the token", id.Subject)
		}
		return id.Subject
	}
	if got := subject(a.Upgrade(wsReq("/acp", bearer(tokAlpha)))); got != want {
		t.Errorf("bearer subject %q, want %q", got, want)
	}
	if got := subject(a.Upgrade(wsReq("/acp", proto("acp, acp.bearer."+tokAlpha)))); got != want {
		t.Errorf("subprotocol subject %q, want %q", got, want)
	}
	if got := subject(a.Bearer(wsReq("/v1/tickets", bearer(tokAlpha)))); got != want {
		t.Errorf("Bearer subject %q, want %q", got, want)
	}
	// A ticket from POST /v1/tickets carries it.
	w, body := serve(t, a.TicketsHandler(), postReq(bearer(tokAlpha)))
	if w.Code != http.StatusCreated {
		t.Fatalf("POST /v1/tickets: %d %+v", w.Code, body)
	}
	if got := subject(a.Upgrade(wsReq("/acp?ticket=" + body.Ticket))); got != want {
		t.Errorf("ticket subject %q, want %q", got, want)
	}
	// Each token of a tenant is its own subject.
	if other := subject(a.Upgrade(wsReq("/acp", bearer(tokAlpha2)))); other == want || other != "token:"+sha(tokAlpha2)[:16] {
		t.Errorf("the tenant's second token has subject %q (the first's is %q)", other, want)
	}
	// The same after a restart (a new authenticator) and a reload with the
	// hash spelled in capitals.
	b := newAuth(t, Config{})
	if got := subject(b.Upgrade(wsReq("/acp", bearer(tokAlpha)))); got != want {
		t.Errorf("subject after a restart %q, want %q", got, want)
	}
	if err := b.UpdateTenants([]TenantTokens{{Name: "alpha", TokensSHA256: []string{strings.ToUpper(sha(tokAlpha))}}}); err != nil {
		t.Fatal(err)
	}
	if got := subject(b.Upgrade(wsReq("/acp", bearer(tokAlpha)))); got != want {
		t.Errorf("subject after a reload %q, want %q", got, want)
	}
}
