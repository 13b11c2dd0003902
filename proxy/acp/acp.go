// Package acp is what acpgate knows of ACP's wire shapes: the method names
// it acts on, where each message carries session IDs, request ids, paths,
// file URIs and the fields the relay reads (specs for jsonrpc.Scanner), and
// small facts about methods and results. It knows nothing of sessions or
// connections.
package acp

import (
	"bytes"
	"encoding/json"
	"maps"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// ACP method names the gateway acts on (PROTOCOL.md §3), with the
// gateway's own session/attach and session/detach (RFD #533).
const (
	Initialize             = "initialize"
	Authenticate           = "authenticate"
	Logout                 = "logout"
	SessionNew             = "session/new"
	SessionLoad            = "session/load"
	SessionResume          = "session/resume"
	SessionList            = "session/list"
	SessionDelete          = "session/delete"
	SessionClose           = "session/close"
	SessionFork            = "session/fork"
	SessionPrompt          = "session/prompt"
	SessionCancel          = "session/cancel"
	SessionUpdate          = "session/update"
	RequestPermission      = "session/request_permission"
	CancelRequest          = "$/cancel_request"
	ElicitationCreate      = "elicitation/create"
	NesStart               = "nes/start"
	SessionSetMode         = "session/set_mode"
	SessionSetConfigOption = "session/set_config_option"
	SessionSetModel        = "session/set_model" // the older models API (unstable)
	FsRead                 = "fs/read_text_file"
	FsWrite                = "fs/write_text_file"
	SessionAttach          = "session/attach"
	SessionStatus          = "session/status"
	SessionDetach          = "session/detach"
)

// Methods interns every method name in the v1 and v2 schemas (stable
// and unstable) so that scanning them allocates nothing.
var Methods = func() map[string]string {
	names := []string{
		Initialize, Authenticate, Logout, SessionNew, SessionLoad, SessionResume,
		SessionList, SessionDelete, SessionClose, SessionFork, SessionPrompt,
		SessionCancel, SessionUpdate, RequestPermission, CancelRequest, ElicitationCreate,
		"elicitation/complete", SessionSetMode, SessionSetConfigOption, FsRead, FsWrite,
		"terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill",
		"terminal/release", "auth/login", "auth/logout", "auth/status", "auth/status_update",
		"tool_call/cancel", "terminal/cancel", "providers/list", "providers/set",
		"providers/disable", "mcp/connect", "mcp/message", "mcp/disconnect", NesStart,
		"nes/suggest", "nes/accept", "nes/reject", "nes/close", "document/didOpen",
		"document/didChange", "document/didClose", "document/didSave", "document/didFocus",
		"session/archive", "session/unarchive", "session/status", "session/set_title",
		"proxy/initialize", "proxy/successor", SessionAttach, SessionDetach, SessionSetModel,
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
	// SpecUpdate: session/update, with the update's kind (metering) and a
	// config_option_update's options (the model allow-list).
	SpecUpdate = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"sessionId": leafSession,
		"update": {Fields: map[string]*jsonrpc.Spec{"sessionUpdate": updateKind, "configOptions": configOptions,
			"currentModeId": {Kind: jsonrpc.FieldTag, Label: LabelCurrentModeID}}},
	}}
	updateKind = &jsonrpc.Spec{Kind: jsonrpc.FieldTag, Label: LabelUpdateKind}
	// SpecChildSessions locates the session IDs inside a session/update's
	// update (a subagent_update's child, a session message's sender or
	// recipient, a background subagent), sealed on the way out like
	// params.sessionId. It is a second scan of the few updates that carry
	// them (CarriesSessionIDs), not part of SpecUpdate: every member name
	// a spec's object has costs each update the scanner walks.
	SpecChildSessions = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"update": {Fields: map[string]*jsonrpc.Spec{
			"sessionId": childSession, "senderSessionId": childSession, "recipientSessionId": childSession,
			"background": {Elems: &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"sessionId": childSession}}},
		}},
	}}
	childSession = &jsonrpc.Spec{Kind: jsonrpc.FieldTag, Label: LabelChildSessionID}
	// specPromptResult: a PromptResponse's stopReason and usage (metering).
	specPromptResult = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"stopReason": {Kind: jsonrpc.FieldTag, Label: LabelStopReason},
		"usage":      {Kind: jsonrpc.FieldTag, Label: LabelUsage},
		"messageId":  {Kind: jsonrpc.FieldTag, Label: LabelMessageID},
	}}
	// The model selectors of a session (package models reads them): the
	// config options (session config options RFD) and the older models
	// API's object, each located whole.
	configOptions = &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Label: LabelConfigOptions}
	modelState    = &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Label: LabelModels}
	modeState     = &jsonrpc.Spec{Kind: jsonrpc.FieldElement, Label: LabelModes}
	// specResultCreated: session/new and fork results: the new session's
	// ID and its selectors.
	specResultCreated = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"sessionId": leafSession, "configOptions": configOptions, "models": modelState, "modes": modeState,
	}}
	// specResultSelectors: load, resume and set_config_option results.
	specResultSelectors = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{"configOptions": configOptions, "models": modelState, "modes": modeState}}
	// modelParams: what the allow-list checks in a client's switch.
	modelParams = map[string]*jsonrpc.Spec{
		SessionSetConfigOption: {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession,
			"configId": {Kind: jsonrpc.FieldTag, Label: LabelConfigID}, "value": {Kind: jsonrpc.FieldTag, Label: LabelConfigValue}}},
		SessionSetModel: {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession, "modelId": {Kind: jsonrpc.FieldTag, Label: LabelModelID}}},
		SessionSetMode:  {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession, "modeId": {Kind: jsonrpc.FieldTag, Label: LabelModeID}}},
	}
	// specErrorData: v2 -32002 errors carry data.sessionId.
	specErrorData = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
		"data": {Fields: map[string]*jsonrpc.Spec{"sessionId": leafSession}},
	}}
)

