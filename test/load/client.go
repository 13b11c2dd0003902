package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// transport carries one JSON-RPC message at a time: over a WebSocket (the
// gateway, websocketd) or over an agent's stdio (the direct floor). The
// same client code runs on either.
type transport interface {
	Send(msg []byte) error
	// Recv returns the next message; it is valid until the next call.
	Recv() ([]byte, error)
	Close() error
}

// wsTransport is a WebSocket client. Reads and writes use a context with no
// deadline (the library then arms no timer per frame); callers bound them
// with a watchdog that closes the connection.
type wsTransport struct {
	c   *websocket.Conn
	buf bytes.Buffer
}

func dialWS(ctx context.Context, url string, subprotocols []string) (*wsTransport, error) {
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols:    subprotocols,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(64 << 20)
	return &wsTransport{c: c}, nil
}

func (t *wsTransport) Send(msg []byte) error {
	return t.c.Write(context.Background(), websocket.MessageText, msg)
}

func (t *wsTransport) Recv() ([]byte, error) {
	typ, r, err := t.c.Reader(context.Background())
	if err != nil {
		return nil, err
	}
	t.buf.Reset()
	if _, err := t.buf.ReadFrom(r); err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, errors.New("binary WebSocket message")
	}
	return t.buf.Bytes(), nil
}

func (t *wsTransport) Close() error { return t.c.CloseNow() }

// closeClean closes with 1000 and its handshake.
func (t *wsTransport) closeClean() { _ = t.c.Close(websocket.StatusNormalClosure, "") }

// startPiped starts argv with pipes to its stdin and from its stdout, and
// its stderr to stderr; it is killed if this process dies.
func startPiped(argv []string, stderr io.Writer) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, in, out, nil
}

// stdioTransport runs an agent and talks to it over its stdin and stdout.
type stdioTransport struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	w    *bufio.Writer
	r    *lineReader
	done chan struct{}
}

func startStdio(argv []string) (*stdioTransport, error) {
	cmd, in, out, err := startPiped(argv, os.Stderr)
	if err != nil {
		return nil, err
	}
	t := &stdioTransport{cmd: cmd, in: in, w: bufio.NewWriterSize(in, 64<<10), r: newLineReader(out, 64<<20), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(t.done) }()
	return t, nil
}

func (t *stdioTransport) Pid() int { return t.cmd.Process.Pid }

func (t *stdioTransport) Send(msg []byte) error {
	t.w.Write(msg)
	t.w.WriteByte('\n')
	return t.w.Flush()
}

func (t *stdioTransport) Recv() ([]byte, error) { return t.r.next() }

// Close ends the agent: EOF on its stdin, then SIGKILL after 5 s.
func (t *stdioTransport) Close() error {
	_ = t.in.Close()
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
		_ = t.cmd.Process.Kill()
		<-t.done
	}
	return nil
}

// rpcClient numbers requests and waits for their answers on a transport,
// skipping the notifications that arrive meanwhile (a bounded number).
type rpcClient struct {
	t      transport
	nextID int
	fs     *fsCaps // clientCapabilities.fs for initialize (nil: defaultFS)
}

type rpcResponse struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (c *rpcClient) call(method string, params any) (json.RawMessage, error) {
	c.nextID++
	id := c.nextID
	p, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	msg := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, p)
	if err := c.t.Send(msg); err != nil {
		return nil, fmt.Errorf("%s: send: %w", method, err)
	}
	for range 100_000 {
		raw, err := c.t.Recv()
		if err != nil {
			return nil, fmt.Errorf("%s: receive: %w", method, err)
		}
		var r rpcResponse
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("%s: undecodable message %.200q: %w", method, raw, err)
		}
		if string(r.ID) != strconv.Itoa(id) {
			continue // a notification, or an answer to something else
		}
		if r.Error != nil {
			return nil, fmt.Errorf("%s: error %d: %s", method, r.Error.Code, r.Error.Message)
		}
		return r.Result, nil
	}
	return nil, fmt.Errorf("%s: no answer among 100000 messages", method)
}

// fsCaps is a client's clientCapabilities.fs.
type fsCaps struct {
	Read  bool `json:"readTextFile"`
	Write bool `json:"writeTextFile"`
}

func (f fsCaps) String() string { return fmt.Sprintf("read %v, write %v", f.Read, f.Write) }

// defaultFS is the gateway's default profile: fs read and write.
var defaultFS = fsCaps{Read: true, Write: true}

// initializeParamsFS is initialize's params offering fs (protocol 1, no
// terminal).
func initializeParamsFS(fs fsCaps) map[string]any {
	return map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": fs, "terminal": false},
		"clientInfo":         map[string]string{"name": "acpgate-load", "version": "1"},
	}
}

// initializeParams are what the harness's clients offer: exactly the
// gateway's default profile (protocol 1, fs read and write, no terminal),
// so that they are served by its pre-warmed processes. A client with other
// capabilities gets processes of its own profile, started cold.
var initializeParams = initializeParamsFS(defaultFS)

// initialize offers c.fs, or the default profile when it is nil.
func (c *rpcClient) initialize() error {
	params := initializeParams
	if c.fs != nil {
		params = initializeParamsFS(*c.fs)
	}
	_, err := c.call("initialize", params)
	return err
}

func (c *rpcClient) newSession() (string, error) {
	res, err := c.call("session/new", map[string]any{"cwd": os.TempDir(), "mcpServers": []any{}})
	if err != nil {
		return "", err
	}
	var r struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.SessionID == "" {
		return "", fmt.Errorf("session/new: no sessionId in %.200s", res)
	}
	return r.SessionID, nil
}

// parseID reads the integer id of a JSON-RPC response without decoding it.
func parseID(msg []byte) (int64, bool) {
	i := bytes.Index(msg, []byte(`"id":`))
	if i < 0 {
		return 0, false
	}
	i += len(`"id":`)
	for i < len(msg) && msg[i] == ' ' {
		i++
	}
	var n int64
	j := i
	for ; j < len(msg) && j-i < 18 && msg[j] >= '0' && msg[j] <= '9'; j++ {
		n = n*10 + int64(msg[j]-'0')
	}
	return n, j > i
}
