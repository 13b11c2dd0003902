package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/acpgate/acpgate/proxy/policy"
)

// Profile is what a pooled agent is told about its clients in initialize:
// the protocol version asked for and the client capabilities that gate
// agent→client requests (PROTOCOL.md §6: the agent may only call what the
// client advertised).
//
// File access is not part of what decides which process serves a client:
// every process is told fs read and write as far as any tenant's policy
// allows, and the gateway answers fs/* itself for a client that did not
// offer them (see fsstandin.go). The rest of a profile (its kind) does:
// terminal (the agent would run commands itself without it) and the draft
// capabilities the gateway cannot stand in for.
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
}

// kind is the part of p that decides which processes may serve it: p
// without its file access.
func (p Profile) kind() Profile {
	p.FsRead, p.FsWrite = false, false
	return p
}

// serves reports whether a process told p may serve a client whose own
// profile is c: same tenant and protocol version, and the process was told
// nothing beyond file access that the client lacks (the agent may ask for
// whatever it was told; file access the gateway stands in for).
func (p Profile) serves(c Profile) bool {
	return p.Tenant == c.Tenant && p.Version == c.Version &&
		(!p.Terminal || c.Terminal) && (!p.AuthTerminal || c.AuthTerminal) &&
		(!p.ElicitForm || c.ElicitForm) && (!p.ElicitURL || c.ElicitURL) &&
		(!p.ConfigBool || c.ConfigBool)
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
	}
}

// AllCapabilities is a profile with every client capability.
var AllCapabilities = Profile{Version: 1, FsRead: true, FsWrite: true, Terminal: true, AuthTerminal: true, ElicitForm: true, ElicitURL: true, ConfigBool: true}

// obj is a loosely decoded JSON object: capability fields fall back to
// "unsupported" when malformed (x-deserialize-default-on-error), so the
// gateway reads them leniently.
type obj map[string]json.RawMessage

func (o obj) get(key string) obj {
	var sub obj
	if raw, ok := o[key]; ok && len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, &sub)
	}
	return sub
}

// flag is true for a v1 boolean true or a v1/v2 object marker ({} = supported).
func (o obj) flag(key string) bool {
	raw := bytes.TrimSpace(o[key])
	return string(raw) == "true" || (len(raw) > 0 && raw[0] == '{')
}

// clientProfile reads the capabilities a client offers in its initialize
// params, in the v1 shape (clientCapabilities) or the v2 one (capabilities).
func clientProfile(params []byte) (Profile, error) {
	var o obj
	if len(params) == 0 || json.Unmarshal(params, &o) != nil {
		return Profile{}, errors.New("params must be an object")
	}
	var version int
	if err := json.Unmarshal(o["protocolVersion"], &version); err != nil || version < 0 || version > 65535 {
		return Profile{}, errors.New("protocolVersion must be an integer from 0 to 65535")
	}
	p := Profile{Version: 1}
	if version >= 2 {
		p.Version = 2
	}
	if v1 := o.get("clientCapabilities"); v1 != nil {
		fs := v1.get("fs")
		p.FsRead = fs.flag("readTextFile")
		p.FsWrite = fs.flag("writeTextFile")
		p.Terminal = v1.flag("terminal")
		p.AuthTerminal = v1.get("auth").flag("terminal")
		el := v1.get("elicitation")
		p.ElicitForm, p.ElicitURL = el.flag("form"), el.flag("url")
		p.ConfigBool = v1.get("session").get("configOptions").flag("boolean")
	}
	if v2 := o.get("capabilities"); v2 != nil {
		p.AuthTerminal = p.AuthTerminal || v2.get("auth").flag("terminal")
		el := v2.get("elicitation")
		p.ElicitForm = p.ElicitForm || el.flag("form")
		p.ElicitURL = p.ElicitURL || el.flag("url")
	}
	return p, nil
}

// initializeParams is what the gateway sends an agent: the profile in the
// v1 shape, and for v2 also in the v2 shape (an agent that answers v1 to a
// v2 request still finds its capabilities).
func initializeParams(p Profile, name, version string) []byte {
	marker := func(on bool) any {
		if on {
			return struct{}{}
		}
		return nil
	}
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
			v2["auth"] = map[string]any{"terminal": marker(true)}
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

// agentInit is what the gateway keeps of an agent's initialize answer.
type agentInit struct {
	result  []byte // the raw result, as the agent sent it
	version int
	caps    policy.AgentCaps // what the agent advertised, for the policy
}

// initialize sends the gateway's one initialize to a fresh process.
func (a *agentProc) initialize(ctx context.Context, cfg *PoolConfig) error {
	resp, err := a.call(ctx, mInitialize, initializeParams(a.prof, cfg.ClientName, cfg.ClientVersion))
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
	var res obj
	if err := json.Unmarshal(env.Result, &res); err != nil || res == nil {
		return errors.New("initialize: the agent's result is not an object")
	}
	var version int
	if err := json.Unmarshal(res["protocolVersion"], &version); err != nil {
		return errors.New("initialize: the agent's result has no integer protocolVersion")
	}
	a.init = agentInit{result: env.Result, version: version, caps: policy.ParseAgentCaps(env.Result)}
	return nil
}
