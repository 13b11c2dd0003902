package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// --- the client process: `load stream-client` ---

// streamRun is what one client measured over one prompt: from sending the
// prompt to receiving its answer, after every chunk.
type streamRun struct {
	Msgs      int      `json:"msgs"`
	Bytes     int64    `json:"bytes"`
	ElapsedNS int64    `json:"elapsed_ns"`
	FirstNS   int64    `json:"first_msg_ns"` // time to the first chunk
	ClientCPU int64    `json:"client_cpu_ns"`
	InOrder   bool     `json:"in_order"`
	Errors    []string `json:"errors,omitempty"`
}

type streamReady struct {
	Ready    bool   `json:"ready"`
	AgentPID int    `json:"agent_pid,omitempty"`
	Session  string `json:"session"`
	Error    string `json:"error,omitempty"`
}

func (r streamReady) setUp() (bool, string) { return r.Ready, r.Error }

// streamClientMain connects (WebSocket URL, Streamable HTTP URL, or the
// agent over stdio), initializes, opens a session, says it is ready, waits
// for "go" on stdin, streams one prompt, prints the streamRun, and waits
// for stdin to end.
// Running the client in its own process keeps its CPU time and its
// goroutines apart from the gateway's and the harness's.
func streamClientMain(args []string) int {
	fs := flag.NewFlagSet("load stream-client", flag.ContinueOnError)
	mode := fs.String("mode", "ws", "ws, http or stdio")
	url := fs.String("url", "", "WebSocket URL (ws) or the gateway's http://…/acp (http)")
	sub := fs.String("subprotocol", "", "WebSocket subprotocol to offer")
	chunks := fs.Int("chunks", 1000, "chunks to ask for")
	size := fs.Int("size", 300, "bytes per chunk")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	exitAfter("stream-client", *timeout) // the stdio agent dies with us (parent-death signal)
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(streamReady{Error: err.Error()})
		return 1
	}
	var (
		t   transport
		pid int
		err error
	)
	switch *mode {
	case "ws":
		var subs []string
		if *sub != "" {
			subs = []string{*sub}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t, err = dialWS(ctx, *url, subs)
		cancel()
	case "http":
		// Connected by initialize: its POST opens the connection, and
		// session/new's answer opens the session's stream.
		t = newHTTPTransport(*url)
	case "stdio":
		exe, _ := os.Executable()
		var st *stdioTransport
		st, err = startStdio([]string{exe, "agent"})
		if err == nil {
			t, pid = st, st.Pid()
		}
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		return fail(err)
	}
	defer t.Close()
	c := &rpcClient{t: t}
	if err := c.initialize(); err != nil {
		return fail(err)
	}
	sid, err := c.newSession()
	if err != nil {
		return fail(err)
	}
	if err := out.Encode(streamReady{Ready: true, AgentPID: pid, Session: sid}); err != nil {
		return 1
	}
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "go" {
		return 1
	}
	res := streamOnce(t, sid, *chunks, *size)
	if err := out.Encode(res); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, in) // until the harness is done measuring
	return 0
}

// streamOnce sends one prompt and reads its chunks and its answer, checking
// that each chunk is for the session and carries the next sequence number.
func streamOnce(t transport, sid string, n, size int) (r streamRun) {
	cc := chunkCheck{n: n}
	fail := cc.fail
	defer func() { r.Msgs, r.Bytes, r.Errors = cc.msgs, cc.bytes, cc.errors }()
	const promptID = 1000
	prompt := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":%s,"prompt":[{"type":"text","text":"chunks=%d size=%d"}]}}`,
		promptID, strconv.Quote(sid), n, size)
	prefix := []byte(chunkPrefix + strconv.Quote(sid))
	textKey := []byte(`"text":"`)
	cpu0 := selfCPU()
	start := time.Now()
	if err := t.Send(prompt); err != nil {
		fail("send prompt: %v", err)
		return r
	}
	done := false
	for i := 0; i < n+1000 && !done; i++ {
		msg, err := t.Recv()
		if err != nil {
			fail("after %d chunks: %v", cc.msgs, err)
			break
		}
		if bytes.HasPrefix(msg, prefix) {
			j := bytes.Index(msg[len(prefix):], textKey)
			seq := -1
			if j >= 0 {
				seq = chunkSeq(msg[len(prefix)+j+len(textKey):])
			}
			cc.chunk(msg, seq)
			continue
		}
		if id, ok := parseID(msg); ok && id == promptID {
			done = true
			if !bytes.Contains(msg, []byte(`"stopReason":"end_turn"`)) {
				fail("prompt answered %.300s", msg)
			}
			continue
		}
		fail("unexpected message %.300s", msg)
	}
	r.ElapsedNS = time.Since(start).Nanoseconds()
	r.ClientCPU = (selfCPU() - cpu0).Nanoseconds()
	if cc.msgs > 0 {
		r.FirstNS = cc.first.Sub(start).Nanoseconds()
	}
	r.InOrder = cc.end(done, "no answer to the prompt")
	return r
}

