// Package proxy is acpgate's ACP core: it multiplexes client connections
// onto pooled agent processes. It knows nothing of HTTP or WebSockets: a
// transport feeds a Conn the client's frames and gives it a Sink to send
// through.
//
// # The parts and who owns what
//
//   - Relay: the registry. It owns the agents (by name), the tenants, the
//     open connections and the resume tokens, under Relay.mu.
//   - agent: one named agent. It owns its pool (package pool, which runs and
//     chooses the processes and knows nothing of messages) and the procLink
//     of each live process.
//   - procLink: the relay's side of one process, the pool.Handler the pool
//     hands the agent's lines, ticks and exit to. It owns the routes of the
//     messages that cross the process: client requests in flight (pending,
//     by the agent-side id), agent requests waiting for a client (inbound),
//     and the process's sessions by the agent's own session ID, in a
//     copy-on-write map the agent's reader reads without a lock.
//   - Session: one ACP session, the one place that says who holds it: its
//     owner (the plain client that created or loaded it) and its members
//     (clients that attached, ACP RFD #533), who all get its messages in
//     one order; see fanout.go and attach.go. Its
//     owner (an atomic pointer the reader loads per message) changes only
//     through its methods, under its own lock: a load by another connection
//     (the newest load wins), a take-over of a detached connection's
//     session, the owner's end, the agent's death. Under that lock it also
//     owns its turn in flight (the client's session/prompt), the agent's
//     requests about it still waiting for a client (a take-over sends them
//     again from this list), whether it was lost or ended while detached,
//     its process session slot (a pool.Lease) until it ends, and its
//     tenant session slot: one however many connections hold it, given
//     back when the last lets go (Session.held, unheld).
//   - Conn: one client connection. It owns what it was sent (its outbox:
//     numbered, kept for a resume; a kept message is tagged with its
//     session, so a take-over finds the session's messages since the
//     detach), the index of its sessions by the ID it sees, and the ids of
//     its requests in flight either way: a client's answer or cancellation
//     names its own id, so the connection resolves it. Its home process
//     lease serves its requests that name no session.
//   - hold: what handling one client request takes (a tenant slot, a
//     process slot, the request's count on its process, a load's session
//     route), made in one place, carried by the outReq and released once,
//     whichever way the request ends. A second release is logged and
//     counted (acpgate_double_releases_total).
//
// # Lock order
//
// Outer before inner; no lock is held while a lock earlier in a line is
// taken:
//
//	Conn.handleMu → Session.fan → Conn.mu → Conn.out.mu → Session.mu
//	                                        Conn.out.mu → the Sink's own lock
//	Relay.mu → pool.Pool.mu → pool.Process.mu
//
// Session.fan orders what a session's clients get (the agent's messages,
// others' prompts, presence, an attach's result and backlog, a permission
// request's copies and their withdrawal). It is taken by the agent's reader
// and by a connection's handler (under its handleMu), never while a Conn or
// Session lock is held, and nothing done under it waits for a handleMu, ends
// a connection or a session, or takes another session's fan: a connection
// that overflows meanwhile ends on a goroutine of its own (Relay.bg), and
// an attach's replay, which may wait for its client, goes out without it.
//
// A take-over holds two outboxes at once, always in the order their
// connections were made (Conn.seq), so two connections taking each other's
// sessions over cannot deadlock. procLink.mu, agent.mu, tenant.mu,
// Session.meter's lock and Relay.promptMu are leaves: nothing else is taken while one is held, and a
// lease is released with no lock held.
//
// # How a client message travels
//
// The transport calls Conn.HandleFrom with a frame. Under handleMu the
// frame's messages are scanned one at a time (jsonrpc.Scanner, no copy)
// and checked: rate limits, the initialize handshake, the tenant's policy,
// paths under the tenant's root. handleCall then lets one small handler per
// class of message choose the process and take the request's hold: a
// message about a live session goes to its process; a load or resume to
// the process that serves the session (or is taken over from a detached
// connection); session/new to a process with room; anything else to the
// connection's home process. send tracks the request with the connection
// and the procLink, splices the edits in (the sealed session ID opened, the
// id renumbered, paths mapped) and queues the line on the process.
//
// # How an agent line travels
//
// The process's read goroutine hands each line to its procLink. The
// agentReader scans it. An answer takes its request from pending, settles
// what it means for the session (created, loaded, closed, listed), ends the
// request (its hold released) and is delivered to the client that asked.
// A request or notification finds its recipient by the session's owner (or
// the request it is about), passes the tenant's policy and root (or is
// served by the file stand-in), and is delivered: the Conn's outbox numbers
// it, keeps it for a resume, and hands it to the Sink, whose bounded queue
// decides what a slow client costs.
//
// # Tracing
//
// With Config.Tracing, each client request has a span named by its method
// (trace.go), carried by its outReq and ended with it; a prompt's span is
// its session's turn (turn.trace), under which the pool wait, the
// first update, the agent's requests to the client, the file stand-in and
// each tool call are spans, and the updates a count. The client's
// params._meta.traceparent (or a POST's header) is its parent; the line
// the agent gets names it in _meta.traceparent, the one edit made to
// _meta. Without it nothing of this runs.
package proxy
