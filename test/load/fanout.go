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
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// The fanout scenario (issue #22): what it costs to fan one session's
// stream out to clients attached to it.
//
// Each round is a fresh session on one gateway (the binary, the load agent,
// sessions.max_clients 9): an owner client opens it with session/new, k
// clients attach to it over WebSocket (session/attach, historyPolicy
// "none"), then the owner prompts for a long stream (300 B and 20 KB
// chunks, as in the stream scenario) and every client reads all of it. Each
// client is a process of its own (`load fanout-client`) and reports Unix
// times, so that every client is timed from the moment the owner sent the
// prompt: the owner to its prompt's answer, an attached client to its
// turn_complete. Every k (0, 1, 2, 4, 8 by default) runs in every
// repetition, ascending in even repetitions and descending in odd ones, so
// that a drift of the machine is spread over all of them. The ratios are
// against k = 0, the owner alone, in the same run.

// --- the client process: `load fanout-client` ---

// fanoutReady is a fan-out client's first line: the session it opened
// (owner) or attached to.
type fanoutReady struct {
	Ready   bool   `json:"ready"`
	Session string `json:"session,omitempty"`
	Error   string `json:"error,omitempty"`
}

func (r fanoutReady) setUp() (bool, string) { return r.Ready, r.Error }

// fanoutRun is what one client of a round measured. Times are Unix
// nanoseconds: one clock for every process on the machine.
type fanoutRun struct {
	Role      string   `json:"role"` // "owner" or "attached"
	Msgs      int      `json:"msgs"`
	Bytes     int64    `json:"bytes"`
	SentNS    int64    `json:"prompt_sent_unix_ns,omitempty"` // the owner's prompt
	FirstNS   int64    `json:"first_msg_unix_ns"`
	EndNS     int64    `json:"end_unix_ns"` // the prompt's answer (owner) or turn_complete (attached)
	ClientCPU int64    `json:"client_cpu_ns"`
	InOrder   bool     `json:"in_order"`
	Errors    []string `json:"errors,omitempty"`
}

// fanoutClientMain connects over WebSocket and initializes. An owner opens
// a session, says so, waits for "go" on stdin, streams one prompt and
// prints its fanoutRun; an attached client attaches to -session
// (historyPolicy "none"), says it is ready, and reads until the turn is
// complete. Both then wait for stdin to end and close cleanly (1000), so
// that the gateway keeps nothing of them for a resume.
func fanoutClientMain(args []string) int {
	fs := flag.NewFlagSet("load fanout-client", flag.ContinueOnError)
	url := fs.String("url", "", "the gateway's WebSocket URL")
	role := fs.String("role", "owner", "owner (opens the session and prompts) or attached")
	session := fs.String("session", "", "attached: the session to attach to")
	chunks := fs.Int("chunks", 1000, "chunks the owner asks for")
	size := fs.Int("size", 300, "bytes per chunk")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	exitAfter("fanout-client", *timeout)
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(fanoutReady{Error: err.Error()})
		return 1
	}
	if *role != "owner" && (*role != "attached" || *session == "") {
		return fail(fmt.Errorf("unknown role %q (owner, or attached with -session)", *role))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t, err := dialWS(ctx, *url, []string{"acp"})
	cancel()
	if err != nil {
		return fail(err)
	}
	defer closeClean(t)
	c := &rpcClient{t: t}
	if err := c.initialize(); err != nil {
		return fail(err)
	}
	in := bufio.NewReader(os.Stdin)
	var r fanoutRun
	if *role == "owner" {
		sid, err := c.newSession()
		if err != nil {
			return fail(err)
		}
		if err := out.Encode(fanoutReady{Ready: true, Session: sid}); err != nil {
			return 1
		}
		if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "go" {
			return 1
		}
		sent := time.Now().UnixNano()
		s := streamOnce(t, sid, *chunks, *size)
		r = fanoutRun{Role: "owner", Msgs: s.Msgs, Bytes: s.Bytes, SentNS: sent, EndNS: sent + s.ElapsedNS,
			ClientCPU: s.ClientCPU, InOrder: s.InOrder, Errors: s.Errors}
		if s.Msgs > 0 {
			r.FirstNS = sent + s.FirstNS
		}
	} else {
		if err := attach(c, *session, "none"); err != nil {
			return fail(err)
		}
		if err := out.Encode(fanoutReady{Ready: true, Session: *session}); err != nil {
			return 1
		}
		r = readAttached(t, *session, *chunks)
	}
	if err := out.Encode(r); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, in) // until the harness is done measuring
	return 0
}

