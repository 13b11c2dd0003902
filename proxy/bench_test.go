package proxy

import (
	"log/slog"

	"github.com/acpgate/acpgate/proxy/policy"
	"strings"
	"testing"
)

type discardSink struct{ n int }

func (d *discardSink) Send(msg []byte, _ bool) bool { d.n += len(msg); return true }
func (d *discardSink) Supersede()                   {}

// benchRoute measures the agent→client hot path for one session/update: scan,
// session lookup, splice of the sealed session ID, hand-off to the client's
// sink; with replay, also the copy kept in the connection's replay buffer
// (sessions.detach_timeout > 0). Run: go test -run '^$' -bench Route -benchmem ./proxy/
func benchRoute(b *testing.B, textLen, replay int) {
	metrics := nopMetrics()
	r := &Relay{sealer: NewRandomSealer(), log: slog.New(slog.DiscardHandler), metrics: metrics}
	pool := &Pool{cfg: PoolConfig{metrics: metrics}, log: r.log, notify: make(chan struct{}), kick: make(chan struct{}, 1)}
	p := &agentProc{pool: pool, log: r.log, pending: map[int64]*outReq{}, inbound: map[string]*inReq{}, sessions: map[string]*Session{}}
	sink := &discardSink{}
	c := r.newConnForBench(sink)
	c.out.limit = replay
	const agentSID = "0199a3f2-7c1e-7b5e-9a3c-5f2d8e1b4c6a"
	p.addSession(c, agentSID, "")
	line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + agentSID +
		`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` +
		strings.Repeat("lorem ipsum ", textLen/12) + `"}}}}`)
	rd := newAgentReader(p)
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

func (r *Relay) newConnForBench(s Sink) *Conn {
	ten := &tenant{metrics: r.metrics, label: "default"}
	pol := policy.Default()
	ten.pol.Store(&pol)
	c := &Conn{relay: r, ten: ten, log: r.log, sessions: map[string]*Session{}, clientReqs: map[string]*outReq{}, agentReqs: map[int64]*inReq{}}
	c.sc.Methods = knownMethods
	c.resolve = c.specFor
	c.out.sink = s
	return c
}