// chunkCheck counts and checks the n chunks of one streamed turn, as one
// client receives them: each carries the next sequence number, and a sample
// of them is valid JSON. Errors keeps the first 10 problems.
type chunkCheck struct {
	n          int
	msgs       int
	bytes      int64
	first      time.Time // when the first chunk arrived
	outOfOrder int
	errors     []string
}

func (c *chunkCheck) fail(format string, args ...any) {
	if len(c.errors) < 10 {
		c.errors = append(c.errors, fmt.Sprintf(format, args...))
	}
}

// chunk counts msg, a chunk that carries sequence number seq (-1: none
// found).
func (c *chunkCheck) chunk(msg []byte, seq int) {
	if seq != c.msgs {
		c.outOfOrder++
		c.fail("chunk %d carries sequence number %d", c.msgs, seq)
	}
	if c.msgs == 0 {
		c.first = time.Now()
	}
	if (c.msgs%1024 == 0 || c.msgs == c.n-1) && !json.Valid(msg) {
		c.fail("chunk %d is not valid JSON", c.msgs)
	}
	c.msgs++
	c.bytes += int64(len(msg))
}

// end checks the turn once it is over: done is whether its end arrived
// (missing says so when not), and every chunk must have come. It reports
// whether all of them came in order.
func (c *chunkCheck) end(done bool, missing string) (inOrder bool) {
	if !done {
		c.fail("%s", missing)
	}
	if c.msgs != c.n {
		c.fail("received %d chunks of %d", c.msgs, c.n)
	}
	return c.outOfOrder == 0 && c.msgs == c.n
}

// chunkProblems is what a client's report of a stream of chunks (its
// errors, the chunks it got of chunks, whether in order) says went wrong,
// each said of where.
func chunkProblems(where string, errs []string, msgs, chunks int, inOrder bool) []string {
	var out []string
	if len(errs) > 0 {
		out = append(out, where+": "+strings.Join(errs, "; "))
	}
	if !inOrder || msgs != chunks {
		out = append(out, fmt.Sprintf("%s: %d of %d chunks, in order: %v", where, msgs, chunks, inOrder))
	}
	return out
}

// chunkSeq is the sequence number that d, a chunk's text, starts with (10
// digits), or -1.
func chunkSeq(d []byte) int {
	if len(d) < 10 {
		return -1
	}
	v, err := strconv.Atoi(string(d[:10]))
	if err != nil {
		return -1
	}
	return v
}

// --- the harness side ---

// streamSample is one client run with the CPU the other processes used
// meanwhile.
type streamSample struct {
	streamRun
	ServerCPU int64 `json:"server_cpu_ns"` // gateway or websocketd
	AgentCPU  int64 `json:"agent_cpu_ns"`  // the agent processes (and supervisors)
}

type streamPath struct {
	Path string `json:"path"`
	// Transport is how the client reached the agent: "ws" (the gateway
	// and websocketd), "http" (the gateway's Streamable HTTP: POST, SSE)
	// or "stdio" (direct).
	Transport string         `json:"transport,omitempty"`
	Samples   []streamSample `json:"samples"`
	// Medians over the samples.
	MsgsPerSec  float64 `json:"msgs_per_s"`
	MinMsgs     float64 `json:"min_msgs_per_s"`
	MaxMsgs     float64 `json:"max_msgs_per_s"`
	MBPerSec    float64 `json:"mb_per_s"` // client-received message bytes, 10^6
	FirstMsgUS  float64 `json:"first_msg_us"`
	ServerCPUPM float64 `json:"server_cpu_s_per_million_msgs"`
	ClientCPUPM float64 `json:"client_cpu_s_per_million_msgs"`
	AgentCPUPM  float64 `json:"agent_cpu_s_per_million_msgs"`
}

