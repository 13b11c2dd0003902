package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The sec-session suite tries, as a second subject of the same tenant,
// to get another subject's session without being let in by the sharing
// rule (issue #36, findings 4 and 11 of shared/reviews/security-99b340a.md):
// through the agent, by a session-creating request the agent answers with
// a session it already has, and through a leaked resume token. Alice and
// Bob are two static tokens of tenant acme, whose sharing is the default
// (same_subject); the agent is test/fakeagent with FAKE_MODE=sessions, and
// params.fakeSessionId makes its session/new answer with that session, as
// claude-code-acp does for _meta.claudeCode.options.resume.

// secNew is a session/new params whose answer names agentSID.
func secNew(agentSID string) map[string]any {
	return map[string]any{"cwd": vroot, "mcpServers": []any{}, "fakeSessionId": agentSID}
}

// secRefusedCreate fails unless m refuses a create that named an existing
// session, saying so.
func secRefusedCreate(t *testing.T, what string, m rpcMsg) {
	t.Helper()
	if m.Error == nil || m.Error.Code != -32603 || !strings.Contains(m.Error.Message, "existing session") {
		t.Fatalf("%s: %.500s; want error -32603 saying the agent answered with an existing session", what, m.Raw)
	}
}

// secRefusedLog is the gateway's record of a refused create.
const secRefusedLog = "agent answered a session-creating request with a session the gateway already knows; refused"

