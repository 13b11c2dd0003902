// Command fakeagent is a deliberately misbehaving ACP agent for the
// end-to-end tests in test/e2e. It speaks just enough ACP v1 on stdio
// (initialize, session/new, session/prompt, _demo/echo) for a client to do
// a round trip through it, and misbehaves on command.
//
// At start, the environment variable FAKE_MODE selects a startup fault:
//
//	exit-before-init  write a line to stderr and exit with status 3 before
//	                  reading anything
//	sessions          behave, and keep sessions (see below)
//	init-error        answer initialize with a JSON-RPC error
//	hang-init         never answer initialize
//	(empty)           behave
//
// Once initialized, extension methods trigger faults on demand, so that one
// agent process can misbehave towards one client while serving others:
//
//	_demo/echo          answer with the params unchanged
//	_fake/hang          never answer
//	_fake/garbage       write invalid lines (not JSON, invalid UTF-8, NUL bytes,
//	                    truncated JSON, duplicate keys, a 10,000-deep array,
//	                    batches, messages for nobody), then answer {"ok":true}
//	_fake/huge-line     write one line of params.bytes bytes (a session/update
//	                    notification padded with x), then answer {"ok":true}
//	_fake/huge-answer   answer with a result padded to params.bytes bytes
//	_fake/double        answer twice: {"n":1}, then {"n":2}
//	_fake/unknown-id    answer ids the gateway never sent (999999999, "nope",
//	                    null, -1, 1.5, an object), then answer {"ok":true}
//	_fake/stderr-flood  write params.lines lines to stderr, then answer
//	                    {"lines":N}
//	_fake/host          act on the host directly, as an agent's own tools
//	                    do (read, write, list, env, exec ...; see host.go),
//	                    and answer {"ok":..., "data":..., "err":...}
//
// session/new answers a new session ID, unique to the process
// ("fake-<process>-<n>"), unless params.fakeSessionId names one: then it
// answers with that ID, as an agent that resumes a session it already has
// in place of a new one (claude-code-acp does for
// _meta.claudeCode.options.resume); with FAKE_MODE=sessions a session it
// already has goes on with its history.
//
// session/prompt answers "You said: <text>" in one agent_message_chunk and
// ends the turn. A prompt "sleep <seconds>" (at most 60) is a silent turn,
// as an agent that works without streaming makes: nothing for that long,
// then only the answer {"stopReason":"end_turn"}; other messages are handled
// meanwhile. A prompt "stream chunks=N size=S" gets N agent_message_chunk
// notifications of S bytes each (N <= 1,000,000, S <= 16 MiB), written as
// fast as stdout takes them, then the end of its turn (a flood for the
// memory tests). A prompt "trickle <seconds>" (at most 60) streams an
// agent_message_chunk "chunk N " every trickleEvery for that long, then a
// last one and the answer {"stopReason":"end_turn"} in one write: an agent
// that streams until its last moment. A prompt "spend A,B,C
// [currency=USD] [every=100ms] [tokens=IN,OUT]" reports the session's cumulative cost A, then B, then
// C (each written into usage_update's cost.amount as it is, so "-1",
// "1e300" or "\"x\"" are sent as such; at most 1000, every at most 10s
// apart), then ends the turn with usage {inputTokens: IN, outputTokens:
// OUT} (written as they are too); a session/cancel meanwhile ends it at
// once, stopReason "cancelled" (with "cancel=usage", its answer carries
// that usage too, as an agent reporting what a cancelled turn used). With
// "total=load" the amounts are the turn's own cost so far, and each report
// is the session's running total in this process plus it, as
// claude-agent-acp reports its SDK's total_cost_usd: the turn's last amount
// is added to it at the turn's end (cancelled too), and a session/new,
// session/load or session/resume starts it again from zero (a new SDK
// query). Without it the total carries on: session/load replays the
// session's last (numeric) report after its history, as an agent that
// keeps its total with the session would (FAKE_REPLAY_COST=off: it does
// not, an agent whose total carries on unsaid). Every prompt is logged to stderr as
// "fakeagent: prompt <session> <text>" (for tests that check a prompt
// never reached the agent).
// Requests for other methods get -32601; notifications and
// responses (but the answers to a "permission" turn's request) are ignored.
// Every loop is bounded by its params.
//
// With FAKE_MODE=sessions it keeps its sessions in memory, each with its
// history (prompts and plain replies), and advertises loadSession and
// sessionCapabilities list, resume, close and delete: session/load replays
// the history (user_message_chunk, agent_message_chunk) then answers {};
// session/resume answers {} without a replay; session/list lists every
// session (sessionId, cwd); session/close answers {} (the session stays
// loadable); session/delete forgets it. A session it does not know gets
// -32002. FAKE_SESSIONS_DIR (a directory) shares the sessions between
// processes, as an agent that keeps them on disk: session/new writes a
// file per session there (its IDs then name the process), and a load or
// resume of a session another process made finds it (its history is
// that process's own). A prompt containing "permission" sends session/request_permission
// (options allow and reject) and waits for the answer, other messages being
// handled meanwhile: "Permission granted (allow)." and end_turn, or the
// stopReason cancelled for a cancelled outcome.
//
// With FAKE_ECHO=1 every line it reads is logged to stderr as it came,
// "fakeagent: received <line>" (for tests of what reaches the agent).
//
// FAKE_MODELS (model IDs, comma-separated; the first is each session's
// model to begin with; FAKE_MODELS_PAD=N adds N more, pad-0 ... pad-N-1)
// makes the results of session/new, load and resume advertise them, as
// FAKE_MODEL_SHAPE says: "config" (the default: a v1 config option of
// category model, after a mode option), "v2" (the v2 draft's shape:
// configId, the models in two groups under groupId), "api" (the older
// models API's models object only) or "both" (config and api).
// session/set_config_option (configId model) and session/set_model switch
// the session's model: each is logged to stderr ("fakeagent:
// set_config_option model=<value>", "fakeagent: set_model <modelId>"),
// sends a config_option_update, and is answered (configOptions for
// set_config_option); a model not offered gets -32602. A prompt's answer
// then ends with " [model <the session's model>]".
//
// FAKE_MODES (mode IDs, comma-separated; the first is each session's mode
// to begin with) makes the same results advertise modes, as FAKE_MODE_SHAPE
// says: "config" (the mode config option, of category mode, lists them),
// "modes" (the modes object: {currentModeId, availableModes: [{id,
// name}]}) or "both" (the default). session/set_mode and
// session/set_config_option (configId mode) switch the session's mode:
// each is logged ("fakeagent: set_mode <modeId>", "fakeagent:
// set_config_option mode=<value>"), sends a current_mode_update, and is
// answered; a mode not offered gets -32602. A prompt's answer then ends
// with " [mode <the session's mode>]" (after its model's). A "permission"
// turn's request then also offers the option "acceptEdits" (as
// claude-code-acp's "Always Allow"); every answer to it is logged
// ("fakeagent: permission answered <outcome> <optionId>").
//
// FAKE_LOAD_DELAY_MS (at most 10000) makes session/load and session/resume
// wait that long before they are handled: a slow load, so that what a
// client pipelines after one reaches the gateway before its answer.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/acpgate/acpgate/test/internal/acpclient"
)

