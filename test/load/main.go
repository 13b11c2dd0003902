// Command load is acpgate's load harness. Each scenario measures the gateway
// side by side with baselines in the same run, so that its results are
// ratios that hold on another machine better than absolute figures do:
//
//	go run ./test/load -scenario stream|fanin|idle|setup|all [-quick] [-out results.json]
//	go run ./test/load -scenario setup -setup-paths mixed [-quick] [-out results.json]
//	go run ./test/load -scenario stream,fanin -transport both [-quick] [-out results.json]
//	go run ./test/load -scenario fanout,history [-quick] [-out results.json]
//
//	stream  one client, one session, a long agent_message_chunk stream
//	        (300 B and 20 KB messages): gateway vs websocketd vs direct stdio
//	fanin   many WebSocket clients sharing 4 agent processes, open-loop echo
//	        round trips at a fixed rate, then a rate search: gateway vs direct
//	idle    many open, initialized WebSocket connections: memory and
//	        goroutines per connection
//	setup   session/new through a warm pool, a cold pool, and direct; and
//	        1,000 clients one after another with mixed fs capabilities
//	        through a 2-process pool, with the gateway's spawn count.
//	        -setup-paths warm,cold,direct,mixed runs only those paths
//	fanout  one session, its owner streaming one turn (300 B and 20 KB
//	        messages) with k = 0, 1, 2, 4, 8 clients attached to it
//	        (session/attach), every client reading everything: each
//	        client's rate against the owner alone, in one run (fanout.go)
//	history the memory per live session of sessions.history_bytes (0,
//	        256 KiB, 2 MiB): many sessions, each streamed more than the
//	        history keeps (history.go)
//
// -transport http (or both) runs the gateway paths of stream and fanin over
// Streamable HTTP as well as, or instead of, a WebSocket: each client
// message a POST, the gateway's messages on SSE streams ("gateway (HTTP)"
// in the results; "gateway" is always the WebSocket path).
//
// It prints a table and writes the figures, the machine and the exact
// command line to a JSON file. -quick uses small counts (well under a
// minute for all of them) so that CI can run it as a smoke test.
//
// The same binary is also the synthetic agent (`load agent`), the client
// processes the scenarios start (`load stream-client`, `load
// idle-clients`), and a profile reader (`load analyze FILE.pprof`). Every
// connection is on loopback. BENCHMARKS.md at the top of the repository
// describes the method and the results.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "agent":
			os.Exit(runAgent(os.Stdin, os.Stdout))
		case "stream-client":
			os.Exit(streamClientMain(os.Args[2:]))
		case "fanout-client":
			os.Exit(fanoutClientMain(os.Args[2:]))
		case "history-clients":
			os.Exit(historyClientsMain(os.Args[2:]))
		case "idle-clients":
			os.Exit(idleClientsMain(os.Args[2:]))
		case "analyze":
			os.Exit(analyzeMain(os.Args[2:]))
		}
	}
	os.Exit(harnessMain(os.Args[1:], os.Stdout, os.Stderr))
}

// scenarioNames are the scenarios, in the order they run; "all" is every
// one of them.
var scenarioNames = []string{"stream", "fanin", "idle", "setup", "fanout", "history"}

// counts are the sizes of a run: full or -quick.
type counts struct {
	SmallChunks int `json:"stream_small_chunks"`
	SmallSize   int `json:"stream_small_bytes"`
	LargeChunks int `json:"stream_large_chunks"`
	LargeSize   int `json:"stream_large_bytes"`
	StreamReps  int `json:"stream_reps"`

	FaninConns     int           `json:"fanin_conns"`
	FaninProcs     int           `json:"fanin_processes"`
	FaninPerProc   int           `json:"fanin_sessions_per_process"`
	FaninRate      int           `json:"fanin_rate"`
	FaninDuration  time.Duration `json:"fanin_duration_ns"`
	FaninWarmup    time.Duration `json:"fanin_warmup_ns"`
	FaninReps      int           `json:"fanin_reps"`
	FaninSteps     []int         `json:"fanin_steps"`
	FaninStepDur   time.Duration `json:"fanin_step_duration_ns"`
	FaninRefine    int           `json:"fanin_refine_iterations"`
	FaninP99Target time.Duration `json:"fanin_p99_target_ns"`

	IdleConns int `json:"idle_conns"`

	SetupWarm   int `json:"setup_warm_samples"`
	SetupCold   int `json:"setup_cold_samples"`
	SetupDirect int `json:"setup_direct_samples"`
	SetupMixed  int `json:"setup_mixed_samples"`

	// fanout: the chunks of the owner's turn (of SmallSize and LargeSize
	// bytes), the numbers of attached clients, the repetitions.
	FanoutSmallChunks int   `json:"fanout_small_chunks"`
	FanoutLargeChunks int   `json:"fanout_large_chunks"`
	FanoutKs          []int `json:"fanout_attached"`
	FanoutReps        int   `json:"fanout_reps"`
	// history: sessions, and the sessions.history_bytes measured.
	HistorySessions int   `json:"history_sessions"`
	HistoryLimits   []int `json:"history_bytes"`
	HistorySize     int   `json:"history_chunk_bytes"`
}

