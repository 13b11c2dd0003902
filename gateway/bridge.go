package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/acpgate/acpgate/auth"
	"github.com/acpgate/acpgate/gateway/cluster"
	"github.com/acpgate/acpgate/proxy"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// A session bridge carries one client connection's part in sessions held
// by another replica: the client stays connected where it landed, and
// this replica is a client of the holder for those sessions, over one
// WebSocket per holder on the holder's internal listener, authenticated
// by a signed envelope naming the client's tenant and subject. The holder
// serves that socket as any connection, with every check it applies to a
// client; this replica only carries:
//
//   - the client's messages naming a bridged session (and its answers to
//     the holder's requests, and its $/cancel_request for a request it
//     sent over the bridge), byte for byte, in the order it sent them;
//   - everything the holder sends, delivered to the client through its
//     connection's outbox (numbered and kept, so a resume here replays it),
//     with the holder's request IDs renamed so that they never meet this
//     replica's own.
//
// A message is carried once: nothing on a bridge is retried. A bridge that
// breaks answers each of the client's requests still in flight on it with
// an error naming the holder, and is forgotten: the next message naming one
// of its sessions is a new bridge's first.

// bridgeIDPrefix starts the IDs of the holder's requests as this replica
// renames them for the client.
const bridgeIDPrefix = "acpgate.bridge."

// bridgeInitID is the ID of a bridge's own initialize.
const bridgeInitID = `"acpgate.bridge.init"`

// bridgeDialTimeout bounds opening a bridge, its initialize included.
const bridgeDialTimeout = 3 * time.Second

// connBridges is one client connection's bridges, across its sockets.
type connBridges struct {
	rp                     *replicas
	id                     string // the connection's ID
	tenant, subject, agent string

	mu       sync.Mutex
	conn     *proxy.Conn        // the relay's connection (the same across resumes)
	init     []byte             // the client's initialize request, as it sent it
	byHolder map[string]*bridge // replica → its bridge
	bySess   map[string]*bridge // session ID → the bridge that carries it
	asked    map[string]asked   // a renamed holder request's ID → its bridge and own ID
	calls    map[string]*bridge // the client's request IDs (raw) in flight on a bridge
	ended    bool               // the connection ended for good
}

// asked is a holder's request as the client was sent it.
type asked struct {
	b  *bridge
	id []byte // the holder's own raw ID
}

// bridge is one socket to a holder.
type bridge struct {
	cb     *connBridges
	holder string
	ws     *websocket.Conn
	done   chan struct{} // closed when read returns
	wmu    sync.Mutex    // one writer at a time
	// Guarded by cb.mu.
	seq     int64             // the holder's requests renamed so far
	renamed map[string]string // a holder's request ID (raw) → the ID the client was sent
}

// bridgesOf is the connection's bridges, made if need be (nil outside a
// cluster).
func (rp *replicas) bridgesOf(l *link, make bool) *connBridges {
	if rp == nil {
		return nil
	}
	if v, ok := rp.bridges.Load(l.id); ok || !make {
		cb, _ := v.(*connBridges)
		return cb
	}
	cb := &connBridges{rp: rp, id: l.id, tenant: l.tenant, subject: l.subject, agent: l.agent, conn: l.conn,
		byHolder: map[string]*bridge{}, bySess: map[string]*bridge{}, asked: map[string]asked{}, calls: map[string]*bridge{}}
	v, _ := rp.bridges.LoadOrStore(l.id, cb)
	return v.(*connBridges)
}

// noteInit keeps a connection's initialize request: a bridge opens with it.
func (rp *replicas) noteInit(l *link, msg []byte) {
	if rp == nil {
		return
	}
	cb := rp.bridgesOf(l, true)
	cb.mu.Lock()
	if cb.init == nil {
		cb.init = bytes.Clone(msg)
	}
	cb.mu.Unlock()
}

// connStarted holds the registry's record of a connection made here.
func (rp *replicas) connStarted(id string) {
	if rp != nil {
		rp.node.Hold(cluster.KindConn, id)
	}
}

