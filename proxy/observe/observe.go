// Package observe is the one point where what watches a session (metrics,
// the audit trail, tracing) and what decides for it (budgets, permission
// rules) plug into the relay. The session and its turn feed an Observer
// every event of their life and ask a PromptDecider before a prompt goes to
// the agent and a PermissionDecider before an agent's permission request
// goes to the clients. The relay knows them by these interfaces only, and a
// plug-in that acts on the relay is handed a Control when it is made
// (Provisioner).
//
// # Where they are called
//
// On the goroutine where the event happens (the agent's reader, a client's
// handler, a worker, the pool's maintainer, a connection's Close), with no
// relay lock held but two:
//
//   - a client's handler lock (proxy's Conn.handleMu) for what a client's
//     message does: its prompt started or queued, an attach, detach or
//     take-over, its answer to a permission request, a file it served. An
//     Observer there holds up only that client's next message.
//     PromptDecider.Prompt is always asked there.
//   - a shared session's fan lock (Session.fan) for PermissionRequested:
//     the request goes to the session's clients under it, and observers
//     hear of it before any client can answer. An Observer there holds up
//     the session's other messages.
//
// PermissionDecider.Permission is asked on the agent's reader with no lock
// held. Observe must not block nor call back into the relay; nor may a
// decider call Control.
package observe

