package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/acpgate/acpgate/proxy/policy"
)

// Profile is what a pooled agent is told about its clients in initialize:
// the protocol version asked for and the client capabilities that gate
// agent→client requests (the agent may only call what the client
// advertised).
//
// File access is not part of what decides which process serves a client:
// every process is told fs read and write as far as any tenant's policy
// allows, and the relay answers fs/* itself for a client that did not offer
// them. The rest of a profile (its Kind) does: terminal (the agent would run
// commands itself without it) and the draft capabilities the gateway cannot
// stand in for.
type Profile struct {
	// Tenant is set when tenants are isolated: the process serves only it.
	Tenant       string
	Version      int
	FsRead       bool
	FsWrite      bool
	Terminal     bool
	AuthTerminal bool
	ElicitForm   bool
	ElicitURL    bool
	ConfigBool   bool
	// Subagents: the v1 client routes subagents' child sessions
	// (clientCapabilities.subagents, v1 unstable; v2 has them always).
	Subagents bool
}

// Kind is the part of p that decides which processes may serve it: p
// without its file access.
func (p Profile) Kind() Profile {
	p.FsRead, p.FsWrite = false, false
	return p
}

// Serves reports whether a process told p may serve a client whose own
// profile is c: same tenant and protocol version, and the process was told
// nothing beyond file access that the client lacks (the agent may ask for
// whatever it was told; file access the gateway stands in for).
func (p Profile) Serves(c Profile) bool {
	return p.Tenant == c.Tenant && p.Version == c.Version &&
		(!p.Terminal || c.Terminal) && (!p.AuthTerminal || c.AuthTerminal) &&
		(!p.ElicitForm || c.ElicitForm) && (!p.ElicitURL || c.ElicitURL) &&
		(!p.ConfigBool || c.ConfigBool) && (!p.Subagents || c.Subagents)
}

// Intersect keeps only the capabilities both profiles have.
func (p Profile) Intersect(q Profile) Profile {
	return Profile{
		Tenant:       p.Tenant,
		Version:      p.Version,
		FsRead:       p.FsRead && q.FsRead,
		FsWrite:      p.FsWrite && q.FsWrite,
		Terminal:     p.Terminal && q.Terminal,
		AuthTerminal: p.AuthTerminal && q.AuthTerminal,
		ElicitForm:   p.ElicitForm && q.ElicitForm,
		ElicitURL:    p.ElicitURL && q.ElicitURL,
		ConfigBool:   p.ConfigBool && q.ConfigBool,
		Subagents:    p.Subagents && q.Subagents,
	}
}

// AllCapabilities is a profile with every client capability.
var AllCapabilities = Profile{Version: 1, FsRead: true, FsWrite: true, Terminal: true, AuthTerminal: true, ElicitForm: true, ElicitURL: true, ConfigBool: true, Subagents: true}

// initializeParams is what the pool sends an agent: the profile in the v1
// shape, and for v2 also in the v2 shape (an agent that answers v1 to a v2
// request still finds its capabilities).
func initializeParams(p Profile, name, version string) []byte {
	elicitation := map[string]any{}
	if p.ElicitForm {
		elicitation["form"] = struct{}{}
	}
	if p.ElicitURL {
		elicitation["url"] = struct{}{}
	}
	v1 := map[string]any{
		"fs":       map[string]bool{"readTextFile": p.FsRead, "writeTextFile": p.FsWrite},
		"terminal": p.Terminal,
	}
	if p.AuthTerminal {
		v1["auth"] = map[string]bool{"terminal": true}
	}
	if len(elicitation) > 0 {
		v1["elicitation"] = elicitation
	}
	if p.Subagents {
		v1["subagents"] = struct{}{}
	}
	if p.ConfigBool {
		v1["session"] = map[string]any{"configOptions": map[string]any{"boolean": struct{}{}}}
	}
	info := map[string]string{"name": name, "title": name, "version": version}
	params := map[string]any{
		"protocolVersion":    p.Version,
		"clientCapabilities": v1,
		"clientInfo":         info,
	}
	if p.Version >= 2 {
		v2 := map[string]any{}
		if p.AuthTerminal {
			v2["auth"] = map[string]any{"terminal": struct{}{}}
		}
		if len(elicitation) > 0 {
			v2["elicitation"] = elicitation
		}
		params["capabilities"] = v2
		params["info"] = info
	}
	b, err := json.Marshal(params)
	if err != nil {
		panic(err) // only maps of plain values
	}
	return b
}

// Init is what the pool keeps of an agent's initialize answer.
type Init struct {
	Result  []byte // the raw result, as the agent sent it
	Version int
	Caps    policy.AgentCaps // what the agent advertised, for the policy
}

// initialize sends the pool's one initialize, telling the process told,
// and waits for the answer.
func (a *Process) initialize(ctx context.Context, cfg *Config, told Profile) error {
	resp, err := a.call(ctx, "initialize", initializeParams(told, cfg.ClientName, cfg.ClientVersion))
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp, &env); err != nil {
		return fmt.Errorf("initialize: undecodable answer: %w", err)
	}
	if env.Error != nil {
		return fmt.Errorf("initialize: the agent answered error %d: %s", env.Error.Code, env.Error.Message)
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(env.Result, &res); err != nil || res == nil {
		return errors.New("initialize: the agent's result is not an object")
	}
	var version int
	if err := json.Unmarshal(res["protocolVersion"], &version); err != nil {
		return errors.New("initialize: the agent's result has no integer protocolVersion")
	}
	a.init = Init{Result: env.Result, Version: version, Caps: policy.ParseAgentCaps(env.Result)}
	return nil
}
