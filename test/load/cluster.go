package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The cluster scenario (issue #38): what a hop between replicas costs. Two
// replicas of the gateway (the binary, the load agent) share one Redis
// (Debian's redis-server, started here) and one session key. Replica a
// holds two sessions, each opened by an owner client that reads and drops
// what it gets. A client attaches to the first on replica a (direct), and
// another to the second through replica b (forwarded: b carries it over a
// session bridge to a). Both then run the same prompts, alternating, in
// one run: round trips (a prompt for no chunks, to its answer) and streams
// (a prompt for many 300 B chunks, timed from the prompt to its answer).
// The targets: the forwarded stream at least half the direct one, and the
// forwarded round trip at most 1 ms more at p99.

// clusterPath is what one path measured.
type clusterPath struct {
	RTT        []time.Duration `json:"-"`
	RTTP50us   float64         `json:"rtt_p50_us"`
	RTTP99us   float64         `json:"rtt_p99_us"`
	StreamRate []float64       `json:"stream_msgs_per_s"` // one per repetition
	MedianRate float64         `json:"stream_median_msgs_per_s"`
}

type clusterResult struct {
	RoundTrips int         `json:"round_trips"`
	Chunks     int         `json:"chunks"`
	Size       int         `json:"size"`
	Reps       int         `json:"reps"`
	Direct     clusterPath `json:"direct"`
	Forwarded  clusterPath `json:"forwarded"`
	AddedP50us float64     `json:"added_p50_us"`
	AddedP99us float64     `json:"added_p99_us"`
	RateRatio  float64     `json:"stream_ratio"` // forwarded / direct
	// The same over Streamable HTTP: a connection made on a, its POSTs and
	// its session's event stream through a (direct) or b (forwarded).
	DirectHTTP     clusterPath `json:"direct_http"`
	ForwardedHTTP  clusterPath `json:"forwarded_http"`
	AddedP50usHTTP float64     `json:"added_p50_us_http"`
	AddedP99usHTTP float64     `json:"added_p99_us_http"`
	RateRatioHTTP  float64     `json:"stream_ratio_http"`
	Forwards       float64     `json:"forwarded_total_b"`
}

// problems are the scenario's sanity failures: none beyond what
// runCluster returns as errors (chunks lost, no bridge opened). The
// targets are figures, printed, not checked: a loaded machine misses them.
func (r *clusterResult) problems() []string { return nil }

// targets says how the run compares with the targets.
func (r *clusterResult) targets() string {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	return fmt.Sprintf("targets (forwarded stream ≥ 0.5× direct; round trip ≤ +1 ms at p99): WebSocket %s, %s; HTTP %s, %s",
		met(r.RateRatio >= 0.5), met(r.AddedP99us <= 1000), met(r.RateRatioHTTP >= 0.5), met(r.AddedP99usHTTP <= 1000))
}

func (r *clusterResult) print(w io.Writer) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "\ncluster: a session on replica a, its client on a (direct) or on b (forwarded over a session bridge)\n")
	tw := newTable(w)
	fmt.Fprintf(tw, "path\tround trip p50\tp99\t%d B stream, msgs/s (median of %d)\n", r.Size, r.Reps)
	fmt.Fprintf(tw, "direct\t%.0f µs\t%.0f µs\t%.0f\n", r.Direct.RTTP50us, r.Direct.RTTP99us, r.Direct.MedianRate)
	fmt.Fprintf(tw, "forwarded\t%.0f µs\t%.0f µs\t%.0f\n", r.Forwarded.RTTP50us, r.Forwarded.RTTP99us, r.Forwarded.MedianRate)
	fmt.Fprintf(tw, "forwarded − direct\t%+.0f µs\t%+.0f µs\t%.2f×\n", r.AddedP50us, r.AddedP99us, r.RateRatio)
	fmt.Fprintf(tw, "direct (HTTP)\t%.0f µs\t%.0f µs\t%.0f\n", r.DirectHTTP.RTTP50us, r.DirectHTTP.RTTP99us, r.DirectHTTP.MedianRate)
	fmt.Fprintf(tw, "forwarded (HTTP)\t%.0f µs\t%.0f µs\t%.0f\n", r.ForwardedHTTP.RTTP50us, r.ForwardedHTTP.RTTP99us, r.ForwardedHTTP.MedianRate)
	fmt.Fprintf(tw, "forwarded − direct (HTTP)\t%+.0f µs\t%+.0f µs\t%.2f×\n", r.AddedP50usHTTP, r.AddedP99usHTTP, r.RateRatioHTTP)
	_ = tw.Flush()
	fmt.Fprintln(w, r.targets())
}