// attach sends session/attach for sid with historyPolicy policy and waits
// for its result (the replay, if any, is skipped).
func attach(c *rpcClient, sid, policy string) error {
	_, err := c.call("session/attach", map[string]any{
		"sessionId": sid, "historyPolicy": policy,
		"clientInfo": map[string]string{"name": "acpgate-load", "version": "1"},
	})
	return err
}

// closeClean closes a WebSocket with 1000, which ends the gateway's side of
// the connection at once; any other transport is just closed.
func closeClean(t transport) {
	if ws, ok := t.(*wsTransport); ok {
		if ws.c.Close(websocket.StatusNormalClosure, "") == nil {
			return
		}
	}
	_ = t.Close()
}

// readAttached reads what an attached client gets of one turn: chunks,
// each for the session and with the next sequence number, until
// turn_complete. The other updates of the session (prompt_received,
// presence) are skipped.
func readAttached(t transport, sid string, n int) fanoutRun {
	r := fanoutRun{Role: "attached"}
	cc := chunkCheck{n: n}
	fail := cc.fail
	head := chunkPrefix + strconv.Quote(sid) + `,"update":{"sessionUpdate":"`
	chunk := []byte(head + `agent_message_chunk","content":{"type":"text","text":"`)
	turnDone := []byte(head + `turn_complete"`)
	update := []byte(head)
	others := 0
	cpu0 := selfCPU()
	done := false
	for !done {
		if others > 1000 {
			fail("more than 1000 updates other than chunks")
			break
		}
		msg, err := t.Recv()
		if err != nil {
			fail("after %d chunks: %v", cc.msgs, err)
			break
		}
		switch {
		case bytes.HasPrefix(msg, chunk):
			cc.chunk(msg, chunkSeq(msg[len(chunk):]))
		case bytes.HasPrefix(msg, turnDone):
			done = true
			r.EndNS = time.Now().UnixNano()
			if !bytes.Contains(msg, []byte(`"stopReason":"end_turn"`)) {
				fail("turn completed with %.300s", msg)
			}
		case bytes.HasPrefix(msg, update):
			others++ // prompt_received, client_connected, …
		default:
			others++
			fail("unexpected message %.300s", msg)
		}
	}
	r.ClientCPU = (selfCPU() - cpu0).Nanoseconds()
	r.InOrder = cc.end(done, "no turn_complete")
	r.Msgs, r.Bytes, r.Errors = cc.msgs, cc.bytes, cc.errors
	if cc.msgs > 0 {
		r.FirstNS = cc.first.UnixNano()
	}
	return r
}

// --- the harness side ---

// fanoutRound is one turn: the owner and its k attached clients, and what
// the gateway and the agents spent meanwhile.
type fanoutRound struct {
	Owner     fanoutRun   `json:"owner"`
	Attached  []fanoutRun `json:"attached"`
	ServerCPU int64       `json:"server_cpu_ns"`
	AgentCPU  int64       `json:"agent_cpu_ns"`
}

// rate is a client's messages per second from the owner's prompt to its
// end (0 when it did not end).
func (r fanoutRound) rate(c fanoutRun) float64 {
	if c.EndNS <= r.Owner.SentNS || c.Msgs == 0 {
		return 0
	}
	return float64(c.Msgs) / (float64(c.EndNS-r.Owner.SentNS) / 1e9)
}

