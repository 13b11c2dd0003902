package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
)

// permCountingAgent asks for a permission on every prompt, ends the turn
// at the first answer, and counts every answer it gets: _demo/count
// reports how many arrived, duplicates included.
func permCountingAgent() {
	out := bufio.NewWriter(os.Stdout)
	answers, next := 0, 0
	prompts := map[string]json.RawMessage{} // permission request id → the prompt's id
	serveLines(func(m agentLine) {
		if answerSetup(out, m) {
			out.Flush()
			return
		}
		switch m.Method {
		case "session/prompt":
			next++
			pid := "p" + strconv.Itoa(next)
			prompts[pid] = m.ID
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%q,"method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t%d"},"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}}`+"\n", pid, next)
		case "_demo/count":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"answers":%d}}`+"\n", m.ID, answers)
		case "_demo/exit": // the agent dies with its requests unanswered
			os.Exit(0)
		case "":
			answers++
			var id string
			_ = json.Unmarshal(m.ID, &id)
			if prompt, ok := prompts[id]; ok {
				delete(prompts, id)
				fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"stopReason":"end_turn"}}`+"\n", prompt)
			}
		default:
			if len(m.ID) > 0 {
				fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", m.ID)
			}
		}
		out.Flush()
	})
}

// Two clients of one session answering the same permission request at the
// same instant: exactly one answer reaches the agent, every round.
func TestTwoAnswersOneReachesTheAgent(t *testing.T) {
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	r := testPool(t, "permcount", nil)
	a, b := newTestConn(t, r, "a"), newTestConn(t, r, "b")
	a.init(`{}`)
	b.init(`{}`)
	sid := a.newSession("1")
	if res := b.attach("2", sid, ""); res.Error != nil {
		t.Fatalf("attach: %s", res.raw)
	}
	for i := range rounds {
		pid := strconv.Itoa(100 + i)
		a.prompt(pid, sid, "go")
		qa, qb := a.untilMethod(acp.RequestPermission, nil), b.untilMethod(acp.RequestPermission, nil)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, q := range []struct {
			tc *testConn
			id json.RawMessage
		}{{a, qa.ID}, {b, qb.ID}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				q.tc.c.Handle([]byte(`{"jsonrpc":"2.0","id":` + string(q.id) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`))
			}()
		}
		close(start)
		wg.Wait()
		a.await(pid, nil)
	}
	a.send(`{"jsonrpc":"2.0","id":"count","method":"_demo/count","params":{}}`)
	got := a.await(`"count"`, nil)
	var res struct {
		Answers int `json:"answers"`
	}
	if err := json.Unmarshal(got.Result, &res); err != nil || res.Answers != rounds {
		t.Fatalf("the agent got %s answers to %d permission requests, want exactly %d", got.Result, rounds, rounds)
	}
}

// Attaching to thousands of unknown session IDs answers each at once with
// "session not found", and changes nothing.
func TestAttachStormOfUnknownIDs(t *testing.T) {
	r := testPool(t, "demo", nil)
	c := newTestConn(t, r, "storm")
	c.init(`{}`)
	for i := range 3000 {
		id := strconv.Itoa(i + 10)
		c.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/attach","params":{"sessionId":"unknown-` + id + `"}}`)
		if got := c.await(id, nil); got.Error == nil || got.Error.Code != -32002 {
			t.Fatalf("attach %d to an unknown session: %s", i, got.raw)
		}
	}
	if n := counterValue(r.metrics.Attaches.WithLabelValues("not_found")); n != 3000 {
		t.Fatalf("attaches not_found = %v, want 3000", n)
	}
}