// ParamsSpec is the spec for the params of a request or notification, in
// either direction. With paths, it also locates every path and file URI
// field (PROTOCOL.md §5) for tenant root mapping, and what the policy
// inspects (mcpServers entries, prompt block types). Client messages are
// always scanned with paths; agent output only when a tenant maps paths.
func ParamsSpec(method string, paths bool) *jsonrpc.Spec {
	switch method {
	case CancelRequest:
		return specCancelRequest
	case ElicitationCreate:
		return specElicitation
	}
	if s := modelParams[method]; s != nil {
		return s
	}
	if paths {
		if s := pathParams[method]; s != nil {
			return s
		}
	}
	if method == SessionUpdate {
		return SpecUpdate
	}
	return specSessionParam
}

// ResultSpec is the spec for an agent's answer to a client request.
func ResultSpec(method string, isError, paths bool) *jsonrpc.Spec {
	if isError {
		return specErrorData
	}
	switch method {
	case SessionNew, SessionFork:
		return specResultCreated
	case SessionLoad, SessionResume, SessionSetConfigOption:
		return specResultSelectors
	case NesStart:
		return specResultSession
	case SessionPrompt:
		return specPromptResult
	case SessionList:
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
		SessionNew:    sessionSetup,
		SessionLoad:   sessionSetup,
		SessionResume: sessionSetup,
		SessionFork:   sessionSetup,
		SessionList:   {Fields: fields{"cwd": pathField("cwd")}},
		SessionPrompt: {Fields: fields{
			"sessionId":      leafSession,
			"prompt":         {Elems: promptBlock},
			"idempotencyKey": {Kind: jsonrpc.FieldTag, Label: LabelIdempotencyKey},
		}},
		SessionUpdate: {Fields: fields{
			"sessionId": leafSession,
			"update": {Fields: fields{
				"content":               contentSpec,
				"locations":             locationsSpec,
				"cwd":                   pathField("update.cwd"),
				"additionalDirectories": pathList("update.additionalDirectories[]"),
				"plan":                  {Fields: fields{"uri": uriField("update.plan.uri")}},
				"summary":               contentSpec,
				"sessionUpdate":         updateKind,
				"configOptions":         configOptions,
			}},
		}},
		RequestPermission: {Fields: fields{
			"sessionId": leafSession,
			"toolCall":  toolCallSpec,
			"subject": {Fields: fields{
				"cwd":      pathField("subject.cwd"),
				"toolCall": toolCallSpec,
			}},
		}},
		FsRead:            {Fields: fields{"sessionId": leafSession, "path": pathField("path")}},
		FsWrite:           {Fields: fields{"sessionId": leafSession, "path": pathField("path")}},
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

// SessionIDObject is {"sessionId": id}: the params of the gateway's own
// session/cancel and session/close, and the data of a -32002 error.
func SessionIDObject(id string) []byte {
	return append(append([]byte(`{"sessionId":`), jsonrpc.AppendQuote(nil, id)...), '}')
}

// Confined reports whether an agent request names a file the client
// would act on: one outside the tenant root is refused by the gateway.
func Confined(method string) bool {
	return method == FsRead || method == FsWrite || method == "terminal/create"
}

// CreatesSession reports whether a successful result of method carries the
// ID of a session that the agent has just created.
func CreatesSession(method string) bool {
	return method == SessionNew || method == SessionFork || method == NesStart
}

// LoadsSession reports whether method takes a session the connection
// may not hold yet and makes it the connection's (load, resume).
func LoadsSession(method string) bool {
	return method == SessionLoad || method == SessionResume
}

// Labels of the trace context fields located in a client's params._meta.
const (
	LabelTraceparent = "_meta.traceparent"
	LabelTracestate  = "_meta.tracestate"
)

var (
	specMeta = &jsonrpc.Spec{Kind: jsonrpc.FieldMeta, Label: "_meta", Fields: fields{
		"traceparent": {Kind: jsonrpc.FieldTag, Label: LabelTraceparent},
		"tracestate":  {Kind: jsonrpc.FieldTag, Label: LabelTracestate},
	}}
	// metaSpecs: each spec of client params (ParamsSpec with paths) with
	// params._meta located too.
	metaSpecs = func() map[*jsonrpc.Spec]*jsonrpc.Spec {
		out := map[*jsonrpc.Spec]*jsonrpc.Spec{}
		add := func(s *jsonrpc.Spec) {
			if out[s] == nil {
				c := *s
				c.Fields = maps.Clone(s.Fields)
				if c.Fields == nil {
					c.Fields = fields{}
				}
				c.Fields["_meta"] = specMeta
				out[s] = &c
			}
		}
		for _, s := range []*jsonrpc.Spec{specSessionParam, specCancelRequest, specElicitation, SpecUpdate} {
			add(s)
		}
		for _, s := range pathParams {
			add(s)
		}
		for _, s := range modelParams {
			add(s)
		}
		return out
	}()
	// specAnswerMeta locates result._meta of a client's answer to an agent
	// request (policy.meta applies to it too).
	specAnswerMeta = &jsonrpc.Spec{Fields: fields{"_meta": specMeta}}
)

// MetaIndex is the index in m.Fields of params._meta, or of result._meta
// in a client's answer (-1: none).
func MetaIndex(m *jsonrpc.Message) int {
	for i, f := range m.Fields {
		if f.Kind == jsonrpc.FieldMeta && f.Parent == -1 {
			return i
		}
	}
	return -1
}

// Labels of the model selectors and switches the specs above locate
// (package models).
const (
	LabelConfigOptions = "configOptions" // a result's or config_option_update's configOptions
	LabelModels        = "models"        // a result's models (the older models API)
	LabelConfigID      = "configId"      // session/set_config_option params
	LabelConfigValue   = "value"         // session/set_config_option params
	LabelModelID       = "modelId"       // session/set_model params
	LabelModes         = "modes"         // a result's modes
	LabelModeID        = "modeId"        // session/set_mode params
	LabelCurrentModeID = "currentModeId" // a current_mode_update's mode
)

// Labels of the fields metering locates (the specs above).
const (
	LabelUpdateKind = "update.sessionUpdate"
	// LabelChildSessionID: a session ID inside a session/update's update
	// (subagent_update.sessionId, senderSessionId, recipientSessionId,
	// background[].sessionId).
	LabelChildSessionID = "update.*sessionId"
	LabelStopReason     = "stopReason"
	LabelUsage          = "usage"
	// LabelMessageID: a v2 PromptResponse's messageId; LabelIdempotencyKey:
	// a v2 prompt's idempotencyKey (retries across a resume).
	LabelMessageID      = "messageId"
	LabelIdempotencyKey = "idempotencyKey"
)

// CarriesSessionIDs reports whether an update of kind (its sessionUpdate)
// may name sessions inside it (SpecChildSessions): subagent_update,
// state_update (background[]), and the session messages.
func CarriesSessionIDs(kind []byte) bool {
	switch string(kind) {
	case "subagent_update", "state_update", "session_message", "session_message_chunk":
		return true
	}
	return false
}

// UpdateKind is a session/update's sessionUpdate tag, as the scanner
// located it (nil: none).
func UpdateKind(m *jsonrpc.Message) []byte {
	f, ok := Tagged(m, LabelUpdateKind)
	if !ok {
		return nil
	}
	kind, _ := m.RawString(f)
	return kind
}

// StopReason is the stopReason of a session/prompt's answer as the
// scanner located it (specPromptResult); ok: the answer has one ("" if it
// is not a string).
func StopReason(m *jsonrpc.Message) (stop string, ok bool) {
	f, ok := Tagged(m, LabelStopReason)
	if !ok {
		return "", false
	}
	stop, _ = m.String(f)
	return stop, true
}

// TaggedString is the string value of the tag of the given label, "" when
// m has none or it is not a string.
func TaggedString(m *jsonrpc.Message, label string) string {
	f, ok := Tagged(m, label)
	if !ok {
		return ""
	}
	v, _ := m.String(f)
	return v
}

// Tagged finds the located tag of the given label.
func Tagged(m *jsonrpc.Message, label string) (jsonrpc.Field, bool) {
	for _, f := range m.Fields {
		if f.Kind == jsonrpc.FieldTag && f.Label == label {
			return f, true
		}
	}
	return jsonrpc.Field{}, false
}

// ClientSpec locates what the relay rewrites in a client message: in an
// answer to an agent request, its result._meta.
func ClientSpec(m *jsonrpc.Message) *jsonrpc.Spec {
	if m.Kind == jsonrpc.KindResponse {
		if m.IsError {
			return nil
		}
		return specAnswerMeta
	}
	s := ParamsSpec(m.Method, true)
	if t := metaSpecs[s]; t != nil { // params._meta's trace context (trace.go)
		return t
	}
	return s
}

// WithAttachCapability adds agentCapabilities.sessionCapabilities.attach
// to an initialize result (the gateway serves session/attach itself),
// creating the objects on the way where the agent sent none. The rest is
// copied as it is.
func WithAttachCapability(result []byte) []byte {
	path := []string{"agentCapabilities", "sessionCapabilities"}
	open, empty, depth, has, ok := findObject(result, path, "attach")
	if !ok || has {
		return result
	}
	ins := `"attach":{}`
	for i := len(path) - 1; i >= depth; i-- {
		ins = strconv.Quote(path[i]) + ":{" + ins + "}"
	}
	if !empty {
		ins += ","
	}
	return jsonrpc.Splice(nil, result, []jsonrpc.Edit{{Start: open, End: open, Repl: []byte(ins)}})
}

// findObject walks doc's objects along path as far as they exist: open is
// the offset just past the '{' of the deepest one found (depth levels of
// path), empty whether it has no member, has whether it holds key (when
// the whole path was found). ok false: doc is not an object, or a level of
// path is not an object.
func findObject(doc []byte, path []string, key string) (open int, empty bool, depth int, has, ok bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(doc))
	enter := func() bool {
		at := int(dec.InputOffset())
		if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
			return false
		}
		open = at + bytes.IndexByte(doc[at:], '{') + 1
		empty = dec.PeekKind() == '}'
		return true
	}
	if !enter() {
		return 0, false, 0, false, false
	}
	for depth < len(path) {
		found := false
		for dec.PeekKind() != '}' {
			name, err := dec.ReadToken()
			if err != nil {
				return 0, false, 0, false, false
			}
			if name.String() == path[depth] {
				if dec.PeekKind() != '{' || !enter() {
					return 0, false, 0, false, false
				}
				found = true
				break
			}
			if dec.SkipValue() != nil {
				return 0, false, 0, false, false
			}
		}
		if !found {
			return open, empty, depth, false, true
		}
		depth++
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return 0, false, 0, false, false
		}
		if name.String() == key {
			return open, empty, depth, true, true
		}
		if dec.SkipValue() != nil {
			return 0, false, 0, false, false
		}
	}
	return open, empty, depth, false, true
}

