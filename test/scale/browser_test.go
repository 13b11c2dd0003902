package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/chromium"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

// The web client through the balancer when its replica dies: browser.mjs
// drives Debian's chromium (playwright-core from test/browser) on the page
// the gateway serves at /, loaded through HAProxy.

const (
	browserRequireEnv = "ACPGATE_REQUIRE_BROWSER" // as test/browser: "1" makes a missing browser a failure
	browserLimit      = 3 * time.Minute           // the whole test, cluster included
)

// requireBrowserTools finds haproxy, node and the browser, skipping the
// test when one is missing (failing with ACPGATE_REQUIRE_BROWSER=1 or
// ACPGATE_REQUIRE_SCALE=1). It returns node's path.
func requireBrowserTools(t *testing.T) string {
	t.Helper()
	if haproxyBin == "" {
		if p, err := exec.LookPath("haproxy"); err == nil {
			haproxyBin = p
		} else if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
			haproxyBin = "/usr/sbin/haproxy" // Debian's, off a user's PATH
		} else {
			harness.Missing(t, "haproxy is missing (install the Debian package haproxy)", browserRequireEnv, requireEnv)
		}
	}
	return chromium.Require(t, filepath.Join("..", "browser", "node_modules"), browserRequireEnv, requireEnv)
}

// TestBrowserReplicaDies: the page, loaded through the balancer, is on one
// replica (the affinity cookie, checked against the replicas' metrics) and
// completes a turn. The test SIGKILLs that replica. The page's socket
// drops; its resume goes to the other replica, which refuses it (404); the
// page's acp.js connects anew through the balancer, now to the surviving
// replica, and loads the session; the page shows the earlier prompt and
// reply again, once each, and a new prompt completes there. The survivor's
// metrics agree: one session/load (the page did not load it twice), one
// prompt, and over a WebSocket one refused resume of another replica's
// connection. Once with each transport: "websocket" (the page's default)
// and "http" (Streamable HTTP: its event streams drop, and their resume
// with Last-Event-ID is refused), each with a cluster of its own.
func TestBrowserReplicaDies(t *testing.T) {
	node := requireBrowserTools(t)
	if binPath == "" {
		buildGateway(t)
		// TestScaleOut builds its own; this one goes with this test.
		dir := buildDir
		t.Cleanup(func() {
			if buildDir == dir && dir != "" {
				os.RemoveAll(dir)
				buildDir, binPath = "", ""
			}
		})
	}
	for _, transport := range []string{"websocket", "http"} {
		if !t.Run(transport, func(t *testing.T) { replicaDies(t, node, transport) }) {
			break
		}
	}
}