type streamCase struct {
	Chunks int           `json:"chunks"`
	Size   int           `json:"chunk_bytes"`
	Paths  []*streamPath `json:"paths"`
	// Throughput ratios (msgs/s): gateway over direct and over websocketd.
	GatewayVsDirect     float64 `json:"gateway_vs_direct"`
	GatewayVsWebsocketd float64 `json:"gateway_vs_websocketd"`
	// With -transport http or both: the gateway over Streamable HTTP
	// ("gateway (HTTP)") over the same gateway over a WebSocket, and over
	// websocketd.
	HTTPVsWS         float64 `json:"gateway_http_vs_ws,omitempty"`
	HTTPVsWebsocketd float64 `json:"gateway_http_vs_websocketd,omitempty"`
	// With -resume-off: the gateway as configured out of the box (resume
	// on, every message kept for a resume) over the same gateway with
	// resume off, both over a WebSocket.
	ResumeOnVsOff float64 `json:"gateway_resume_on_vs_off,omitempty"`
	// With -audit: the gateway with its audit trail on over the default
	// (off), both over a WebSocket.
	AuditOnVsOff float64 `json:"gateway_audit_on_vs_off,omitempty"`
	// With -tracing: the gateway with tracing on (always sampled) over
	// the default (off), both over a WebSocket.
	TracingOnVsOff float64 `json:"gateway_tracing_on_vs_off,omitempty"`
	// Paired: the same comparisons run by run (see pairedRatio).
	Paired []*pairedRatio `json:"paired,omitempty"`
	// Peak RSS (VmHWM) of the gateway and websocketd processes after this
	// case (cumulative over the cases run so far): what queueing costs.
	GatewayPeakRSS    int64          `json:"gateway_peak_rss_bytes"`
	WebsocketdPeakRSS int64          `json:"websocketd_peak_rss_bytes,omitempty"`
	Profile           *profileResult `json:"profile,omitempty"`
	// The same in-process gateway's profile with the client on HTTP.
	ProfileHTTP *profileResult `json:"profile_http,omitempty"`
	// ProfileResumeOff: the same as Profile with resume off (-resume-off).
	ProfileResumeOff *profileResult `json:"profile_resume_off,omitempty"`
}

type streamResult struct {
	Cases []*streamCase `json:"cases"`
	// DefaultLimits is one small-chunk stream through a gateway with the
	// default send queue (limits.send_queue_messages 4096): how far it got.
	// The measured gateways have a queue sized for the whole stream.
	DefaultLimits *streamRun `json:"default_limits,omitempty"`
	// DefaultLimitsHTTP is the same over Streamable HTTP, whose sink
	// applies limits.send_queue_bytes (64 MiB by default) to what its SSE
	// streams hold: the large chunks, where bytes matter.
	DefaultLimitsHTTP *streamRun `json:"default_limits_http,omitempty"`
}

func (r *streamResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, c := range r.Cases {
		for _, p := range c.Paths {
			if len(p.Samples) == 0 {
				out = append(out, fmt.Sprintf("stream %d B via %s: no samples", c.Size, p.Path))
			}
			for i, s := range p.Samples {
				where := fmt.Sprintf("stream %d B via %s, run %d", c.Size, p.Path, i+1)
				out = append(out, chunkProblems(where, s.Errors, s.Msgs, c.Chunks, s.InOrder)...)
				if s.Msgs > 0 && s.ElapsedNS <= 0 {
					out = append(out, where+": zero elapsed time")
				}
			}
		}
	}
	return out
}

