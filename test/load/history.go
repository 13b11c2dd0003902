package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The history scenario (issue #22): the memory of sessions.history_bytes,
// what each live session keeps for an attach to replay.
//
// For each history_bytes (0, 256 KiB and 2 MiB by default), a gateway with
// resume off (sessions.detach_timeout 0: no replay buffer, whose share of
// memory would otherwise be mixed in) gets S connections, each with a
// session (`load history-clients`, a process of its own). Its memory is
// read; then every session streams more than the largest history_bytes
// (300 B chunks, or -history-chunk-bytes) and its memory is read again. (after - before) / S is
// what a session that streamed costs; the same with history_bytes 0 is the
// baseline, and the difference is the history's share. Each is run twice:
// against the binary (RSS, and go_memstats_heap_inuse_bytes from its
// /metrics, as an operator sees them: the heap there may hold garbage not
// yet collected) and against a gateway in this process (heap in use after
// runtime.GC: live memory). Last, a client attaches to one session with
// historyPolicy "full" and counts what is replayed.

// --- the client process: `load history-clients` ---

type historyReport struct {
	Phase    string `json:"phase"` // "open", "streamed", "replayed"
	OK       int    `json:"ok"`
	Failed   int    `json:"failed"`
	FirstErr string `json:"first_error,omitempty"`
	// streamed: message bytes each session's client received (the
	// smallest over the sessions).
	MinBytes int64 `json:"min_bytes_per_session,omitempty"`
	// replayed: session/update messages replayed to an attach with
	// historyPolicy full, their bytes, and what the result says.
	Replayed       int   `json:"replayed,omitempty"`
	ReplayedBytes  int64 `json:"replayed_bytes,omitempty"`
	ResultReplayed int   `json:"result_replayed,omitempty"`
	Trimmed        bool  `json:"history_trimmed,omitempty"`
}

// historyClientsMain opens n connections, each with a session, and
// reports; on "go" streams chunks × size into every session (concurrency
// at a time) and reports; on "replay" attaches once more to the first
// session with historyPolicy full and reports what it got; when stdin
// ends, closes everything cleanly.
func historyClientsMain(args []string) int {
	fs := flag.NewFlagSet("load history-clients", flag.ContinueOnError)
	url := fs.String("url", "", "the gateway's WebSocket URL")
	n := fs.Int("n", 200, "connections, each with a session")
	chunks := fs.Int("chunks", 1000, "chunks to stream into each session")
	size := fs.Int("size", 300, "bytes per chunk")
	conc := fs.Int("concurrency", 4, "sessions set up or streaming at once")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	exitAfter("history-clients", *timeout)
	out := json.NewEncoder(os.Stdout)
	ts := make([]transport, *n)
	sids := make([]string, *n)
	defer func() {
		var wg sync.WaitGroup
		for _, t := range ts {
			if t != nil {
				wg.Go(func() { closeClean(t) })
			}
		}
		wg.Wait()
	}()
	// each runs f for every session, conc at a time, and reports phase.
	each := func(phase string, f func(i int) error) historyReport {
		rep := historyReport{Phase: phase}
		rep.Failed, rep.FirstErr = boundedErrs(*n, *conc, func(i int) error {
			if err := f(i); err != nil {
				return fmt.Errorf("session %d: %v", i, err)
			}
			return nil
		})
		rep.OK = *n - rep.Failed
		return rep
	}
	rep := each("open", func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t, err := dialWS(ctx, *url, []string{"acp"})
		cancel()
		if err != nil {
			return err
		}
		ts[i] = t
		c := &rpcClient{t: t}
		if err := c.initialize(); err != nil {
			return err
		}
		sids[i], err = c.newSession()
		return err
	})
	if out.Encode(rep) != nil || rep.Failed > 0 {
		return 1
	}
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "go" {
		return 1
	}
	var mu sync.Mutex
	minBytes := int64(-1)
	rep = each("streamed", func(i int) error {
		r := streamOnce(ts[i], sids[i], *chunks, *size)
		mu.Lock()
		if minBytes < 0 || r.Bytes < minBytes {
			minBytes = r.Bytes
		}
		mu.Unlock()
		if len(r.Errors) > 0 {
			return errors.New(strings.Join(r.Errors, "; "))
		}
		return nil
	})
	rep.MinBytes = minBytes
	if out.Encode(rep) != nil || rep.Failed > 0 {
		return 1
	}
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "replay" {
		return 1
	}
	rep = replayOnce(*url, sids[0])
	if out.Encode(rep) != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, in) // until the harness is done measuring
	return 0
}

