// Package audittrail records a session's events in the audit trail
// (package audit writes them): session.created, loaded, closed and lost,
// session.attached and detached (a client that joined or left a session
// it does not hold), prompt.started and prompt.ended, permission.requested
// and resolved, fs.read and fs.written. Every event names the session's ID
// as its clients see it, never the agent's, and never a prompt's or a
// file's contents (a prompt's text only when asked for).
package audittrail

import (
	"encoding/json"
	"strings"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/observe"
)

// Trail is the audit trail as an observer.
type Trail struct {
	rec     audit.Recorder
	prompts bool // record a prompt's text in prompt.started
}

// New records the events of sessions in rec; prompts adds a prompt's text
// to prompt.started.
func New(rec audit.Recorder, prompts bool) *Trail { return &Trail{rec: rec, prompts: prompts} }

// Observe records e, if the trail keeps events of its kind.
func (t *Trail) Observe(e *observe.Event) {
	switch e.Kind {
	case observe.SessionCreated, observe.SessionLoaded, observe.SessionClosed, observe.SessionLost:
		fields := []audit.Field{audit.F("cwd", e.Session.Cwd)}
		if e.Reason != "" {
			fields = append(fields, audit.F("reason", e.Reason))
		}
		t.record(e, "session."+e.Kind.SessionName(), fields...)
	case observe.TurnStarted:
		t.promptStarted(e)
	case observe.TurnEnded:
		fields := []audit.Field{audit.F("stop_reason", e.StopReason), audit.F("duration_ms", e.Duration.Milliseconds())}
		if len(e.Tokens) > 0 {
			fields = append(fields, audit.F("usage", e.Tokens))
		}
		if len(e.Cost) > 0 {
			fields = append(fields, audit.F("cost", e.Cost))
		}
		t.record(e, "prompt.ended", fields...)
	case observe.PermissionRequested:
		t.permissionRequested(e)
	case observe.PermissionResolved:
		t.permissionResolved(e)
	case observe.SessionAttached:
		t.record(e, "session.attached", audit.F("clientId", e.ClientID), audit.F("readOnly", e.ReadOnly),
			audit.F("history", e.History))
	case observe.SessionDetached:
		t.record(e, "session.detached", audit.F("clientId", e.ClientID), audit.F("readOnly", e.ReadOnly))
	case observe.FileServed:
		kind := "fs.read"
		if e.Method == acp.FsWrite {
			kind = "fs.written"
		}
		t.record(e, kind, audit.F("path", e.Path), audit.F("bytes", e.Bytes), audit.F("by", e.By))
	}
}

// record writes one event about e's session: its client is who acted (none
// when the gateway did).
func (t *Trail) record(e *observe.Event, kind string, fields ...audit.Field) {
	s := e.Session
	t.rec.Record(audit.Event{Event: kind, Tenant: s.Tenant, Agent: s.Agent, Session: s.ID,
		Subject: e.Client.Subject, Conn: e.Client.Conn, Fields: fields})
}

// promptStarted records prompt.started, with the prompt's text if asked.
func (t *Trail) promptStarted(e *observe.Event) {
	if !t.prompts {
		t.record(e, "prompt.started")
		return
	}
	blocks := e.Prompt
	if blocks == nil {
		blocks = acp.PromptBlocks(e.Params)
	}
	t.record(e, "prompt.started", audit.F("prompt", promptText(blocks)))
}

// promptText joins the text blocks of a prompt.
func promptText(blocks []json.RawMessage) string {
	var texts []string
	for _, b := range blocks {
		var blk struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(b, &blk) == nil && blk.Type == "text" {
			texts = append(texts, blk.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// permissionFacts is what the trail says of a permission request: the tool
// call, and the options offered (never their content).
type permissionFacts struct {
	Params struct {
		ToolCall struct {
			ToolCallID string `json:"toolCallId"`
			Title      string `json:"title"`
			Kind       string `json:"kind"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Name     string `json:"name"`
			Kind     string `json:"kind"`
		} `json:"options"`
	} `json:"params"`
}

func (t *Trail) permissionRequested(e *observe.Event) {
	var p permissionFacts
	_ = json.Unmarshal(e.Msg, &p)
	opts := make([]map[string]string, 0, len(p.Params.Options))
	for _, o := range p.Params.Options {
		opts = append(opts, map[string]string{"optionId": o.OptionID, "name": o.Name, "kind": o.Kind})
	}
	tc := p.Params.ToolCall
	t.record(e, "permission.requested", audit.F("toolCallId", tc.ToolCallID), audit.F("title", tc.Title),
		audit.F("kind", tc.Kind), audit.F("options", opts))
}

func (t *Trail) permissionResolved(e *observe.Event) {
	var p permissionFacts
	_ = json.Unmarshal(e.Msg, &p)
	var o struct {
		Outcome  string `json:"outcome"`
		OptionID string `json:"optionId"`
	}
	_ = json.Unmarshal(e.Outcome, &o)
	fields := []audit.Field{audit.F("toolCallId", p.Params.ToolCall.ToolCallID), audit.F("outcome", o.Outcome)}
	if o.OptionID != "" {
		fields = append(fields, audit.F("optionId", o.OptionID))
	}
	fields = append(fields, audit.F("by", e.By))
	if e.Rule != "" {
		fields = append(fields, audit.F("rule", e.Rule))
	}
	t.record(e, "permission.resolved", fields...)
}
