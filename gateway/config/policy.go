package config

import (
	"fmt"

	"github.com/acpgate/acpgate/proxy/policy"
)

// PolicyYAML is a `policy:` section, globally or in a tenant. Every key is
// optional: a tenant's policy is the global one with the tenant's keys
// laid over it, key by key, and the global one is the built-in secure
// defaults with its keys laid over them.
type PolicyYAML struct {
	// Session gates the session methods beyond the baseline: a method
	// that is off is hidden from the initialize result and refused
	// (-32601).
	Session struct {
		// Load is session/load.
		Load *bool `yaml:"load"`
		// Resume is session/resume.
		Resume *bool `yaml:"resume"`
		// Close is session/close.
		Close *bool `yaml:"close"`
		// List is session/list.
		List *bool `yaml:"list"`
		// Delete is session/delete.
		Delete *bool `yaml:"delete"`
		// Fork is session/fork (unstable: it needs unstable too).
		Fork *bool `yaml:"fork"`
		// AdditionalDirectories lets a request carry additionalDirectories
		// (off: -32602).
		AdditionalDirectories *bool `yaml:"additional_directories"`
	} `yaml:"session"`
	// MCP says which MCP servers a client may hand the agent in
	// mcpServers; another gets -32602 naming it.
	MCP struct {
		// Stdio allows servers over stdio, which run a command on the host.
		Stdio *bool `yaml:"stdio"`
		// HTTP allows servers over HTTP.
		HTTP *bool `yaml:"http"`
		// SSE allows servers over SSE.
		SSE *bool `yaml:"sse"`
		// HTTPHosts, when set, lists the hosts an http or sse server's URL
		// may name ("*.example.com" matches subdomains, not the apex).
		HTTPHosts *[]string `yaml:"http_hosts"`
	} `yaml:"mcp"`
	// Prompt says which content a prompt may carry besides text and
	// resource_link (always allowed); another block gets -32602.
	Prompt struct {
		// Image allows image blocks.
		Image *bool `yaml:"image"`
		// Audio allows audio blocks.
		Audio *bool `yaml:"audio"`
		// EmbeddedContext allows embedded resource blocks.
		EmbeddedContext *bool `yaml:"embedded_context"`
	} `yaml:"prompt"`
	// Client says what agents may ask of clients.
	Client struct {
		// FsRead and FsWrite tell agents of file access: the gateway serves
		// fs/read_text_file and fs/write_text_file from the tenant root for
		// a client that does not offer them.
		FsRead  *bool `yaml:"fs_read"`
		FsWrite *bool `yaml:"fs_write"`
		// Terminal tells agents of a client's terminal (off: agents run
		// commands themselves, and a terminal request gets -32601).
		Terminal *bool `yaml:"terminal"`
	} `yaml:"client"`
	// AgentAuth forwards the agent's authentication surface (authMethods,
	// authenticate, logout, auth/login, auth/logout); off, clients cannot
	// log the shared agent process in or out.
	AgentAuth *bool `yaml:"agent_auth"`
	// Extensions lists the "_"-prefixed extension methods allowed in
	// either direction ("_zed.dev/*" matches a prefix).
	Extensions struct {
		// Allow is the list of extension method patterns.
		Allow *[]string `yaml:"allow"`
	} `yaml:"extensions"`
	// Unstable allows the protocol's unstable methods and capability keys
	// (providers/*, nes/*, document/*, mcp/*, session/fork, ...).
	Unstable *bool `yaml:"unstable"`
	// Models is the model allow-list.
	Models struct {
		// Allow: nil keeps the layer below's list; [] allows no model.
		Allow *[]string `yaml:"allow"`
	} `yaml:"models"`
	// Modes is the mode allow-list, applied as Models is.
	Modes struct {
		// Allow: nil keeps the layer below's list; [] allows no mode.
		Allow *[]string `yaml:"allow"`
	} `yaml:"modes"`
	// Meta is which top-level keys of a client's _meta reach the agent.
	Meta struct {
		// Allow: nil keeps the layer below's list.
		Allow *[]string `yaml:"allow"`
	} `yaml:"meta"`
}

