package policy

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"
)

// Shape is the form of an agent's initialize result.
type Shape int

const (
	// ShapeUnknown: the result is not a JSON object. Nothing beyond the
	// baseline is advertised.
	ShapeUnknown Shape = iota
	// ShapeV1: ACP v1, "agentCapabilities" with booleans (loadSession,
	// promptCapabilities.*, mcpCapabilities.*) and object markers
	// (sessionCapabilities.*, auth.logout). stdio MCP servers are mandatory.
	ShapeV1
	// ShapeV2Draft: the v2 draft pages' shape, "capabilities.session" with
	// markers for load, resume and close (and, by symmetry, list): those
	// methods exist only when marked.
	ShapeV2Draft
	// ShapeV2: the later v2 schema's shape: no session/load; a present
	// "capabilities.session" makes session/list, resume and close baseline.
	ShapeV2
)

func (s Shape) String() string {
	switch s {
	case ShapeV1:
		return "v1"
	case ShapeV2Draft:
		return "v2-draft"
	case ShapeV2:
		return "v2"
	}
	return "unknown"
}

// IsV2 reports whether s is either v2 shape.
func (s Shape) IsV2() bool { return s == ShapeV2Draft || s == ShapeV2 }

// AgentCaps is what an agent advertised in its initialize result, normalized
// across the shapes. A field is true only when the agent advertised the
// capability in a well-formed way (malformed values mean unsupported, as
// the schemas' x-deserialize-default-on-error says).
type AgentCaps struct {
	ProtocolVersion int   // the result's protocolVersion (0 if absent or not an integer)
	Shape           Shape // which shape the capabilities came in

	// Sessions: v1 always; v2 when "capabilities.session" is an object
	// (omitted or null means no session/* methods at all).
	Sessions bool

	Load, Resume, Close, List, Delete, AdditionalDirectories bool
	Fork                                                     bool // unstable

	MCPStdio, MCPHTTP, MCPSSE bool // v1: stdio always; v2: session.mcp.* (sse: not in v2)
	MCPACP                    bool // unstable "acp" transport

	PromptImage, PromptAudio, PromptEmbeddedContext bool

	// AuthMethods is how many authMethods the agent listed.
	AuthMethods int
	// Logout: v1 auth.logout marker; v2 a non-empty authMethods (the agent
	// "MUST implement both auth/login and auth/logout").
	Logout bool

	// Unstable markers.
	AuthStatus    bool // auth.status: auth/status
	Providers     bool // providers: providers/*
	NES           bool // nes: nes/*, document/*
	SystemPrompt  bool // session(Capabilities).systemPrompt
	Archive       bool // session/archive, session/unarchive
	SessionStatus bool // session/status
	Title         bool // session/set_title
}

// draftOnlyKeys are the session markers of the v2 draft pages that the
// later v2 schema dropped (list is not on the draft pages; it is treated as
// a marker by symmetry with v1 when a draft-shaped agent sends it).
var draftOnlyKeys = []string{"load", "resume", "close", "list"}

// ParseAgentCaps reads an agent's initialize result (the JSON-RPC "result"
// member, not the whole response). It never fails: a result it cannot read
// advertises nothing beyond the baseline.
//
// The shape comes from the member present: "agentCapabilities" is v1,
// "capabilities" is v2 (with both, protocolVersion >= 2 picks v2; with
// neither, protocolVersion does). A v2 result is the draft shape when
// capabilities.session has any of load, resume, close or list, and the later
// schema shape otherwise.
func ParseAgentCaps(initResult []byte) AgentCaps {
	var c AgentCaps
	top, err := objectMembers(initResult)
	if err != nil {
		return c
	}
	c.ProtocolVersion = intValue(lookup(top, "protocolVersion"))
	v1 := lookup(top, "agentCapabilities") != nil
	v2 := lookup(top, "capabilities") != nil
	if v1 == v2 {
		v1 = c.ProtocolVersion < 2
	}
	authMethods := lookup(top, "authMethods")
	if nonEmptyArray(authMethods) {
		c.AuthMethods = countElements(authMethods)
	}
	if v1 {
		c.Shape = ShapeV1
		parseV1(&c, top)
	} else {
		c.Shape = ShapeV2
		parseV2(&c, top)
	}
	return c
}

