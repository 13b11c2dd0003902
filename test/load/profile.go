package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// profileResult breaks a CPU profile of the gateway down. Each sample goes
// to one category, decided by the frame nearest the leaf that belongs to
// one (helpers such as memmove count for their caller).
type profileResult struct {
	File       string  `json:"file"`
	TotalCPU   float64 `json:"total_cpu_s"`
	Samples    int     `json:"samples"`
	Categories []share `json:"categories"`
	// Syscalls split by what they were for.
	Syscalls []share `json:"syscalls"`
	// By goroutine: the share of samples under each of the gateway's loops.
	Goroutines []share `json:"goroutines"`
	// The heaviest leaf functions (flat).
	TopFlat []share `json:"top_flat"`
	// Who pays for each category: the frame nearest the leaf in the
	// gateway's or the WebSocket library's code, the top few.
	Payers map[string][]share `json:"payers"`
}

type share struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	Percent float64 `json:"percent"`
}

type rule struct {
	category string
	match    []string // prefixes of function names
}

// A sample's category: the first of these whose entry points appear
// anywhere in its stack (so that, e.g., a GC assist inside an allocation is
// GC, and a futex wake inside a channel send is scheduling) ...
var stackRules = []rule{
	{"GC", []string{"runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.bgsweep", "runtime.bgscavenge",
		"runtime.deductSweepCredit", "runtime.sweepone", "runtime.wbBufFlush", "runtime.gcStart", "runtime.markroot",
		"runtime.(*mcache).prepareForSweep", "runtime.gcMarkDone", "runtime.gcMarkTermination", "runtime.stopTheWorld",
		"runtime.bulkBarrierPreWrite", "runtime.gcWriteBarrier", "runtime.(*sweepLocked)"}},
	{"syscalls", []string{"syscall.Syscall", "syscall.RawSyscall", "syscall.syscall", "internal/runtime/syscall.",
		"runtime/internal/syscall.", "runtime.entersyscall", "runtime.exitsyscall", "runtime.reentersyscall"}},
	{"allocation", []string{"runtime.mallocgc", "runtime.newobject", "runtime.makeslice", "runtime.growslice",
		"runtime.makemap", "runtime.rawbyteslice", "runtime.rawstring", "runtime.newarray", "runtime.(*mheap).alloc"}},
	{"scheduling", []string{"runtime.mcall", "runtime.park_m", "runtime.schedule", "runtime.findRunnable",
		"runtime.gopark", "runtime.goready", "runtime.ready", "runtime.wakep", "runtime.futex", "runtime.notesleep",
		"runtime.notewakeup", "runtime.mstart", "runtime.morestack", "runtime.newproc", "runtime.goexit0",
		"runtime.sysmon", "runtime.netpoll", "runtime.Gosched", "runtime.gosched_m", "runtime.usleep", "runtime.osyield"}},
	{"profiler", []string{"runtime/pprof.", "runtime.sigprof"}},
}

