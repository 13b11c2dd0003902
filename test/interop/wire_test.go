//go:build unix

package interop

// TestHTTPWireMatchesReference sends the same raw HTTP exchanges (Go's
// net/http, no SDK client) to the official SDK's own Streamable-HTTP server
// (AcpServer + createNodeHttpHandler, @agentclientprotocol/sdk 2.4.0, run by
// reference-server.mjs) and to the gateway's /acp, both in front of the
// built-in demo agent, and compares them case by case (wireCases): the
// status, the Content-Type media type, and the text/plain body or the JSON
// error body. It also compares which SSE stream each message from the agent
// arrives on, and in what order, by payload (session IDs normalized, the
// ids of the agent's requests and of SSE events left out). The reference's
// own answers are checked against what SPEC.md (the SDK's code) gives, so an
// SDK upgrade that changes them shows up as such.
//
// Where the gateway deliberately answers otherwise (docs/protocol.md, "Streamable
// HTTP"), the test asserts the gateway's own behaviour instead:
//
//   - SSE events: the gateway writes an "id: N" line before each event (N
//     counts from 1 on each stream); the reference writes none.
//   - Last-Event-ID: the gateway re-sends the events after N that the stream
//     still holds (Last-Event-ID: 0 re-sends them all, with their ids); N that
//     it does not hold gets 404 application/json {"error":"resume_refused"},
//     and one that is not a number 400 text/plain. The reference ignores the
//     header: a plain 200 stream with nothing re-sent.
//   - 413: both limits are 16 MiB, but the gateway's body names its setting:
//     "Request body exceeds 16777216 bytes (limits.max_message_bytes)", not
//     "Request body exceeds 16777216 bytes".
//   - Session IDs: the gateway's are sealed, never the agent's "demo-…" ID,
//     which the reference passes through.
//
// Alike, though one might expect otherwise: a GET of a session stream for an
// ID nobody issued is a 200 stream on both (nothing arrives on it), and the
// gateway's initialize answer over HTTP is the reference's, byte for byte as
// JSON (no resume token: HTTP connections do not resume).
//
// Differences that are not exercised here (and not compared): credentials
// (401; this gateway has no tenants), the gateway's 429 past 1,024 session
// streams (the reference closes the connection), its idle timeout (the
// reference has none), GET with "Upgrade: websocket" (the reference answers
// 426; the gateway serves WebSockets there), methods other than POST, GET
// and DELETE (405 on the reference), and headers other than Content-Type
// (the gateway adds Cache-Control: no-store to its errors and
// X-Accel-Buffering: no to its streams, and "; charset=utf-8" to text/plain).
//
// Any other difference fails, naming the case and both answers.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	wireStep  = 10 * time.Second // one HTTP exchange, or waiting for one SSE event
	wireQuiet = 300 * time.Millisecond
	wireLimit = 30 * time.Second // one side's whole scenario (normally 2-4 s)

	connIDHeader = "Acp-Connection-Id"
	sessIDHeader = "Acp-Session-Id"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// spec is an answer as SPEC.md (and so the SDK's code) gives it.
type spec struct {
	status int
	media  string // the Content-Type media type; "" = no Content-Type
	body   string // text/plain: the exact body; application/json: JSON the body must contain (see jsonContains); "" = not checked
}

func (s spec) String() string {
	m := s.media
	if m == "" {
		m = "no Content-Type"
	}
	if s.body == "" {
		return fmt.Sprintf("%d (%s)", s.status, m)
	}
	return fmt.Sprintf("%d (%s) %q", s.status, m, s.body)
}

// wireCase is one exchange of the table: what the reference must answer,
// and, where the gateway deliberately differs, what the gateway must answer.
type wireCase struct {
	name    string
	want    spec
	gateway *spec  // nil: the gateway must answer as the reference did
	why     string // why the gateway differs
}

const (
	ctJSON  = "application/json"
	ctPlain = "text/plain"
	ctSSE   = "text/event-stream"
)

func plainAnswer(status int, body string) spec { return spec{status, ctPlain, body} }

var (
	accepted  = spec{status: 202}
	sseOK     = spec{status: 200, media: ctSSE}
	batchBody = `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request: JSON-RPC batches are not supported"}}`
)

