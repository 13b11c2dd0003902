// Package models applies a tenant's model allow-list (policy.ModelPolicy)
// to the ACP messages the relay routes, as splice edits on a scanned
// message: the relay never re-encodes what it only routes.
//
// A session's models are offered two ways: session config options of
// category "model" (configOptions: [{id (v1) or configId (v2), category,
// type: "select", currentValue, options: [{value, name}] or grouped
// [{group|groupId, name, options: [...]}]}]), and the older models API
// (models: {currentModelId, availableModels: [{modelId, name}]}). The
// scanner locates both whole (acp.LabelConfigOptions, acp.LabelModels) in
// session/new, load, resume, fork and set_config_option results and in
// config_option_update notifications; only a message that carries one is
// read further, once, by a token decoder over that value.
//
//   - [Seen.Edits] (updates) and [Seen.Answer] (results) remove the values
//     outside the list (a group left empty goes, a selector left empty
//     goes: a config option is removed from the array, a models object
//     becomes null) and move a current value outside it to the first
//     allowed one; every other byte passes as it is. They note what the
//     session's selectors are.
//   - For the answer that made or loaded a session, [Seen.Answer] also
//     decides: when the session's current model is outside the list the
//     gateway asks the agent to switch it to the first allowed one it
//     offers before the client gets the answer ([Switch]), or refuses the
//     session when it offers none.
//   - [Seen.Check] refuses a client's switch to a model outside the list,
//     and a prompt while the session's model is outside it (after a reload
//     of the policy, or an agent that switched on its own).
package models

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/policy"
)

// located is what the scanner located of a message's selectors.
type located struct {
	opts, api jsonrpc.Field
	hasOpts   bool
	hasAPI    bool
}

// locate finds the selector fields among m's located fields; false: none
// (the cost of a message without selectors: one pass over its few fields).
func locate(m *jsonrpc.Message) (l located, any bool) {
	for _, f := range m.Fields {
		switch {
		case f.Kind == jsonrpc.FieldElement && f.Label == acp.LabelConfigOptions:
			l.opts, l.hasOpts = f, true
		case f.Kind == jsonrpc.FieldElement && f.Label == acp.LabelModels:
			l.api, l.hasAPI = f, true
		}
	}
	return l, l.hasOpts || l.hasAPI
}

// selectors reads the located selectors: every config option (model or
// not) and the models object (api.api false: none).
func (l located) selectors(raw []byte) (opts []selector, api selector, err error) {
	if l.hasOpts {
		if opts, err = configOptions(raw, l.opts.Start, l.opts.End); err != nil {
			return nil, api, err
		}
	}
	if l.hasAPI {
		var ok bool
		if api, ok, err = modelsObject(raw, l.api.Start, l.api.End); err != nil || !ok {
			return opts, selector{}, err
		}
	}
	return opts, api, nil
}

// filters reports whether the selector is one the list filters.
func (s *selector) filters() bool { return s.model && s.sel }

// first is the first value of the selector the list allows ("", false:
// none).
func (s *selector) first(allow policy.ModelPolicy) (string, bool) {
	for _, e := range s.entries {
		for _, v := range e.values() {
			if v.ok && allow.Allows(v.value) {
				return v.value, true
			}
		}
	}
	return "", false
}

// values is the entry's values: itself, or a group's.
func (e *entry) values() []entry {
	if e.group {
		return e.sub
	}
	return []entry{*e}
}

// keep reports whether an entry stays: a value the list allows, or a
// group with one.
func (e *entry) keep(allow policy.ModelPolicy) bool {
	if e.group {
		return slices.ContainsFunc(e.sub, func(v entry) bool { return v.keep(allow) })
	}
	return e.ok && allow.Allows(e.value)
}

// edits appends the edits that leave only allowed values in a selector
// that keeps at least one (first), its current value one of them.
func (s *selector) edits(dst []jsonrpc.Edit, allow policy.ModelPolicy, first string) []jsonrpc.Edit {
	if !s.curOK || !allow.Allows(s.cur) {
		dst = append(dst, jsonrpc.Edit{Start: s.curPos[0], End: s.curPos[1], Repl: jsonrpc.AppendQuote(nil, first)})
	}
	dst = deleteEntries(dst, s.entries, allow)
	for _, e := range s.entries {
		if e.group && e.keep(allow) {
			dst = deleteEntries(dst, e.sub, allow)
		}
	}
	return dst
}

