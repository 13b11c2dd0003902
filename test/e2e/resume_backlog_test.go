package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestResumeBacklogDoesNotDelayOthers (issue #39's acceptance): a client
// resumes a connection whose replay buffer holds about 8 MiB, on a socket
// it never reads, while that connection's turn goes on streaming; another
// client's round trips through the same agent process are not delayed by
// it: their p99 stays within 2 ms of a window without the resume (the
// median over seven rounds of a window each).
//
// The replay is far more than the send queue takes (1 MiB here), so the
// resumed socket is cut by the slow-client rule after a second without
// progress. A resume that replayed under the connection's locks held the
// agent's reader for that second: the turn's next tick to the resumed
// connection waited for the lock, and every answer behind it, the other
// client's included.
//
// B's round trips are sent on a fixed schedule, not one after another, so
// that a stall shows in every round trip it covers, not in one.
func TestResumeBacklogDoesNotDelayOthers(t *testing.T) {
	const (
		pad      = 256 << 10
		pads     = 29 // 7.25 MiB of answers kept for A, of the 8 MiB replay buffer
		interval = 5 * time.Millisecond
		window   = 2 * time.Second
		rounds   = 7
		bound    = 2 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	// No pings: nothing acks A's messages, so they all stay kept, and A can
	// resume from the same point every round.
	g := startGateway(t, gwOpts{config: resumeConfig + hostilePolicy +
		"limits: {messages_per_second: 0, max_message_bytes: 524288, send_queue_bytes: 1048576}\nwebsocket: {ping_interval: 0s}\n"})
	waitReady(t, g, 30*time.Second)

	// A: large answers it reads, then a turn that streams a tick every
	// 100 ms; its socket is reset while the turn runs.
	a := newRconn(t, g, nil)
	a.initialize()
	sid := a.newSession(t.TempDir())
	from := a.Got // A resumes from here: every answer below is replayed
	for i := range pads {
		p := strings.Repeat(strconv.Itoa(i%10), pad)
		if m := a.Await("_demo/echo", a.Request("_demo/echo", map[string]string{"pad": p}), turn, nil); m.Error != nil {
			t.Fatalf("echo: %.300s", m.Raw)
		}
	}
	a.slowTurn(sid, 2)
	a.resetDetached()

	b, write := dialRawInit(t, ctx, g, 1<<20)
	defer b.CloseNow()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, init, err := b.Read(rctx)
	rcancel()
	if err != nil || !strings.Contains(string(init), `"result"`) {
		t.Fatalf("B's initialize: %v %.300s", err, init)
	}
	pr := &probe{t: t, ws: b, write: write, next: 1}
	pr.window(ctx, window/5, interval, nil) // warm up

	// resume opens A's resumed socket with a small receive buffer (the
	// kernel holds little of the replay for it), reads its greeting and
	// nothing else.
	resume := func() *websocket.Conn {
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			}); err != nil {
				return err
			}
			return serr
		}}
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		defer dcancel()
		ws, resp, err := websocket.Dial(dctx, "ws://"+g.Addr+resumePath(a.token, strconv.Itoa(from)), &websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{"acp"}})
		if err != nil {
			t.Errorf("A's resume: %v (%s)", err, respText(resp))
			return nil
		}
		ws.SetReadLimit(1 << 10)
		_, first, err := ws.Read(dctx)
		if err != nil || !strings.Contains(string(first), `"_acpgate/resumed"`) {
			t.Errorf("A's resumed socket: first message %.200s (%v); want _acpgate/resumed", first, err)
		}
		return ws
	}

	slowBefore, _ := metricWith(t, g, "acpgate_slow_client_disconnects_total", "")
	// Each round has a window without a resume and one with, in turns
	// first, and compares their p99s; the rounds' median difference
	// decides, so that a busy machine stalling a window or two (other
	// tests, other builds) does not.
	var without, with, deltas []time.Duration
	for r := range rounds {
		var p99s [2]time.Duration // without, with
		// Which goes first alternates.
		for _, resuming := range []bool{r%2 == 1, r%2 == 0} {
			if !resuming {
				took := pr.window(ctx, window, interval, nil)
				t.Logf("round %d without a resume: p50 %s p99 %s max %s", r, quantile(took, 0.5), p99(took), slices.Max(took))
				without, p99s[0] = append(without, took...), p99(took)
				continue
			}
			var rs *websocket.Conn
			took := pr.window(ctx, window, interval, func() { rs = resume() })
			t.Logf("round %d with a resume: p50 %s p99 %s max %s", r, quantile(took, 0.5), p99(took), slices.Max(took))
			with, p99s[1] = append(with, took...), p99(took)
			if rs == nil {
				t.FailNow()
			}
			rs.CloseNow()
			waitDetached(t, g, 1) // cut by the slow-client rule, or by the close: A may resume again
		}
		deltas = append(deltas, p99s[1]-p99s[0])
	}
	slowAfter, _ := metricWith(t, g, "acpgate_slow_client_disconnects_total", "")
	delta := quantile(deltas, 0.5)
	t.Logf("B's round trips through A's agent process, %d rounds of %s: without a resume p50 %s p99 %s max %s (%d); with A resuming %d kB unread: p50 %s p99 %s max %s (%d); p99 with minus without, median of the rounds: %s; slow-client cuts %g",
		rounds, window, quantile(without, 0.5), p99(without), slices.Max(without), len(without), pads*pad>>10,
		quantile(with, 0.5), p99(with), slices.Max(with), len(with), delta, slowAfter-slowBefore)
	if slowAfter-slowBefore < rounds {
		t.Errorf("%g slow-client cuts in %d resumes: the resumed socket read its replay, or was never given it", slowAfter-slowBefore, rounds)
	}
	if delta > bound {
		t.Errorf("B's p99 round trip with A resuming exceeds the p99 without by %s (median over %d rounds: %v); want at most %s", delta, rounds, deltas, bound)
	}
	if pids := g.agentPIDs(); len(pids) != 1 {
		t.Errorf("agent processes %v; want the one both clients share", pids)
	}
}