func fullCounts() counts {
	return counts{
		SmallChunks: 200_000, SmallSize: 300, LargeChunks: 20_000, LargeSize: 20 << 10, StreamReps: 5,
		FaninConns: 200, FaninProcs: 4, FaninPerProc: 64, FaninRate: 2000,
		FaninDuration: 10 * time.Second, FaninWarmup: time.Second, FaninReps: 3,
		FaninSteps:   []int{1000, 2000, 4000, 6000, 8000, 12000, 16000, 24000, 32000, 48000, 64000, 96000},
		FaninStepDur: 4 * time.Second, FaninRefine: 3, FaninP99Target: 5 * time.Millisecond,
		IdleConns: 10_000,
		SetupWarm: 200, SetupCold: 20, SetupDirect: 200, SetupMixed: 1000,
		FanoutSmallChunks: 100_000, FanoutLargeChunks: 10_000, FanoutKs: []int{0, 1, 2, 4, 8}, FanoutReps: 3,
		HistorySessions: 200, HistoryLimits: []int{0, 256 << 10, 2 << 20}, HistorySize: 300,
	}
}

func quickCounts() counts {
	return counts{
		SmallChunks: 20_000, SmallSize: 300, LargeChunks: 2_000, LargeSize: 20 << 10, StreamReps: 1,
		FaninConns: 50, FaninProcs: 4, FaninPerProc: 16, FaninRate: 1000,
		FaninDuration: 1500 * time.Millisecond, FaninWarmup: 300 * time.Millisecond, FaninReps: 1,
		FaninSteps:   []int{1000, 4000},
		FaninStepDur: time.Second, FaninRefine: 0, FaninP99Target: 5 * time.Millisecond,
		IdleConns: 1000,
		SetupWarm: 20, SetupCold: 2, SetupDirect: 20, SetupMixed: 30,
		FanoutSmallChunks: 2_000, FanoutLargeChunks: 200, FanoutKs: []int{0, 1, 2, 4, 8}, FanoutReps: 1,
		HistorySessions: 10, HistoryLimits: []int{0, 256 << 10, 2 << 20}, HistorySize: 300,
	}
}

// harness is one run of the scenarios.
type harness struct {
	exe        string // this binary: the agent and the client processes
	gatewayBin string // the acpgate binary
	// More acpgate builds to compare in the stream scenario (-gateway-bin
	// A,B,...: the first is "gateway", the others "gateway <file name>").
	otherBins []string
	// resumeOff adds, in the stream scenario, the gateway with resume off
	// (sessions.detach_timeout 0: no replay buffer) next to the default.
	resumeOff bool
	// audit adds, in the stream and setup scenarios, the gateway with its
	// audit trail on (audit.file) next to the default, which has it off.
	audit bool
	// tracing adds, in the stream and fanin scenarios, the gateway with tracing on
	// (every span sampled, exported over OTLP/HTTP to a collector in the
	// harness that drops them) next to the default, which has it off.
	tracing    bool
	websocketd string // "" when not installed
	tmp        string
	c          counts
	quick      bool
	profile    string          // CPU profile file prefix ("" = none)
	setupPaths map[string]bool // -setup-paths (nil = all)
	transports []string        // -transport: "ws", "http" or both, in that order
	httpClient string          // -http-client: "lean" or "nethttp"
	log        io.Writer
	// What the binary's configuration accepts (probeConfig).
	noRateKey, noPolicyKey bool
	echo                   string // the extension method for round trips
}