type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
}

type agent struct {
	mode     string
	id       string // this process's part of its session IDs: unique, as a real agent's are
	sessions int
	shared   string // FAKE_SESSIONS_DIR: where the sessions are shared with other processes
	noCost   bool   // FAKE_REPLAY_COST=off: a load replays no cost report

	smu   sync.Mutex                       // guards store, waits and asked
	store map[string]*fakeSession          // FAKE_MODE=sessions: the sessions by ID
	waits map[string]chan permissionAnswer // the answers a permission turn waits for, by request ID
	asked int                              // permission requests sent

	cancelMu sync.Mutex
	cancels  map[string]chan struct{} // running spend turns, by session
	running  map[string]float64       // spend total=load: each session's running total since its new, load or resume (guarded by cancelMu)

	mu  sync.Mutex // guards out: silent turns answer from goroutines of their own
	out *bufio.Writer

	// FAKE_MODELS: the models offered, each session's model (by ID; absent:
	// the first), the shape. Used by the main goroutine only.
	models     []string
	model      map[string]string
	modelShape string
	// FAKE_MODES: the same for modes.
	modes     []string
	curMode   map[string]string
	modeShape string
}

func main() {
	a := &agent{mode: os.Getenv("FAKE_MODE"), shared: os.Getenv("FAKE_SESSIONS_DIR"), noCost: os.Getenv("FAKE_REPLAY_COST") == "off", out: bufio.NewWriterSize(os.Stdout, 1<<16),
		store: map[string]*fakeSession{}, waits: map[string]chan permissionAnswer{},
		model: map[string]string{}, modelShape: os.Getenv("FAKE_MODEL_SHAPE"),
		curMode: map[string]string{}, modeShape: os.Getenv("FAKE_MODE_SHAPE"),
		id: strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.Itoa(os.Getpid())}
	if v := os.Getenv("FAKE_MODES"); v != "" {
		a.modes = strings.Split(v, ",")
	}
	if v := os.Getenv("FAKE_MODELS"); v != "" {
		a.models = strings.Split(v, ",")
	}
	pad, _ := strconv.Atoi(os.Getenv("FAKE_MODELS_PAD"))
	for i := range min(max(pad, 0), 1_000_000) {
		a.models = append(a.models, fmt.Sprintf("pad-%d", i))
	}
	if a.mode == "exit-before-init" {
		fmt.Fprintln(os.Stderr, "fakeagent: exiting before initialize (FAKE_MODE=exit-before-init)")
		os.Exit(3)
	}
	fmt.Fprintf(os.Stderr, "fakeagent: started (FAKE_MODE=%q)\n", a.mode)
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	echo := os.Getenv("FAKE_ECHO") == "1"
	for {
		line, err := in.ReadBytes('\n')
		if echo && len(line) > 0 {
			fmt.Fprintf(os.Stderr, "fakeagent: received %s\n", bytes.TrimSuffix(line, []byte("\n")))
		}
		if len(bytes.TrimSpace(line)) > 0 {
			a.handle(line)
		}
		if err != nil {
			if err != io.EOF {
				fmt.Fprintln(os.Stderr, "fakeagent: stdin:", err)
			}
			return
		}
	}
}

