package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The last word for every client (issue #37): once a drain's turns have
// ended, the gateway leaves each client shutdown_linger to read its answer
// and close by itself before it closes the connection (1001 on a
// WebSocket, the end of its streams on Streamable HTTP); a client that
// closes (or leaves its streams) ends the wait for itself, and the linger
// never runs past shutdown_grace. The turn is the fake agent's "trickle":
// chunks until its last moment, then the answer in the same write.

const (
	lingerTurn = "trickle 1.5" // the fake agent's streaming turn
	// lingerHold is how long the client keeps the connection open after
	// the answer before it closes it: less than the default linger (1s),
	// more than the 300 ms a draining Streamable HTTP connection stays
	// quiet before its streams end (httpQuiet in gateway/httpconn.go).
	lingerHold = 600 * time.Millisecond
)

// lingerGateway starts a gateway on the fake agent with extra settings.
func lingerGateway(t *testing.T, extra string) *gateway {
	t.Helper()
	return startGateway(t, gwOpts{config: extra + fakeAgentConfig(t, "")})
}

// TestDrainLingersForTheClient: the client that has its answer closes
// lingerHold later; the gateway has not closed the connection before that
// (at 99b340a it closed it right after the answer), and it exits soon
// after the client has closed, not at the end of the linger.
func TestDrainLingersForTheClient(t *testing.T) {
	fakeAgentBin(t)
	for _, tc := range []struct {
		name, config string
		exitWithin   time.Duration // from the client's close to the gateway's exit
	}{
		// The default linger (1s): the gateway waits for the client.
		{"default linger", "shutdown_grace: 20s\n", 0},
		// A long linger: a client that has closed is not waited for.
		{"long linger", "shutdown_grace: 20s\nshutdown_linger: 15s\n", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("websocket", func(t *testing.T) {
				t.Parallel()
				lingerRunWS(t, tc.config, tc.exitWithin)
			})
			t.Run("http", func(t *testing.T) {
				t.Parallel()
				lingerRunHTTP(t, tc.config, tc.exitWithin)
			})
		})
	}
}

// lingerPrompt sends the trickle turn, waits for its first chunk, drains
// the gateway, and reads the answer; it returns when the answer was read.
func lingerPromptWS(t *testing.T, g *gateway, c *client, sid string) time.Time {
	t.Helper()
	id := c.Request("session/prompt", textPrompt(sid, lingerTurn))
	readUntil(t, c, "the first chunk", turn, isUpdate("agent_message_chunk"))
	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var answer rpcMsg
	if !readOrEnd(t, c, "client", "the answer", func(m rpcMsg) bool { answer = m; return m.IsResponseTo(id) }) {
		t.Fatalf("the connection ended (%v) before the answer to the prompt", c.Err())
	}
	at := time.Now()
	if r := stopReason(t, answer); r != "end_turn" {
		t.Fatalf("stopReason %q, want end_turn", r)
	}
	return at
}

func lingerRunWS(t *testing.T, config string, exitWithin time.Duration) {
	g := lingerGateway(t, config)
	c, sid := dialSession(t, g, t.TempDir())
	answered := lingerPromptWS(t, g, c, sid)
	select {
	case m, ok := <-c.In:
		if !ok {
			t.Fatalf("the gateway closed the connection %v after the answer (%v), before the client closed it",
				time.Since(answered).Round(time.Millisecond), c.Err())
		}
		t.Fatalf("a message after the answer: %s", m.Raw)
	case <-time.After(lingerHold):
	}
	closed := time.Now()
	if err := c.CloseWith(websocket.StatusNormalClosure, "done"); err != nil {
		t.Errorf("the client's close: %v", err)
	}
	lingerExit(t, g, closed, exitWithin)
}

// lingerExit checks that the gateway exits 0, within exitWithin of the
// client's close when that is set.
func lingerExit(t *testing.T, g *gateway, closed time.Time, exitWithin time.Duration) {
	t.Helper()
	waitDrained(t, g)
	took := time.Since(closed)
	if exitWithin > 0 && took > exitWithin {
		t.Errorf("the gateway exited %v after the client closed: it waited out the linger", took.Round(time.Millisecond))
	}
	t.Logf("the gateway exited %v after the client closed", took.Round(time.Millisecond))
}

