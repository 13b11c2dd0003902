package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/models"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
)

// Under a restricting model or mode allow-list, what a client sends about a
// session waits until the gateway knows the session's model and mode: a
// load or resume closes the session's gate (Session.gate) when it goes to
// the agent, and opens it once its answer is out, after any switch the
// gateway made for it (agentReader.switchModel, switched), or when it
// ends otherwise (hold.release). Meanwhile the connection's messages about
// the session are held in order (holdBack), then handled as if they had
// just arrived (drainGate); a session that ends first fails them with why
// (failHeld). Without such a policy no gate closes, and the one check on
// the hot path is an atomic load (agent.gating).

// heldMsg is a client message a session's gate holds.
type heldMsg struct {
	conn   *Conn
	line   []byte // the message, copied
	id     []byte // a request's id (nil: a notification)
	method string
	parent trace.SpanContext // its transport's trace context
}

// gatesSessions reports whether the tenant's policy makes c's loads wait
// for the session's model and mode before the client's messages about it
// pass.
func (c *Conn) gatesSessions() bool { return models.ListsOf(c.ten.policy(c.ag.name)).Restricts() }

// gate closes s's gate until the request h is for ends.
func (h *hold) gate(s *Session) {
	if s.gate.Close() {
		h.conn.ag.gating.Add(1)
	}
	h.gated = s
}

// takeGated takes the gate h would open when released: its caller opens
// it (nil: none).
func (h *hold) takeGated() *Session {
	if h == nil {
		return nil
	}
	s := h.gated
	h.gated = nil
	return s
}

// ungate ends the wait gate began (s nil: none); the last one hands what
// the gate holds, in order, to a worker off the caller's stack.
func (s *Session) ungate(c *Conn) {
	if s == nil {
		return
	}
	drain, idle := s.gate.Open()
	if idle {
		c.ag.gating.Add(-1)
	}
	if drain && !c.relay.bg.Go(func() { s.drainGate(c) }) {
		s.failHeld("the gateway is shutting down")
	}
}

// drainGate handles the messages s's gate held, oldest first, each under
// its connection's handling lock, until none is left or a new load closes
// the gate again (its end drains the rest).
func (s *Session) drainGate(c *Conn) {
	for {
		hm, n, ok, idle := s.gate.Next()
		if !ok {
			if idle {
				c.ag.gating.Add(-1)
			}
			return
		}
		hm.conn.queuedBytes.Release(int64(n))
		hm.conn.handleHeld(hm)
	}
}

// failHeld answers every message s's gate holds: the session ended
// before it was established (why).
func (s *Session) failHeld(why string) {
	held, sizes, idle := s.gate.Drop()
	if idle {
		s.side.ag.gating.Add(-1)
	}
	for i, hm := range held {
		hm.conn.queuedBytes.Release(int64(sizes[i]))
		if hm.id != nil {
			hm.conn.replyError(hm.id, jsonrpc.CodeInvalidRequest, fmt.Sprintf(
				"%s was not sent: the gateway held it until session %s was established, and it was not (%s)", hm.method, s.GatewayID, why), nil)
		}
	}
}

// holdBack holds m, a client message about a session of c's whose gate is
// closed, reporting whether it did so (or answered m: no room to hold it).
func (cr *clientReader) holdBack(m *jsonrpc.Message) bool {
	c := cr.c
	s := c.sessionNamed(m)
	if s == nil || !s.gate.Active() {
		return false
	}
	n := len(m.Raw)
	if !c.queuedBytes.Hold(int64(n)) {
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, codeBusy, "this connection's messages waiting for sessions would pass "+sizeText(c.queuedBytes.Max)+"; try again when one has run", nil)
		}
		return true
	}
	hm := heldMsg{conn: c, line: bytes.Clone(m.Raw), method: m.Method, parent: cr.traceParent}
	if m.Kind == jsonrpc.KindRequest {
		hm.id = bytes.Clone(m.ID)
	}
	held, err := s.gate.Hold(hm, n)
	if !held {
		c.queuedBytes.Release(int64(n))
	}
	switch {
	case err != nil:
		if m.Kind == jsonrpc.KindRequest {
			c.replyError(m.ID, codeBusy, err.Error()+"; try again when it is", nil)
		}
		return true
	case held:
		c.log.Debug("held until the session is established", "session", s.GatewayID, "method", m.Method)
	}
	return held
}

// handleHeld handles a message a gate held as if it had just arrived, the
// gate's check aside.
func (c *Conn) handleHeld(hm heldMsg) {
	c.handleMu.Lock()
	cr := &c.cr
	if !c.isClosed() {
		if err := cr.sc.Scan(hm.line, &cr.msg, cr.resolve); err == nil { // it scanned when it came
			cr.traceParent = hm.parent
			cr.handleCallNow(&cr.msg)
			cr.traceParent = trace.SpanContext{}
		}
	}
	c.handleMu.Unlock()
	c.handled()
}

// modeChoice is m, a client's answer to the agent's permission request in,
// unless it picks an option named after a mode of the session outside the
// mode list (models.Seen.Choice): then the agent, and the session's other
// clients, get a cancelled outcome in its place (scanned into cr.choice),
// and the refusal is counted, audited and logged. Failing closed, the tool
// call is not run; an answer has no answer of its own to carry the error
// to the client.
func (cr *clientReader) modeChoice(in *inReq, m *jsonrpc.Message) *jsonrpc.Message {
	c := cr.c
	ls := models.ListsOf(c.ten.policy(c.ag.name))
	if !ls.Modes.Restricts() {
		return m
	}
	var res struct {
		Outcome struct {
			Outcome  string `json:"outcome"`
			OptionID string `json:"optionId"`
		} `json:"outcome"`
	}
	if json.Unmarshal(m.Payload, &res) != nil || res.Outcome.Outcome != "selected" {
		return m
	}
	r := in.sess.models.Choice(res.Outcome.OptionID, ls)
	if r == nil {
		return m
	}
	c.denied(r.Reason, in.method)
	tracing.WithTrace(c.log, in.span).Info("refused a permission answer; the agent is told it was cancelled", "session", in.sess.GatewayID, "err", r.Err)
	line := jsonrpc.AppendResult(nil, m.ID, []byte(`{"outcome":{"outcome":"cancelled"}}`))
	if err := ScanClient(&cr.choiceSc, line, &cr.choice); err != nil {
		return m // cannot happen: the gateway's own line
	}
	return &cr.choice
}
