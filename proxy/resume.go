package proxy

import (
	"crypto/subtle"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/metrics"
)

// Sessions outlive sockets.
//
// A connection whose socket ends without a clean close by the client
// detaches (SocketEnded): its sessions, running turns and pending agent
// requests stay, and what the agents send it is kept in its outbox, for
// sessions.detach_timeout. Then it ends as a closed connection does
// (Close). Within that time the client can resume it exactly on a new
// socket (Relay.Resume, Conn.Resume), or another connection of the tenant
// can take one of its sessions over with session/load or session/resume
// (takeOver).

// ErrResumeRefused is returned for every resume that cannot be served, for
// whatever reason: the caller answers them all alike, so a refusal tells
// nothing about the token.
var ErrResumeRefused = errors.New("this connection cannot be resumed; connect anew and load your sessions")

// MethodResumed is the notification that starts a resumed socket: its
// params.received is the number of client messages the gateway had received.
const MethodResumed = "_acpgate/resumed"

// methodTurnEnded tells the connection that took a session over that the
// turn it found running has ended.
const methodTurnEnded = "_acpgate/turn_ended"

// refused counts a refused resume.
func (r *Relay) refused(reason string) {
	r.metrics.Resumes.WithLabelValues("refused", reason).Inc()
}

// maxTokenBytes bounds what Resume looks up.
const maxTokenBytes = 64

// Resume finds the connection of agent a client of tenant resumes with
// token, having received received messages on it. The connection stops its detach timer;
// the caller then resumes it on the new socket (Conn.Resume) or gives up
// (AbortResume). Every failure is ErrResumeRefused. A token resumes its
// connection only for the credential subject that made it: another
// subject of the tenant (who may have read the token from a proxy's log or
// a shared browser profile) is refused as for an unknown token, and the
// connection is not disturbed.
func (r *Relay) Resume(tenant, subject, agent, token string, received int64) (*Conn, error) {
	if token == "" || len(token) > maxTokenBytes {
		r.refused(metrics.RefusedUnknown)
		return nil, ErrResumeRefused
	}
	r.mu.Lock()
	c := r.resumable[token]
	r.mu.Unlock()
	switch {
	case c == nil:
		if inst, _, ok := strings.Cut(token, "."); ok && inst != r.instance && (r.named || len(inst) == len(r.instance)) {
			r.refused(metrics.RefusedOtherReplica)
		} else {
			r.refused(metrics.RefusedUnknown)
		}
		return nil, ErrResumeRefused
	case subtle.ConstantTimeCompare([]byte(c.tenant), []byte(tenant))&subtle.ConstantTimeCompare([]byte(c.subject), []byte(subject)) != 1 ||
		agent != "" && c.ag.name != agent:
		r.refused(metrics.RefusedMismatch)
		return nil, ErrResumeRefused
	case !c.reserveResume(received):
		r.refused(metrics.RefusedNotKept)
		return nil, ErrResumeRefused
	}
	return c, nil
}

// reserveResume checks that the connection can resume from received and
// holds it for the resume: no detach timeout meanwhile.
func (c *Conn) reserveResume(received int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.initialized {
		return false
	}
	c.out.Lock()
	ok := c.out.CanResumeLocked(received)
	c.out.Unlock()
	if !ok {
		return false
	}
	if c.detachTimer != nil {
		c.detachTimer.Stop()
	}
	c.resuming++
	return true
}