// delivered is every client's messages over the time from the prompt to
// the last client's end.
func (r fanoutRound) delivered() (msgs int, rate float64) {
	end := r.Owner.EndNS
	msgs = r.Owner.Msgs
	for _, a := range r.Attached {
		end = max(end, a.EndNS)
		msgs += a.Msgs
	}
	if end <= r.Owner.SentNS {
		return msgs, 0
	}
	return msgs, float64(msgs) / (float64(end-r.Owner.SentNS) / 1e9)
}

// fanoutK is one k of a case: its rounds and their medians.
type fanoutK struct {
	K      int           `json:"attached_clients"`
	Rounds []fanoutRound `json:"rounds"`
	// Medians over the rounds (msgs/s).
	OwnerMsgsPerSec float64 `json:"owner_msgs_per_s"`
	OwnerMin        float64 `json:"owner_min_msgs_per_s"`
	OwnerMax        float64 `json:"owner_max_msgs_per_s"`
	// Over every attached client of every round.
	AttachedMsgsPerSec float64 `json:"attached_msgs_per_s,omitempty"`
	// The slowest attached client of each round, median over the rounds.
	SlowestMsgsPerSec float64 `json:"slowest_attached_msgs_per_s,omitempty"`
	// Every client's messages over the time to the last one's end.
	DeliveredMsgsPerSec float64 `json:"delivered_msgs_per_s"`
	// The gateway's and the clients' CPU per million messages delivered
	// (to all clients together).
	ServerCPUPM float64 `json:"server_cpu_s_per_million_delivered"`
	ClientCPUPM float64 `json:"client_cpu_s_per_million_delivered"`
	// Against k = 0 in the same run: the owner's rate, an attached
	// client's (median), and the messages delivered to all.
	OwnerVsAlone     float64 `json:"owner_vs_alone"`
	AttachedVsAlone  float64 `json:"attached_vs_alone,omitempty"`
	DeliveredVsAlone float64 `json:"delivered_vs_alone"`
}

type fanoutCase struct {
	Chunks int        `json:"chunks"`
	Size   int        `json:"chunk_bytes"`
	Ks     []*fanoutK `json:"ks"`
	// Peak RSS (VmHWM) of the gateway after this case (cumulative).
	GatewayPeakRSS int64 `json:"gateway_peak_rss_bytes"`
}

type fanoutResult struct {
	MaxClients int           `json:"max_clients"`
	Cases      []*fanoutCase `json:"cases"`
}

func (r *fanoutResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, c := range r.Cases {
		for _, k := range c.Ks {
			if len(k.Rounds) == 0 {
				out = append(out, fmt.Sprintf("fanout %d B, k=%d: no rounds", c.Size, k.K))
			}
			for i, rd := range k.Rounds {
				where := fmt.Sprintf("fanout %d B, k=%d, run %d", c.Size, k.K, i+1)
				if len(rd.Attached) != k.K {
					out = append(out, fmt.Sprintf("%s: %d attached clients reported", where, len(rd.Attached)))
				}
				for j, cl := range append([]fanoutRun{rd.Owner}, rd.Attached...) {
					who := "owner"
					if j > 0 {
						who = fmt.Sprintf("attached client %d", j)
					}
					out = append(out, chunkProblems(where+", "+who, cl.Errors, cl.Msgs, c.Chunks, cl.InOrder)...)
					if cl.Msgs > 0 && rd.rate(cl) <= 0 {
						out = append(out, where+", "+who+": no elapsed time")
					}
				}
			}
		}
	}
	return out
}

// fanoutMaxClients is the generated configuration's sessions.max_clients:
// the owner and 8 attached clients.
const fanoutMaxClients = 9