// connEnded lets the connection's record and bridges go: it ended for good.
func (rp *replicas) connEnded(id string) {
	if rp == nil {
		return
	}
	if v, ok := rp.bridges.LoadAndDelete(id); ok {
		v.(*connBridges).close()
	}
	rp.node.Release(cluster.KindConn, id)
}

// bridgeMethods are the methods that may open a bridge: they name a
// session the client wants to take part in.
var bridgeMethods = map[string]bool{"session/attach": true, "session/load": true, "session/resume": true}

// intercept carries frame to another replica if it is about a bridged
// session, or opens a bridge for it; it reports whether it took the
// frame (the relay must not see it). m is frame scanned, or nil.
func (rp *replicas) intercept(l *link, frame []byte, m *jsonrpc.Message) bool {
	if rp == nil {
		return false
	}
	if !l.conn.HandshakeDone() { // its initialize, if this is it: a bridge opens with it
		if bytes.Contains(frame, []byte(`"initialize"`)) {
			p := postScanners.Get().(*postScan)
			if p.sc.Scan(frame, &p.m, nil) == nil && p.m.Method == "initialize" {
				rp.noteInit(l, frame)
			}
			postScanners.Put(p)
		}
		return false
	}
	cb := rp.bridgesOf(l, false)
	bridged := cb != nil && cb.mayCarry(frame)
	if !bridged && !mayOpenBridge(frame) {
		return false
	}
	if m == nil { // scanned only when it may be a bridge's
		p := postScanners.Get().(*postScan)
		defer postScanners.Put(p)
		if p.sc.Scan(frame, &p.m, routeSpec) != nil {
			return false // the relay answers what does not scan
		}
		m = &p.m
	}
	if bridged && cb.carry(frame, m) {
		return true
	}
	if m.Kind != jsonrpc.KindRequest || !bridgeMethods[m.Method] {
		return false
	}
	sid, ok := sessionOf(m)
	if !ok {
		return false
	}
	return rp.open(l, frame, m, sid)
}

// mayOpenBridge is a cheap look at frame: could it be a request that
// opens a bridge? (A prompt that only mentions one is scanned for nothing.)
func mayOpenBridge(frame []byte) bool {
	return bytes.Contains(frame, []byte("session/attach")) || bytes.Contains(frame, []byte("session/load")) ||
		bytes.Contains(frame, []byte("session/resume"))
}

// mayCarry is a cheap look at frame: could it be one of the bridges'? It
// names a bridged session, answers a holder's renamed request, or cancels
// a request sent on a bridge. (Only then is it scanned before the relay.)
func (cb *connBridges) mayCarry(frame []byte) bool {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if len(cb.asked) > 0 && bytes.Contains(frame, []byte(bridgeIDPrefix)) ||
		len(cb.calls) > 0 && bytes.Contains(frame, []byte(`"$/cancel_request"`)) {
		return true
	}
	for sid := range cb.bySess {
		if bytes.Contains(frame, []byte(sid)) {
			return true
		}
	}
	return false
}

// carry sends m to the bridge it belongs to, if any: a message naming a
// bridged session, the client's answer to a holder's request, or its
// $/cancel_request for a request it sent on a bridge.
func (cb *connBridges) carry(frame []byte, m *jsonrpc.Message) bool {
	cb.mu.Lock()
	var b *bridge
	out := frame
	switch m.Kind {
	case jsonrpc.KindResponse:
		a, ok := cb.asked[string(m.ID)]
		if !ok {
			cb.mu.Unlock()
			return false
		}
		delete(cb.asked, string(m.ID))
		delete(a.b.renamed, string(a.id))
		b = a.b
		out = jsonrpc.Splice(nil, frame, []jsonrpc.Edit{{Start: m.IDPos[0], End: m.IDPos[1], Repl: a.id}})
	default:
		if sid, ok := sessionOf(m); ok {
			b = cb.bySess[sid]
		}
		if b == nil && m.Method == "$/cancel_request" {
			b = cb.calls[string(cancelledID(m))]
		}
		if b != nil && m.Kind == jsonrpc.KindRequest {
			cb.calls[string(m.ID)] = b
		}
	}
	cb.mu.Unlock()
	if b == nil {
		return false
	}
	b.send(out)
	return true
}