import (
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Session is what observers know of a session. Static once made.
type Session struct {
	ID     string // as its clients see it (never the agent's own ID)
	Tenant string
	Label  string // the tenant's label on metrics
	Agent  string
	Cwd    string // as the client asked for it
	// Key names the agent's session the same on every connection, replica
	// and restart (a digest of the agent's name and its own session ID,
	// never the ID itself): what budgets keep its cumulative cost by.
	Key string
}

// Client is who acted: the zero Client is the gateway itself.
type Client struct {
	Conn    string // the connection's ID
	Subject string // its credential's subject
}

// Turn is one prompt of a session while the agent works on it.
type Turn struct {
	Start time.Time  // when it went to the agent
	Span  trace.Span // its request's span (nil: not traced)
}

// Kind is what happened.
type Kind uint8

// The events, and the Event fields each sets beside Session (and Client
// where a client acted).
const (
	SessionCreated      Kind = iota + 1 // session/new answered
	SessionLoaded                       // session/load or resume answered, or taken over
	SessionClosed                       // Reason: "" (a client closed it) or why the gateway did
	SessionLost                         // Reason: its agent process died
	TurnStarted                         // Turn; Prompt (its content blocks as sent; nil: read them from Params); Params
	Update                              // Turn (nil: between turns); UpdateKind; Params: the session/update's; First: the turn's first, Duration after it started
	CostReported                        // Turn; Currency (a metrics label), Unit (the currency itself); Amount: the session's cost increase as this process metered it (0 for a loaded session's first report); Total: the agent's cumulative cost as reported; First: the load's first live report of the currency (the session was loaded or resumed) of a per-session total with no replayed total, to count against the session's kept value; From: what its increase counts from (usage.Budgeted). Every live report (not a replay's) that reads as an amount
	UsageRejected                       // Reason: why an agent's usage report counts nothing
	TurnEnded                           // Turn; StopReason ("error": no answer); Duration; Tokens and Cost: the turn's
	PermissionRequested                 // Msg: the request as a client is sent it
	PermissionResolved                  // Msg; By: "client", "policy", "timeout", "disconnect", "admin", "agent_exited", or a decider's; Rule (a decider's); Outcome
	FileServed                          // Method; Path (as the tenant sees it); Bytes; By: "client" or "gateway"
	SessionAttached                     // Client: the one that attached (session/attach answered); ClientID, ReadOnly, History
	SessionDetached                     // Client: an attached one that left (session/detach, or its connection ended); ClientID, ReadOnly
	TokensReported                      // Tokens: what a turn's answer reported after the gateway had ended the turn (timed out, cancelled in the agent's place)
	AttachRefused                       // Client: the one that asked; Reason: not_found, refused, full or invalid (Session: only the tenant and agent when it names no live session)
	TakenOver                           // Client: the one that took the session over from a detached connection; Reason: the turn it found: running, ended or idle
	PromptsQueued                       // Count: prompts that began (> 0) or stopped (< 0) waiting for another client's turn
)

// SessionName is what happened to the session, for a session event:
// "created", "loaded", "closed" or "lost" ("" for any other kind).
func (k Kind) SessionName() string {
	switch k {
	case SessionCreated:
		return "created"
	case SessionLoaded:
		return "loaded"
	case SessionClosed:
		return "closed"
	case SessionLost:
		return "lost"
	}
	return ""
}

// Event is one event of a session's life. Observers must not keep it, nor
// the slices it points to, past the call.
type Event struct {
	Kind    Kind
	Session *Session
	Client  Client
	Turn    *Turn

	Reason     string
	UpdateKind []byte
	Msg        []byte
	Prompt     []json.RawMessage
	Params     []byte
	First      bool
	StopReason string
	Duration   time.Duration
	Tokens     map[string]int64   // by kind: input, output, thought, cached_read, cached_write
	Cost       map[string]float64 // by currency label
	Currency   string             // a metrics label: past a tenant's first few currencies, "other"
	Unit       string             // the currency as metering names it, whatever the label (budgets cap it)
	Amount     float64
	Total      float64 // CostReported: the agent's cumulative amount
	From       float64 // CostReported: what Total's increase counts from (usage.Budgeted.From)
	Method     string
	Path       string
	Bytes      int
	By         string
	Rule       string // the standing rule that decided a permission request ("": none)
	Outcome    []byte // a RequestPermissionOutcome
	ClientID   string // an attached client's ID in the session
	ReadOnly   bool   // the attached client may only watch
	History    string // the history policy it attached with: "full", "pending_only" or "none"
	Count      int    // PromptsQueued: how many
}

// Observer watches sessions. Observe runs on the session's hot paths (the
// agent's reader, a client's handler): it must not block, nor call back
// into the relay.
type Observer interface {
	Observe(e *Event)
}

// Refusal is a decider's no: the JSON-RPC error the client gets.
type Refusal struct {
	Code    int
	Message string
	Data    []byte // error.data as JSON (nil: none)
}

// Decision answers an agent's permission request in the clients' place.
type Decision struct {
	Outcome []byte // the RequestPermissionOutcome the agent gets
	By      string // who decided, for the clients and the audit trail
	Rule    string // the standing rule that decided, named and written out ("": none)
	Decide  string // what the rule says: "allow" or "deny" ("": no rule)
}

// PromptDecider is asked before a prompt (e: TurnStarted, Turn nil) goes
// to the agent, or waits for its turn: a Refusal answers it instead.
type PromptDecider interface {
	Prompt(e *Event) *Refusal
}

// PermissionDecider is asked before an agent's permission request (e:
// PermissionRequested, Msg as a client would be sent it: its paths the
// tenant's, the host root scrubbed from its text) goes to the clients: ok
// answers the agent with d, no client is asked, and observers get e then
// PermissionResolved.
type PermissionDecider interface {
	Permission(e *Event) (d Decision, ok bool)
}

// Decider is a plug-in that decides for sessions before the clients are
// asked: a PromptDecider, a PermissionDecider or both. The relay asks each
// only what it implements; one that is neither is never asked.
type Decider any

// Control is what a plug-in may ask of the relay it is registered with. Its
// methods never wait for an agent or a client, and may be called from any
// goroutine, but not from Observe (nothing calls back into the relay
// there).
type Control interface {
	// CancelTurn cancels the running turn of the session its clients see
	// as session: its client's answer carries why (JSON) under
	// _meta.acpgate.<key>. It reports whether a turn was running and not
	// already being cancelled.
	CancelTurn(session, key string, why []byte) bool
}

// Provisioner is a plug-in (an Observer or a Decider) that acts on the
// relay: Provision hands it the relay's Control once, when the relay is
// made, before any event and before any question.
type Provisioner interface {
	Provision(ctl Control)
}

// Selective is an Observer that takes only some kinds of events; one that
// does not implement it takes every kind.
type Selective interface {
	Wants(k Kind) bool
}

// Set is many observers as one, each called in order with the kinds it
// wants. A nil Set observes nothing.
type Set struct {
	all   []Observer
	wants uint64 // a bit per Kind some observer wants
}

// NewSet makes a Set of os (nil ones left out).
func NewSet(os ...Observer) *Set {
	s := &Set{}
	for _, o := range os {
		if o == nil {
			continue
		}
		s.all = append(s.all, o)
		for k := Kind(1); k < 64; k++ {
			if sel, ok := o.(Selective); !ok || sel.Wants(k) {
				s.wants |= 1 << k
			}
		}
	}
	return s
}

// Wants reports whether some observer takes events of kind k: a caller may
// skip building an event nobody takes.
func (s *Set) Wants(k Kind) bool { return s != nil && s.wants&(1<<k) != 0 }

// Observe passes e to each observer that wants it.
func (s *Set) Observe(e *Event) {
	if !s.Wants(e.Kind) {
		return
	}
	for _, o := range s.all {
		if sel, ok := o.(Selective); !ok || sel.Wants(e.Kind) {
			o.Observe(e)
		}
	}
}

// Deciders is many deciders as one, each asked only what it decides, in
// order: the first refusal or decision wins. The zero Deciders decides
// nothing.
type Deciders struct {
	prompt     []PromptDecider
	permission []PermissionDecider
}

// NewDeciders makes a Deciders of ds (nil ones left out).
func NewDeciders(ds ...Decider) Deciders {
	var out Deciders
	for _, d := range ds {
		if p, ok := d.(PromptDecider); ok && p != nil {
			out.prompt = append(out.prompt, p)
		}
		if p, ok := d.(PermissionDecider); ok && p != nil {
			out.permission = append(out.permission, p)
		}
	}
	return out
}

// DecidesPrompts and DecidesPermissions report whether some decider
// decides prompts, or permission requests: a caller may skip building
// the event.
func (ds Deciders) DecidesPrompts() bool     { return len(ds.prompt) > 0 }
func (ds Deciders) DecidesPermissions() bool { return len(ds.permission) > 0 }

// Prompt asks each PromptDecider in order until one refuses.
func (ds Deciders) Prompt(e *Event) *Refusal {
	for _, d := range ds.prompt {
		if r := d.Prompt(e); r != nil {
			return r
		}
	}
	return nil
}

// Permission asks each PermissionDecider in order until one decides.
func (ds Deciders) Permission(e *Event) (Decision, bool) {
	for _, d := range ds.permission {
		if dec, ok := d.Permission(e); ok {
			return dec, true
		}
	}
	return Decision{}, false
}