// WithAcpgateMeta adds _meta.acpgate to an initialize result (a JSON
// object) with the resume token and the affinity cookie (each if not
// empty), inside an existing _meta object if there is one. The rest is
// copied as it is.
func WithAcpgateMeta(result []byte, token, affinity, clientID string) []byte {
	var fields []string
	if clientID != "" {
		fields = append(fields, `"clientId":`+strconv.Quote(clientID))
	}
	if token != "" {
		fields = append(fields, `"resumeToken":`+strconv.Quote(token))
	}
	if affinity != "" {
		fields = append(fields, `"affinity":`+strconv.Quote(affinity))
	}
	member := []byte(`"acpgate":{` + strings.Join(fields, ",") + `}`)
	dec := jsontext.NewDecoder(bytes.NewReader(result))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return result
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return result
		}
		if name.String() != "_meta" {
			if err := dec.SkipValue(); err != nil {
				return result
			}
			continue
		}
		if dec.PeekKind() != '{' {
			return result // a _meta that is not an object: left alone
		}
		at := int(dec.InputOffset()) // before the object's '{' and any space
		open := at + bytes.IndexByte(result[at:], '{') + 1
		var meta jsontext.Value
		if meta, err = dec.ReadValue(); err != nil {
			return result
		}
		if bytes.Contains(meta, []byte(`"acpgate"`)) {
			return result // the agent's own acpgate key: not overwritten
		}
		sep := []byte(",")
		if len(bytes.TrimSpace(meta[1:len(meta)-1])) == 0 {
			sep = nil
		}
		return jsonrpc.Splice(nil, result, []jsonrpc.Edit{{Start: open, End: open, Repl: append(member, sep...)}})
	}
	open := bytes.IndexByte(result, '{') + 1
	sep := []byte(",")
	if len(bytes.TrimSpace(result[open:len(bytes.TrimRight(result, " \t\r\n"))-1])) == 0 {
		sep = nil
	}
	meta := append(append(append([]byte(`"_meta":{`), member...), '}'), sep...)
	return jsonrpc.Splice(nil, result, []jsonrpc.Edit{{Start: open, End: open, Repl: meta}})
}