// cancelledID is params.requestId of a $/cancel_request, raw.
func cancelledID(m *jsonrpc.Message) []byte {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(m.Payload, &p) != nil {
		return nil
	}
	return p.RequestID
}

// open carries a request naming session sid to the replica that holds it,
// over its bridge (opened now if need be), when another replica holds it.
// A session nobody holds is claimed for this replica (the relay loads it
// here). It reports whether it took the request (answered it, with an
// error if the holder cannot be reached).
func (rp *replicas) open(l *link, frame []byte, m *jsonrpc.Message, sid string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), bridgeDialTimeout)
	defer cancel()
	key := cluster.SessionID(l.tenant, l.agent, sid)
	holder, err := rp.node.Owner(ctx, cluster.KindSession, key)
	load := m.Method != "session/attach"
	if err == nil && load && holder != "" && holder != rp.name() {
		if _, live, perr := rp.node.Peer(ctx, holder); perr == nil && !live {
			holder = "" // its holder is gone: the session is free to load
		}
	}
	if err == nil && load && holder == "" {
		if rp.node.Draining() {
			// Live nowhere, and this replica is draining: a replica that
			// stays loads it (none: this one does).
			holder = rp.node.Successor(ctx)
		}
		if holder == "" {
			holder, err = rp.node.Claim(ctx, cluster.KindSession, key)
		}
	}
	if err != nil {
		rp.refuse(l, m, sid, "", cluster.ReasonStore, err)
		return true
	}
	if holder == "" || holder == rp.name() {
		return false // live here, or nowhere: the relay serves it
	}
	cb := rp.bridgesOf(l, true)
	b, err := cb.bridgeTo(ctx, holder)
	if err != nil {
		reason := cluster.ReasonOwnerGone
		var fe *cluster.ForwardError
		if errors.As(err, &fe) {
			reason = fe.Reason
		}
		rp.refuse(l, m, sid, holder, reason, err)
		return true
	}
	cb.mu.Lock()
	cb.bySess[sid] = b
	cb.calls[string(m.ID)] = b
	cb.mu.Unlock()
	rp.log.Debug("cluster: session bridged to the replica that holds it", "conn", l.id, "session", sid, "holder", holder, "method", m.Method)
	b.send(frame)
	return true
}

// refuse answers a request that could not be carried to its holder:
// -32002 with the session, the reason (owner_gone, store_unavailable) and
// the replica.
func (rp *replicas) refuse(l *link, m *jsonrpc.Message, sid, holder, reason string, err error) {
	rp.node.Metrics().ForwardErrors.WithLabelValues("bridge", reason).Inc()
	rp.log.Info("cluster: cannot reach the session's replica", "conn", l.id, "session", sid, "holder", holder, "reason", reason, "err", err)
	l.conn.Deliver(rp.unreachable(m.ID, sid, holder, reason, err))
}

// unreachable is the -32002 answer to request id about session sid (""
// when it may be several) whose holder cannot be reached: why (reason:
// owner_gone, store_unavailable), the replica, and when a load works again.
func (rp *replicas) unreachable(id []byte, sid, holder, reason string, err error) []byte {
	data := map[string]string{"reason": reason, "replica": holder}
	msg := "the session"
	if sid != "" {
		data["sessionId"], msg = sid, "session "+sid
	}
	if reason == cluster.ReasonStore {
		msg += ": " + err.Error()
	} else {
		msg += fmt.Sprintf(" is held by replica %s, which cannot be reached (%v); once its lease (%s) runs out it can be loaded again",
			holder, err, rp.node.Lease())
	}
	raw, _ := json.Marshal(data)
	return jsonrpc.AppendError(jsonrpc.GetBuffer(256), id, jsonrpc.CodeNotFound, msg, raw)
}

