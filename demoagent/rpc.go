package demoagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// JSON-RPC 2.0 and ACP error codes used by the agent.
const (
	codeParseError      = -32700
	codeInvalidRequest  = -32600
	codeMethodNotFound  = -32601
	codeInvalidParams   = -32602
	codeInternalError   = -32603
	codeResourceMissing = -32002
)

// maxLineBytes is the largest message the agent accepts, newline excluded.
const maxLineBytes = 64 << 20

var (
	errLineTooLong  = errors.New("message exceeds 64 MiB")
	errWriterClosed = errors.New("output closed")
	nullID          = json.RawMessage("null")
)

// rpcError is a JSON-RPC error object. The agent returns it from handlers,
// and it also holds the errors in the client's responses.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (e *rpcError) Error() string {
	return fmt.Sprintf("json-rpc error %d: %s", e.Code, e.Message)
}

func newError(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalidParams(format string, args ...any) *rpcError {
	return newError(codeInvalidParams, "invalid params: "+format, args...)
}

func sessionNotFound(id string) *rpcError {
	return &rpcError{Code: codeResourceMissing, Message: "session not found", Data: map[string]string{"sessionId": id}}
}

// message is any incoming JSON-RPC message: a request, a notification or a
// response.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// Outgoing message shapes.
type (
	outRequest struct {
		JSONRPC string `json:"jsonrpc"`
		ID      int64  `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params,omitempty"`
	}
	outNotification struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params,omitempty"`
	}
	outResult struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result"`
	}
	outError struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *rpcError       `json:"error"`
	}
)

// validID reports whether raw is a legal JSON-RPC id: a string, a number or
// null.
func validID(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	switch c := raw[0]; {
	case c == '"', c == '-', c >= '0' && c <= '9':
		return true
	default:
		return string(raw) == "null"
	}
}

// idKey turns a JSON-RPC id into a map key. Ids that are the same JSON value
// give the same key, whatever the whitespace around them.
func idKey(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}

// lineWriter writes every outgoing message as one line, from one goroutine,
// in the order the messages were handed over. send waits until the writing
// goroutine takes the message, so a slow client slows the agent down. close
// unblocks every sender at once, even while a Write is stuck.
type lineWriter struct {
	w        io.Writer
	queue    chan []byte
	stopped  chan struct{} // closed by close
	stopOnce sync.Once
	done     chan struct{} // closed when the writing goroutine has ended
	onFail   func(error)   // called once if a write fails
}

func newLineWriter(w io.Writer, onFail func(error)) *lineWriter {
	lw := &lineWriter{
		w:       w,
		queue:   make(chan []byte),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),
		onFail:  onFail,
	}
	go lw.loop()
	return lw
}

func (lw *lineWriter) loop() {
	defer close(lw.done)
	for {
		select {
		case <-lw.stopped:
			return
		case b := <-lw.queue:
			if _, err := lw.w.Write(b); err != nil {
				lw.close()
				lw.onFail(fmt.Errorf("write message: %w", err))
				return
			}
		}
	}
}

// send encodes v and hands it to the writing goroutine. After close, or
// once a write has failed, it returns errWriterClosed. The failure itself is
// reported through onFail.
func (lw *lineWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	b = append(b, '\n')
	select {
	case <-lw.stopped:
		return errWriterClosed
	default:
	}
	select {
	case lw.queue <- b:
		return nil
	case <-lw.stopped:
		return errWriterClosed
	}
}

// close stops the writer: later sends return errWriterClosed, and the
// writing goroutine ends once its current Write, if any, returns.
func (lw *lineWriter) close() {
	lw.stopOnce.Do(func() { close(lw.stopped) })
}

// inputLine is one line read from the client, or the error that ended the
// input.
type inputLine struct {
	data []byte
	err  error
}

// readLines sends the lines of r to out until r ends or ctx is cancelled,
// then closes out. A line that is too long is reported as errLineTooLong and
// reading continues. Any other read error is sent as the last item.
func readLines(ctx context.Context, r io.Reader, out chan<- inputLine) {
	defer close(out)
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		data, err := readLine(br, maxLineBytes)
		var item inputLine
		switch {
		case errors.Is(err, errLineTooLong):
			item.err = err
		case len(data) > 0:
			item.data = data
		}
		if item.data != nil || item.err != nil {
			select {
			case out <- item:
			case <-ctx.Done():
				return
			}
		}
		switch {
		case err == nil || errors.Is(err, errLineTooLong):
			continue
		case errors.Is(err, io.EOF):
			return
		default:
			select {
			case out <- inputLine{err: fmt.Errorf("read input: %w", err)}:
			case <-ctx.Done():
			}
			return
		}
	}
}

// readLine returns the next line without its "\n". A last line without a
// newline is returned together with io.EOF. A line longer than limit bytes is
// skipped and reported as errLineTooLong.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		frag, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(frag) > limit+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if tooLong {
			if err == nil || errors.Is(err, io.EOF) {
				err = errLineTooLong
			}
			return nil, err
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	}
}