func (h *harness) runStream() (*streamResult, error) {
	// The gateway as configured out of the box, except that the send
	// queue is sized for the whole stream: the load agent writes faster
	// than any WebSocket drains (see BENCHMARKS.md).
	cfg := gwConfig{minIdle: 1, maxProcs: 4, perProc: 32, queueMsgs: 4 << 20, queueBytes: 1 << 30}
	gw, err := h.startGateway(cfg, true)
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	var others []*server
	var otherNames []string
	for _, bin := range h.otherBins {
		g, err := h.startGatewayBin(bin, cfg, true)
		if err != nil {
			return nil, err
		}
		defer g.stop()
		others, otherNames = append(others, g), append(otherNames, "gateway "+filepath.Base(bin))
	}
	// The variants of the same build, each a gateway of its own; tracing
	// exports to a collector that drops what it gets.
	collectorURL := ""
	if h.tracing {
		collector, err := startNullCollector()
		if err != nil {
			return nil, err
		}
		defer collector.Close()
		collectorURL = "http://" + collector.Listener.Addr().String()
	}
	variants := []struct {
		on   bool
		name string
		set  func(*gwConfig)
	}{
		{h.tracing, tracingOnName, func(c *gwConfig) { c.traceTo = collectorURL }},
		{h.audit, auditOnName, func(c *gwConfig) { c.audit = true }},
		{h.resumeOff, resumeOffName, func(c *gwConfig) { c.noResume = true }},
	}
	for _, v := range variants {
		if !v.on {
			continue
		}
		vc := cfg
		v.set(&vc)
		g, err := h.startGateway(vc, true)
		if err != nil {
			return nil, err
		}
		defer g.stop()
		others, otherNames = append(others, g), append(otherNames, "gateway"+v.name)
	}
	var wsd *server
	if h.websocketd != "" {
		if wsd, err = h.startWebsocketd(); err != nil {
			return nil, err
		}
		defer wsd.stop()
	}
	res := &streamResult{}
	var errs []string
	if g, err := h.startGateway(gwConfig{minIdle: 1, maxProcs: 4, perProc: 32}, true); err != nil {
		errs = append(errs, err.Error())
	} else {
		if h.uses("ws") {
			fmt.Fprintf(h.log, "load: stream %d × %d B via a gateway with the default send queue\n", h.c.SmallChunks, h.c.SmallSize)
			if s, err := h.streamClient("ws", g.url, "acp", g, h.c.SmallChunks, h.c.SmallSize); err != nil {
				errs = append(errs, "default limits: "+err.Error())
			} else {
				res.DefaultLimits = &s.streamRun
			}
		}
		if h.uses("http") {
			// A stream cut short is the finding here, not an error.
			fmt.Fprintf(h.log, "load: stream %d × %d B via a gateway with the default send queue, over HTTP\n", h.c.LargeChunks, h.c.LargeSize)
			if s, err := h.streamClient("http", httpURL(g.url), "", g, h.c.LargeChunks, h.c.LargeSize); err != nil {
				errs = append(errs, "default limits over HTTP: "+err.Error())
			} else {
				res.DefaultLimitsHTTP = &s.streamRun
			}
		}
		g.stop()
	}
	for _, cs := range [][2]int{{h.c.SmallChunks, h.c.SmallSize}, {h.c.LargeChunks, h.c.LargeSize}} {
		c := &streamCase{Chunks: cs[0], Size: cs[1]}
		res.Cases = append(res.Cases, c)
		type target struct {
			path, mode, url, sub string
			srv                  *server
		}
		targets := []target{{path: "direct (stdio)", mode: "stdio"}}
		if wsd != nil {
			targets = append(targets, target{path: "websocketd", mode: "ws", url: wsd.url, srv: wsd})
		}
		// "gateway" is the WebSocket path, as in every earlier result;
		// "gateway (HTTP)" is the same gateway over Streamable HTTP.
		gws := []*server{gw}
		names := []string{"gateway"}
		gws, names = append(gws, others...), append(names, otherNames...)
		for i, g := range gws {
			if h.uses("ws") {
				targets = append(targets, target{path: names[i], mode: "ws", url: g.url, sub: "acp", srv: g})
			}
			if h.uses("http") {
				targets = append(targets, target{path: names[i] + httpSuffix, mode: "http", url: httpURL(g.url), srv: g})
			}
		}
		for _, t := range targets {
			c.Paths = append(c.Paths, &streamPath{Path: t.path, Transport: t.mode})
		}
		for rep := 0; rep < h.c.StreamReps; rep++ {
			for i, t := range targets {
				fmt.Fprintf(h.log, "load: stream %d × %d B via %s, run %d\n", c.Chunks, c.Size, t.path, rep+1)
				s, err := h.streamClient(t.mode, t.url, t.sub, t.srv, c.Chunks, c.Size)
				if err != nil {
					errs = append(errs, fmt.Sprintf("%d B via %s: %v", c.Size, t.path, err))
					continue
				}
				c.Paths[i].Samples = append(c.Paths[i].Samples, s)
			}
		}
		for _, p := range c.Paths {
			p.aggregate()
		}
		c.GatewayPeakRSS, _ = procStatus(gw.Pid(), "VmHWM")
		if wsd != nil {
			c.WebsocketdPeakRSS, _ = procStatus(wsd.Pid(), "VmHWM")
		}
		byName := map[string]*streamPath{}
		for _, p := range c.Paths {
			byName[p.Path] = p
		}
		if g, d := byName["gateway"], byName["direct (stdio)"]; g != nil && d != nil && d.MsgsPerSec > 0 {
			c.GatewayVsDirect = g.MsgsPerSec / d.MsgsPerSec
		}
		if g, w := byName["gateway"], byName["websocketd"]; g != nil && w != nil && w.MsgsPerSec > 0 {
			c.GatewayVsWebsocketd = g.MsgsPerSec / w.MsgsPerSec
		}
		if g, ws := byName["gateway"+httpSuffix], byName["gateway"]; g != nil && ws != nil && ws.MsgsPerSec > 0 {
			c.HTTPVsWS = g.MsgsPerSec / ws.MsgsPerSec
		}
		if g, w := byName["gateway"+httpSuffix], byName["websocketd"]; g != nil && w != nil && w.MsgsPerSec > 0 {
			c.HTTPVsWebsocketd = g.MsgsPerSec / w.MsgsPerSec
		}
		if on, off := byName["gateway"], byName["gateway"+resumeOffName]; on != nil && off != nil && off.MsgsPerSec > 0 {
			c.ResumeOnVsOff = on.MsgsPerSec / off.MsgsPerSec
		}
		if on, off := byName["gateway"+auditOnName], byName["gateway"]; on != nil && off != nil && off.MsgsPerSec > 0 {
			c.AuditOnVsOff = on.MsgsPerSec / off.MsgsPerSec
		}
		if on, off := byName["gateway"+tracingOnName], byName["gateway"]; on != nil && off != nil && off.MsgsPerSec > 0 {
			c.TracingOnVsOff = on.MsgsPerSec / off.MsgsPerSec
		}
		for _, ab := range [][2]string{{"gateway", "gateway" + resumeOffName}, {"gateway" + httpSuffix, "gateway"},
			{"gateway" + auditOnName, "gateway"}, {"gateway" + tracingOnName, "gateway"}} {
			if pr := paired(byName[ab[0]], byName[ab[1]]); pr != nil {
				c.Paired = append(c.Paired, pr)
			}
		}
		if h.profile != "" && h.uses("ws") {
			p, err := h.profileStream(cfg, c, "ws")
			if err != nil {
				errs = append(errs, fmt.Sprintf("profile %d B: %v", c.Size, err))
			}
			c.Profile = p
		}
		if h.profile != "" && h.resumeOff && h.uses("ws") {
			off := cfg
			off.noResume = true
			p, err := h.profileStream(off, c, "ws")
			if err != nil {
				errs = append(errs, fmt.Sprintf("profile %d B, resume off: %v", c.Size, err))
			}
			c.ProfileResumeOff = p
		}
		if h.profile != "" && h.uses("http") {
			p, err := h.profileStream(cfg, c, "http")
			if err != nil {
				errs = append(errs, fmt.Sprintf("profile %d B over HTTP: %v", c.Size, err))
			}
			c.ProfileHTTP = p
		}
	}
	if len(errs) > 0 {
		return res, errors.New(strings.Join(errs, "; "))
	}
	return res, nil
}