func parseV1(c *AgentCaps, top []member) {
	c.Sessions = true
	c.MCPStdio = true // "All Agents MUST support" stdio MCP servers
	ac, ok := subMembers(top, "agentCapabilities")
	if !ok {
		return
	}
	c.Load = isTrue(lookup(ac, "loadSession"))
	if pc, ok := subMembers(ac, "promptCapabilities"); ok {
		parsePrompt(c, pc, isTrue)
	}
	if mc, ok := subMembers(ac, "mcpCapabilities"); ok {
		parseMCP(c, mc, isTrue)
	}
	if sc, ok := subMembers(ac, "sessionCapabilities"); ok {
		parseSessionMarkers(c, sc)
	}
	if au, ok := subMembers(ac, "auth"); ok {
		c.Logout = isMarker(lookup(au, "logout"))
		c.AuthStatus = isMarker(lookup(au, "status"))
	}
	parseTopUnstable(c, ac)
}

func parseV2(c *AgentCaps, top []member) {
	c.Logout = c.AuthMethods > 0
	caps, ok := subMembers(top, "capabilities")
	if !ok {
		return
	}
	if sc, ok := subMembers(caps, "session"); ok {
		c.Sessions = true
		draft := false
		for _, k := range draftOnlyKeys {
			if lookup(sc, k) != nil {
				draft = true
			}
		}
		if draft {
			c.Shape = ShapeV2Draft
			c.Load = isMarker(lookup(sc, "load"))
		} else { // later schema: list, resume and close are baseline
			c.List, c.Resume, c.Close = true, true, true
		}
		parseSessionMarkers(c, sc)
		if mc, ok := subMembers(sc, "mcp"); ok {
			c.MCPStdio = isMarker(lookup(mc, "stdio"))
			parseMCP(c, mc, isMarker)
		}
		if pc, ok := subMembers(sc, "prompt"); ok {
			parsePrompt(c, pc, isMarker)
		}
	}
	if au, ok := subMembers(caps, "auth"); ok {
		c.AuthStatus = isMarker(lookup(au, "status"))
	}
	parseTopUnstable(c, caps)
}

// parsePrompt reads the prompt content types an agent accepts, the same
// keys in v1 promptCapabilities (booleans: is is isTrue) and v2
// capabilities.session.prompt (markers: isMarker).
func parsePrompt(c *AgentCaps, pc []member, is func([]byte) bool) {
	c.PromptImage = is(lookup(pc, "image"))
	c.PromptAudio = is(lookup(pc, "audio"))
	c.PromptEmbeddedContext = is(lookup(pc, "embeddedContext"))
}

// parseMCP reads the MCP transports beyond stdio an agent accepts, the same
// keys in v1 mcpCapabilities (booleans: is is isTrue) and v2
// capabilities.session.mcp (markers: isMarker).
func parseMCP(c *AgentCaps, mc []member, is func([]byte) bool) {
	c.MCPHTTP = is(lookup(mc, "http"))
	c.MCPSSE = is(lookup(mc, "sse"))
	c.MCPACP = is(lookup(mc, "acp"))
}

// parseSessionMarkers reads the object markers shared by v1
// sessionCapabilities and v2 capabilities.session. For the later v2 shape,
// list, resume and close are already true (baseline) and stay so.
func parseSessionMarkers(c *AgentCaps, sc []member) {
	if c.Shape != ShapeV2 {
		c.List = isMarker(lookup(sc, "list"))
		c.Resume = isMarker(lookup(sc, "resume"))
		c.Close = isMarker(lookup(sc, "close"))
	}
	c.Delete = isMarker(lookup(sc, "delete"))
	c.AdditionalDirectories = isMarker(lookup(sc, "additionalDirectories"))
	c.Fork = isMarker(lookup(sc, "fork"))
	c.SystemPrompt = isMarker(lookup(sc, "systemPrompt"))
	c.Archive = isMarker(lookup(sc, "archive"))
	c.SessionStatus = isMarker(lookup(sc, "status"))
	c.Title = isMarker(lookup(sc, "title"))
}

func parseTopUnstable(c *AgentCaps, caps []member) {
	c.Providers = isMarker(lookup(caps, "providers"))
	c.NES = isMarker(lookup(caps, "nes"))
}

// countElements counts the elements of a JSON array (0 if malformed).
func countElements(arr []byte) int {
	dec := jsontext.NewDecoder(bytes.NewReader(arr))
	if _, err := dec.ReadToken(); err != nil {
		return 0
	}
	n := 0
	for dec.PeekKind() != jsontext.KindEndArray && dec.PeekKind() != jsontext.KindInvalid {
		if err := dec.SkipValue(); err != nil {
			return n
		}
		n++
	}
	return n
}
