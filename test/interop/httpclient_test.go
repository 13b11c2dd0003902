package interop

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestSDKHTTPClient runs the official SDK's Streamable-HTTP client
// (createHttpStream, @agentclientprotocol/sdk 2.4.0) against the real
// gateway: a turn through an extension method, fs/read_text_file answered
// by the client, a permission request, a cancelled turn; session/load from a
// new HTTP connection; the same session loaded over WebSocket; and no token.
func TestSDKHTTPClient(t *testing.T) {
	requireNode(t, "@agentclientprotocol/sdk/package.json", "@agentclientprotocol/sdk/dist/transports/http-stream.js")
	h := newHarness(t)
	home, work := h.mkdir("home"), h.mkdir("work")
	if err := os.WriteFile(filepath.Join(work, "hello.txt"), []byte("hello from the client's disk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g, token := h.startTenantGateway(t, "ide", "http-", home, work)
	url := "http://" + g.Addr + "/acp"

	r := h.runNode(t, home, work, runLimit, "http-client.mjs", "--timeout", msString(scriptTimeout), "--token", token, url, work)
	if r.err != nil {
		t.Fatalf("http-client.mjs failed: %v\n%s", r.err, r.dump())
	}
	news := r.find("session/new", "")
	if len(news) != 1 || news[0].SessionID == "" {
		t.Fatalf("no session\n%s", r.dump())
	}
	sid := news[0].SessionID
	if e := r.find("echo", ""); len(e) != 1 || string(e[0].Result) != `{"hello":"http"}` {
		t.Errorf("_demo/echo over HTTP\n%s", r.dump())
	}
	type promptLine struct {
		Prompt string `json:"prompt"`
		Text   string `json:"text"`
		Result struct {
			StopReason string `json:"stopReason"`
		} `json:"result"`
	}
	prompts := map[string]promptLine{}
	for _, l := range r.find("session/prompt", "") {
		var p promptLine
		mustUnmarshal(t, json.RawMessage(l.raw), &p)
		prompts[strings.Fields(p.Prompt)[0]] = p
	}
	if p := prompts["read"]; p.Result.StopReason != "end_turn" || !strings.Contains(p.Text, "hello from the client's disk") {
		t.Errorf("read turn: %+v\n%s", p, r.dump())
	}
	if len(r.find("request", "fs/read_text_file")) != 1 {
		t.Errorf("the client was not asked to read the file\n%s", r.dump())
	}
	if p := prompts["permission"]; p.Result.StopReason != "end_turn" || !strings.Contains(p.Text, "Permission granted (allow).") {
		t.Errorf("permission turn: %+v\n%s", p, r.dump())
	}
	if p := prompts["slow"]; p.Result.StopReason != "cancelled" {
		t.Errorf("cancelled turn: %+v\n%s", p, r.dump())
	}

	// session/load from a new HTTP connection replays the history.
	r = h.runNode(t, home, work, runLimit, "http-client.mjs", "--timeout", msString(scriptTimeout), "--token", token, "--load", sid, url, work)
	if r.err != nil || len(r.find("session/load", "")) != 1 {
		t.Fatalf("session/load over HTTP: %v\n%s", r.err, r.dump())
	}
	if len(r.find("session/update", "")) == 0 {
		t.Errorf("session/load replayed no history\n%s", r.dump())
	}

	// The session made over HTTP loads over WebSocket too.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+g.Addr+"/acp", &websocket.DialOptions{
		Subprotocols: []string{"acp"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	call := func(id int, method string, params any) map[string]any {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
		if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			if m["id"] == float64(id) {
				return m
			}
		}
	}
	call(1, "initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}})
	if m := call(2, "session/load", map[string]any{"sessionId": sid, "cwd": work, "mcpServers": []any{}}); m["error"] != nil {
		t.Errorf("session/load over WebSocket of a session made over HTTP: %v", m)
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")

	// No token: the transport fails at initialize with 401.
	r = h.runNode(t, home, work, runLimit, "http-client.mjs", "--timeout", "10000", url, work)
	if r.err == nil || !strings.Contains(r.dump(), "401") {
		t.Errorf("without a token: %v\n%s", r.err, r.dump())
	}
	g.stop(t)
}