// ... or else the first frame from the leaf up that one of these matches
// (helpers such as memmove count for their callers).
var leafRules = []rule{
	{"JSON scanning (jsonrpc.Scanner, jsontext)", []string{"github.com/acpgate/acpgate/proxy/jsonrpc.(*Scanner)",
		"github.com/acpgate/acpgate/proxy/jsonrpc.kindOf", "github.com/acpgate/acpgate/proxy/jsonrpc.lookupMember",
		"github.com/acpgate/acpgate/proxy/jsonrpc.(*Message)", "github.com/acpgate/acpgate/proxy/jsonrpc.scanString",
		"github.com/acpgate/acpgate/proxy/jsonrpc.special", "github.com/acpgate/acpgate/proxy/jsonrpc.hex4",
		"github.com/acpgate/acpgate/proxy/jsonrpc.indexQuote", "github.com/acpgate/acpgate/proxy/jsonrpc.isName",
		"github.com/go-json-experiment/json"}},
	{"splicing (ids, session IDs)", []string{"github.com/acpgate/acpgate/proxy/jsonrpc.Splice",
		"github.com/acpgate/acpgate/proxy/jsonrpc.Append", "github.com/acpgate/acpgate/proxy/jsonrpc.SortEdits", "slices.", "sort."}},
	{"stdio line framing", []string{"github.com/acpgate/acpgate/proxy/jsonrpc.(*LineReader)", "bufio.(*Reader)"}},
	{"WebSocket framing (coder/websocket)", []string{"github.com/coder/websocket", "bufio.(*Writer)"}},
	// The Streamable HTTP transport: its sink decodes each message with
	// encoding/json to route it; net/http frames the POSTs and the SSE
	// streams (in those stacks bufio.(*Writer) is net/http's: see
	// httpLeafRules).
	{"encoding/json (decoding to route)", []string{"encoding/json."}},
	{"HTTP and SSE framing (net/http)", []string{"net/http.", "net/textproto.", "mime.", "net/url.", "github.com/go-chi/"}},
	{"channels, locks, context", []string{"runtime.chansend", "runtime.chanrecv", "runtime.selectgo", "runtime.selectnb",
		"runtime.semacquire", "runtime.semrelease", "runtime.closechan", "runtime.lock", "runtime.unlock",
		"sync.", "internal/sync.", "context.", "sync/atomic."}},
	{"timers, clocks", []string{"time.", "runtime.nanotime", "runtime.walltime", "runtime.(*timer)", "runtime.(*timers)",
		"runtime.resetForSleep", "runtime.time_now", "runtime.addtimer", "runtime.deltimer", "runtime.modtimer"}},
	{"net, os, poll (non-syscall part)", []string{"internal/poll.", "net.", "os.", "io."}},
	{"relay logic (routing, maps, queues)", []string{"github.com/acpgate/acpgate/", "runtime.mapaccess",
		"runtime.mapassign", "runtime.mapdelete", "internal/runtime/maps.", "runtime.slicebytetostring",
		"runtime.concatstring", "runtime.memequal", "runtime.strhash", "runtime.memhash", "runtime.aeshash"}},
}

// httpLeafRules are leafRules for a stack under net/http (a POST or an SSE
// stream): a buffered write there is HTTP framing, not WebSocket framing.
var httpLeafRules = func() []rule {
	out := make([]rule, 0, len(leafRules))
	for _, r := range leafRules {
		if strings.HasPrefix(r.category, "WebSocket framing") {
			r = rule{r.category, []string{"github.com/coder/websocket"}}
		}
		if strings.HasPrefix(r.category, "HTTP and SSE framing") {
			r = rule{r.category, append([]string{"bufio.(*Writer)"}, r.match...)}
		}
		out = append(out, r)
	}
	return out
}()

// underHTTP reports whether a stack is net/http's: serving a POST or an SSE
// stream (a WebSocket's reader and writer run apart from net/http once the
// connection is upgraded).
func underHTTP(frames []string) bool {
	for _, fn := range frames {
		if strings.HasPrefix(fn, "net/http.") {
			return true
		}
	}
	return false
}

// transparent frames are charged to their callers.
var transparent = []string{
	"runtime.memmove", "runtime.memclrNoHeapPointers", "runtime.cmpstring", "internal/bytealg.", "bytes.",
	"runtime.duffcopy", "runtime.duffzero", "runtime.procyield", "unicode/utf8.", "strconv.", "internal/runtime/atomic.",
	"runtime.systemstack",
}

// syscallKinds tell what a syscall sample was for, by a caller frame.
var syscallKinds = []rule{
	{"write to WebSocket (TCP)", []string{"net.(*conn).Write", "net.(*netFD).Write", "net.(*Buffers).WriteTo",
		"net.(*netFD).writeBuffers", "net.(*conn).writeBuffers"}},
	{"read from WebSocket (TCP)", []string{"net.(*conn).Read", "net.(*netFD).Read"}},
	{"read agent stdout (pipe)", []string{"github.com/acpgate/acpgate/proxy.(*agentProc).readLoop", "github.com/acpgate/acpgate/proxy.(*agentProc).stderrLoop"}},
	{"write agent stdin (pipe)", []string{"github.com/acpgate/acpgate/proxy.(*agentProc).writeLoop"}},
	{"other", []string{""}},
}