func (a *agent) writeLine(b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.out.Write(b)
	a.out.WriteByte('\n')
	a.out.Flush()
}

func (a *agent) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	a.writeLine(b)
}

func (a *agent) result(id json.RawMessage, res any) {
	a.send(map[string]any{"jsonrpc": "2.0", "id": id, "result": res})
}

func (a *agent) fail(id json.RawMessage, code int, msg string) {
	a.send(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
}

// intParam reads a bounded integer from params.
func intParam(params json.RawMessage, key string, def, max int) int {
	var p map[string]any
	_ = json.Unmarshal(params, &p)
	if f, ok := p[key].(float64); ok && f > 0 {
		return min(int(f), max)
	}
	return def
}

func (a *agent) handle(line []byte) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		fmt.Fprintf(os.Stderr, "fakeagent: unreadable line (%d bytes): %v\n", len(line), err)
		return
	}
	if m.Method == "" && len(m.ID) != 0 {
		a.answered(line, m.ID)
		return
	}
	if m.Method == "session/cancel" {
		var p struct {
			SessionID string `json:"sessionId"`
		}
		_ = json.Unmarshal(m.Params, &p)
		fmt.Fprintf(os.Stderr, "fakeagent: cancel %s\n", p.SessionID)
		a.cancelMu.Lock()
		if c := a.cancels[p.SessionID]; c != nil {
			close(c)
			delete(a.cancels, p.SessionID)
		}
		a.cancelMu.Unlock()
		return
	}
	if m.Method == "" || len(m.ID) == 0 {
		return // a notification
	}
	if a.mode == "sessions" && a.handleSessions(m) {
		return
	}
	switch m.Method {
	case "initialize":
		switch a.mode {
		case "init-error":
			a.fail(m.ID, -32603, "fakeagent refuses to initialize (FAKE_MODE=init-error)")
		case "hang-init":
		default:
			caps := map[string]any{"loadSession": false}
			if a.mode == "sessions" {
				caps = map[string]any{"loadSession": true, "sessionCapabilities": map[string]any{
					"list": map[string]any{}, "resume": map[string]any{}, "close": map[string]any{}, "delete": map[string]any{}}}
			}
			a.result(m.ID, map[string]any{
				"protocolVersion":   1,
				"agentCapabilities": caps,
				"authMethods":       []any{},
				"agentInfo":         map[string]string{"name": "fakeagent", "version": "0"},
			})
		}
	case "session/new":
		var p struct {
			Cwd    string `json:"cwd"`
			Resume string `json:"fakeSessionId"`
		}
		_ = json.Unmarshal(m.Params, &p)
		a.sessions++
		// Unique to this process (a.id), so processes sharing
		// FAKE_SESSIONS_DIR never name two sessions alike.
		sid := fmt.Sprintf("fake-%s-%d", a.id, a.sessions)
		if p.Resume != "" {
			sid = p.Resume
			fmt.Fprintf(os.Stderr, "fakeagent: session/new names %s\n", sid)
		}
		if a.mode == "sessions" {
			a.smu.Lock()
			if a.store[sid] == nil { // one it has already goes on as it is
				a.store[sid] = &fakeSession{cwd: p.Cwd}
			}
			a.smu.Unlock()
			if a.shared != "" {
				if err := os.WriteFile(filepath.Join(a.shared, sid), []byte(p.Cwd), 0o600); err != nil {
					fmt.Fprintln(os.Stderr, "fakeagent: FAKE_SESSIONS_DIR:", err)
				}
			}
		}
		a.result(m.ID, a.withModels(sid, map[string]any{"sessionId": sid}))
	case "session/set_config_option", "session/set_model", "session/set_mode":
		a.setModel(m)
	case "session/prompt":
		var p acpclient.PromptParams
		_ = json.Unmarshal(m.Params, &p)
		var text strings.Builder
		for _, b := range p.Prompt {
			if b.Type == "text" {
				text.WriteString(b.Text)
			}
		}
		fmt.Fprintf(os.Stderr, "fakeagent: prompt %s %.200s\n", p.SessionID, text.String())
		if args, ok := strings.CutPrefix(text.String(), "spend "); ok {
			a.spend(m.ID, p.SessionID, args)
			return
		}
		if secs, ok := strings.CutPrefix(text.String(), "sleep "); ok {
			if f, err := strconv.ParseFloat(secs, 64); err == nil && f >= 0 && f <= 60 {
				go func() { // ends with the turn, at most 60 s later
					time.Sleep(time.Duration(f * float64(time.Second)))
					a.result(m.ID, map[string]string{"stopReason": "end_turn"})
				}()
				return
			}
		}
		if secs, ok := strings.CutPrefix(text.String(), "trickle "); ok {
			if f, err := strconv.ParseFloat(secs, 64); err == nil && f >= 0 && f <= 60 {
				go a.trickle(m.ID, p.SessionID, time.Duration(f*float64(time.Second))) // ends with the turn, at most 60 s later
				return
			}
		}
		var chunks, size int
		if _, err := fmt.Sscanf(text.String(), "stream chunks=%d size=%d", &chunks, &size); err == nil {
			a.stream(p.SessionID, min(max(chunks, 0), 1_000_000), min(max(size, 0), 16<<20))
			a.result(m.ID, map[string]string{"stopReason": "end_turn"})
			return
		}
		if text.String() == "duplicate request ids" {
			// Two requests to the client with one id, both in flight.
			for range 2 {
				a.send(map[string]any{"jsonrpc": "2.0", "id": "dup", "method": "session/request_permission", "params": map[string]any{
					"sessionId": p.SessionID,
					"toolCall":  map[string]any{"toolCallId": "t1", "title": "twice"},
					"options":   []map[string]string{{"optionId": "allow", "name": "Allow", "kind": "allow_once"}},
				}})
			}
		}
		a.record(p.SessionID, "user_message_chunk", text.String())
		if a.mode == "sessions" && strings.Contains(text.String(), "permission") {
			go a.permissionTurn(m.ID, p.SessionID) // ends when the client answers
			return
		}
		if len(a.models) > 0 {
			text.WriteString(" [model " + a.current(p.SessionID) + "]")
		}
		if len(a.modes) > 0 {
			text.WriteString(" [mode " + a.currentMode(p.SessionID) + "]")
		}
		a.reply(p.SessionID, "You said: "+text.String())
		a.result(m.ID, map[string]string{"stopReason": "end_turn"})
	case "_demo/echo":
		if len(m.Params) == 0 {
			m.Params = json.RawMessage("null")
		}
		a.writeLine(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), m.ID...), `,"result":`...), append(m.Params, '}')...))
	case "_fake/hang":
		fmt.Fprintf(os.Stderr, "fakeagent: hanging on request %s\n", m.ID)
	case "_fake/garbage":
		for _, g := range garbage() {
			a.writeLine(g)
		}
		a.result(m.ID, map[string]bool{"ok": true})
	case "_fake/huge-line":
		n := intParam(m.Params, "bytes", 1<<20, 64<<20)
		head := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"nobody","pad":"`
		tail := `"}}`
		pad := max(0, n-len(head)-len(tail))
		a.writeLine([]byte(head + strings.Repeat("x", pad) + tail))
		a.result(m.ID, map[string]bool{"ok": true})
	case "_fake/huge-answer":
		n := intParam(m.Params, "bytes", 1<<20, 64<<20)
		a.result(m.ID, map[string]string{"pad": strings.Repeat("x", n)})
	case "_fake/host":
		a.result(m.ID, doHost(m.Params))
	case "_fake/double":
		a.result(m.ID, map[string]int{"n": 1})
		a.result(m.ID, map[string]int{"n": 2})
	case "_fake/unknown-id":
		for _, id := range []string{`999999999`, `"nope"`, `null`, `-1`, `1.5`, `{"a":1}`, `99999999999999999999999`} {
			a.writeLine([]byte(`{"jsonrpc":"2.0","id":` + id + `,"result":{"stray":true}}`))
		}
		a.result(m.ID, map[string]bool{"ok": true})
	case "_fake/stderr-flood":
		n := intParam(m.Params, "lines", 1000, 1_000_000)
		w := bufio.NewWriterSize(os.Stderr, 1<<16)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "fakeagent: stderr flood line %d of %d\n", i+1, n)
		}
		w.Flush()
		a.result(m.ID, map[string]int{"lines": n})
	default:
		a.fail(m.ID, -32601, "method not found: "+m.Method)
	}
}