// wireCases lists every exchange, in the order the scenario makes them.
var wireCases = []wireCase{
	// POST, SPEC.md §1.3 rows 1-8, before any connection exists.
	{name: "POST wrong Content-Type", want: plainAnswer(415, "Unsupported Media Type")},
	{name: "POST no Content-Type", want: plainAnswer(415, "Unsupported Media Type")},
	{name: "POST not JSON", want: plainAnswer(400, "Invalid JSON")},
	{name: "POST empty body", want: plainAnswer(400, "Invalid JSON")},
	{name: "POST batch", want: spec{400, ctJSON, batchBody}},
	{name: "POST empty batch", want: spec{400, ctJSON, batchBody}},
	{name: "POST number", want: plainAnswer(400, "Invalid JSON-RPC message")},
	{name: "POST string", want: plainAnswer(400, "Invalid JSON-RPC message")},
	{name: "POST null", want: plainAnswer(400, "Invalid JSON-RPC message")},
	{name: "POST session/new without Acp-Connection-Id", want: plainAnswer(400, "Missing Acp-Connection-Id")},
	{name: "POST initialize notification without Acp-Connection-Id", want: plainAnswer(400, "Missing Acp-Connection-Id")},
	{name: "POST initialize without jsonrpc", want: plainAnswer(400, "Missing Acp-Connection-Id")},
	{name: "POST unknown Acp-Connection-Id", want: plainAnswer(404, "Unknown Acp-Connection-Id")},
	{name: "POST initialize with unknown Acp-Connection-Id", want: plainAnswer(400, "Initialize not allowed on existing connection")},
	{name: "POST initialize with null id", want: plainAnswer(400, "Initialize request must include an ID")},
	{name: "POST over the body limit", want: plainAnswer(413, "Request body exceeds 16777216 bytes"),
		gateway: &spec{413, ctPlain, "Request body exceeds 16777216 bytes (limits.max_message_bytes)"},
		why:     "the gateway's body names its setting, limits.max_message_bytes"},

	// Connection 1: initialize, its streams, the session header rules.
	{name: "POST initialize", want: spec{status: 200, media: ctJSON}}, // + Acp-Connection-Id, checked by the scenario
	{name: "POST initialize with its Acp-Connection-Id", want: plainAnswer(400, "Initialize not allowed on existing connection")},
	{name: "GET without Accept", want: plainAnswer(406, "Not Acceptable")},
	{name: "GET with Accept: application/json", want: plainAnswer(406, "Not Acceptable")},
	{name: "GET without Acp-Connection-Id", want: plainAnswer(400, "Missing Acp-Connection-Id")},
	{name: "GET unknown Acp-Connection-Id", want: plainAnswer(404, "Unknown Acp-Connection-Id")},
	{name: "POST session/new before any GET", want: accepted},
	{name: "GET connection stream", want: sseOK},
	{name: "GET connection stream, second receiver", want: plainAnswer(409, "Outbound stream already has an active receiver")},
	{name: "POST session/prompt without Acp-Session-Id", want: plainAnswer(400, "Missing Acp-Session-Id")},
	{name: "POST session/prompt with another Acp-Session-Id", want: plainAnswer(400, "Mismatched Acp-Session-Id")},
	{name: "POST session/set_mode without Acp-Session-Id", want: plainAnswer(400, "Missing Acp-Session-Id")},
	{name: "GET session stream", want: sseOK},
	{name: "GET session stream, second receiver", want: plainAnswer(409, "Outbound stream already has an active receiver")},
	{name: "POST session/prompt", want: accepted},
	{name: "POST session/prompt (permission)", want: accepted},
	{name: "POST permission answer without Acp-Session-Id", want: plainAnswer(400, "Missing Acp-Session-Id")},
	{name: "POST permission answer with another Acp-Session-Id", want: plainAnswer(400, "Mismatched Acp-Session-Id")},
	{name: "POST permission answer", want: accepted},
	{name: "GET session stream of a session never issued", want: sseOK},
	{name: "DELETE", want: accepted},
	{name: "DELETE again", want: plainAnswer(404, "Unknown Acp-Connection-Id")},
	{name: "DELETE without Acp-Connection-Id", want: plainAnswer(400, "Missing Acp-Connection-Id")},
	{name: "POST after DELETE", want: plainAnswer(404, "Unknown Acp-Connection-Id")},
	{name: "GET after DELETE", want: plainAnswer(404, "Unknown Acp-Connection-Id")},

	// Connection 2: session/load of that session.
	{name: "POST initialize (string id)", want: spec{status: 200, media: ctJSON}},
	{name: "GET connection stream (2)", want: sseOK},
	{name: "GET session stream (2)", want: sseOK},
	{name: "POST session/load", want: accepted},
	{name: "GET session stream again with Last-Event-ID: 0", want: sseOK},
	{name: "GET session stream again with Last-Event-ID: 999", want: sseOK,
		gateway: &spec{404, ctJSON, `{"error":"resume_refused"}`},
		why:     "the gateway honours Last-Event-ID, and refuses one whose events it does not hold"},
	{name: "GET session stream again with Last-Event-ID: x", want: sseOK,
		gateway: &spec{400, ctPlain, "Last-Event-ID must be an event id this stream sent"},
		why:     "the gateway honours Last-Event-ID, and refuses one it never sent"},
	{name: "DELETE (2)", want: accepted},

	// Connection 3: the rest of §1.3.
	{name: "POST initialize (3)", want: spec{status: 200, media: ctJSON}},
	{name: "POST Content-Type with parameters", want: accepted},
	{name: "POST object that is not JSON-RPC", want: accepted},
	{name: "GET connection stream (3)", want: sseOK},
	{name: "POST Acp-Session-Id over maxIdLength", want: plainAnswer(400, "Session ID exceeds maxIdLength (1024)")},
	{name: "POST request id over maxIdLength", want: plainAnswer(400, "Request ID exceeds maxIdLength (1024)")},
	{name: "DELETE (3)", want: accepted},
}

// answer is what one side answered to one exchange.
type answer struct {
	status int
	media  string
	header http.Header
	body   string
	err    error // the exchange failed (no answer)
}

func (a *answer) String() string {
	if a == nil {
		return "(not sent: the scenario stopped before it)"
	}
	if a.err != nil {
		return "(no answer: " + a.err.Error() + ")"
	}
	m := a.media
	if m == "" {
		m = "no Content-Type"
	}
	if a.body == "" {
		return fmt.Sprintf("%d (%s)", a.status, m)
	}
	return fmt.Sprintf("%d (%s) %q", a.status, m, truncate(a.body, 300))
}

// mismatch reports how an answer differs from a spec ("" = it does not).
func (s spec) mismatch(a *answer) string {
	if a == nil || a.err != nil {
		return "no answer"
	}
	var diffs []string
	if a.status != s.status {
		diffs = append(diffs, fmt.Sprintf("status %d, want %d", a.status, s.status))
	}
	if a.media != s.media {
		diffs = append(diffs, fmt.Sprintf("media type %q, want %q", a.media, s.media))
	}
	if s.body != "" {
		if s.media == ctJSON {
			if !jsonContains(a.body, s.body) {
				diffs = append(diffs, fmt.Sprintf("body %s, want one with %s", a.body, s.body))
			}
		} else if a.body != s.body {
			diffs = append(diffs, fmt.Sprintf("body %q, want %q", a.body, s.body))
		}
	}
	if s.status == 202 && a.body != "" {
		diffs = append(diffs, fmt.Sprintf("body %q, want none", a.body))
	}
	return strings.Join(diffs, "; ")
}

// sameAnswer reports how the gateway's answer differs from the reference's
// ("" = it does not): status, media type, and the body where it is text or
// a JSON error.
func sameAnswer(ref, gw *answer) string {
	if gw == nil || gw.err != nil {
		return "no answer"
	}
	var diffs []string
	if ref.status != gw.status {
		diffs = append(diffs, "status")
	}
	if ref.media != gw.media {
		diffs = append(diffs, "media type")
	}
	switch {
	case ref.media == ctPlain || ref.body == "":
		if ref.body != gw.body {
			diffs = append(diffs, "body")
		}
	case ref.media == ctJSON && ref.status >= 400:
		if !jsonEqual(ref.body, gw.body) {
			diffs = append(diffs, "JSON body")
		}
	}
	return strings.Join(diffs, ", ")
}

