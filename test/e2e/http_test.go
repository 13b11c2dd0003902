package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// The Streamable-HTTP transport against hostile clients: bodies over the
// limit, another tenant's connection ID, thousands of event streams, a
// receiver that never reads. The gateway answers each clearly and keeps
// serving everybody else.

// policyAllowDemo lets clients call the demo agent's _demo/echo.
const policyAllowDemo = "policy: {extensions: {allow: [\"_demo/*\"]}}\n"

type httpPeer struct {
	t     *testing.T
	g     *gateway
	hc    *http.Client
	token string
	conn  string
}

func (p *httpPeer) req(method, body string, hdr map[string]string) (*http.Response, string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, method, "http://"+p.g.Addr+"/acp", strings.NewReader(body))
	if p.token != "" {
		r.Header.Set("Authorization", "Bearer "+p.token)
	}
	if method == http.MethodPost {
		r.Header.Set("Content-Type", "application/json")
	}
	if p.conn != "" {
		r.Header.Set("Acp-Connection-Id", p.conn)
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := p.hc.Do(r)
	if err != nil {
		p.t.Fatalf("%s /acp: %v", method, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func (p *httpPeer) initialize() {
	p.t.Helper()
	resp, body := p.req(http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`, nil)
	p.conn = resp.Header.Get("Acp-Connection-Id")
	if resp.StatusCode != 200 || p.conn == "" {
		p.t.Fatalf("initialize over HTTP: %d %q", resp.StatusCode, body)
	}
}

// stream opens an event stream and hands back its data lines.
func (p *httpPeer) stream(ctx context.Context, session string) (*http.Response, <-chan string) {
	p.t.Helper()
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.g.Addr+"/acp", nil)
	r.Header.Set("Authorization", "Bearer "+p.token)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Acp-Connection-Id", p.conn)
	if session != "" {
		r.Header.Set("Acp-Session-Id", session)
	}
	resp, err := p.hc.Do(r)
	if err != nil {
		p.t.Fatalf("GET /acp: %v", err)
	}
	out := make(chan string, 1000)
	go func() { // ends with the body, or with ctx
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				select {
				case out <- d:
				case <-ctx.Done(): // the reader stopped: so does this
					return
				}
			}
		}
	}()
	return resp, out
}

func TestHostileHTTP(t *testing.T) {
	e := newIsoEnv(t)
	g := startGateway(t, gwOpts{config: e.config(e.keyFile, nil) + policyAllowDemo +
		"limits: {max_message_bytes: 1048576, send_queue_bytes: 2097152}\nwebsocket: {write_timeout: 2s}\n"})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	acme := &httpPeer{t: t, g: g, hc: hc, token: e.tokens["acme"]}
	acme.initialize()
	echo := func(p *httpPeer) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		resp, events := p.stream(ctx, "")
		if resp.StatusCode != 200 {
			t.Fatalf("connection stream: %d", resp.StatusCode)
		}
		if resp, body := p.req(http.MethodPost, `{"jsonrpc":"2.0","id":"e","method":"_demo/echo","params":{"still":"here"}}`, nil); resp.StatusCode != 202 {
			t.Fatalf("echo: %d %q", resp.StatusCode, body)
		}
		for d := range events {
			if strings.Contains(d, `"id":"e"`) {
				if !strings.Contains(d, `"still":"here"`) {
					t.Fatalf("echo answer %s", d)
				}
				return
			}
		}
		t.Fatal("no echo answer on the connection stream")
	}

	t.Run("no credentials: 401 before anything else", func(t *testing.T) {
		anon := &httpPeer{t: t, g: g, hc: hc, conn: acme.conn}
		for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			if resp, body := anon.req(m, "{}", nil); resp.StatusCode != 401 {
				t.Errorf("anonymous %s: %d %q", m, resp.StatusCode, body)
			}
		}
	})
	t.Run("a body over limits.max_message_bytes: 413", func(t *testing.T) {
		big := `{"jsonrpc":"2.0","id":2,"method":"_demo/echo","params":{"pad":"` + strings.Repeat("x", 2<<20) + `"}}`
		if resp, body := acme.req(http.MethodPost, big, nil); resp.StatusCode != 413 || !strings.Contains(body, "max_message_bytes") {
			t.Errorf("%d %q", resp.StatusCode, body)
		}
		echo(acme)
	})
	t.Run("another tenant's connection ID: the same 404 as an unknown one", func(t *testing.T) {
		globex := &httpPeer{t: t, g: g, hc: hc, token: e.tokens["globex"], conn: acme.conn}
		for _, m := range []string{http.MethodPost, http.MethodDelete} {
			resp, body := globex.req(m, `{"jsonrpc":"2.0","id":3,"method":"session/list","params":{}}`, nil)
			if resp.StatusCode != 404 || body != "Unknown Acp-Connection-Id" {
				t.Errorf("%s with acme's connection as globex: %d %q", m, resp.StatusCode, body)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if resp, _ := globex.stream(ctx, ""); resp.StatusCode != 404 {
			t.Errorf("GET of acme's stream as globex: %d", resp.StatusCode)
		}
		echo(acme)
	})
	t.Run("thousands of event streams on one connection", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 1100
		codes := map[int]int{}
		var mu sync.Mutex
		harness.Bounded(n, 64, func(i int) {
			resp, _ := acme.stream(ctx, fmt.Sprintf("nobody-%d", i))
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
		t.Logf("%d GETs of distinct session streams: %v", n, codes)
		if codes[200] > 1025 || codes[429] == 0 || codes[200]+codes[429] != n {
			t.Errorf("status codes %v: want at most 1,025 streams and 429 for the rest", codes)
		}
		cancel()
		time.Sleep(200 * time.Millisecond)
		echo(acme)
	})
	t.Run("a receiver that never reads is cut off; others go on", func(t *testing.T) {
		slow := &httpPeer{t: t, g: g, hc: &http.Client{}, token: e.tokens["acme"]}
		slow.initialize()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Addr+"/acp", nil)
		r.Header.Set("Authorization", "Bearer "+slow.token)
		r.Header.Set("Accept", "text/event-stream")
		r.Header.Set("Acp-Connection-Id", slow.conn)
		resp, err := slow.hc.Do(r)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET: %v", err)
		}
		defer resp.Body.Close() // never read
		pad := strings.Repeat("y", 512<<10)
		ended := false
		for i := 0; i < 200 && !ended; i++ {
			rs, _ := slow.req(http.MethodPost, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{"pad":%q}}`, 100+i, pad), nil)
			ended = rs.StatusCode == 404
			if !ended {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if !ended {
			t.Fatal("a connection whose receiver never reads was still open after 100 MB of answers")
		}
		g.WaitLog(t, "connection closed", "conn", slow.conn, 10*time.Second)
		echo(acme)
	})
	t.Run("DELETE ends the connection", func(t *testing.T) {
		if resp, _ := acme.req(http.MethodDelete, "", nil); resp.StatusCode != 202 {
			t.Errorf("DELETE: %d", resp.StatusCode)
		}
		if resp, _ := acme.req(http.MethodPost, `{"jsonrpc":"2.0","id":4,"method":"session/list","params":{}}`, nil); resp.StatusCode != 404 {
			t.Errorf("POST after DELETE: %d", resp.StatusCode)
		}
	})
}