// httpTurn is a Streamable HTTP client with a session and its streams.
type httpTurn struct {
	p                *httpPeer
	sid              string
	connEv, sessEv   <-chan string
	cancel           context.CancelFunc
	connEnd, sessEnd <-chan struct{}
}

func (h *httpTurn) post(v any) {
	h.p.t.Helper()
	b, _ := json.Marshal(v)
	hdr := map[string]string{}
	if h.sid != "" {
		hdr["Acp-Session-Id"] = h.sid
	}
	if resp, body := h.p.req(http.MethodPost, string(b), hdr); resp.StatusCode != http.StatusAccepted {
		h.p.t.Fatalf("POST %s: %d %q", b, resp.StatusCode, body)
	}
}

// until reads events until stop accepts one (true) or the stream ends.
func (h *httpTurn) until(events <-chan string, stop func(rpcMsg) bool) bool {
	t := h.p.t
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
				t.Fatalf("event %q: %v", d, err)
			}
			m.Raw = []byte(d)
			if stop(m) {
				return true
			}
		case <-deadline:
			t.Fatalf("nothing awaited within %s", turn)
		}
	}
}

// drained returns a channel closed when events ends; it reads them all.
func drained(events <-chan string) <-chan struct{} {
	ended := make(chan struct{})
	go func() { // ends with the stream
		defer close(ended)
		for range events {
		}
	}()
	return ended
}

// openHTTPTurn initializes, opens the connection stream, a session and its
// stream.
func openHTTPTurn(t *testing.T, g *gateway) *httpTurn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &httpTurn{p: &httpPeer{t: t, g: g, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}, cancel: cancel}
	h.p.initialize()
	_, h.connEv = h.p.stream(ctx, "")
	h.post(map[string]any{"jsonrpc": "2.0", "id": "new", "method": "session/new",
		"params": map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}})
	var sid string
	if !h.until(h.connEv, func(m rpcMsg) bool { sid = m.NewSessionID(); return string(m.ID) == `"new"` }) || sid == "" {
		t.Fatal("no session from session/new")
	}
	h.sid = sid
	h.connEnd = drained(h.connEv)
	_, h.sessEv = h.p.stream(ctx, sid)
	return h
}

// prompt runs the trickle turn, drains the gateway at its first chunk and
// reads the answer; it returns when the answer was read.
func (h *httpTurn) prompt(g *gateway) time.Time {
	t := h.p.t
	t.Helper()
	h.post(map[string]any{"jsonrpc": "2.0", "id": "turn", "method": "session/prompt", "params": textPrompt(h.sid, lingerTurn)})
	if !h.until(h.sessEv, isUpdate("agent_message_chunk")) {
		t.Fatal("the session's stream ended before the first chunk")
	}
	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var answer rpcMsg
	if !h.until(h.sessEv, func(m rpcMsg) bool { answer = m; return string(m.ID) == `"turn"` }) {
		t.Fatal("the session's stream ended before the answer")
	}
	if r := stopReason(t, answer); r != "end_turn" {
		t.Fatalf("stopReason %q, want end_turn", r)
	}
	at := time.Now()
	h.sessEnd = drained(h.sessEv)
	return at
}

func lingerRunHTTP(t *testing.T, config string, exitWithin time.Duration) {
	g := lingerGateway(t, config)
	h := openHTTPTurn(t, g)
	answered := h.prompt(g)
	select {
	case <-h.connEnd:
		t.Fatalf("the gateway ended the connection's stream %v after the answer, before the client left",
			time.Since(answered).Round(time.Millisecond))
	case <-h.sessEnd:
		t.Fatalf("the gateway ended the session's stream %v after the answer, before the client left",
			time.Since(answered).Round(time.Millisecond))
	case <-time.After(lingerHold):
	}
	// The client leaves as the SDK's client closes: it ends its streams
	// (its DELETE cannot reach a draining gateway).
	closed := time.Now()
	h.cancel()
	lingerExit(t, g, closed, exitWithin)
}