// WithID is msg, a request as a client was sent it, with another id.
func WithID(msg []byte, id int64) []byte {
	var sc jsonrpc.Scanner
	var m jsonrpc.Message
	if err := sc.Scan(msg, &m, nil); err != nil || m.IDPos[1] == 0 {
		return nil
	}
	return jsonrpc.Splice(nil, msg, []jsonrpc.Edit{{Start: m.IDPos[0], End: m.IDPos[1], Repl: strconv.AppendInt(nil, id, 10)}})
}

// CancelRequestMsg is $/cancel_request for the id a client was sent.
func CancelRequestMsg(id int64) []byte {
	params := append(strconv.AppendInt([]byte(`{"requestId":`), id, 10), '}')
	return jsonrpc.AppendRequest(nil, nil, CancelRequest, params)
}

// Declines reports whether a client's answer to an agent request is an
// error or a cancelled permission outcome rather than a choice.
func Declines(m *jsonrpc.Message) bool {
	if m.IsError {
		return true
	}
	if !bytes.Contains(m.Payload, []byte(`"cancel`)) && !bytes.Contains(m.Payload, []byte(`"decline"`)) {
		return false
	}
	var res struct {
		Outcome struct {
			Outcome string `json:"outcome"`
		} `json:"outcome"`
		Action string `json:"action"` // elicitation
	}
	return json.Unmarshal(m.Payload, &res) == nil && (res.Outcome.Outcome == "cancelled" || res.Action == "cancel" || res.Action == "decline")
}