// secWantRefusedLog waits for the n-th record of a refused create naming
// agentSID, and fails unless it says known (which check refused it: the
// client is not told).
func secWantRefusedLog(t *testing.T, g *gateway, agentSID string, n int, known string) {
	t.Helper()
	deadline := time.Now().Add(subjWait)
	for {
		var got []string
		for _, r := range g.Logs() {
			if r["msg"] == secRefusedLog && r["agent_session"] == agentSID {
				got = append(got, fmt.Sprint(r["known"]))
			}
		}
		if len(got) >= n {
			if got[n-1] != known {
				t.Fatalf("refused create %d of %s logged known=%q; want %q", n, agentSID, got[n-1], known)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d refused creates of %s logged within %s, want %d", len(got), agentSID, subjWait, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSecSessionCreateNeverAdopts: a session/new whose answer names an
// agent session the gateway knows is refused, and its holder is not
// disturbed: the session live on Alice's connection (Bob's create, and
// Alice's own from a second connection: a create never replaces a holder),
// and one recorded as Alice's that nobody holds (she closed it), which she
// then loads with its history.
func TestSecSessionCreateNeverAdopts(t *testing.T) {
	acme := &sharingTenant{name: "acme"}
	g := sharingGatewayWith(t, []*sharingTenant{acme}, subjConfig(t))
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := &subjEnv{g: g, alice: acme.tokens[0], bob: acme.tokens[1], dial: tr.dial}
			t.Run("live", func(t *testing.T) {
				agentSID := "alice-live-" + tr.name
				a := e.aliceConn(t)
				m, _ := subjCall(t, a, "Alice's session/new", "session/new", secNew(agentSID))
				sid := m.NewSessionID()
				if sid == "" {
					t.Fatalf("Alice's session/new: %s", m.Raw)
				}
				promptWorks(t, a, "Alice", sid, "hello from alice")

				bob := e.bobConn(t)
				m, _ = subjCall(t, bob, "Bob's session/new naming Alice's session", "session/new", secNew(agentSID))
				secRefusedCreate(t, "Bob's session/new answered with Alice's live session", m)
				secWantRefusedLog(t, g, agentSID, 1, "made by another subject")
				if got := listed(t, bob, "Bob"); len(got) != 0 {
					t.Fatalf("Bob's session/list after the refused create lists %q; want nothing", got)
				}
				m, _ = subjCall(t, e.aliceConn(t), "Alice's second session/new naming her session", "session/new", secNew(agentSID))
				secRefusedCreate(t, "Alice's second connection's session/new answered with her live session", m)
				secWantRefusedLog(t, g, agentSID, 2, "live")

				if got := subjDrain(a, subjQuiet); len(got) != 0 {
					t.Fatalf("Alice's connection received %d messages after the refused creates, the first %.500s; want none", len(got), got[0].Raw)
				}
				promptWorks(t, a, "Alice", sid, "still mine after two refused creates")
			})
			t.Run("recorded", func(t *testing.T) {
				agentSID := "alice-closed-" + tr.name
				a := e.aliceConn(t)
				m, _ := subjCall(t, a, "Alice's session/new", "session/new", secNew(agentSID))
				sid := m.NewSessionID()
				if sid == "" {
					t.Fatalf("Alice's session/new: %s", m.Raw)
				}
				promptWorks(t, a, "Alice", sid, "hello from alice")
				if m, _ = subjCall(t, a, "Alice's session/close", "session/close", map[string]any{"sessionId": sid}); m.Error != nil {
					t.Fatalf("Alice's session/close: %s", m.Raw)
				}

				bob := e.bobConn(t)
				m, _ = subjCall(t, bob, "Bob's session/new naming Alice's closed session", "session/new", secNew(agentSID))
				secRefusedCreate(t, "Bob's session/new answered with Alice's recorded session", m)
				secWantRefusedLog(t, g, agentSID, 1, "made by another subject")

				// Alice's session is hers still: she loads it, with her history.
				a2 := e.aliceConn(t)
				m, before := subjCall(t, a2, "Alice's session/load of her session", "session/load", subjParams("session/load", sid))
				if m.Error != nil {
					t.Fatalf("Alice's session/load after Bob's refused create: %s", m.Raw)
				}
				replayed(t, a2, "Alice", sid, before)
			})
		})
	}
}

// TestSecSessionResumeIsTheSubjects: a resume token resumes its connection
// only for the subject that made it. Bob, with Alice's token, gets what a
// made-up token gets (same status and body, before the upgrade); Alice's
// detached connection is not disturbed, and she resumes it and prompts.
func TestSecSessionResumeIsTheSubjects(t *testing.T) {
	acme := &sharingTenant{name: "acme"}
	g := sharingGatewayWith(t, []*sharingTenant{acme}, subjConfig(t))
	alice, bob := bearer(acme.tokens[0]), bearer(acme.tokens[1])

	r := newRconn(t, g, alice)
	r.initialize()
	sid := r.newSession(vroot)
	r.resetDetached()

	received := strconv.Itoa(r.Got)
	bogus := strings.Repeat("x", len(r.token))
	if i := strings.IndexByte(r.token, '.'); i > 0 { // this replica's instance, another connection
		bogus = r.token[:i+1] + strings.Repeat("x", len(r.token)-i-1)
	}
	unknown := wantResumeRefused(t, g, bob, resumePath(bogus, received), "a made-up token")
	for _, try := range []struct {
		who    string
		header http.Header
		token  string
	}{
		{"Bob, with Alice's token", bob, r.token},
		{"Alice, with a made-up token", alice, bogus},
		{"Bob, with Alice's token again", bob, r.token},
	} {
		if body := wantResumeRefused(t, g, try.header, resumePath(try.token, received), try.who); body != unknown {
			t.Fatalf("resume by %s: %s; want exactly the refusal of an unknown token: %s", try.who, body, unknown)
		}
	}

	r.resume(r.Got)
	m := r.Await("Alice's prompt after resuming", r.Request("session/prompt", textPrompt(sid, "back again")), 10*time.Second, func(m rpcMsg) {
		if m.Method != "session/update" {
			t.Fatalf("Alice, prompting after her resume: %.500s", m.Raw)
		}
	})
	if m.Error != nil || stopReason(t, m) != "end_turn" {
		t.Fatalf("Alice's prompt after resuming: %s; want end_turn", m.Raw)
	}
}

// TestSecSessionOwnersPerTenant: one tenant's churn never hides another
// tenant's sessions from their makers' session/list (finding 8: one ring of
// 65,536 owners for every tenant, so another tenant's sessions pushed
// Alice's out and her list lost them). With sessions.owners_per_tenant at
// 4, globex makes 12 sessions; Alice's session, made before, is still in
// her list, over each transport.
func TestSecSessionOwnersPerTenant(t *testing.T) {
	acme, globex := &sharingTenant{name: "acme"}, &sharingTenant{name: "globex"}
	extra := strings.Replace(subjConfig(t), "max_processes: 1", "max_processes: 2", 1) +
		"sessions: {owners_per_tenant: 4}\n"
	g := sharingGatewayWith(t, []*sharingTenant{acme, globex}, extra)
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			alice := tr.dial(t, g, acme.tokens[0])
			m, _ := subjCall(t, alice, "Alice's session/new", "session/new", map[string]any{"cwd": vroot, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("Alice's session/new: %s", m.Raw)
			}
			gina := tr.dial(t, g, globex.tokens[0])
			for i := range 12 {
				m, _ := subjCall(t, gina, "globex's session/new", "session/new", map[string]any{"cwd": vroot, "mcpServers": []any{}})
				gsid := m.NewSessionID()
				if gsid == "" {
					t.Fatalf("globex's session/new %d: %s", i, m.Raw)
				}
				if m, _ = subjCall(t, gina, "globex's session/close", "session/close", map[string]any{"sessionId": gsid}); m.Error != nil {
					t.Fatalf("globex's session/close %d: %s", i, m.Raw)
				}
			}
			if got := listed(t, alice, "Alice"); !slices.Contains(got, sid) {
				t.Fatalf("after globex made 12 sessions, Alice's session/list lists %q, not her session %q", got, sid)
			}
		})
	}
}

