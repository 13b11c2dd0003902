package demoagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"
)

// This file holds the handlers of initialize and the session/* methods
// other than session/prompt (see turn.go).

type (
	initializeResult struct {
		ProtocolVersion   int               `json:"protocolVersion"`
		AgentCapabilities agentCapabilities `json:"agentCapabilities"`
		AuthMethods       []any             `json:"authMethods"`
		AgentInfo         implementation    `json:"agentInfo"`
	}
	agentCapabilities struct {
		LoadSession         bool                `json:"loadSession"`
		PromptCapabilities  promptCapabilities  `json:"promptCapabilities"`
		MCPCapabilities     mcpCapabilities     `json:"mcpCapabilities"`
		SessionCapabilities sessionCapabilities `json:"sessionCapabilities"`
	}
	promptCapabilities struct {
		Image           bool `json:"image"`
		Audio           bool `json:"audio"`
		EmbeddedContext bool `json:"embeddedContext"`
	}
	mcpCapabilities struct {
		HTTP bool `json:"http"`
		SSE  bool `json:"sse"`
	}
	sessionCapabilities struct {
		List                  struct{} `json:"list"`
		Close                 struct{} `json:"close"`
		Resume                struct{} `json:"resume"`
		AdditionalDirectories struct{} `json:"additionalDirectories"`
	}
	implementation struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
)

func (a *agent) initialize(raw json.RawMessage) (any, error) {
	var p struct {
		ProtocolVersion    *int64          `json:"protocolVersion"`
		ClientCapabilities json.RawMessage `json:"clientCapabilities"`
	}
	if err := decodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.ProtocolVersion == nil {
		return nil, invalidParams("protocolVersion is required")
	}
	// Capabilities fall back to "unsupported" when malformed, as the schema
	// asks (x-deserialize-default-on-error), so decoding errors are ignored.
	var caps struct {
		FS struct {
			ReadTextFile  json.RawMessage `json:"readTextFile"`
			WriteTextFile json.RawMessage `json:"writeTextFile"`
		} `json:"fs"`
	}
	_ = json.Unmarshal(p.ClientCapabilities, &caps)

	a.mu.Lock()
	a.initialized = true
	a.canRead = string(caps.FS.ReadTextFile) == "true"
	a.canWrite = string(caps.FS.WriteTextFile) == "true"
	a.mu.Unlock()
	if *p.ProtocolVersion != 1 {
		a.log.Printf("client asked for protocol version %d; answering with 1", *p.ProtocolVersion)
	}

	return initializeResult{
		ProtocolVersion: 1,
		AgentCapabilities: agentCapabilities{
			LoadSession:        true,
			PromptCapabilities: promptCapabilities{EmbeddedContext: true},
			MCPCapabilities:    mcpCapabilities{HTTP: true},
		},
		AuthMethods: []any{},
		AgentInfo:   implementation{Name: a.opt.Name, Version: a.opt.Version},
	}, nil
}

// ---- sessions ----

// checkRoots validates the cwd and additionalDirectories of a session
// request.
func checkRoots(cwd string, additional []string) error {
	if cwd == "" {
		return invalidParams("cwd is required")
	}
	if !filepath.IsAbs(cwd) {
		return invalidParams("cwd must be an absolute path, got %q", cwd)
	}
	for i, d := range additional {
		if !filepath.IsAbs(d) {
			return invalidParams("additionalDirectories[%d] must be an absolute path, got %q", i, d)
		}
	}
	return nil
}

// checkMCPServers rejects MCP transports that the agent did not advertise
// (it advertises stdio, which v1 makes mandatory, and http). The demo agent
// records them but never connects to MCP servers.
func checkMCPServers(servers []json.RawMessage) error {
	for i, raw := range servers {
		var s struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalidParams("mcpServers[%d]: %v", i, err)
		}
		if s.Type == "sse" {
			return invalidParams("mcpServers[%d]: transport %q is not supported", i, s.Type)
		}
	}
	return nil
}

type sessionParams struct {
	SessionID             string            `json:"sessionId"`
	Cwd                   string            `json:"cwd"`
	MCPServers            []json.RawMessage `json:"mcpServers"`
	AdditionalDirectories []string          `json:"additionalDirectories"`
}