// PromptBlocks reads the prompt of a session/prompt's params.
func PromptBlocks(params []byte) []json.RawMessage {
	var p struct {
		Prompt []json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Prompt
}

// TraceparentEdit sets a forwarded request's params._meta.traceparent to
// tp (a JSON string): the value replaced, the key added to _meta, or _meta added to
// params. Everything else in _meta passes as it is. emptied says that
// other edits remove every member _meta has (policy.meta): the key is then
// added without a comma after it. No edit: params is not an object, or
// its _meta is not one.
func TraceparentEdit(m *jsonrpc.Message, tp []byte, emptied bool) (jsonrpc.Edit, bool) {
	idx := MetaIndex(m)
	if idx < 0 {
		if len(m.Payload) == 0 || m.Payload[0] != '{' {
			return jsonrpc.Edit{}, false
		}
		at := m.PayloadPos[0] + 1
		repl := append(append([]byte(`"_meta":{"traceparent":`), tp...), '}')
		if !emptyObject(m.Payload) {
			repl = append(repl, ',')
		}
		return jsonrpc.Edit{Start: at, End: at, Repl: repl}, true
	}
	for _, f := range m.Fields[idx+1:] {
		if f.Parent == idx && f.Label == LabelTraceparent {
			return jsonrpc.Edit{Start: f.Start, End: f.End, Repl: tp}, true
		}
	}
	meta := m.Fields[idx]
	if m.Raw[meta.Start] != '{' {
		return jsonrpc.Edit{}, false
	}
	repl := append([]byte(`"traceparent":`), tp...)
	if !emptied && !emptyObject(m.Raw[meta.Start:meta.End]) {
		repl = append(repl, ',')
	}
	return jsonrpc.Edit{Start: meta.Start + 1, End: meta.Start + 1, Repl: repl}, true
}

// emptyObject reports whether obj, a JSON object's text, has no members.
func emptyObject(obj []byte) bool {
	for _, b := range obj[1 : len(obj)-1] {
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			return false
		}
	}
	return true
}