// TestSecSessionCreateNeverAdoptsAcrossProcesses: a session live on one
// process of the agent is not taken by a create another process of the
// same agent and tenant answers with its ID (one session per process, so
// the second create goes to the second process). Alice's second
// connection tries it, so that only the live check can refuse it; her
// first connection is not disturbed.
func TestSecSessionCreateNeverAdoptsAcrossProcesses(t *testing.T) {
	acme := &sharingTenant{name: "acme"}
	extra := strings.Replace(subjConfig(t), "max_processes: 1", "max_processes: 2, max_sessions_per_process: 1", 1)
	g := sharingGatewayWith(t, []*sharingTenant{acme}, extra)
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := &subjEnv{g: g, alice: acme.tokens[0], bob: acme.tokens[1], dial: tr.dial}
			agentSID := "alice-elsewhere-" + tr.name
			a := e.aliceConn(t)
			m, _ := subjCall(t, a, "Alice's session/new", "session/new", secNew(agentSID))
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("Alice's session/new: %s", m.Raw)
			}
			promptWorks(t, a, "Alice", sid, "hello from alice")
			a2 := e.aliceConn(t)
			m, _ = subjCall(t, a2, "Alice's second session/new naming her session", "session/new", secNew(agentSID))
			secRefusedCreate(t, "a session/new answered on another process with Alice's live session", m)
			secWantRefusedLog(t, g, agentSID, 1, "live on another process")
			if got := subjDrain(a, subjQuiet); len(got) != 0 {
				t.Fatalf("Alice's connection received %d messages after the refused create, the first %.500s; want none", len(got), got[0].Raw)
			}
			promptWorks(t, a, "Alice", sid, "still mine")
			// Her session ends, so the next subtest finds a free process.
			if m, _ = subjCall(t, a, "Alice's session/close", "session/close", map[string]any{"sessionId": sid}); m.Error != nil {
				t.Fatalf("Alice's session/close: %s", m.Raw)
			}
		})
	}
}
