package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	testharness "github.com/acpgate/acpgate/test/internal/harness"
)

// The fan-in scenario: many clients, one session each, sharing a few agent
// processes, doing echo round trips at a fixed total rate. It is open loop:
// every send time is fixed in advance (client i sends its k-th request at
// t0 + i/R + k·C/R for C clients at R round trips/s, whether or not its
// earlier requests were answered), and latency runs from the intended send
// time, so a stall shows up as latency instead of silently lowering the
// rate (no coordinated omission).

// faninEndpoint is one client's way to the agents: a WebSocket or
// Streamable HTTP (httpEndpoint) through the gateway, or a shared stdio pipe
// to one of the agent processes.
type faninEndpoint interface {
	send(msg []byte) error
}

type wsEndpoint struct{ t *wsTransport }

func (e wsEndpoint) send(msg []byte) error { return e.t.Send(msg) }

// pipeEndpoint writes one line per request to an agent's stdin, shared by
// the clients the agent serves.
type pipeEndpoint struct {
	mu *sync.Mutex
	w  io.Writer
}

func (e pipeEndpoint) send(msg []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err := e.w.Write(append(msg, '\n'))
	return err
}

// faninClient is one client: its session and the latencies of the current
// step.
type faninClient struct {
	idx int
	ep  faninEndpoint
	sid string

	mu       sync.Mutex
	step     *faninStep
	lat      []time.Duration // by request index; 0 = not answered
	sent     []time.Time     // when each request actually went out
	answered int
	stray    int             // answers to no request of the step
	svc      []time.Duration // latencies from the actual send times
}

// faninStep is one run at one rate.
type faninStep struct {
	id      int64
	rate    int
	clients int
	t0      time.Time
	perConn int // requests per client
}

// intended is when request k of a client is due: requests are spread evenly,
// request j = k·clients + client of the step at t0 + j/rate.
func (s *faninStep) intended(client, k int) time.Time {
	j := int64(k)*int64(s.clients) + int64(client)
	return s.t0.Add(time.Duration(j * int64(time.Second) / int64(s.rate)))
}

// The request id carries the step, the request index and the client, so
// that answers can be told apart even over a shared pipe.
func reqID(step int64, k, client int) int64 {
	return (step*1_000_000_000+int64(k))*1000 + int64(client)
}

func splitID(id int64) (step int64, k, client int) {
	return id / 1000 / 1_000_000_000, int(id / 1000 % 1_000_000_000), int(id % 1000)
}

