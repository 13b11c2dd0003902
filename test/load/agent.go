package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/acpgate/acpgate/test/internal/acpclient"
)

// The synthetic ACP agent (`load agent`): it answers at once and streams as
// fast as its stdout accepts, so that what is measured is the path between
// client and agent, not the agent.
//
//   - initialize, session/new, session/close: answered at once.
//   - session/prompt whose first text block is "chunks=N size=S": N
//     session/update agent_message_chunk notifications, each exactly S bytes
//     on the agent's stdout (without the newline), then the prompt's answer
//     {"stopReason":"end_turn"}. The text of chunk k starts with k as 10
//     digits, so a client can check that every chunk arrived, in order.
//   - _load/echo (and _demo/echo, the demo agent's name for it): answered
//     with its params unchanged.
//   - anything else: -32601; notifications are ignored.
//
// It reads until stdin ends.

const (
	echoMethod     = "_load/echo"
	echoMethodDemo = "_demo/echo"
	// Bounds on what one prompt may ask for.
	maxChunks    = 10_000_000
	maxChunkSize = 16 << 20
)

// agentInitResult advertises session/close so that the gateway closes the
// sessions of clients that leave, as it would with a real agent.
const agentInitResult = `{"protocolVersion":1,"agentCapabilities":{"loadSession":false,` +
	`"promptCapabilities":{"image":false,"audio":false,"embeddedContext":false},` +
	`"sessionCapabilities":{"close":{}}},"authMethods":[],` +
	`"agentInfo":{"name":"acpgate-load-agent","version":"1"}}`

// agentLifetime bounds how long an agent runs, should whoever started it
// never close its stdin.
const agentLifetime = 2 * time.Hour

func runAgent(in io.Reader, out io.Writer) int {
	time.AfterFunc(agentLifetime, func() {
		fmt.Fprintf(os.Stderr, "load agent: still running after %s; exiting\n", agentLifetime)
		os.Exit(3)
	})
	r := newLineReader(in, maxChunkSize)
	w := bufio.NewWriterSize(out, 256<<10)
	a := &fakeAgent{w: w}
	for range 1 << 40 { // messages; in practice, until stdin ends
		line, err := r.next()
		if err != nil {
			_ = w.Flush()
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "load agent:", err)
			return 1
		}
		if err := a.handle(line); err != nil {
			fmt.Fprintln(os.Stderr, "load agent:", err)
			return 1
		}
		if r.buffered() == 0 {
			if err := w.Flush(); err != nil {
				return 1 // the reader is gone
			}
		}
	}
	return 1
}

type fakeAgent struct {
	w        *bufio.Writer
	sessions int
}

type agentMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

func (a *fakeAgent) handle(line []byte) error {
	var m agentMsg
	if err := json.Unmarshal(line, &m); err != nil {
		return a.reply(nil, "", `{"code":-32700,"message":"parse error"}`)
	}
	if m.Method == "" || len(m.ID) == 0 || string(m.ID) == "null" {
		return nil // a response (the agent asks nothing) or a notification
	}
	switch m.Method {
	case "initialize":
		return a.reply(m.ID, agentInitResult, "")
	case "session/new":
		// Unique across the pool's processes, as a real agent's are: the
		// gateway refuses a create that names a session it already knows.
		a.sessions++
		return a.reply(m.ID, `{"sessionId":"ls-`+strconv.Itoa(os.Getpid())+`-`+strconv.Itoa(a.sessions)+`"}`, "")
	case "session/close":
		return a.reply(m.ID, `{}`, "")
	case "session/prompt":
		return a.prompt(m)
	case echoMethod, echoMethodDemo:
		params := m.Params
		if len(params) == 0 {
			params = []byte("null")
		}
		return a.reply(m.ID, string(params), "")
	}
	return a.reply(m.ID, "", `{"code":-32601,"message":"method not found: `+jsonEscape(m.Method)+`"}`)
}

