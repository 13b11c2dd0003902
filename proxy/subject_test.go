package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// subjectConns are Alice's and Bob's connections (two subjects of one
// tenant) to a relay whose tenant shares as sharing says.
func subjectConns(t *testing.T, sharing Sharing) (alice, bob *testConn) {
	r := testPool(t, "demo", nil, func(c *Config) { c.Tenants[0].Sharing = sharing })
	alice = connWith(t, r, ConnInfo{ID: "alice", Subject: "token:alice"})
	bob = connWith(t, r, ConnInfo{ID: "bob", Subject: "token:bob"})
	alice.init(`{}`)
	bob.init(`{}`)
	return alice, bob
}

// listed reports whether tc's session/list names sid.
func (tc *testConn) listed(id, sid string) bool {
	tc.t.Helper()
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/list","params":{}}`)
	m := tc.await(id, nil)
	if m.Error != nil {
		tc.t.Fatalf("session/list: %s", m.raw)
	}
	return strings.Contains(string(m.Result), `"`+sid+`"`)
}

// promptOK prompts sid and reports whether the turn ended well, passing
// what else came to seen.
func (tc *testConn) promptOK(id, sid string, seen func(msg)) msg {
	tc.t.Helper()
	tc.prompt(id, sid, "hello")
	return tc.await(id, seen)
}

// The subject sealed in a session's ID decides, by the tenant's sharing,
// what another subject of the tenant may do with it: with same_subject
// Bob cannot see, load or attach to Alice's session, and she goes on
// undisturbed; with tenant he loads it and she is told she lost it; with
// read_only_for_others his load becomes a read-only attach.
func TestSubjectBoundary(t *testing.T) {
	ended := func(got *[]string) func(msg) {
		return func(m msg) {
			if m.Method == methodSessionEnded {
				*got = append(*got, string(m.Params))
			}
		}
	}
	t.Run("same_subject", func(t *testing.T) {
		alice, bob := subjectConns(t, Sharing{})
		sid := alice.newSession("1")
		if res := alice.promptOK("2", sid, nil); res.Error != nil {
			t.Fatalf("prompt: %s", res.raw)
		}
		if !alice.listed("3", sid) {
			t.Error("Alice's own list does not name her session")
		}
		if bob.listed("4", sid) {
			t.Error("Bob's list names Alice's session")
		}
		for i, method := range []string{"session/load", "session/resume", "session/attach", "session/close"} {
			id := string(rune('a' + i))
			bob.send(`{"jsonrpc":"2.0","id":"` + id + `","method":"` + method + `","params":{"sessionId":"` + sid + `","cwd":"/tmp","mcpServers":[]}}`)
			if m := bob.await(`"`+id+`"`, nil); m.Error == nil || m.Error.Code != jsonrpc.CodeNotFound {
				t.Errorf("Bob's %s of Alice's session: %s, want -32002", method, m.raw)
			}
		}
		var told []string
		if res := alice.promptOK("5", sid, ended(&told)); res.Error != nil || len(told) != 0 {
			t.Errorf("Alice's prompt after Bob's tries: %s (told %v)", res.raw, told)
		}
	})
	t.Run("tenant", func(t *testing.T) {
		alice, bob := subjectConns(t, Sharing{Attach: SharingTenant})
		sid := alice.newSession("1")
		alice.promptOK("2", sid, nil)
		if !bob.listed("3", sid) {
			t.Error("Bob's list does not name Alice's session")
		}
		bob.send(`{"jsonrpc":"2.0","id":4,"method":"session/load","params":{"sessionId":"` + sid + `","cwd":"/tmp","mcpServers":[]}}`)
		if m := bob.await("4", nil); m.Error != nil || strings.Contains(string(m.Result), `"readOnly"`) {
			t.Fatalf("Bob's load: %s", m.raw)
		}
		notice := alice.untilMethod(methodSessionEnded, nil)
		var p struct{ SessionID, Reason string }
		if json.Unmarshal(notice.Params, &p); p.SessionID != sid || !strings.Contains(p.Reason, "another client") {
			t.Errorf("Alice was told %s", notice.raw)
		}
		if res := alice.promptOK("5", sid, nil); res.Error == nil || res.Error.Code != jsonrpc.CodeNotFound {
			t.Errorf("Alice's prompt after the load: %s, want -32002", res.raw)
		}
		if res := bob.promptOK("6", sid, nil); res.Error != nil {
			t.Errorf("Bob's prompt: %s", res.raw)
		}
	})
	t.Run("read_only_for_others", func(t *testing.T) {
		alice, bob := subjectConns(t, Sharing{Attach: SharingTenant, ReadOnlyForOthers: true})
		sid := alice.newSession("1")
		alice.promptOK("2", sid, nil)
		if !bob.listed("3", sid) {
			t.Error("Bob's list does not name Alice's session")
		}
		replayed := 0
		bob.send(`{"jsonrpc":"2.0","id":4,"method":"session/load","params":{"sessionId":"` + sid + `","cwd":"/tmp","mcpServers":[]}}`)
		m := bob.await("4", func(m msg) {
			if m.Method == "session/update" {
				replayed++
			}
		})
		var res struct {
			Meta struct {
				Acpgate struct{ ReadOnly, Attached bool } `json:"acpgate"`
			} `json:"_meta"`
		}
		if m.Error != nil || json.Unmarshal(m.Result, &res) != nil || !res.Meta.Acpgate.ReadOnly || !res.Meta.Acpgate.Attached || replayed == 0 {
			t.Fatalf("Bob's load: %s after %d updates, want a read-only attach with the history", m.raw, replayed)
		}
		if res := bob.promptOK("5", sid, nil); res.Error == nil || res.Error.Code != codeReadOnly {
			t.Errorf("Bob's prompt: %s, want -32007", res.raw)
		}
		var told []string
		if res := alice.promptOK("6", sid, ended(&told)); res.Error != nil || len(told) != 0 {
			t.Errorf("Alice's prompt after Bob's load: %s (told %v)", res.raw, told)
		}
		// Bob watches her turn.
		bob.untilMethod("session/update", nil)
	})
}
