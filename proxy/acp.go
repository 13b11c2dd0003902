package proxy

import "github.com/acpgate/acpgate/proxy/jsonrpc"

// ACP method names the gateway acts on (PROTOCOL.md §3).
const (
	mInitialize       = "initialize"
	mAuthenticate     = "authenticate"
	mLogout           = "logout"
	mSessionNew       = "session/new"
	mSessionLoad      = "session/load"
	mSessionResume    = "session/resume"
	mSessionList      = "session/list"
	mSessionDelete    = "session/delete"
	mSessionClose     = "session/close"
	mSessionFork      = "session/fork"
	mSessionPrompt    = "session/prompt"
	mSessionCancel    = "session/cancel"
	mSessionUpdate    = "session/update"
	mRequestPerm      = "session/request_permission"
	mCancelRequest    = "$/cancel_request"
	mElicitCreate     = "elicitation/create"
	mNesStart         = "nes/start"
	mSessionSetMode   = "session/set_mode"
	mSessionSetConfig = "session/set_config_option"
	mFsRead           = "fs/read_text_file"
	mFsWrite          = "fs/write_text_file"
)

// knownMethods interns every method name in the v1 and v2 schemas (stable
// and unstable) so that scanning them allocates nothing.
var knownMethods = func() map[string]string {
	names := []string{
		mInitialize, mAuthenticate, mLogout, mSessionNew, mSessionLoad, mSessionResume,
		mSessionList, mSessionDelete, mSessionClose, mSessionFork, mSessionPrompt,
		mSessionCancel, mSessionUpdate, mRequestPerm, mCancelRequest, mElicitCreate,
		"elicitation/complete", mSessionSetMode, mSessionSetConfig, mFsRead, mFsWrite,
		"terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill",
		"terminal/release", "auth/login", "auth/logout", "auth/status", "auth/status_update",
		"tool_call/cancel", "terminal/cancel", "providers/list", "providers/set",
		"providers/disable", "mcp/connect", "mcp/message", "mcp/disconnect", mNesStart,
		"nes/suggest", "nes/accept", "nes/reject", "nes/close", "document/didOpen",
		"document/didChange", "document/didClose", "document/didSave", "document/didFocus",
		"session/archive", "session/unarchive", "session/status", "session/set_title",
		"proxy/initialize", "proxy/successor",
	}
	m := make(map[string]string, len(names))
	for _, n := range names {
		m[n] = n
	}
	return m
}()

var (
	leafSession = &jsonrpc.Spec{Kind: jsonrpc.FieldSessionID}
	leafReqID   = &jsonrpc.Spec{Kind: jsonrpc.FieldRequestID}

	// specSessionParam locates params.sessionId, which every session-scoped
	// method carries (PROTOCOL.md §4), in both directions. Extension methods
	// get it too: a client only ever knows the gateway's session IDs.
	specSessionParam = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession}}
	// specCancelRequest: $/cancel_request.params.requestId is a JSON-RPC id.
	specCancelRequest = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"requestId": leafReqID}}
	// specElicitation: session-scoped (sessionId) or request-scoped (requestId).
	specElicitation = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession, "requestId": leafReqID}}
	// specResultSession: results that create a session carry its ID.
	specResultSession = specSessionParam
	// specResultList: session/list results; each entry is located whole so
	// that entries a connection may not see can be dropped.
	specResultList = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"sessions": {Elems: &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession}}},
	}}
	// specErrorData: v2 -32002 errors carry data.sessionId.
	specErrorData = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"data": {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession}},
	}}
)

// paramsSpec is the spec for the params of a request or notification, in
// either direction.
func paramsSpec(method string) *jsonrpc.Spec {
	switch method {
	case mCancelRequest:
		return specCancelRequest
	case mElicitCreate:
		return specElicitation
	}
	return specSessionParam
}

// resultSpec is the spec for an agent's answer to a client request.
func resultSpec(method string, isError bool) *jsonrpc.Spec {
	if isError {
		return specErrorData
	}
	switch method {
	case mSessionNew, mSessionFork, mNesStart:
		return specResultSession
	case mSessionList:
		return specResultList
	}
	return nil
}

// createsSession reports whether a successful result of method carries the
// ID of a session that the agent has just created.
func createsSession(method string) bool {
	return method == mSessionNew || method == mSessionFork || method == mNesStart
}

// attachesSession reports whether method takes a session the connection
// may not hold yet and makes it the connection's (load, resume).
func attachesSession(method string) bool {
	return method == mSessionLoad || method == mSessionResume
}