func replicaDies(t *testing.T, node, transport string) {
	ctx, cancel := context.WithTimeout(context.Background(), browserLimit)
	defer cancel()
	start := time.Now()
	c := newCluster(t, ctx)
	t.Logf("two replicas (%s, %s) behind haproxy %s, ready in %s", c.replicas["a"].addr, c.replicas["b"].addr, c.lb.addr, time.Since(start).Round(time.Millisecond))

	var (
		killed   string
		survivor string
		before   map[string]float64 // the survivor's counters before the kill
	)
	counters := map[string][]string{
		"refused resumes": {"acpgate_resumes_total", `result="refused"`, `reason="other_replica"`},
		"sessions loaded": {"acpgate_sessions_total", `event="loaded"`},
		"session/load":    {"acpgate_messages_total", `direction="client_to_agent"`, `method="session/load"`},
		"session/prompt":  {"acpgate_messages_total", `direction="client_to_agent"`, `method="session/prompt"`},
	}
	read := func(r *replica) (map[string]float64, error) {
		out := map[string]float64{}
		for what, m := range counters {
			v, err := scrape(r, m[0], m[1:]...)
			if err != nil {
				return nil, err
			}
			out[what] = v
		}
		return out, nil
	}
	open := func(r *replica) (float64, error) {
		return scrape(r, "acpgate_connections_open", `transport="`+transport+`"`)
	}

	if transport == "http" {
		// One request through the balancer first: round robin then usually
		// puts the page on b, so that the two runs kill different replicas.
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Get("http://" + c.lb.addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var actions []string
	runBrowserScript(t, ctx, node, []string{"http://" + c.lb.addr, transport}, []string{"ACPGATE_SCALE_TOKEN=" + c.token, "ACPGATE_SCALE_CWD=" + c.root}, func(action string) error {
		actions = append(actions, action)
		verb, name, _ := strings.Cut(action, " ")
		r := c.replicas[name]
		if r == nil {
			return fmt.Errorf("no replica %q", name)
		}
		switch verb {
		case "kill":
			// The cookie's replica holds the page's connection, the other none.
			for n, want := range map[string]float64{name: 1, other(name): 0} {
				if v, err := open(c.replicas[n]); err != nil || v != want {
					return fmt.Errorf("the cookie names replica %s, but replica %s has %v open %s connections (%v); want %v", name, n, v, transport, err, want)
				}
			}
			killed, survivor = name, other(name)
			var err error
			if before, err = read(c.replicas[survivor]); err != nil {
				return err
			}
			p := r.cur()
			if err := p.cmd.Process.Kill(); err != nil {
				return err
			}
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("replica %s still runs 10 s after SIGKILL", name)
			}
			t.Logf("replica %s killed; the page should go on on %s", name, survivor)
		case "check":
			if name != survivor {
				return fmt.Errorf("the page is on replica %s after the kill, want %s", name, survivor)
			}
			after, err := read(r)
			if err != nil {
				return err
			}
			d := map[string]float64{}
			for what := range counters {
				d[what] = after[what] - before[what]
			}
			t.Logf("replica %s since the kill: %v", name, d)
			var errs []error
			// Over HTTP the refusal is a 404 for the unknown connection.
			if transport == "websocket" && d["refused resumes"] < 1 {
				errs = append(errs, errors.New("it refused no resume of another replica's connection"))
			}
			if d["sessions loaded"] != 1 || d["session/load"] != 1 {
				errs = append(errs, fmt.Errorf("%v sessions loaded with %v session/load requests; want 1 (a page that loads twice shows the history twice)", d["sessions loaded"], d["session/load"]))
			}
			if d["session/prompt"] != 1 {
				errs = append(errs, fmt.Errorf("%v prompts; want 1, the one after the kill", d["session/prompt"]))
			}
			if v, err := open(r); err != nil || v != 1 {
				errs = append(errs, fmt.Errorf("%v open %s connections (%v); want 1, the page's", v, transport, err))
			}
			return errors.Join(errs...)
		default:
			return fmt.Errorf("unknown harness action %q", action)
		}
		return nil
	})
	if got, want := strings.Join(actions, ","), fmt.Sprintf("kill %s,check %s", killed, survivor); killed == "" || got != want {
		t.Errorf("harness actions %q, want %q", got, want)
	}

	// The balancer's view: the refused resume and the new connection were
	// the survivor's. A new connection is a 101 (WebSocket) or a 200 to
	// the initialize POST (Streamable HTTP; later POSTs get 202).
	opened := "status=101 method=GET"
	if transport == "http" {
		opened = "status=200 method=POST"
	}
	var refusals, conns []string
	for _, l := range c.lb.lines("scale server=") {
		if !strings.Contains(l, "path=/acp ") {
			continue
		}
		switch {
		case strings.Contains(l, "status=404"):
			refusals = append(refusals, l)
			if !strings.Contains(l, "server="+survivor+" ") {
				t.Errorf("a 404 on /acp not from the survivor %s: %s", survivor, l)
			}
		case strings.Contains(l, opened):
			conns = append(conns, l)
		}
	}
	if len(refusals) < 1 || len(conns) != 2 || !strings.Contains(conns[1], "server="+survivor+" ") {
		t.Errorf("the balancer logged %d refusals and %d new connections on /acp; want at least 1 refusal and 2 connections (the first, then the new one on %s):\n%s\n%s",
			len(refusals), len(conns), survivor, strings.Join(refusals, "\n"), strings.Join(conns, "\n"))
	}
	t.Logf("done in %s", time.Since(start).Round(time.Millisecond))
}

// scrape sums the samples of a metric whose labels contain every one of
// labels, from the replica's /metrics (an error, not a fatal failure: it
// runs while the browser script waits).
func scrape(r *replica, name string, labels ...string) (float64, error) {
	code, body := r.get("/metrics")
	if code != http.StatusOK {
		return 0, fmt.Errorf("replica %s /metrics: %d %.200s", r.name, code, body)
	}
	return metricscrape.Sum(body, name, labels...), nil
}

// runBrowserScript runs browser.mjs and relays its "@@harness ACTION"
// requests to onAction, answering "ok" (or "error") on its stdin. The
// script and the browser it starts are killed when ctx ends.
func runBrowserScript(t *testing.T, ctx context.Context, node string, args, env []string, onAction func(string) error) {
	t.Helper()
	outDir, err := filepath.Abs(filepath.Join("..", "out", "scale"))
	if err != nil {
		t.Fatal(err)
	}
	res := chromium.Run(t, ctx, chromium.Script{Node: node, Args: append([]string{"browser.mjs"}, args...), Env: env, OutDir: outDir, OnAction: onAction})
	if ctx.Err() != nil {
		t.Errorf("browser.mjs did not finish in time (%v)", ctx.Err())
	}
	if res.ActionErr != nil {
		t.Errorf("harness action: %v", res.ActionErr)
	}
	if res.Err != nil || res.ActionErr != nil {
		t.Errorf("browser.mjs: %v after %v\n--- script stderr ---\n%s", res.Err, res.Took, res.Stderr)
		return
	}
	t.Logf("browser.mjs passed in %v; screenshots in %s", res.Took, outDir)
}
