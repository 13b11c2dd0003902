package proxy

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/adminview"
)

// A "deaf" test agent never answers a prompt, nor heeds session/cancel.
func init() {
	if os.Getenv("ACPGATE_TEST_AGENT") != "deaf" {
		return
	}
	serveLines(func(m agentLine) { answerSetup(os.Stdout, m) })
	os.Exit(0)
}

// An administrator ends a shared session mid-turn: the turn's client gets
// stopReason "cancelled", both clients are told, and later prompts of
// either get an error naming the session.
func TestAdminEndSessionCancelsTheTurn(t *testing.T) {
	r := testPool(t, "demo", nil)
	owner, peerC, sid := sharedSession(t, r, "")
	owner.prompt("3", sid, "slow")
	owner.untilMethod(acp.SessionUpdate, nil) // the turn runs
	snaps := r.SessionSnapshots("", true)
	if len(snaps) != 1 || snaps[0].ID != sid || snaps[0].State != adminview.Running || snaps[0].Clients != 2 || snaps[0].TurnStarted.IsZero() {
		t.Fatalf("sessions while the turn runs: %+v", snaps)
	}
	if got := r.SessionSnapshots("other", false); len(got) != 0 {
		t.Fatalf("another tenant's sessions: %+v", got)
	}
	if conns := r.ConnSnapshots(); len(conns) != 2 || len(conns[0].Sessions) != 1 || conns[0].Sessions[0] != sid {
		t.Fatalf("connections: %+v", conns)
	}
	if _, err := r.EndSession(sid, "test"); err != nil {
		t.Fatal(err)
	}
	ended := false
	got := owner.await("3", func(m msg) { ended = ended || m.Method == methodSessionEnded })
	if !strings.Contains(string(got.Result), `"cancelled"`) {
		t.Fatalf("the turn's answer: %s", got.raw)
	}
	if !ended {
		owner.untilMethod(methodSessionEnded, nil)
	}
	peerC.untilMethod(methodSessionEnded, nil)
	for i, tc := range []*testConn{owner, peerC} {
		id := []string{"5", "6"}[i]
		tc.prompt(id, sid, "again")
		if got := tc.await(id, nil); got.Error == nil || !strings.Contains(got.Error.Message, sid) ||
			!strings.Contains(got.Error.Message, "ended by an administrator") {
			t.Fatalf("a prompt after the end: %s", got.raw)
		}
	}
	if snaps := r.SessionSnapshots("", true); len(snaps) != 0 {
		t.Fatalf("sessions after the end: %+v", snaps)
	}
	if _, err := r.EndSession(sid, "test"); !errors.Is(err, ErrNoSuchSession) {
		t.Fatalf("ending it again: %v", err)
	}
}

// An idle session ends at once; its owner may go on with other sessions.
func TestAdminEndIdleSession(t *testing.T) {
	r := testPool(t, "demo", nil)
	c := newTestConn(t, r, "c")
	c.init(`{}`)
	sid := c.newSession("1")
	if snaps := r.SessionSnapshots("", true); len(snaps) != 1 || snaps[0].State != adminview.Idle || snaps[0].Since.IsZero() {
		t.Fatalf("sessions: %+v", snaps)
	}
	start := time.Now()
	if _, err := r.EndSession(sid, "test"); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("ending an idle session waited")
	}
	c.untilMethod(methodSessionEnded, nil)
	c.send(`{"jsonrpc":"2.0","id":9,"method":"session/load","params":{"sessionId":"` + sid + `","cwd":"/tmp","mcpServers":[]}}`)
	if got := c.await("9", nil); got.Error == nil || !strings.Contains(got.Error.Message, "ended by an administrator") {
		t.Fatalf("loading it again: %s", got.raw)
	}
	other := c.newSession("2")
	c.prompt("3", other, "hello")
	if got := c.await("3", nil); got.Error != nil {
		t.Fatalf("a prompt on another session: %s", got.raw)
	}
}

// A connection an administrator closed cannot be resumed.
func TestAdminCloseConnRefusesResume(t *testing.T) {
	r := testPool(t, "demo", nil)
	r.resume = SessionsConfig{DetachTimeout: time.Minute, ReplayBufferBytes: 1 << 20}
	c := newTestConn(t, r, "c")
	c.init(`{}`)
	c.newSession("1")
	c.c.SocketEnded(c.s, false) // detached: kept for a resume
	if conns := r.ConnSnapshots(); len(conns) != 1 || !conns[0].Detached || conns[0].DetachedAt.IsZero() {
		t.Fatalf("connections: %+v", conns)
	}
	if snaps := r.SessionSnapshots("", true); len(snaps) != 1 || snaps[0].State != adminview.Detached {
		t.Fatalf("sessions: %+v", snaps)
	}
	if _, err := r.CloseConn("c", "test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resume("", "", "", c.c.token, 0); !errors.Is(err, ErrResumeRefused) {
		t.Fatalf("resume after the close: %v", err)
	}
	if conns := r.ConnSnapshots(); len(conns) != 0 {
		t.Fatalf("connections after the close: %+v", conns)
	}
	if _, err := r.CloseConn("c", "test", nil); !errors.Is(err, ErrNoSuchConn) {
		t.Fatalf("closing it again: %v", err)
	}
}

