package scale

import (
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

	"github.com/acpgate/acpgate/test/internal/acpclient"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// A WebSocket ACP client that goes through the balancer, keeps the
// affinity cookie it is given and can resume its connection exactly
// (docs/protocol.md, Resume after a drop).

type rpcMsg = acpclient.Msg

// socket is one WebSocket to the balancer.
type socket struct{ *acpclient.Conn }

// dialSocket opens a WebSocket to addr+path with header. A refused
// handshake returns the HTTP response (with its body) and the error.
func dialSocket(t *testing.T, addr, path string, header http.Header) (*socket, *http.Response, error) {
	t.Helper()
	conn, resp, err := acpclient.Dial("ws://"+addr+path, acpclient.Options{Header: header, Subprotocols: []string{"acp"},
		Timeout: 15 * time.Second, BadJSON: func(m *rpcMsg, err error) bool {
			t.Errorf("the gateway sent invalid JSON: %v: %.300s", err, m.Raw)
			return false
		}})
	if err != nil {
		return nil, resp, err
	}
	if conn.TCP == nil {
		conn.Kill()
		t.Fatal("the WebSocket does not run on a *net.TCPConn")
	}
	s := &socket{conn}
	t.Cleanup(s.Close)
	return s, resp, nil
}

// reset drops the TCP connection with an RST and no close frame, as a
// network loss does.
func (s *socket) reset(t *testing.T) {
	t.Helper()
	if err := s.Reset(); err != nil {
		t.Fatalf("reset the TCP connection: %v", err)
	}
}

// affinity returns the value of the affinity cookie a response sets ("" if
// none).
func affinity(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			return c.Value
		}
	}
	return ""
}

// acpClient is one ACP connection through the balancer, across its
// sockets. It counts the messages it received (all but _acpgate/resumed)
// and keeps the frames it sent, to resume exactly. Only the test's
// goroutine may use it.
type acpClient struct {
	*acpclient.Resumable // on socket s

	t      *testing.T
	c      *cluster
	name   string // X-Scale-Client: names it in the balancer's log
	cookie string // the affinity cookie: the replica it is bound to
	s      *socket
	connID string
	token  string // the resume token
}

// connect opens a fresh connection through the balancer, with the given
// affinity cookie ("" = none, as a new client). The balancer must set the
// affinity cookie of the replica it chose when the client had none.
func (c *cluster) connect(t *testing.T, name, cookie string) *acpClient {
	t.Helper()
	h := c.header(cookie)
	h.Set("X-Scale-Client", name)
	s, resp, err := dialSocket(t, c.lb.addr, "/acp", h)
	if err != nil {
		t.Fatalf("%s: dial through the balancer: %v (%s)", name, err, respText(resp))
	}
	cl := &acpClient{t: t, c: c, name: name, cookie: cookie, s: s, connID: resp.Header.Get("Acp-Connection-Id")}
	cl.Resumable = acpclient.NewResumable(t, name, func() *acpclient.Conn { return cl.s.Conn })
	if cl.connID == "" {
		t.Fatalf("%s: the 101 has no Acp-Connection-Id", name)
	}
	if set := affinity(resp); set != "" {
		cl.cookie = set
	} else if cookie == "" {
		t.Fatalf("%s: the balancer's 101 to a client without a cookie sets no %s cookie (Set-Cookie: %q)", name, cookieName, resp.Header.Values("Set-Cookie"))
	}
	if cl.cookie != "a" && cl.cookie != "b" {
		t.Fatalf("%s: affinity cookie %q names no replica", name, cl.cookie)
	}
	return cl
}

func (cl *acpClient) initialize() {
	cl.t.Helper()
	m := cl.Await("initialize", cl.Request("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{},
		"clientInfo":         map[string]string{"name": "scale-" + cl.name, "version": "0"},
	}), 30*time.Second, nil)
	if cl.token = acpclient.ResumeToken(m); m.Error != nil || cl.token == "" {
		cl.t.Fatalf("%s: initialize: %s (want a result with _meta.acpgate.resumeToken)", cl.name, m.Raw)
	}
}

func (cl *acpClient) newSession() string {
	cl.t.Helper()
	m := cl.Await("session/new", cl.Request("session/new", map[string]any{"cwd": cl.c.root, "mcpServers": []any{}}), 30*time.Second, nil)
	sid := m.NewSessionID()
	if sid == "" {
		cl.t.Fatalf("%s: session/new: %s", cl.name, m.Raw)
	}
	return sid
}