// results is the JSON file.
type results struct {
	Command string         `json:"command"`
	Argv    []string       `json:"argv"`
	Started time.Time      `json:"started"`
	Seconds float64        `json:"seconds"`
	Quick   bool           `json:"quick"`
	Machine machineInfo    `json:"machine"`
	Counts  counts         `json:"counts"`
	Stream  *streamResult  `json:"stream,omitempty"`
	Fanin   *faninResult   `json:"fanin,omitempty"`
	Idle    *idleResult    `json:"idle,omitempty"`
	Setup   *setupResult   `json:"setup,omitempty"`
	Fanout  *fanoutResult  `json:"fanout,omitempty"`
	History *historyResult `json:"history,omitempty"`
	Cluster *clusterResult `json:"cluster,omitempty"`
	// Background is the CPU that processes other than the harness and its
	// children used during each scenario: figures taken on a busy machine
	// are not comparable.
	Background map[string]background `json:"background_load"`
	Errors     []string              `json:"errors"`
	Notes      []string              `json:"notes,omitempty"`
	Extension  string                `json:"extension_method"`
	// Transports are the client transports of the gateway paths in the
	// stream and fanin scenarios: "ws", "http".
	Transports []string `json:"transports"`
}

// httpSuffix names a gateway path over Streamable HTTP.
const httpSuffix = " (HTTP)"

// uses reports whether the gateway paths run over transport t.
func (h *harness) uses(t string) bool { return slices.Contains(h.transports, t) }

// httpURL is a gateway's Streamable HTTP endpoint: the same /acp.
func httpURL(wsURL string) string {
	if rest, ok := strings.CutPrefix(wsURL, "ws://"); ok {
		return "http://" + rest
	}
	return wsURL
}

func harnessMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "all", "stream, fanin, idle, setup, fanout, history, cluster or all (comma-separated list allowed; all leaves out cluster, which needs redis-server)")
	quick := fs.Bool("quick", false, "small counts: a smoke test that finishes in well under a minute")
	out := fs.String("out", "", "where to write the results (JSON; default: a new file in the temp directory)")
	gatewayBin := fs.String("gateway-bin", "", "acpgate binary to measure (default: build ./cmd/acpgate); "+
		"a comma-separated list compares builds side by side in the stream scenario")
	wsd := fs.String("websocketd", "websocketd", "websocketd binary for the stream baseline (\"\" = skip it)")
	profile := fs.Bool("profile", true, "write profiles next to -out: the CPU of an in-process gateway streaming, the heap of the idle one")
	timeout := fs.Duration("timeout", 0, "stop everything after this long (default 30m, 3m with -quick)")
	idleConns := fs.Int("idle-conns", 0, "idle: connections (default 10000, 1000 with -quick)")
	reps := fs.Int("reps", 0, "stream, fanin and fanout: repetitions per path (default 5, 3 and 3, 1 with -quick)")
	fanoutKs := fs.String("fanout-attached", "", "fanout: the numbers of attached clients, comma-separated, 0 first (default 0,1,2,4,8; at most 8)")
	historySessions := fs.Int("history-sessions", 0, "history: sessions per gateway (default 200, 10 with -quick)")
	historySize := fs.Int("history-chunk-bytes", 0, "history: bytes per chunk streamed into each session (default 300)")
	rate := fs.Int("rate", 0, "fanin: the fixed total rate, round trips/s (default 2000, 1000 with -quick)")
	p99Target := fs.Duration("p99-target", 0, "fanin: the p99 a rate search step must stay under (default 5ms)")
	setupPaths := fs.String("setup-paths", "all", "setup: the paths to run, a comma-separated list of "+strings.Join(setupPathNames, ", ")+" or all")
	transport := fs.String("transport", "ws", "stream and fanin: the gateway paths' client transport: ws (WebSocket), http (Streamable HTTP: POST, SSE) or both")
	resumeOff := fs.Bool("resume-off", false, "stream: also measure the gateway with resume off (sessions.detach_timeout: 0, no replay buffer) side by side with the default, over WebSocket")
	tracingOn := fs.Bool("tracing", false, "stream and fanin: also measure the gateway with tracing on (every span sampled, exported over OTLP/HTTP to a collector that drops them) side by side with the default (off)")
	auditOn := fs.Bool("audit", false, "stream and setup: also measure the gateway with its audit trail on (audit.file) side by side with the default (off)")
	httpClient := fs.String("http-client", "lean", "fanin over HTTP: how clients POST: lean (each writes its POSTs on a keep-alive connection and reads the answers itself) or nethttp (Go's http.Client)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "load: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *out == "" {
		*out = filepath.Join(os.TempDir(), "acpgate-load-"+time.Now().UTC().Format("20060102-150405")+".json")
	}
	c := fullCounts()
	if *quick {
		c = quickCounts()
	}
	if *idleConns > 0 {
		c.IdleConns = min(*idleConns, 100_000)
	}
	if *reps > 0 {
		c.StreamReps, c.FaninReps, c.FanoutReps = min(*reps, 100), min(*reps, 100), min(*reps, 100)
	}
	if *rate > 0 {
		c.FaninRate = min(*rate, 1_000_000)
	}
	if *p99Target > 0 {
		c.FaninP99Target = min(*p99Target, time.Minute)
	}
	if *fanoutKs != "" {
		c.FanoutKs = nil
		for f := range strings.SplitSeq(*fanoutKs, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k < 0 || k > fanoutMaxClients-1 || slices.Contains(c.FanoutKs, k) {
				fmt.Fprintf(stderr, "load: -fanout-attached: %q is not a new number from 0 to %d\n", f, fanoutMaxClients-1)
				return 2
			}
			c.FanoutKs = append(c.FanoutKs, k)
		}
	}
	if *historySessions > 0 {
		c.HistorySessions = min(*historySessions, 10_000)
	}
	if *historySize > 0 {
		c.HistorySize = min(max(*historySize, 200), 1<<20)
	}
	want := map[string]bool{}
	for s := range strings.SplitSeq(*scenario, ",") {
		switch s = strings.TrimSpace(s); s {
		case "all":
			for _, n := range scenarioNames {
				want[n] = true
			}
		case "stream", "fanin", "idle", "setup", "fanout", "history", "cluster":
			want[s] = true
		default:
			fmt.Fprintf(stderr, "load: unknown scenario %q (%s, all)\n", s, strings.Join(scenarioNames, ", "))
			return 2
		}
	}
	onlyPaths := map[string]bool{} // nil: all
	for s := range strings.SplitSeq(*setupPaths, ",") {
		switch s = strings.TrimSpace(s); {
		case s == "all":
			onlyPaths = nil
		case slices.Contains(setupPathNames, s):
			if onlyPaths != nil {
				onlyPaths[s] = true
			}
		default:
			fmt.Fprintf(stderr, "load: unknown setup path %q (%s, all)\n", s, strings.Join(setupPathNames, ", "))
			return 2
		}
	}
	var transports []string
	switch *transport {
	case "ws", "http":
		transports = []string{*transport}
	case "both", "ws,http", "http,ws":
		transports = []string{"ws", "http"}
	default:
		fmt.Fprintf(stderr, "load: unknown transport %q (ws, http, both)\n", *transport)
		return 2
	}
	if *httpClient != "lean" && *httpClient != "nethttp" {
		fmt.Fprintf(stderr, "load: unknown HTTP client %q (lean, nethttp)\n", *httpClient)
		return 2
	}
	if *timeout == 0 {
		*timeout = 30 * time.Minute
		if *quick {
			*timeout = 3 * time.Minute
		}
	}
	watchdog := time.AfterFunc(*timeout, func() {
		fmt.Fprintf(stderr, "load: timed out after %s; stopping\n", *timeout)
		killChildren()
		os.Exit(3)
	})
	defer watchdog.Stop()

	res := &results{Command: commandLine(), Argv: os.Args, Started: time.Now().UTC(), Quick: *quick, Counts: c, Errors: []string{}, Extension: echoMethod,
		Background: map[string]background{}, Transports: transports}
	h := &harness{c: c, quick: *quick, log: stderr, echo: echoMethod, setupPaths: onlyPaths, transports: transports, httpClient: *httpClient}
	var err error
	if h.exe, err = os.Executable(); err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 1
	}
	if h.tmp, err = os.MkdirTemp("", "acpgate-load-"); err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 1
	}
	defer os.RemoveAll(h.tmp)
	if nofile, err := raiseNoFile(uint64(c.IdleConns)*2 + 4096); err != nil {
		res.Notes = append(res.Notes, "could not raise RLIMIT_NOFILE: "+err.Error())
	} else {
		res.Machine.NoFile = nofile
	}
	bins := strings.Split(*gatewayBin, ",")
	h.gatewayBin, h.otherBins = bins[0], bins[1:]
	h.resumeOff, h.audit, h.tracing = *resumeOff, *auditOn, *tracingOn
	if h.gatewayBin == "" {
		h.gatewayBin = filepath.Join(h.tmp, "acpgate")
		fmt.Fprintln(stderr, "load: building ./cmd/acpgate")
		build := exec.Command("go", "build", "-o", h.gatewayBin, "github.com/acpgate/acpgate/cmd/acpgate")
		build.Stdout, build.Stderr = stderr, stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(stderr, "load: build acpgate:", err)
			return 1
		}
	}
	res.Notes = append(res.Notes, h.probeConfig()...)
	res.Extension = h.echo
	if *wsd != "" {
		if p, err := exec.LookPath(*wsd); err == nil {
			h.websocketd = p
		} else {
			res.Notes = append(res.Notes, "websocketd not found: the stream scenario has no websocketd baseline (apt-get install websocketd)")
		}
	}
	if *profile && *out != "" {
		h.profile = strings.TrimSuffix(*out, ".json")
	}
	nofile := res.Machine.NoFile
	res.Machine = describeMachine()
	res.Machine.NoFile = nofile
	if h.websocketd != "" {
		if v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "websocketd").Output(); err == nil {
			res.Machine.Websocketd = "websocketd " + string(v) + " (Debian package)"
		} else {
			res.Machine.Websocketd = h.websocketd
		}
	}

	start := time.Now()
	run := func(name string, f func() error) {
		if !want[name] {
			return
		}
		fmt.Fprintf(stderr, "load: scenario %s\n", name)
		t0 := time.Now()
		b0 := sampleLoad()
		if err := f(); err != nil {
			res.Errors = append(res.Errors, name+": "+err.Error())
			fmt.Fprintf(stderr, "load: %s: %v\n", name, err)
		}
		res.Background[name] = sampleLoad().since(b0)
		fmt.Fprintf(stderr, "load: scenario %s took %s\n", name, time.Since(t0).Round(time.Millisecond))
	}
	run("stream", func() (err error) { res.Stream, err = h.runStream(); return })
	run("fanin", func() (err error) { res.Fanin, err = h.runFanin(); return })
	run("idle", func() (err error) { res.Idle, err = h.runIdle(); return })
	run("setup", func() (err error) { res.Setup, err = h.runSetup(); return })
	run("fanout", func() (err error) { res.Fanout, err = h.runFanout(); return })
	run("history", func() (err error) { res.History, err = h.runHistory(); return })
	run("cluster", func() (err error) { res.Cluster, err = h.runCluster(); return })
	res.Seconds = time.Since(start).Seconds()
	// Each result's own sanity checks (nil-safe: a scenario not run has none).
	res.Errors = append(res.Errors, res.Stream.problems()...)
	res.Errors = append(res.Errors, res.Fanin.problems()...)
	res.Errors = append(res.Errors, res.Idle.problems()...)
	res.Errors = append(res.Errors, res.Setup.problems()...)
	res.Errors = append(res.Errors, res.Fanout.problems()...)
	res.Errors = append(res.Errors, res.History.problems()...)
	res.Errors = append(res.Errors, res.Cluster.problems()...)

	printTables(stdout, res)
	if *out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "load:", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", *out)
	}
	if len(res.Errors) > 0 {
		return 1
	}
	return 0
}

