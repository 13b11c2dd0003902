package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/propagation"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/cluster"
)

// tunnelResume serves a WebSocket resume whose token another replica
// issued ("<replica>.<random>"): the connection lives there, so this
// replica opens the same resume on the holder's internal listener and
// carries frames both ways, byte for byte, until either side ends; a
// close's code and reason pass through. The holder decides the resume as
// if the client had reached it (its answer, a refusal's included, is the
// client's). It reports whether it took the request.
func (s *Server) tunnelResume(w http.ResponseWriter, r *http.Request, who auth.Identity, agent string, accept *websocket.AcceptOptions) bool {
	rp := s.replicas
	if rp == nil {
		return false
	}
	if _, forwarded := forwardedIdentity(r); forwarded {
		return false
	}
	token := r.URL.Query().Get("resume")
	holder := cluster.Hint(token)
	if holder == "" || holder == rp.name() {
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), bridgeDialTimeout)
	defer cancel()
	up, resp, err := rp.dialHolder(ctx, holder, "resume", who, agent, r.URL.RawQuery, r.Header.Values("Sec-WebSocket-Protocol"), token)
	if err != nil {
		rp.node.Metrics().ForwardErrors.WithLabelValues("resume", forwardReason(err)).Inc()
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols { // the holder's refusal: the client's
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(body)
			return true
		}
		rp.log.Info("cluster: cannot carry a resume to the replica that holds its connection", "holder", holder, "err", err)
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "resume_refused", "reason": forwardReason(err),
			"message": fmt.Sprintf("the connection is held by replica %s, which cannot be reached: %v", holder, err)})
		return true
	}
	rp.node.Metrics().Forwarded.WithLabelValues("resume").Inc()
	if id := resp.Header.Get(ConnectionIDHeader); id != "" {
		w.Header().Set(ConnectionIDHeader, id)
	}
	opts := *accept
	opts.Subprotocols = nil
	if p := up.Subprotocol(); p != "" {
		opts.Subprotocols = []string{p}
	}
	down, err := websocket.Accept(w, r, &opts)
	if err != nil {
		up.CloseNow()
		return true // Accept wrote the HTTP error
	}
	limit := int64(s.config().Limits.MaxMessageBytes)
	down.SetReadLimit(limit)
	up.SetReadLimit(limit + 4096)
	rp.log.Debug("cluster: resume carried to the replica that holds its connection", "holder", holder, "conn", resp.Header.Get(ConnectionIDHeader))
	rp.pipe(down, up)
	return true
}

// forwardReason is err's reason label.
func forwardReason(err error) string {
	var fe *cluster.ForwardError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return cluster.ReasonOwnerGone
}

// dialHolder opens a WebSocket on holder's internal listener for who
// (op: resume or bridge; reply: the token or connection it serves).
func (rp *replicas) dialHolder(ctx context.Context, holder, op string, who auth.Identity, agent, rawQuery string,
	subprotocols []string, reply string) (*websocket.Conn, *http.Response, error) {
	url, live, err := rp.node.Peer(ctx, holder)
	if err != nil {
		return nil, nil, &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonStore, Err: err}
	}
	if !live {
		return nil, nil, &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonOwnerGone, Err: errors.New("it is gone from the cluster store")}
	}
	path := cluster.Prefix + "/acp/" + agent
	if rawQuery != "" {
		path += "?" + rawQuery
	}
	ctx, end := rp.node.Hop(ctx, op, holder)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	rp.node.SignRequest(req, cluster.Envelope{Op: op, Tenant: who.Tenant, Subject: who.Subject, Reply: reply})
	var protos []string
	for _, v := range subprotocols {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				protos = append(protos, p)
			}
		}
	}
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+path, &websocket.DialOptions{
		HTTPClient: rp.node.Client, HTTPHeader: req.Header, Subprotocols: protos, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		err = &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonOwnerGone, Err: err}
	}
	end(err)
	return ws, resp, err
}

// pipe carries messages between a client's socket and the holder's until
// either ends, then closes the other with the same code and reason (an
// abrupt end abruptly: the holder then keeps the connection for a resume).
// It ends too when this replica leaves the cluster.
func (rp *replicas) pipe(down, up *websocket.Conn) {
	rp.tunnels.Add(1)
	defer rp.tunnels.Done()
	ctx, cancel := context.WithCancel(rp.ctx)
	defer cancel()
	errc := make(chan error, 2)
	carry := func(dst, src *websocket.Conn) { errc <- carryMessages(ctx, dst, src) }
	go carry(up, down)
	go carry(down, up)
	err := <-errc
	code, reason := websocket.CloseStatus(err), ""
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		reason = ce.Reason
	}
	switch {
	case rp.ctx.Err() != nil:
		_ = down.Close(websocket.StatusGoingAway, "gateway shutting down")
		up.CloseNow()
	case code == -1: // one side dropped: drop the other, as a network would
		down.CloseNow()
		up.CloseNow()
	default: // both close with the code and reason, each handshake bounded by the library
		var wg sync.WaitGroup
		for _, c := range []*websocket.Conn{down, up} {
			wg.Go(func() { _ = c.Close(code, reason) })
		}
		wg.Wait()
	}
	cancel()
	<-errc
}

// carryMessages copies src's messages to dst as they come, each streamed
// through one buffer (no message is held whole), until either fails.
func carryMessages(ctx context.Context, dst, src *websocket.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		typ, r, err := src.Reader(ctx)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		w, err := dst.Writer(wctx, typ)
		if err == nil {
			if _, err = io.CopyBuffer(w, r, buf); err == nil {
				err = w.Close()
			}
		}
		cancel()
		if err != nil {
			return err
		}
	}
}