// deliver records an answer; an error answer counts as answered and as an
// error.
func (c *faninClient) deliver(f *faninFleet, msg []byte, at time.Time) {
	id, ok := parseID(msg)
	if !ok {
		f.fail(fmt.Errorf("a message that is not an answer: %.200s", msg))
		return
	}
	if bytes.Contains(msg, []byte(`"error":`)) && !bytes.Contains(msg, []byte(`"result":`)) {
		f.fail(fmt.Errorf("error answer: %.300s", msg))
	}
	step, k, _ := splitID(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.step == nil || step != c.step.id || k < 0 || k >= len(c.lat) || c.lat[k] != 0 {
		c.stray++
		return
	}
	c.lat[k] = max(at.Sub(c.step.intended(c.idx, k)), 1)
	if !c.sent[k].IsZero() {
		c.svc = append(c.svc, at.Sub(c.sent[k]))
	}
	c.answered++
}

// faninFleet is the clients of one path.
type faninFleet struct {
	name    string
	echo    string // the extension method
	clients []*faninClient
	errs    atomic.Int64
	lastErr atomic.Value
	closers []func()
	nextID  int64
	// cpu measures the processes that serve the path (the gateway; the
	// agents): before and after each step.
	serverPIDs func() []int
	agentPIDs  func() []int
}

func (f *faninFleet) fail(err error) {
	f.errs.Add(1)
	f.lastErr.Store(err.Error())
}

func (f *faninFleet) close() {
	for i := len(f.closers) - 1; i >= 0; i-- {
		f.closers[i]()
	}
}

// faninRun is the outcome of one step.
type faninRun struct {
	Rate      int     `json:"rate"`
	Seconds   float64 `json:"seconds"`
	Sent      int     `json:"sent"`
	Answered  int     `json:"answered"`
	Missing   int     `json:"missing"`
	Errors    int     `json:"errors"`
	LastError string  `json:"last_error,omitempty"`
	Latency   dist    `json:"latency"` // from the intended send time, after the warm-up
	// CPU per round trip over the whole step (warm-up included).
	ServerCPUUS float64 `json:"server_cpu_us_per_rt"`
	AgentCPUUS  float64 `json:"agent_cpu_us_per_rt"`
	ClientCPUUS float64 `json:"client_cpu_us_per_rt"` // the harness: clients and dispatcher
	// How late the dispatcher sent, after its intended times: the
	// harness's own error, included in Latency.
	SendLateness dist `json:"send_lateness"`
	// Latency from the actual send time (the warm-up included): Latency
	// without the dispatcher's lateness.
	FromSend   dist `json:"latency_from_send"`
	samples    []time.Duration
	svcSamples []time.Duration
}

// run sends at rate for warmup+dur and collects the answers (waiting at most
// grace after the last send).
func (f *faninFleet) run(rate int, warmup, dur time.Duration) faninRun {
	n := len(f.clients)
	f.nextID++
	total := warmup + dur
	perConn := max(int(int64(rate)*int64(total)/int64(time.Second)/int64(n)), 1)
	s := &faninStep{id: f.nextID, rate: rate, clients: n, perConn: perConn}
	s.t0 = time.Now().Add(20 * time.Millisecond)
	for _, c := range f.clients {
		c.mu.Lock()
		c.step, c.lat, c.sent, c.svc, c.answered = s, make([]time.Duration, perConn), make([]time.Time, perConn), nil, 0
		c.mu.Unlock()
	}
	var srv, agt []int
	if f.serverPIDs != nil {
		srv = f.serverPIDs()
	}
	if f.agentPIDs != nil {
		agt = f.agentPIDs()
	}
	s0, a0 := cpuOf(srv), cpuOf(agt)
	errs0 := f.errs.Load()
	// A sender stuck in a write past the step (and a generous margin) is
	// a failure: the connections are closed, which unblocks it.
	stuck := time.AfterFunc(total+60*time.Second, func() {
		f.fail(fmt.Errorf("step at %d rt/s: senders stuck; closing the connections", rate))
		f.close()
	})
	defer stuck.Stop()
	c0 := selfCPU()
	late := f.dispatch(s)
	r := faninRun{Rate: rate, Seconds: dur.Seconds()}
	r.SendLateness = summarize(late)
	// Wait for the answers, for at most the grace period.
	grace := 2*time.Second + dur/2
	deadline := time.Now().Add(grace)
	want := perConn * n
	for time.Now().Before(deadline) {
		got := 0
		for _, c := range f.clients {
			c.mu.Lock()
			got += c.answered
			c.mu.Unlock()
		}
		if got == want {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.Sent, r.Errors = want, int(f.errs.Load()-errs0)
	if v, ok := f.lastErr.Load().(string); ok && r.Errors > 0 {
		r.LastError = v
	}
	cut := s.t0.Add(warmup)
	var svc []time.Duration
	for _, c := range f.clients {
		c.mu.Lock()
		svc = append(svc, c.svc...) // warm-up included
		for k, l := range c.lat {
			if l == 0 {
				r.Missing++
				continue
			}
			r.Answered++
			if !s.intended(c.idx, k).Before(cut) {
				r.samples = append(r.samples, l)
			}
		}
		c.step, c.lat, c.sent, c.svc = nil, nil, nil, nil // late answers are strays
		c.mu.Unlock()
	}
	if want > 0 {
		r.ServerCPUUS = float64((cpuOf(srv) - s0).Microseconds()) / float64(want)
		r.AgentCPUUS = float64((cpuOf(agt) - a0).Microseconds()) / float64(want)
		r.ClientCPUUS = float64((selfCPU() - c0).Microseconds()) / float64(want)
	}
	r.Latency = summarize(append([]time.Duration(nil), r.samples...))
	r.svcSamples = svc
	r.FromSend = summarize(append([]time.Duration(nil), svc...))
	return r
}

// gatewayFleet connects n clients to the gateway, one session each, over
// mode: "ws" (a WebSocket each) or "http" (Streamable HTTP: each client
// has its own keep-alive connections, its connection's and its session's
// SSE streams, and POSTs its requests).
func (h *harness) gatewayFleet(gw *server, n int, mode string) (*faninFleet, error) {
	f := &faninFleet{name: "gateway", echo: h.echo,
		serverPIDs: func() []int { return []int{gw.Pid()} },
		agentPIDs:  func() []int { return descendants(gw.Pid()) }}
	if mode == "http" {
		f.name += httpSuffix
	}
	f.clients = make([]*faninClient, n)
	var mu sync.Mutex
	var firstErr error
	testharness.Bounded(n, 16, func(i int) {
		var (
			t   transport
			err error
		)
		if mode == "http" {
			t = newHTTPTransport(httpURL(gw.url))
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			t, err = dialWS(ctx, gw.url, []string{"acp"})
			cancel()
		}
		if err == nil {
			stop := time.AfterFunc(30*time.Second, func() { t.Close() })
			c := &rpcClient{t: t}
			if err = c.initialize(); err == nil {
				var sid string
				if sid, err = c.newSession(); err == nil {
					var ep faninEndpoint
					switch t := t.(type) {
					case *httpTransport:
						var e *httpEndpoint
						if e, err = newHTTPEndpoint(t, sid, h.httpClient != "nethttp", f.fail); err == nil {
							ep = e
							mu.Lock()
							f.closers = append(f.closers, e.close)
							mu.Unlock()
						}
					case *wsTransport:
						ep = wsEndpoint{t}
					}
					f.clients[i] = &faninClient{idx: i, ep: ep, sid: sid}
				}
			}
			if !stop.Stop() {
				err = errors.New("setup timed out")
			}
			mu.Lock()
			f.closers = append(f.closers, func() { t.Close() })
			mu.Unlock()
		}
		if err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = fmt.Errorf("client %d: %w", i, err)
			}
			mu.Unlock()
		}
	})
	if firstErr != nil {
		f.close()
		return nil, firstErr
	}
	for _, c := range f.clients {
		if e, ok := c.ep.(*httpEndpoint); ok {
			// The session stream's reader delivers as it reads.
			deliver := func(msg []byte) { c.deliver(f, msg, time.Now()) }
			e.t.onMessage.Store(&deliver)
			continue
		}
		t := c.ep.(wsEndpoint).t
		go func() {
			for range 1 << 40 { // until the connection is closed
				msg, err := t.Recv()
				if err != nil {
					return
				}
				c.deliver(f, msg, time.Now())
			}
		}()
	}
	return f, nil
}

// directFleet runs procs agents and multiplexes the n clients' sessions over
// their stdio, packed like the gateway packs them (perProc sessions on the
// first agent, then the next), with no gateway in between.
func (h *harness) directFleet(n, procs, perProc int) (*faninFleet, error) {
	f := &faninFleet{name: "direct", echo: h.echo}
	var agents []*stdioTransport
	f.agentPIDs = func() []int {
		var pids []int
		for _, a := range agents {
			pids = append(pids, a.Pid())
		}
		return pids
	}
	f.clients = make([]*faninClient, n)
	for p := 0; p < procs && p*perProc < n; p++ {
		a, err := startStdio([]string{h.exe, "agent"})
		if err != nil {
			f.close()
			return nil, err
		}
		agents = append(agents, a)
		f.closers = append(f.closers, func() { a.Close() })
		c := &rpcClient{t: a}
		watchdog := time.AfterFunc(30*time.Second, func() { _ = a.cmd.Process.Kill() })
		if err := c.initialize(); err != nil {
			f.close()
			return nil, err
		}
		ep := pipeEndpoint{mu: &sync.Mutex{}, w: a.in}
		lo, hi := p*perProc, min((p+1)*perProc, n)
		if p == procs-1 {
			hi = n // the last agent takes the rest
		}
		for i := lo; i < hi; i++ {
			sid, err := c.newSession()
			if err != nil {
				f.close()
				return nil, err
			}
			f.clients[i] = &faninClient{idx: i, ep: ep, sid: sid}
		}
		if !watchdog.Stop() {
			f.close()
			return nil, errors.New("direct agents: setup timed out")
		}
		go func() {
			for range 1 << 40 { // until the agent exits
				msg, err := a.Recv()
				if err != nil {
					return
				}
				now := time.Now()
				if id, ok := parseID(msg); ok {
					if _, _, ci := splitID(id); ci >= 0 && ci < n {
						f.clients[ci].deliver(f, msg, now)
					}
				}
			}
		}()
	}
	return f, nil
}

// faninResult is the scenario's outcome.
type faninResult struct {
	Conns   int `json:"conns"`
	Procs   int `json:"processes"`
	PerProc int `json:"sessions_per_process"`
	Rate    int `json:"rate"`
	// At the fixed rate, all repetitions pooled.
	Gateway faninRun `json:"gateway"`
	Direct  faninRun `json:"direct"`
	// Gateway minus direct, per percentile (µs).
	AddedP50  float64 `json:"added_p50_us"`
	AddedP99  float64 `json:"added_p99_us"`
	AddedP999 float64 `json:"added_p999_us"`
	// The same at p99 from the actual send times.
	AddedFromSendP99 float64 `json:"added_p99_from_send_us"`
	// Rate search: each step, and the highest rate with p99 under target
	// and every request answered.
	TargetP99US    float64    `json:"target_p99_us"`
	GatewaySteps   []faninRun `json:"gateway_steps"`
	DirectSteps    []faninRun `json:"direct_steps"`
	GatewayMaxRate int        `json:"gateway_max_rate"`
	DirectMaxRate  int        `json:"direct_max_rate"`
	Stray          int        `json:"stray_answers"` // during the fixed-rate runs
	// Transports are the gateway paths' transports: "ws" (Gateway,
	// Added*, GatewaySteps, GatewayMaxRate) and "http" (HTTP). Results
	// from before there was an HTTP path have none: "ws".
	Transports []string   `json:"transports,omitempty"`
	HTTP       *faninHTTP `json:"gateway_http,omitempty"`
	// With -tracing: a gateway with tracing on (every request a sampled
	// span, exported to a collector that drops them), WebSocket clients,
	// at the fixed rate; and it minus the untraced gateway (µs).
	Traced            *faninRun `json:"gateway_traced,omitempty"`
	TracingAddedP50   float64   `json:"tracing_added_p50_us,omitempty"`
	TracingAddedP99   float64   `json:"tracing_added_p99_us,omitempty"`
	TracingAddedCPUUS float64   `json:"tracing_added_cpu_us,omitempty"`
}

// faninHTTP is the gateway over Streamable HTTP (a POST per request, the
// answers on each client's session SSE stream), measured as the WebSocket
// path is, with a gateway of its own: the fixed rate (pooled; minus direct
// per percentile, in µs), then the rate search.
type faninHTTP struct {
	// Client is how the clients POST (-http-client): "lean" (each writes
	// its POSTs on a keep-alive connection and reads the answers itself)
	// or "nethttp" (Go's http.Client).
	Client           string     `json:"client"`
	Gateway          faninRun   `json:"gateway"`
	AddedP50         float64    `json:"added_p50_us"`
	AddedP99         float64    `json:"added_p99_us"`
	AddedP999        float64    `json:"added_p999_us"`
	AddedFromSendP99 float64    `json:"added_p99_from_send_us"`
	Steps            []faninRun `json:"steps"`
	MaxRate          int        `json:"max_rate"`
}

// hasWS reports whether the WebSocket gateway path ran.
func (r *faninResult) hasWS() bool {
	return len(r.Transports) == 0 || slices.Contains(r.Transports, "ws")
}

func (r *faninResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	check := func(name string, x faninRun) {
		if x.Sent == 0 || x.Answered != x.Sent || x.Errors > 0 || x.Latency.N == 0 {
			out = append(out, fmt.Sprintf("fanin %s at %d rt/s: sent %d, answered %d, errors %d %s", name, x.Rate, x.Sent, x.Answered, x.Errors, x.LastError))
		}
	}
	if r.hasWS() {
		check("gateway", r.Gateway)
	}
	if r.HTTP != nil {
		check("gateway"+httpSuffix, r.HTTP.Gateway)
	}
	if r.Traced != nil {
		check("gateway"+tracingOnName, *r.Traced)
	}
	check("direct", r.Direct)
	if r.Stray > 0 {
		out = append(out, fmt.Sprintf("fanin: %d answers matched no request", r.Stray))
	}
	return out
}

func pass(x faninRun, target time.Duration) bool {
	return x.Sent > 0 && x.Missing == 0 && x.Errors == 0 && x.Latency.P99 < float64(target.Microseconds())
}

func (h *harness) runFanin() (*faninResult, error) {
	c := h.c
	res := &faninResult{Conns: c.FaninConns, Procs: c.FaninProcs, PerProc: c.FaninPerProc, Rate: c.FaninRate,
		TargetP99US: float64(c.FaninP99Target.Microseconds()), Transports: h.transports}
	if c.FaninConns > 999 {
		return nil, errors.New("fanin: at most 999 clients (request ids carry the client number)")
	}
	// The per-connection message rate limit is off: this measures capacity.
	// Each transport has a gateway of its own, so that each has the pool
	// to itself.
	cfg := gwConfig{minIdle: 1, maxProcs: c.FaninProcs, perProc: c.FaninPerProc, noRateLimit: true}
	var stops []func() // run last first when this returns
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	// gatewayPath starts, if the run uses transport mode, a gateway and
	// its fleet of clients on mode (what names the clients in an error).
	gatewayPath := func(mode, what string, cfg gwConfig) (*server, *faninFleet, error) {
		if !h.uses(mode) {
			return nil, nil, nil
		}
		srv, err := h.startGateway(cfg, true)
		if err != nil {
			return nil, nil, err
		}
		stops = append(stops, srv.stop)
		f, err := h.gatewayFleet(srv, c.FaninConns, mode)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		stops = append(stops, f.close)
		return srv, f, nil
	}
	gw, gf, err := gatewayPath("ws", "gateway clients", cfg)
	if err != nil {
		return nil, err
	}
	hgw, hf, err := gatewayPath("http", "gateway clients over HTTP", cfg)
	if err != nil {
		return nil, err
	}
	var tf *faninFleet // -tracing: the WebSocket path again, traced
	if h.tracing && gf != nil {
		collector, err := startNullCollector()
		if err != nil {
			return nil, err
		}
		stops = append(stops, collector.Close)
		traced := cfg
		traced.traceTo = "http://" + collector.Listener.Addr().String()
		if _, tf, err = gatewayPath("ws", "traced gateway clients", traced); err != nil {
			return nil, err
		}
	}
	if hf != nil {
		res.HTTP = &faninHTTP{Client: h.httpClient}
	}
	df, err := h.directFleet(c.FaninConns, c.FaninProcs, c.FaninPerProc)
	if err != nil {
		return nil, fmt.Errorf("direct clients: %w", err)
	}
	defer df.close()
	for _, g := range []struct {
		f   *faninFleet
		srv *server
	}{{gf, gw}, {hf, hgw}} {
		if g.f != nil {
			fmt.Fprintf(h.log, "load: fanin: %d clients connected to the %s path; its gateway runs %d agent processes\n",
				c.FaninConns, g.f.name, len(h.agentPIDs(g.srv.Pid())))
		}
	}

	// A short warm-up of every path, then the fixed rate, the paths
	// interleaved, repetitions pooled.
	fleets := []*faninFleet{}
	for _, f := range []*faninFleet{gf, hf, tf, df} {
		if f != nil {
			fleets = append(fleets, f)
		}
	}
	for _, f := range fleets {
		f.run(c.FaninRate, 0, c.FaninWarmup)
	}
	pooled := make([]faninRun, len(fleets))
	samples := make([][]time.Duration, len(fleets))
	svc := make([][]time.Duration, len(fleets))
	for rep := 0; rep < c.FaninReps; rep++ {
		fmt.Fprintf(h.log, "load: fanin %d rt/s, run %d\n", c.FaninRate, rep+1)
		for i, f := range fleets {
			x := f.run(c.FaninRate, c.FaninWarmup, c.FaninDuration)
			samples[i], svc[i] = append(samples[i], x.samples...), append(svc[i], x.svcSamples...)
			pooled[i] = mergeRuns(pooled[i], x, rep)
		}
	}
	for i, f := range fleets {
		x := pooled[i]
		x.Latency, x.FromSend = summarize(samples[i]), summarize(svc[i])
		x.samples, x.svcSamples = nil, nil // summarized: let them go
		switch f {
		case gf:
			res.Gateway = x
		case hf:
			res.HTTP.Gateway = x
		case tf:
			res.Traced = &x
		case df:
			res.Direct = x
		}
	}
	samples, svc = nil, nil
	if gf != nil {
		res.AddedFromSendP99 = res.Gateway.FromSend.P99 - res.Direct.FromSend.P99
		res.AddedP50 = res.Gateway.Latency.P50 - res.Direct.Latency.P50
		res.AddedP99 = res.Gateway.Latency.P99 - res.Direct.Latency.P99
		res.AddedP999 = res.Gateway.Latency.P999 - res.Direct.Latency.P999
	}
	if x := res.Traced; x != nil {
		res.TracingAddedP50 = x.Latency.P50 - res.Gateway.Latency.P50
		res.TracingAddedP99 = x.Latency.P99 - res.Gateway.Latency.P99
		res.TracingAddedCPUUS = x.ServerCPUUS - res.Gateway.ServerCPUUS
	}
	if x := res.HTTP; x != nil {
		x.AddedFromSendP99 = x.Gateway.FromSend.P99 - res.Direct.FromSend.P99
		x.AddedP50 = x.Gateway.Latency.P50 - res.Direct.Latency.P50
		x.AddedP99 = x.Gateway.Latency.P99 - res.Direct.Latency.P99
		x.AddedP999 = x.Gateway.Latency.P999 - res.Direct.Latency.P999
	}

	// Rate search, each path on its own (an overloaded step leaves a
	// backlog, so a path's search ends at its first failure).
	search := func(f *faninFleet, steps *[]faninRun) int {
		best, fail := 0, 0
		for _, rate := range c.FaninSteps {
			fmt.Fprintf(h.log, "load: fanin %s rate search: %d rt/s\n", f.name, rate)
			x := f.run(rate, c.FaninWarmup, c.FaninStepDur)
			*steps = append(*steps, x)
			if !pass(x, c.FaninP99Target) {
				fail = rate
				break
			}
			best = rate
		}
		for range c.FaninRefine {
			if fail == 0 || fail-best <= max(best/20, 100) {
				break
			}
			time.Sleep(time.Second) // let a failed step's backlog drain
			rate := (best + fail) / 2
			fmt.Fprintf(h.log, "load: fanin %s rate search: %d rt/s\n", f.name, rate)
			x := f.run(rate, c.FaninWarmup, c.FaninStepDur)
			*steps = append(*steps, x)
			if pass(x, c.FaninP99Target) {
				best = rate
			} else {
				fail = rate
			}
		}
		return best
	}
	// Answers matching no request, so far: there should be none. (In the
	// rate search, answers that come after a failed step's grace period
	// are expected strays, so it is not counted.)
	for _, f := range fleets {
		for _, cl := range f.clients {
			cl.mu.Lock()
			res.Stray += cl.stray
			cl.mu.Unlock()
		}
	}
	// A gateway's backlog must not load the next path's search: each
	// gateway stops when its search is done.
	if gf != nil {
		res.GatewayMaxRate = search(gf, &res.GatewaySteps)
		gf.close()
		gw.stop()
	}
	if hf != nil {
		res.HTTP.MaxRate = search(hf, &res.HTTP.Steps)
		hf.close()
		hgw.stop()
	}
	res.DirectMaxRate = search(df, &res.DirectSteps)
	steps := [][]faninRun{res.GatewaySteps, res.DirectSteps}
	if res.HTTP != nil {
		steps = append(steps, res.HTTP.Steps)
	}
	for _, steps := range steps {
		for i := range steps {
			steps[i].samples, steps[i].svcSamples = nil, nil
		}
	}
	return res, nil
}

func mergeRuns(acc, x faninRun, rep int) faninRun {
	if rep == 0 {
		return x
	}
	acc.Seconds += x.Seconds
	acc.Sent += x.Sent
	acc.Answered += x.Answered
	acc.Missing += x.Missing
	acc.Errors += x.Errors
	if x.LastError != "" {
		acc.LastError = x.LastError
	}
	acc.ServerCPUUS = (acc.ServerCPUUS*float64(rep) + x.ServerCPUUS) / float64(rep+1)
	acc.AgentCPUUS = (acc.AgentCPUUS*float64(rep) + x.AgentCPUUS) / float64(rep+1)
	acc.ClientCPUUS = (acc.ClientCPUUS*float64(rep) + x.ClientCPUUS) / float64(rep+1)
	acc.SendLateness.P99 = max(acc.SendLateness.P99, x.SendLateness.P99)
	return acc
}

func (r *faninResult) print(w io.Writer) {
	if r.HTTP == nil {
		fmt.Fprintf(w, "\nFANIN: %d WebSocket clients, one session each, %d agent processes (≤ %d sessions each), open-loop echo round trips\n",
			r.Conns, r.Procs, r.PerProc)
	} else {
		client := "each client writes its POSTs on a keep-alive connection of its own and reads the answers itself"
		if r.HTTP.Client == "nethttp" {
			client = "the clients POST with Go's http.Client"
		}
		fmt.Fprintf(w, "\nFANIN: %d clients per gateway path, one session each, %d agent processes (≤ %d sessions each), open-loop echo round trips\n"+
			"(\"gateway\": WebSocket clients; \"gateway (HTTP)\": Streamable HTTP clients, a POST per request, the answers on each session's SSE stream;\n"+
			"%s (-http-client %s); each path has a gateway of its own)\n",
			r.Conns, r.Procs, r.PerProc, client, r.HTTP.Client)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "rate\tpath\tround trips\tp50\tp99\tp99.9\tmax\tCPU/rt: gateway\tagents\tclients\tsend late p99\t")
	row := func(name string, x faninRun) {
		srv := fmt.Sprintf("%.1f µs", x.ServerCPUUS)
		if name == "direct" {
			srv = "-"
		}
		fmt.Fprintf(tw, "%d/s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f µs\t%.1f µs\t%s\t\n", x.Rate, name, x.Latency.N, fmtUS(x.Latency.P50), fmtUS(x.Latency.P99),
			fmtUS(x.Latency.P999), fmtUS(x.Latency.Max), srv, x.AgentCPUUS, x.ClientCPUUS, fmtUS(x.SendLateness.P99))
	}
	row("direct", r.Direct)
	if r.hasWS() {
		row("gateway", r.Gateway)
		fmt.Fprintf(tw, "\tgateway − direct\t\t%s\t%s\t%s\t\t\t\t\t\t\n", fmtUS(r.AddedP50), fmtUS(r.AddedP99), fmtUS(r.AddedP999))
	}
	if x := r.HTTP; x != nil {
		row("gateway"+httpSuffix, x.Gateway)
		fmt.Fprintf(tw, "\tgateway (HTTP) − direct\t\t%s\t%s\t%s\t\t\t\t\t\t\n", fmtUS(x.AddedP50), fmtUS(x.AddedP99), fmtUS(x.AddedP999))
	}
	if x := r.Traced; x != nil {
		row("gateway"+tracingOnName, *x)
		fmt.Fprintf(tw, "\tgateway%s − gateway\t\t%s\t%s\t\t\t%+.1f µs\t\t\t\t\n", tracingOnName, fmtUS(r.TracingAddedP50), fmtUS(r.TracingAddedP99), r.TracingAddedCPUUS)
	}
	tw.Flush()
	if r.hasWS() {
		fmt.Fprintf(w, "from the actual send times (without the harness's sending delay): p50 direct %s, gateway %s; p99 direct %s, gateway %s (%+.0f µs)\n",
			fmtUS(r.Direct.FromSend.P50), fmtUS(r.Gateway.FromSend.P50), fmtUS(r.Direct.FromSend.P99), fmtUS(r.Gateway.FromSend.P99), r.AddedFromSendP99)
	}
	if x := r.HTTP; x != nil {
		fmt.Fprintf(w, "from the actual send times, over HTTP (the dispatcher queues each request for its client's POST): p50 %s, p99 %s (%+.0f µs against direct)\n",
			fmtUS(x.Gateway.FromSend.P50), fmtUS(x.Gateway.FromSend.P99), x.AddedFromSendP99)
	}
	fmt.Fprintf(w, "\nrate search (p99 < %s, every request answered):\n", fmtUS(r.TargetP99US))
	tw = newTable(w)
	fmt.Fprintln(tw, "path\trate\tp50\tp99\tp99.9\tmissing\tCPU/rt: gateway\tagents\tclients\tsend late p99\tresult\t")
	type pathSteps struct {
		name  string
		steps []faninRun
	}
	var paths []pathSteps
	if r.hasWS() {
		paths = append(paths, pathSteps{"gateway", r.GatewaySteps})
	}
	if r.HTTP != nil {
		paths = append(paths, pathSteps{"gateway" + httpSuffix, r.HTTP.Steps})
	}
	for _, s := range append(paths, pathSteps{"direct", r.DirectSteps}) {
		for _, x := range s.steps {
			verdict := "ok"
			if !pass(x, time.Duration(r.TargetP99US)*time.Microsecond) {
				verdict = "FAIL"
			}
			srv := fmt.Sprintf("%.1f µs", x.ServerCPUUS)
			if s.name == "direct" {
				srv = "-"
			}
			fmt.Fprintf(tw, "%s\t%d/s\t%s\t%s\t%s\t%d\t%s\t%.1f µs\t%.1f µs\t%s\t%s\t\n", s.name, x.Rate, fmtUS(x.Latency.P50), fmtUS(x.Latency.P99),
				fmtUS(x.Latency.P999), x.Missing, srv, x.AgentCPUUS, x.ClientCPUUS, fmtUS(x.SendLateness.P99), verdict)
		}
	}
	tw.Flush()
	switch {
	case r.HTTP == nil:
		fmt.Fprintf(w, "highest rate sustained: gateway %d rt/s, direct %d rt/s\n", r.GatewayMaxRate, r.DirectMaxRate)
	case r.hasWS():
		fmt.Fprintf(w, "highest rate sustained: gateway %d rt/s, gateway (HTTP) %d rt/s, direct %d rt/s\n", r.GatewayMaxRate, r.HTTP.MaxRate, r.DirectMaxRate)
	default:
		fmt.Fprintf(w, "highest rate sustained: gateway (HTTP) %d rt/s, direct %d rt/s\n", r.HTTP.MaxRate, r.DirectMaxRate)
	}
}

// dispatch sends every request of the step at its intended time and
// returns how late each went out. One goroutine, locked to its thread,
// sleeps with nanosleep at 1 ns timer slack: Go's own timers wake up to a
// millisecond late in a mostly idle process (the netpoller waits in whole
// milliseconds), which would swamp the latencies measured. A client whose
// connection failed is skipped from then on.
func (f *faninFleet) dispatch(s *faninStep) []time.Duration {
	done := make(chan []time.Duration, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// PR_SET_TIMERSLACK (29): this thread's sleeps end on time.
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, 29, 1, 0)
		n := len(f.clients)
		late := make([]time.Duration, 0, n*s.perConn)
		dead := make([]bool, n)
		buf := make([]byte, 0, 256)
		for j := 0; j < n*s.perConn; j++ {
			i, k := j%n, j/n
			c := f.clients[i]
			due := s.intended(i, k)
			// Signals (Go's preemption) cut a sleep short: sleep again, a
			// bounded number of times.
			for try := 0; try < 100; try++ {
				d := time.Until(due)
				if d <= 0 {
					break
				}
				ts := syscall.NsecToTimespec(d.Nanoseconds())
				_ = syscall.Nanosleep(&ts, nil)
			}
			late = append(late, max(time.Since(due), 0))
			if dead[i] {
				continue
			}
			buf = append(buf[:0], `{"jsonrpc":"2.0","id":`...)
			buf = strconv.AppendInt(buf, reqID(s.id, k, i), 10)
			buf = append(buf, `,"method":"`...)
			buf = append(buf, f.echo...)
			buf = append(buf, `","params":{"sessionId":`...)
			buf = strconv.AppendQuote(buf, c.sid)
			buf = append(buf, `,"pad":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}`...)
			c.mu.Lock()
			c.sent[k] = time.Now()
			c.mu.Unlock()
			if err := c.ep.send(buf); err != nil {
				f.fail(err)
				dead[i] = true
			}
		}
		done <- late
	}()
	return <-done
}
