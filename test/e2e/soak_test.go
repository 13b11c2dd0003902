package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSoakMixedLoad runs a mixed load against one gateway for a while and
// checks that nothing is lost and memory stays flat:
//
//   - streamers prompt with random text (JSON escapes, multi-byte UTF-8,
//     emoji) and compare the whole streamed "You said: <text>" with what
//     they sent, while echo requests run on the same connection;
//   - a permission client answers session/request_permission (allow,
//     reject) and, for "write <path>", the fs/write_text_file that follows;
//   - a file reader answers fs/read_text_file and checks the agent quotes
//     the content back;
//   - a canceller starts slow prompts and cancels them (session/cancel or
//     $/cancel_request) after a few ticks, which must arrive in order;
//   - a reconnector disconnects and reconnects, loads its session (the
//     replay must hold its last exchange) and prompts again.
//
// Every request must get exactly one response, and every response must
// answer a request. The gateway's RSS is sampled every few seconds: after
// a warm-up, the average of the last third of the samples may be at most
// 20% above the average of the first third.
//
// It runs 60 s by default; ACPGATE_SOAK=10m (any Go duration) runs longer.
// It is skipped with -short.
func TestSoakMixedLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	duration := 60 * time.Second
	if s := os.Getenv("ACPGATE_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("ACPGATE_SOAK=%q is not a positive duration (e.g. 10m)", s)
		}
		duration = d
	}
	g := startGateway(t, gwOpts{config: `pool: {min_idle: 1, max_processes: 3, max_sessions_per_process: 16}
limits: {messages_per_second: 1000, message_burst: 2000}
# Dropped sockets detach and end within the run, pings every second let
# the replay buffers forget what clients have read, and each session's
# history for session/attach is small enough to fill within the warm-up
# (2 MiB, the default, would still be filling at the end of the run):
# steady state is reached within the warm-up, so RSS growth still means a
# leak.
sessions: {detach_timeout: 2s, history_bytes: 16384}
websocket: {ping_interval: 1s}
` + hostilePolicy})
	gwPID := g.Cmd.Process.Pid
	cwd := t.TempDir()
	deadline := time.Now().Add(duration)

	var (
		errMu sync.Mutex
		errs  []string
	)
	fail := func(who string, err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 30 {
			errs = append(errs, who+": "+err.Error())
		}
	}
	stats := &soakStats{}
	open := func(who string) (*soakConn, error) {
		c, err := wsDial(g.Addr, nil)
		if err != nil {
			return nil, err
		}
		k := &soakConn{wsClient: c, stats: stats, sent: map[int]bool{}, answers: map[int]int{}}
		id, err := k.req("initialize", map[string]any{
			"protocolVersion":    1,
			"clientCapabilities": map[string]any{"fs": map[string]bool{"readTextFile": true, "writeTextFile": true}},
		})
		var m rpcMsg
		if err == nil {
			m, err = k.waitFor(id, soakHandlers{})
		}
		if err == nil && m.Error != nil {
			err = fmt.Errorf("initialize: %s", m.Raw)
		}
		if err != nil {
			c.Kill()
			return nil, fmt.Errorf("%s: %w", who, err)
		}
		return k, nil
	}

	var wg sync.WaitGroup
	worker := func(who string, f func(who string, rng *rand.Rand) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(len(who)), uint64(time.Now().UnixNano())))
			if err := f(who, rng); err != nil {
				fail(who, err)
			}
		}()
	}
	session := func(k *soakConn) (string, error) {
		id, err := k.req("session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
		if err != nil {
			return "", err
		}
		return newSessionResult(k.waitFor(id, soakHandlers{}))
	}
	// collect counts m and adds its text to got when it is an
	// agent_message_chunk for sid.
	collect := func(m rpcMsg, sid string, got *strings.Builder) (bool, error) {
		s, isChunk, err := chunkText(m, sid)
		if err == nil && isChunk {
			stats.chunks.Add(1)
			got.WriteString(s)
		}
		return isChunk, err
	}
	// prompt runs one turn; other sees the agent's requests and every
	// update (after the chunk bookkeeping).
	prompt := func(k *soakConn, sid, text string, other func(m rpcMsg) error, onResponse func(m rpcMsg) error) (string, rpcMsg, error) {
		id, err := k.req("session/prompt", textPrompt(sid, text))
		if err != nil {
			return "", rpcMsg{}, err
		}
		stats.prompts.Add(1)
		var got strings.Builder
		m, err := k.waitFor(id, soakHandlers{onResponse: onResponse, other: func(m rpcMsg) error {
			if _, err := collect(m, sid, &got); err != nil {
				return err
			}
			if m.Method != "session/update" {
				stats.agentRequests.Add(1)
				if other == nil {
					return fmt.Errorf("unexpected agent request: %.300s", m.Raw)
				}
			}
			if other != nil {
				return other(m)
			}
			return nil
		}})
		return got.String(), m, err
	}
	endTurn := func(m rpcMsg, want string) error {
		var r struct {
			StopReason string `json:"stopReason"`
		}
		if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || r.StopReason != want {
			return fmt.Errorf("prompt answer %.300s, want stopReason %q", m.Raw, want)
		}
		return nil
	}

	words := []string{"alpha", "bravo", "charlie", "delta", "foxtrot", "golf", "hotel", "india", "juliett", "kilo",
		"lima", "mike", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "victor", "zulu",
		"grüße", "日本語", "ünïcödé", "🙂", "\"quoted\"", `back\slash`, "tab\there", "new\nline", "</script>", "{json}", "42"}
	randomText := func(rng *rand.Rand, who string, n int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%s turn %d:", who, n)
		for i, k := 0, 1+rng.IntN(60); i < k; i++ {
			b.WriteByte(' ')
			b.WriteString(words[rng.IntN(len(words))])
		}
		return b.String()
	}

	// sessionWorker runs turn over and over on one connection and session
	// until the deadline, then checks the connection's accounting.
	sessionWorker := func(who string, turn func(who string, k *soakConn, sid string, rng *rand.Rand, n int) error) {
		worker(who, func(who string, rng *rand.Rand) error {
			k, err := open(who)
			if err != nil {
				return err
			}
			defer k.Close()
			sid, err := session(k)
			if err != nil {
				return err
			}
			for n := 0; time.Now().Before(deadline); n++ {
				if err := turn(who, k, sid, rng, n); err != nil {
					return err
				}
			}
			return k.finish()
		})
	}

	for i := 0; i < 3; i++ {
		sessionWorker(fmt.Sprintf("streamer-%d", i), func(who string, k *soakConn, sid string, rng *rand.Rand, n int) error {
			text := randomText(rng, who, n)
			// Echo requests on the same connection, mid-stream.
			echoes := map[int]string{}
			id, err := k.req("session/prompt", textPrompt(sid, text))
			if err != nil {
				return err
			}
			stats.prompts.Add(1)
			var got strings.Builder
			checkEcho := func(m rpcMsg) error {
				var eid int
				_ = json.Unmarshal(m.ID, &eid)
				var res struct {
					Nonce string `json:"nonce"`
				}
				if nonce, ok := echoes[eid]; !ok || m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Nonce != nonce {
					return fmt.Errorf("echo answer %.300s, want nonce %q", m.Raw, echoes[eid])
				}
				delete(echoes, eid)
				return nil
			}
			m, err := k.waitFor(id, soakHandlers{
				other: func(m rpcMsg) error {
					isChunk, err := collect(m, sid, &got)
					if err != nil {
						return err
					}
					if isChunk {
						if rng.IntN(4) == 0 {
							nonce := fmt.Sprintf("%s/%d/%d", who, n, rng.Int())
							eid, err := k.req("_demo/echo", map[string]string{"nonce": nonce})
							if err != nil {
								return err
							}
							echoes[eid] = nonce
						}
					}
					return nil
				},
				onResponse: checkEcho,
			})
			if err != nil {
				return err
			}
			if err := endTurn(m, "end_turn"); err != nil {
				return err
			}
			if got.String() != "You said: "+text {
				return fmt.Errorf("streamed %q, want %q", got.String(), "You said: "+text)
			}
			// Echoes sent near the end of the turn, answered in any order
			// (the map's order is random, so each wait accepts the others).
			for len(echoes) > 0 {
				eid := slices.Min(slices.Collect(maps.Keys(echoes)))
				nonce := echoes[eid]
				m, err := k.waitFor(eid, soakHandlers{onResponse: checkEcho})
				var res struct {
					Nonce string `json:"nonce"`
				}
				if err != nil || m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Nonce != nonce {
					return fmt.Errorf("echo %d: %v %.300s", eid, err, m.Raw)
				}
				delete(echoes, eid)
			}
			return nil
		})
	}

	sessionWorker("permission", func(who string, k *soakConn, sid string, rng *rand.Rand, n int) error {
		choice := []string{"allow", "reject"}[rng.IntN(2)]
		path := filepath.Join(cwd, fmt.Sprintf("soak-%d.txt", n))
		write := n%2 == 1
		text := "permission please"
		if write {
			text = fmt.Sprintf("write %s soak content %d", path, n)
		}
		asked, wrote := 0, 0
		got, m, err := prompt(k, sid, text, func(m rpcMsg) error {
			switch m.Method {
			case "session/request_permission":
				asked++
				return k.Respond(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": choice}})
			case "fs/write_text_file":
				wrote++
				if m.Param("path") != path || !strings.Contains(m.Param("content"), fmt.Sprintf("soak content %d", n)) {
					return fmt.Errorf("fs/write_text_file %.300s", m.Raw)
				}
				return k.Respond(m.ID, map[string]any{})
			}
			return nil
		}, nil)
		if err != nil {
			return err
		}
		if err := endTurn(m, "end_turn"); err != nil {
			return err
		}
		var want string
		switch {
		case !write && choice == "allow":
			want = "Permission granted (allow)."
		case !write:
			want = "Permission denied (reject)."
		case choice == "allow":
			want = "Wrote "
		default:
			want = "Permission denied."
		}
		if asked != 1 || !strings.Contains(got, want) || (write && choice == "allow") != (wrote == 1) {
			return fmt.Errorf("%q answered %s: asked %d, wrote %d, reply %q (want %q)", text, choice, asked, wrote, got, want)
		}
		return nil
	})

	sessionWorker("fs-reader", func(who string, k *soakConn, sid string, rng *rand.Rand, n int) error {
		path := filepath.Join(cwd, fmt.Sprintf("notes-%d.txt", n))
		first := fmt.Sprintf("first line %d %x", n, rng.Uint64())
		asked := 0
		got, m, err := prompt(k, sid, "read "+path, func(m rpcMsg) error {
			if m.Method != "fs/read_text_file" {
				return nil
			}
			asked++
			if m.Param("path") != path || m.Param("sessionId") != sid {
				return fmt.Errorf("fs/read_text_file %.300s", m.Raw)
			}
			return k.Respond(m.ID, map[string]string{"content": first + "\nsecond line\n"})
		}, nil)
		if err != nil {
			return err
		}
		if err := endTurn(m, "end_turn"); err != nil {
			return err
		}
		if asked != 1 || !strings.Contains(got, fmt.Sprintf("%q", first)) {
			return fmt.Errorf("read %s: asked %d, reply %q", path, asked, got)
		}
		return nil
	})

	sessionWorker("canceller", func(who string, k *soakConn, sid string, rng *rand.Rand, n int) error {
		id, err := k.req("session/prompt", textPrompt(sid, "slow please"))
		if err != nil {
			return err
		}
		stats.prompts.Add(1)
		after := 1 + rng.IntN(5)
		viaRequestID := n%2 == 1
		ticks := 0
		m, err := k.waitFor(id, soakHandlers{other: func(m rpcMsg) error {
			s, isChunk, err := chunkText(m, sid)
			if err != nil || !isChunk {
				return err
			}
			stats.chunks.Add(1)
			ticks++
			if want := fmt.Sprintf("tick %d ", ticks); s != want {
				return fmt.Errorf("chunk %q, want %q: a tick was lost or reordered", s, want)
			}
			if ticks == after {
				stats.cancels.Add(1)
				if viaRequestID {
					return k.Notify("$/cancel_request", map[string]int{"requestId": id})
				}
				return k.Notify("session/cancel", map[string]string{"sessionId": sid})
			}
			return nil
		}})
		if err != nil {
			return err
		}
		if err := endTurn(m, "cancelled"); err != nil {
			return err
		}
		return nil
	})

	worker("reconnector", func(who string, rng *rand.Rand) error {
		var sid, last string
		for n := 0; time.Now().Before(deadline); n++ {
			k, err := open(who)
			if err != nil {
				return err
			}
			stats.reconnects.Add(1)
			if sid == "" || n%10 == 0 {
				if sid, err = session(k); err != nil {
					k.Kill()
					return err
				}
				last = ""
			} else {
				id, err := k.req("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}})
				if err != nil {
					k.Kill()
					return err
				}
				var replay strings.Builder
				m, err := k.waitFor(id, soakHandlers{other: func(m rpcMsg) error {
					var u update
					if err := json.Unmarshal(m.Params, &u); err != nil || m.Method != "session/update" || u.SessionID != sid {
						return fmt.Errorf("replay: %.300s", m.Raw)
					}
					replay.WriteString(u.text())
					return nil
				}})
				if err != nil {
					k.Kill()
					return err
				}
				if m.Error != nil || !strings.HasSuffix(replay.String(), last+"You said: "+last) {
					k.Kill()
					return fmt.Errorf("session/load: %.300s; the replay %q does not end with the last exchange %q", m.Raw, replay.String(), last)
				}
			}
			last = randomText(rng, who, n)
			got, m, err := prompt(k, sid, last, nil, nil)
			if err == nil {
				err = endTurn(m, "end_turn")
			}
			if err == nil && got != "You said: "+last {
				err = fmt.Errorf("streamed %q, want %q", got, "You said: "+last)
			}
			if err == nil {
				err = k.finish()
			}
			if rng.IntN(2) == 0 {
				k.Close()
			} else {
				k.Kill() // drop the TCP connection
			}
			if err != nil {
				return err
			}
		}
		return nil
	})

	// Memory: the gateway's RSS (and Go heap, for the log) every few
	// seconds until the workers are done.
	// About 30 samples per run: every 2 s for the default minute, every
	// 5 s (at most) for long runs.
	every := min(5*time.Second, max(time.Second, duration/30))
	type sample struct {
		at        time.Duration
		rss, heap int
	}
	var samples []sample
	start := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(every)
	defer tick.Stop()
sampling:
	for {
		select {
		case <-done:
			break sampling
		case <-tick.C:
			samples = append(samples, sample{time.Since(start), rssKB(gwPID), int(g.metrics(t)["go_memstats_heap_inuse_bytes"] / 1024)})
		}
	}
	for _, e := range errs {
		t.Error(e)
	}
	t.Logf("%s: %d prompts, %d chunks streamed, %d requests, %d responses, %d agent requests answered, %d cancels, %d reconnects",
		time.Since(start).Round(time.Millisecond), stats.prompts.Load(), stats.chunks.Load(), stats.requests.Load(),
		stats.responses.Load(), stats.agentRequests.Load(), stats.cancels.Load(), stats.reconnects.Load())
	if len(errs) == 0 && stats.requests.Load() != stats.responses.Load() {
		t.Errorf("%d requests, %d responses", stats.requests.Load(), stats.responses.Load())
	}
	if stats.prompts.Load() < 50 {
		t.Errorf("only %d prompts ran: the load did not run", stats.prompts.Load())
	}

	// Warm-up: the first sixth of the run (at least 5 s) is not judged:
	// the pool spawns its processes, buffers and the race detector's
	// shadow memory grow to the load's working set.
	warm := max(duration/6, 5*time.Second)
	var judged []sample
	var trace []string
	for _, s := range samples {
		trace = append(trace, fmt.Sprintf("%s:%dM/%dM", s.at.Round(time.Second), s.rss/1024, s.heap/1024))
		if s.at >= warm {
			judged = append(judged, s)
		}
	}
	t.Logf("RSS/heap-in-use samples: %s", strings.Join(trace, " "))
	if len(judged) < 6 {
		t.Logf("%d samples after the warm-up: too few to judge memory (run longer)", len(judged))
		return
	}
	third := len(judged) / 3
	avg := func(ss []sample) float64 {
		sum := 0
		for _, s := range ss {
			sum += s.rss
		}
		return float64(sum) / float64(len(ss))
	}
	first, last := avg(judged[:third]), avg(judged[len(judged)-third:])
	t.Logf("RSS after warm-up: first third %.1f MiB, last third %.1f MiB (%+.1f%%)", first/1024, last/1024, 100*(last-first)/first)
	if last > 1.2*first {
		t.Errorf("the gateway's RSS grew from %.1f MiB to %.1f MiB (more than 20%%) under a steady load", first/1024, last/1024)
	}
}

type soakStats struct {
	prompts, chunks, requests, responses, agentRequests, cancels, reconnects atomic.Int64
}

// soakConn is a worker's connection with exactly-once bookkeeping of its
// requests.
type soakConn struct {
	*wsClient
	stats   *soakStats
	sent    map[int]bool
	answers map[int]int
}

// soakHandlers see what arrives while a worker waits for one answer:
// other gets requests and notifications (nil: only session/update is
// expected), onResponse the answers to its other requests (nil: none is
// expected).
type soakHandlers struct {
	other      func(m rpcMsg) error
	onResponse func(m rpcMsg) error
}

// req sends a request and books it.
func (k *soakConn) req(method string, params any) (int, error) {
	id, err := k.Request(method, params)
	if err == nil {
		k.sent[id] = true
		k.stats.requests.Add(1)
	}
	return id, err
}

// record books a response: it must answer a request of this connection,
// and only once.
func (k *soakConn) record(m rpcMsg) error {
	var id int
	if err := json.Unmarshal(m.ID, &id); err != nil || !k.sent[id] {
		return fmt.Errorf("a response to a request never sent: %.300s", m.Raw)
	}
	k.answers[id]++
	k.stats.responses.Add(1)
	if k.answers[id] > 1 {
		return fmt.Errorf("request %d answered %d times: %.300s", id, k.answers[id], m.Raw)
	}
	return nil
}

// waitFor reads until the answer to id.
func (k *soakConn) waitFor(id int, h soakHandlers) (rpcMsg, error) {
	stop := time.Now().Add(60 * time.Second)
	for {
		m, err := k.Next(time.Until(stop))
		if err != nil {
			return m, fmt.Errorf("waiting for the answer to %d: %w", id, err)
		}
		if m.Method == "" {
			if err := k.record(m); err != nil {
				return m, err
			}
			if m.IsResponseTo(id) {
				return m, nil
			}
			if h.onResponse == nil {
				return m, fmt.Errorf("unexpected response while waiting for %d: %.300s", id, m.Raw)
			}
			if err := h.onResponse(m); err != nil {
				return m, err
			}
			continue
		}
		if h.other == nil {
			if m.Method == "session/update" {
				continue
			}
			return m, fmt.Errorf("unexpected message while waiting for %d: %.300s", id, m.Raw)
		}
		if err := h.other(m); err != nil {
			return m, err
		}
	}
}

// finish checks that every request was answered exactly once.
func (k *soakConn) finish() error {
	for id := range k.sent {
		if k.answers[id] != 1 {
			return fmt.Errorf("request %d answered %d times", id, k.answers[id])
		}
	}
	return nil
}
