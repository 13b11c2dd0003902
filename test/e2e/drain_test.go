package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// The drain keeps the last word (issue #29): a turn a graceful drain lets
// finish delivers its answer to the client that prompted, and its
// turn_complete to the client attached to the session (session/attach),
// before their connections close (1001 on a WebSocket), on both
// transports. The turn is the fake agent's "sleep": silent for 2.5 s, then
// only the answer (no chunk streamed before it, unlike the demo agent's
// turns in test/ops); the drain starts 0.3 to 1.5 s into it.

const (
	drainRuns  = 20                      // per transport
	drainTurn  = "sleep 2.5"             // the fake agent's silent turn
	drainFirst = 300 * time.Millisecond  // the earliest SIGTERM after the prompt
	drainLast  = 1500 * time.Millisecond // the latest
	// drainAtOnce bounds the gateways running at once: a run is mostly
	// the agent's sleep, so many share two cores.
	drainAtOnce = 16
)

// drainDelay spreads the runs' SIGTERMs evenly over [drainFirst, drainLast].
func drainDelay(i int) time.Duration {
	return drainFirst + time.Duration(i)*(drainLast-drainFirst)/(drainRuns-1)
}

// TestDrainKeepsTheLastWord runs drainRuns drains a transport, each on a
// gateway of its own (a SIGTERM drains a whole gateway), several at once.
func TestDrainKeepsTheLastWord(t *testing.T) {
	fakeAgentBin(t) // built once, before the runs need it
	type run struct {
		name  string
		f     func(*testing.T, time.Duration)
		delay time.Duration
	}
	var runs []run
	for i := range drainRuns {
		runs = append(runs,
			run{fmt.Sprintf("websocket/%02d", i), func(t *testing.T, d time.Duration) { drainRunWS(t, lastWord, d) }, drainDelay(i)},
			run{fmt.Sprintf("http/%02d", i), func(t *testing.T, d time.Duration) { drainRunHTTP(t, lastWord, d) }, drainDelay(i)})
	}
	// t.Run may be called from several goroutines; each subtest runs (and
	// may fail) on a goroutine of its own.
	harness.Bounded(len(runs), drainAtOnce, func(i int) {
		r := runs[i]
		t.Run(r.name, func(t *testing.T) { r.f(t, r.delay) })
	})
}

// drainCase is a drain's turn: the fake agent's prompt, the gateway's
// shutdown_grace, and the stopReason every client must get before its
// connection closes.
type drainCase struct{ prompt, grace, stop string }

// lastWord: a turn that fits in the grace many times over ends as the
// agent ends it.
var lastWord = drainCase{prompt: drainTurn, grace: "20s", stop: "end_turn"}

// drainGateway starts a gateway on the fake agent with dc's grace.
func drainGateway(t *testing.T, dc drainCase) *gateway {
	t.Helper()
	return startGateway(t, gwOpts{config: "shutdown_grace: " + dc.grace + "\n" + fakeAgentConfig(t, "")})
}

