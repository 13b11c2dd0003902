package proxy

import (
	"encoding/json"
	"strconv"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
)

// An ACP v2 turn. The answer to a v2 session/prompt is only its
// acknowledgement ({messageId}, no stopReason); the turn runs on until
// the agent's session/update state_update "idle" for the session, which
// carries its stopReason, error and usage. So for a process that speaks v2
// the prompt stays in its process's table (pending) after the
// acknowledgement, marked acked: everything that follows turns (the
// session's turn and its queue, budgets and the admin API's cancel, the
// drain, turn_complete, metering, the turn's span) sees it running until
// the idle update ends it (idleTurns). An acked prompt the gateway ends in
// the agent's place (timeout, cancel not answered, the process gone) ends
// with an idle state_update of the gateway's, not a second answer
// (outReq.fail).

// speaksV2 reports whether the process answered initialize with ACP v2.
func (l *procSide) speaksV2() bool { return l.p.Init().Version >= 2 }

// acknowledge marks the prompt the answer m (agent-side id) is for as
// acknowledged, when m is a v2 acknowledgement: a success without
// stopReason from a v2 process. It returns the prompt, still in pending
// (nil: m is not one, or it is a retry's: see noteKey). late: a retry
// the agent answered with a new messageId, so ran again: its turn starts
// now.
func (l *procSide) acknowledge(id int64, m *jsonrpc.Message) (req *outReq, late bool) {
	if m.IsError || !l.speaksV2() {
		return nil, false
	}
	if _, ok := acp.StopReason(m); ok {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	req = l.pending[id]
	if req == nil || req.method != acp.SessionPrompt || req.conn == nil || req.sess == nil || req.acked.Load() {
		return nil, false
	}
	if req.key != "" {
		msgID := acp.TaggedString(m, acp.LabelMessageID)
		if req.retry {
			if first, ok := req.sess.keys.get(req.key); ok && first != "" && first == msgID {
				return nil, false // the first sending's turn: the answer ends the retry
			}
			req.retry, late = false, true
			l.p.Log().Warn("agent ran a prompt again for an idempotencyKey it was sent before; counted as a new turn",
				"session", req.sess.GatewayID)
		}
		req.sess.keys.answered(req.key, msgID)
	}
	req.acked.Store(true)
	return req, late
}

// noteKey notes key, the idempotencyKey of req (a prompt to a v2
// process, about to be sent; "" for none), in its session. A key the
// session's agent was sent before makes req a retry (a client re-sending
// a prompt it had no answer to, as after a resume): the agent, which
// dedupes by key, answers it with the first sending's messageId and runs
// no second turn, so neither does the gateway: the retry is forwarded as
// sent and its answer ends it, while the turn stays the first sending's.
func (l *procSide) noteKey(req *outReq, key string) {
	if key == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	req.key = key
	req.retry = !req.sess.keys.add(key)
}

// maxPromptKeys bounds the idempotencyKeys a session remembers: the
// oldest are forgotten first (a retry comes soon after its first sending).
const maxPromptKeys = 64

// promptKeys are a session's v2 idempotencyKeys with the messageId of
// each one's first acknowledgement ("" until then), oldest first.
type promptKeys struct {
	ids   map[string]string
	order []string
}

// add notes key, false if it is known already.
func (k *promptKeys) add(key string) bool {
	if _, ok := k.ids[key]; ok {
		return false
	}
	if k.ids == nil {
		k.ids = make(map[string]string)
	}
	if len(k.order) == maxPromptKeys {
		delete(k.ids, k.order[0])
		k.order = append(k.order[:0], k.order[1:]...)
	}
	k.ids[key] = ""
	k.order = append(k.order, key)
	return true
}

// get is the messageId key's first sending was acknowledged with.
func (k *promptKeys) get(key string) (string, bool) {
	id, ok := k.ids[key]
	return id, ok
}

// answered notes msgID as key's acknowledgement if it has none yet.
func (k *promptKeys) answered(key, msgID string) {
	if id, ok := k.ids[key]; ok && id == "" {
		k.ids[key] = msgID
	}
}

// deliverAck gives the client its prompt's acknowledgement: the turn goes
// on.
func (r *agentReader) deliverAck(m *jsonrpc.Message, req *outReq) {
	edits := append(r.edits[:0], jsonrpc.Edit{Start: m.IDPos[0], End: m.IDPos[1], Repl: req.clientID})
	r.edits = edits
	c := req.conn
	out := jsonrpc.Splice(jsonrpc.GetBuffer(len(m.Raw)+16), m.Raw, edits)
	r.l.ag.metrics.Message(metrics.AgentToClient, req.method, len(out))
	c.deliverFor(out, nil, Facts{ID: req.clientID}, false)
}

// takeAcked takes s's acknowledged prompts out of the table: the idle
// update ends them. Each counts as running until that update is in its
// client's queue (procSide.answered).
func (l *procSide) takeAcked(s *Session) []*outReq {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*outReq
	for id, req := range l.pending {
		if req.sess == s && req.method == acp.SessionPrompt && req.acked.Load() {
			delete(l.pending, id)
			l.answering++
			out = append(out, req)
		}
	}
	return out
}

// idleUpdate is what the gateway reads of a state_update.
type idleUpdate struct {
	Update struct {
		State      string          `json:"state"`
		StopReason string          `json:"stopReason"`
		Usage      json.RawMessage `json:"usage"`
		Error      json.RawMessage `json:"error"`
	} `json:"update"`
}

// idleTurns notes what m, a v2 state_update of s, says of its turn
// (requires_action or not), and ends the turns it says are over (state
// idle): each is counted with the update's stopReason and usage,
// the session's other clients hear turn_complete, and the next queued
// prompt is held until the update is out. It returns the prompts ended
// and edits with what says in m why the gateway cancelled the turn
// (_meta.acpgate.<key> of its params), if it did.
func (r *agentReader) idleTurns(m *jsonrpc.Message, s *Session, edits []jsonrpc.Edit) ([]*outReq, []jsonrpc.Edit) {
	var u idleUpdate
	if json.Unmarshal(m.Payload, &u) != nil {
		return nil, edits
	}
	s.turn.RequiresAction(u.Update.State == "requires_action")
	if u.Update.State != "idle" {
		return nil, edits
	}
	prompts := r.l.takeAcked(s)
	if len(prompts) == 0 {
		return nil, edits // a snapshot: no turn of the gateway's ran
	}
	stop := u.Update.StopReason
	if stop == "" {
		stop = "end_turn"
	}
	usage := []byte(u.Update.Usage)
	if string(usage) == "null" {
		usage = nil
	}
	why := false
	for _, req := range prompts {
		req.turnEnded(stop, usage)
		usage = nil // the turn's usage counts once
		s.turnComplete(req.conn, stop)
		if !why {
			if e, ok := req.whyEdit(m.Raw, m.PayloadPos[0], m.PayloadPos[1]); ok {
				edits, why = append(edits, e), true
			}
		}
		req.holdNext = true
		req.end()
		promptEndedWith(req, stop, nil)
	}
	return prompts, edits
}

// idleDelivered finishes what idleTurns started once the idle update is in
// its clients' queues: the prompts no longer count as running, and the
// prompt that waited for the turn starts.
func (r *agentReader) idleDelivered(prompts []*outReq) {
	for _, req := range prompts {
		r.l.answered(req.conn.relay)
		req.startNext()
	}
}

// idleInPlace is the idle state_update the gateway sends the client of an
// acked prompt it ends in the agent's place: stopReason "cancelled", or
// "error" with the JSON-RPC error of msg, the answer a v1 client would
// have had.
func (r *outReq) idleInPlace(msg []byte) []byte {
	var answer struct {
		Error json.RawMessage `json:"error"`
	}
	_ = json.Unmarshal(msg, &answer)
	params := append([]byte(`{"sessionId":`), r.sess.quotedID...)
	params = append(params, `,"update":{"sessionUpdate":"state_update","state":"idle","stopReason":`...)
	if len(answer.Error) > 0 {
		params = append(append(append(params, strconv.Quote("error")...), `,"error":`...), answer.Error...)
	} else {
		params = append(params, strconv.Quote("cancelled")...)
	}
	params = append(params, "}}"...)
	out := jsonrpc.AppendRequest(nil, nil, acp.SessionUpdate, params)
	if e, ok := r.whyEdit(out, len(`{"jsonrpc":"2.0","method":"session/update","params":`), len(out)-1); ok {
		out = jsonrpc.Splice(nil, out, []jsonrpc.Edit{e})
	}
	return out
}

// replayComplete is the v2 session/update that tells a client the replay
// of s is over, for a replay the gateway makes from its own buffer (a
// resumed socket's messages, an attach's history).
func (s *Session) replayComplete() ([]byte, Facts) {
	params := append(append([]byte(`{"sessionId":`), s.quotedID...), `,"update":{"sessionUpdate":"replay_complete"}}`...)
	return jsonrpc.AppendRequest(nil, nil, acp.SessionUpdate, params), Facts{Method: acp.SessionUpdate, SessionID: s.streamID()}
}
