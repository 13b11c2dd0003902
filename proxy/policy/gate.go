package policy

import (
	"errors"
	"strconv"
	"strings"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// The kinds of refusal; every error from the gates wraps exactly one.
var (
	// ErrNotAllowed: the gateway's policy forbids it (whatever the agent
	// supports).
	ErrNotAllowed = errors.New("not allowed by the gateway policy")
	// ErrUnsupported: the policy allows it but the agent did not advertise it.
	ErrUnsupported = errors.New("not supported by the agent")
	// ErrInvalid: a parameter the gateway must inspect is malformed.
	ErrInvalid = errors.New("invalid parameter")
)

// Error is a refusal. Its message is meant for the peer that sent the
// refused message (the caller answers -32601 for methods, -32602 for
// parameters): it never repeats values such as commands, arguments,
// environment variables, URL queries or headers.
type Error struct {
	Kind error // ErrNotAllowed, ErrUnsupported or ErrInvalid
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// quoteClient quotes a peer-supplied string for an error message, cut to a
// reasonable length.
func quoteClient(s string) string { return logx.Quote(s, 80) }

func methodNotAllowed(method string) error {
	return &Error{Kind: ErrNotAllowed, Msg: "method " + quoteClient(method) + " is not allowed by the gateway policy"}
}

func methodUnsupported(method string) error {
	return &Error{Kind: ErrUnsupported, Msg: "method " + quoteClient(method) + " is not available: the agent does not support it"}
}

// gate checks the policy first, then the agent's advertisement.
func gate(method string, allowed, supported bool) error {
	if !allowed {
		return methodNotAllowed(method)
	}
	if !supported {
		return methodUnsupported(method)
	}
	return nil
}

// AllowClientMethod decides whether a request or notification a client
// sent may go to the agent, given what the agent advertised. nil means
// forward it; otherwise the caller answers a request with -32601 and the
// error's message (and drops a notification).
//
//   - Baseline, always allowed: session/new, session/prompt, session/cancel,
//     $/cancel_request, session/set_mode, session/set_config_option, and for
//     a v2 agent tool_call/cancel and terminal/cancel.
//   - session/load, resume, close, list, delete and fork need the policy key
//     and the agent's advertisement (fork is unstable).
//   - authenticate and logout (v1), auth/login and auth/logout (v2) need
//     p.AgentAuth and a non-empty authMethods (v1 logout: auth.logout).
//   - "_" extension methods need a p.Extensions match.
//   - The unstable surface (providers/*, nes/*, document/*, mcp/*, proxy/*,
//     session/archive|unarchive|status|set_title, auth/status) needs
//     p.Unstable, and the agent's marker where the protocol defines one.
//   - Anything else is refused, including initialize: the gateway answers
//     it from the filtered result and must never forward it to a shared
//     agent process.
//
// Refusals wrap ErrNotAllowed (policy) or ErrUnsupported (agent).
func (p Policy) AllowClientMethod(method string, caps AgentCaps) error {
	v1, v2 := caps.Shape == ShapeV1, caps.Shape.IsV2()
	switch method {
	case "session/new", "session/prompt", "session/cancel", "$/cancel_request",
		"session/set_mode", "session/set_config_option":
		return nil
	case "tool_call/cancel", "terminal/cancel": // v2 stable (newer schema)
		return gate(method, true, v2)
	case "session/load":
		return gate(method, p.Session.Load, caps.Load)
	case "session/resume":
		return gate(method, p.Session.Resume, caps.Resume)
	case "session/close":
		return gate(method, p.Session.Close, caps.Close)
	case "session/list":
		return gate(method, p.Session.List, caps.List)
	case "session/delete":
		return gate(method, p.Session.Delete, caps.Delete)
	case "session/fork":
		return gate(method, p.Session.Fork && p.Unstable, caps.Fork)
	case "authenticate":
		return gate(method, p.AgentAuth, v1 && caps.AuthMethods > 0)
	case "logout":
		return gate(method, p.AgentAuth, v1 && caps.Logout)
	case "auth/login":
		return gate(method, p.AgentAuth, v2 && caps.AuthMethods > 0)
	case "auth/logout":
		return gate(method, p.AgentAuth, v2 && caps.Logout)
	case "auth/status":
		return gate(method, p.AgentAuth && p.Unstable, caps.AuthStatus)
	case "session/archive", "session/unarchive":
		return gate(method, p.Unstable, caps.Archive)
	case "session/status": // answered by the gateway itself, whatever the agent supports
		return gate(method, p.Unstable, true)
	case "session/set_title":
		return gate(method, p.Unstable, caps.Title)
	case "initialize":
		return &Error{Kind: ErrNotAllowed, Msg: `"initialize" is answered by the gateway and never forwarded to the agent`}
	}
	switch {
	case strings.HasPrefix(method, "_"):
		return gate(method, matchExtension(p.Extensions, method), true)
	case strings.HasPrefix(method, "providers/"):
		return gate(method, p.Unstable, caps.Providers)
	case strings.HasPrefix(method, "nes/"), strings.HasPrefix(method, "document/"),
		strings.HasPrefix(method, "mcp/"), strings.HasPrefix(method, "proxy/"):
		return gate(method, p.Unstable, true)
	}
	return methodNotAllowed(method)
}

// AllowAgentMethod decides whether a request or notification the agent sent
// may go to the client. nil means forward it; otherwise the caller answers
// the agent's request with -32601 and the error's message.
//
//   - Always: session/update, session/request_permission, elicitation/*,
//     $/cancel_request.
//   - fs/read_text_file needs p.Client.FsRead, fs/write_text_file
//     p.Client.FsWrite, terminal/* p.Client.Terminal.
//   - "_" extension methods need a p.Extensions match.
//   - Unstable: mcp/* and proxy/* need p.Unstable; auth/status_update needs
//     p.Unstable and p.AgentAuth.
//   - Anything else is refused.
func (p Policy) AllowAgentMethod(method string) error {
	switch method {
	case "session/update", "session/request_permission", "$/cancel_request":
		return nil
	case "fs/read_text_file":
		return gate(method, p.Client.FsRead, true)
	case "fs/write_text_file":
		return gate(method, p.Client.FsWrite, true)
	case "auth/status_update":
		return gate(method, p.Unstable && p.AgentAuth, true)
	}
	switch {
	case strings.HasPrefix(method, "elicitation/"):
		return nil
	case strings.HasPrefix(method, "terminal/"):
		return gate(method, p.Client.Terminal, true)
	case strings.HasPrefix(method, "_"):
		return gate(method, matchExtension(p.Extensions, method), true)
	case strings.HasPrefix(method, "mcp/"), strings.HasPrefix(method, "proxy/"):
		return gate(method, p.Unstable, true)
	}
	return methodNotAllowed(method)
}

// CheckPromptBlock decides whether content block index of a session/prompt
// may have type blockType: text and resource_link are baseline; image,
// audio and resource (embedded context) need the policy and the agent's
// prompt capability; any other type is refused.
func (p Policy) CheckPromptBlock(index int, blockType string, caps AgentCaps) error {
	var allowed, supported bool
	var what string
	switch blockType {
	case "text", "resource_link":
		return nil
	case "image":
		allowed, supported, what = p.Prompt.Image, caps.PromptImage, "image content"
	case "audio":
		allowed, supported, what = p.Prompt.Audio, caps.PromptAudio, "audio content"
	case "resource":
		allowed, supported, what = p.Prompt.EmbeddedContext, caps.PromptEmbeddedContext, "embedded context (resource content)"
	default:
		return &Error{Kind: ErrNotAllowed, Msg: "prompt[" + strconv.Itoa(index) + "]: content type " + quoteClient(blockType) + " is not allowed by the gateway policy"}
	}
	at := "prompt[" + strconv.Itoa(index) + "]: "
	if !allowed {
		return &Error{Kind: ErrNotAllowed, Msg: at + what + " is not allowed by the gateway policy"}
	}
	if !supported {
		return &Error{Kind: ErrUnsupported, Msg: at + "the agent does not support " + what}
	}
	return nil
}

// CheckAdditionalDirectories decides whether a session method may carry a
// non-empty additionalDirectories (the caller checks emptiness: omitted and
// [] need no capability).
func (p Policy) CheckAdditionalDirectories(caps AgentCaps) error {
	if !p.Session.AdditionalDirectories {
		return &Error{Kind: ErrNotAllowed, Msg: "additionalDirectories is not allowed by the gateway policy"}
	}
	if !caps.AdditionalDirectories {
		return &Error{Kind: ErrUnsupported, Msg: "additionalDirectories is not available: the agent does not support it"}
	}
	return nil
}

// Refusal is why the policy refuses a client message: the JSON-RPC error
// code, the reason it is counted under, and the error the client is told.
type Refusal struct {
	Code   int
	Reason string
	Err    error
}

// CheckClient applies the policy to a client message the relay scanned
// with acp.ClientSpec: a method that is off (or that the agent never
// advertised) is refused with -32601; a disallowed MCP server, prompt
// content type or additionalDirectories with -32602. nil: it passes.
func (p Policy) CheckClient(m *jsonrpc.Message, caps AgentCaps) *Refusal {
	if err := p.AllowClientMethod(m.Method, caps); err != nil {
		return &Refusal{jsonrpc.CodeMethodNotFound, "method", err}
	}
	blocks, servers := 0, 0
	for _, f := range m.Fields {
		var err error
		var reason string
		switch {
		case f.Kind == jsonrpc.FieldElement && f.Label == "mcpServers[]":
			err, reason = p.CheckMCPServer(servers, m.Bytes(f), caps), "mcp_server"
			servers++
		case f.Kind == jsonrpc.FieldTag && f.Label == "prompt[].type":
			typ, _ := m.String(f)
			err, reason = p.CheckPromptBlock(blocks, typ, caps), "prompt_content"
			blocks++
		case f.Kind == jsonrpc.FieldPath && f.Label == "additionalDirectories[]":
			err, reason = p.CheckAdditionalDirectories(caps), "additional_directories"
		}
		if err != nil {
			return &Refusal{jsonrpc.CodeInvalidParams, reason, err}
		}
	}
	return nil
}