// jsonContains reports whether the JSON got holds want: the same value, or
// for objects, every member of want with a value that holds want's.
func jsonContains(got, want string) bool {
	var g, w any
	if json.Unmarshal([]byte(got), &g) != nil || json.Unmarshal([]byte(want), &w) != nil {
		return false
	}
	var holds func(g, w any) bool
	holds = func(g, w any) bool {
		wm, ok := w.(map[string]any)
		if !ok {
			return mustJSON(g) == mustJSON(w)
		}
		gm, ok := g.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range wm {
			gv, ok := gm[k]
			if !ok || !holds(gv, wv) {
				return false
			}
		}
		return true
	}
	return holds(g, w)
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && mustJSON(x) == mustJSON(y)
}

// ---------------------------------------------------------------------------
// One side: the reference or the gateway

type wireSide struct {
	t       *testing.T
	name    string
	url     string
	tr      *http.Transport
	hc      *http.Client
	answers map[string]*answer
	streams map[string]*sseReader // by label: conn1, sess1, never1, conn2, sess2, ...
	order   []string              // stream labels in the order opened
	start   time.Time
	took    time.Duration

	// learned during the scenario
	sid      string    // the session id it issued
	conn     [4]string // connection ids, by number
	initBody [4]map[string]any
	notes    []string
}

// errAbort stops a scenario; the cases it did not reach have no answer.
type errAbort struct{ err error }

func (s *wireSide) abort(format string, args ...any) {
	panic(errAbort{fmt.Errorf(format, args...)})
}

func newWireSide(t *testing.T, name, url string) *wireSide {
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 8}
	return &wireSide{t: t, name: name, url: url, tr: tr, hc: &http.Client{Transport: tr},
		answers: map[string]*answer{}, streams: map[string]*sseReader{}}
}

// close ends every stream still open and the client's connections.
func (s *wireSide) close() {
	for _, l := range s.order {
		s.streams[l].stop()
	}
	s.tr.CloseIdleConnections()
}

type hdr = map[string]string

// checkTime stops a scenario that has run for longer than wireLimit.
func (s *wireSide) checkTime(name string) {
	if took := time.Since(s.start); took > wireLimit {
		s.abort("%s: the scenario has run for %v already (limit %v)", name, took.Round(time.Millisecond), wireLimit)
	}
}

// exchange sends one request and records the answer under the case name.
func (s *wireSide) exchange(name, method string, h hdr, body []byte) *answer {
	s.t.Helper()
	s.checkTime(name)
	if !slices.ContainsFunc(wireCases, func(c wireCase) bool { return c.name == name }) {
		s.t.Fatalf("case %q is not in wireCases", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wireStep)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	a := &answer{}
	s.answers[name] = a
	resp, err := s.hc.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	a.status, a.header, a.body, a.err = resp.StatusCode, resp.Header, string(b), err
	a.media = mediaType(resp.Header)
	return a
}

func mediaType(h http.Header) string {
	ct := h.Get("Content-Type")
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "unparsable: " + ct
	}
	return mt
}

func (s *wireSide) post(name string, h hdr, body string) *answer {
	s.t.Helper()
	all := hdr{"Content-Type": ctJSON}
	for k, v := range h {
		if v == "" {
			delete(all, k)
		} else {
			all[k] = v
		}
	}
	return s.exchange(name, http.MethodPost, all, []byte(body))
}

// mustStatus aborts the scenario when an exchange it depends on failed.
func (s *wireSide) mustStatus(a *answer, status int, what string) {
	if a.err != nil || a.status != status {
		s.abort("%s: got %v, want status %d", what, a, status)
	}
}

// initialize opens connection n and records its id.
func (s *wireSide) initialize(name string, n int, id string) {
	body := `{"jsonrpc":"2.0","id":` + id + `,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":false,"writeTextFile":false}}}}`
	a := s.post(name, nil, body)
	s.mustStatus(a, 200, name)
	conn := a.header.Get(connIDHeader)
	if !uuidV4.MatchString(conn) {
		s.abort("%s: Acp-Connection-Id %q is not a version 4 UUID", name, conn)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(a.body), &m); err != nil {
		s.abort("%s: body %q: %v", name, a.body, err)
	}
	wantID, _ := decodeJSON(id)
	if m["jsonrpc"] != "2.0" || !jsonEqual(mustJSON(m["id"]), mustJSON(wantID)) || m["result"] == nil {
		s.abort("%s: body %s is not the answer to request id %s", name, a.body, id)
	}
	s.conn[n] = conn
	s.initBody[n] = m
}

func decodeJSON(s string) (any, error) {
	var v any
	err := json.Unmarshal([]byte(s), &v)
	return v, err
}

// get opens an SSE stream; for a 200 it keeps reading it in the background
// under label.
func (s *wireSide) get(name, label string, h hdr) *answer {
	s.t.Helper()
	s.checkTime(name)
	if !slices.ContainsFunc(wireCases, func(c wireCase) bool { return c.name == name }) {
		s.t.Fatalf("case %q is not in wireCases", name)
	}
	a := &answer{}
	s.answers[name] = a
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	timer := time.AfterFunc(wireStep, cancel) // until the headers are in
	resp, err := s.hc.Do(req)
	if !timer.Stop() && err == nil {
		err = errors.New("no response headers in time")
	}
	if err != nil {
		cancel()
		if resp != nil {
			resp.Body.Close()
		}
		a.err = err
		return a
	}
	a.status, a.header, a.media = resp.StatusCode, resp.Header, mediaType(resp.Header)
	if resp.StatusCode != http.StatusOK || label == "" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		a.body = string(b)
		resp.Body.Close()
		cancel()
		return a
	}
	if _, dup := s.streams[label]; dup {
		s.t.Fatalf("stream label %q used twice", label)
	}
	r := newSSEReader(label, resp, cancel)
	s.streams[label] = r
	s.order = append(s.order, label)
	return a
}