// sigterm sends the gateway SIGTERM at the given time.
func sigterm(t *testing.T, g *gateway, at time.Time) {
	t.Helper()
	time.Sleep(time.Until(at))
	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// waitDrained checks that the gateway exits 0 after the drain.
func waitDrained(t *testing.T, g *gateway) {
	t.Helper()
	select {
	case <-g.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway still runs 30 s after SIGTERM")
	}
	if g.ExitCode() != 0 {
		t.Fatalf("gateway exit status %d after a drain, want 0", g.ExitCode())
	}
}

// readOrEnd reads c until stop accepts a message (true), or the connection
// ends first (false); a connection still open after turn fails the test.
func readOrEnd(t *testing.T, c *client, who, what string, stop func(rpcMsg) bool) bool {
	t.Helper()
	deadline := time.After(turn)
	for {
		select {
		case m, ok := <-c.In:
			if !ok {
				return false
			}
			if stop(m) {
				return true
			}
		case <-deadline:
			t.Fatalf("%s: neither %s nor the end of the connection within %s", who, what, turn)
		}
	}
}

// drainRunWS: the owner prompts over a WebSocket, a second WebSocket is
// attached to the session; SIGTERM after delay.
func drainRunWS(t *testing.T, dc drainCase, delay time.Duration) {
	g := drainGateway(t, dc)
	owner, sid := dialSession(t, g, t.TempDir())
	watcher := dialInit(t, g)
	mustAttach(t, watcher, sid, "watcher", false)

	start := time.Now()
	id := owner.Request("session/prompt", textPrompt(sid, dc.prompt))
	// The turn runs: the attached client has seen the prompt go.
	readUntil(t, watcher, "prompt_received", turn, isUpdate("prompt_received"))
	sigterm(t, g, start.Add(delay))

	var answer rpcMsg
	if !readOrEnd(t, owner, "owner", "the answer", func(m rpcMsg) bool { answer = m; return m.IsResponseTo(id) }) {
		t.Errorf("owner: the connection ended (%v) before the answer to the prompt", owner.Err())
	} else {
		if r := stopReason(t, answer); r != dc.stop {
			t.Errorf("owner: stopReason %q, want %s", r, dc.stop)
		}
		if st := owner.CloseStatus(turn); st != websocket.StatusGoingAway {
			t.Errorf("owner: close status %v after the answer, want 1001 going away", st)
		}
	}
	var complete rpcMsg
	if !readOrEnd(t, watcher, "attached client", "turn_complete", func(m rpcMsg) bool {
		complete = m
		return attUpd(m).Update.Kind == "turn_complete"
	}) {
		t.Errorf("attached client: the connection ended (%v) before turn_complete", watcher.Err())
	} else {
		if r := attUpd(complete).Update.StopReason; r != dc.stop {
			t.Errorf("attached client: %s, want turn_complete with stopReason %s", complete.Raw, dc.stop)
		}
		if st := watcher.CloseStatus(turn); st != websocket.StatusGoingAway {
			t.Errorf("attached client: close status %v after turn_complete, want 1001 going away", st)
		}
	}
	waitDrained(t, g)
}

// drainRunHTTP is drainRunWS over Streamable HTTP: the owner and the
// attached client each read the session's event stream.
func drainRunHTTP(t *testing.T, dc drainCase, delay time.Duration) {
	g := drainGateway(t, dc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	peer := func() *httpPeer {
		p := &httpPeer{t: t, g: g, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}
		p.initialize()
		return p
	}
	post := func(p *httpPeer, session string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		var hdr map[string]string
		if session != "" {
			hdr = map[string]string{"Acp-Session-Id": session}
		}
		if resp, body := p.req(http.MethodPost, string(b), hdr); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: %d %q", b, resp.StatusCode, body)
		}
	}
	// until reads an event stream until stop accepts a message (true), or
	// the stream ends first (false).
	until := func(who, what string, events <-chan string, stop func(rpcMsg) bool) bool {
		t.Helper()
		deadline := time.After(turn)
		for {
			select {
			case d, ok := <-events:
				if !ok {
					return false
				}
				var m rpcMsg
				if err := json.Unmarshal([]byte(d), &m); err != nil {
					t.Fatalf("%s: event %q: %v", who, d, err)
				}
				m.Raw = []byte(d)
				if stop(m) {
					return true
				}
			case <-deadline:
				t.Fatalf("%s: neither %s nor the end of the event stream within %s", who, what, turn)
			}
		}
	}

	// connEnd reads a connection stream to its end, which the ACP SDK's
	// HTTP client takes for the end of the connection.
	connEnd := func(events <-chan string) <-chan struct{} {
		ended := make(chan struct{})
		go func() { // ends with the stream
			defer close(ended)
			for range events {
			}
		}()
		return ended
	}
	// endedBefore fails the test if the connection stream has ended before
	// what was just read arrived.
	endedBefore := func(who, what string, ended <-chan struct{}) {
		t.Helper()
		select {
		case <-ended:
			t.Errorf("%s: the connection's event stream ended before %s arrived", who, what)
		default:
		}
	}

	owner := peer()
	_, ownerConn := owner.stream(ctx, "")
	post(owner, "", map[string]any{"jsonrpc": "2.0", "id": "new", "method": "session/new",
		"params": map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}})
	var sid string
	if !until("owner", "the session/new answer", ownerConn, func(m rpcMsg) bool { sid = m.NewSessionID(); return string(m.ID) == `"new"` }) ||
		sid == "" {
		t.Fatal("owner: no session from session/new")
	}
	ownerEnd := connEnd(ownerConn)
	_, ownerEvents := owner.stream(ctx, sid)

	watcher := peer()
	_, watcherConn := watcher.stream(ctx, "")
	watcherEnd := connEnd(watcherConn)
	_, watcherEvents := watcher.stream(ctx, sid)
	post(watcher, sid, map[string]any{"jsonrpc": "2.0", "id": "att", "method": "session/attach", "params": attachParams(sid, "watcher", false)})
	var attach rpcMsg
	if !until("attached client", "the attach answer", watcherEvents, func(m rpcMsg) bool { attach = m; return string(m.ID) == `"att"` }) ||
		attach.Error != nil {
		t.Fatalf("attached client: session/attach: %s", attach.Raw)
	}

	start := time.Now()
	post(owner, sid, map[string]any{"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": textPrompt(sid, dc.prompt)})
	if !until("attached client", "prompt_received", watcherEvents, isUpdate("prompt_received")) {
		t.Fatal("attached client: the event stream ended before prompt_received")
	}
	sigterm(t, g, start.Add(delay))

	var answer rpcMsg
	if !until("owner", "the answer", ownerEvents, func(m rpcMsg) bool { answer = m; return string(m.ID) == `"turn"` }) {
		t.Error("owner: the session's event stream ended before the answer to the prompt")
	} else {
		endedBefore("owner", "the answer", ownerEnd)
		if r := stopReason(t, answer); r != dc.stop {
			t.Errorf("owner: stopReason %q, want %s", r, dc.stop)
		}
	}
	var complete rpcMsg
	if !until("attached client", "turn_complete", watcherEvents, func(m rpcMsg) bool {
		complete = m
		return attUpd(m).Update.Kind == "turn_complete"
	}) {
		t.Error("attached client: the session's event stream ended before turn_complete")
	} else {
		endedBefore("attached client", "turn_complete", watcherEnd)
		if r := attUpd(complete).Update.StopReason; r != dc.stop {
			t.Errorf("attached client: %s, want turn_complete with stopReason %s", complete.Raw, dc.stop)
		}
	}
	waitDrained(t, g)
}

// TestDrainAnswersWhatTheAgentLeaves: a turn that outlasts shutdown_grace
// on an agent that ignores session/cancel still gets its last word before
// the drain closes its clients, on both transports: the prompting client
// stopReason "cancelled" (the gateway answers in the agent's place once
// the cancel has gone unanswered), the attached client turn_complete.
func TestDrainAnswersWhatTheAgentLeaves(t *testing.T) {
	fakeAgentBin(t)
	left := drainCase{prompt: "sleep 30", grace: "500ms", stop: "cancelled"} // the fake agent ignores session/cancel
	t.Run("websocket", func(t *testing.T) { t.Parallel(); drainRunWS(t, left, 0) })
	t.Run("http", func(t *testing.T) { t.Parallel(); drainRunHTTP(t, left, 0) })
}
