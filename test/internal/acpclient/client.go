package acpclient

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Sender writes JSON-RPC messages for the test's goroutine, numbering its
// requests 1, 2, 3, …; a failed write fails the test.
type Sender struct {
	T      testing.TB
	NextID int // the id of the last request sent

	write func(frame string) error
}

// SendRaw sends s as one text frame.
func (s *Sender) SendRaw(frame string) {
	s.T.Helper()
	if err := s.write(frame); err != nil {
		s.T.Fatalf("write: %v", err)
	}
}

// Send sends v as JSON.
func (s *Sender) Send(v any) {
	s.T.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		s.T.Fatal(err)
	}
	s.SendRaw(string(b))
}

// Request sends a request and returns its id.
func (s *Sender) Request(method string, params any) int {
	s.T.Helper()
	s.NextID++
	s.Send(Request(s.NextID, method, params))
	return s.NextID
}

// Notify sends a notification.
func (s *Sender) Notify(method string, params any) {
	s.T.Helper()
	s.Send(Notification(method, params))
}

// Respond answers the agent's request id with result.
func (s *Sender) Respond(id json.RawMessage, result any) {
	s.T.Helper()
	s.Send(Response(id, result))
}

// Client is a Conn for the test's own goroutine: its methods fail the test
// instead of returning errors.
type Client struct {
	*Conn
	Sender
}

// DialClient dials url as Dial does and closes the connection when the test
// ends. A frame that is not JSON fails the test (and is dropped).
func DialClient(t testing.TB, url string, header http.Header, protos []string) (*Client, *http.Response, error) {
	t.Helper()
	conn, resp, err := Dial(url, Options{Header: header, Subprotocols: protos, BadJSON: func(m *Msg, err error) bool {
		t.Errorf("gateway sent invalid JSON: %v: %s", err, m.Raw)
		return false
	}})
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(conn.Close)
	return &Client{Conn: conn, Sender: Sender{T: t, write: func(frame string) error {
		return conn.WS.Write(conn.Ctx(), websocket.MessageText, []byte(frame))
	}}}, resp, nil
}

// Next returns the next message, failing the test after timeout or when
// the connection ends.
func (c *Client) Next(timeout time.Duration) Msg {
	c.T.Helper()
	select {
	case m, ok := <-c.In:
		if !ok {
			c.T.Fatalf("connection closed: %v", c.Err())
		}
		return m
	case <-time.After(timeout):
		c.T.Fatalf("no message within %s", timeout)
	}
	return Msg{}
}

// Await reads until the response to id, passing every other message to
// other; with other nil, anything but a session/update fails the test.
func (c *Client) Await(id int, timeout time.Duration, other func(Msg)) Msg {
	c.T.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			c.T.Fatalf("no response to request %d within %s", id, timeout)
		}
		m := c.Next(left)
		answer, unexpected := AwaitStep(m, id, other)
		if answer {
			return m
		}
		if unexpected {
			c.T.Fatalf("unexpected message while waiting for %d: %s", id, m.Raw)
		}
	}
}

// AwaitStep is what an Await does with m, read while it waits for the
// response to id: answer when m is that response; otherwise m goes to
// other, or, with other nil, anything but a session/update is unexpected.
func AwaitStep(m Msg, id int, other func(Msg)) (answer, unexpected bool) {
	if m.IsResponseTo(id) {
		return true, false
	}
	if other != nil {
		other(m)
		return false, false
	}
	return false, m.Method != "session/update"
}

// Call sends a request and awaits its response.
func (c *Client) Call(method string, params any, timeout time.Duration) Msg {
	c.T.Helper()
	return c.Await(c.Request(method, params), timeout, nil)
}

// CloseStatus waits for the connection to end and returns its close code
// (-1 if it ended without one), dropping what arrives meanwhile.
func (c *Client) CloseStatus(timeout time.Duration) websocket.StatusCode {
	c.T.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-c.In:
			if !ok {
				return websocket.CloseStatus(c.Err())
			}
		case <-deadline:
			c.T.Fatalf("connection still open after %s", timeout)
		}
	}
}

// Initialize sends initialize as a client called name, with or without the
// fs capabilities, and returns its result; an error fails the test.
func (c *Client) Initialize(name string, fs bool) map[string]any {
	c.T.Helper()
	m := c.Call("initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": fs, "writeTextFile": fs}},
		"clientInfo":         map[string]string{"name": name, "version": "0"},
	}, 30*time.Second)
	if m.Error != nil {
		c.T.Fatalf("initialize: %+v", m.Error)
	}
	var res map[string]any
	_ = json.Unmarshal(m.Result, &res)
	return res
}

// NewSession opens a session in cwd and returns its id; an error fails
// the test.
func (c *Client) NewSession(cwd string) string {
	c.T.Helper()
	m := c.Call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}}, 30*time.Second)
	if m.Error != nil {
		c.T.Fatalf("session/new: %+v", m.Error)
	}
	sid := m.NewSessionID()
	if sid == "" {
		c.T.Fatalf("session/new without sessionId: %s", m.Raw)
	}
	return sid
}
