package proxy

import (
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/inflight"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/multiclient"
	"github.com/acpgate/acpgate/proxy/outbox"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/pool"
	"github.com/acpgate/acpgate/proxy/sessionid"
)

type discardSink struct{ n int }

func (d *discardSink) Send(msg []byte, _ bool) bool { d.n += len(msg); return true }
func (d *discardSink) Supersede()                   {}

// benchRoute measures the agent→client hot path for one session/update: scan,
// session lookup, splice of the sealed session ID, hand-off to the client's
// sink; with replay, also the copy kept in the connection's replay buffer
// (sessions.detach_timeout > 0). Run: go test -run '^$' -bench Route -benchmem ./proxy/
func benchRoute(b *testing.B, textLen, replay int) { benchFanOut(b, textLen, replay, 0, 0) }

// benchFanOut is benchRoute with the session's attach history (history
// bytes, -1: none) and members more clients attached to the session; setup
// runs on the relay and the session before the loop.
func benchFanOut(b *testing.B, textLen, replay, history, members int, setup ...func(*Relay, *Session)) {
	r := &Relay{sealer: sessionid.NewRandom(), log: slog.New(slog.DiscardHandler), metrics: metrics.Nop()}
	r.resume.HistoryBytes = history
	am := r.metrics.ForAgent(DefaultAgent)
	ag := &agent{name: DefaultAgent, metrics: am, sides: map[*pool.Process]*procSide{}}
	ag.obs = r.observers(ag, nil)
	l := ag.newSide(nil).(*procSide) // the hot path never reaches the process
	sink := &discardSink{}
	c := r.newConnForBench(sink)
	c.ag = ag
	c.out.Init(sink, replay)
	const agentSID = "0199a3f2-7c1e-7b5e-9a3c-5f2d8e1b4c6a"
	s := l.addSession(c, sessionid.Opened{Agent: agentSID, Subject: c.subject}, "", "", nil)
	for range members {
		m := r.newConnForBench(&discardSink{})
		m.ag = ag
		s.join(&member{conn: m, id: multiclient.NewClientID()}, members+1)
	}
	for _, f := range setup {
		f(r, s)
	}
	line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + agentSID +
		`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` +
		strings.Repeat("lorem ipsum ", textLen/12) + `"}}}}`)
	rd := l.reader
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rd.handle(line)
	}
	b.StopTimer()
	if sink.n == 0 {
		b.Fatal("nothing was routed")
	}
}

func BenchmarkRouteSessionUpdate300B(b *testing.B) { benchRoute(b, 160, 0) }
func BenchmarkRouteSessionUpdate20KB(b *testing.B) { benchRoute(b, 20000, 0) }

func BenchmarkRouteSessionUpdate300BReplay(b *testing.B) { benchRoute(b, 160, 8<<20) }
func BenchmarkRouteSessionUpdate20KBReplay(b *testing.B) { benchRoute(b, 20000, 8<<20) }

// The attach history's cost (sessions.history_bytes 0 vs the default), and
// fan-out to attached clients.
func BenchmarkRouteSessionUpdate300BNoHistory(b *testing.B) { benchFanOut(b, 160, 0, -1, 0) }
func BenchmarkRouteSessionUpdate20KBNoHistory(b *testing.B) { benchFanOut(b, 20000, 0, -1, 0) }
func BenchmarkRouteSessionUpdate300BAttached1(b *testing.B) { benchFanOut(b, 160, 0, 0, 1) }
func BenchmarkRouteSessionUpdate300BAttached4(b *testing.B) { benchFanOut(b, 160, 0, 0, 4) }

func (r *Relay) newConnForBench(s Sink) *Conn {
	ten := &tenant{metrics: r.metrics, label: "default"}
	pol := policy.Default()
	ten.conf.Store(&TenantConfig{Policy: &pol})
	c := &Conn{relay: r, ten: ten, log: r.log, sessions: map[string]*Session{}, reqs: inflight.NewTable[*outReq, *inReq]()}
	c.cr = clientReader{c: c, resolve: acp.ClientSpec}
	c.cr.sc.Methods = acp.Methods
	c.out.Init(s, 0)
	return c
}

// BenchmarkDetachedConnection measures what a detached connection's replay
// buffer holds on the heap: 1,000 connections, each kept with msgs
// session/update messages of about 300 B that arrived while detached.
// Run: go test -run '^$' -bench Detached -benchmem ./proxy/
func BenchmarkDetachedConnection(b *testing.B) {
	for _, msgs := range []int{0, 10, 100, 1000} {
		b.Run(fmt.Sprintf("msgs=%d", msgs), func(b *testing.B) {
			const conns = 1000
			line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_0123456789abcdef","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` +
				strings.Repeat("lorem ipsum ", 16) + `"}}}}`)
			var perConn float64
			var kept int
			for range b.N {
				runtime.GC()
				runtime.GC() // twice: pooled buffers are gone, so every kept copy is new heap
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				boxes := make([]*outbox.Box[*Session], conns)
				for i := range boxes {
					o := &outbox.Box[*Session]{}
					o.Init(nil, 8<<20)
					for range msgs {
						o.Deliver(append(jsonrpc.GetBuffer(len(line)), line...), nil, false)
					}
					boxes[i] = o
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perConn = float64(after.HeapAlloc-before.HeapAlloc) / conns
				kept = boxes[0].KeptBytes()
				for _, o := range boxes {
					o.Release()
				}
			}
			b.ReportMetric(perConn, "heap-B/conn")
			b.ReportMetric(float64(kept), "kept-B/conn")
			b.ReportMetric(float64(msgs*len(line)), "msg-B/conn")
		})
	}
}
