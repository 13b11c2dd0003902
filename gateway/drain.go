package gateway

import (
	"context"
	"time"
)

// promptsWaiter is the event a drain waits on when the relay offers it: a
// channel closed once the prompts in flight of agent ("" = every agent),
// answers not yet handed to their clients included, have reached zero.
type promptsWaiter interface {
	PromptsDone(agent string) <-chan struct{}
}

// promptSettle is how long after a delivery a drain looks at the prompts in
// flight again, when the relay has no PromptsDone: a prompt's answer still
// counts until just after its client's Send returns.
const promptSettle = 20 * time.Millisecond

// wakeDrain tells drains waiting for prompts that a message was handed to
// a client or a connection ended. It costs one atomic load when no drain
// waits.
func (s *Server) wakeDrain() {
	if s.promptWatchers.Load() == 0 {
		return
	}
	s.wakeMu.Lock()
	close(s.promptWake)
	s.promptWake = make(chan struct{})
	s.wakeMu.Unlock()
}

// deliveries returns a channel closed at the next wakeDrain.
func (s *Server) deliveries() <-chan struct{} {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return s.promptWake
}

// finishPrompts lets the running prompts of agent ("" = every agent) finish
// for up to grace, or until ctx ends, then cancels those left (a drain).
func (s *Server) finishPrompts(ctx context.Context, agent string, grace time.Duration) {
	log := s.log
	if agent != "" {
		log = log.With("agent", agent)
	}
	if n := s.relay.PromptsInFlight(agent); n > 0 {
		log.Info("letting running prompts finish", "prompts", n, "grace", grace)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	if s.waitPrompts(ctx, agent, timer.C) {
		return
	}
	// Those left are cancelled; their clients get the stopReason
	// "cancelled" if the agents answer within cancelWait (even when ctx
	// has ended).
	s.relay.CancelPrompts(agent, 0)
	timer.Reset(cancelWait)
	s.waitPrompts(context.WithoutCancel(ctx), agent, timer.C)
}

// cancelWait is how long a drain waits for the agents to answer the
// session/cancel of the prompts it cancelled.
const cancelWait = 2 * time.Second

// waitPrompts waits until agent has no prompt in flight (true), or until
// expired or ctx ends (false).
func (s *Server) waitPrompts(ctx context.Context, agent string, expired <-chan time.Time) bool {
	if w, ok := any(s.relay).(promptsWaiter); ok {
		select {
		case <-w.PromptsDone(agent):
			return true
		case <-expired:
		case <-ctx.Done():
		}
		return false
	}
	s.promptWatchers.Add(1)
	defer s.promptWatchers.Add(-1)
	settle := time.NewTimer(promptSettle)
	defer settle.Stop()
	for {
		woken := s.deliveries() // taken before the count: no delivery falls between
		if s.relay.PromptsInFlight(agent) == 0 {
			return true
		}
		select {
		case <-woken:
			settle.Reset(promptSettle) // and look again once the delivery has settled
		case <-settle.C:
		case <-expired:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
