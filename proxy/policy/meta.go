package policy

import (
	"strconv"
	"strings"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// MetaPolicy is which members of a client's _meta reach the agent: the
// top-level keys of params._meta of every request and notification a
// client sends, and of result._meta of its answers to the agent's
// requests. Every other member is removed before the agent sees the
// message (the message still goes). Agents read _meta as they like:
// claude-code-acp spreads _meta.claudeCode.options of session/new into the
// options of its SDK, which start programs, set the environment and load
// other sessions, so a key passes only when the operator allows it.
type MetaPolicy struct {
	// Allow lists key patterns, matched against each top-level key as a
	// whole: "*" matches any run of characters, "?" any one character;
	// every other character matches itself. traceparent, tracestate (the
	// W3C trace context) and acpgate (the gateway's own) always pass.
	// nil or empty: only those.
	Allow []string `yaml:"allow"`
}

// Allows reports whether a client's _meta member key reaches the agent.
func (m MetaPolicy) Allows(key []byte) bool {
	switch string(key) {
	case "traceparent", "tracestate", "acpgate": // pass whatever the list says
		return true
	}
	for _, pat := range m.Allow {
		if validateMetaPattern(pat) == nil && matchGlob(pat, string(key)) {
			return true
		}
	}
	return false
}

// Lets reports the patterns of the list that let key through (an
// operator's check that claudeCode stays out).
func (m MetaPolicy) Lets(key string) []string {
	var out []string
	for _, pat := range m.Allow {
		if validateMetaPattern(pat) == nil && matchGlob(pat, key) {
			out = append(out, pat)
		}
	}
	return out
}

// MetaWarning says why an allow-list is dangerous with the agents known to
// act on _meta ("" if it lets none of their keys through).
func (m MetaPolicy) MetaWarning() string {
	pats := m.Lets("claudeCode")
	if len(pats) == 0 {
		return ""
	}
	q := make([]string, len(pats))
	for i, p := range pats {
		q[i] = strconv.Quote(p)
	}
	return "meta.allow lets _meta.claudeCode through (" + strings.Join(q, ", ") + "): claude-code-acp and claude-agent-acp " +
		"spread _meta.claudeCode.options into their SDK options, so a client can run its own code in the agent with the " +
		"tenant's credentials (executableArgs), send them elsewhere (env), adopt another session (resume) and start MCP " +
		"servers past policy.mcp (mcpServers, extraArgs)"
}

func validateMetaPattern(pat string) error { return validatePattern(pat, "key") }

// MetaFilter removes what a policy does not allow from a client's _meta
// (MetaPolicy). One is kept per client reader: it reuses its buffers and
// is not safe for concurrent use.
type MetaFilter struct {
	w       jsonrpc.Members
	allow   MetaPolicy
	removed []string
}

// MetaResult is what Edits did to a message's _meta.
type MetaResult struct {
	// Removed are the names of the members removed, in order; valid until
	// the next call.
	Removed []string
	// Emptied: every member of _meta was removed, so an edit that adds one
	// must not add a comma after it.
	Emptied bool
}

// Edits appends to dst the splice edits that remove from m (scanned with
// acp.ClientSpec) the members of its params._meta, or of an answer's
// result._meta, that p does not allow. A message without _meta costs one
// look at its located fields. An error: _meta is not an object (null
// passes as it is) or not valid JSON; it wraps ErrInvalid, and nothing is
// appended.
func (f *MetaFilter) Edits(dst []jsonrpc.Edit, m *jsonrpc.Message, p MetaPolicy) ([]jsonrpc.Edit, MetaResult, error) {
	idx := acp.MetaIndex(m)
	if idx < 0 {
		return dst, MetaResult{}, nil
	}
	meta := m.Fields[idx]
	if string(m.Raw[meta.Start:meta.End]) == "null" {
		return dst, MetaResult{}, nil
	}
	f.allow, f.removed = p, f.removed[:0]
	out, removed, kept, err := f.w.Delete(dst, m.Raw, meta.Start, meta.End, f.drop)
	f.allow = MetaPolicy{}
	if err != nil {
		return dst, MetaResult{}, &Error{Kind: ErrInvalid, Msg: "_meta must be a JSON object (or null): " + err.Error()}
	}
	return out, MetaResult{Removed: f.removed, Emptied: removed > 0 && kept == 0}, nil
}

func (f *MetaFilter) drop(name []byte) bool {
	if f.allow.Allows(name) {
		return false
	}
	f.removed = append(f.removed, string(name))
	return true
}
