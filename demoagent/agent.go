package demoagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Options configures Run.
type Options struct {
	// StateDir is where sessions are stored, one JSON file per session.
	// When empty it is os.TempDir()/acpgate-demo-agent.
	StateDir string
	// ChunkDelay is the pause between streamed chunks. Zero means 15ms and
	// a negative value means no pause.
	ChunkDelay time.Duration
	// Name is reported as agentInfo.name (default "acpgate-demo-agent").
	Name string
	// Version is reported as agentInfo.version (default "dev").
	Version string
	// Stderr receives diagnostics. Nil discards them.
	Stderr io.Writer
}

func (o Options) withDefaults() Options {
	if o.StateDir == "" {
		o.StateDir = filepath.Join(os.TempDir(), "acpgate-demo-agent")
	}
	if o.ChunkDelay == 0 {
		o.ChunkDelay = 15 * time.Millisecond
	}
	if o.Name == "" {
		o.Name = "acpgate-demo-agent"
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	return o
}

// Run serves ACP on r (client to agent) and w (agent to client) until r hits
// EOF or ctx is cancelled. It returns nil on a clean EOF, ctx.Err() when ctx
// is cancelled, and an error if reading r or writing w fails.
//
// Prompts that are still running when the input ends are cancelled: each
// one still gets its "cancelled" response before Run returns. When ctx is
// cancelled, Run stops writing to w at once.
//
// Run returns only after its goroutines have ended. If it stops for any
// reason other than EOF and r is an io.Closer, it closes r to unblock the
// pending Read. Some reads cannot be interrupted that way, such as a read of
// a blocking stdin pipe, and a Write to w that is stuck cannot be interrupted
// either. If such a call has not returned within a short grace period, Run
// returns anyway, and the goroutine making it ends as soon as the call
// returns.
func Run(ctx context.Context, r io.Reader, w io.Writer, opt Options) error {
	if r == nil || w == nil {
		return errors.New("demoagent: Run needs a reader and a writer")
	}
	opt = opt.withDefaults()
	if err := os.MkdirAll(opt.StateDir, 0o700); err != nil {
		return fmt.Errorf("demoagent: create state dir: %w", err)
	}

	// runCtx does not inherit ctx's cancellation: on ctx cancellation the
	// output is closed first, so the prompts, once stopped, write nothing.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a := newAgent(runCtx, w, opt)
	stopClosing := context.AfterFunc(ctx, a.out.close)
	defer stopClosing()
	a.log.Printf("serving ACP (state dir %s)", opt.StateDir)

	lines := make(chan inputLine)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		readLines(runCtx, r, lines)
	}()

	err := a.serve(ctx, lines)
	eof := err == nil && ctx.Err() == nil
	if !eof {
		a.out.close()
		if c, ok := r.(io.Closer); ok {
			_ = c.Close()
		}
	}
	stop()
	a.wg.Wait()   // the prompts; after EOF they still send their responses
	a.out.close() // the writer finishes the message it is writing, if any

	graceCtx := context.Background() // after EOF: wait as long as it takes
	if !eof {
		var cancel context.CancelFunc
		graceCtx, cancel = context.WithTimeout(graceCtx, stopGrace)
		defer cancel()
	}
	for _, done := range []<-chan struct{}{readerDone, a.out.done} {
		select {
		case <-done:
		case <-graceCtx.Done():
			a.log.Printf("a read or write is still blocked; its goroutine ends when the call returns")
		}
	}
	if err != nil && ctx.Err() == nil {
		a.log.Printf("stopped: %v", err)
	}
	return err
}

// stopGrace is how long Run, when it stops before EOF, waits for a Read or
// Write that closing did not interrupt.
const stopGrace = 200 * time.Millisecond