// probe measures one client's round trips (_demo/echo, answered by its
// agent process) on a fixed schedule.
type probe struct {
	t     *testing.T
	ws    *websocket.Conn
	write func(string) error
	next  int // the next request id
}

// window sends a round trip every interval for d and returns how long each
// took; during, if not nil, runs meanwhile, from a fifth of the window on.
func (p *probe) window(ctx context.Context, d, interval time.Duration, during func()) []time.Duration {
	p.t.Helper()
	n := int(d / interval)
	first := p.next
	p.next += n
	sent := make([]atomic.Int64, n) // unix nanos each was written
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	start := time.Now()
	wg.Go(func() {
		for i := range n {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				select {
				case <-time.After(wait):
				case <-wctx.Done():
					return
				}
			}
			sent[i].Store(time.Now().UnixNano())
			if err := p.write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_demo/echo","params":{}}`, first+i)); err != nil {
				p.t.Errorf("B's round trip %d: %v", first+i, err)
				return
			}
		}
	})
	if during != nil {
		wg.Go(func() {
			select {
			case <-time.After(d / 5):
				during()
			case <-wctx.Done():
			}
		})
	}
	took := make([]time.Duration, 0, n)
	rctx, rcancel := context.WithTimeout(ctx, d+20*time.Second)
	defer rcancel()
	for len(took) < n {
		_, frame, err := p.ws.Read(rctx)
		now := time.Now()
		if err != nil {
			p.t.Fatalf("B got %d of %d answers in its window, then: %v", len(took), n, err)
		}
		var m struct {
			ID    *int            `json:"id"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(frame, &m) != nil || m.ID == nil {
			continue
		}
		i := *m.ID - first
		if i < 0 || i >= n || m.Error != nil {
			p.t.Fatalf("B's answer out of its window or failed: %.300s", frame)
		}
		took = append(took, now.Sub(time.Unix(0, sent[i].Load())))
	}
	cancel()
	wg.Wait()
	return took
}

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[max(min(i, len(s)-1), 0)]
}

func p99(ds []time.Duration) time.Duration { return quantile(ds, 0.99) }
