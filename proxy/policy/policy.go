// Package policy decides what remote clients may do with an ACP agent behind
// the gateway, and what the agent may ask of them.
//
// An operator writes a [Policy] (secure defaults in [Default]). The gateway
// uses it at five points:
//
//   - [FilterInitialize] turns the agent's initialize result into the one a
//     client receives: the agent's capabilities intersected with the policy,
//     edited in place in the shape the agent used (ACP v1, the v2 draft pages'
//     shape, or the later v2 schema shape; see [Shape]).
//   - [Policy.AllowClientMethod] and [Policy.AllowAgentMethod] gate every
//     request and notification by method name, in each direction.
//   - [Policy.CheckMCPServer], [Policy.CheckPromptBlock] and
//     [Policy.CheckAdditionalDirectories] gate the parameters that a
//     capability flag alone cannot (v1 has no flag for stdio MCP servers).
//   - [Policy.ClientCaps] says which client capabilities an agent may be told
//     about (fs and terminal: what the agent may ask of clients).
//   - [MetaFilter] cuts the members of a client's _meta that [MetaPolicy]
//     does not allow out of each message a client sends the agent.
//
// Advertising is not enforcing: a client can send a method or parameter the
// filtered initialize result did not offer, so the gateway must call the
// gates too. Every refusal is an error whose message can be shown to the
// client as is; errors.Is tells a policy refusal ([ErrNotAllowed]) from a
// capability the agent lacks ([ErrUnsupported]) and from a malformed
// parameter ([ErrInvalid]).
package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Policy is what remote clients may do with the agent. The zero value allows
// only the baseline (session/new, session/prompt, session/cancel, text and
// resource links in prompts); [Default] is the recommended starting point.
type Policy struct {
	Session SessionPolicy `yaml:"session"`
	MCP     MCPPolicy     `yaml:"mcp"`
	Prompt  PromptPolicy  `yaml:"prompt"`
	Client  ClientPolicy  `yaml:"client"`

	// AgentAuth forwards the agent's authentication surface: authMethods in
	// the initialize result, authenticate/logout (v1) and auth/login,
	// auth/logout (v2). Off, clients see "authMethods": [] and cannot log the
	// shared agent process in or out; the operator authenticates the agent
	// out of band (environment, credentials file).
	AgentAuth bool `yaml:"agent_auth"`

	// Extensions lists the "_"-prefixed extension methods allowed in either
	// direction. A pattern ending in "*" matches every method with that
	// prefix ("_zed.dev/*"); any other pattern matches one method exactly.
	Extensions []string `yaml:"extensions"`

	// Unstable allows the protocol's unstable surface: providers/*, nes/*,
	// document/*, mcp/*, proxy/*, session/archive|unarchive|status|set_title,
	// session/fork (with Session.Fork), auth/status and auth/status_update
	// (with AgentAuth), MCP servers of type "acp", and the matching unstable
	// capability keys. Off, those keys are removed from the initialize result.
	Unstable bool `yaml:"unstable"`

	// Models is the model allow-list: which models the tenant's sessions
	// may run on (see [ModelPolicy]).
	Models ModelPolicy `yaml:"models"`
	// Modes is the mode allow-list, applied as Models is: which session
	// modes (ACP's modes and config options of category "mode") the
	// tenant's sessions may run in.
	Modes ModelPolicy `yaml:"modes"`

	// Meta is which members of a client's _meta reach the agent (see
	// [MetaPolicy]): by default only the trace context and acpgate.
	Meta MetaPolicy `yaml:"meta"`
}

// SessionPolicy gates the session methods beyond the baseline.
type SessionPolicy struct {
	Load   bool `yaml:"load"`   // session/load
	Resume bool `yaml:"resume"` // session/resume
	Close  bool `yaml:"close"`  // session/close
	List   bool `yaml:"list"`   // session/list
	Delete bool `yaml:"delete"` // session/delete
	Fork   bool `yaml:"fork"`   // session/fork (unstable: also needs Policy.Unstable)
	// AdditionalDirectories allows a non-empty additionalDirectories on
	// session/new, load, resume and fork.
	AdditionalDirectories bool `yaml:"additional_directories"`
}

// MCPPolicy gates the mcpServers[] entries clients may pass to the agent.
type MCPPolicy struct {
	Stdio bool `yaml:"stdio"` // the agent spawns a client-chosen command on its host
	HTTP  bool `yaml:"http"`
	SSE   bool `yaml:"sse"` // v1 only; v2 removed the transport
	// HTTPHosts lists the hosts http and sse servers may be on: exact host
	// names or IP literals, or "*.example.com" for any subdomain of
	// example.com at any depth (not example.com itself). Empty means any
	// host. Ports are not part of the match (see [MatchHost]).
	HTTPHosts []string `yaml:"http_hosts"`
}

// PromptPolicy gates session/prompt content beyond text and resource_link.
type PromptPolicy struct {
	Image           bool `yaml:"image"`
	Audio           bool `yaml:"audio"`
	EmbeddedContext bool `yaml:"embedded_context"` // "resource" content blocks
}

// ClientPolicy is what agents may ask of clients (ACP v1; v2 removed fs and
// terminal from the client).
type ClientPolicy struct {
	FsRead   bool `yaml:"fs_read"`  // fs/read_text_file
	FsWrite  bool `yaml:"fs_write"` // fs/write_text_file
	Terminal bool `yaml:"terminal"` // terminal/*
}

// Default is the recommended policy: the session lifecycle without delete
// and fork, HTTP MCP servers on any host but no stdio or SSE ones, image and
// embedded-context prompts, client file access but no client terminal, no
// agent authentication, extensions or unstable methods.
func Default() Policy {
	return Policy{
		Session: SessionPolicy{Load: true, Resume: true, Close: true, List: true, AdditionalDirectories: true},
		MCP:     MCPPolicy{HTTP: true},
		Prompt:  PromptPolicy{Image: true, EmbeddedContext: true},
		Client:  ClientPolicy{FsRead: true, FsWrite: true},
	}
}