// bridgeTo is the bridge to holder, opened if need be.
func (cb *connBridges) bridgeTo(ctx context.Context, holder string) (*bridge, error) {
	cb.mu.Lock()
	if b := cb.byHolder[holder]; b != nil {
		cb.mu.Unlock()
		return b, nil
	}
	init, ended := cb.init, cb.ended
	cb.mu.Unlock()
	if ended {
		return nil, errors.New("the connection ended")
	}
	if init == nil {
		return nil, errors.New("the connection has not initialized")
	}
	b, err := cb.dial(ctx, holder, init)
	if err != nil {
		return nil, err
	}
	cb.mu.Lock()
	if cb.ended {
		cb.mu.Unlock()
		b.ws.CloseNow()
		return nil, errors.New("the connection ended")
	}
	if other := cb.byHolder[holder]; other != nil { // two POSTs opened one at once: the first stays
		cb.mu.Unlock()
		b.ws.CloseNow()
		return other, nil
	}
	cb.byHolder[holder] = b
	cb.mu.Unlock()
	go b.read()
	return b, nil
}

// dial opens a socket to holder's internal listener as this connection's
// client, and initializes it as the client did.
func (cb *connBridges) dial(ctx context.Context, holder string, init []byte) (*bridge, error) {
	rp := cb.rp
	n := rp.node
	start := time.Now()
	ws, _, err := rp.dialHolder(ctx, holder, "bridge", auth.Identity{Tenant: cb.tenant, Subject: cb.subject}, cb.agent, "",
		[]string{Subprotocol}, cb.id)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(int64(rp.s.config().Limits.MaxMessageBytes) + 4096)
	// The client's initialize, under the bridge's own ID.
	var sc jsonrpc.Scanner
	var im jsonrpc.Message
	if err := sc.Scan(init, &im, nil); err != nil {
		ws.CloseNow()
		return nil, err
	}
	own := jsonrpc.Splice(nil, init, []jsonrpc.Edit{{Start: im.IDPos[0], End: im.IDPos[1], Repl: []byte(bridgeInitID)}})
	if err := ws.Write(ctx, websocket.MessageText, own); err != nil {
		ws.CloseNow()
		return nil, &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonOwnerGone, Err: err}
	}
	for {
		_, reply, err := ws.Read(ctx)
		if err != nil {
			ws.CloseNow()
			return nil, &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonOwnerGone, Err: err}
		}
		var rm jsonrpc.Message
		if sc.Scan(reply, &rm, nil) != nil || rm.Kind != jsonrpc.KindResponse || string(rm.ID) != bridgeInitID {
			continue // nothing else comes before the answer; ignore what might
		}
		if rm.IsError {
			ws.CloseNow()
			return nil, &cluster.ForwardError{Replica: holder, Reason: cluster.ReasonRefused, Err: fmt.Errorf("initialize: %s", rm.Payload)}
		}
		break
	}
	n.Metrics().Forwarded.WithLabelValues("bridge").Inc()
	n.Metrics().ForwardTime.WithLabelValues("bridge").Observe(time.Since(start).Seconds())
	return &bridge{cb: cb, holder: holder, ws: ws, done: make(chan struct{}), renamed: map[string]string{}}, nil
}

// send writes one client message to the holder; a failed write breaks
// the bridge.
func (b *bridge) send(msg []byte) {
	b.wmu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := b.ws.Write(ctx, websocket.MessageText, msg)
	cancel()
	b.wmu.Unlock()
	if err != nil {
		b.broke(err)
	}
}

// read delivers what the holder sends until the bridge closes.
func (b *bridge) read() {
	defer close(b.done)
	var sc jsonrpc.Scanner
	var m jsonrpc.Message
	for {
		msg, err := readPooled(context.Background(), b.ws)
		if err != nil {
			b.broke(err)
			return
		}
		out := msg // most messages: delivered in the buffer they were read into
		switch {
		case bytes.Contains(msg, []byte(`"id"`)) && sc.Scan(msg, &m, routeSpec) == nil:
			out = b.fromHolder(msg, &m)
		case bytes.Contains(msg, []byte(`"$/cancel_request"`)) && sc.Scan(msg, &m, nil) == nil && m.Method == "$/cancel_request":
			out = b.cancelFromHolder(&m)
		}
		if len(out) == 0 || &out[0] != &msg[0] { // dropped, or rewritten into another buffer
			if len(out) > 0 {
				out = append(jsonrpc.GetBuffer(len(out)), out...)
			}
			jsonrpc.PutBuffer(msg)
			if len(out) == 0 {
				continue
			}
		}
		b.cb.mu.Lock()
		conn := b.cb.conn
		b.cb.mu.Unlock()
		conn.Deliver(out)
	}
}

