package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	testharness "github.com/acpgate/acpgate/test/internal/harness"
)

// --- the client process: `load idle-clients` ---

type idleReport struct {
	Open      int    `json:"open"`
	Failed    int    `json:"failed"`
	FirstErr  string `json:"first_error,omitempty"`
	ElapsedNS int64  `json:"elapsed_ns"`
}

// idleClientsMain opens n WebSocket connections, initializes each, reports,
// and holds them open (answering the gateway's pings) until stdin ends.
// The clients live in their own process so that the gateway's process
// holds only the gateway's side of each connection.
func idleClientsMain(args []string) int {
	fs := flag.NewFlagSet("load idle-clients", flag.ContinueOnError)
	url := fs.String("url", "", "gateway WebSocket URL")
	n := fs.Int("n", 1000, "connections")
	conc := fs.Int("concurrency", 32, "connections being set up at once")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	exitAfter("idle-clients", *timeout)
	start := time.Now()
	conns := make([]*websocket.Conn, *n)
	failed, firstErr := boundedErrs(*n, *conc, func(i int) error {
		c, err := openIdle(*url)
		if err != nil {
			return err
		}
		conns[i] = c
		return nil
	})
	rep := idleReport{Open: *n - failed, Failed: failed, FirstErr: firstErr, ElapsedNS: time.Since(start).Nanoseconds()}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	// A clean close (1000): the gateway ends the connection at once
	// rather than keep it for a resume.
	var closing sync.WaitGroup
	for _, c := range conns {
		if c != nil {
			closing.Go(func() {
				if c.Close(websocket.StatusNormalClosure, "") != nil {
					_ = c.CloseNow()
				}
			})
		}
	}
	closing.Wait()
	return 0
}

// boundedErrs runs f(i) for every i below n, limit at a time
// (testharness.Bounded), and counts the calls that failed; firstErr is the
// first of their errors to come ("" when none did).
func boundedErrs(n, limit int, f func(i int) error) (failed int, firstErr string) {
	var nFailed atomic.Int64
	var first atomic.Value
	testharness.Bounded(n, limit, func(i int) {
		if err := f(i); err != nil {
			nFailed.Add(1)
			first.CompareAndSwap(nil, err.Error())
		}
	})
	firstErr, _ = first.Load().(string)
	return int(nFailed.Load()), firstErr
}

// exitAfter ends a client process (exit code 3), saying so on stderr, once
// d has passed.
func exitAfter(name string, d time.Duration) {
	time.AfterFunc(d, func() {
		fmt.Fprintf(os.Stderr, "%s: timed out after %s\n", name, d)
		os.Exit(3)
	})
}