// ClientCaps reports which client capabilities agents may be told about, so
// that the caller masks clientCapabilities.fs.readTextFile, .writeTextFile
// and .terminal in the initialize params it sends to the agent.
func (p Policy) ClientCaps() (fsRead, fsWrite, terminal bool) {
	return p.Client.FsRead, p.Client.FsWrite, p.Client.Terminal
}

// Validate reports every malformed entry of HTTPHosts, Extensions,
// Models.Allow, Modes.Allow and Meta.Allow.
// The gates never match a malformed pattern, so an unvalidated policy fails
// closed; Validate tells the operator why.
func (p Policy) Validate() error {
	var errs []error
	for _, h := range p.MCP.HTTPHosts {
		if err := ValidateHostPattern(h); err != nil {
			errs = append(errs, fmt.Errorf("mcp.http_hosts: %w", err))
		}
	}
	for _, e := range p.Extensions {
		if err := validateExtensionPattern(e); err != nil {
			errs = append(errs, fmt.Errorf("extensions: %w", err))
		}
	}
	for _, m := range p.Models.Allow {
		if err := validateModelPattern(m); err != nil {
			errs = append(errs, fmt.Errorf("models.allow: %w", err))
		}
	}
	for _, m := range p.Modes.Allow {
		if err := validateModelPattern(m); err != nil {
			errs = append(errs, fmt.Errorf("modes.allow: %w", err))
		}
	}
	for _, m := range p.Meta.Allow {
		if err := validateMetaPattern(m); err != nil {
			errs = append(errs, fmt.Errorf("meta.allow: %w", err))
		}
	}
	return errors.Join(errs...)
}

func validateExtensionPattern(pat string) error {
	if !strings.HasPrefix(pat, "_") {
		return fmt.Errorf("%q: extension methods start with \"_\" (e.g. \"_zed.dev/*\")", pat)
	}
	if i := strings.IndexByte(pat, '*'); i >= 0 && i != len(pat)-1 {
		return fmt.Errorf("%q: \"*\" is only allowed at the end", pat)
	}
	for _, r := range pat {
		if r < 0x21 || r == 0x7f {
			return fmt.Errorf("%q: spaces and control characters are not allowed", pat)
		}
	}
	return nil
}

// matchExtension reports whether method matches one of patterns: "x*"
// matches every method starting with "x", anything else only itself.
func matchExtension(patterns []string, method string) bool {
	for _, pat := range patterns {
		if !strings.HasPrefix(pat, "_") {
			continue // malformed (see Validate): never matches
		}
		if prefix, ok := strings.CutSuffix(pat, "*"); ok {
			if strings.HasPrefix(method, prefix) && !strings.Contains(prefix, "*") {
				return true
			}
		} else if pat == method {
			return true
		}
	}
	return false
}

// String is [Policy.Describe].
func (p Policy) String() string { return p.Describe() }

// Describe renders the policy for people (acpgate check-config): one key per
// line, YAML-like, every key present, in a fixed order, with the key names
// of the configuration file.
func (p Policy) Describe() string {
	var b strings.Builder
	kv := func(indent, key string, v bool) {
		b.WriteString(indent + key + ": " + strconv.FormatBool(v) + "\n")
	}
	list := func(indent, key string, vals []string, empty string) {
		if len(vals) == 0 {
			b.WriteString(indent + key + ": " + empty + "\n")
			return
		}
		b.WriteString(indent + key + ":\n")
		for _, v := range vals {
			b.WriteString(indent + "  - " + strconv.Quote(v) + "\n")
		}
	}
	b.WriteString("session:\n")
	kv("  ", "load", p.Session.Load)
	kv("  ", "resume", p.Session.Resume)
	kv("  ", "close", p.Session.Close)
	kv("  ", "list", p.Session.List)
	kv("  ", "delete", p.Session.Delete)
	kv("  ", "fork", p.Session.Fork)
	kv("  ", "additional_directories", p.Session.AdditionalDirectories)
	b.WriteString("mcp:\n")
	kv("  ", "stdio", p.MCP.Stdio)
	kv("  ", "http", p.MCP.HTTP)
	kv("  ", "sse", p.MCP.SSE)
	list("  ", "http_hosts", p.MCP.HTTPHosts, "[]  # any host")
	b.WriteString("prompt:\n")
	kv("  ", "image", p.Prompt.Image)
	kv("  ", "audio", p.Prompt.Audio)
	kv("  ", "embedded_context", p.Prompt.EmbeddedContext)
	b.WriteString("client:\n")
	kv("  ", "fs_read", p.Client.FsRead)
	kv("  ", "fs_write", p.Client.FsWrite)
	kv("  ", "terminal", p.Client.Terminal)
	kv("", "agent_auth", p.AgentAuth)
	list("", "extensions", p.Extensions, "[]  # none")
	kv("", "unstable", p.Unstable)
	b.WriteString("models:\n")
	if p.Models.Allow == nil {
		b.WriteString("  allow: null  # every model\n")
	} else {
		list("  ", "allow", p.Models.Allow, "[]  # none")
	}
	b.WriteString("modes:\n")
	if p.Modes.Allow == nil {
		b.WriteString("  allow: null  # every mode\n")
	} else {
		list("  ", "allow", p.Modes.Allow, "[]  # none")
	}
	b.WriteString("meta:\n")
	list("  ", "allow", p.Meta.Allow, "[]  # only traceparent, tracestate, acpgate")
	return b.String()
}