func (h *harness) runFanout() (*fanoutResult, error) {
	if k := slices.Max(h.c.FanoutKs); k+1 > fanoutMaxClients {
		return nil, fmt.Errorf("fanout: %d attached clients and the owner exceed max_clients %d", k, fanoutMaxClients)
	}
	// As the stream scenario's gateway (send queues sized for the whole
	// stream: attached clients get no backpressure, so that a slow one never
	// delays the others), with room for the owner and 8 attached clients.
	cfg := gwConfig{minIdle: 1, maxProcs: 4, perProc: 32, queueMsgs: 4 << 20, queueBytes: 1 << 30, maxClients: fanoutMaxClients}
	gw, err := h.startGateway(cfg, true)
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	res := &fanoutResult{MaxClients: fanoutMaxClients}
	var errs []string
	for _, cs := range [][2]int{{h.c.FanoutSmallChunks, h.c.SmallSize}, {h.c.FanoutLargeChunks, h.c.LargeSize}} {
		c := &fanoutCase{Chunks: cs[0], Size: cs[1]}
		res.Cases = append(res.Cases, c)
		for _, k := range h.c.FanoutKs {
			c.Ks = append(c.Ks, &fanoutK{K: k})
		}
		for rep := 0; rep < h.c.FanoutReps; rep++ {
			order := slices.Clone(c.Ks)
			if rep%2 == 1 {
				slices.Reverse(order)
			}
			for _, fk := range order {
				fmt.Fprintf(h.log, "load: fanout %d × %d B to the owner and %d attached clients, run %d\n", c.Chunks, c.Size, fk.K, rep+1)
				rd, err := h.fanoutRound(gw, fk.K, c.Chunks, c.Size)
				if err != nil {
					errs = append(errs, fmt.Sprintf("%d B, k=%d: %v", c.Size, fk.K, err))
					continue
				}
				fk.Rounds = append(fk.Rounds, rd)
			}
		}
		for _, fk := range c.Ks {
			fk.aggregate()
		}
		if len(c.Ks) > 0 && c.Ks[0].K == 0 {
			alone := c.Ks[0].OwnerMsgsPerSec
			for _, fk := range c.Ks {
				fk.OwnerVsAlone = ratio(fk.OwnerMsgsPerSec, alone)
				fk.AttachedVsAlone = ratio(fk.AttachedMsgsPerSec, alone)
				fk.DeliveredVsAlone = ratio(fk.DeliveredMsgsPerSec, c.Ks[0].DeliveredMsgsPerSec)
			}
		}
		c.GatewayPeakRSS, _ = procStatus(gw.Pid(), "VmHWM")
	}
	if len(errs) > 0 {
		return res, errors.New(strings.Join(errs, "; "))
	}
	return res, nil
}

func ratio(x, base float64) float64 {
	if base <= 0 {
		return 0
	}
	return x / base
}

// fanoutRound runs one turn: the owner's session, k clients attached to
// it, the stream, every client's report.
func (h *harness) fanoutRound(gw *server, k, n, size int) (fanoutRound, error) {
	var rd fanoutRound
	owner, err := h.startFanoutChild(gw.url, "owner", "", n, size)
	if err != nil {
		return rd, fmt.Errorf("owner: %w", err)
	}
	defer owner.finish(10 * time.Second)
	sid := owner.ready.Session
	attached := make([]*fanoutChild, 0, k)
	defer func() {
		for _, a := range attached {
			a.finish(10 * time.Second)
		}
	}()
	for i := range k {
		a, err := h.startFanoutChild(gw.url, "attached", sid, n, size)
		if err != nil {
			return rd, fmt.Errorf("attached client %d: %w", i+1, err)
		}
		attached = append(attached, a)
	}
	serverPIDs, agentPIDs := []int{gw.Pid()}, descendants(gw.Pid())
	s0, a0 := cpuOf(serverPIDs), cpuOf(agentPIDs)
	if _, err := io.WriteString(owner.stdin, "go\n"); err != nil {
		return rd, err
	}
	timeout := h.streamTimeout(n*(k+1), size)
	if err := owner.decode(&rd.Owner, timeout); err != nil {
		return rd, fmt.Errorf("owner: %v %s", err, owner.errb.String())
	}
	for i, a := range attached {
		var r fanoutRun
		if err := a.decode(&r, timeout); err != nil {
			return rd, fmt.Errorf("attached client %d: %v %s", i+1, err, a.errb.String())
		}
		rd.Attached = append(rd.Attached, r)
	}
	rd.ServerCPU = (cpuOf(serverPIDs) - s0).Nanoseconds()
	rd.AgentCPU = (cpuOf(agentPIDs) - a0).Nanoseconds()
	return rd, nil
}