func (a *fakeAgent) reply(id json.RawMessage, result, rpcErr string) error {
	if len(id) == 0 {
		id = []byte("null")
	}
	a.w.WriteString(`{"jsonrpc":"2.0","id":`)
	a.w.Write(id)
	if rpcErr != "" {
		a.w.WriteString(`,"error":`)
		a.w.WriteString(rpcErr)
	} else {
		a.w.WriteString(`,"result":`)
		a.w.WriteString(result)
	}
	_, err := a.w.WriteString("}\n")
	return err
}

func (a *fakeAgent) prompt(m agentMsg) error {
	var p acpclient.PromptParams
	if err := json.Unmarshal(m.Params, &p); err != nil || len(p.Prompt) == 0 {
		return a.reply(m.ID, "", `{"code":-32602,"message":"params.prompt: expected a text block"}`)
	}
	var n, size int
	if _, err := fmt.Sscanf(p.Prompt[0].Text, "chunks=%d size=%d", &n, &size); err != nil ||
		n < 0 || n > maxChunks || size < 0 || size > maxChunkSize {
		return a.reply(m.ID, "", `{"code":-32602,"message":"prompt text must be \"chunks=N size=S\" (N <= 10000000, S <= 16 MiB)"}`)
	}
	tmpl, digits := chunkTemplate(p.SessionID, size)
	for k := 0; k < n; k++ {
		putDigits(tmpl[digits:digits+10], k)
		if _, err := a.w.Write(tmpl); err != nil {
			return err
		}
	}
	return a.reply(m.ID, `{"stopReason":"end_turn"}`, "")
}

// chunkPrefix starts every chunk the agent writes; clients use it to tell
// chunks from other messages without decoding them.
const chunkPrefix = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":`

// chunkTemplate builds one agent_message_chunk line of exactly size bytes
// (plus its newline) for session sid, and returns where the 10 sequence
// digits go. The padding reads like text and has a JSON escape (\n) every
// 64 bytes, as agent output does.
func chunkTemplate(sid string, size int) ([]byte, int) {
	head := chunkPrefix + strconv.Quote(sid) +
		`,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"`
	const tail = `"}}}}`
	b := make([]byte, 0, max(size, len(head)+10+len(tail))+1)
	b = append(b, head...)
	digits := len(b)
	b = append(b, "0000000000"...)
	const filler = "lorem ipsum dolor sit amet, consectetur adipiscing elit sed do "
	for i := 0; len(b) < size-len(tail); i++ {
		switch {
		case size-len(tail)-len(b) >= 2 && i%64 == 63:
			b = append(b, `\n`...)
		default:
			b = append(b, filler[i%len(filler)])
		}
	}
	b = append(b, tail...)
	return append(b, '\n'), digits
}

func putDigits(dst []byte, k int) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte('0' + k%10)
		k /= 10
	}
}

func jsonEscape(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// lineReader splits newline-delimited JSON; lines may be longer than its
// buffer, up to max bytes.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 1<<20), max: max}
}

func (l *lineReader) buffered() int { return l.r.Buffered() }

// next returns the next non-empty line without its newline; it is valid
// until the next call.
func (l *lineReader) next() ([]byte, error) {
	for range 1 << 20 { // empty lines are skipped, a bounded number of them
		frag, err := l.r.ReadSlice('\n')
		var line []byte
		switch {
		case err == nil:
			line = frag[:len(frag)-1]
		case errors.Is(err, bufio.ErrBufferFull):
			l.buf = append(l.buf[:0], frag...)
			for errors.Is(err, bufio.ErrBufferFull) {
				if len(l.buf) > l.max {
					return nil, fmt.Errorf("line longer than %d bytes", l.max)
				}
				frag, err = l.r.ReadSlice('\n')
				l.buf = append(l.buf, frag...)
			}
			if err != nil {
				return nil, err
			}
			line = l.buf[:len(l.buf)-1]
		default:
			if err == io.EOF && len(frag) > 0 {
				return frag, nil
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r")
		if len(bytes.TrimSpace(line)) > 0 {
			return line, nil
		}
	}
	return nil, errors.New("too many empty lines")
}
