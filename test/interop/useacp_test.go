package interop

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestUseACPClient drives marimo's use-acp 0.2.6 as its React hook wires
// it: a WebSocket with no subprotocol (so the tenant's ticket rides in the
// query), each message written as a binary frame ending in a newline. It
// completes a turn with the demo agent, with a permission request on the
// way.
func TestUseACPClient(t *testing.T) {
	requireNode(t, "use-acp/package.json", "use-acp/dist/components/streams.js", "ws/package.json")
	h := newHarness(t)
	home, work := h.mkdir("home"), h.mkdir("work")
	g, token := h.startTenantGateway(t, "marimo", "useacp-", home, work)

	ticket := func() string {
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr+"/v1/tickets", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Ticket string `json:"ticket"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusCreated || body.Ticket == "" {
			t.Fatalf("POST /v1/tickets: %d %v", resp.StatusCode, err)
		}
		return body.Ticket
	}
	// The demo agent asks for permission on "permission".
	const prompt = "permission"
	r := h.runNode(t, home, work, runLimit, "use-acp-client.mjs", "--timeout", msString(scriptTimeout),
		g.url()+"?ticket="+url.QueryEscape(ticket()), work, prompt)
	if r.err != nil {
		t.Fatalf("use-acp-client.mjs failed: %v\n%s", r.err, r.dump())
	}
	if open := r.find("open", ""); len(open) != 1 || open[0].Protocol != "" {
		t.Errorf("want one open line with no subprotocol (as use-acp opens it)\n%s", r.dump())
	}
	for _, stage := range []string{"initialize", "session/new", "session/prompt"} {
		if len(r.find(stage, "")) != 1 {
			t.Fatalf("no %s answer\n%s", stage, r.dump())
		}
	}
	var pr struct {
		StopReason string `json:"stopReason"`
	}
	mustUnmarshal(t, r.find("session/prompt", "")[0].Result, &pr)
	if pr.StopReason != "end_turn" {
		t.Errorf("stopReason %q, want end_turn\n%s", pr.StopReason, r.dump())
	}
	var text strings.Builder
	for _, u := range r.find("session/update", "") {
		var p struct {
			Update struct {
				SessionUpdate string          `json:"sessionUpdate"`
				Content       json.RawMessage `json:"content"` // an object in a chunk, a list in a tool call
			} `json:"update"`
		}
		mustUnmarshal(t, u.Params, &p)
		if p.Update.SessionUpdate == "agent_message_chunk" {
			var c struct {
				Text string `json:"text"`
			}
			mustUnmarshal(t, p.Update.Content, &c)
			text.WriteString(c.Text)
		}
	}
	if !strings.Contains(text.String(), "Permission granted (allow).") {
		t.Errorf("the streamed answer %q does not report the permission use-acp's client granted\n%s", text.String(), r.dump())
	}
	if reqs := r.find("request", "session/request_permission"); len(reqs) != 1 {
		t.Errorf("%d permission requests reached the client, want 1\n%s", len(reqs), r.dump())
	}
	t.Logf("use-acp turn: %d updates, %d agent requests, answer %q", len(r.find("session/update", "")), len(r.find("request", "")), text.String())

	// Without a ticket (and without any other credential) the upgrade is refused.
	r = h.runNode(t, home, work, runLimit, "use-acp-client.mjs", "--timeout", "5000", g.url(), work)
	if r.err == nil {
		t.Errorf("use-acp connected without credentials\n%s", r.dump())
	}
	g.stop(t)
}