// goroutineRoles name the gateway's loops (a sample counts for the first
// role found from the root down).
var goroutineRoles = []rule{
	{"agent stdout reader (scan, route, queue)", []string{"github.com/acpgate/acpgate/proxy.(*agentProc).readLoop"}},
	{"WebSocket writer (frame, write)", []string{"github.com/acpgate/acpgate/gateway.(*wsConn).writeLoop"}},
	{"WebSocket reader (client → agent)", []string{"github.com/acpgate/acpgate/gateway.(*wsConn).readLoop"}},
	{"SSE stream writer (handleSSE)", []string{"github.com/acpgate/acpgate/gateway.(*Server).handleSSE"}},
	{"HTTP POST handler (client → agent)", []string{"github.com/acpgate/acpgate/gateway.(*Server).handleHTTPPost"}},
	{"agent stdin writer", []string{"github.com/acpgate/acpgate/proxy.(*agentProc).writeLoop"}},
	{"GC workers", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge"}},
	{"scheduler, idle Ps, timers (no goroutine)", []string{"runtime.mstart", "runtime.mcall", "runtime.schedule", "runtime.morestack"}},
}

// matches reports whether function fn starts with one of the prefixes.
func matches(fn string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

// classify picks a sample's category.
func classify(frames []string) string {
	for _, r := range stackRules {
		for _, fn := range frames {
			if matches(fn, r.match) {
				return r.category
			}
		}
	}
	rules := leafRules
	if underHTTP(frames) {
		rules = httpLeafRules
	}
	for _, fn := range frames {
		if matches(fn, transparent) {
			continue
		}
		for _, r := range rules {
			if matches(fn, r.match) {
				return r.category
			}
		}
	}
	return "other"
}

// analyzeProfile reads the profile with `go tool pprof -traces`.
func analyzeProfile(path string) (*profileResult, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return &profileResult{File: path}, fmt.Errorf("profile written to %s; no go tool to analyze it: %v", path, err)
	}
	out, err := exec.Command(goBin, "tool", "pprof", "-traces", path).Output()
	if err != nil {
		return &profileResult{File: path}, fmt.Errorf("go tool pprof -traces %s: %v", path, err)
	}
	p, err := parseTraces(bytes.NewReader(out))
	if p != nil {
		p.File = path
	}
	return p, err
}

// parseTraces reads pprof's -traces output: blocks separated by lines of
// dashes, each a value and the stack, leaf first.
func parseTraces(r io.Reader) (*profileResult, error) {
	type trace struct {
		v      time.Duration
		frames []string
	}
	var traces []trace
	var cur *trace
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			cur = nil
			continue
		}
		if !strings.HasPrefix(line, " ") && cur == nil {
			continue // the header
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if cur == nil {
			v, err := time.ParseDuration(f[0])
			if err != nil || len(f) < 2 {
				continue
			}
			traces = append(traces, trace{v: v})
			cur = &traces[len(traces)-1]
			f = f[1:]
		}
		if strings.Contains(f[0], ":") && !strings.Contains(f[0], ".") {
			continue // a label line
		}
		cur.frames = append(cur.frames, f[0])
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(traces) == 0 {
		return nil, fmt.Errorf("the profile has no samples")
	}
	cat, sys, role, flat := map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}
	payers := map[string]map[string]time.Duration{}
	var total time.Duration
	for _, t := range traces {
		total += t.v
		if len(t.frames) > 0 {
			flat[t.frames[0]] += t.v
		}
		c := classify(t.frames)
		cat[c] += t.v
		if payers[c] == nil {
			payers[c] = map[string]time.Duration{}
		}
		payer := "(runtime only)"
		for _, fn := range t.frames {
			if strings.HasPrefix(fn, "github.com/acpgate/") || strings.HasPrefix(fn, "github.com/coder/websocket") {
				payer = strings.TrimPrefix(strings.TrimPrefix(fn, "github.com/acpgate/acpgate/"), "github.com/")
				break
			}
		}
		payers[c][payer] += t.v
		if c == "syscalls" {
			k := "other"
		kinds:
			for _, fn := range t.frames {
				for _, r := range syscallKinds[:len(syscallKinds)-1] {
					if matches(fn, r.match) {
						k = r.category
						break kinds
					}
				}
			}
			if underHTTP(t.frames) { // the same socket calls, for HTTP
				k = strings.Replace(k, "WebSocket", "HTTP/SSE", 1)
			}
			sys[k] += t.v
		}
		rl := "other"
	roles:
		for i := len(t.frames) - 1; i >= 0; i-- {
			for _, r := range goroutineRoles {
				if matches(t.frames[i], r.match) {
					rl = r.category
					break roles
				}
			}
		}
		role[rl] += t.v
	}
	toShares := func(m map[string]time.Duration, limit int) []share {
		var out []share
		for k, v := range m {
			out = append(out, share{Name: k, Seconds: v.Seconds(), Percent: 100 * float64(v) / float64(total)})
		}
		slices.SortFunc(out, func(a, b share) int {
			if a.Seconds != b.Seconds {
				if a.Seconds > b.Seconds {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Name, b.Name)
		})
		if limit > 0 && len(out) > limit {
			out = out[:limit]
		}
		return out
	}
	pay := map[string][]share{}
	for c, m := range payers {
		pay[c] = toShares(m, 4)
	}
	return &profileResult{
		Payers:     pay,
		TotalCPU:   total.Seconds(),
		Samples:    len(traces),
		Categories: toShares(cat, 0),
		Syscalls:   toShares(sys, 0),
		Goroutines: toShares(role, 0),
		TopFlat:    toShares(flat, 15),
	}, nil
}

func (p *profileResult) print(w io.Writer, title string) {
	fmt.Fprintf(w, "\nCPU PROFILE of the in-process gateway, stream %s: %.2f CPU s (%s)\n", title, p.TotalCPU, p.File)
	tw := newTable(w)
	fmt.Fprintln(tw, "category\tshare\t\tsyscalls for\tshare\t\tgoroutine\tshare\t")
	n := max(len(p.Categories), len(p.Syscalls), len(p.Goroutines))
	cell := func(s []share, i int) string {
		if i >= len(s) {
			return "\t"
		}
		return fmt.Sprintf("%s\t%.1f%%", s[i].Name, s[i].Percent)
	}
	for i := range n {
		fmt.Fprintf(tw, "%s\t\t%s\t\t%s\t\n", cell(p.Categories, i), cell(p.Syscalls, i), cell(p.Goroutines, i))
	}
	tw.Flush()
}

// analyzeMain prints the breakdown of CPU profiles (`load analyze FILE...`),
// with the heaviest leaf functions.
func analyzeMain(files []string) int {
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "usage: load analyze CPU.pprof...")
		return 2
	}
	for _, f := range files {
		p, err := analyzeProfile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "load analyze:", err)
			return 1
		}
		p.print(os.Stdout, f)
		tw := newTable(os.Stdout)
		fmt.Fprintln(tw, "category\tpaid by (nearest gateway or coder/websocket frame)\tshare of all\t")
		for _, c := range p.Categories {
			for _, s := range p.Payers[c.Name] {
				fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t\n", c.Name, s.Name, s.Percent)
			}
		}
		tw.Flush()
		tw = newTable(os.Stdout)
		fmt.Fprintln(tw, "top leaf functions (flat)\tshare\t")
		for _, s := range p.TopFlat {
			fmt.Fprintf(tw, "%s\t%.1f%%\t\n", s.Name, s.Percent)
		}
		tw.Flush()
	}
	return 0
}
