package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// childStealAgent is a v2 agent whose sessions are s1, s2, … and whose
// prompt "steal X" announces the agent session X as a child of the
// prompt's session (a subagent_update naming it), speaks under X, and ends
// the turn: an agent told to pass another's session off as its child.
func childStealAgent() {
	out := bufio.NewWriter(os.Stdout)
	n := 0
	serveLines(func(m agentLine) {
		defer out.Flush()
		switch m.Method {
		case "initialize":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":2,"info":{"name":"t","version":"0"},"capabilities":{"session":{}}}}`+"\n", m.ID)
		case "session/new":
			n++
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"s%d"}}`+"\n", m.ID, n)
		case "session/prompt":
			var p struct {
				Params struct {
					SessionID string `json:"sessionId"`
					Prompt    []struct {
						Text string `json:"text"`
					} `json:"prompt"`
				} `json:"params"`
			}
			_ = json.Unmarshal(m.raw, &p)
			sid := p.Params.SessionID
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"messageId":"m%d"}}`+"\n", m.ID, n)
			if len(p.Params.Prompt) > 0 {
				if victim, ok := strings.CutPrefix(p.Params.Prompt[0].Text, "steal "); ok {
					fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":{"sessionUpdate":"subagent_update","sessionId":%q,"title":"stolen"}}}`+"\n", sid, victim)
					fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"from the stolen session"}}}}`+"\n", victim)
				}
			}
			fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":{"sessionUpdate":"state_update","state":"idle","stopReason":"end_turn"}}}`+"\n", sid)
		}
	})
}

// A subagent's child is made as a create is: an agent that announces a
// session the gateway knows as another subject's (Bob's, ended on the
// gateway but recorded as his) as a child of Alice's gets no child for
// it: Alice's update names no session ("") and nothing under it reaches
// her, so she never holds a sealed ID of Bob's session to load.
func TestChildNeverAdoptsAKnownSession(t *testing.T) {
	r := testPool(t, "child-steal", func(c *PoolConfig) { c.MaxProcesses = 1 })
	init := `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":2,"info":{"name":"c","version":"0"},"capabilities":{}}}`
	bob := connWith(t, r, ConnInfo{ID: "bob", Subject: "token:bob"})
	bob.send(init)
	if m := bob.await(`"init"`, nil); m.Error != nil {
		t.Fatalf("initialize: %s", m.raw)
	}
	bob.newSession("1") // the agent's s1, recorded as Bob's
	bob.c.Close()
	alice := connWith(t, r, ConnInfo{ID: "alice", Subject: "token:alice"})
	alice.send(init)
	if m := alice.await(`"init"`, nil); m.Error != nil {
		t.Fatalf("initialize: %s", m.raw)
	}
	sid := alice.newSession("1")
	alice.send(`{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"` + sid + `","prompt":[{"type":"text","text":"steal s1"}]}}`)
	if m := alice.await("9", nil); m.Error != nil {
		t.Fatalf("prompt: %s", m.raw)
	}
	for {
		m := alice.next()
		if strings.Contains(string(m.Params), "from the stolen session") {
			t.Fatalf("Alice got the stolen session's update: %s", m.raw)
		}
		if strings.Contains(string(m.Params), `"subagent_update"`) {
			var u struct {
				Update struct {
					SessionID string `json:"sessionId"`
				} `json:"update"`
			}
			if err := json.Unmarshal(m.Params, &u); err != nil || u.Update.SessionID != "" {
				t.Fatalf("Alice's subagent_update names %q (%v), want \"\": a child made of Bob's session", u.Update.SessionID, err)
			}
		}
		if strings.Contains(string(m.Params), `"idle"`) {
			return
		}
	}
}
