package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The setup scenario: how long a client waits for a session.
//
//   - warm gateway: min_idle 1, an initialized agent waiting; each sample is
//     a new connection: dial, initialize, session/new.
//   - cold gateway: min_idle 0, a fresh gateway per sample; initialize
//     starts the agent (under acpgate supervise) and waits for it.
//   - direct warm: session/new on an initialized agent over stdio.
//   - direct cold: start the agent, initialize, session/new.
//   - mixed capabilities: one gateway (min_idle 1, max_processes 2), a new
//     connection per sample, one after another; client i offers
//     mixedProfiles[i%3] as clientCapabilities.fs, so two of three need a
//     process of a profile other than the warm one. Each client is bounded
//     at mixedClientLimit; a failure or timeout is an error of the path.
//     After the run the gateway's acpgate_agent_spawns_total is read from
//     its /metrics.
//
// -setup-paths picks among warm, cold, direct (both direct paths) and
// mixed; the default is all of them.

// setupPathNames are the values -setup-paths accepts.
var setupPathNames = []string{"warm", "cold", "direct", "mixed"}

// mixedProfiles are the mixed path's clients' fs capabilities, in turn.
var mixedProfiles = []fsCaps{{Read: true, Write: true}, {Read: false, Write: false}, {Read: true, Write: false}}

// mixedClientLimit bounds one mixed client from dialing to session/new.
const mixedClientLimit = 30 * time.Second

type setupPath struct {
	Path    string `json:"path"`
	Samples int    `json:"samples"`
	// Phases, each from sending its request to its answer. Connect is the
	// TCP connection and WebSocket upgrade (or the process start).
	Connect    dist `json:"connect"`
	Initialize dist `json:"initialize"`
	SessionNew dist `json:"session_new"`
	Total      dist `json:"total"` // connect/start → session/new answered
	// Failed is the number of samples that ended in an error; Errors are
	// the first 5 of them.
	Failed int      `json:"failed,omitempty"`
	Errors []string `json:"errors,omitempty"`
	// Spawns is the gateway's acpgate_agent_spawns_total after the last
	// sample, SpawnsAtReady before the first (mixed path only).
	Spawns        *int64 `json:"spawns,omitempty"`
	SpawnsAtReady *int64 `json:"spawns_at_ready,omitempty"`
}

type setupResult struct {
	Paths []*setupPath `json:"paths"`
}

func (r *setupResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, p := range r.Paths {
		if len(p.Errors) > 0 {
			out = append(out, fmt.Sprintf("setup %s: %s", p.Path, strings.Join(p.Errors, "; ")))
		}
		if p.SessionNew.N != p.Samples || p.Samples == 0 {
			out = append(out, fmt.Sprintf("setup %s: %d of %d samples", p.Path, p.SessionNew.N, p.Samples))
		}
	}
	return out
}

type setupSample struct{ connect, init, newSess, total time.Duration }

type setupCollector struct {
	p                      *setupPath
	conn, init, sess, totl []time.Duration
}

func (c *setupCollector) add(s setupSample, err error) {
	if err != nil {
		c.p.Failed++
		if len(c.p.Errors) < 5 {
			c.p.Errors = append(c.p.Errors, err.Error())
		}
		return
	}
	c.conn, c.init = append(c.conn, s.connect), append(c.init, s.init)
	c.sess, c.totl = append(c.sess, s.newSess), append(c.totl, s.total)
}

func (c *setupCollector) done() *setupPath {
	c.p.Connect, c.p.Initialize = summarize(c.conn), summarize(c.init)
	c.p.SessionNew, c.p.Total = summarize(c.sess), summarize(c.totl)
	return c.p
}

// wsSession times one connection through to its first session.
func wsSession(url string) (setupSample, error) {
	return wsSessionFS(url, nil, 60*time.Second)
}

// wsSessionFS is wsSession offering fs (nil: the default profile), given
// at most limit from dialing to session/new's answer: then the connection
// is closed and the error says so.
func wsSessionFS(url string, fs *fsCaps, limit time.Duration) (setupSample, error) {
	var s setupSample
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	t, err := dialWS(ctx, url, []string{"acp"})
	if err != nil {
		return s, err
	}
	// Closed as a client that is done closes (1000): its session ends at
	// once, where a dropped socket would keep it for detach_timeout and
	// fill the pool.
	defer t.closeClean()
	var expired atomic.Bool
	stop := time.AfterFunc(limit-time.Since(start), func() { expired.Store(true); t.Close() })
	defer stop.Stop()
	s.connect = time.Since(start)
	err = timeSession(&rpcClient{t: t, fs: fs}, start, &s)
	if err != nil && expired.Load() {
		err = fmt.Errorf("timed out after %s: %w", limit, err)
	}
	return s, err
}

