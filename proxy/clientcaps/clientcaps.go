// Package clientcaps reads what an ACP client offers in its initialize
// params (its protocol version and client capabilities) into the profile
// the agent pool goes by (pool.Profile).
package clientcaps

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/acpgate/acpgate/proxy/pool"
)

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

// Parse reads the capabilities a client offers in its initialize
// params, in the v1 shape (clientCapabilities) or the v2 one (capabilities).
func Parse(params []byte) (pool.Profile, error) {
	var o obj
	if len(params) == 0 || json.Unmarshal(params, &o) != nil {
		return pool.Profile{}, errors.New("params must be an object")
	}
	var version int
	if err := json.Unmarshal(o["protocolVersion"], &version); err != nil || version < 0 || version > 65535 {
		return pool.Profile{}, errors.New("protocolVersion must be an integer from 0 to 65535")
	}
	p := pool.Profile{Version: 1}
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
		p.Subagents = v1.flag("subagents")
	}
	if v2 := o.get("capabilities"); v2 != nil {
		p.AuthTerminal = p.AuthTerminal || v2.get("auth").flag("terminal")
		el := v2.get("elicitation")
		p.ElicitForm = p.ElicitForm || el.flag("form")
		p.ElicitURL = p.ElicitURL || el.flag("url")
	}
	return p, nil
}