// spend runs a "spend" prompt's turn (see the package doc) on a goroutine
// of its own, which ends with the turn, at most 1000 × 10 s later.
func (a *agent) spend(id json.RawMessage, sid, args string) {
	fields := strings.Fields(args)
	if len(fields) == 0 {
		a.fail(id, -32602, "spend: no amounts")
		return
	}
	amounts := strings.Split(fields[0], ",")
	currency, every, tokens, cancelUsage, running := "USD", 100*time.Millisecond, "", false, false
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "cancel":
			cancelUsage = v == "usage"
		case "total":
			running = v == "load"
		case "currency":
			currency = v
		case "every":
			if d, err := time.ParseDuration(v); err == nil && d >= 0 && d <= 10*time.Second {
				every = d
			}
		case "tokens":
			if in, out, ok := strings.Cut(v, ","); ok {
				tokens = `{"inputTokens":` + in + `,"outputTokens":` + out + `,"totalTokens":0}`
			}
		}
	}
	if len(amounts) > 1000 {
		amounts = amounts[:1000]
	}
	cancelled := `{"stopReason":"cancelled"}`
	if tokens != "" && cancelUsage {
		cancelled = `{"stopReason":"cancelled","usage":` + tokens + `}`
	}
	cancel := make(chan struct{})
	a.cancelMu.Lock()
	if a.cancels == nil {
		a.cancels = map[string]chan struct{}{}
	}
	a.cancels[sid] = cancel
	base := a.running[sid]
	a.cancelMu.Unlock()
	if running { // the running total plus the turn's own cost so far; a load replays none
		a.keepCost(sid, "")
		for i, amount := range amounts {
			v, err := strconv.ParseFloat(amount, 64)
			if err != nil {
				a.fail(id, -32602, "spend total=load: amount "+amount+" is not a number")
				return
			}
			amounts[i] = strconv.FormatFloat(base+v, 'g', -1, 64)
		}
	}
	last := "" // the last amount reported
	sidJSON, _ := json.Marshal(sid)
	curJSON, _ := json.Marshal(currency)
	go func() {
		defer func() {
			a.cancelMu.Lock()
			if a.cancels[sid] == cancel {
				delete(a.cancels, sid)
			}
			if v, err := strconv.ParseFloat(last, 64); running && err == nil {
				if a.running == nil {
					a.running = map[string]float64{}
				}
				a.running[sid] = v
			}
			a.cancelMu.Unlock()
		}()
		tick := time.NewTicker(max(every, time.Millisecond))
		defer tick.Stop()
		for i, amount := range amounts {
			if i > 0 {
				select {
				case <-cancel:
					a.writeLine([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + cancelled + `}`))
					return
				case <-tick.C:
				}
			}
			cost := `{"amount":` + amount + `,"currency":` + string(curJSON) + `}`
			a.writeLine([]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":` + string(sidJSON) +
				`,"update":{"sessionUpdate":"usage_update","used":0,"size":1000000,"cost":` + cost + `}}}`))
			if _, err := strconv.ParseFloat(amount, 64); err == nil && !running {
				a.keepCost(sid, cost)
			}
			last = amount
		}
		select { // a last chance to be cancelled after the last report
		case <-cancel:
			a.writeLine([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + cancelled + `}`))
			return
		case <-time.After(every):
		}
		res := `{"stopReason":"end_turn"`
		if tokens != "" {
			res += `,"usage":` + tokens
		}
		a.writeLine([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + res + `}}`))
	}()
}