// warmSetup is the warm path: new sessions through a gateway with an
// initialized agent waiting, and with -audit the same through a gateway
// with its audit trail on, a sample of each in turn.
func (h *harness) warmSetup(errs *[]string) []*setupPath {
	cfgs := []gwConfig{{minIdle: 1, maxProcs: 4, perProc: 32}}
	names := []string{"gateway, warm pool (min_idle 1)"}
	if h.audit {
		cfgs = append(cfgs, gwConfig{minIdle: 1, maxProcs: 4, perProc: 32, audit: true})
		names = append(names, names[0]+auditOnName)
	}
	var gws []*server
	var cols []*setupCollector
	for i, cfg := range cfgs {
		gw, err := h.startGateway(cfg, true)
		if err != nil {
			*errs = append(*errs, err.Error())
			continue
		}
		defer gw.stop()
		gws, cols = append(gws, gw), append(cols, &setupCollector{p: &setupPath{Path: names[i], Samples: h.c.SetupWarm}})
	}
	fmt.Fprintf(h.log, "load: setup: %d sessions through a warm pool (%d gateways)\n", h.c.SetupWarm, len(gws))
	for range h.c.SetupWarm {
		for i, gw := range gws {
			cols[i].add(wsSession(gw.url))
			time.Sleep(2 * time.Millisecond) // the previous connection's close settles
		}
	}
	var out []*setupPath
	for _, c := range cols {
		out = append(out, c.done())
	}
	return out
}

func (h *harness) runSetup() (*setupResult, error) {
	res := &setupResult{}
	var errs []string
	want := func(name string) bool { return h.setupPaths == nil || h.setupPaths[name] }

	// Warm gateway (and with -audit, the same with its audit trail on,
	// one sample of each in turn).
	if want("warm") {
		res.Paths = append(res.Paths, h.warmSetup(&errs)...)
	}

	// Cold gateway: a fresh one per sample.
	if want("cold") {
		cold := &setupCollector{p: &setupPath{Path: "gateway, cold pool (min_idle 0)", Samples: h.c.SetupCold}}
		fmt.Fprintf(h.log, "load: setup: %d first sessions through a cold pool\n", h.c.SetupCold)
		for range h.c.SetupCold {
			gw, err := h.startGateway(gwConfig{minIdle: 0, maxProcs: 4, perProc: 32}, false)
			if err != nil {
				cold.add(setupSample{}, err)
				continue
			}
			cold.add(wsSession(gw.url))
			gw.stop()
		}
		res.Paths = append(res.Paths, cold.done())
	}

	if want("direct") {
		// Direct, warm: one initialized agent.
		dw := &setupCollector{p: &setupPath{Path: "direct, initialized agent", Samples: h.c.SetupDirect}}
		if a, err := startStdio([]string{h.exe, "agent"}); err != nil {
			errs = append(errs, err.Error())
		} else {
			c := &rpcClient{t: a}
			watchdog := time.AfterFunc(60*time.Second, func() { _ = a.cmd.Process.Kill() })
			defer watchdog.Stop()
			if err := c.initialize(); err != nil {
				errs = append(errs, err.Error())
			} else {
				for range h.c.SetupDirect {
					t := time.Now()
					_, err := c.newSession()
					d := time.Since(t)
					dw.add(setupSample{newSess: d, total: d}, err)
				}
			}
			a.Close()
		}
		res.Paths = append(res.Paths, dw.done())

		// Direct, cold: start, initialize, session/new.
		dc := &setupCollector{p: &setupPath{Path: "direct, agent started per session", Samples: h.c.SetupCold}}
		for range h.c.SetupCold {
			dc.add(directCold(h.exe))
		}
		res.Paths = append(res.Paths, dc.done())
	}

	// Mixed capability profiles through one small pool.
	if want("mixed") {
		p, err := h.setupMixed()
		res.Paths = append(res.Paths, p)
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return res, errors.New(strings.Join(errs, "; "))
	}
	return res, nil
}