func deleteEntries(dst []jsonrpc.Edit, es []entry, allow policy.ModelPolicy) []jsonrpc.Edit {
	pos := make([][2]int, len(es))
	for i, e := range es {
		pos[i] = e.pos
	}
	return jsonrpc.DeleteElements(dst, pos, func(i int) bool { return !es[i].keep(allow) })
}

// filter appends the edits that apply the list to the located selectors.
func (l located) filter(dst []jsonrpc.Edit, opts []selector, api selector, allow policy.ModelPolicy) []jsonrpc.Edit {
	var own []jsonrpc.Edit
	if l.hasOpts {
		pos := make([][2]int, len(opts))
		drop := make([]bool, len(opts))
		for i := range opts {
			pos[i] = opts[i].elem
			if !opts[i].filters() {
				continue
			}
			if first, ok := opts[i].first(allow); ok {
				own = opts[i].edits(own, allow, first)
			} else {
				drop[i] = true // no allowed model: the selector goes
			}
		}
		own = jsonrpc.DeleteElements(own, pos, func(i int) bool { return drop[i] })
	}
	if api.api {
		if first, ok := api.first(allow); ok {
			own = api.edits(own, allow, first)
		} else {
			own = append(own, jsonrpc.Edit{Start: api.elem[0], End: api.elem[1], Repl: []byte("null")})
		}
	}
	slices.SortFunc(own, func(a, b jsonrpc.Edit) int { return a.Start - b.Start })
	return append(dst, own...)
}

// Seen is what the gateway last saw of one session's model selectors: the
// IDs of its model config options and its current model. The agent's
// reader writes it, a client's reader reads it; the zero value has seen
// nothing.
type Seen struct {
	p atomic.Pointer[seen]
}

type seen struct {
	opts    bool     // the session's config options are known
	ids     []string // config options of category "model"
	current string   // the model the session runs on ("": not known)
}

// note records the selectors of a message: switched, when the gateway has
// switched the session, is its model now.
func (s *Seen) note(opts []selector, api selector, hasOpts bool, switched string) {
	next := seen{}
	if old := s.p.Load(); old != nil {
		next = *old
	}
	if hasOpts {
		next.opts, next.ids, next.current = true, nil, ""
		for _, o := range opts {
			if o.model && o.id != "" {
				next.ids = append(next.ids, o.id)
				if next.current == "" && o.sel && o.curOK {
					next.current = o.cur
				}
			}
		}
	}
	if api.api && len(next.ids) == 0 && api.curOK {
		next.current = api.cur
	}
	if switched != "" {
		next.current = switched
	}
	s.p.Store(&next)
}

// Edits appends to edits those that apply the allow-list to the model
// selectors m, a config_option_update, carries, and notes them as the
// session's. A message without selectors costs one pass over its located
// fields; one that does not parse is left as it is (the scanner has
// validated it: only a shape the schema does not allow).
func (s *Seen) Edits(m *jsonrpc.Message, allow policy.ModelPolicy, edits []jsonrpc.Edit) []jsonrpc.Edit {
	edits, _, _ = s.Answer(m, allow, false, "", edits)
	return edits
}

// Answer is Edits for an agent's answer about the session. When the
// answer made or loaded the session (establishes; sid is the agent's ID
// of it) and leaves it on a model outside the list, it also returns the
// switch to make before the client gets the answer ([Switch]), or an error
// when the agent offers no allowed model (the session is refused).
func (s *Seen) Answer(m *jsonrpc.Message, allow policy.ModelPolicy, establishes bool, sid string, edits []jsonrpc.Edit) ([]jsonrpc.Edit, *Switch, error) {
	l, any := locate(m)
	if !any || m.IsError {
		return edits, nil, nil
	}
	opts, api, err := l.selectors(m.Raw)
	if err != nil {
		return edits, nil, nil
	}
	s.note(opts, api, l.hasOpts, "")
	if !allow.Restricts() {
		return edits, nil, nil
	}
	var sw *Switch
	if establishes {
		if sw, err = plan(opts, api, allow, sid); err != nil {
			return edits, nil, err
		}
	}
	return l.filter(edits, opts, api, allow), sw, nil
}