// fromHolder is what the client gets of a holder's message with an id:
// a request renamed (and remembered), a response to the client passed on
// (its request no longer in flight), the bridge's own initialize answer
// dropped.
func (b *bridge) fromHolder(msg []byte, m *jsonrpc.Message) []byte {
	cb := b.cb
	switch m.Kind {
	case jsonrpc.KindRequest:
		cb.mu.Lock()
		if sid, ok := sessionOf(m); ok && cb.bySess[sid] == nil {
			// A session the holder asks about on this bridge (a subagent's
			// child, say) is reached through it too.
			cb.bySess[sid] = b
		}
		b.seq++
		id := strconv.Quote(bridgeIDPrefix + b.holder + "." + strconv.FormatInt(b.seq, 10))
		cb.asked[id] = asked{b: b, id: bytes.Clone(m.ID)}
		b.renamed[string(m.ID)] = id
		cb.mu.Unlock()
		return jsonrpc.Splice(nil, msg, []jsonrpc.Edit{{Start: m.IDPos[0], End: m.IDPos[1], Repl: []byte(id)}})
	case jsonrpc.KindResponse:
		if string(m.ID) == bridgeInitID {
			return nil
		}
		cb.mu.Lock()
		delete(cb.calls, string(m.ID))
		cb.mu.Unlock()
	}
	return msg
}

// cancelFromHolder is the holder's $/cancel_request (another client
// answered first) as the client knows the request: under the ID it was
// sent; nil when the client was never sent it (or has answered it). The
// holder's gateway wrote it: it is rebuilt, not spliced.
func (b *bridge) cancelFromHolder(m *jsonrpc.Message) []byte {
	id := cancelledID(m)
	b.cb.mu.Lock()
	renamed, ok := b.renamed[string(id)]
	if ok {
		delete(b.renamed, string(id))
		delete(b.cb.asked, renamed)
	}
	b.cb.mu.Unlock()
	if !ok {
		return nil
	}
	return []byte(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":` + renamed + `}}`)
}

// broke forgets a bridge that failed: each of the client's requests in
// flight on it gets an error naming the holder.
func (b *bridge) broke(err error) {
	cb := b.cb
	cb.mu.Lock()
	if cb.byHolder[b.holder] != b {
		cb.mu.Unlock()
		return
	}
	delete(cb.byHolder, b.holder)
	var sessions []string
	for sid, sb := range cb.bySess {
		if sb == b {
			delete(cb.bySess, sid)
			sessions = append(sessions, sid)
		}
	}
	var pending []string
	for id, cbb := range cb.calls {
		if cbb == b {
			delete(cb.calls, id)
			pending = append(pending, id)
		}
	}
	for id, a := range cb.asked {
		if a.b == b {
			delete(cb.asked, id)
		}
	}
	conn, ended := cb.conn, cb.ended
	cb.mu.Unlock()
	b.ws.CloseNow()
	if ended {
		return
	}
	rp := cb.rp
	rp.node.Metrics().ForwardErrors.WithLabelValues("bridge", cluster.ReasonOwnerGone).Inc()
	rp.log.Info("cluster: a session bridge broke", "conn", cb.id, "holder", b.holder, "sessions", len(sessions), "in_flight", len(pending), "err", err)
	for _, id := range pending {
		conn.Deliver(rp.unreachable([]byte(id), "", b.holder, cluster.ReasonOwnerGone, err))
	}
}

// close ends the bridge: the client is gone for good.
func (b *bridge) close() {
	b.wmu.Lock()
	_ = b.ws.Close(websocket.StatusNormalClosure, "client gone")
	b.wmu.Unlock()
	b.ws.CloseNow()
	<-b.done
}

// close ends every bridge of a connection that ended for good.
func (cb *connBridges) close() {
	cb.mu.Lock()
	cb.ended = true
	bs := make([]*bridge, 0, len(cb.byHolder))
	for _, b := range cb.byHolder {
		bs = append(bs, b)
	}
	cb.byHolder = map[string]*bridge{}
	cb.mu.Unlock()
	for _, b := range bs {
		b.close()
	}
}