// setupMixed runs h.c.SetupMixed clients one after another through one
// gateway (min_idle 1, max_processes 2), each a new connection offering
// the next of mixedProfiles, and reads the gateway's spawn count.
func (h *harness) setupMixed() (*setupPath, error) {
	mixed := &setupCollector{p: &setupPath{Path: "gateway, mixed fs profiles (min_idle 1, 2 processes)", Samples: h.c.SetupMixed}}
	gw, err := h.startGateway(gwConfig{minIdle: 1, maxProcs: 2, perProc: 32}, true)
	if err != nil {
		return mixed.done(), err
	}
	defer gw.stop()
	metricsURL := "http://" + gw.addr + "/metrics"
	var errs []string
	if n, err := scrapeCounter(metricsURL, "acpgate_agent_spawns_total"); err != nil {
		errs = append(errs, err.Error())
	} else {
		mixed.p.SpawnsAtReady = &n
	}
	fmt.Fprintf(h.log, "load: setup: %d sessions with mixed fs capabilities through a 2-process pool\n", h.c.SetupMixed)
	t0 := time.Now()
	for i := range h.c.SetupMixed {
		fs := mixedProfiles[i%len(mixedProfiles)]
		s, err := wsSessionFS(gw.url, &fs, mixedClientLimit)
		if err != nil {
			err = fmt.Errorf("client %d (fs %s): %w", i, fs, err)
		}
		mixed.add(s, err)
		if (i+1)%100 == 0 {
			fmt.Fprintf(h.log, "load: setup: mixed: %d clients, %d failed, %s\n", i+1, mixed.p.Failed, time.Since(t0).Round(time.Millisecond))
		}
		time.Sleep(2 * time.Millisecond) // the previous connection's close settles
	}
	if n, err := scrapeCounter(metricsURL, "acpgate_agent_spawns_total"); err != nil {
		errs = append(errs, err.Error())
	} else {
		mixed.p.Spawns = &n
	}
	if len(errs) > 0 {
		return mixed.done(), errors.New(strings.Join(errs, "; "))
	}
	return mixed.done(), nil
}

// scrapeCounter reads a counter from a Prometheus text exposition at url:
// its value, or the sum over its label sets.
func scrapeCounter(url, name string) (int64, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: GET %s: %s", url, resp.Status)
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), name)
		if !ok || line == "" || (line[0] != ' ' && line[0] != '{') {
			continue // another metric, a comment, or a longer name
		}
		if line[0] == '{' {
			end := strings.LastIndexByte(line, '}')
			if end < 0 {
				return 0, fmt.Errorf("metrics: bad line %q", sc.Text())
			}
			line = line[end+1:]
		}
		f := strings.Fields(line) // value [timestamp]
		if len(f) == 0 {
			return 0, fmt.Errorf("metrics: bad line %q", sc.Text())
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: bad line %q: %w", sc.Text(), err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	if !found {
		return 0, fmt.Errorf("metrics: no %s at %s", name, url)
	}
	return int64(sum), nil
}

// timeSession times initialize and session/new on a connected client and
// fills s (start is when connecting began), so that every path is timed
// the same way.
func timeSession(c *rpcClient, start time.Time, s *setupSample) error {
	t1 := time.Now()
	if err := c.initialize(); err != nil {
		return err
	}
	s.init = time.Since(t1)
	t2 := time.Now()
	if _, err := c.newSession(); err != nil {
		return err
	}
	s.newSess = time.Since(t2)
	s.total = time.Since(start)
	return nil
}

func directCold(exe string) (setupSample, error) {
	var s setupSample
	start := time.Now()
	a, err := startStdio([]string{exe, "agent"})
	if err != nil {
		return s, err
	}
	defer a.Close()
	stop := time.AfterFunc(60*time.Second, func() { _ = a.cmd.Process.Kill() })
	defer stop.Stop()
	s.connect = time.Since(start)
	err = timeSession(&rpcClient{t: a}, start, &s)
	return s, err
}

func (r *setupResult) print(w io.Writer) {
	fmt.Fprintf(w, "\nSETUP: time to a session (p50 / p99 of samples)\n")
	tw := newTable(w)
	fmt.Fprintln(tw, "path\tsamples\tconnect/start\tinitialize\tsession/new p50\tsession/new p99\ttotal p50\ttotal p99\t")
	var mixed []*setupPath
	for _, p := range r.Paths {
		con, ini := fmtUS(p.Connect.P50), fmtUS(p.Initialize.P50)
		if p.Connect.P50 == 0 {
			con, ini = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Path, p.SessionNew.N, con, ini,
			fmtUS(p.SessionNew.P50), fmtUS(p.SessionNew.P99), fmtUS(p.Total.P50), fmtUS(p.Total.P99))
		if p.Spawns != nil || p.SpawnsAtReady != nil || p.Failed > 0 {
			mixed = append(mixed, p)
		}
	}
	tw.Flush()
	if len(mixed) == 0 {
		return
	}
	// The paths with spawn counts or failures, in more detail.
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "path\tsamples\tfailed\tinitialize p50\tinitialize p99\tsession/new p50\tsession/new p99\ttotal p50\ttotal p99\tspawns\tat ready\t")
	count := func(n *int64) string {
		if n == nil {
			return "-"
		}
		return strconv.FormatInt(*n, 10)
	}
	for _, p := range mixed {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Path, p.Samples, p.Failed,
			fmtUS(p.Initialize.P50), fmtUS(p.Initialize.P99), fmtUS(p.SessionNew.P50), fmtUS(p.SessionNew.P99),
			fmtUS(p.Total.P50), fmtUS(p.Total.P99), count(p.Spawns), count(p.SpawnsAtReady))
	}
	tw.Flush()
}