// Check applies the allow-list to a client message about the session
// (scanned with acp.ClientSpec): a session/set_config_option of one of the
// session's model options, or a session/set_model, to a model outside the
// list is refused with -32602; a session/prompt while the session's model
// is outside it with -32600. nil: it passes.
func (s *Seen) Check(m *jsonrpc.Message, allow policy.ModelPolicy) *policy.Refusal {
	if !allow.Restricts() {
		return nil
	}
	cur := s.p.Load()
	switch m.Method {
	case acp.SessionPrompt:
		switch {
		case cur == nil || cur.current == "": // unknown is not allowed
			return refusal(jsonrpc.CodeInvalidRequest, "the gateway could not learn which model this session runs on (the agent did not report it), and the gateway policy restricts models ("+
				listed(allow)+"); switch it to an allowed model first")
		case !allow.Allows(cur.current):
			return refusal(jsonrpc.CodeInvalidRequest, "this session runs on model "+quote(cur.current)+
				", which the gateway policy does not allow ("+listed(allow)+"); switch it to an allowed model first")
		}
	case acp.SessionSetConfigOption:
		id, _ := tag(m, acp.LabelConfigID)
		if cur != nil && cur.opts && !slices.Contains(cur.ids, id) {
			return nil // not a model option of the session's
		}
		// A model option, or the session's options are not known: its
		// value must be an allowed model (unknown is not allowed).
		f, ok := acp.Tagged(m, acp.LabelConfigValue)
		v, isStr := "", false
		if ok {
			v, isStr = m.String(f)
		}
		if !isStr {
			return refusal(jsonrpc.CodeInvalidParams, "params.value: the model option "+quote(id)+" takes a model ID (a string)")
		}
		return checkModel(v, allow)
	case acp.SessionSetModel:
		v, _ := tag(m, acp.LabelModelID)
		return checkModel(v, allow)
	}
	return nil
}

func checkModel(id string, allow policy.ModelPolicy) *policy.Refusal {
	if allow.Allows(id) {
		return nil
	}
	return refusal(jsonrpc.CodeInvalidParams, "model "+quote(id)+" is not allowed by the gateway policy ("+listed(allow)+")")
}

func refusal(code int, msg string) *policy.Refusal {
	return &policy.Refusal{Code: code, Reason: "model", Err: &policy.Error{Kind: policy.ErrNotAllowed, Msg: msg}}
}

func tag(m *jsonrpc.Message, label string) (string, bool) {
	f, ok := acp.Tagged(m, label)
	if !ok {
		return "", false
	}
	return m.String(f)
}

func listed(allow policy.ModelPolicy) string { return "policy.models.allow: " + allow.Describe() }

// quote quotes a peer's string for a message, cut to a reasonable length.
func quote(s string) string { return logx.Quote(s, 80) }

// Switch is a switch of a session's model that the gateway asks the agent
// for before it answers the request that made or loaded the session: the
// answer is held back meanwhile.
type Switch struct {
	method string // session/set_config_option or session/set_model
	params []byte
	to     string // the model switched to
	held   []byte // the answer held back
}

// Method is the switch's method.
func (sw *Switch) Method() string { return sw.method }

// Request is the switch as a line for the agent, with the gateway's id.
func (sw *Switch) Request(id int64) []byte {
	return append(jsonrpc.AppendRequest(nil, strconv.AppendInt(nil, id, 10), sw.method, sw.params), '\n')
}

// Hold keeps the answer that waits for the switch; Held gives it back.
func (sw *Switch) Hold(answer []byte) { sw.held = answer }
func (sw *Switch) Held() []byte       { return sw.held }