// trickleEvery is the pause between the chunks of a "trickle" turn.
const trickleEvery = 5 * time.Millisecond

// trickle streams chunks to sid for d, then answers id right after the
// last one, in the same write.
func (a *agent) trickle(id json.RawMessage, sid string, d time.Duration) {
	chunk := func(n int) []byte {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
			"sessionId": sid, "update": textUpdate("agent_message_chunk", fmt.Sprintf("chunk %d ", n))}})
		return b
	}
	end := time.Now().Add(d)
	n := 1
	for ; time.Now().Before(end); n++ {
		a.writeLine(chunk(n))
		time.Sleep(trickleEvery)
	}
	answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]string{"stopReason": "end_turn"}})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.out.Write(chunk(n))
	a.out.WriteByte('\n')
	a.out.Write(answer)
	a.out.WriteByte('\n')
	a.out.Flush()
}

// stream writes n agent_message_chunk notifications of session sid, each
// size bytes long (or as short as one can be), flushing only when the
// buffer fills.
func (a *agent) stream(sid string, n, size int) {
	sidJSON, _ := json.Marshal(sid)
	head := `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":` + string(sidJSON) +
		`,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"`
	const tail = `"}}}}`
	line := []byte(head + strings.Repeat("x", max(size-len(head)-len(tail), 0)) + tail)
	a.mu.Lock() // a silent turn may answer meanwhile
	defer a.mu.Unlock()
	for range n {
		a.out.Write(line)
		a.out.WriteByte('\n')
	}
	a.out.Flush()
}