// resumeOffName names the gateway with resume off among the compared ones
// (-resume-off): "gateway (resume off)"; auditOnName the one with its audit
// trail on (-audit).
const (
	resumeOffName = " (resume off)"
	auditOnName   = " (audit on)"
	tracingOnName = " (tracing on)"
)

func (p *streamPath) aggregate() {
	var rate, mb, first, srv, cli, agt []float64
	for _, s := range p.Samples {
		if s.ElapsedNS <= 0 || s.Msgs == 0 {
			continue
		}
		sec := float64(s.ElapsedNS) / 1e9
		perM := 1e6 / float64(s.Msgs) / 1e9 // ns → s per million messages
		rate = append(rate, float64(s.Msgs)/sec)
		mb = append(mb, float64(s.Bytes)/sec/1e6)
		first = append(first, float64(s.FirstNS)/1e3)
		srv = append(srv, float64(s.ServerCPU)*perM)
		cli = append(cli, float64(s.ClientCPU)*perM)
		agt = append(agt, float64(s.AgentCPU)*perM)
	}
	p.MsgsPerSec, p.MBPerSec, p.FirstMsgUS = median(rate), median(mb), median(first)
	if len(rate) > 0 {
		p.MinMsgs, p.MaxMsgs = slices.Min(rate), slices.Max(rate)
	}
	p.ServerCPUPM, p.ClientCPUPM, p.AgentCPUPM = median(srv), median(cli), median(agt)
}