// Done takes the agent's answer m to the switch: on success the session
// (seen) runs on the allowed model now; an error says why it does not.
func (sw *Switch) Done(m *jsonrpc.Message, seen *Seen) error {
	if m.IsError {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(m.Payload, &e)
		return errors.New("the agent did not switch the session to the allowed model " + quote(sw.to) + ": " + quote(e.Message))
	}
	seen.note(nil, selector{}, false, sw.to)
	return nil
}

// plan is the switch a session whose selectors are opts and api needs
// (nil: none), or why it cannot have one.
func plan(opts []selector, api selector, allow policy.ModelPolicy, sid string) (*Switch, error) {
	var off []*selector // selectors on a model outside the list
	for i := range opts {
		if o := &opts[i]; o.filters() && !(o.curOK && allow.Allows(o.cur)) {
			off = append(off, o)
		}
	}
	if len(off) == 0 && api.api && len(modelOptions(opts)) == 0 && !(api.curOK && allow.Allows(api.cur)) {
		off = append(off, &api)
	}
	switch {
	case len(off) == 0:
		return nil, nil
	case len(off) > 1:
		return nil, errors.New("the agent runs the session on more than one model selector outside the gateway policy (" + listed(allow) + ")")
	}
	o := off[0]
	to, ok := o.first(allow)
	if !ok {
		return nil, errors.New("the agent offers no model that the gateway policy allows (offered: " + offered(o) + "; " + listed(allow) + ")")
	}
	sw := &Switch{to: to, method: acp.SessionSetConfigOption}
	p := append(jsonrpc.AppendQuote([]byte(`{"sessionId":`), sid), ',')
	switch {
	case o.api:
		sw.method = acp.SessionSetModel
		p = append(jsonrpc.AppendQuote(append(p, `"modelId":`...), to), '}')
	case o.v2:
		p = append(jsonrpc.AppendQuote(append(p, `"configId":`...), o.id), `,"type":"id","value":`...)
		p = append(jsonrpc.AppendQuote(p, to), '}')
	default:
		p = append(jsonrpc.AppendQuote(append(p, `"configId":`...), o.id), `,"value":`...)
		p = append(jsonrpc.AppendQuote(p, to), '}')
	}
	sw.params = p
	return sw, nil
}

// modelOptions are the config options that select a model.
func modelOptions(opts []selector) []*selector {
	var out []*selector
	for i := range opts {
		if opts[i].filters() {
			out = append(out, &opts[i])
		}
	}
	return out
}

// offered lists a selector's values for a message (at most 10).
func offered(s *selector) string {
	var vs []string
	for _, e := range s.entries {
		for _, v := range e.values() {
			if v.ok {
				vs = append(vs, quote(v.value))
			}
		}
	}
	switch {
	case len(vs) == 0:
		return "none"
	case len(vs) > 10:
		return strings.Join(vs[:10], ", ") + ", … (" + strconv.Itoa(len(vs)-10) + " more)"
	}
	return strings.Join(vs, ", ")
}

// FilterState applies the allow-list to a session's recorded selectors (a
// configOptions array and a models object, raw JSON; nil: none), as
// session/attach reports them: the same edits as [Seen.Edits], spliced.
func FilterState(configOpts, modelsObj []byte, allow policy.ModelPolicy) ([]byte, []byte) {
	if !allow.Restricts() {
		return configOpts, modelsObj
	}
	if len(configOpts) > 0 {
		l := located{opts: jsonrpc.Field{Start: 0, End: len(configOpts)}, hasOpts: true}
		if opts, _, err := l.selectors(configOpts); err == nil {
			configOpts = jsonrpc.Splice(nil, configOpts, l.filter(nil, opts, selector{}, allow))
		}
	}
	if len(modelsObj) > 0 {
		l := located{api: jsonrpc.Field{Start: 0, End: len(modelsObj)}, hasAPI: true}
		if _, api, err := l.selectors(modelsObj); err == nil && api.api {
			modelsObj = jsonrpc.Splice(nil, modelsObj, l.filter(nil, nil, api, allow))
		}
	}
	return configOpts, modelsObj
}