// garbage returns lines no JSON-RPC peer should act on, and two valid
// messages addressed to nobody.
func garbage() [][]byte {
	deep := strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
	return [][]byte{
		[]byte("this is not JSON"),
		[]byte("\xff\xfe\xfd invalid UTF-8"),
		[]byte("\x00\x00\x00"),
		[]byte(`{"jsonrpc":"2.0","id":`),
		[]byte(`{"jsonrpc":"2.0","id":1,"id":2,"result":{}}`),
		[]byte(`[{"jsonrpc":"2.0","method":"session/update","params":{}}]`),
		[]byte(`null`),
		[]byte(`{}`),
		[]byte(`{"jsonrpc":"2.0","method":"session/update","params":` + deep + `}`),
		[]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"nobody","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"stray"}}}}`),
		[]byte(`{"jsonrpc":"2.0","id":"stray-1","method":"fs/read_text_file","params":{"sessionId":"nobody","path":"/etc/passwd"}}`),
	}
}

// fakeSession is a session FAKE_MODE=sessions keeps.
type fakeSession struct {
	cwd     string
	history []map[string]any // session/update params' update objects
	cost    string           // the last cost report of a total that carries on (a usage_update's cost object), replayed by a load
}

// keepCost notes the last cost report of session sid, cost (a
// usage_update's cost object), for its loads' replays; "" forgets it (a
// total that starts again at each load replays none). With
// FAKE_SESSIONS_DIR it is shared with the other processes.
func (a *agent) keepCost(sid, cost string) {
	a.smu.Lock()
	defer a.smu.Unlock()
	if s := a.store[sid]; s != nil {
		s.cost = cost
	}
	if a.shared == "" || a.mode != "sessions" {
		return
	}
	f := filepath.Join(a.shared, sid+".cost")
	if cost == "" {
		_ = os.Remove(f)
	} else if err := os.WriteFile(f, []byte(cost), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "fakeagent: FAKE_SESSIONS_DIR:", err)
	}
}

// keptCost is session sid's last cost report for a load's replay ("":
// none); s is its session, a.smu held.
func (a *agent) keptCost(sid string, s *fakeSession) string {
	switch {
	case a.noCost:
		return ""
	case a.shared != "":
		b, _ := os.ReadFile(filepath.Join(a.shared, sid+".cost"))
		return string(b)
	}
	return s.cost
}

// permissionAnswer is the client's answer to a permission request: its
// outcome ("selected" or "cancelled"), or failed for an error.
type permissionAnswer struct {
	outcome  string
	optionID string
	failed   bool
}

// textUpdate is a session/update's update of kind with one text block.
func textUpdate(kind, text string) map[string]any {
	return map[string]any{"sessionUpdate": kind, "content": map[string]string{"type": "text", "text": text}}
}

func (a *agent) update(sid string, u map[string]any) {
	a.send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{"sessionId": sid, "update": u}})
}

// record adds an update to the history of a kept session.
func (a *agent) record(sid, kind, text string) {
	a.smu.Lock()
	defer a.smu.Unlock()
	if s := a.store[sid]; s != nil {
		s.history = append(s.history, textUpdate(kind, text))
	}
}

// reply sends the agent_message_chunk text and records it.
func (a *agent) reply(sid, text string) {
	a.update(sid, textUpdate("agent_message_chunk", text))
	a.record(sid, "agent_message_chunk", text)
}