// turn runs a prompt to its end and checks the demo agent's echo.
func (cl *acpClient) turn(sid, text string, timeout time.Duration) {
	cl.t.Helper()
	tally := &turnTally{t: cl.t, sid: sid}
	m := cl.Await("session/prompt "+text, cl.Request("session/prompt", textPrompt(sid, text)), timeout, tally.add)
	tally.check(m, "You said: "+text)
}

// closeClean ends the connection with 1000.
func (cl *acpClient) closeClean() { cl.s.Close() }

// resume opens a new socket for the connection through the balancer with
// the client's affinity cookie, having received n messages. It checks the
// 101 and _acpgate/resumed, re-sends the frames the gateway lacks and
// returns the 101 and the gateway's count of the client's messages.
func (cl *acpClient) resume(n int) (*http.Response, int) {
	cl.t.Helper()
	h := cl.c.header(cl.cookie)
	h.Set("X-Scale-Client", cl.name+"-resume")
	s, resp, err := dialSocket(cl.t, cl.c.lb.addr, resumePath(cl.token, n), h)
	if err != nil {
		cl.t.Fatalf("%s: resume with received=%d: refused: %v (%s)", cl.name, n, err, respText(resp))
	}
	if id := resp.Header.Get("Acp-Connection-Id"); id != cl.connID {
		cl.t.Fatalf("%s: the resumed socket's Acp-Connection-Id is %q, the connection's %q", cl.name, id, cl.connID)
	}
	cl.s = s
	return resp, cl.Resumed(s.Conn)
}

func resumePath(token string, received int) string {
	return acpclient.ResumePath(token, strconv.Itoa(received))
}

func respText(resp *http.Response) string {
	if resp == nil {
		return "no HTTP response"
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("HTTP %d %s", resp.StatusCode, b)
}

var textPrompt = acpclient.TextPrompt

// update is the part of a session/update the test looks at.
type update struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		Kind    string `json:"sessionUpdate"`
		Content struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"update"`
}

func parseUpdate(t *testing.T, m rpcMsg) update {
	t.Helper()
	var u update
	if m.Method != "session/update" || json.Unmarshal(m.Params, &u) != nil {
		t.Fatalf("want a session/update: %.500s", m.Raw)
	}
	return u
}

// turnTally collects one session's streamed reply and the
// session_info_update that ends a demo agent turn.
type turnTally struct {
	t      *testing.T
	sid    string
	text   strings.Builder
	chunks int
	infos  int
}

func (tt *turnTally) add(m rpcMsg) {
	tt.t.Helper()
	u := parseUpdate(tt.t, m)
	if u.SessionID != tt.sid {
		tt.t.Fatalf("an update for another session: %.500s", m.Raw)
	}
	switch u.Update.Kind {
	case "agent_message_chunk":
		tt.text.WriteString(u.Update.Content.Text)
		tt.chunks++
	case "session_info_update":
		tt.infos++
	}
}

// check asserts the turn ended with end_turn, one session_info_update and
// exactly the text want.
func (tt *turnTally) check(resp rpcMsg, want string) {
	tt.t.Helper()
	var r struct {
		StopReason string `json:"stopReason"`
	}
	if resp.Error != nil || json.Unmarshal(resp.Result, &r) != nil || r.StopReason != "end_turn" {
		tt.t.Fatalf("the turn's answer is %.300s; want stopReason end_turn", resp.Raw)
	}
	if got := tt.text.String(); got != want {
		tt.t.Fatalf("the turn's text is not the echo: %s", harness.Diverge(got, want))
	}
	if tt.infos != 1 {
		tt.t.Fatalf("%d session_info_update messages in the turn, want 1", tt.infos)
	}
}

// echoText is a prompt of about n bytes without demo agent keywords: the
// agent echoes it in 8-character chunks, chunkDelay apart.
func echoText(tag string, n int) string {
	var b strings.Builder
	b.WriteString(tag)
	for i := 1; b.Len() < n; i++ {
		fmt.Fprintf(&b, " scale check %04d", i)
	}
	return b.String()
}

// closeStatus is the close code a socket's read ended with (-1: none).
func closeStatus(err error) websocket.StatusCode {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return -1
}