// startRedis runs redis-server on a free loopback port, in h.tmp.
func (h *harness) startRedis() (*exec.Cmd, int, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: redis-server not found (Debian: apt-get install redis-server): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, 0, err
	}
	dir := filepath.Join(h.tmp, "redis-"+strconv.Itoa(port))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	trackChild(cmd)
	s := &server{cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port)}
	if err := s.waitTCP(10 * time.Second); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		untrackChild(cmd)
		return nil, 0, err
	}
	return cmd, port, nil
}

func (h *harness) runCluster() (*clusterResult, error) {
	res := &clusterResult{RoundTrips: 2000, Chunks: 20000, Size: h.c.SmallSize, Reps: h.c.StreamReps}
	if h.quick {
		res.RoundTrips, res.Chunks = 300, 5000
	}
	redis, port, err := h.startRedis()
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = redis.Process.Kill()
		_ = redis.Wait()
		untrackChild(redis)
	}()
	key, err := exec.Command(h.gatewayBin, "keygen").Output()
	if err != nil {
		return nil, fmt.Errorf("cluster: acpgate keygen: %w", err)
	}
	keyFile := filepath.Join(h.tmp, "cluster-session.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return nil, err
	}
	gw := map[string]*server{}
	for _, name := range []string{"a", "b"} {
		cport, err := freePort()
		if err != nil {
			return nil, err
		}
		extra := fmt.Sprintf("session_key_file: %q\ncluster: {name: %s, store: \"redis://127.0.0.1:%d/0\", listen: \"127.0.0.1:%d\"}\n",
			keyFile, name, port, cport)
		s, err := h.startGateway(gwConfig{minIdle: 1, maxProcs: 2, perProc: 8, noRateLimit: true, extra: extra}, true)
		if err != nil {
			return nil, fmt.Errorf("cluster: replica %s: %w", name, err)
		}
		defer s.stop()
		gw[name] = s
	}

	// Two sessions on a, each with an owner that reads and drops.
	var sessions [2]string
	for i := range sessions {
		owner, err := h.clusterClient(gw["a"].url)
		if err != nil {
			return nil, err
		}
		defer owner.t.Close()
		if sessions[i], err = owner.newSession(); err != nil {
			return nil, err
		}
		go func() {
			for {
				if _, err := owner.t.Recv(); err != nil {
					return
				}
			}
		}()
	}
	direct, err := h.clusterClient(gw["a"].url)
	if err != nil {
		return nil, err
	}
	defer direct.t.Close()
	fwd, err := h.clusterClient(gw["b"].url)
	if err != nil {
		return nil, err
	}
	defer fwd.t.Close()
	for i, c := range []*rpcClient{direct, fwd} {
		if _, err := c.call("session/attach", map[string]any{"sessionId": sessions[i], "historyPolicy": "none"}); err != nil {
			return nil, fmt.Errorf("cluster: attach (%s): %w", []string{"direct", "forwarded"}[i], err)
		}
	}
	// Over HTTP: two connections made on a, each with a session of its own;
	// the second then sends everything (its POSTs, its session's stream)
	// through b.
	var httpSessions [2]string
	var httpClients [2]*rpcClient
	for i := range httpClients {
		t := newHTTPTransport(httpURL(gw["a"].url))
		defer t.Close()
		c := &rpcClient{t: t}
		if err := c.initialize(); err != nil {
			return nil, fmt.Errorf("cluster: HTTP: %w", err)
		}
		if httpSessions[i], err = c.newSession(); err != nil {
			return nil, fmt.Errorf("cluster: HTTP: %w", err)
		}
		if i == 1 {
			t.url = httpURL(gw["b"].url)
		}
		httpClients[i] = c
	}
	paths := []*clusterPath{&res.Direct, &res.Forwarded, &res.DirectHTTP, &res.ForwardedHTTP}
	clients := []*rpcClient{direct, fwd, httpClients[0], httpClients[1]}
	sids := []string{sessions[0], sessions[1], httpSessions[0], httpSessions[1]}
	prompt := func(c *rpcClient, sid string, chunks int) (time.Duration, int, error) {
		c.nextID++
		id := c.nextID
		msg := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":%q,"prompt":[{"type":"text","text":"chunks=%d size=%d"}]}}`,
			id, sid, chunks, res.Size)
		start := time.Now()
		if err := c.t.Send(msg); err != nil {
			return 0, 0, err
		}
		n := 0
		for {
			raw, err := c.t.Recv()
			if err != nil {
				return 0, n, err
			}
			if got, ok := parseID(raw); ok && got == int64(id) && !strings.Contains(string(raw[:min(len(raw), 64)]), `"method"`) {
				var r rpcResponse
				if err := json.Unmarshal(raw, &r); err != nil || r.Error != nil {
					return 0, n, fmt.Errorf("prompt: %.300s", raw)
				}
				return time.Since(start), n, nil
			}
			n++
		}
	}
	// Round trips, alternating paths in blocks of 50.
	for done := 0; done < res.RoundTrips; done += 50 {
		for p := range paths {
			for range 50 {
				d, _, err := prompt(clients[p], sids[p], 0)
				if err != nil {
					return nil, fmt.Errorf("cluster: round trip: %w", err)
				}
				paths[p].RTT = append(paths[p].RTT, d)
			}
		}
	}
	// Streams, alternating which path goes first.
	for rep := range res.Reps {
		order := []int{0, 1, 2, 3}
		if rep%2 == 1 {
			order = []int{3, 2, 1, 0}
		}
		for _, p := range order {
			d, n, err := prompt(clients[p], sids[p], res.Chunks)
			if err != nil {
				return nil, fmt.Errorf("cluster: stream: %w", err)
			}
			if n < res.Chunks {
				return nil, fmt.Errorf("cluster: stream: %d of %d chunks arrived", n, res.Chunks)
			}
			paths[p].StreamRate = append(paths[p].StreamRate, float64(n)/d.Seconds())
		}
	}
	for _, p := range paths {
		slices.Sort(p.RTT)
		p.RTTP50us = float64(p.RTT[len(p.RTT)/2].Microseconds())
		p.RTTP99us = float64(p.RTT[len(p.RTT)*99/100].Microseconds())
		rates := slices.Clone(p.StreamRate)
		slices.Sort(rates)
		p.MedianRate = rates[len(rates)/2]
	}
	res.AddedP50us = res.Forwarded.RTTP50us - res.Direct.RTTP50us
	res.AddedP99us = res.Forwarded.RTTP99us - res.Direct.RTTP99us
	res.RateRatio = res.Forwarded.MedianRate / res.Direct.MedianRate
	res.AddedP50usHTTP = res.ForwardedHTTP.RTTP50us - res.DirectHTTP.RTTP50us
	res.AddedP99usHTTP = res.ForwardedHTTP.RTTP99us - res.DirectHTTP.RTTP99us
	res.RateRatioHTTP = res.ForwardedHTTP.MedianRate / res.DirectHTTP.MedianRate
	if v, err := scrapeCounter("http://"+gw["b"].addr+"/metrics", "acpgate_cluster_forwarded_total"); err == nil {
		res.Forwards = float64(v)
		if v < 1 {
			return nil, fmt.Errorf("cluster: replica b opened no session bridge: the forwarded path was not forwarded")
		}
	}
	return res, nil
}

// clusterClient is an initialized WebSocket client of url.
func (h *harness) clusterClient(url string) (*rpcClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t, err := dialWS(ctx, url, []string{"acp"})
	if err != nil {
		return nil, fmt.Errorf("cluster: dial %s: %w", url, err)
	}
	c := &rpcClient{t: t}
	if err := c.initialize(); err != nil {
		t.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return c, nil
}