// agent is the state of one Run call.
type agent struct {
	opt   Options
	store store
	out   *lineWriter
	log   *log.Logger

	ctx context.Context // cancelled when Run stops serving
	wg  sync.WaitGroup  // the running prompts

	writeFailed chan struct{} // closed when a write to the client fails
	writeErr    error         // set before writeFailed is closed

	mu          sync.Mutex
	initialized bool
	canRead     bool // client capability fs.readTextFile
	canWrite    bool // client capability fs.writeTextFile
	sessions    map[string]*session
	prompts     map[string]*turn // running prompts by request id (idKey)
	pending     map[int64]chan *message
	nextID      int64
}

func newAgent(ctx context.Context, w io.Writer, opt Options) *agent {
	a := &agent{
		opt:         opt,
		store:       store{dir: opt.StateDir},
		log:         log.New(opt.Stderr, "demo-agent: ", log.LstdFlags|log.Lmsgprefix),
		ctx:         ctx,
		writeFailed: make(chan struct{}),
		sessions:    make(map[string]*session),
		prompts:     make(map[string]*turn),
		pending:     make(map[int64]chan *message),
	}
	a.out = newLineWriter(w, func(err error) {
		a.writeErr = err
		close(a.writeFailed)
	})
	return a
}

// serve handles incoming lines until the input ends, ctx is cancelled or a
// write fails.
func (a *agent) serve(ctx context.Context, lines <-chan inputLine) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.writeFailed:
			return a.writeErr
		case line, ok := <-lines:
			switch {
			case !ok:
				return nil
			case errors.Is(line.err, errLineTooLong):
				a.log.Printf("dropped a message: %v", line.err)
				a.replyError(nullID, newError(codeParseError, "parse error: %v", line.err))
			case line.err != nil:
				return line.err
			default:
				a.handleLine(line.data)
			}
		}
	}
}

// handleLine decodes one message and dispatches it. Requests are answered
// here, in order, except session/prompt, which runs in its own goroutine.
func (a *agent) handleLine(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return
	}
	if !json.Valid(data) {
		a.replyError(nullID, newError(codeParseError, "parse error: invalid JSON"))
		return
	}
	if data[0] != '{' {
		a.replyError(nullID, newError(codeInvalidRequest, "invalid request: a message must be a JSON object (batches are not supported)"))
		return
	}
	var m message
	if err := json.Unmarshal(data, &m); err != nil {
		a.replyError(nullID, newError(codeInvalidRequest, "invalid request: %v", err))
		return
	}
	if m.ID != nil && !validID(m.ID) {
		a.replyError(nullID, newError(codeInvalidRequest, "invalid request: id must be a string, a number or null"))
		return
	}

	switch {
	case m.Method != "" && m.ID == nil:
		a.handleNotification(&m)
	case m.Method != "":
		if m.JSONRPC != "2.0" {
			a.replyError(m.ID, newError(codeInvalidRequest, `invalid request: jsonrpc must be "2.0"`))
			return
		}
		a.handleRequest(&m)
	case m.ID != nil && (m.Result != nil || m.Error != nil):
		a.handleResponse(&m)
	default:
		id := m.ID
		if id == nil {
			id = nullID
		}
		a.replyError(id, newError(codeInvalidRequest, "invalid request: no method, result or error"))
	}
}

func (a *agent) handleRequest(m *message) {
	a.mu.Lock()
	initialized := a.initialized
	a.mu.Unlock()
	if !initialized && m.Method != "initialize" {
		a.replyError(m.ID, newError(codeInvalidRequest, "not initialized"))
		return
	}

	var (
		result any
		err    error
	)
	switch m.Method {
	case "initialize":
		result, err = a.initialize(m.Params)
	case "session/new":
		result, err = a.newSession(m.Params)
	case "session/load":
		result, err = a.loadSession(m.Params, true)
	case "session/resume":
		result, err = a.loadSession(m.Params, false)
	case "session/list":
		result, err = a.listSessions(m.Params)
	case "session/close":
		result, err = a.closeSession(m.Params)
	case "session/prompt":
		if err := a.startPrompt(m); err != nil {
			a.replyError(m.ID, err)
		}
		return // answered by the prompt's goroutine
	case "_demo/echo":
		if m.Params == nil {
			result = json.RawMessage("null")
		} else {
			result = m.Params
		}
	default:
		err = newError(codeMethodNotFound, "method not found: %s", m.Method)
	}
	if err != nil {
		a.replyError(m.ID, err)
		return
	}
	a.reply(m.ID, result)
}