// permissionTurn asks the client's permission for a tool call of sid and
// answers the prompt id once the client has answered.
func (a *agent) permissionTurn(id json.RawMessage, sid string) {
	a.smu.Lock()
	a.asked++
	reqID := fmt.Sprintf("perm-%d", a.asked)
	wait := make(chan permissionAnswer, 1)
	a.waits[strconv.Quote(reqID)] = wait
	a.smu.Unlock()
	options := []map[string]string{{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
		{"optionId": "reject", "name": "Reject", "kind": "reject_once"}}
	if len(a.modes) > 0 { // as claude-code-acp: "Always Allow" moves the session to acceptEdits
		options = append(options, map[string]string{"optionId": "acceptEdits", "name": "Always Allow", "kind": "allow_always"})
	}
	a.send(map[string]any{"jsonrpc": "2.0", "id": reqID, "method": "session/request_permission", "params": map[string]any{
		"sessionId": sid,
		"toolCall":  map[string]any{"toolCallId": "tool-" + reqID, "title": "Run a harmless command", "kind": "execute"},
		"options":   options,
	}})
	ans := <-wait // the gateway answers it in the client's place when the client goes
	fmt.Fprintf(os.Stderr, "fakeagent: permission answered %s %s\n", ans.outcome, ans.optionID)
	if ans.failed || ans.outcome != "selected" {
		a.result(id, map[string]string{"stopReason": "cancelled"})
		return
	}
	a.reply(sid, "Permission granted (allow).")
	a.result(id, map[string]string{"stopReason": "end_turn"})
}

// answered takes the answer (line) to the agent's request id.
func (a *agent) answered(line []byte, id json.RawMessage) {
	a.smu.Lock()
	wait := a.waits[string(id)]
	delete(a.waits, string(id))
	a.smu.Unlock()
	if wait == nil {
		return
	}
	var r struct {
		Result *struct {
			Outcome struct {
				Outcome  string `json:"outcome"`
				OptionID string `json:"optionId"`
			} `json:"outcome"`
		} `json:"result"`
	}
	if json.Unmarshal(line, &r) != nil || r.Result == nil {
		wait <- permissionAnswer{failed: true}
		return
	}
	wait <- permissionAnswer{outcome: r.Result.Outcome.Outcome, optionID: r.Result.Outcome.OptionID}
}

// handleSessions serves the session methods of FAKE_MODE=sessions and
// reports whether m was one.
func (a *agent) handleSessions(m message) bool {
	switch m.Method {
	case "session/load", "session/resume", "session/close", "session/delete", "session/list":
	default:
		return false
	}
	if m.Method == "session/list" {
		a.smu.Lock()
		list := []map[string]string{}
		for sid, s := range a.store {
			list = append(list, map[string]string{"sessionId": sid, "cwd": s.cwd})
		}
		a.smu.Unlock()
		a.result(m.ID, map[string]any{"sessions": list})
		return true
	}
	var p struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(m.Params, &p)
	if ms, _ := strconv.Atoi(os.Getenv("FAKE_LOAD_DELAY_MS")); ms > 0 && (m.Method == "session/load" || m.Method == "session/resume") {
		time.Sleep(time.Duration(min(ms, 10_000)) * time.Millisecond)
	}
	a.smu.Lock()
	s := a.store[p.SessionID]
	if s == nil && a.shared != "" && m.Method != "session/delete" && filepath.Base(p.SessionID) == p.SessionID {
		// Another process's session (FAKE_SESSIONS_DIR): known here from now on.
		if cwd, err := os.ReadFile(filepath.Join(a.shared, p.SessionID)); err == nil {
			s = &fakeSession{cwd: string(cwd)}
			a.store[p.SessionID] = s
		}
	}
	var history []map[string]any
	var cost string
	if s != nil {
		history = append(history, s.history...)
		cost = a.keptCost(p.SessionID, s)
		if m.Method == "session/delete" {
			delete(a.store, p.SessionID)
		}
	}
	a.smu.Unlock()
	if s == nil {
		a.fail(m.ID, -32002, "session not found: "+p.SessionID)
		return true
	}
	if m.Method == "session/load" || m.Method == "session/resume" {
		a.restartTotal(p.SessionID)
	}
	if m.Method == "session/load" {
		for _, u := range history {
			a.update(p.SessionID, u)
		}
		if cost != "" { // the total carries on: the replay tells it, as a well-behaved agent would
			sidJSON, _ := json.Marshal(p.SessionID)
			a.writeLine([]byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":` + string(sidJSON) +
				`,"update":{"sessionUpdate":"usage_update","used":0,"size":1000000,"cost":` + cost + `}}}`))
		}
	}
	res := map[string]any{}
	if m.Method == "session/load" || m.Method == "session/resume" {
		res = a.withModels(p.SessionID, res)
	}
	a.result(m.ID, res)
	return true
}

// restartTotal starts session sid's running total (spend total=load) again
// from zero.
func (a *agent) restartTotal(sid string) {
	a.cancelMu.Lock()
	delete(a.running, sid)
	a.cancelMu.Unlock()
}

// current is the model session sid runs on (FAKE_MODELS).
func (a *agent) current(sid string) string {
	if cur, ok := a.model[sid]; ok {
		return cur
	}
	return a.models[0]
}