// commandLine is how the run was started: "go run ./test/load ..." when the
// binary is go run's temporary build.
func commandLine() string {
	args := make([]string, 0, len(os.Args))
	for _, a := range os.Args[1:] {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	exe := os.Args[0]
	if strings.Contains(exe, "go-build") {
		exe = "go run ./test/load"
	}
	return strings.TrimSpace(exe + " " + strings.Join(args, " "))
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
}

func printTables(w io.Writer, res *results) {
	fmt.Fprintf(w, "\n%s\n%s, %d CPUs, Linux %s, %s\n", res.Command, res.Machine.CPUModel, res.Machine.CPUs, res.Machine.Kernel, res.Machine.GoVersion)
	if res.Stream != nil {
		res.Stream.print(w)
	}
	if res.Fanin != nil {
		res.Fanin.print(w)
	}
	if res.Idle != nil {
		res.Idle.print(w)
	}
	if res.Setup != nil {
		res.Setup.print(w)
	}
	if res.Fanout != nil {
		res.Fanout.print(w)
	}
	if res.History != nil {
		res.History.print(w)
	}
	res.Cluster.print(w)
	if len(res.Background) > 0 {
		fmt.Fprintf(w, "\nbackground load (CPU used by processes other than the harness and its children, in cores):")
		for _, name := range scenarioNames {
			if b, ok := res.Background[name]; ok {
				fmt.Fprintf(w, " %s %.2f cores (irq %.2f, steal %.2f);", name, b.ForeignCores, b.IRQCores, b.StealCores)
			}
		}
		fmt.Fprintln(w)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "\nnote: %s\n", n)
	}
	if len(res.Errors) > 0 {
		fmt.Fprintf(w, "\nERRORS:\n")
		for _, e := range res.Errors {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
}