// An agent that does not answer the cancelled turn: the gateway answers
// its client "cancelled" itself, within the bound.
func TestAdminEndSessionOfADeafAgent(t *testing.T) {
	r := testPool(t, "deaf", nil)
	c := newTestConn(t, r, "c")
	c.init(`{}`)
	sid := c.newSession("1")
	c.prompt("2", sid, "hello")
	waitFor(t, "the prompt to reach the agent", func() bool { return r.PromptsInFlight("") == 1 })
	start := time.Now()
	if _, err := r.EndSession(sid, "test"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < adminCancelWait/2 || d > adminCancelWait+time.Second {
		t.Errorf("EndSession took %s; the bound is %s", d, adminCancelWait)
	}
	if got := c.await("2", nil); !strings.Contains(string(got.Result), `"cancelled"`) {
		t.Fatalf("the turn's answer: %s", got.raw)
	}
	if n := r.PromptsInFlight(""); n != 0 {
		t.Fatalf("%d prompts in flight after the end", n)
	}
}

// A permission request waiting for the turn's client is answered
// "cancelled" in its place and taken back from the client, as a client
// that cancels does; the agent then ends the turn.
func TestAdminEndSessionSettlesPermission(t *testing.T) {
	r := testPool(t, "permcount", nil)
	c := newTestConn(t, r, "c")
	c.init(`{}`)
	sid := c.newSession("1")
	c.prompt("2", sid, "hello")
	perm := c.untilMethod(acp.RequestPermission, nil)
	if _, err := r.EndSession(sid, "test"); err != nil {
		t.Fatal(err)
	}
	withdrawn := false
	c.await("2", func(m msg) {
		withdrawn = withdrawn || m.Method == acp.CancelRequest && strings.Contains(string(m.Params), string(perm.ID))
	})
	if !withdrawn {
		t.Fatal("the permission request was not taken back from the client")
	}
}

// The gateway cancels a running turn (a budget): the agent gets
// session/cancel, the answer says why under _meta.acpgate, the session
// lives on; a deaf agent's turn is answered for it. With no turn running
// there is nothing to cancel.
func TestCancelTurn(t *testing.T) {
	for _, mode := range []string{"demo", "deaf"} {
		t.Run(mode, func(t *testing.T) {
			r := testPool(t, mode, nil)
			c := newTestConn(t, r, "c")
			c.init(`{}`)
			sid := c.newSession("1")
			if r.CancelTurn(sid, "budget", []byte(`{"unit":"USD"}`)) {
				t.Fatal("cancelled a turn while none ran")
			}
			c.prompt("2", sid, "slow")
			if mode == "demo" {
				c.untilMethod(acp.SessionUpdate, nil) // the turn runs
			} else {
				deadline := time.Now().Add(5 * time.Second)
				for len(r.SessionSnapshots("", true)) == 0 || r.SessionSnapshots("", true)[0].State != adminview.Running {
					if time.Now().After(deadline) {
						t.Fatal("the turn did not start")
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			if !r.CancelTurn(sid, "budget", []byte(`{"unit":"USD"}`)) || r.CancelTurn("no-such-session", "budget", nil) {
				t.Fatal("CancelTurn")
			}
			got := c.await("2", nil)
			var res struct {
				StopReason string `json:"stopReason"`
				Meta       struct {
					Acpgate struct {
						Budget struct{ Unit string } `json:"budget"`
					} `json:"acpgate"`
				} `json:"_meta"`
			}
			if err := json.Unmarshal(got.Result, &res); err != nil || res.StopReason != "cancelled" || res.Meta.Acpgate.Budget.Unit != "USD" {
				t.Fatalf("the cancelled turn's answer: %s", got.raw)
			}
			if mode == "demo" {
				c.prompt("3", sid, "hello") // the session lives on
				if got := c.await("3", nil); got.Error != nil || strings.Contains(string(got.Result), "budget") {
					t.Fatalf("the next turn: %s", got.raw)
				}
			}
		})
	}
}
