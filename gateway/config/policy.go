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
	Session struct {
		Load                  *bool `yaml:"load"`
		Resume                *bool `yaml:"resume"`
		Close                 *bool `yaml:"close"`
		List                  *bool `yaml:"list"`
		Delete                *bool `yaml:"delete"`
		Fork                  *bool `yaml:"fork"`
		AdditionalDirectories *bool `yaml:"additional_directories"`
	} `yaml:"session"`
	MCP struct {
		Stdio     *bool     `yaml:"stdio"`
		HTTP      *bool     `yaml:"http"`
		SSE       *bool     `yaml:"sse"`
		HTTPHosts *[]string `yaml:"http_hosts"`
	} `yaml:"mcp"`
	Prompt struct {
		Image           *bool `yaml:"image"`
		Audio           *bool `yaml:"audio"`
		EmbeddedContext *bool `yaml:"embedded_context"`
	} `yaml:"prompt"`
	Client struct {
		FsRead   *bool `yaml:"fs_read"`
		FsWrite  *bool `yaml:"fs_write"`
		Terminal *bool `yaml:"terminal"`
	} `yaml:"client"`
	AgentAuth  *bool `yaml:"agent_auth"`
	Extensions struct {
		Allow *[]string `yaml:"allow"`
	} `yaml:"extensions"`
	Unstable *bool `yaml:"unstable"`
	Models   struct {
		// Allow: nil keeps the layer below's list; [] allows no model.
		Allow *[]string `yaml:"allow"`
	} `yaml:"models"`
	Modes struct {
		// Allow: nil keeps the layer below's list; [] allows no mode.
		Allow *[]string `yaml:"allow"`
	} `yaml:"modes"`
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
