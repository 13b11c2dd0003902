//go:build unix

package browser

import (
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserHTTP: the page on Streamable HTTP (?transport=http) against a
// gateway with one tenant, through the TCP proxy that the harness can cut.
// Refused without a token (the 401 and its message are readable over HTTP),
// connected with the token in an Authorization header; a streamed turn, a
// permission card answered, a turn whose event stream is cut and resumed
// with Last-Event-ID (every chunk exactly once), and DELETE on disconnect.
func TestBrowserHTTP(t *testing.T) {
	r := newRig(t)
	const good = "http-good-token"
	// Chunks 40 ms apart (the demo agent's default is 15 ms): a loaded CI
	// machine once delivered a whole 15 ms reply in one read, and the page
	// rightly rendered it at once; the test is about streaming.
	config := tenantConfig(t, r.dir, good, fmt.Sprintf("agent:\n  command: [%q, \"demo-agent\", \"--chunk-delay\", \"40ms\"]\n", r.bin))

	gw := r.start(t, config, "")
	defer gw.stop()
	px := startCutProxy(t, gw.Addr)
	defer px.close()

	start := time.Now()
	var actions []string
	r.runScript(t, "http://"+px.addr+"/?transport=http", "http", []string{"ACPGATE_GOOD_TOKEN=" + good}, func(action string) error {
		actions = append(actions, action)
		if action != "cut" {
			return fmt.Errorf("unknown harness action %q", action)
		}
		n := px.cut()
		t.Logf("proxy: cut %d connections", n)
		if n == 0 {
			return errors.New("no connection to cut")
		}
		return nil
	})
	t.Logf("the scenario took %v", time.Since(start).Round(time.Millisecond))
	px.close()
	gw.stop()
	r.saveLog(t, "http-gateway.log")

	if got := strings.Join(actions, ","); got != "cut" {
		t.Errorf("harness actions %q, want \"cut\"", got)
	}
	// The first request of each proxied connection to /acp (POSTs and
	// GETs here): none with a credential in its URL.
	acp := px.upgrades()
	if len(acp) == 0 {
		t.Errorf("no request for /acp went through the proxy")
	}
	for _, target := range acp {
		if strings.Contains(target, "token") || strings.Contains(target, good) {
			t.Errorf("a request URL carries a credential: %s", target)
		}
	}
	logText := r.log.String()
	if strings.Contains(logText, good) {
		t.Errorf("the gateway log contains the token")
	}
	for _, want := range []string{`"transport":"http"`, "closed by client"} {
		if !strings.Contains(logText, want) {
			t.Errorf("the gateway log has no %s", want)
		}
	}
}

// TestBrowserHTTPFallback: the page loaded through an HTTP reverse proxy that
// refuses WebSocket upgrades (400) and forwards everything else, streaming.
// The page's WebSocket fails, the gateway answers /healthz, so the page falls
// back to Streamable HTTP on its own and completes a turn (a streamed reply,
// a permission card answered), loads a session (the replay before the
// answer), and falls back again after a reload.
func TestBrowserHTTPFallback(t *testing.T) {
	r := newRig(t)
	config := writeConfig(t, r.dir, "")
	gw := r.start(t, config, "")
	defer gw.stop()
	px := startNoUpgradeProxy(t, gw.Addr)
	defer px.close()

	start := time.Now()
	r.runScript(t, "http://"+px.addr+"/", "fallback", nil, nil)
	t.Logf("the scenario took %v", time.Since(start).Round(time.Millisecond))
	px.close()
	gw.stop()
	r.saveLog(t, "fallback-gateway.log")

	refused, seen := px.counts()
	t.Logf("proxy: %d upgrades refused; forwarded %v", refused, seen)
	if refused < 2 {
		t.Errorf("%d WebSocket upgrades reached the proxy, want at least 2 (a load and a reload)", refused)
	}
	for _, want := range []string{"POST /acp", "GET /acp", "DELETE /acp", "GET /healthz"} {
		if seen[want] == 0 {
			t.Errorf("the proxy forwarded no %s", want)
		}
	}
	if !strings.Contains(r.log.String(), `"transport":"http"`) {
		t.Errorf("the gateway log has no HTTP connection")
	}
}

// noUpgradeProxy is an HTTP reverse proxy, as some corporate proxies are:
// it answers 400 to any Upgrade request and forwards everything else,
// flushing each write (event streams pass as they come).
type noUpgradeProxy struct {
	addr string
	srv  *http.Server
	tr   *http.Transport
	done chan struct{}

	mu      sync.Mutex
	refused int
	seen    map[string]int // "METHOD /path" -> requests forwarded
}

func startNoUpgradeProxy(t *testing.T, target string) *noUpgradeProxy {
	t.Helper()
	ln := harness.Listen(t)
	to := &url.URL{Scheme: "http", Host: target}
	p := &noUpgradeProxy{addr: ln.Addr().String(), tr: &http.Transport{}, done: make(chan struct{}), seen: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.Host = r.In.Host // the gateway sees the page's origin as its own
		},
		Transport:     p.tr,
		FlushInterval: -1,
		ErrorLog:      stdlog.New(io.Discard, "", 0), // aborted event streams are expected
	}
	p.srv = &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Upgrade") != "" {
				p.mu.Lock()
				p.refused++
				p.mu.Unlock()
				http.Error(w, "this proxy does not pass WebSockets", http.StatusBadRequest)
				return
			}
			p.mu.Lock()
			p.seen[r.Method+" "+r.URL.Path]++
			p.mu.Unlock()
			rp.ServeHTTP(w, r)
		}),
	}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p
}

func (p *noUpgradeProxy) counts() (int, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[string]int, len(p.seen))
	for k, v := range p.seen {
		seen[k] = v
	}
	return p.refused, seen
}

func (p *noUpgradeProxy) close() {
	_ = p.srv.Close()
	<-p.done
	p.tr.CloseIdleConnections()
}