// openIdle connects and initializes one connection, then leaves a reader
// (CloseRead) to answer pings.
func openIdle(url string) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"acp"}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	msg := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true},"terminal":false}}}`)
	if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
		c.CloseNow()
		return nil, err
	}
	_, resp, err := c.Read(ctx)
	if err != nil {
		c.CloseNow()
		return nil, err
	}
	if id, ok := parseID(resp); !ok || id != 1 || !json.Valid(resp) || len(resp) < 30 {
		c.CloseNow()
		return nil, fmt.Errorf("initialize: unexpected answer %.200s", resp)
	}
	var r rpcResponse
	if err := json.Unmarshal(resp, &r); err != nil || r.Error != nil {
		c.CloseNow()
		return nil, fmt.Errorf("initialize: %.200s", resp)
	}
	c.CloseRead(context.Background())
	return c, nil
}

// --- the harness side ---

type idleResult struct {
	Conns int `json:"conns"`
	// In-process gateway (gateway.New + Serve in the harness).
	InProc struct {
		Goroutines0       int     `json:"goroutines_before"`
		Goroutines        int     `json:"goroutines_open"`
		GoroutinesAfter   int     `json:"goroutines_after_close"`
		GoroutinesPerConn float64 `json:"goroutines_per_conn"`
		HeapPerConn       float64 `json:"heap_inuse_bytes_per_conn"`  // after runtime.GC
		StackPerConn      float64 `json:"stack_inuse_bytes_per_conn"` // goroutine stacks
		RSSPerConn        float64 `json:"rss_bytes_per_conn"`
		OpenSeconds       float64 `json:"open_seconds"`
		// What the goroutines are (per connection), and where the live
		// heap was allocated (bytes per connection; from a heap profile).
		GoroutineKinds []perConn `json:"goroutine_kinds"`
		HeapSites      []perConn `json:"heap_sites"`
	} `json:"in_process"`
	// The acpgate binary: VmRSS of its process.
	OutProc struct {
		RSS0        int64   `json:"rss_before_bytes"`
		RSS         int64   `json:"rss_open_bytes"`
		RSSPerConn  float64 `json:"rss_bytes_per_conn"`
		Threads     int64   `json:"threads"`
		OpenSeconds float64 `json:"open_seconds"`
	} `json:"out_of_process"`
	Errors []string `json:"errors,omitempty"`
}

func (r *idleResult) problems() []string {
	if r == nil {
		return nil
	}
	out := r.Errors
	if r.InProc.GoroutinesPerConn <= 0 {
		out = append(out, "idle: no goroutines counted per connection")
	}
	if r.OutProc.RSSPerConn <= 0 {
		out = append(out, "idle: no RSS counted per connection")
	}
	return out
}

// idleChild is a running `load idle-clients`.
type idleChild struct {
	*child
	rep idleReport
}

func (h *harness) openIdleClients(url string, n int) (*idleChild, error) {
	timeout := 2*time.Minute + time.Duration(n)*10*time.Millisecond
	c, err := h.startChild("idle-clients", "-url", url, "-n", strconv.Itoa(n), "-timeout", (timeout + time.Minute).String())
	if err != nil {
		return nil, err
	}
	ch := &idleChild{child: c}
	err = ch.decode(&ch.rep, timeout)
	if err == nil && ch.rep.Failed > 0 {
		err = fmt.Errorf("%d of %d connections failed: %s", ch.rep.Failed, n, ch.rep.FirstErr)
	}
	if err != nil {
		ch.close()
		return nil, fmt.Errorf("connections not open: %v %s", err, ch.errb.String())
	}
	return ch, nil
}

func (ch *idleChild) close() { ch.finish(30 * time.Second) }

func memNow() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

func (h *harness) runIdle() (*idleResult, error) {
	n := h.c.IdleConns
	res := &idleResult{Conns: n}
	// Every connection's home is the warm process (homes go to the busiest).
	cfg := gwConfig{minIdle: 1, maxProcs: 2, perProc: 32}

	// In process: goroutines and Go memory. The heap profile samples every
	// 1 KiB allocated, so that per-connection sites are resolved (only the
	// connections' allocations are made at this rate; it is restored after).
	if h.profile != "" {
		old := runtime.MemProfileRate
		runtime.MemProfileRate = 1024
		defer func() { runtime.MemProfileRate = old }()
	}
	g, err := h.startInProcGateway(cfg)
	if err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	m0 := memNow()
	res.InProc.Goroutines0 = runtime.NumGoroutine()
	rss0, _ := procRSS(os.Getpid())
	t0 := time.Now()
	fmt.Fprintf(h.log, "load: idle: opening %d connections to the in-process gateway\n", n)
	ch, err := h.openIdleClients(g.url, n)
	if err != nil {
		g.stop()
		return nil, err
	}
	res.InProc.OpenSeconds = time.Since(t0).Seconds()
	if err := waitConns(g, n, 30*time.Second); err != nil {
		res.Errors = append(res.Errors, "in-process: "+err.Error())
	}
	time.Sleep(time.Second)
	m1 := memNow()
	res.InProc.Goroutines = runtime.NumGoroutine()
	rss1, _ := procRSS(os.Getpid())
	res.InProc.GoroutinesPerConn = float64(res.InProc.Goroutines-res.InProc.Goroutines0) / float64(n)
	res.InProc.HeapPerConn = (float64(m1.HeapInuse) - float64(m0.HeapInuse)) / float64(n)
	res.InProc.StackPerConn = (float64(m1.StackInuse) - float64(m0.StackInuse)) / float64(n)
	res.InProc.RSSPerConn = float64(rss1-rss0) / float64(n)
	res.InProc.GoroutineKinds = goroutineGroups(n)
	if h.profile != "" {
		if sites, err := heapSites(h.profile+".idle-heap.pprof", n); err != nil {
			res.Errors = append(res.Errors, "heap profile: "+err.Error())
		} else {
			res.InProc.HeapSites = sites
		}
	}
	ch.close()
	if err := waitConns(g, 0, 30*time.Second); err != nil {
		res.Errors = append(res.Errors, "in-process, closing: "+err.Error())
	}
	// Goroutines should return to the baseline once every connection is
	// gone (bounded wait).
	for i := 0; i < 200 && runtime.NumGoroutine() > res.InProc.Goroutines0; i++ {
		time.Sleep(25 * time.Millisecond)
	}
	res.InProc.GoroutinesAfter = runtime.NumGoroutine()
	if res.InProc.GoroutinesAfter > res.InProc.Goroutines0+10 {
		res.Errors = append(res.Errors, fmt.Sprintf("in-process: %d goroutines before, %d after every connection closed",
			res.InProc.Goroutines0, res.InProc.GoroutinesAfter))
	}
	g.stop()

	// The binary: its RSS.
	gw, err := h.startGateway(cfg, true)
	if err != nil {
		return res, err
	}
	defer gw.stop()
	time.Sleep(200 * time.Millisecond)
	res.OutProc.RSS0, _ = procRSS(gw.Pid())
	t0 = time.Now()
	fmt.Fprintf(h.log, "load: idle: opening %d connections to the acpgate binary\n", n)
	ch, err = h.openIdleClients(gw.url, n)
	if err != nil {
		return res, err
	}
	defer ch.close()
	res.OutProc.OpenSeconds = time.Since(t0).Seconds()
	time.Sleep(2 * time.Second)
	res.OutProc.RSS, _ = procRSS(gw.Pid())
	res.OutProc.Threads, _ = procStatus(gw.Pid(), "Threads")
	res.OutProc.RSSPerConn = float64(res.OutProc.RSS-res.OutProc.RSS0) / float64(n)
	if len(res.Errors) > 0 {
		return res, errors.New(res.Errors[0])
	}
	return res, nil
}

func waitConns(g *inProcGateway, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for g.srv.Relay().Conns() != want {
		if time.Now().After(deadline) {
			return fmt.Errorf("the gateway holds %d connections, not %d, after %s", g.srv.Relay().Conns(), want, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (r *idleResult) print(w io.Writer) {
	fmt.Fprintf(w, "\nIDLE: %d open, initialized WebSocket connections (clients in another process)\n", r.Conns)
	tw := newTable(w)
	fmt.Fprintln(tw, "gateway\tper connection\t\topened in\t")
	fmt.Fprintf(tw, "acpgate binary\tRSS %s\t(%s → %s, %d threads)\t%.1f s\t\n", fmtBytes(r.OutProc.RSSPerConn),
		fmtBytes(float64(r.OutProc.RSS0)), fmtBytes(float64(r.OutProc.RSS)), r.OutProc.Threads, r.OutProc.OpenSeconds)
	fmt.Fprintf(tw, "in-process\t%.2f goroutines\t(%d → %d, %d after close)\t%.1f s\t\n", r.InProc.GoroutinesPerConn,
		r.InProc.Goroutines0, r.InProc.Goroutines, r.InProc.GoroutinesAfter, r.InProc.OpenSeconds)
	fmt.Fprintf(tw, "in-process\theap %s + stacks %s\t(live, after GC)\t\t\n", fmtBytes(r.InProc.HeapPerConn), fmtBytes(r.InProc.StackPerConn))
	fmt.Fprintf(tw, "in-process\tRSS %s\t\t\t\n", fmtBytes(r.InProc.RSSPerConn))
	tw.Flush()
	if len(r.InProc.GoroutineKinds) > 0 || len(r.InProc.HeapSites) > 0 {
		fmt.Fprintf(w, "\nper connection, in process: goroutines by function, and live heap by allocation site (inuse_space)\n")
		tw = newTable(w)
		for i := range max(len(r.InProc.GoroutineKinds), len(r.InProc.HeapSites)) {
			g, hs := "\t", "\t"
			if i < len(r.InProc.GoroutineKinds) {
				k := r.InProc.GoroutineKinds[i]
				g = fmt.Sprintf("%.2f\t%s", k.PerConn, k.Name)
			}
			if i < len(r.InProc.HeapSites) {
				k := r.InProc.HeapSites[i]
				hs = fmt.Sprintf("%s\t%s", fmtBytes(k.PerConn), k.Name)
			}
			fmt.Fprintf(tw, "%s\t%s\t\n", g, hs)
		}
		tw.Flush()
	}
}

// perConn is an amount per connection, by what it is.
type perConn struct {
	Name    string  `json:"name"`
	PerConn float64 `json:"per_conn"`
}

// goroutineGroups counts this process's goroutines by the function they
// run (the outermost frame of the gateway, net/http or coder/websocket),
// per connection, for groups of at least n/2.
func goroutineGroups(n int) []perConn {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return nil
	}
	counts := map[string]int{}
	var cur int
	var name string
	flush := func() {
		if cur > 0 {
			counts[name] += cur
		}
		cur, name = 0, ""
	}
	for line := range strings.SplitSeq(b.String(), "\n") {
		if c, rest, ok := strings.Cut(line, " @ "); ok && rest != "" {
			flush()
			cur, _ = strconv.Atoi(c)
			name = "?"
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, "#"))
		if cur > 0 && strings.HasPrefix(line, "#") && len(f) >= 2 {
			fn, _, _ := strings.Cut(f[1], "+0x")
			if strings.Contains(fn, "acpgate/") || strings.Contains(fn, "net/http.(*conn).serve") || strings.Contains(fn, "coder/websocket") {
				name = fn // the outermost such frame wins: frames run leaf to root
			}
		}
	}
	flush()
	var out []perConn
	for k, v := range counts {
		if v >= n/2 {
			out = append(out, perConn{Name: k, PerConn: float64(v) / float64(n)})
		}
	}
	slices.SortFunc(out, func(a, b perConn) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// heapSites writes a heap profile and lists its largest in-use allocation
// sites (flat), per connection.
func heapSites(path string, n int) ([]perConn, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, nil // written, not analyzed
	}
	out, err := exec.Command(goBin, "tool", "pprof", "-sample_index=inuse_space", "-top", "-nodecount=12", path).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -top %s: %v", path, err)
	}
	var sites []perConn
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || f[0] == "flat" {
			continue
		}
		b, ok := parseSize(f[0])
		if !ok {
			continue
		}
		sites = append(sites, perConn{Name: strings.Join(f[5:], " "), PerConn: b / float64(n)})
	}
	return sites, nil
}

// parseSize reads pprof's sizes: 12.50MB, 512kB, 100B.
func parseSize(s string) (float64, bool) {
	units := []struct {
		suffix string
		mult   float64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(v, 64)
			return x * u.mult, err == nil
		}
	}
	return 0, false
}