// getStream opens a stream with the usual headers: Accept, the connection,
// and the session when sid is not "".
func (s *wireSide) getStream(name, label, conn, sid string, extra hdr) *answer {
	h := hdr{"Accept": ctSSE, connIDHeader: conn}
	if sid != "" {
		h[sessIDHeader] = sid
	}
	for k, v := range extra {
		h[k] = v
	}
	return s.get(name, label, h)
}

// getStreamAgain is getStream for a stream whose last receiver just left:
// the server may take a moment to notice, and answers 409 meanwhile.
func (s *wireSide) getStreamAgain(name, label, conn, sid string, extra hdr) *answer {
	deadline := time.Now().Add(3 * time.Second)
	for {
		a := s.getStream(name, label, conn, sid, extra)
		if a.err != nil || a.status != http.StatusConflict || time.Now().After(deadline) {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *wireSide) stream(label string) *sseReader {
	r := s.streams[label]
	if r == nil {
		s.abort("stream %s was not opened", label)
	}
	return r
}

// waitEvent waits for the first event on a stream that satisfies pred.
func (s *wireSide) waitEvent(label, what string, pred func(rpcMsg) bool) rpcMsg {
	ev, err := s.stream(label).wait(wireStep, func(ev sseEvent) bool { return pred(ev.msg) })
	if err != nil {
		s.abort("waiting on stream %s for %s: %v\nevents so far:\n%s", label, what, err, s.stream(label).dump())
	}
	return ev.msg
}

// ---------------------------------------------------------------------------
// SSE

type sseEvent struct {
	hasID bool
	id    string
	data  string
	msg   rpcMsg
}

// rpcMsg is a decoded JSON-RPC message.
type rpcMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (m rpcMsg) isResponseTo(id string) bool {
	return m.Method == "" && len(m.ID) > 0 && jsonEqual(string(m.ID), id)
}

func (m rpcMsg) isRequest(method string) bool {
	return m.Method == method && len(m.ID) > 0 && string(m.ID) != "null"
}

// update is params.update.sessionUpdate and the text of its content, if any.
func (m rpcMsg) update() (kind, text string) {
	var p struct {
		Update struct {
			SessionUpdate string `json:"sessionUpdate"`
			Content       struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"update"`
	}
	_ = json.Unmarshal(m.Params, &p)
	return p.Update.SessionUpdate, p.Update.Content.Text
}

// sseReader reads one SSE response until it ends.
type sseReader struct {
	label  string
	resp   *http.Response
	cancel context.CancelFunc

	mu      sync.Mutex
	events  []sseEvent
	bad     []string // lines that are not SSE, or data that is not JSON
	changed chan struct{}
	done    chan struct{}
	endErr  error // nil: the body ended cleanly
	stopped bool  // we ended it
}

func newSSEReader(label string, resp *http.Response, cancel context.CancelFunc) *sseReader {
	r := &sseReader{label: label, resp: resp, cancel: cancel, changed: make(chan struct{}, 1), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *sseReader) run() {
	defer close(r.done)
	defer r.resp.Body.Close()
	br := bufio.NewReaderSize(r.resp.Body, 64<<10)
	var ev sseEvent
	var data []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			r.mu.Lock()
			if !errors.Is(err, io.EOF) {
				r.endErr = err
			} else if line != "" || len(data) > 0 {
				r.endErr = fmt.Errorf("the body ended inside an event (%q)", line)
			}
			r.mu.Unlock()
			r.poke()
			return
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if len(data) > 0 {
				ev.data = strings.Join(data, "\n")
				r.mu.Lock()
				if err := json.Unmarshal([]byte(ev.data), &ev.msg); err != nil {
					r.bad = append(r.bad, "data is not a JSON-RPC message: "+ev.data)
				}
				r.events = append(r.events, ev)
				r.mu.Unlock()
				r.poke()
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"): // a comment (keep-alive)
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		case strings.HasPrefix(line, "id:"):
			ev.hasID, ev.id = true, strings.TrimPrefix(strings.TrimPrefix(line, "id:"), " ")
		default:
			r.mu.Lock()
			r.bad = append(r.bad, "unexpected line: "+line)
			r.mu.Unlock()
		}
	}
}

func (r *sseReader) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *sseReader) snapshot() []sseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// wait returns the first event that satisfies pred, waiting for it at most d.
func (r *sseReader) wait(d time.Duration, pred func(sseEvent) bool) (sseEvent, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		for _, ev := range r.snapshot() {
			if pred(ev) {
				return ev, nil
			}
		}
		select {
		case <-r.changed:
		case <-r.done:
			for _, ev := range r.snapshot() {
				if pred(ev) {
					return ev, nil
				}
			}
			return sseEvent{}, fmt.Errorf("the stream ended (%v)", orEOF(r.err()))
		case <-deadline.C:
			return sseEvent{}, fmt.Errorf("nothing within %v", d)
		}
	}
}

// quiet waits until no event came for wireQuiet (at most wireStep).
func (r *sseReader) quiet() {
	end := time.Now().Add(wireStep)
	for time.Now().Before(end) {
		select {
		case <-r.changed:
		case <-r.done:
			return
		case <-time.After(wireQuiet):
			return
		}
	}
}

// ended waits at most d for the body to end, and returns how it ended.
func (r *sseReader) ended(d time.Duration) (bool, error) {
	select {
	case <-r.done:
		return true, r.err()
	case <-time.After(d):
		return false, nil
	}
}

func (r *sseReader) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endErr
}

// stop ends the request (a receiver leaving), unless the body has ended
// already, and waits for the reader.
func (r *sseReader) stop() {
	r.mu.Lock()
	select {
	case <-r.done:
	default:
		r.stopped = true
	}
	r.mu.Unlock()
	r.cancel()
	<-r.done
}

func (r *sseReader) dump() string {
	var b strings.Builder
	for _, ev := range r.snapshot() {
		if ev.hasID {
			fmt.Fprintf(&b, "  id: %s\n", ev.id)
		}
		fmt.Fprintf(&b, "  data: %s\n", truncate(ev.data, 500))
	}
	return b.String()
}

func orEOF(err error) any {
	if err == nil {
		return "EOF"
	}
	return err
}

// signature is what the test compares of an event: its kind, the method,
// the client's request id for a response, and the parts of the payload the
// agent determines; the side's session id is replaced by $SID. Ids of the
// agent's requests are not compared (the gateway renumbers them).
func (s *wireSide) signature(ev sseEvent) string {
	data := ev.data
	if s.sid != "" {
		data = strings.ReplaceAll(data, strconv.Quote(s.sid), `"$SID"`)
	}
	var m rpcMsg
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		return "not JSON: " + data
	}
	var p struct {
		SessionID json.RawMessage `json:"sessionId"`
	}
	_ = json.Unmarshal(m.Params, &p)
	sess := ""
	if len(p.SessionID) > 0 {
		sess = " sessionId=" + string(p.SessionID)
	}
	switch {
	case m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null":
		return "request " + m.Method + sess
	case m.Method != "":
		sig := "notification " + m.Method + sess
		if kind, text := m.update(); kind != "" {
			sig += " " + kind
			if text != "" {
				sig += " " + strconv.Quote(text)
			}
		}
		return sig
	case m.Error != nil:
		return fmt.Sprintf("response id=%s error %d", m.ID, m.Error.Code)
	default:
		return fmt.Sprintf("response id=%s result %s", m.ID, m.Result)
	}
}

func (s *wireSide) signatures(label string) []string {
	r := s.streams[label]
	if r == nil {
		return nil
	}
	var out []string
	for _, ev := range r.snapshot() {
		out = append(out, s.signature(ev))
	}
	return out
}

// ---------------------------------------------------------------------------
// The scenario, the same for both sides

const (
	newSession = `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`
	promptMsg  = `{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":%q,"prompt":[{"type":"text","text":%q}]}}`
	setMode    = `{"jsonrpc":"2.0","id":9,"method":"session/set_mode","params":{"modeId":"x"}}`
	loadMsg    = `{"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":%q,"cwd":%q,"mcpServers":[]}}`
)

// run plays the whole scenario; a step it depends on that fails stops it,
// and the error says where.
func (s *wireSide) run(cwd string) (err error) {
	s.start = time.Now()
	defer func() {
		s.took = time.Since(s.start)
		if r := recover(); r != nil {
			a, ok := r.(errAbort)
			if !ok {
				panic(r)
			}
			err = a.err
		}
	}()
	s.refusals()
	s.connection1(cwd)
	s.connection2(cwd)
	s.connection3()
	return nil
}

func (s *wireSide) refusals() {
	initMsg := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`
	newMsg := `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`
	s.post("POST wrong Content-Type", hdr{"Content-Type": "text/plain"}, initMsg)
	s.post("POST no Content-Type", hdr{"Content-Type": ""}, initMsg)
	s.post("POST not JSON", nil, "this is not json")
	s.post("POST empty body", nil, "")
	s.post("POST batch", nil, "["+initMsg+"]")
	s.post("POST empty batch", nil, "[]")
	s.post("POST number", nil, "42")
	s.post("POST string", nil, `"initialize"`)
	s.post("POST null", nil, "null")
	s.post("POST session/new without Acp-Connection-Id", nil, newMsg)
	s.post("POST initialize notification without Acp-Connection-Id", nil, `{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":1}}`)
	s.post("POST initialize without jsonrpc", nil, `{"id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	s.post("POST unknown Acp-Connection-Id", hdr{connIDHeader: "00000000-0000-4000-8000-000000000000"}, newMsg)
	s.post("POST initialize with unknown Acp-Connection-Id", hdr{connIDHeader: "00000000-0000-4000-8000-000000000000"}, initMsg)
	s.post("POST initialize with null id", nil, `{"jsonrpc":"2.0","id":null,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	// 16 MiB + 1 byte: over both limits (each is 16 MiB by default).
	big := `{"jsonrpc":"2.0","method":"_wire/big","params":{"pad":"`
	pad := 16<<20 + 1 - len(big) - len(`"}}`)
	s.post("POST over the body limit", nil, big+strings.Repeat("a", pad)+`"}}`)
}

func (s *wireSide) connection1(cwd string) {
	s.initialize("POST initialize", 1, "1")
	c := s.conn[1]
	s.post("POST initialize with its Acp-Connection-Id", hdr{connIDHeader: c},
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	s.get("GET without Accept", "", hdr{connIDHeader: c})
	s.get("GET with Accept: application/json", "", hdr{"Accept": ctJSON, connIDHeader: c})
	s.get("GET without Acp-Connection-Id", "", hdr{"Accept": ctSSE})
	s.get("GET unknown Acp-Connection-Id", "", hdr{"Accept": ctSSE, connIDHeader: "00000000-0000-4000-8000-000000000000"})

	// session/new before any GET: its answer waits for the connection stream.
	s.mustStatus(s.post("POST session/new before any GET", hdr{connIDHeader: c}, fmt.Sprintf(newSession, cwd)), 202, "session/new")
	s.mustStatus(s.getStream("GET connection stream", "conn1", c, "", nil), 200, "GET connection stream")
	ans := s.waitEvent("conn1", "the session/new answer", func(m rpcMsg) bool { return m.isResponseTo("2") })
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(ans.Result, &res); err != nil || res.SessionID == "" {
		s.abort("session/new answer without a sessionId: %s", ans.Result)
	}
	s.sid = res.SessionID
	s.getStream("GET connection stream, second receiver", "", c, "", nil)

	// The session header rules.
	sh := hdr{connIDHeader: c, sessIDHeader: s.sid}
	s.post("POST session/prompt without Acp-Session-Id", hdr{connIDHeader: c}, fmt.Sprintf(promptMsg, 3, s.sid, "hello"))
	s.post("POST session/prompt with another Acp-Session-Id", hdr{connIDHeader: c, sessIDHeader: s.sid + "-other"}, fmt.Sprintf(promptMsg, 3, s.sid, "hello"))
	s.post("POST session/set_mode without Acp-Session-Id", hdr{connIDHeader: c}, setMode)

	s.mustStatus(s.getStream("GET session stream", "sess1", c, s.sid, nil), 200, "GET session stream")
	s.getStream("GET session stream, second receiver", "", c, s.sid, nil)
	s.mustStatus(s.post("POST session/prompt", sh, fmt.Sprintf(promptMsg, 3, s.sid, "hello")), 202, "session/prompt")
	s.waitEvent("sess1", "the answer to prompt 3", func(m rpcMsg) bool { return m.isResponseTo("3") })

	// An agent request on the session stream: its answer must name the session.
	s.mustStatus(s.post("POST session/prompt (permission)", sh, fmt.Sprintf(promptMsg, 4, s.sid, "permission")), 202, "session/prompt permission")
	req := s.waitEvent("sess1", "session/request_permission", func(m rpcMsg) bool { return m.isRequest("session/request_permission") })
	answerMsg := `{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`
	s.post("POST permission answer without Acp-Session-Id", hdr{connIDHeader: c}, answerMsg)
	s.post("POST permission answer with another Acp-Session-Id", hdr{connIDHeader: c, sessIDHeader: s.sid + "-other"}, answerMsg)
	s.mustStatus(s.post("POST permission answer", sh, answerMsg), 202, "permission answer")
	s.waitEvent("sess1", "the answer to prompt 4", func(m rpcMsg) bool { return m.isResponseTo("4") })

	s.getStream("GET session stream of a session never issued", "never1", c, "never-issued", nil)

	// DELETE ends the open streams; the connection is gone.
	s.streams["conn1"].quiet()
	s.streams["sess1"].quiet()
	s.mustStatus(s.exchange("DELETE", http.MethodDelete, hdr{connIDHeader: c}, nil), 202, "DELETE")
	for _, l := range []string{"conn1", "sess1", "never1"} {
		if r := s.streams[l]; r != nil {
			if ok, _ := r.ended(5 * time.Second); !ok {
				s.notes = append(s.notes, fmt.Sprintf("stream %s did not end within 5s of DELETE", l))
			}
		}
	}
	s.exchange("DELETE again", http.MethodDelete, hdr{connIDHeader: c}, nil)
	s.exchange("DELETE without Acp-Connection-Id", http.MethodDelete, nil, nil)
	s.post("POST after DELETE", hdr{connIDHeader: c}, fmt.Sprintf(newSession, cwd))
	s.get("GET after DELETE", "", hdr{"Accept": ctSSE, connIDHeader: c})
}

func (s *wireSide) connection2(cwd string) {
	s.initialize("POST initialize (string id)", 2, `"init-2"`)
	c := s.conn[2]
	s.mustStatus(s.getStream("GET connection stream (2)", "conn2", c, "", nil), 200, "GET connection stream (2)")
	s.mustStatus(s.getStream("GET session stream (2)", "sess2", c, s.sid, nil), 200, "GET session stream (2)")
	s.mustStatus(s.post("POST session/load", hdr{connIDHeader: c, sessIDHeader: s.sid}, fmt.Sprintf(loadMsg, s.sid, cwd)), 202, "session/load")
	s.waitEvent("conn2", "the session/load answer", func(m rpcMsg) bool { return m.isResponseTo("5") })
	s.waitEvent("sess2", "the replay of the last reply", func(m rpcMsg) bool {
		_, text := m.update()
		return text == "Permission granted (allow)."
	})
	s.streams["sess2"].quiet()
	s.streams["conn2"].quiet()

	// The receiver leaves and comes back with Last-Event-ID.
	s.streams["sess2"].stop()
	s.getStreamAgain("GET session stream again with Last-Event-ID: 0", "sess2-again", c, s.sid, hdr{"Last-Event-ID": "0"})
	if r := s.streams["sess2-again"]; r != nil {
		r.quiet()
		r.stop()
	}
	for _, id := range []string{"999", "x"} {
		label := "sess2-" + id
		s.getStreamAgain("GET session stream again with Last-Event-ID: "+id, label, c, s.sid, hdr{"Last-Event-ID": id})
		if r := s.streams[label]; r != nil {
			r.quiet()
			r.stop()
		}
	}
	s.mustStatus(s.exchange("DELETE (2)", http.MethodDelete, hdr{connIDHeader: c}, nil), 202, "DELETE (2)")
	if ok, _ := s.streams["conn2"].ended(5 * time.Second); !ok {
		s.notes = append(s.notes, "stream conn2 did not end within 5s of DELETE")
	}
}

func (s *wireSide) connection3() {
	s.initialize("POST initialize (3)", 3, "1")
	c := s.conn[3]
	s.post("POST Content-Type with parameters", hdr{connIDHeader: c, "Content-Type": "Application/JSON; charset=utf-8"},
		`{"jsonrpc":"2.0","method":"_wire/ping","params":{}}`)
	s.post("POST object that is not JSON-RPC", hdr{connIDHeader: c}, `{"foo":1}`)
	s.mustStatus(s.getStream("GET connection stream (3)", "conn3", c, "", nil), 200, "GET connection stream (3)")
	s.streams["conn3"].quiet()
	long := strings.Repeat("a", 1025)
	s.post("POST Acp-Session-Id over maxIdLength", hdr{connIDHeader: c, sessIDHeader: long},
		fmt.Sprintf(promptMsg, 7, long, "hello"))
	// What follows may put an answer on the stream (if the request is
	// taken); the routing comparison covers only what came before.
	s.streams["conn3"].stop()
	s.post("POST request id over maxIdLength", hdr{connIDHeader: c},
		`{"jsonrpc":"2.0","id":"`+long+`","method":"session/list","params":{}}`)
	s.exchange("DELETE (3)", http.MethodDelete, hdr{connIDHeader: c}, nil)
}

// ---------------------------------------------------------------------------
// The reference server

type refServer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	lines  chan string
	done   chan struct{}
	err    error
}

type refWriter struct {
	r   *refServer
	buf *bytes.Buffer
	out bool
}

func (w refWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	if !w.out {
		return w.buf.Write(p)
	}
	start := w.buf.Len()
	w.buf.Write(p)
	// Hand over the complete lines that came with this write.
	b := w.buf.Bytes()
	from := bytes.LastIndexByte(b[:start], '\n') + 1
	for {
		i := bytes.IndexByte(b[from:], '\n')
		if i < 0 {
			break
		}
		select {
		case w.r.lines <- string(b[from : from+i]):
		default:
		}
		from += i + 1
	}
	return len(p), nil
}

func (r *refServer) output() (stdout, stderr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stdout.String(), r.stderr.String()
}

// startReference runs reference-server.mjs with the given agent and returns
// its /acp URL. It is stopped by stop, or at the latest by the cleanup.
func (h *harness) startReference(t *testing.T, home, dir string, agentArgv ...string) (*refServer, string) {
	t.Helper()
	args := append([]string{"reference-server.mjs", "--lifetime", "120000", "--log", "--"}, agentArgv...)
	r := &refServer{lines: make(chan string, 64), done: make(chan struct{})}
	r.cmd = exec.Command(nodeBin, args...)
	r.cmd.Dir = interopDir
	r.cmd.Env = h.environ(home)
	r.cmd.Stdout = refWriter{r, &r.stdout, true}
	r.cmd.Stderr = refWriter{r, &r.stderr, false}
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.cmd.WaitDelay = 5 * time.Second
	var err error
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start reference-server.mjs: %v", err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	deadline := time.After(20 * time.Second)
	for {
		select {
		case line := <-r.lines:
			var l struct{ Type, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Type == "listening" && l.URL != "" {
				t.Logf("reference server (node pid %d) listening on %s", r.cmd.Process.Pid, l.URL)
				return r, l.URL
			}
		case <-r.done:
			out, errOut := r.output()
			t.Fatalf("reference-server.mjs exited before listening: %v\nstdout:\n%s\nstderr:\n%s", r.err, out, errOut)
		case <-deadline:
			t.Fatal("reference-server.mjs did not listen within 20s")
		}
	}
}

// stop closes its stdin (it then closes every connection and stops its
// agents), and kills its process group if it has not exited within 10 s.
func (r *refServer) stop(t *testing.T) {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.stdin.Close()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Errorf("reference-server.mjs did not exit within 10s of its stdin closing; killing its process group")
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL) // anything left in its group
	if r.err != nil {
		t.Errorf("reference-server.mjs: %v", r.err)
	}
	out, errOut := r.output()
	started, exited := strings.Count(out, `"type":"agent"`), strings.Count(out, `"type":"agent-exit"`)
	if started != exited || !strings.Contains(out, `"type":"closed"`) {
		t.Errorf("reference-server.mjs: %d agents started, %d exited\nstdout:\n%s\nstderr:\n%s", started, exited, out, truncate(errOut, 8000))
	}
	if t.Failed() {
		t.Logf("reference-server.mjs stderr:\n%s", truncate(errOut, 8000))
	}
}

// ---------------------------------------------------------------------------
// The test

func TestHTTPWireMatchesReference(t *testing.T) {
	requireNode(t, "@agentclientprotocol/sdk/package.json", "@agentclientprotocol/sdk/dist/transports/server.js",
		"@agentclientprotocol/sdk/dist/transports/node-adapter.js")
	began := time.Now()
	h := newHarness(t)
	home, work := h.mkdir("home"), h.mkdir("work")
	refState, gwState := h.mkdir("state-reference"), h.mkdir("state-gateway")

	// The same agent on both sides: the built-in demo agent, each with its
	// own state dir.
	ref, refURL := h.startReference(t, home, work, gatewayBin, "demo-agent", "--chunk-delay", "-1ms", "--state-dir", refState)
	g := h.startGatewayWith(t, allowAllPolicy, shellJoin(gatewayBin, "demo-agent", "--chunk-delay", "-1ms", "--state-dir", gwState), home, work)
	g.waitReady(t, readyLimit)

	sides := []*wireSide{newWireSide(t, "reference", refURL), newWireSide(t, "gateway", "http://"+g.Addr+"/acp")}
	for _, s := range sides {
		err := s.run(work)
		s.close()
		t.Logf("%s: scenario ran in %v", s.name, s.took.Round(time.Millisecond))
		if err != nil {
			t.Errorf("%s: the scenario stopped: %v", s.name, err)
		}
		for _, n := range s.notes {
			t.Errorf("%s: %s", s.name, n)
		}
	}
	rs, gs := sides[0], sides[1]

	// Exchanges, case by case.
	for _, c := range wireCases {
		ra, ga := rs.answers[c.name], gs.answers[c.name]
		if os.Getenv(verboseEnv) == "1" {
			t.Logf("%-55s reference %v | gateway %v", c.name, ra, ga)
		}
		if d := c.want.mismatch(ra); d != "" {
			t.Errorf("%s: the reference answered %v; SPEC.md says %v (%s)", c.name, ra, c.want, d)
			continue
		}
		if c.gateway != nil {
			if d := c.gateway.mismatch(ga); d != "" {
				t.Errorf("%s: the gateway answered %v; want %v, as documented (%s) [reference: %v]", c.name, ga, *c.gateway, c.why, ra)
			}
			continue
		}
		if d := sameAnswer(ra, ga); d != "" {
			t.Errorf("%s: the gateway differs from the reference in %s\n  reference: %v\n  gateway:   %v", c.name, d, ra, ga)
		}
	}

	// initialize: a v4 UUID connection id on both (checked by the
	// scenario), and the same answer (an HTTP connection has no resume
	// token: its streams replay by Last-Event-ID instead), but for the
	// gateway's offer of session/attach (docs/protocol.md, "Several clients on one
	// session").
	for n := 1; n <= 3; n++ {
		rb, gb := rs.initBody[n], gs.initBody[n]
		if res, _ := gb["result"].(map[string]any); gb != nil && !dropAttachCapability(res) {
			t.Errorf("initialize (%d): the gateway's answer lacks agentCapabilities.sessionCapabilities.attach: %s", n, mustJSON(gb))
		}
		if rb != nil && gb != nil && mustJSON(rb) != mustJSON(gb) {
			t.Errorf("initialize (%d): the answers differ\n  reference: %s\n  gateway:   %s", n, mustJSON(rb), mustJSON(gb))
		}
	}

	// Session IDs: the reference passes the agent's through, the gateway's
	// are sealed.
	if !regexp.MustCompile(`^demo-[0-9a-f]{16}$`).MatchString(rs.sid) {
		t.Errorf("the reference's session id %q is not the demo agent's", rs.sid)
	}
	if gs.sid == "" || strings.HasPrefix(gs.sid, "demo-") {
		t.Errorf("the gateway's session id %q is not a sealed one", gs.sid)
	}
	t.Logf("session ids: reference %s, gateway %s", rs.sid, gs.sid)

	// Where each message goes: the same payloads on the same streams, in
	// the same order. Compared for the streams the reference opened.
	streams := []struct{ label, what string }{
		{"conn1", "connection stream: the session/new answer"},
		{"sess1", "session stream: the prompts' updates, the permission request, the prompts' answers"},
		{"never1", "stream of a session never issued: nothing"},
		{"conn2", "connection stream: the session/load answer"},
		{"sess2", "session stream: session/load's replay"},
		{"conn3", "connection stream: the agent's error for a message that is not JSON-RPC"},
	}
	for _, st := range streams {
		rsig, gsig := rs.signatures(st.label), gs.signatures(st.label)
		if os.Getenv(verboseEnv) == "1" {
			t.Logf("%s events:\n  reference:\n    %s\n  gateway:\n    %s", st.label, strings.Join(rsig, "\n    "), strings.Join(gsig, "\n    "))
		}
		if !slices.Equal(rsig, gsig) {
			t.Errorf("%s (%s): the events differ\n  reference:\n    %s\n  gateway:\n    %s", st.label, st.what,
				strings.Join(rsig, "\n    "), strings.Join(gsig, "\n    "))
		} else {
			t.Logf("%s: %d events alike", st.label, len(rsig))
		}
	}
	// The routing the SDK's code defines, checked on the reference (and so,
	// by the comparison above, on the gateway).
	routed := func(label string, pred func(string) bool) bool {
		return slices.ContainsFunc(rs.signatures(label), pred)
	}
	prefix := func(p string) func(string) bool { return func(s string) bool { return strings.HasPrefix(s, p) } }
	for _, c := range []struct {
		label, sig, what string
	}{
		{"conn1", "response id=2 result", "the session/new answer on the connection stream"},
		{"sess1", "notification session/update sessionId=\"$SID\" agent_message_chunk", "session/update on the session stream"},
		{"sess1", "request session/request_permission sessionId=\"$SID\"", "session/request_permission on the session stream"},
		{"sess1", "response id=3 result", "the prompt's answer on the session stream"},
		{"sess1", "response id=4 result", "the second prompt's answer on the session stream"},
		{"conn2", "response id=5 result", "the session/load answer on the connection stream"},
		{"sess2", "notification session/update sessionId=\"$SID\" user_message_chunk", "session/load's replay on the session stream"},
	} {
		if !routed(c.label, prefix(c.sig)) {
			t.Errorf("reference: expected %s (%q on %s)", c.what, c.sig, c.label)
		}
	}
	for _, l := range []string{"sess1", "conn2", "sess2"} {
		if routed(l, prefix("response id=2")) {
			t.Errorf("reference: the session/new answer is on %s", l)
		}
	}

	// How the streams ended: DELETE ends an open stream cleanly, on both.
	// (One that did not end within 5 s is reported by the scenario.)
	for _, s := range sides {
		var clean []string
		for _, l := range []string{"conn1", "sess1", "never1", "conn2"} {
			if r := s.streams[l]; r != nil && !r.stopped {
				if err := r.err(); err != nil {
					t.Errorf("%s: stream %s did not end cleanly after DELETE: %v", s.name, l, err)
				} else {
					clean = append(clean, l)
				}
			}
		}
		t.Logf("%s: streams that ended cleanly after DELETE: %v", s.name, clean)
	}

	// SSE framing: no id: lines in the reference; an id on every gateway
	// event, counting from 1 on each stream.
	for _, l := range rs.order {
		for _, ev := range rs.streams[l].snapshot() {
			if ev.hasID {
				t.Errorf("reference: stream %s has an id: line (%q); SPEC.md §2 says it never sends one", l, ev.id)
				break
			}
		}
	}
	for _, l := range gs.order {
		for i, ev := range gs.streams[l].snapshot() {
			want := strconv.Itoa(i + 1)
			if !ev.hasID || ev.id != want {
				t.Errorf("gateway: event %d on stream %s has id %q (present: %v), want %s", i+1, l, ev.id, ev.hasID, want)
				break
			}
		}
	}
	for _, s := range sides {
		for _, l := range s.order {
			if bad := s.streams[l].bad; len(bad) > 0 {
				t.Errorf("%s: stream %s: %s", s.name, l, strings.Join(bad, "; "))
			}
		}
	}

	// Last-Event-ID after the receiver left. The reference ignores it
	// (nothing is re-sent); the gateway re-sends the stream's events after
	// id 0, with the ids they had.
	for _, l := range []string{"sess2-again", "sess2-999", "sess2-x"} {
		if r := rs.streams[l]; r != nil && len(r.snapshot()) != 0 {
			t.Errorf("reference: a GET with Last-Event-ID (%s) got events:\n%s", l, r.dump())
		}
	}
	if r, first := gs.streams["sess2-again"], gs.streams["sess2"]; r != nil && first != nil {
		again, before := r.snapshot(), first.snapshot()
		same := len(again) == len(before)
		for i := 0; same && i < len(again); i++ {
			same = again[i].id == before[i].id && again[i].data == before[i].data
		}
		if !same || len(before) == 0 {
			t.Errorf("gateway: a GET with Last-Event-ID: 0 did not re-send the %d events of the stream\n  first:\n%s  again:\n%s", len(before), first.dump(), r.dump())
		}
	}

	ref.stop(t)
	g.stop(t)
	t.Logf("TestHTTPWireMatchesReference: %d cases, %v in all", len(wireCases), time.Since(began).Round(time.Millisecond))
}
