package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe"
)

// retire retires the agents a reload removed from cur: they take no new
// connection and are drained in the background as a shutdown drains the
// gateway.
func (ag *agents) retire(cur *config.Config, removed []string) {
	for _, name := range removed {
		ag.relay.RetireAgent(name)
		ag.mu.Lock()
		ag.draining[name] = struct{}{}
		ag.mu.Unlock()
		stopGrace := cur.AgentNamed(name).StopGrace.D()
		grace := cur.ShutdownGrace.D() // restart-only: the same in the new configuration
		linger := cur.Linger()
		ag.drains.Add(1)
		go func() { // ends within shutdown_grace and the agent's stop grace, or with stopDrains
			defer ag.drains.Done()
			ag.drain(name, grace, linger, stopGrace)
		}()
	}
}

// drain ends a removed agent as Shutdown ends the gateway: running prompts
// get grace (shutdown_grace) to finish, then are cancelled; its clients get
// the linger to read their answers and close; the connections left close
// (a WebSocket with 1001, going away); its processes stop.
func (ag *agents) drain(name string, grace, linger, stopGrace time.Duration) {
	log := ag.log.With("agent", name)
	log.Info("agent removed: draining")
	end := ag.finishPrompts(ag.drainCtx, name, grace)
	ag.lingerThenClose(ag.drainCtx, name, linger, end, "agent removed")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second+stopGrace)
	defer cancel()
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	stop := context.AfterFunc(ag.drainCtx, stopWait) // Shutdown ends the wait, not the agent's stop
	defer stop()
	ag.links.waitLinks(waitCtx, name)
	if err := ag.relay.CloseAgent(ctx, name); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("agent drain incomplete", "err", err)
	}
	ag.gate.reopen(name) // the name may be added again
	ag.mu.Lock()
	delete(ag.draining, name)
	ag.mu.Unlock()
	log.Info("agent removed: drained")
}

// retiring reports whether a reload removed the agent and it is draining.
func (ag *agents) retiring(name string) bool {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	_, ok := ag.draining[name]
	return ok
}

// drainsInProgress counts the removed agents still draining.
func (ag *agents) drainsInProgress() int {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return len(ag.draining)
}

// stopDrains cuts the drains of removed agents short (their prompts' grace
// and the wait for their connections) and waits for them to end: each
// still stops its agent's processes first.
func (ag *agents) stopDrains() {
	ag.cancel()
	ag.drains.Wait()
}

// finishPrompts lets the running prompts of agent ("" = every agent) finish
// for up to grace, or until ctx ends, then cancels those left (a drain).
// Both waits are woken by the relay as each prompt's answer reaches its
// client (proxy.Relay.WaitPrompts). It returns when the drain's time is up:
// the end of grace, or of cancelWait after a cancel.
func (ag *agents) finishPrompts(ctx context.Context, agent string, grace time.Duration) time.Time {
	log := ag.log
	if agent != "" {
		log = log.With("agent", agent)
	}
	if n := ag.relay.PromptsInFlight(agent); n > 0 {
		log.Info("letting running prompts finish", "prompts", n, "grace", grace)
	}
	end := time.Now().Add(grace)
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	if ag.relay.WaitPrompts(wctx, agent) == nil {
		return end
	}
	// Those left are cancelled; their clients get the stopReason
	// "cancelled": the agents' if they answer within cancelWait, else the
	// gateway's (even when ctx has ended).
	end = time.Now().Add(cancelWait)
	ag.relay.CancelPrompts(agent, cancelWait)
	return end
}

// lingerThenClose closes the connections of agent ("" = every agent) once
// a drain's prompts have ended (finishPrompts): each client first gets up
// to linger to read its last answers and close by itself, as a client
// that reads asynchronously needs. Prompts are refused from now on
// (drainGate). The wait ends when every connection
// has closed or its client has left (link.left: Streamable HTTP), at end
// (the drain's time is up: the linger never makes a drain longer), or
// when ctx ends. Those still open then close: a WebSocket with 1001
// (going away), Streamable HTTP by ending its streams.
func (ag *agents) lingerThenClose(ctx context.Context, agent string, linger time.Duration, end time.Time, reason string) {
	ag.gate.shut(agent) // a prompt now would be cut by the close
	if until := time.Now().Add(linger); until.Before(end) {
		end = until
	}
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	// A client leaving Streamable HTTP changes no registry: it is looked
	// for every lingerPoll.
	poll := time.NewTicker(lingerPoll)
	defer poll.Stop()
	logged := false
	for {
		links, changed := ag.links.linksOf(agent)
		open := 0
		for _, l := range links {
			if _, _, closing := l.closeState(); closing {
				continue
			}
			if l.left() {
				l.goingAway(reason)
				continue
			}
			open++
		}
		if open == 0 || wctx.Err() != nil {
			break
		}
		if !logged {
			logged = true
			log := ag.log
			if agent != "" {
				log = log.With("agent", agent)
			}
			log.Info("prompts ended; waiting for clients to close", "connections", open, "linger", time.Until(end).Round(time.Millisecond))
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-wctx.Done():
		}
	}
	links, _ := ag.links.linksOf(agent)
	for _, l := range links {
		l.goingAway(reason)
	}
}

// drainGate refuses the prompts of a drain that lingers (lingerThenClose),
// as the one decider point (observe.PromptDecider) refuses a prompt: a prompt
// then would reach the agent only to be cut by the close that follows; its
// client is told so at once instead, and the agent never sees it. Prompts
// during the grace still run: the drain waits for them.
type drainGate struct {
	all     atomic.Bool  // the gateway's drain
	removed atomic.Int32 // len(agents): the hot path takes no lock without one
	mu      sync.Mutex
	agents  map[string]struct{} // removed agents whose drain lingers
}

// shut refuses the prompts of agent ("" = every agent).
func (g *drainGate) shut(agent string) {
	if agent == "" {
		g.all.Store(true)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.agents[agent] = struct{}{}
	g.removed.Store(int32(len(g.agents)))
}

// reopen takes prompts for a removed agent's name again, once its drain is
// over.
func (g *drainGate) reopen(agent string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.agents, agent)
	g.removed.Store(int32(len(g.agents)))
}

// drainRefusal is what a prompt refused by a drain is answered: the code
// and words of a queued prompt a drain drops (proxy.Relay.CancelPrompts).
var drainRefusal = observe.Refusal{Code: jsonrpc.CodeRequestCancelled,
	Message: "the gateway is shutting down; the prompt was not sent to the agent"}

// Prompt implements observe.PromptDecider.
func (g *drainGate) Prompt(e *observe.Event) *observe.Refusal {
	if g.all.Load() {
		r := drainRefusal
		return &r
	}
	if g.removed.Load() == 0 || e.Session == nil {
		return nil
	}
	g.mu.Lock()
	_, shut := g.agents[e.Session.Agent]
	g.mu.Unlock()
	if !shut {
		return nil
	}
	r := drainRefusal
	return &r
}

var _ observe.PromptDecider = (*drainGate)(nil)

// lingerPoll is how often a drain's linger looks for Streamable HTTP
// clients that have left.
const lingerPoll = 50 * time.Millisecond

// cancelWait is how long a drain waits for the agents to answer the
// session/cancel of the prompts it cancelled.
const cancelWait = 2 * time.Second