// Resume makes sink the connection's socket, resuming it: the old socket,
// if still open, is superseded; sink gets the _acpgate/resumed
// notification, then every message after the first received, then live
// traffic. It follows a successful Relay.Resume.
//
// Under the connection's locks it only swaps the socket and marks it
// catching up (outbox.Box.ResumeLocked), as a member catches up on
// session/attach (joinSession). The replay, up to the whole replay buffer,
// then goes out with no lock held, at the pace the client reads: the
// agent's reader, delivering to this connection meanwhile, never waits on
// it, and what it delivers is kept behind the replay, in order, within
// sessions.replay_buffer_bytes. A client that does not read is cut off by
// its socket's slow-client rule (the connection detaches again); one whose
// agents outrun the replay buffer meanwhile overflows (overflowed).
func (c *Conn) Resume(sink Sink, received int64) error {
	c.mu.Lock()
	c.resuming--
	if c.closed {
		c.mu.Unlock()
		return ErrResumeRefused
	}
	c.out.Lock()
	if !c.out.CanResumeLocked(received) {
		c.out.Unlock()
		c.mu.Unlock()
		c.relay.refused(metrics.RefusedNotKept)
		return ErrResumeRefused
	}
	n := c.recv.Load() // counted under c.out's lock (countFrom)
	params := append(strconv.AppendInt([]byte(`{"received":`), n, 10), '}')
	superseded := c.out.ResumeLocked(sink, received, jsonrpc.AppendRequest(nil, nil, MethodResumed, params))
	overflow := false
	if c.prof.Version >= 2 { // a v2 client hears that each session's replay is complete
		for _, s := range c.sessions {
			if s.live() {
				msg, f := s.replayComplete()
				overflow = c.out.DeliverLocked(msg, s, f, false) || overflow // kept behind the replay
			}
		}
	}
	c.out.Unlock()
	wasDetached := c.detached
	c.detached = false
	c.mu.Unlock()
	if wasDetached {
		c.relay.metrics.Detached.Dec()
	}
	if overflow {
		c.overflowed()
	}
	c.relay.metrics.Resumes.WithLabelValues("ok", "").Inc()
	c.log.Info("connection resumed", "client_received", received, "gateway_received", n, "superseded", superseded)
	c.out.CatchUp(sink)
	return nil
}

// Acked tells the connection that sink's client answered a ping sent
// after the socket had written written messages: the client has read
// them, and the replay buffer need not keep them.
func (c *Conn) Acked(sink Sink, written int64) {
	c.out.Lock()
	if c.out.SinkLocked() == sink {
		c.out.AckLocked(written)
	}
	c.out.Unlock()
}

// AbortResume gives up a Resume whose socket never came: a detached
// connection gets its detach timeout again.
func (c *Conn) AbortResume() {
	c.mu.Lock()
	c.resuming--
	if c.detached && !c.closed && c.resuming == 0 {
		c.armDetachLocked()
	}
	c.mu.Unlock()
}

// SocketEnded is called when sink's socket has ended; clean is a close the
// client asked for (1000) or the gateway decided for good (shutdown, idle,
// handshake). A socket that was superseded changes nothing. Otherwise the
// connection ends, unless it may detach: resume is on, the client was
// initialized and the end was not clean.
func (c *Conn) SocketEnded(sink Sink, clean bool) {
	c.mu.Lock()
	c.out.Lock()
	current := c.out.SinkLocked() == sink
	if current {
		c.out.DetachLocked()
	}
	// A take-over delivers what came after the detach (docs/protocol.md,
	// "Resume after a drop"): taken in
	// the same critical section as the sink, so nothing falls between.
	// After a resume whose catch-up the socket did not finish, that is
	// what it had not been handed yet.
	handed := c.out.HandedLocked()
	c.out.Unlock()
	detach := current && !clean && c.token != "" && c.initialized && !c.closed
	if detach && !c.detached {
		c.detached = true
		c.detachSeq = handed
		c.detachedAt = time.Now()
		if c.resuming == 0 {
			c.armDetachLocked()
		}
	}
	c.mu.Unlock()
	switch {
	case detach:
		c.relay.metrics.Detached.Inc()
		c.log.Info("socket lost; the connection is kept for a resume", "detach_timeout", c.relay.resume.DetachTimeout)
	case current:
		c.Close()
	}
}

// armDetachLocked starts the detach timeout (c.mu held).
func (c *Conn) armDetachLocked() {
	if c.detachTimer != nil {
		c.detachTimer.Stop()
	}
	c.detachTimer = time.AfterFunc(c.relay.resume.DetachTimeout, func() {
		c.mu.Lock()
		expired := c.detached && c.resuming == 0
		c.mu.Unlock()
		if expired {
			c.log.Info("no resume within the detach timeout; ending the connection")
			c.Close()
		}
	})
}

// overflowed ends a connection whose replay buffer had to drop a message
// no socket got: it was detached, or its resumed socket was still catching
// up (the outbox reports an overflow only then), and can no longer be
// resumed exactly.
func (c *Conn) overflowed() {
	c.mu.Lock()
	end := !c.closed
	c.mu.Unlock()
	if end {
		c.log.Warn("replay buffer full before the client got a message; ending the connection", "replay_buffer_bytes", c.out.Limit())
		// Not on the deliverer's stack: it may hold a session's fan lock,
		// which ending the connection's sessions takes. Relay.Close waits.
		c.relay.bg.Go(c.Close) // its answers to agents are queued, never waited for (sendCtrl)
	}
}

// Detached reports whether the connection has no socket.
func (c *Conn) Detached() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.detached
}
