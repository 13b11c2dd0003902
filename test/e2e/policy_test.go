package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPolicyEnforced drives the capability policy through the real binary:
// each disallowed request is refused with the documented code and message,
// and the agent receives nothing of it (the demo agent logs every session it
// creates, loads or deletes, and the gateway counts every message it relays
// to the agent in acpgate_messages_total).
func TestPolicyEnforced(t *testing.T) {
	cfg := `policy:
  session: {load: false, delete: false, additional_directories: false}
  mcp: {stdio: false, http: true, http_hosts: ["mcp.example.com", "*.internal.example"]}
  prompt: {audio: false}
  agent_auth: false
`
	g := startGateway(t, gwOpts{config: cfg})
	c := dial(t, g)
	init := c.initialize()
	// Advertised: what the agent has, within the policy, in its own shape.
	caps, _ := init["agentCapabilities"].(map[string]any)
	if caps["loadSession"] != false {
		t.Errorf("loadSession advertised although the policy forbids it: %v", caps["loadSession"])
	}
	if sc, _ := caps["sessionCapabilities"].(map[string]any); sc["additionalDirectories"] != nil || sc["list"] == nil {
		t.Errorf("sessionCapabilities: %v", sc)
	}
	if am, _ := init["authMethods"].([]any); len(am) != 0 {
		t.Errorf("authMethods shown with agent_auth off: %v", am)
	}
	cwd := t.TempDir()
	sid := c.newSession(cwd)

	sentBefore := agentBoundMessages(t, g)
	createdBefore := g.CountLogs("agent stderr", "", "")
	cases := []struct {
		name    string
		method  string
		params  any
		code    int
		message string
	}{
		{"session/load off", "session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}},
			-32601, `method "session/load" is not allowed by the gateway policy`},
		{"session/delete off", "session/delete", map[string]any{"sessionId": sid},
			-32601, `method "session/delete" is not allowed by the gateway policy`},
		{"authenticate with agent_auth off", "authenticate", map[string]any{"methodId": "x"},
			-32601, `method "authenticate" is not allowed by the gateway policy`},
		{"stdio MCP server", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{
			map[string]any{"name": "tools", "command": "/usr/bin/secret-tool", "args": []string{"--token", "hunter2"}, "env": []any{map[string]string{"name": "KEY", "value": "s3cr3t"}}}}},
			-32602, `mcpServers[0] "tools": stdio MCP servers are not allowed by this gateway`},
		{"http MCP host not on the list", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{
			map[string]any{"type": "http", "name": "exfil", "url": "https://evil.example.net/mcp?k=v", "headers": []any{map[string]string{"name": "Authorization", "value": "Bearer abc"}}}}},
			-32602, `mcpServers[0] "exfil"`},
		{"audio prompt", "session/prompt", map[string]any{"sessionId": sid, "prompt": []any{
			map[string]string{"type": "text", "text": "listen"}, map[string]string{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}}},
			-32602, "prompt[1]"},
		{"additionalDirectories off", "session/new", map[string]any{"cwd": cwd, "additionalDirectories": []string{cwd}, "mcpServers": []any{}},
			-32602, "additionalDirectories"},
		{"unstable method", "session/fork", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}},
			-32601, "session/fork"},
		{"unknown extension", "_vendor/secret", map[string]any{"sessionId": sid},
			-32601, `"_vendor/secret" is not allowed by the gateway policy`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := c.Call(tc.method, tc.params, turn)
			if m.Error == nil || m.Error.Code != tc.code || !strings.Contains(m.Error.Message, tc.message) {
				t.Fatalf("got %s, want code %d and %q", m.Raw, tc.code, tc.message)
			}
			for _, secret := range []string{"hunter2", "s3cr3t", "secret-tool", "Bearer abc", "k=v"} {
				if strings.Contains(m.Error.Message, secret) {
					t.Errorf("the refusal repeats a server's command, env, header or query: %q", m.Error.Message)
				}
			}
		})
	}
	// An allowed http MCP server passes (the agent advertises http).
	m := c.Call("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{
		map[string]any{"type": "http", "name": "ok", "url": "https://mcp.example.com/mcp", "headers": []any{}}}}, turn)
	if m.Error != nil {
		t.Fatalf("an allowed http MCP server was refused: %s", m.Raw)
	}
	sentAfter := agentBoundMessages(t, g)
	// The only client message that reached the agent since the cases is the
	// allowed session/new.
	if sentAfter-sentBefore != 1 {
		t.Errorf("client messages relayed to the agent during the refused cases: %v (want only the allowed session/new)", sentAfter-sentBefore)
	}
	if n := g.CountLogs("agent stderr", "", ""); n-createdBefore > 1 {
		t.Logf("agent stderr lines during the cases: %d", n-createdBefore)
	}
	// Nothing the gateway logged repeats the secrets either.
	for _, secret := range []string{"hunter2", "s3cr3t", "Bearer abc"} {
		if strings.Contains(g.LogText(), secret) {
			t.Errorf("the gateway log contains %q", secret)
		}
	}
	// The connection is fine.
	if got := stopReason(t, c.Call("session/prompt", textPrompt(sid, "still fine"), turn)); got != "end_turn" {
		t.Fatalf("prompt after the refusals: %s", got)
	}
}

// agentBoundMessages sums acpgate_messages_total{direction="client_to_agent"}.
func agentBoundMessages(t *testing.T, g *gateway) float64 {
	t.Helper()
	body := httpGetBody(t, "http://"+g.Addr+"/metrics")
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `acpgate_messages_total{agent="default",direction="client_to_agent"`) {
			f := strings.Fields(line)
			var v float64
			_ = json.Unmarshal([]byte(f[len(f)-1]), &v)
			sum += v
		}
	}
	return sum
}

func httpGetBody(t *testing.T, url string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