// apply lays the keys y sets over p.
func (y *PolicyYAML) apply(p policy.Policy) policy.Policy {
	set := func(dst *bool, src *bool) {
		if src != nil {
			*dst = *src
		}
	}
	set(&p.Session.Load, y.Session.Load)
	set(&p.Session.Resume, y.Session.Resume)
	set(&p.Session.Close, y.Session.Close)
	set(&p.Session.List, y.Session.List)
	set(&p.Session.Delete, y.Session.Delete)
	set(&p.Session.Fork, y.Session.Fork)
	set(&p.Session.AdditionalDirectories, y.Session.AdditionalDirectories)
	set(&p.MCP.Stdio, y.MCP.Stdio)
	set(&p.MCP.HTTP, y.MCP.HTTP)
	set(&p.MCP.SSE, y.MCP.SSE)
	if y.MCP.HTTPHosts != nil {
		p.MCP.HTTPHosts = append([]string(nil), (*y.MCP.HTTPHosts)...)
	}
	set(&p.Prompt.Image, y.Prompt.Image)
	set(&p.Prompt.Audio, y.Prompt.Audio)
	set(&p.Prompt.EmbeddedContext, y.Prompt.EmbeddedContext)
	set(&p.Client.FsRead, y.Client.FsRead)
	set(&p.Client.FsWrite, y.Client.FsWrite)
	set(&p.Client.Terminal, y.Client.Terminal)
	set(&p.AgentAuth, y.AgentAuth)
	if y.Extensions.Allow != nil {
		p.Extensions = append([]string(nil), (*y.Extensions.Allow)...)
	}
	set(&p.Unstable, y.Unstable)
	if y.Models.Allow != nil {
		p.Models.Allow = append([]string{}, (*y.Models.Allow)...) // [] stays a list: no model
	}
	if y.Modes.Allow != nil {
		p.Modes.Allow = append([]string{}, (*y.Modes.Allow)...) // [] stays a list: no mode
	}
	if y.Meta.Allow != nil {
		p.Meta.Allow = append([]string(nil), (*y.Meta.Allow)...)
	}
	return p
}

// GlobalPolicy is the built-in secure defaults with the file's policy
// section laid over them.
func (c *Config) GlobalPolicy() policy.Policy { return c.Policy.apply(policy.Default()) }

// TenantPolicy is the global policy with the tenant's keys laid over it.
func (c *Config) TenantPolicy(t *Tenant) policy.Policy { return t.Policy.apply(c.GlobalPolicy()) }

// AgentPolicy is the global policy with the named agent's keys laid over
// it (what clients without tenants get with that agent).
func (c *Config) AgentPolicy(agent string) policy.Policy {
	p := c.GlobalPolicy()
	if a := c.Agents[agent]; a != nil {
		p = a.Policy.apply(p)
	}
	return p
}

// TenantAgentPolicy is a tenant's policy with an agent: the global policy,
// the agent's keys over it, the tenant's keys over those. A tenant's own
// keys are the most specific and win.
func (c *Config) TenantAgentPolicy(t *Tenant, agent string) policy.Policy {
	return t.Policy.apply(c.AgentPolicy(agent))
}

// MetaWarnings says, for each policy clients get with an agent (every
// agent without tenants; every tenant with each agent it may use), when
// its meta.allow lets through a _meta key an agent is known to act on
// dangerously (claudeCode; see policy.MetaPolicy.MetaWarning).
// check-config prints them and serve logs them.
func (c *Config) MetaWarnings() []string {
	var out []string
	for _, a := range c.AgentList() {
		if len(c.Tenants) == 0 {
			if w := c.AgentPolicy(a.Name).Meta.MetaWarning(); w != "" {
				out = append(out, fmt.Sprintf("agent %q: policy.%s", a.Name, w))
			}
			continue
		}
		for i := range c.Tenants {
			t := &c.Tenants[i]
			if !t.MayUse(a.Name) {
				continue
			}
			if w := c.TenantAgentPolicy(t, a.Name).Meta.MetaWarning(); w != "" {
				out = append(out, fmt.Sprintf("tenant %q with agent %q: policy.%s", t.Name, a.Name, w))
			}
		}
	}
	return out
}
