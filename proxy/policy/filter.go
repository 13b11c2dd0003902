package policy

import (
	"fmt"

	"github.com/go-json-experiment/json/jsontext"
)

// FilterInitialize returns the initialize result a client receives: the
// agent's result with its capabilities intersected with p, in the shape the
// agent used. It edits the bytes in place rather than re-encoding them:
//
//   - a v1 boolean the policy turns off becomes false;
//   - an object marker ({}) the policy turns off is removed;
//   - unstable keys are removed unless p.Unstable (v1 mcpCapabilities.acp,
//     sessionCapabilities.{fork,systemPrompt,archive,status,title},
//     auth.status, providers, nes, positionEncoding; v2 the same under
//     capabilities and capabilities.session, and session.mcp.acp); fork also
//     needs p.Session.Fork, auth.status also p.AgentAuth;
//   - authMethods becomes [] and auth.logout is removed unless p.AgentAuth;
//   - a known capability with a malformed value is normalized to
//     "unsupported" (a boolean becomes false, a marker is removed, an object
//     of capabilities becomes null), so that no client can read it as
//     support;
//   - in v2 the draft-only session markers (load, resume, close, list) the
//     policy turns off become null instead of being removed, so that a
//     draft-shaped result stays recognizably draft-shaped (see [Shape]);
//     session.mcp.sse and auth.logout, which v2 does not define, are gated
//     like their v1 counterparts should an agent send them;
//   - everything else (unknown keys, _meta, agentInfo/info, protocolVersion,
//     names, order, whitespace) keeps its exact bytes.
//
// A capability the agent did not advertise is never added. In the later v2
// shape session/list, resume and close are baseline and cannot be hidden;
// in v1 stdio MCP servers are mandatory: the gates refuse what the policy
// forbids there.
//
// The result must be a single JSON object with valid UTF-8 and no duplicate
// names at any depth; anything else is an error (the caller should fail
// the connection rather than forward an unfiltered result). When nothing
// changes, the returned slice is result itself.
func FilterInitialize(result []byte, p Policy) ([]byte, error) {
	out, err := rewriteObject(result, func(m member) (action, error) {
		return apply(topRules[m.name], m.val, p)
	})
	if err != nil {
		return nil, fmt.Errorf("policy: initialize result: %w", err)
	}
	return out, nil
}

type ruleKind uint8

const (
	passThrough     ruleKind = iota // not a capability the policy knows: unchanged
	boolCap                         // v1 boolean: off → false; malformed → false
	unstableBoolCap                 // v1 unstable boolean: off → removed; malformed → false
	markerCap                       // object marker: off → removed; null kept; malformed → removed
	draftMarkerCap                  // v2 draft-only session marker: off or malformed → null
	opaqueCap                       // any value: off → removed
	container                       // object holding other capabilities; null kept; malformed → null
	authMethodsList                 // off → []; malformed → []
)

type rule struct {
	kind  ruleKind
	allow func(Policy) bool // not for containers
	sub   map[string]rule   // container
}

func apply(r rule, v []byte, p Policy) (action, error) {
	k := kindOf(v)
	switch r.kind {
	case boolCap, unstableBoolCap:
		if !r.allow(p) && r.kind == unstableBoolCap {
			return action{drop: true}, nil
		}
		if k == jsontext.KindFalse || (k == jsontext.KindTrue && r.allow(p)) {
			return keep, nil
		}
		return action{repl: []byte("false")}, nil
	case markerCap:
		if k == jsontext.KindNull || (k == jsontext.KindBeginObject && r.allow(p)) {
			return keep, nil
		}
		return action{drop: true}, nil
	case draftMarkerCap:
		if k == jsontext.KindNull || (k == jsontext.KindBeginObject && r.allow(p)) {
			return keep, nil
		}
		return action{repl: []byte("null")}, nil
	case opaqueCap:
		if r.allow(p) {
			return keep, nil
		}
		return action{drop: true}, nil
	case container:
		switch k {
		case jsontext.KindNull:
			return keep, nil
		case jsontext.KindBeginObject:
			out, err := rewriteObject(v, func(m member) (action, error) {
				return apply(r.sub[m.name], m.val, p)
			})
			if err != nil {
				return action{}, err
			}
			return action{repl: out}, nil
		}
		return action{repl: []byte("null")}, nil
	case authMethodsList:
		if k == jsontext.KindBeginArray && (p.AgentAuth || !nonEmptyArray(v)) {
			return keep, nil
		}
		return action{repl: []byte("[]")}, nil
	}
	return keep, nil
}

func boolRule(allow func(Policy) bool) rule   { return rule{kind: boolCap, allow: allow} }
func markerRule(allow func(Policy) bool) rule { return rule{kind: markerCap, allow: allow} }
func containerRule(sub map[string]rule) rule  { return rule{kind: container, sub: sub} }

