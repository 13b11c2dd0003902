package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/policy"
)

// floodingAgent is single-threaded, like most stdio agents: it reads a line,
// handles it, writing its output synchronously, then reads the next. Asked
// for a burst it stops reading, sends a request only the gateway can answer
// and floods its stdout: the gateway's reader must never block answering it
// (a regression test for a deadlock found in review).
func floodingAgent() {
	out := os.Stdout
	serveLines(func(m agentLine) {
		switch m.Method {
		case "initialize":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentCapabilities":{"sessionCapabilities":{"close":{}}}}}`+"\n", m.ID)
		case "session/new":
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"s1"}}`+"\n", m.ID)
		case "_demo/burst":
			time.Sleep(1500 * time.Millisecond) // busy: not reading stdin
			// A permission request for a session no client holds any more
			// (its client left): the gateway answers it itself.
			fmt.Fprint(out, `{"jsonrpc":"2.0","id":"o1","method":"session/request_permission","params":{"sessionId":"gone","toolCall":{},"options":[]}}`+"\n")
			pad := strings.Repeat("x", 200)
			for i := 0; i < 3000; i++ { // ~700 KB of streamed output for the live session
				fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"}}}}`+"\n", pad)
			}
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", m.ID)
		default:
			if len(m.ID) > 0 && m.Method != "" {
				fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", m.ID)
			}
		}
	})
}

// agentLine is what a test agent reads of each line it gets.
type agentLine struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	raw    []byte          // the line as read, without its newline
}

// answerSetup answers initialize and session/new (the session is "s1")
// on out and reports whether m was one of them.
func answerSetup(out io.Writer, m agentLine) bool {
	switch m.Method {
	case "initialize":
		fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentCapabilities":{}}}`+"\n", m.ID)
	case "session/new":
		fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"s1"}}`+"\n", m.ID)
	default:
		return false
	}
	return true
}

// serveLines runs a single-threaded test agent: each line of its stdin,
// decoded, goes to handle, until stdin ends.
func serveLines(handle func(m agentLine)) {
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m agentLine
		_ = json.Unmarshal(line, &m)
		m.raw = bytes.TrimSuffix(line, []byte("\n"))
		handle(m)
	}
}

type drainSink struct{ ch chan []byte }

func (s *drainSink) Supersede() {}

func (s *drainSink) Send(b []byte, _ bool) bool {
	select {
	case s.ch <- b:
	default:
	}
	return true
}

func TestAgentReaderNeverBlocksOnAFullAgent(t *testing.T) {
	exe, _ := os.Executable()
	pol := policy.Default()
	pol.Extensions = []string{"_demo/*"}
	r, err := NewRelay(Config{Pool: PoolConfig{
		Agent:           AgentConfig{Command: []string{exe, "-test.run=^$"}, Env: map[string]string{"ACPGATE_TEST_AGENT": "flood"}, StopGrace: time.Second},
		MaxProcesses:    1,
		AcquireTimeout:  5 * time.Second,
		MaxMessageBytes: 1 << 20,
	}, ClientCaps: AllCapabilities, Tenants: []TenantConfig{{Policy: &pol}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Close(ctx)
	}()
	ds := &drainSink{ch: make(chan []byte, 100000)}
	c, _ := r.NewConn(ConnInfo{ID: "c"}, ds)
	defer c.Close()
	next := func() string {
		select {
		case b := <-ds.ch:
			return string(b)
		case <-time.After(5 * time.Second):
			return ""
		}
	}
	c.Handle([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true}}}}`))
	next()
	c.Handle([]byte(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`))
	var res struct {
		Result struct{ SessionID string } `json:"result"`
	}
	_ = json.Unmarshal([]byte(next()), &res)
	sid := res.Result.SessionID
	c.Handle([]byte(`{"jsonrpc":"2.0","id":3,"method":"_demo/burst","params":{"sessionId":"` + sid + `"}}`))
	// While the agent is busy, the client sends cancellations (never rate
	// limited), 1 KB each: they fill the stdin pipe, then the write queue.
	go func() {
		pad := strings.Repeat("y", 1000)
		for i := 0; i < 600; i++ {
			c.Handle([]byte(`{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"` + sid + `","_meta":{"pad":"` + pad + `"}}}`))
		}
	}()
	deadline := time.After(8 * time.Second)
	got := 0
	for {
		select {
		case b := <-ds.ch:
			got++
			if strings.Contains(string(b), `"id":3`) {
				t.Logf("burst answered after %d messages: no deadlock", got)
				return
			}
		case <-deadline:
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			var relevant []string
			for _, g := range strings.Split(string(buf[:n]), "\n\n") {
				if strings.Contains(g, "pool.(*Process).Send") || strings.Contains(g, "pool.(*Process).writeLoop") {
					relevant = append(relevant, g)
				}
			}
			t.Errorf("deadlock: the burst never completed (%d updates relayed); stacks:\n%s", got, strings.Join(relevant, "\n\n"))
			closed := make(chan struct{})
			go func() { c.Close(); close(closed) }()
			select {
			case <-closed:
				t.Log("Conn.Close returned")
			case <-time.After(3 * time.Second):
				t.Errorf("Conn.Close (client disconnect) blocks too: the WebSocket handler goroutine would hang")
			}
			r.agentList()[0].sideList()[0].p.Stop()
			return
		}
	}
}