func (a *agent) handleNotification(m *message) {
	a.mu.Lock()
	initialized := a.initialized
	a.mu.Unlock()
	if !initialized {
		return
	}
	switch m.Method {
	case "session/cancel":
		var p struct {
			SessionID string `json:"sessionId"`
		}
		if err := json.Unmarshal(m.Params, &p); err != nil {
			a.log.Printf("session/cancel: bad params: %v", err)
			return
		}
		a.mu.Lock()
		if s := a.sessions[p.SessionID]; s != nil && s.running != nil {
			s.running.cancel()
		}
		a.mu.Unlock()
	case "$/cancel_request":
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		if err := json.Unmarshal(m.Params, &p); err != nil || p.RequestID == nil {
			a.log.Printf("$/cancel_request: bad params: %s", m.Params)
			return
		}
		a.mu.Lock()
		if t := a.prompts[idKey(p.RequestID)]; t != nil {
			t.cancel()
		}
		a.mu.Unlock()
	}
}

// handleResponse passes the client's answer to the agent request it belongs
// to.
func (a *agent) handleResponse(m *message) {
	var id int64
	if err := json.Unmarshal(m.ID, &id); err != nil {
		a.log.Printf("ignoring a response with foreign id %s", m.ID)
		return
	}
	a.mu.Lock()
	ch := a.pending[id]
	delete(a.pending, id)
	a.mu.Unlock()
	if ch == nil {
		a.log.Printf("ignoring a response to request %d, which is not pending", id)
		return
	}
	ch <- m // buffered
}

// call sends a request to the client and waits for its answer. If ctx ends
// first, call sends $/cancel_request for the request (unless the agent is
// shutting down) and returns ctx.Err(). An error response is returned as a
// *rpcError.
func (a *agent) call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	ch := make(chan *message, 1)
	a.mu.Lock()
	a.nextID++
	id := a.nextID
	a.pending[id] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.pending, id)
		a.mu.Unlock()
	}()

	if err := a.out.send(outRequest{JSONRPC: "2.0", ID: id, Method: method, Params: params}); err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	select {
	case resp := <-ch:
		if resp.Error != nil {
			return nil, resp.Error
		}
		return resp.Result, nil
	case <-ctx.Done():
		if a.ctx.Err() == nil {
			a.notify("$/cancel_request", map[string]any{"requestId": id})
		}
		return nil, ctx.Err()
	}
}

func (a *agent) notify(method string, params any) {
	if err := a.out.send(outNotification{JSONRPC: "2.0", Method: method, Params: params}); err != nil && !errors.Is(err, errWriterClosed) {
		a.log.Printf("%s: %v", method, err)
	}
}

// update sends a session/update notification.
func (a *agent) update(sessionID string, update map[string]any) {
	a.notify("session/update", map[string]any{"sessionId": sessionID, "update": update})
}

func (a *agent) reply(id json.RawMessage, result any) {
	if err := a.out.send(outResult{JSONRPC: "2.0", ID: id, Result: result}); err != nil && !errors.Is(err, errWriterClosed) {
		a.log.Printf("reply to %s: %v", id, err)
	}
}

// replyError sends an error response. An err that is not an *rpcError
// becomes an internal error.
func (a *agent) replyError(id json.RawMessage, err error) {
	var re *rpcError
	if !errors.As(err, &re) {
		a.log.Printf("internal error: %v", err)
		re = newError(codeInternalError, "internal error: %v", err)
	}
	if err := a.out.send(outError{JSONRPC: "2.0", ID: id, Error: re}); err != nil && !errors.Is(err, errWriterClosed) {
		a.log.Printf("reply to %s: %v", id, err)
	}
}

// decodeParams decodes required params into v.
func decodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return invalidParams("params are required")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return invalidParams("%v", err)
	}
	return nil
}