// TraceContext is the W3C trace context a client message names in its
// params._meta (traceparent and tracestate; "" where it names none).
func TraceContext(m *jsonrpc.Message) (traceparent, tracestate string) {
	idx := MetaIndex(m)
	if idx < 0 {
		return "", ""
	}
	for _, f := range m.Fields[idx+1:] {
		if f.Kind != jsonrpc.FieldTag || f.Parent != idx {
			continue
		}
		if v, ok := m.String(f); ok && f.Label == LabelTraceparent {
			traceparent = v
		} else if ok && f.Label == LabelTracestate {
			tracestate = v
		}
	}
	return traceparent, tracestate
}

// ParseAgentID reads an id the gateway issued to an agent (a positive
// integer).
func ParseAgentID(raw []byte) (int64, bool) {
	if len(raw) == 0 || len(raw) > 19 {
		return 0, false
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// SessionCwd is the cwd a session/new, load, resume or fork asks for, as
// the client sent it and the scanner located it ("" if none).
func SessionCwd(m *jsonrpc.Message) string {
	for _, f := range m.Fields {
		if f.Kind == jsonrpc.FieldPath && f.Label == "cwd" {
			v, _ := m.String(f)
			return v
		}
	}
	return ""
}

// CreatedCwd is SessionCwd for a request that creates a session.
func CreatedCwd(m *jsonrpc.Message) string {
	if !CreatesSession(m.Method) {
		return ""
	}
	return SessionCwd(m)
}

// ReadContentLen is the length of the content of a fs/read_text_file
// result.
func ReadContentLen(result []byte) int {
	var res struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(result, &res)
	return len(res.Content)
}