// pairedRatio is path A's rate over path B's, run by run: the paths take
// turns, so run i of each saw the host in about the same state, and the
// host's drift between runs (often larger than the difference measured)
// cancels out of each run's ratio. The median and the middle half of those
// ratios.
type pairedRatio struct {
	Of     string  `json:"of"` // "A ÷ B"
	Runs   int     `json:"runs"`
	Median float64 `json:"median"`
	Q1     float64 `json:"q1"`
	Q3     float64 `json:"q3"`
}

// paired compares a and b run by run; nil unless both have the same runs,
// all of them measured.
func paired(a, b *streamPath) *pairedRatio {
	if a == nil || b == nil || len(a.Samples) == 0 || len(a.Samples) != len(b.Samples) {
		return nil
	}
	rate := func(s streamSample) float64 { return float64(s.Msgs) / (float64(s.ElapsedNS) / 1e9) }
	var rs []float64
	for i, sa := range a.Samples {
		sb := b.Samples[i]
		if sa.ElapsedNS <= 0 || sb.ElapsedNS <= 0 || sa.Msgs == 0 || sb.Msgs == 0 {
			return nil
		}
		rs = append(rs, rate(sa)/rate(sb))
	}
	slices.Sort(rs)
	return &pairedRatio{Of: a.Path + " ÷ " + b.Path, Runs: len(rs), Median: median(rs),
		Q1: median(rs[:(len(rs)+1)/2]), Q3: median(rs[len(rs)/2:])}
}

// streamChild is a running `load stream-client`.
type streamChild struct {
	*child
	ready streamReady
}

// streamTimeout bounds one client run: generous, since a slow path is a
// result, not an error.
func (h *harness) streamTimeout(n, size int) time.Duration {
	return 60*time.Second + time.Duration(n)*20*time.Microsecond + time.Duration(int64(n)*int64(size))*time.Second/(20<<20)
}

func (h *harness) startStreamChild(mode, url, sub string, n, size int) (*streamChild, error) {
	timeout := h.streamTimeout(n, size)
	args := []string{"stream-client", "-mode", mode, "-chunks", strconv.Itoa(n), "-size", strconv.Itoa(size), "-timeout", timeout.String()}
	switch mode {
	case "ws":
		args = append(args, "-url", url, "-subprotocol", sub)
	case "http":
		args = append(args, "-url", url)
	}
	c, ready, err := startClient[streamReady](h, args...)
	if err != nil {
		return nil, err
	}
	return &streamChild{child: c, ready: ready}, nil
}

// startClient starts a client process (startChild) and reads the first
// line it prints, ready, which says whether it is set up; when it is not,
// it ends the process.
func startClient[R interface{ setUp() (ok bool, err string) }](h *harness, args ...string) (*child, R, error) {
	var ready R
	c, err := h.startChild(args...)
	if err != nil {
		return nil, ready, err
	}
	if err := c.decode(&ready, 60*time.Second); err != nil {
		c.finish(10 * time.Second)
		return nil, ready, fmt.Errorf("client setup: %v %s", err, c.errb.String())
	}
	if ok, msg := ready.setUp(); !ok {
		c.finish(10 * time.Second)
		return nil, ready, fmt.Errorf("client setup: %s %s", msg, c.errb.String())
	}
	return c, ready, nil
}

func (ch *streamChild) run(n, size int, timeout time.Duration) (streamRun, error) {
	var r streamRun
	if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
		return r, err
	}
	err := ch.decode(&r, timeout)
	return r, err
}

