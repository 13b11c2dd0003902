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
		"proxy/initialize", "proxy/successor", mSessionAttach, mSessionDetach, "session/set_model",
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
	// specUpdate: session/update, with the update's kind (metering).
	specUpdate = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"sessionId": leafSession,
		"update":    {Fields: map[string]*jsonrpc.Spec{"sessionUpdate": updateKind}},
	}}
	updateKind = &jsonrpc.Spec{Kind: jsonrpc.FieldTag, Label: labelUpdateKind}
	// specPromptResult: a PromptResponse's stopReason and usage (metering).
	specPromptResult = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"stopReason": {Kind: jsonrpc.FieldTag, Label: labelStopReason},
		"usage":      {Kind: jsonrpc.FieldTag, Label: labelUsage},
	}}
	// specErrorData: v2 -32002 errors carry data.sessionId.
	specErrorData = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"data": {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession}},
	}}
)

// paramsSpec is the spec for the params of a request or notification, in
// either direction. With paths, it also locates every path and file URI
// field (PROTOCOL.md §5) for tenant root mapping, and what the policy
// inspects (mcpServers entries, prompt block types). Client messages are
// always scanned with paths; agent output only when a tenant maps paths.
func paramsSpec(method string, paths bool) *jsonrpc.Spec {
	switch method {
	case mCancelRequest:
		return specCancelRequest
	case mElicitCreate:
		return specElicitation
	}
	if paths {
		if s := pathParams[method]; s != nil {
			return s
		}
	}
	if method == mSessionUpdate {
		return specUpdate
	}
	return specSessionParam
}

// resultSpec is the spec for an agent's answer to a client request.
func resultSpec(method string, isError, paths bool) *jsonrpc.Spec {
	if isError {
		return specErrorData
	}
	switch method {
	case mSessionNew, mSessionFork, mNesStart:
		return specResultSession
	case mSessionPrompt:
		return specPromptResult
	case mSessionList:
		if paths {
			return specResultListPaths
		}
		return specResultList
	}
	return nil
}

func pathField(label string) *jsonrpc.Spec {
	return &jsonrpc.Spec{Kind: jsonrpc.FieldPath, Label: label}
}

func uriField(label string) *jsonrpc.Spec {
	return &jsonrpc.Spec{Kind: jsonrpc.FieldURI, Label: label}
}

func pathList(label string) *jsonrpc.Spec {
	return &jsonrpc.Spec{Elems: pathField(label)}
}

type fields = map[string]*jsonrpc.Spec

var (
	// blockSpec: a ContentBlock (resource_link/image uri, embedded resource uri).
	blockSpec = &jsonrpc.Spec{Fields: fields{
		"uri":      uriField("uri"),
		"resource": {Fields: fields{"uri": uriField("resource.uri")}},
	}}
	// contentSpec: a content block, a tool call content item (v1 diff path,
	// v2 diff changes[].path/oldPath, nested content block), or a list of
	// them: the same names are located wherever the shapes put them.
	contentSpec = func() *jsonrpc.Spec {
		s := &jsonrpc.Spec{Fields: fields{
			"uri":      uriField("content.uri"),
			"resource": {Fields: fields{"uri": uriField("content.resource.uri")}},
			"path":     pathField("content.path"),
			"oldPath":  pathField("content.oldPath"),
			"changes": {Elems: &jsonrpc.Spec{Fields: fields{
				"path":    pathField("content.changes[].path"),
				"oldPath": pathField("content.changes[].oldPath"),
			}}},
			"content": blockSpec,
		}}
		s.Elems = s
		return s
	}()
	locationsSpec = &jsonrpc.Spec{Elems: &jsonrpc.Spec{Fields: fields{"path": pathField("locations[].path")}}}
	toolCallSpec  = &jsonrpc.Spec{Fields: fields{"locations": locationsSpec, "content": contentSpec}}

	sessionSetup = &jsonrpc.Spec{Fields: fields{
		"sessionId":             leafSession,
		"cwd":                   pathField("cwd"),
		"additionalDirectories": pathList("additionalDirectories[]"),
		"systemPrompt":          {Fields: fields{"content": contentSpec}},
		"mcpServers":            {Elems: &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Label: "mcpServers[]"}},
	}}
	// promptBlock: a prompt content block, with its type for the policy.
	promptBlock = &jsonrpc.Spec{Fields: fields{
		"type":     {Kind: jsonrpc.FieldTag, Label: "prompt[].type"},
		"uri":      uriField("prompt[].uri"),
		"resource": {Fields: fields{"uri": uriField("prompt[].resource.uri")}},
	}}

	// pathParams are the params specs of methods that carry paths, both
	// directions (method names say the direction).
	pathParams = map[string]*jsonrpc.Spec{
		mSessionNew:    sessionSetup,
		mSessionLoad:   sessionSetup,
		mSessionResume: sessionSetup,
		mSessionFork:   sessionSetup,
		mSessionList:   {Fields: fields{"cwd": pathField("cwd")}},
		mSessionPrompt: {Fields: fields{
			"sessionId": leafSession,
			"prompt":    {Elems: promptBlock},
		}},
		mSessionUpdate: {Fields: fields{
			"sessionId": leafSession,
			"update": {Fields: fields{
				"content":               contentSpec,
				"locations":             locationsSpec,
				"cwd":                   pathField("update.cwd"),
				"additionalDirectories": pathList("update.additionalDirectories[]"),
				"plan":                  {Fields: fields{"uri": uriField("update.plan.uri")}},
				"summary":               contentSpec,
				"sessionUpdate":         updateKind,
			}},
		}},
		mRequestPerm: {Fields: fields{
			"sessionId": leafSession,
			"toolCall":  toolCallSpec,
			"subject": {Fields: fields{
				"cwd":      pathField("subject.cwd"),
				"toolCall": toolCallSpec,
			}},
		}},
		mFsRead:           {Fields: fields{"sessionId": leafSession, "path": pathField("path")}},
		mFsWrite:          {Fields: fields{"sessionId": leafSession, "path": pathField("path")}},
		"terminal/create": {Fields: fields{"sessionId": leafSession, "cwd": pathField("cwd")}},
	}

	specResultListPaths = &jsonrpc.Spec{Fields: fields{
		"sessions": {Elems: &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Fields: fields{
			"sessionId":             leafSession,
			"cwd":                   pathField("sessions[].cwd"),
			"additionalDirectories": pathList("sessions[].additionalDirectories[]"),
		}}},
	}}
)

// sessionIDObject is {"sessionId": id}: the params of the gateway's own
// session/cancel and session/close, and the data of a -32002 error.
func sessionIDObject(id string) []byte {
	return append(append([]byte(`{"sessionId":`), jsonrpc.AppendQuote(nil, id)...), '}')
}

// confinedRequest reports whether an agent request names a file the client
// would act on: one outside the tenant root is refused by the gateway.
func confinedRequest(method string) bool {
	return method == mFsRead || method == mFsWrite || method == "terminal/create"
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
