package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Prefix is the path under which a replica's internal listener serves
// what other replicas carry to it.
const Prefix = "/cluster/v1"

// Reasons a forward fails.
const (
	ReasonOwnerGone = "owner_gone"        // the holder does not answer, or is gone from the store
	ReasonStore     = "store_unavailable" // the route needed the store, which failed
	ReasonRefused   = "refused"           // the holder refused the envelope
)

// ForwardError is why a request could not be carried to the replica that
// holds what it names.
type ForwardError struct {
	Replica string
	Reason  string
	Err     error
}

func (e *ForwardError) Error() string {
	switch e.Reason {
	case ReasonOwnerGone:
		return fmt.Sprintf("held by replica %s, which does not answer: %v", e.Replica, e.Err)
	case ReasonStore:
		return e.Err.Error()
	}
	return fmt.Sprintf("replica %s refused it: %v", e.Replica, e.Err)
}
func (e *ForwardError) Unwrap() error { return e.Err }

// SetTracer makes a span of each hop (nil: none).
func (n *Node) SetTracer(t trace.Tracer) { n.tracer = t }

// Verify checks the envelope of a request another replica carried here,
// over its body: a bad signature, a stale time or a nonce already seen is
// an error (ErrUnsigned, ErrStale, ErrReplayed).
func (n *Node) Verify(r *http.Request, body []byte) (Envelope, error) {
	return n.sign.verify(r, body)
}

// Request is one request to carry to another replica.
type Request struct {
	Replica string // the holder
	Op      string // metrics' op label
	Method  string
	Path    string // under Prefix, with its query
	Header  http.Header
	Body    []byte
	Env     Envelope // From is set by Do
	// Retry: on a transport error the request is sent again with the same
	// nonce (the holder executes it once: a repeat is refused as replayed,
	// which Do then takes as delivered).
	Retry bool
}

// forwardBudget bounds a hop's connection attempts: a holder that does not
// answer is reported within it.
const forwardBudget = 2 * time.Second

// Do carries req to its replica and returns the response (the caller
// closes its body). A replica that is gone, a store that fails or a holder
// that refuses gives a *ForwardError. delivered is true when a retry found
// the first attempt executed (the response then is nil).
func (n *Node) Do(ctx context.Context, req Request) (resp *http.Response, delivered bool, err error) {
	start := time.Now()
	m := n.metrics
	ctx, span := n.startSpan(ctx, req)
	defer func() {
		if err != nil {
			var fe *ForwardError
			reason := ReasonRefused
			if errors.As(err, &fe) {
				reason = fe.Reason
			}
			m.ForwardErrors.WithLabelValues(req.Op, reason).Inc()
			if span != nil {
				span.SetStatus(codes.Error, err.Error())
			}
		} else {
			m.Forwarded.WithLabelValues(req.Op).Inc()
			m.ForwardTime.WithLabelValues(req.Op).Observe(time.Since(start).Seconds())
		}
		if span != nil {
			span.End()
		}
	}()
	url, live, err := n.Peer(ctx, req.Replica)
	if err != nil {
		return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonStore, Err: err}
	}
	if !live || url == "" {
		return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonOwnerGone, Err: errors.New("it is gone from the cluster store")}
	}
	req.Env.From = n.cfg.Name
	deadline := time.Now().Add(forwardBudget)
	for attempt := 1; ; attempt++ {
		hr, err := http.NewRequestWithContext(ctx, req.Method, strings.TrimSuffix(url, "/")+req.Path, bytes.NewReader(req.Body))
		if err != nil {
			return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonRefused, Err: err}
		}
		for k, v := range req.Header {
			hr.Header[k] = v
		}
		if span != nil {
			propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hr.Header))
		}
		req.Env.nonce = n.sign.sign(hr, req.Env, req.Body)
		resp, err := n.Client.Do(hr)
		if err == nil {
			if resp.StatusCode == http.StatusConflict && resp.Header.Get(HdrReplayed) != "" && attempt > 1 {
				_ = resp.Body.Close()
				return nil, true, nil
			}
			if resp.StatusCode == http.StatusForbidden && resp.Header.Get(HdrReplayed) == "" && resp.Header.Get(hdrRefused) != "" {
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				_ = resp.Body.Close()
				return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonRefused, Err: errors.New(strings.TrimSpace(string(msg)))}
			}
			return resp, false, nil
		}
		if ctx.Err() != nil {
			return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonOwnerGone, Err: ctx.Err()}
		}
		// A refused connection: nothing listens there, the replica is down.
		if errors.Is(err, syscall.ECONNREFUSED) || !req.Retry || time.Now().Add(100*time.Millisecond).After(deadline) {
			return nil, false, &ForwardError{Replica: req.Replica, Reason: ReasonOwnerGone, Err: err}
		}
		time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
	}
}

// SignRequest stamps a request with no body (a WebSocket upgrade) with e,
// from this replica.
func (n *Node) SignRequest(req *http.Request, e Envelope) {
	e.From = n.cfg.Name
	n.sign.sign(req, e, nil)
}

// hdrRefused marks the holder's refusal of an envelope (403).
const hdrRefused = "Acpgate-Cluster-Refused"

// Refuse answers a request whose envelope failed Verify.
func Refuse(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrReplayed) {
		w.Header().Set(HdrReplayed, "1")
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set(hdrRefused, "1")
	http.Error(w, err.Error(), http.StatusForbidden)
}

func (n *Node) startSpan(ctx context.Context, req Request) (context.Context, trace.Span) {
	if n.tracer == nil {
		return ctx, nil
	}
	ctx, span := n.tracer.Start(ctx, "cluster.forward", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("acpgate.cluster.op", req.Op), attribute.String("acpgate.cluster.replica", req.Replica)))
	return ctx, span
}

// Hop starts the span of a hop that is not a Do (a WebSocket opened on
// another replica: a resume's tunnel, a session bridge); end ends it with
// the hop's error, if any. Without tracing, both are no-ops.
func (n *Node) Hop(ctx context.Context, op, replica string) (_ context.Context, end func(error)) {
	ctx, span := n.startSpan(ctx, Request{Op: op, Replica: replica})
	if span == nil {
		return ctx, func(error) {}
	}
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