// streamClient runs one client and measures the server's and the agents'
// CPU time over its prompt.
func (h *harness) streamClient(mode, url, sub string, srv *server, n, size int) (streamSample, error) {
	var s streamSample
	ch, err := h.startStreamChild(mode, url, sub, n, size)
	if err != nil {
		return s, err
	}
	defer ch.finish(10 * time.Second)
	var serverPIDs, agentPIDs []int
	if srv != nil {
		serverPIDs = []int{srv.Pid()}
		agentPIDs = descendants(srv.Pid())
	} else {
		agentPIDs = []int{ch.ready.AgentPID}
	}
	s0, a0 := cpuOf(serverPIDs), cpuOf(agentPIDs)
	r, err := ch.run(n, size, h.streamTimeout(n, size))
	if err != nil {
		return s, fmt.Errorf("%v %s", err, ch.errb.String())
	}
	s.streamRun = r
	s.ServerCPU = (cpuOf(serverPIDs) - s0).Nanoseconds()
	s.AgentCPU = (cpuOf(agentPIDs) - a0).Nanoseconds()
	return s, nil
}

// profileStream runs the case against a gateway inside this process under
// the CPU profiler (the client is still a separate process, on transport
// mode: ws or http), then breaks the profile down.
func (h *harness) profileStream(cfg gwConfig, c *streamCase, mode string) (*profileResult, error) {
	g, err := h.startInProcGateway(cfg)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	path := fmt.Sprintf("%s.stream-%dB.pprof", h.profile, c.Size)
	url, sub, name := g.url, "acp", "gateway (in-process, profiled)"
	if mode == "http" {
		path = fmt.Sprintf("%s.stream-http-%dB.pprof", h.profile, c.Size)
		url, sub, name = httpURL(g.url), "", "gateway (HTTP, in-process, profiled)"
	} else if cfg.noResume {
		path = fmt.Sprintf("%s.stream-resume-off-%dB.pprof", h.profile, c.Size)
		name = "gateway (resume off, in-process, profiled)"
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	runs := 5 // enough samples at pprof's 100 Hz
	if h.quick {
		runs = 1
	}
	var samples []streamSample
	profiling := false
	defer func() {
		if profiling {
			pprof.StopCPUProfile()
		}
	}()
	for i := 0; i < runs; i++ {
		fmt.Fprintf(h.log, "load: stream %d × %d B via %s, run %d\n", c.Chunks, c.Size, name, i+1)
		ch, err := h.startStreamChild(mode, url, sub, c.Chunks, c.Size)
		if err != nil {
			return nil, err
		}
		if !profiling {
			if err := pprof.StartCPUProfile(f); err != nil {
				ch.finish(10 * time.Second)
				return nil, err
			}
			profiling = true
		}
		cpu0 := selfCPU()
		r, err := ch.run(c.Chunks, c.Size, h.streamTimeout(c.Chunks, c.Size))
		cpu := selfCPU() - cpu0
		ch.finish(10 * time.Second)
		if err != nil {
			return nil, fmt.Errorf("%v %s", err, ch.errb.String())
		}
		samples = append(samples, streamSample{streamRun: r, ServerCPU: cpu.Nanoseconds()})
	}
	pprof.StopCPUProfile()
	profiling = false
	if err := f.Close(); err != nil {
		return nil, err
	}
	p := &streamPath{Path: name, Transport: mode, Samples: samples}
	p.aggregate()
	c.Paths = append(c.Paths, p)
	return analyzeProfile(path)
}

func (r *streamResult) print(w io.Writer) {
	fmt.Fprintf(w, "\nSTREAM: one client, one session, agent_message_chunk notifications as fast as the agent writes (median of runs)\n")
	tw := newTable(w)
	fmt.Fprintln(tw, "chunks × size\tpath\tmsgs/s\t(min–max)\tMB/s\tfirst chunk\tCPU s/M msgs: server\tclient\tagent\t")
	for _, c := range r.Cases {
		for _, p := range c.Paths {
			srv := fmt.Sprintf("%.2f", p.ServerCPUPM)
			if p.Path == "direct (stdio)" {
				srv = "-"
			}
			cli, agt := fmt.Sprintf("%.2f", p.ClientCPUPM), fmt.Sprintf("%.2f", p.AgentCPUPM)
			if strings.Contains(p.Path, "in-process") {
				cli, agt = "-", "-" // the profiled run measures only the gateway's process
			}
			fmt.Fprintf(tw, "%d × %s\t%s\t%.0f\t%.0f–%.0f\t%.1f\t%s\t%s\t%s\t%s\t\n", c.Chunks, fmtBytes(float64(c.Size)), p.Path,
				p.MsgsPerSec, p.MinMsgs, p.MaxMsgs, p.MBPerSec, fmtUS(p.FirstMsgUS), srv, cli, agt)
		}
		fmt.Fprintf(tw, "\tgateway ÷ direct\t%s\t\t\t\t\t\t\t\n", fmtRatio(c.GatewayVsDirect))
		fmt.Fprintf(tw, "\tgateway ÷ websocketd\t%s\t\t\t\t\t\t\t\n", fmtRatio(c.GatewayVsWebsocketd))
		if c.ResumeOnVsOff != 0 {
			fmt.Fprintf(tw, "\tgateway ÷ gateway%s\t%s\t\t\t\t\t\t\t\n", resumeOffName, fmtRatio(c.ResumeOnVsOff))
		}
		if c.AuditOnVsOff != 0 {
			fmt.Fprintf(tw, "\tgateway%s ÷ gateway\t%s\t\t\t\t\t\t\t\n", auditOnName, fmtRatio(c.AuditOnVsOff))
		}
		if c.TracingOnVsOff != 0 {
			fmt.Fprintf(tw, "\tgateway%s ÷ gateway\t%s\t\t\t\t\t\t\t\n", tracingOnName, fmtRatio(c.TracingOnVsOff))
		}
		if c.HTTPVsWS != 0 || c.HTTPVsWebsocketd != 0 {
			fmt.Fprintf(tw, "\tgateway (HTTP) ÷ gateway (WebSocket)\t%s\t\t\t\t\t\t\t\n", fmtRatio(c.HTTPVsWS))
			fmt.Fprintf(tw, "\tgateway (HTTP) ÷ websocketd\t%s\t\t\t\t\t\t\t\n", fmtRatio(c.HTTPVsWebsocketd))
		}
		for _, pr := range c.Paired { // the middle half in the (min–max) column
			fmt.Fprintf(tw, "\t%s, run by run (%d)\t%s\t%s–%s\t\t\t\t\t\t\n", pr.Of, pr.Runs, fmtRatio(pr.Median), fmtRatio(pr.Q1), fmtRatio(pr.Q3))
		}
	}
	tw.Flush()
	for _, c := range r.Cases[:min(len(r.Cases), 1)] {
		for _, p := range c.Paths {
			if p.Transport == "http" {
				fmt.Fprintf(w, "paths: \"gateway\" is a WebSocket; \"gateway (HTTP)\" is Streamable HTTP (the prompt POSTed, the chunks on the session's SSE stream)\n")
				break
			}
		}
	}
	// defaultLimits reports run d, a stream of case i's chunks through a
	// gateway with its default limits, if it ran.
	defaultLimits := func(what string, d *streamRun, i int) {
		if d == nil || len(r.Cases) <= i {
			return
		}
		verdict := "all received"
		if len(d.Errors) > 0 {
			verdict = d.Errors[0]
		}
		fmt.Fprintf(w, "%s: %d of %d chunks of %s, then: %s\n",
			what, d.Msgs, r.Cases[i].Chunks, fmtBytes(float64(r.Cases[i].Size)), verdict)
	}
	defaultLimits("with the default send queue (4096 messages)", r.DefaultLimits, 0)
	defaultLimits("over HTTP with the default send queue (64 MiB)", r.DefaultLimitsHTTP, 1)
	for _, c := range r.Cases {
		fmt.Fprintf(w, "peak RSS after %d × %s: gateway %s, websocketd %s\n", c.Chunks, fmtBytes(float64(c.Size)),
			fmtBytes(float64(c.GatewayPeakRSS)), fmtBytes(float64(c.WebsocketdPeakRSS)))
	}
	for _, c := range r.Cases {
		if c.Profile != nil {
			c.Profile.print(w, fmt.Sprintf("%d × %s", c.Chunks, fmtBytes(float64(c.Size))))
		}
		if c.ProfileHTTP != nil {
			c.ProfileHTTP.print(w, fmt.Sprintf("%d × %s over HTTP", c.Chunks, fmtBytes(float64(c.Size))))
		}
		if c.ProfileResumeOff != nil {
			c.ProfileResumeOff.print(w, fmt.Sprintf("%d × %s with resume off", c.Chunks, fmtBytes(float64(c.Size))))
		}
	}
}

// startNullCollector is an OTLP/HTTP trace receiver on loopback that
// answers every export and keeps nothing: the gateway pays for making and
// exporting its spans, and no backend competes for the CPU.
func startNullCollector() (*httptest.Server, error) {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})), nil
}