// fanoutChild is a running `load fanout-client`.
type fanoutChild struct {
	*child
	ready fanoutReady
}

func (h *harness) startFanoutChild(url, role, sid string, n, size int) (*fanoutChild, error) {
	args := []string{"fanout-client", "-url", url, "-role", role, "-chunks", strconv.Itoa(n), "-size", strconv.Itoa(size),
		"-timeout", h.streamTimeout(n*fanoutMaxClients, size).String()}
	if sid != "" {
		args = append(args, "-session", sid)
	}
	c, ready, err := startClient[fanoutReady](h, args...)
	if err != nil {
		return nil, err
	}
	return &fanoutChild{child: c, ready: ready}, nil
}

func (k *fanoutK) aggregate() {
	var owner, att, slowest, deliv, srv, cli []float64
	for _, rd := range k.Rounds {
		o := rd.rate(rd.Owner)
		if o <= 0 {
			continue
		}
		owner = append(owner, o)
		slow := 0.0
		for i, a := range rd.Attached {
			r := rd.rate(a)
			att = append(att, r)
			if i == 0 || r < slow {
				slow = r
			}
		}
		if len(rd.Attached) > 0 {
			slowest = append(slowest, slow)
		}
		msgs, d := rd.delivered()
		deliv = append(deliv, d)
		if msgs > 0 {
			perM := 1e6 / float64(msgs) / 1e9
			srv = append(srv, float64(rd.ServerCPU)*perM)
			var c int64
			for _, cl := range append([]fanoutRun{rd.Owner}, rd.Attached...) {
				c += cl.ClientCPU
			}
			cli = append(cli, float64(c)*perM)
		}
	}
	k.OwnerMsgsPerSec, k.AttachedMsgsPerSec, k.SlowestMsgsPerSec = median(owner), median(att), median(slowest)
	if len(owner) > 0 {
		k.OwnerMin, k.OwnerMax = slices.Min(owner), slices.Max(owner)
	}
	k.DeliveredMsgsPerSec, k.ServerCPUPM, k.ClientCPUPM = median(deliv), median(srv), median(cli)
}

func (r *fanoutResult) print(w io.Writer) {
	fmt.Fprintf(w, "\nFANOUT: one session, its owner streaming one turn, k clients attached to it (session/attach, historyPolicy none) reading everything (medians of runs; ratios against k = 0 in this run)\n")
	tw := newTable(w)
	fmt.Fprintln(tw, "chunks × size\tk\towner msgs/s\t(min–max)\tattached msgs/s\tslowest\tall clients msgs/s\towner ÷ alone\tattached ÷ alone\tall ÷ alone\tCPU s/M delivered: gateway\tclients\t")
	for _, c := range r.Cases {
		for _, k := range c.Ks {
			att, slow, attR := "-", "-", "-"
			if k.K > 0 {
				att, slow, attR = fmt.Sprintf("%.0f", k.AttachedMsgsPerSec), fmt.Sprintf("%.0f", k.SlowestMsgsPerSec), fmtRatio(k.AttachedVsAlone)
			}
			fmt.Fprintf(tw, "%d × %s\t%d\t%.0f\t%.0f–%.0f\t%s\t%s\t%.0f\t%s\t%s\t%s\t%.2f\t%.2f\t\n", c.Chunks, fmtBytes(float64(c.Size)), k.K,
				k.OwnerMsgsPerSec, k.OwnerMin, k.OwnerMax, att, slow, k.DeliveredMsgsPerSec,
				fmtRatio(k.OwnerVsAlone), attR, fmtRatio(k.DeliveredVsAlone), k.ServerCPUPM, k.ClientCPUPM)
		}
	}
	tw.Flush()
	for _, c := range r.Cases {
		fmt.Fprintf(w, "gateway peak RSS after %d × %s: %s\n", c.Chunks, fmtBytes(float64(c.Size)), fmtBytes(float64(c.GatewayPeakRSS)))
	}
}
