// Package proxy is acpgate's ACP core: it multiplexes client connections
// onto pooled agent processes. It knows nothing of HTTP or WebSockets: a
// transport feeds a Conn the client's messages and gives it a Sink to send
// through.
//
// # The parts and who owns what
//
//   - Relay: the registry. It owns the agents (by name), the tenants, the
//     open connections and the resume tokens, under Relay.mu, and the
//     relay's own goroutines (workers: a prompt that waited for its turn
//     starts, an agent request is answered in its clients' place, an
//     overflowed connection ends, a turn the gateway cancels is cancelled:
//     Relay.CancelTurn, for a budget), which Relay.Close waits for once the
//     agents' readers have stopped.
//   - agent: one named agent. It owns its pool (package pool, which runs and
//     chooses the processes and knows nothing of messages), the procSide of
//     each live process, and what watches and decides for its sessions
//     (an observe.Set and observe.Deciders, built by AddAgent).
//   - procSide: the relay's side of one process (procside.go), the
//     pool.Handler the pool hands the agent's lines, ticks and exit to. It
//     owns the routes of the messages that cross the process: client
//     requests in flight (pending, by the agent-side id), the prompt
//     answers the gateway is handing over (answering), and the process's
//     sessions by the agent's own session ID, in a copy-on-write map the
//     agent's reader reads without a lock. The agent's requests about no
//     session wait in its loose set. Its agentReader is the process's read
//     side: it runs on the pool's read goroutine only.
//   - Session: one ACP session, the one place that says who holds it: its
//     owner (the plain client that created or loaded it; an atomic pointer
//     the reader loads per message) and its members (clients that attached,
//     ACP RFD #533), who all get its messages in one order (fanout.go,
//     attach.go). Its life is one stage, live, closing, lost or ended,
//     moved forward once under Session.mu; Session.end(cause) runs the
//     teardown once, off every lock, its steps chosen by the cause
//     (life.go). It owns its process session slot (a pool.Lease) until it
//     ends, its tenant session slot while any connection holds it
//     (refs), the agent's requests about it waiting for a client
//     (inbound, an inflight.Set: their one index), the configuration the
//     agent last reported (multiclient.Record), what session/attach
//     replays (history, under fan), what its agent reported using (meter),
//     and its turn. A client joins and leaves it as a member (Session.join
//     and leave; session/attach and session/detach on the wire).
//   - turn: the session's prompts: the one the agent works on, those of
//     other clients waiting for it, when it started and last ended, its span
//     as observers know it (observe.Turn), and a turn that ended while the
//     owner was detached (package turn). An ACP v2 turn runs from its
//     prompt's acknowledgement to the session's idle state_update: the
//     prompt stays in its process's table, acked, until then (v2turn.go).
//   - A child session (an agent's subagent, announced by subagent_update)
//     is a Session of its parent's client, sealed with its subject: its
//     messages go with its parent's (its stream, attached clients,
//     history), a take-over moves it, and it ends with its parent
//     (child.go).
//   - Conn: one client connection, the client record: the index of its
//     sessions by the ID it sees (Conn.index and forget), its home process
//     lease, its outbox (numbered, kept for a resume; a kept message is
//     tagged with its session, so a take-over finds the session's messages
//     since the detach), its socket's state (resume.go), and its requests
//     in flight either way (reqs, an inflight.Table: a client's answer or
//     cancellation names its own id; an agent request there is only an id
//     to its inReq). Its clientReader is its read side: it scans each
//     message, applies the limits and the tenant's policy, and routes it,
//     used only under Conn.handleMu.
//   - inReq: one agent request waiting for a client (inreq.go), with a
//     lock of its own (a leaf) over who holds a copy. It is settled once,
//     by settle, whoever settles it (the client that answers, a decider, or
//     the gateway in the clients' place: the last client gone, a timeout,
//     an administrator, the agent's exit, no recipient), always in one
//     order: claimed, forgotten by its index, the other clients' copies
//     withdrawn and the members told (under Session.fan), the agent
//     answered, PermissionResolved emitted.
//   - hold: what handling one client request takes (a tenant slot, a
//     process slot, the request's count on its process, a load's session
//     route), carried by the outReq and released once, whichever way the
//     request ends; a second release is logged and counted
//     (acpgate_double_releases_total). The handlers that route a request
//     make it (route_client.go), and the agent's reader for a model switch
//     it asks for (switchModel).
//
// # Lock order
//
// Outer before inner; no lock is held while a lock earlier in a line is
// taken (Conn.out, Session.turn and Session.inbound stand for the locks of
// their outbox.Box, turn.Turn and inflight.Set):
//
//	Conn.handleMu → Session.fan → Conn.mu → Conn.out → Session.mu → Session.turn → procSide.mu
//	                                        Conn.out → the Sink's own lock
//	                                                   Session.mu → Session.inbound
//	Relay.mu → pool.Pool.mu → pool.Process.mu
//
// Session.fan orders what a session's clients get (the agent's messages,
// others' prompts, presence, an attach's result and backlog, a permission
// request's copies and their withdrawal, an administrator's notice). It is
// taken by the agent's reader, a connection's handler (under its
// handleMu), a connection's Close (a member leaving tells the others), the
// admin API's EndSession, a session's end, whoever settles an agent request
// (inReq.settle: the pool's maintainer for a timeout, a worker) and the
// workers (a queued prompt announced, a turn answered in the agent's
// place), never while a Conn or Session lock is held, and nothing done under it waits for a
// handleMu, ends a connection or a session, or takes another session's
// fan: a connection that overflows meanwhile ends on a worker, and an
// attach's replay, which may wait for its client, goes out without it.
// Observers are called under no relay lock but a client's handleMu (for
// what its messages do) and a shared session's fan (PermissionRequested
// only); package observe says exactly when.
//
// A take-over holds two outboxes at once, always in the order their
// connections were made (Conn.seq), so two connections taking each other's
// sessions over cannot deadlock. procSide.mu, inReq.mu, agent.mu, tenant.mu,
// the locks of usage.Meter, multiclient.Record, Conn.reqs (an
// inflight.Table) and Relay.adminEnded (an inflight.Recent), workers.mu,
// Relay.promptMu and metrics.TenantLabels.mu are leaves. The pool calls no relay code with its
// locks held, and a session's slot is released by its end's teardown, off
// every lock.
//
// # How a client message travels
//
// The transport calls Conn.HandleFrom with a frame (Streamable HTTP scans
// a POST first, with ScanClient, and calls HandleScannedTrace). Under
// handleMu the clientReader scans each message (jsonrpc.Scanner, no copy)
// and checks it: rate limits, the initialize handshake, the tenant's
// policy, paths under the tenant's root; the members of its _meta the
// policy does not allow (policy.MetaFilter) are cut out by splice edits,
// and the line the agent reads is the message on one line
// (jsonrpc.SpliceLine). handleCall then lets one small
// handler per class of message choose the process and take the request's
// hold: a message about a live session goes to its process; a load or
// resume to the process that serves the session (or is taken over from a
// detached connection); session/new to a process with room; anything else
// to the connection's home process. send asks the deciders about a prompt,
// tracks the request with the connection and the procSide, splices the
// edits in (the sealed session ID opened, the id renumbered, paths mapped,
// the traceparent) and queues the line on the process.
//
// # How an agent line travels
//
// The process's read goroutine hands each line to its procSide. The
// agentReader scans it. An answer takes its request from pending, settles
// what it means for the session (created, loaded, closed, listed), ends the
// request (its hold released) and is delivered to the client that asked; a
// prompt's answer counts as running until it is in that client's queue,
// and so does an answer the gateway gives in the agent's place (a drain
// waits for both). A request or notification finds its recipient by the
// session's owner (or the request it is about), passes the tenant's policy
// and root (or is served by the file stand-in, or a permission request
// answered by a decider), and is delivered: the Conn's outbox numbers it,
// keeps it for a resume, and hands it to the Sink, whose bounded queue
// decides what a slow client costs (to a resumed Sink still catching up,
// after its replay, which goes out with no lock held: Conn.Resume).
//
// # What watches and what decides
//
// The session and its turn are the one place that tells observers what
// happens (events.go, the only place an observe.Event is built): created,
// loaded, closed and lost, a turn started and ended (its stop reason, time,
// tokens and cost), each update (the first of a turn marked), cost reported
// and usage rejected, permission requested and resolved, files served, a
// member joined, refused or let go, a take-over, prompts queued for a turn.
// The relay's session gauges and counters (attached clients, attaches,
// take-overs, queued prompts) are derived from these by metrics.Agent. The relay's metrics (package metrics), the
// audit trail (observe/audittrail) and the turns' spans (observe/tracing)
// are observers, beside Config.Observers. Config.Deciders are asked, each
// only what it implements (observe.PromptDecider, PermissionDecider),
// before a prompt goes to the agent (a refusal is the client's answer) and
// before an agent's permission request goes to the clients (a decision
// answers the agent, and no client is asked). A plug-in that acts on the
// relay (the budget ledger cancels turns) is handed the relay's
// observe.Control once, when NewRelay is done (observe.Provisioner): it
// holds no pointer to the relay. Routing code hands a session's events
// to nothing else; what it counts itself is about messages and requests,
// not sessions (messages and bytes relayed, request times, refusals,
// protocol errors).
//
// # Tracing
//
// With Config.Tracing, each client request has a span named by its method
// (observe/tracing), opened once by handleCall and ended once: by its
// outReq's end once one carries it, else (the gateway answered it itself)
// when handleCall returns (endRequestSpan); an agent request's span ends in
// its settle. A prompt's span is its turn's, under which the pool wait,
// the first update, the agent's requests to the client, the file stand-in
// and each tool call are spans, and the updates a count. The client's
// params._meta.traceparent (or a POST's header) is its parent; the line the
// agent gets names it in _meta.traceparent, the one edit made to _meta
// besides the allow-list's removals. Without it none of this runs.
//
// # Pooled buffers
//
// A message the relay delivers is a pooled buffer (jsonrpc.GetBuffer) that
// the Sink owns once it has it, unless the connection keeps what it sends
// for a resume (Conn.KeepsSent): then the connection's outbox owns it, the
// Sink only borrows it, and the outbox pools it when it drops it from the
// replay buffer once the Sink has written it (WrittenSink; package outbox
// says when it gives a buffer back). A build with -tags poison scribbles
// over every released buffer and panics on a second release, so that a use
// after release fails the tests (test/run.sh runs proxy and gateway so).
package proxy
