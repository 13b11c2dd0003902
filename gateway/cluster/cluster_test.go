package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/acpgate/acpgate/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKey = bytes.Repeat([]byte{7}, 32)

func newNode(t *testing.T, name, store string, lease time.Duration) *Node {
	t.Helper()
	n, err := New(Config{Name: name, Store: store, Advertise: "http://" + name + ".invalid", Key: testKey, Lease: lease},
		slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// signed is a request to target with body, signed by s as e.
func signed(s *signer, method, target string, e Envelope, body []byte) *http.Request {
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	r.Header.Set("Acp-Connection-Id", "a.1")
	s.sign(r, e, body)
	return r
}

func TestEnvelope(t *testing.T) {
	s := newSigner(testKey)
	e := Envelope{From: "a", Op: "http_post", Tenant: "acme", Subject: "token:1", Reply: "a.1"}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"session/prompt"}`)

	r := signed(s, http.MethodPost, "/cluster/v1/acp", e, body)
	got, err := s.verify(r, body)
	if err != nil {
		t.Fatalf("a valid envelope: %v", err)
	}
	if got.Tenant != "acme" || got.Subject != "token:1" || got.Op != "http_post" || got.From != "a" || got.Reply != "a.1" {
		t.Fatalf("verified %+v", got)
	}
	if _, err := s.verify(r, body); !errors.Is(err, ErrReplayed) {
		t.Fatalf("the same envelope again: %v, want ErrReplayed", err)
	}

	// Each signed part, changed, breaks the signature.
	for name, change := range map[string]func(r *http.Request) []byte{
		"body":   func(*http.Request) []byte { return []byte(`{"jsonrpc":"2.0","id":2}`) },
		"tenant": func(r *http.Request) []byte { r.Header.Set(hdrTenant, "other"); return body },
		"subject": func(r *http.Request) []byte {
			r.Header.Set(hdrSubject, b64.EncodeToString([]byte("jwt:x")))
			return body
		},
		"op":     func(r *http.Request) []byte { r.Header.Set(hdrOp, "admin_end"); return body },
		"reply":  func(r *http.Request) []byte { r.Header.Set(hdrReply, "b.2"); return body },
		"target": func(r *http.Request) []byte { r.URL.Path = "/cluster/v1/admin/sessions"; return body },
		"conn":   func(r *http.Request) []byte { r.Header.Set("Acp-Connection-Id", "a.2"); return body },
		"unsigned": func(r *http.Request) []byte {
			r.Header.Del(hdrSig)
			return body
		},
	} {
		r := signed(s, http.MethodPost, "/cluster/v1/acp", e, body)
		b := change(r)
		if _, err := s.verify(r, b); !errors.Is(err, ErrUnsigned) {
			t.Errorf("%s changed: %v, want ErrUnsigned", name, err)
		}
	}
	// Another key.
	other := newSigner(bytes.Repeat([]byte{8}, 32))
	if _, err := s.verify(signed(other, http.MethodPost, "/x", e, body), body); !errors.Is(err, ErrUnsigned) {
		t.Errorf("another key: %v, want ErrUnsigned", err)
	}
	// Stale and future.
	for _, skew := range []time.Duration{-2 * maxSkew, 2 * maxSkew} {
		old := newSigner(testKey)
		old.now = func() time.Time { return time.Now().Add(skew) }
		if _, err := s.verify(signed(old, http.MethodPost, "/x", e, body), body); !errors.Is(err, ErrStale) {
			t.Errorf("skew %s: %v, want ErrStale", skew, err)
		}
	}
}

func TestReplayCacheWindows(t *testing.T) {
	c := newReplayCache()
	now := time.Now()
	if !c.spend("n", now) || c.spend("n", now.Add(time.Second)) {
		t.Fatal("a nonce is spent once")
	}
	// Still remembered one window later (it could not be older than maxSkew
	// when accepted), forgotten two windows later (stale by then anyway).
	if c.spend("n", now.Add(2*maxSkew+time.Second)) {
		t.Fatal("remembered for a window after")
	}
	if !c.spend("n", now.Add(4*maxSkew+2*time.Second)) {
		t.Fatal("forgotten after two windows")
	}
}

func TestRegistry(t *testing.T) {
	rs := redistest.Start(t)
	lease := 600 * time.Millisecond
	a := newNode(t, "a", rs.URL(0), lease)
	b := newNode(t, "b", rs.URL(0), lease)
	a.Start()
	b.Start()
	defer b.Close()
	ctx := context.Background()

	a.Hold(KindSession, "s1")
	waitOwner(t, b, "s1", "a")
	if h, err := b.Claim(ctx, KindSession, "s1"); err != nil || h != "a" {
		t.Fatalf("b claims a's session: holder %q err %v, want a", h, err)
	}
	peers, err := b.Replicas(ctx)
	if err != nil || peers["a"] != "http://a.invalid" || peers["b"] != "http://b.invalid" {
		t.Fatalf("replicas %v err %v", peers, err)
	}
	// Renewed past several leases.
	time.Sleep(3 * lease)
	if h, _ := b.Owner(ctx, KindSession, "s1"); h != "a" {
		t.Fatalf("after 3 leases the holder is %q, want a (renewed)", h)
	}
	// A clean stop gives every record up at once.
	a.Close()
	if h, _ := b.Owner(ctx, KindSession, "s1"); h != "" {
		t.Fatalf("after a's stop the holder is %q, want none", h)
	}
	if h, err := b.Claim(ctx, KindSession, "s1"); err != nil || h != "" {
		t.Fatalf("b claims the freed session: holder %q err %v", h, err)
	}

	// A record whose holder is gone (no replica record) is taken over by
	// compare-and-set, before its own lease runs out.
	if err := b.rdb.Set(ctx, RecordKey(KindSession, "s2"), "c", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if h, err := b.Claim(ctx, KindSession, "s2"); err != nil || h != "" {
		t.Fatalf("b takes s2 over from gone c: holder %q err %v", h, err)
	}
	if n := counterValue(b.metrics.Takeovers); n != 1 {
		t.Fatalf("takeovers %v, want 1", n)
	}
	// A claim stays pending (given up after pendingClaim) until Hold confirms it.
	if v := b.held[RecordKey(KindSession, "s2")]; v.IsZero() {
		t.Fatal("a claim is pending until Hold")
	}
}

func waitOwner(t *testing.T, n *Node, id, want string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		h, err := n.Owner(context.Background(), KindSession, id)
		if err == nil && h == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("owner of %s: %q (%v), want %q", id, h, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A dead replica's records expire within the lease; a Redis that restarts
// empty has every live record again within a heartbeat; while it is down,
// a lookup fails fast with an error naming the store.
func TestRegistryFailures(t *testing.T) {
	rs := redistest.Start(t)
	lease := 600 * time.Millisecond
	a := newNode(t, "a", rs.URL(0), lease)
	b := newNode(t, "b", rs.URL(0), lease)
	a.Start()
	b.Start()
	defer a.Close()
	defer b.Close()

	a.Hold(KindSession, "s1")
	waitOwner(t, b, "s1", "a")

	rs.Kill()
	start := time.Now()
	_, err := b.Owner(context.Background(), KindSession, "s1")
	var se *StoreError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), rs.URL(0)) {
		t.Fatalf("lookup with the store down: %v, want a StoreError naming %s", err, rs.URL(0))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the failed lookup took %s, want within 2s", d)
	}
	rs.Restart() // empty
	waitOwner(t, b, "s1", "a")
	if n := counterValue(a.metrics.StoreErrors.WithLabelValues("heartbeat")); n == 0 {
		t.Log("no heartbeat failed during the outage (it fell between beats)")
	}

	// a dies without giving anything up: its records expire.
	a.stop()
	<-a.done
	a.stop = nil
	deadline := time.Now().Add(2*lease + time.Second)
	for {
		if h, _ := b.Owner(context.Background(), KindSession, "s1"); h == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a dead replica's record outlived its lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A forwarded POST is executed once: a retry after a lost answer carries
// the same envelope, the holder refuses it as replayed, and Do reports
// it delivered.
func TestDoExecutesOnce(t *testing.T) {
	rs := redistest.Start(t)
	a := newNode(t, "a", rs.URL(0), time.Second)
	b := newNode(t, "b", rs.URL(0), time.Second)
	defer a.Close()
	defer b.Close()
	var executed atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		env, err := a.Verify(r, body)
		if err != nil {
			Refuse(w, err)
			return
		}
		if env.Tenant != "acme" {
			http.Error(w, "bad tenant", http.StatusBadRequest)
			return
		}
		executed.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	a.cfg.Advertise = srv.URL
	a.Start()

	// The first attempt reaches the holder, but its answer is lost.
	var attempts atomic.Int32
	b.Client = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if attempts.Add(1) == 1 && err == nil {
			resp.Body.Close()
			return nil, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}
		}
		return resp, err
	})}
	resp, delivered, err := b.Do(context.Background(), Request{Replica: "a", Op: "http_post", Method: http.MethodPost, Path: "/x",
		Body: []byte(`{}`), Env: Envelope{Op: "http_post", Tenant: "acme"}, Retry: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp != nil {
		resp.Body.Close()
	}
	if !delivered || executed.Load() != 1 || attempts.Load() != 2 {
		t.Fatalf("delivered %v, executed %d times in %d attempts; want delivered, once, 2", delivered, executed.Load(), attempts.Load())
	}

	// A holder that is down is reported at once, naming it.
	srv.Close()
	start := time.Now()
	_, _, err = b.Do(context.Background(), Request{Replica: "a", Op: "http_post", Method: http.MethodPost, Path: "/x",
		Env: Envelope{Op: "http_post", Tenant: "acme"}, Retry: true})
	var fe *ForwardError
	if !errors.As(err, &fe) || fe.Reason != ReasonOwnerGone || !strings.Contains(err.Error(), "replica a") {
		t.Fatalf("holder down: %v, want owner_gone naming replica a", err)
	}
	if d := time.Since(start); d > forwardBudget+500*time.Millisecond {
		t.Fatalf("took %s", d)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// A store that restarts empty gets back what is written once (session
// owners): the next heartbeat finds it does not know the replica and runs
// the OnReset hooks.
func TestOwnersRewrittenAfterReset(t *testing.T) {
	rs := redistest.Start(t)
	a := newNode(t, "a", rs.URL(0), 600*time.Millisecond)
	own := a.NewOwners(time.Hour)
	defer own.Close()
	kept := map[string]string{"acme\x00s1": "token:1", "acme\x00s2": "jwt:bob"}
	a.OnReset(func(ctx context.Context) {
		own.Rewrite(ctx, func(yield func(scope, agentSID, subject string, used int64)) {
			for k, subject := range kept {
				scope, sid, _ := strings.Cut(k, "\x00")
				yield(scope, sid, subject, time.Now().Unix())
			}
		})
	})
	a.Start()
	defer a.Close()
	waitSubject := func(when string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			if s, _ := own.Get("acme", "s2"); s == "jwt:bob" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the owner of s2 is not in the store", when)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitSubject("after the first heartbeat")
	rs.Kill()
	rs.Restart() // empty
	waitSubject("after the store restarted empty")
}