// replayOnce attaches a new connection to sid with historyPolicy full and
// counts the replay that precedes the result.
func replayOnce(url, sid string) historyReport {
	rep := historyReport{Phase: "replayed"}
	fail := func(err error) historyReport {
		rep.Failed, rep.FirstErr = 1, err.Error()
		return rep
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t, err := dialWS(ctx, url, []string{"acp"})
	cancel()
	if err != nil {
		return fail(err)
	}
	defer closeClean(t)
	stop := time.AfterFunc(60*time.Second, func() { _ = t.Close() })
	defer stop.Stop()
	c := &rpcClient{t: t}
	if err := c.initialize(); err != nil {
		return fail(err)
	}
	c.nextID++
	msg := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"session/attach","params":{"sessionId":%s,"historyPolicy":"full"}}`,
		c.nextID, strconv.Quote(sid))
	if err := t.Send(msg); err != nil {
		return fail(err)
	}
	for range 10_000_000 {
		raw, err := t.Recv()
		if err != nil {
			return fail(err)
		}
		if id, ok := parseID(raw); ok && id == int64(c.nextID) {
			var r rpcResponse
			if err := json.Unmarshal(raw, &r); err != nil || r.Error != nil {
				return fail(fmt.Errorf("session/attach: %.300s", raw))
			}
			var res struct {
				Meta struct {
					Acpgate struct {
						Replayed int  `json:"replayed"`
						Trimmed  bool `json:"historyTrimmed"`
					} `json:"acpgate"`
				} `json:"_meta"`
			}
			_ = json.Unmarshal(r.Result, &res)
			rep.OK, rep.ResultReplayed, rep.Trimmed = 1, res.Meta.Acpgate.Replayed, res.Meta.Acpgate.Trimmed
			return rep
		}
		rep.Replayed++
		rep.ReplayedBytes += int64(len(raw))
	}
	return fail(errors.New("no answer to session/attach"))
}

// --- the harness side ---

// historyRun is one gateway with one history_bytes.
type historyRun struct {
	HistoryBytes int    `json:"history_bytes"`
	Gateway      string `json:"gateway"` // "binary" or "in-process"
	Sessions     int    `json:"sessions"`
	// Message bytes each session's client received (the least of them).
	StreamedBytes int64 `json:"streamed_bytes_per_session"`
	// Before and after the streams. The binary's heap is its /metrics'
	// go_memstats_heap_inuse_bytes; the in-process one's is
	// runtime.MemStats.HeapInuse after runtime.GC (twice).
	RSSBefore  int64 `json:"rss_before"`
	RSSAfter   int64 `json:"rss_after"`
	HeapBefore int64 `json:"heap_inuse_before"`
	HeapAfter  int64 `json:"heap_inuse_after"`
	// (after - before) / sessions.
	RSSPerSession  float64 `json:"rss_per_session"`
	HeapPerSession float64 `json:"heap_inuse_per_session"`
	// Heap per session minus that of the same gateway kind with
	// history_bytes 0, and that over history_bytes.
	HistoryHeap        float64 `json:"history_heap_per_session,omitempty"`
	HistoryHeapVsLimit float64 `json:"history_heap_vs_limit,omitempty"`
	// What an attach with historyPolicy full to one session got.
	Replayed       int   `json:"replayed_msgs"`
	ReplayedBytes  int64 `json:"replayed_bytes"`
	ResultReplayed int   `json:"result_replayed"`
	Trimmed        bool  `json:"history_trimmed"`
}

type historyResult struct {
	ChunkBytes int           `json:"chunk_bytes"`
	Chunks     int           `json:"chunks_per_session"`
	Runs       []*historyRun `json:"runs"`
}

func (r *historyResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, x := range r.Runs {
		where := fmt.Sprintf("history %s, history_bytes %d", x.Gateway, x.HistoryBytes)
		if x.StreamedBytes < int64(r.Chunks)*int64(r.ChunkBytes) {
			out = append(out, fmt.Sprintf("%s: %d bytes streamed per session, want at least %d", where, x.StreamedBytes, r.Chunks*r.ChunkBytes))
		}
		switch {
		case x.HistoryBytes == 0 && x.Replayed != 0:
			out = append(out, fmt.Sprintf("%s: %d messages replayed without a history", where, x.Replayed))
		case x.HistoryBytes > 0 && (x.ReplayedBytes < int64(x.HistoryBytes)/2-int64(r.ChunkBytes) || x.ReplayedBytes > int64(x.HistoryBytes) || !x.Trimmed):
			// The history keeps the newest half to whole of history_bytes.
			out = append(out, fmt.Sprintf("%s: replayed %d bytes (trimmed %v), want %d to %d", where, x.ReplayedBytes, x.Trimmed, x.HistoryBytes/2, x.HistoryBytes))
		}
		if x.Replayed != x.ResultReplayed {
			out = append(out, fmt.Sprintf("%s: %d messages replayed, the result says %d", where, x.Replayed, x.ResultReplayed))
		}
	}
	return out
}

func (h *harness) runHistory() (*historyResult, error) {
	size := h.c.HistorySize
	// More than the largest history, with a margin.
	largest := 0
	for _, hb := range h.c.HistoryLimits {
		largest = max(largest, hb)
	}
	chunks := (largest + largest/4 + 64<<10) / size
	res := &historyResult{ChunkBytes: size, Chunks: chunks}
	var errs []string
	base := map[string]float64{}
	for _, hb := range h.c.HistoryLimits {
		for _, kind := range []string{"binary", "in-process"} {
			fmt.Fprintf(h.log, "load: history: %d sessions × %d × %d B, history_bytes %d, gateway %s\n", h.c.HistorySessions, chunks, size, hb, kind)
			x, err := h.historyRun(kind, hb, chunks, size)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s, history_bytes %d: %v", kind, hb, err))
				continue
			}
			if hb == 0 {
				base[kind] = x.HeapPerSession
			} else if b, ok := base[kind]; ok {
				x.HistoryHeap = x.HeapPerSession - b
				x.HistoryHeapVsLimit = x.HistoryHeap / float64(hb)
			}
			res.Runs = append(res.Runs, x)
		}
	}
	if len(errs) > 0 {
		return res, errors.New(strings.Join(errs, "; "))
	}
	return res, nil
}

func (h *harness) historyRun(kind string, historyBytes, chunks, size int) (*historyRun, error) {
	n := h.c.HistorySessions
	const procs = 8
	cfg := gwConfig{minIdle: 1, maxProcs: procs, perProc: max(32, (n+procs-1)/procs+1), queueMsgs: 4 << 20, queueBytes: 1 << 30,
		noResume: true, historySet: true, historyBytes: historyBytes}
	x := &historyRun{HistoryBytes: historyBytes, Gateway: kind, Sessions: n}
	var (
		url    string
		pid    int
		memory func() (heap int64, err error)
	)
	switch kind {
	case "binary":
		gw, err := h.startGateway(cfg, true)
		if err != nil {
			return nil, err
		}
		defer gw.stop()
		url, pid = gw.url, gw.Pid()
		metrics := "http://" + gw.addr + "/metrics"
		memory = func() (int64, error) { return scrapeCounter(metrics, "go_memstats_heap_inuse_bytes") }
	default:
		g, err := h.startInProcGateway(cfg)
		if err != nil {
			return nil, err
		}
		defer g.stop()
		url, pid = g.url, os.Getpid()
		memory = func() (int64, error) { return int64(memNow().HeapInuse), nil }
	}
	timeout := 2*time.Minute + time.Duration(n)*(h.streamTimeout(chunks, size)-60*time.Second)
	c, err := h.startChild("history-clients", "-url", url, "-n", strconv.Itoa(n), "-chunks", strconv.Itoa(chunks),
		"-size", strconv.Itoa(size), "-timeout", timeout.String())
	if err != nil {
		return nil, err
	}
	defer c.finish(60 * time.Second)
	step := func(cmd, phase string) (historyReport, error) {
		var rep historyReport
		if cmd != "" {
			if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
				return rep, err
			}
		}
		if err := c.decode(&rep, timeout); err != nil {
			return rep, fmt.Errorf("%s: %v %s", phase, err, c.errb.String())
		}
		if rep.Phase != phase || rep.Failed > 0 {
			return rep, fmt.Errorf("%s: %d of %d failed: %s", phase, rep.Failed, rep.Failed+rep.OK, rep.FirstErr)
		}
		return rep, nil
	}
	if _, err := step("", "open"); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond) // the sessions' set-up settles
	if x.HeapBefore, err = memory(); err != nil {
		return nil, err
	}
	x.RSSBefore, _ = procRSS(pid)
	rep, err := step("go", "streamed")
	if err != nil {
		return nil, err
	}
	x.StreamedBytes = rep.MinBytes
	time.Sleep(500 * time.Millisecond)
	if x.HeapAfter, err = memory(); err != nil {
		return nil, err
	}
	x.RSSAfter, _ = procRSS(pid)
	x.HeapPerSession = float64(x.HeapAfter-x.HeapBefore) / float64(n)
	x.RSSPerSession = float64(x.RSSAfter-x.RSSBefore) / float64(n)
	rep, err = step("replay", "replayed")
	if err != nil {
		return x, err
	}
	x.Replayed, x.ReplayedBytes, x.ResultReplayed, x.Trimmed = rep.Replayed, rep.ReplayedBytes, rep.ResultReplayed, rep.Trimmed
	return x, nil
}

func (r *historyResult) print(w io.Writer) {
	if len(r.Runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nHISTORY: memory per live session that streamed %d × %s (resume off), by sessions.history_bytes (%d sessions)\n",
		r.Chunks, fmtBytes(float64(r.ChunkBytes)), r.Runs[0].Sessions)
	tw := newTable(w)
	fmt.Fprintln(tw, "history_bytes\tgateway\theap in use\t(before → after)\tRSS\t(before → after)\theap − history_bytes 0\t÷ history_bytes\treplayed\t")
	for _, x := range r.Runs {
		hist, vs := "-", "-"
		if x.HistoryBytes > 0 && x.HistoryHeapVsLimit != 0 {
			hist, vs = fmtSignedBytes(x.HistoryHeap), fmtRatio(x.HistoryHeapVsLimit)
		}
		heapNote := "(metrics)"
		if x.Gateway != "binary" {
			heapNote = "(after GC)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s → %s\t%s\t%s → %s\t%s\t%s\t%d msgs, %s\t\n", fmtBytes(float64(x.HistoryBytes)), x.Gateway,
			fmtSignedBytes(x.HeapPerSession), heapNote, fmtBytes(float64(x.HeapBefore)), fmtBytes(float64(x.HeapAfter)),
			fmtSignedBytes(x.RSSPerSession), fmtBytes(float64(x.RSSBefore)), fmtBytes(float64(x.RSSAfter)), hist, vs,
			x.Replayed, fmtBytes(float64(x.ReplayedBytes)))
	}
	tw.Flush()
}

// fmtSignedBytes is fmtBytes for a difference, which may be negative.
func fmtSignedBytes(b float64) string {
	if b < 0 {
		return "−" + fmtBytes(-b)
	}
	return fmtBytes(b)
}
