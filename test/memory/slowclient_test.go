package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/test/internal/acpclient"
)

// TestSlowClientMemory: a client that stops reading while 20 of its
// sessions each stream 16 MB, on the agent process where another client's
// session streams too, costs the gateway less than 256 MiB of RSS over its
// baseline (docs/operations.md, "What one connection may hold": 64 MiB of send
// queue, 8 MiB of replay buffer, 20 x 2 MiB of history, twice that for the
// garbage collector); it is cut off (1008), and the other client gets all
// of its stream. The 16 MB come as one update (it made a 2 MiB history hold
// 16 MB, 20 of them half a gigabyte), or as 1,024 of 16 KiB.
func TestSlowClientMemory(t *testing.T) {
	for _, c := range []struct {
		name         string
		chunks, size int
	}{
		{"one 16 MB update a session", 1, 16_000_000},
		{"1024 updates of 16 KiB a session", 1024, 16 << 10},
	} {
		t.Run(c.name, func(t *testing.T) { slowClientMemory(t, 20, c.chunks, c.size) })
	}
}

func slowClientMemory(t *testing.T, sessions, chunks, size int) {
	const bound = 256 * mib
	g, pid := startGateway(t, "")
	url := "ws://" + g.Addr + "/acp"

	// The client beside the slow one: a session on the same process (one
	// process in the pool), warmed up with a short stream.
	other, _, err := acpclient.DialClient(t, url, nil, []string{"acp"})
	if err != nil {
		t.Fatal(err)
	}
	other.Initialize("other", false)
	osid := other.NewSession(t.TempDir())
	stream := func(chunks, size int) (got int) {
		t.Helper()
		id := other.Request("session/prompt", acpclient.TextPrompt(osid, fmt.Sprintf("stream chunks=%d size=%d", chunks, size)))
		m := other.Await(id, time.Minute, func(m acpclient.Msg) {
			if m.Method == "session/update" {
				got++
			}
		})
		if m.Error != nil {
			t.Fatalf("the other client's prompt: %+v", m.Error)
		}
		return got
	}
	stream(16, 1024)
	baseline := procStatus(t, pid, "VmRSS")

	// The slow client: a bare WebSocket that reads its answers to
	// initialize and session/new, then prompts every session and never
	// reads again.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"acp"},
		HTTPClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	write := func(id int, method string, params any) {
		t.Helper()
		b, _ := json.Marshal(acpclient.Request(id, method, params))
		if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatalf("the slow client's %s: %v", method, err)
		}
	}
	call := func(id int, method string, params any) acpclient.Msg {
		t.Helper()
		write(id, method, params)
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("the slow client's %s: %v", method, err)
			}
			var m acpclient.Msg
			_ = json.Unmarshal(b, &m)
			if m.IsResponseTo(id) {
				if m.Error != nil {
					t.Fatalf("the slow client's %s: %s", method, b)
				}
				return m
			}
		}
	}
	call(0, "initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": false, "writeTextFile": false}}})
	sids := make([]string, sessions)
	for i := range sids {
		sids[i] = call(i+1, "session/new", map[string]any{"cwd": t.TempDir(), "mcpServers": []any{}}).NewSessionID()
	}
	start := time.Now()
	for i, sid := range sids {
		write(100+i, "session/prompt", acpclient.TextPrompt(sid, fmt.Sprintf("stream chunks=%d size=%d", chunks, size)))
	}
	// Every one of the slow client's turns has ended (the agent streams
	// one prompt at a time) before the other client streams again.
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < sessions+1; n = prompts(t, g.Addr, "agent_to_client") {
		if time.Now().After(deadline) {
			t.Fatalf("the agent answered %d of the slow client's %d prompts within 30 s", n-1, sessions)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := stream(chunks, size); got != chunks {
		t.Errorf("the other client got %d of its %d updates", got, chunks)
	}
	checkPeak(t, pid, baseline, bound, fmt.Sprintf("%d sessions streamed %d x %d B each in %s",
		sessions, chunks, size, time.Since(start).Round(time.Millisecond)))
	if g.CountLogs("closing slow client", "", "") != 1 {
		t.Errorf("the client that stopped reading was not cut off as a slow client")
	}
}