func (a *agent) newSession(raw json.RawMessage) (any, error) {
	var p sessionParams
	if err := decodeParams(raw, &p); err != nil {
		return nil, err
	}
	if err := checkRoots(p.Cwd, p.AdditionalDirectories); err != nil {
		return nil, err
	}
	if err := checkMCPServers(p.MCPServers); err != nil {
		return nil, err
	}
	s := &session{id: newSessionID(), cwd: p.Cwd, updatedAt: time.Now(), history: []historyEntry{}}
	if err := a.store.save(s.file()); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	a.mu.Lock()
	a.sessions[s.id] = s
	a.mu.Unlock()
	a.log.Printf("session %s created (cwd %s)", s.id, s.cwd)
	return map[string]string{"sessionId": s.id}, nil
}

// loadSession serves session/load (replay=true) and session/resume
// (replay=false). It makes the stored session active in this process.
func (a *agent) loadSession(raw json.RawMessage, replay bool) (any, error) {
	var p sessionParams
	if err := decodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.SessionID == "" {
		return nil, invalidParams("sessionId is required")
	}
	if err := checkRoots(p.Cwd, p.AdditionalDirectories); err != nil {
		return nil, err
	}
	if err := checkMCPServers(p.MCPServers); err != nil {
		return nil, err
	}

	a.mu.Lock()
	s := a.sessions[p.SessionID]
	a.mu.Unlock()
	if s == nil {
		f, err := a.store.load(p.SessionID)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, sessionNotFound(p.SessionID)
		}
		if err != nil {
			return nil, err
		}
		s = sessionFromFile(f)
		a.mu.Lock()
		a.sessions[s.id] = s
		a.mu.Unlock()
		a.log.Printf("session %s loaded from %s", s.id, a.store.path(s.id))
	}
	if !replay {
		return struct{}{}, nil
	}

	a.mu.Lock()
	history := append([]historyEntry{}, s.history...)
	a.mu.Unlock()
	for _, h := range history {
		if h.Text == "" {
			continue
		}
		kind := "agent_message_chunk"
		if h.Role == "user" {
			kind = "user_message_chunk"
		}
		a.update(s.id, map[string]any{"sessionUpdate": kind, "content": textBlock(h.Text)})
	}
	return struct{}{}, nil
}

type sessionInfo struct {
	SessionID string `json:"sessionId"`
	Cwd       string `json:"cwd"`
	Title     string `json:"title,omitempty"`
	UpdatedAt string `json:"updatedAt,omitempty"`
}

func (a *agent) listSessions(raw json.RawMessage) (any, error) {
	var p struct {
		Cwd    *string `json:"cwd"`
		Cursor *string `json:"cursor"`
	}
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, invalidParams("%v", err)
		}
	}
	files, err := a.store.list(func(err error) { a.log.Printf("session/list: skipping: %v", err) })
	if err != nil {
		return nil, err
	}
	sessions := []sessionInfo{}
	for _, f := range files {
		if p.Cwd != nil && f.Cwd != *p.Cwd {
			continue
		}
		sessions = append(sessions, sessionInfo{SessionID: f.SessionID, Cwd: f.Cwd, Title: f.Title, UpdatedAt: f.UpdatedAt})
	}
	return map[string]any{"sessions": sessions}, nil
}

func (a *agent) closeSession(raw json.RawMessage) (any, error) {
	var p struct {
		SessionID string `json:"sessionId"`
	}
	if err := decodeParams(raw, &p); err != nil {
		return nil, err
	}
	a.mu.Lock()
	s := a.sessions[p.SessionID]
	var t *turn
	if s != nil {
		t = s.running
		delete(a.sessions, p.SessionID)
	}
	a.mu.Unlock()
	if s == nil {
		if a.store.exists(p.SessionID) {
			return struct{}{}, nil // stored but not active here: nothing to free
		}
		return nil, sessionNotFound(p.SessionID)
	}
	if t != nil {
		// Let the prompt answer "cancelled" before close answers.
		t.cancel()
		select {
		case <-t.done:
		case <-a.ctx.Done():
		}
	}
	a.log.Printf("session %s closed", p.SessionID)
	return struct{}{}, nil
}

func textBlock(text string) map[string]any {
	return map[string]any{"type": "text", "text": text}
}
