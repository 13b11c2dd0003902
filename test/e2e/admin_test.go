package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The admin API (on the operations listener, metrics_listen) lists the
// connections and sessions, ends a running session (its turn ends
// "cancelled", later prompts get an error naming it) and closes a
// connection (1008, its resume refused). Tenant tokens, forged tokens and
// anonymous calls are refused; the main listener does not serve it.

const (
	adminTok = "e2e-admin-token-0123456789abcdef"
	acmeTok  = "e2e-acme-token-0123456789abcdef"
)

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// adminGateway runs a gateway with tenant acme (its root returned), an
// admin token and an operations listener.
func adminGateway(t *testing.T) (*gateway, string) {
	t.Helper()
	root := t.TempDir()
	cfg := fmt.Sprintf("%sobservability:\n  metrics_listen: 127.0.0.1:0\ntenants:\n  - name: acme\n    tokens_sha256: [%q]\n    root: %q\n"+
		"admin:\n  tokens_sha256: [%q]\n", resumeConfig, hexSHA256(acmeTok), root, hexSHA256(adminTok))
	g := startGateway(t, gwOpts{config: cfg})
	if g.MetricsAddr() == "" {
		t.Fatal("no operations listener")
	}
	return g, root
}

// adminDo calls the admin API at url with token ("" = none) and decodes a
// 200's JSON body into out (if not nil).
func adminDo(t *testing.T, method, url, token string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, body)
		}
	}
	return resp.StatusCode
}

type adminConnJSON struct {
	ID, Tenant, Subject, Agent, Transport, Remote, State string
	Sessions                                             []string
}

type adminSessionJSON struct {
	ID, Tenant, Agent, State string
	Clients                  int
	TurnStarted              *time.Time
}

func TestAdminAPIRefusesOthers(t *testing.T) {
	g, _ := adminGateway(t)
	ops := "http://" + g.MetricsAddr() + "/v1/admin/"
	forgedJWT := "eyJhbGciOiJIUzI1NiJ9.eyJhY3BnYXRlX2FkbWluIjp0cnVlfQ.c2lnbmF0dXJl"
	for name, c := range map[string]struct {
		token string
		want  int
	}{
		"anonymous":  {"", http.StatusUnauthorized},
		"forged":     {"not-" + adminTok, http.StatusUnauthorized},
		"forged JWT": {forgedJWT, http.StatusUnauthorized},
		"tenant":     {acmeTok, http.StatusForbidden},
	} {
		for _, call := range []struct{ method, path string }{
			{http.MethodGet, "connections"}, {http.MethodGet, "sessions"},
			{http.MethodDelete, "sessions/x"}, {http.MethodDelete, "connections/x"},
		} {
			if got := adminDo(t, call.method, ops+call.path, c.token, nil); got != c.want {
				t.Errorf("%s credential, %s %s: %d, want %d", name, call.method, call.path, got, c.want)
			}
		}
	}
	if got := adminDo(t, http.MethodGet, "http://"+g.Addr+"/v1/admin/sessions", adminTok, nil); got == http.StatusOK {
		t.Error("the main listener serves the admin API beside an operations listener")
	}
	if strings.Contains(g.LogText(), adminTok) {
		t.Error("the admin token is in the log")
	}
}

func TestAdminAPIEndsSessionAndClosesConnection(t *testing.T) {
	g, root := adminGateway(t)
	ops := "http://" + g.MetricsAddr() + "/v1/admin/"
	r := newRconn(t, g, bearer(acmeTok))
	r.initialize()
	sid := r.newSession(root)

	var conns struct{ Connections []adminConnJSON }
	if code := adminDo(t, http.MethodGet, ops+"connections", adminTok, &conns); code != http.StatusOK || len(conns.Connections) != 1 {
		t.Fatalf("connections: %d %+v", code, conns)
	}
	if c := conns.Connections[0]; c.ID != r.connID || c.Tenant != "acme" || c.Transport != "websocket" || c.State != "attached" ||
		!strings.HasPrefix(c.Remote, "127.0.0.1:") || len(c.Sessions) != 1 || c.Sessions[0] != sid {
		t.Fatalf("connection: %+v", c)
	}

	id, k := r.slowTurn(sid, 2)
	var sessions struct{ Sessions []adminSessionJSON }
	adminDo(t, http.MethodGet, ops+"sessions?tenant=acme", adminTok, &sessions)
	if len(sessions.Sessions) != 1 || sessions.Sessions[0].ID != sid || sessions.Sessions[0].State != "running" ||
		sessions.Sessions[0].TurnStarted == nil || sessions.Sessions[0].Clients != 1 {
		t.Fatalf("sessions while the turn runs: %+v", sessions)
	}
	adminDo(t, http.MethodGet, ops+"sessions?tenant=nobody", adminTok, &sessions)
	if len(sessions.Sessions) != 0 {
		t.Fatalf("sessions of another tenant: %+v", sessions)
	}

	if code := adminDo(t, http.MethodDelete, ops+"sessions/"+sid, adminTok, nil); code != http.StatusOK {
		t.Fatalf("ending the session: %d", code)
	}
	told := false
	m := r.Await("the cancelled prompt", id, turn, func(m rpcMsg) {
		if m.Method == "_acpgate/session_ended" {
			told = true
			return
		}
		k.handle(m)
	})
	if s := stopReason(t, m); s != "cancelled" {
		t.Fatalf("stopReason %q, want cancelled: %s", s, m.Raw)
	}
	for !told {
		if m := r.Next("_acpgate/session_ended", turn); m.Method == "_acpgate/session_ended" {
			told = true
		}
	}
	m = r.Await("a prompt after the end", r.Request("session/prompt", textPrompt(sid, "hello")), turn, nil)
	if m.Error == nil || !strings.Contains(m.Error.Message, sid) || !strings.Contains(m.Error.Message, "ended by an administrator") {
		t.Fatalf("a prompt after the end: %s", m.Raw)
	}

	if code := adminDo(t, http.MethodDelete, ops+"connections/"+r.connID, adminTok, nil); code != http.StatusOK {
		t.Fatalf("closing the connection: %d", code)
	}
	if st, _ := closedWith(t, r.c, 10*time.Second); st != websocket.StatusPolicyViolation {
		t.Fatalf("the closed socket: %s; want 1008", closedText(r.c))
	}
	var ce websocket.CloseError
	if !errors.As(r.c.Err(), &ce) || ce.Reason != "closed by an administrator" {
		t.Fatalf("the close: %s", closedText(r.c))
	}
	wantResumeRefused(t, g, bearer(acmeTok), resumePath(r.token, strconv.Itoa(r.Got)), "the token of a connection an administrator closed")
	adminDo(t, http.MethodGet, ops+"connections", adminTok, &conns)
	if len(conns.Connections) != 0 {
		t.Fatalf("connections after the close: %+v", conns)
	}
}