// TestDrainLingerWithinGrace: a client that never closes is closed at the
// end of shutdown_grace when the linger would run past it: the turn ends
// about 1.5 s into a 2.5 s grace, the linger is 2.5 s, and the client's
// connection closes (1001) at the grace's end, after a wait.
func TestDrainLingerWithinGrace(t *testing.T) {
	fakeAgentBin(t)
	const grace = 2500 * time.Millisecond
	config := "shutdown_grace: 2500ms\nshutdown_linger: 2500ms\n"
	t.Run("websocket", func(t *testing.T) {
		t.Parallel()
		g := lingerGateway(t, config)
		c, sid := dialSession(t, g, t.TempDir())
		id := c.Request("session/prompt", textPrompt(sid, lingerTurn))
		readUntil(t, c, "the first chunk", turn, isUpdate("agent_message_chunk"))
		term := time.Now()
		if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if !readOrEnd(t, c, "client", "the answer", func(m rpcMsg) bool { return m.IsResponseTo(id) }) {
			t.Fatalf("the connection ended (%v) before the answer", c.Err())
		}
		answered := time.Now()
		if st := c.CloseStatus(turn); st != websocket.StatusGoingAway {
			t.Errorf("close status %v, want 1001 going away", st)
		}
		lingerWithin(t, term, answered, time.Now(), grace)
		waitDrained(t, g)
	})
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		g := lingerGateway(t, config)
		h := openHTTPTurn(t, g)
		term := time.Now() // prompt signals at the first chunk: a little later
		answered := h.prompt(g)
		select {
		case <-h.connEnd:
		case <-time.After(turn):
			t.Fatal("the connection's stream still runs")
		}
		lingerWithin(t, term, answered, time.Now(), grace)
		waitDrained(t, g)
	})
}

// lingerWithin checks when the gateway closed a connection it had answered:
// a while after the answer (it lingered), and no later than the grace
// after SIGTERM (the linger was cut to it), with some slack for a loaded
// machine.
func lingerWithin(t *testing.T, term, answered, closed time.Time, grace time.Duration) {
	t.Helper()
	const slack = 700 * time.Millisecond
	after, since := closed.Sub(answered), closed.Sub(term)
	t.Logf("answer %v after SIGTERM; closed %v after the answer, %v after SIGTERM (grace %v)",
		answered.Sub(term).Round(time.Millisecond), after.Round(time.Millisecond), since.Round(time.Millisecond), grace)
	if after < lingerHold {
		t.Errorf("the gateway closed the connection %v after the answer: no linger", after.Round(time.Millisecond))
	}
	if since > grace+slack {
		t.Errorf("the gateway closed the connection %v after SIGTERM: the linger ran past shutdown_grace (%v)", since.Round(time.Millisecond), grace)
	}
}

// TestDrainLingerRefusesPrompts: a prompt sent while the drain lingers
// (after the last answer) is answered at once with -32800 and why, never
// sent to the agent to be cut by the close. (WebSocket only: a draining
// gateway's listener is closed, so a Streamable HTTP client cannot post.)
// At 99b340a the connection had closed with the answer.
func TestDrainLingerRefusesPrompts(t *testing.T) {
	g := lingerGateway(t, "shutdown_grace: 20s\n")
	c, sid := dialSession(t, g, t.TempDir())
	answered := lingerPromptWS(t, g, c, sid)
	id := c.Request("session/prompt", textPrompt(sid, "hello"))
	var m rpcMsg
	if !readOrEnd(t, c, "client", "an answer to the prompt sent while lingering", func(r rpcMsg) bool { m = r; return r.IsResponseTo(id) }) {
		t.Fatalf("the connection ended (%v) %v after the answer, before the prompt sent while lingering was answered",
			c.Err(), time.Since(answered).Round(time.Millisecond))
	}
	var res struct {
		Error *struct {
			Code    int
			Message string
		}
	}
	if err := json.Unmarshal(m.Raw, &res); err != nil {
		t.Fatal(err)
	}
	const want = "the gateway is shutting down; the prompt was not sent to the agent"
	if res.Error == nil || res.Error.Code != -32800 || res.Error.Message != want {
		t.Fatalf("the prompt sent while lingering got %s, want error -32800 %q", m.Raw, want)
	}
	c.Close()
	waitDrained(t, g)
}
