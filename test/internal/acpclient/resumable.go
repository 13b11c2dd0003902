package acpclient

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// Resumable is one connection of the gateway across its sockets, for the
// test's goroutine. It counts the messages it received (every one but
// _acpgate/resumed) and keeps the text frames it sent, so that it can
// resume exactly (GET /acp?resume=TOKEN&received=N) and re-send what the
// gateway did not receive.
type Resumable struct {
	Sender
	Name   string       // prefixes its failure messages ("" = none)
	Socket func() *Conn // the current socket, which the caller keeps
	Got    int          // messages received, _acpgate/resumed excepted
	Frames []string     // every text frame sent, in order
}

// NewResumable is a Resumable on the sockets socket returns.
func NewResumable(t testing.TB, name string, socket func() *Conn) *Resumable {
	r := &Resumable{Name: name, Socket: socket}
	r.Sender = Sender{T: t, write: func(frame string) error {
		r.Frames = append(r.Frames, frame)
		if err := r.Socket().Write([]byte(frame)); err != nil {
			return fmt.Errorf("%v (the socket: %v)", err, r.Socket().Err())
		}
		return nil
	}}
	return r
}

func (r *Resumable) fatalf(format string, args ...any) {
	r.T.Helper()
	if r.Name != "" {
		format = r.Name + ": " + format
	}
	r.T.Fatalf(format, args...)
}

// Next returns the next message of the current socket and counts it
// (what says what was awaited). An _acpgate/resumed anywhere but first on
// a resumed socket fails the test.
func (r *Resumable) Next(what string, timeout time.Duration) Msg {
	r.T.Helper()
	conn := r.Socket()
	select {
	case m, ok := <-conn.In:
		if !ok {
			r.fatalf("%s: the socket ended: %v (after %d messages received)", what, conn.Err(), r.Got)
		}
		if m.Method == "_acpgate/resumed" {
			r.fatalf("%s: _acpgate/resumed in the middle of the stream: %.500s", what, m.Raw)
		}
		r.Got++
		return m
	case <-time.After(timeout):
		r.fatalf("%s: nothing within %s (the gateway stayed silent; %d messages received so far)", what, timeout, r.Got)
	}
	return Msg{}
}

// Await reads until the answer to id, passing every other message to
// other; with other nil, anything but a session/update fails the test.
func (r *Resumable) Await(what string, id int, timeout time.Duration, other func(Msg)) Msg {
	r.T.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			r.fatalf("%s: no answer within %s", what, timeout)
		}
		m := r.Next(what, left)
		answer, unexpected := AwaitStep(m, id, other)
		if answer {
			return m
		}
		if unexpected {
			r.fatalf("%s: unexpected message while waiting for the answer: %.500s", what, m.Raw)
		}
	}
}

// Resumed checks conn, a new socket of the connection that the caller
// makes the current one: its first message must be _acpgate/resumed with
// the number of frames the gateway received, and the frames after those
// are sent again. It returns that number.
func (r *Resumable) Resumed(conn *Conn) int {
	r.T.Helper()
	var first Msg
	select {
	case m, ok := <-conn.In:
		if !ok {
			r.fatalf("resume: the socket ended before _acpgate/resumed: %v", conn.Err())
		}
		first = m
	case <-time.After(10 * time.Second):
		r.fatalf("resume: no _acpgate/resumed within 10 s")
	}
	var p struct {
		Received *json.Number `json:"received"`
	}
	if first.Method != "_acpgate/resumed" || len(first.ID) != 0 || json.Unmarshal(first.Params, &p) != nil || p.Received == nil {
		r.fatalf("resume: the first message is %.500s; want the notification _acpgate/resumed with params.received", first.Raw)
	}
	n, err := strconv.Atoi(p.Received.String())
	if err != nil || n < 0 || n > len(r.Frames) {
		r.fatalf("resume: _acpgate/resumed says the gateway received %s messages; the client sent %d: %s", p.Received, len(r.Frames), first.Raw)
	}
	for _, f := range r.Frames[n:] {
		if err := conn.Write([]byte(f)); err != nil {
			r.fatalf("resume: re-send: %v", err)
		}
	}
	return n
}

// ResumeToken is result._meta.acpgate.resumeToken of an answer to
// initialize ("" if it has none).
func ResumeToken(m Msg) string {
	var res struct {
		Meta struct {
			Acpgate struct {
				ResumeToken string `json:"resumeToken"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	_ = json.Unmarshal(m.Result, &res)
	return res.Meta.Acpgate.ResumeToken
}

// ResumePath is the path that resumes the connection of token, the client
// having received received messages.
func ResumePath(token, received string) string {
	return "/acp?resume=" + url.QueryEscape(token) + "&received=" + url.QueryEscape(received)
}