var (
	sessionLoad   = func(p Policy) bool { return p.Session.Load }
	sessionResume = func(p Policy) bool { return p.Session.Resume }
	sessionClose  = func(p Policy) bool { return p.Session.Close }
	sessionList   = func(p Policy) bool { return p.Session.List }
	sessionDelete = func(p Policy) bool { return p.Session.Delete }
	sessionFork   = func(p Policy) bool { return p.Session.Fork && p.Unstable }
	sessionDirs   = func(p Policy) bool { return p.Session.AdditionalDirectories }
	mcpStdio      = func(p Policy) bool { return p.MCP.Stdio }
	mcpHTTP       = func(p Policy) bool { return p.MCP.HTTP }
	mcpSSE        = func(p Policy) bool { return p.MCP.SSE }
	promptImage   = func(p Policy) bool { return p.Prompt.Image }
	promptAudio   = func(p Policy) bool { return p.Prompt.Audio }
	promptContext = func(p Policy) bool { return p.Prompt.EmbeddedContext }
	agentAuth     = func(p Policy) bool { return p.AgentAuth }
	authStatus    = func(p Policy) bool { return p.AgentAuth && p.Unstable }
	unstable      = func(p Policy) bool { return p.Unstable }
)

// sessionMarkers are the session capability markers shared by v1
// sessionCapabilities and v2 capabilities.session.
func sessionMarkers() map[string]rule {
	return map[string]rule{
		"list":                  markerRule(sessionList),
		"delete":                markerRule(sessionDelete),
		"resume":                markerRule(sessionResume),
		"close":                 markerRule(sessionClose),
		"additionalDirectories": markerRule(sessionDirs),
		"fork":                  markerRule(sessionFork),
		"systemPrompt":          markerRule(unstable),
		"archive":               markerRule(unstable),
		"status":                markerRule(unstable),
		"title":                 markerRule(unstable),
	}
}

// topUnstable adds the unstable agent capabilities shared by v1
// agentCapabilities and v2 capabilities.
func topUnstable(m map[string]rule) map[string]rule {
	m["providers"] = rule{kind: opaqueCap, allow: unstable}
	m["nes"] = rule{kind: opaqueCap, allow: unstable}
	m["positionEncoding"] = rule{kind: opaqueCap, allow: unstable}
	return m
}

func authRules() map[string]rule {
	return map[string]rule{
		"logout": markerRule(agentAuth),
		"status": markerRule(authStatus),
	}
}

// topRules apply to the members of the initialize result. Both shapes'
// capability members are filtered whichever shape the result claims.
var topRules = map[string]rule{
	"agentCapabilities": containerRule(topUnstable(map[string]rule{ // v1
		"loadSession": boolRule(sessionLoad),
		"promptCapabilities": containerRule(map[string]rule{
			"image":           boolRule(promptImage),
			"audio":           boolRule(promptAudio),
			"embeddedContext": boolRule(promptContext),
		}),
		"mcpCapabilities": containerRule(map[string]rule{
			"http": boolRule(mcpHTTP),
			"sse":  boolRule(mcpSSE),
			"acp":  {kind: unstableBoolCap, allow: unstable},
		}),
		"sessionCapabilities": containerRule(sessionMarkers()),
		"auth":                containerRule(authRules()),
	})),
	"capabilities": containerRule(topUnstable(map[string]rule{ // v2
		"session": containerRule(func() map[string]rule {
			m := sessionMarkers()
			// The draft pages' markers become null rather than disappear, so
			// that the result stays recognizably draft-shaped: without them a
			// reader would take the later shape, where resume, close and list
			// are baseline.
			m["load"] = rule{kind: draftMarkerCap, allow: sessionLoad}
			m["resume"] = rule{kind: draftMarkerCap, allow: sessionResume}
			m["close"] = rule{kind: draftMarkerCap, allow: sessionClose}
			m["list"] = rule{kind: draftMarkerCap, allow: sessionList}
			m["mcp"] = containerRule(map[string]rule{
				"stdio": markerRule(mcpStdio),
				"http":  markerRule(mcpHTTP),
				"sse":   markerRule(mcpSSE), // not in v2; gated in case an agent sends it
				"acp":   markerRule(unstable),
			})
			m["prompt"] = containerRule(map[string]rule{
				"image":           markerRule(promptImage),
				"audio":           markerRule(promptAudio),
				"embeddedContext": markerRule(promptContext),
			})
			return m
		}()),
		"auth": containerRule(authRules()),
	})),
	"authMethods": {kind: authMethodsList, allow: agentAuth},
}
