package gateway

import (
	"context"
	"time"
)

// finishPrompts lets the running prompts of agent ("" = every agent) finish
// for up to grace, or until ctx ends, then cancels those left (a drain).
// Both waits are woken by the relay as each prompt's answer reaches its
// client (proxy.Relay.WaitPrompts).
func (s *Server) finishPrompts(ctx context.Context, agent string, grace time.Duration) {
	log := s.log
	if agent != "" {
		log = log.With("agent", agent)
	}
	if n := s.relay.PromptsInFlight(agent); n > 0 {
		log.Info("letting running prompts finish", "prompts", n, "grace", grace)
	}
	wctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	if s.relay.WaitPrompts(wctx, agent) == nil {
		return
	}
	// Those left are cancelled; their clients get the stopReason
	// "cancelled" if the agents answer within cancelWait (even when ctx
	// has ended).
	s.relay.CancelPrompts(agent, cancelWait)
}

// cancelWait is how long a drain waits for the agents to answer the
// session/cancel of the prompts it cancelled.
const cancelWait = 2 * time.Second