// configOptions are session sid's config options, in FAKE_MODEL_SHAPE.
func (a *agent) configOptions(sid string) []any {
	key := "id"
	if a.modelShape == "v2" {
		key = "configId"
	}
	var opts []any
	for _, id := range a.models {
		opts = append(opts, map[string]string{"value": id, "name": "Model " + id})
	}
	if a.modelShape == "v2" {
		half := (len(opts) + 1) / 2
		opts = []any{map[string]any{"groupId": "first", "name": "First", "options": opts[:half]},
			map[string]any{"groupId": "rest", "name": "Rest", "options": opts[half:]}}
	}
	mode := map[string]any{key: "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "ask",
		"options": []any{map[string]string{"value": "ask", "name": "Ask"}, map[string]string{"value": "code", "name": "Code"}}}
	if len(a.modes) > 0 {
		var modes []any
		for _, id := range a.modes {
			modes = append(modes, map[string]string{"value": id, "name": "Mode " + id})
		}
		mode["currentValue"], mode["options"] = a.currentMode(sid), modes
	}
	out := []any{mode}
	if len(a.models) > 0 {
		out = append(out, map[string]any{key: "model", "name": "Model", "category": "model", "type": "select", "currentValue": a.current(sid),
			"options": opts, "_meta": map[string]any{"fake": "kept"}})
	}
	return out
}

// currentMode is the mode session sid runs in (FAKE_MODES).
func (a *agent) currentMode(sid string) string {
	if cur, ok := a.curMode[sid]; ok {
		return cur
	}
	return a.modes[0]
}

// withModels adds session sid's model selectors to a result (FAKE_MODELS).
func (a *agent) withModels(sid string, res map[string]any) map[string]any {
	if len(a.models) == 0 && len(a.modes) == 0 {
		return res
	}
	if len(a.models) > 0 && a.modelShape != "api" || len(a.models) == 0 && a.modeShape != "modes" {
		res["configOptions"] = a.configOptions(sid)
	}
	if len(a.modes) > 0 && a.modeShape != "config" {
		var avail []any
		for _, id := range a.modes {
			avail = append(avail, map[string]string{"id": id, "name": "Mode " + id})
		}
		res["modes"] = map[string]any{"currentModeId": a.currentMode(sid), "availableModes": avail}
	}
	if len(a.models) == 0 {
		return res
	}
	if a.modelShape == "api" || a.modelShape == "both" {
		var avail []any
		for _, id := range a.models {
			avail = append(avail, map[string]string{"modelId": id, "name": "Model " + id})
		}
		res["models"] = map[string]any{"currentModelId": a.current(sid), "availableModels": avail}
	}
	return res
}

// setMode serves session/set_mode and session/set_config_option of the
// mode option (FAKE_MODES).
func (a *agent) setMode(m message, sid, to string, value json.RawMessage) {
	if m.Method == "session/set_config_option" {
		_ = json.Unmarshal(value, &to)
		fmt.Fprintf(os.Stderr, "fakeagent: set_config_option mode=%s\n", to)
	} else {
		fmt.Fprintf(os.Stderr, "fakeagent: set_mode %s\n", to)
	}
	offered := false
	for _, id := range a.modes {
		offered = offered || id == to
	}
	if !offered {
		a.fail(m.ID, -32602, "no such mode")
		return
	}
	a.curMode[sid] = to
	a.update(sid, map[string]any{"sessionUpdate": "current_mode_update", "currentModeId": to})
	if m.Method == "session/set_mode" {
		a.result(m.ID, map[string]any{})
		return
	}
	a.result(m.ID, map[string]any{"configOptions": a.configOptions(sid)})
}

// setModel serves session/set_config_option and session/set_model.
func (a *agent) setModel(m message) {
	var p struct {
		SessionID string          `json:"sessionId"`
		ConfigID  string          `json:"configId"`
		Value     json.RawMessage `json:"value"`
		ModelID   string          `json:"modelId"`
		ModeID    string          `json:"modeId"`
	}
	_ = json.Unmarshal(m.Params, &p)
	if m.Method == "session/set_mode" || m.Method == "session/set_config_option" && p.ConfigID == "mode" {
		a.setMode(m, p.SessionID, p.ModeID, p.Value)
		return
	}
	to := p.ModelID
	if m.Method == "session/set_config_option" {
		_ = json.Unmarshal(p.Value, &to)
		fmt.Fprintf(os.Stderr, "fakeagent: set_config_option %s=%s\n", p.ConfigID, to)
	} else {
		fmt.Fprintf(os.Stderr, "fakeagent: set_model %s\n", to)
	}
	offered := false
	for _, id := range a.models {
		offered = offered || id == to
	}
	if !offered || m.Method == "session/set_config_option" && p.ConfigID != "model" {
		a.fail(m.ID, -32602, "no such model or option")
		return
	}
	a.model[p.SessionID] = to
	a.update(p.SessionID, map[string]any{"sessionUpdate": "config_option_update", "configOptions": a.configOptions(p.SessionID)})
	if m.Method == "session/set_model" {
		a.result(m.ID, map[string]any{})
		return
	}
	a.result(m.ID, map[string]any{"configOptions": a.configOptions(p.SessionID)})
}
