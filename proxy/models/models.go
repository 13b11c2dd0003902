// Package models applies a tenant's model and mode allow-lists
// (policy.models.allow, policy.modes.allow: [Lists]) to the ACP messages
// the relay routes, as splice edits on a scanned message: the relay never
// re-encodes what it only routes. Modes are handled exactly as models are,
// by the same code: a mode is offered as a config option of category
// "mode" or in the modes object (modes: {currentModeId, availableModes:
// [{id, name}]}), switched with set_config_option or session/set_mode, and
// reported by current_mode_update.
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
//     of the policy, or an agent that switched on its own) or not known
//     (unknown is not allowed).
//   - [Seen.Choice] refuses a client's permission answer that picks an
//     option named after a mode outside the mode list (an agent that
//     switches the session into the mode picked).
//
// What a client pipelines behind a load waits for the load's answer and
// switch (package proxy, establish.go), so that Check decides on what the
// gateway has learnt of the session, never on nothing.
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

// kind is what a selector selects.
type kind uint8

const (
	kindNone kind = iota
	kindModel
	kindMode
	nKinds
)

// selecting are the kinds that select something.
var selecting = [...]kind{kindModel, kindMode}

// kindInfo names a kind's parts: its config option category, its object
// (label, members), its switch on the object's API, its setting.
type kindInfo struct {
	name                    string // "model"
	label                   string // the object's scanner label
	current, available, key string // the object's members
	method, param           string // the object API's switch
	setting                 string
}

var kinds = [nKinds]kindInfo{
	kindModel: {name: "model", label: acp.LabelModels, current: "currentModelId", available: "availableModels", key: "modelId",
		method: acp.SessionSetModel, param: "modelId", setting: "policy.models.allow"},
	kindMode: {name: "mode", label: acp.LabelModes, current: "currentModeId", available: "availableModes", key: "id",
		method: acp.SessionSetMode, param: "modeId", setting: "policy.modes.allow"},
}

func kindOfCategory(cat string) kind {
	switch cat {
	case "model":
		return kindModel
	case "mode":
		return kindMode
	}
	return kindNone
}

// Lists are the allow-lists the package applies, by kind.
type Lists struct {
	Models, Modes policy.ModelPolicy
}

// ListsOf is a policy's lists.
func ListsOf(p *policy.Policy) Lists { return Lists{Models: p.Models, Modes: p.Modes} }

// Restricts reports whether either list limits anything.
func (ls Lists) Restricts() bool { return ls.Models.Restricts() || ls.Modes.Restricts() }

func (ls Lists) of(k kind) policy.ModelPolicy {
	if k == kindMode {
		return ls.Modes
	}
	return ls.Models
}

// located is what the scanner located of a message's selectors.
type located struct {
	opts    jsonrpc.Field
	hasOpts bool
	api     [nKinds]jsonrpc.Field // the models and modes objects
	hasAPI  [nKinds]bool
	mode    jsonrpc.Field // a current_mode_update's currentModeId
	hasMode bool
}

// locate finds the selector fields among m's located fields; false: none.
func locate(m *jsonrpc.Message) (l located, any bool) {
	for _, f := range m.Fields {
		switch {
		case f.Kind == jsonrpc.FieldElement && f.Label == acp.LabelConfigOptions:
			l.opts, l.hasOpts, any = f, true, true
		case f.Kind == jsonrpc.FieldElement && f.Label == acp.LabelModels:
			l.api[kindModel], l.hasAPI[kindModel], any = f, true, true
		case f.Kind == jsonrpc.FieldElement && f.Label == acp.LabelModes:
			l.api[kindMode], l.hasAPI[kindMode], any = f, true, true
		case f.Kind == jsonrpc.FieldTag && f.Label == acp.LabelCurrentModeID:
			l.mode, l.hasMode, any = f, true, true
		}
	}
	return l, any
}

// selectors reads the located selectors: every config option (model, mode
// or neither) and the models and modes objects (apis[k].api false: none).
func (l located) selectors(raw []byte) (opts []selector, apis [nKinds]selector, err error) {
	if l.hasOpts {
		if opts, err = configOptions(raw, l.opts.Start, l.opts.End); err != nil {
			return nil, apis, err
		}
	}
	for _, k := range selecting {
		if l.hasAPI[k] {
			api, ok, err := apiObject(raw, l.api[k].Start, l.api[k].End, k)
			if err != nil {
				return opts, apis, err
			}
			if ok {
				apis[k] = api
			}
		}
	}
	return opts, apis, nil
}

// filters reports whether the selector is one the lists filter.
func (s *selector) filters(ls Lists) bool {
	return s.sel && s.kind != kindNone && ls.of(s.kind).Restricts()
}

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

// filter appends the edits that apply the lists to the located selectors.
func (l located) filter(dst []jsonrpc.Edit, opts []selector, apis [nKinds]selector, ls Lists) []jsonrpc.Edit {
	var own []jsonrpc.Edit
	if l.hasOpts {
		pos := make([][2]int, len(opts))
		drop := make([]bool, len(opts))
		for i := range opts {
			pos[i] = opts[i].elem
			if !opts[i].filters(ls) {
				continue
			}
			allow := ls.of(opts[i].kind)
			if first, ok := opts[i].first(allow); ok {
				own = opts[i].edits(own, allow, first)
			} else {
				drop[i] = true // no allowed value: the selector goes
			}
		}
		own = jsonrpc.DeleteElements(own, pos, func(i int) bool { return drop[i] })
	}
	for _, k := range selecting {
		api := &apis[k]
		if !api.api || !api.filters(ls) {
			continue
		}
		if first, ok := api.first(ls.of(k)); ok {
			own = api.edits(own, ls.of(k), first)
		} else {
			own = append(own, jsonrpc.Edit{Start: api.elem[0], End: api.elem[1], Repl: []byte("null")})
		}
	}
	slices.SortFunc(own, func(a, b jsonrpc.Edit) int { return a.Start - b.Start })
	return append(dst, own...)
}

// Seen is what the gateway last saw of one session's selectors: the IDs
// of its model and mode config options and its current model and mode. The
// agent's reader writes it, a client's reader reads it; the zero value has
// seen nothing.
type Seen struct {
	p atomic.Pointer[seen]
}

type seen struct {
	opts    bool             // the session's config options are known
	ids     [nKinds][]string // config options by kind (kindNone: neither)
	current [nKinds]string   // what the session runs on ("": not known)
	offered [nKinds][]string // the values its selectors offer (at most maxOffered a kind)
}

// maxOffered bounds the values of a kind a session's record keeps.
const maxOffered = 256

// note records the selectors of a message; mode is a current_mode_update's
// mode ("": none).
func (s *Seen) note(opts []selector, apis [nKinds]selector, hasOpts bool, mode string) {
	next := seen{}
	if old := s.p.Load(); old != nil {
		next = *old
	}
	if hasOpts {
		next.opts, next.ids, next.current, next.offered = true, [nKinds][]string{}, [nKinds]string{}, [nKinds][]string{}
		for _, o := range opts {
			if o.kind != kindNone && o.id != "" {
				next.ids[o.kind] = append(next.ids[o.kind], o.id)
				if next.current[o.kind] == "" && o.sel && o.curOK {
					next.current[o.kind] = o.cur
				}
				next.offered[o.kind] = o.appendValues(next.offered[o.kind])
			}
		}
	}
	for _, k := range selecting {
		api := apis[k]
		if !api.api {
			continue
		}
		if len(next.ids[k]) == 0 && api.curOK {
			next.current[k] = api.cur
		}
		if !hasOpts {
			next.offered[k] = nil
		}
		next.offered[k] = api.appendValues(next.offered[k])
	}
	if mode != "" {
		next.current[kindMode] = mode
	}
	s.p.Store(&next)
}

// appendValues appends the values s offers to vs, up to maxOffered.
func (s *selector) appendValues(vs []string) []string {
	for _, e := range s.entries {
		for _, v := range e.values() {
			if v.ok && len(vs) < maxOffered && !slices.Contains(vs, v.value) {
				vs = append(vs, v.value)
			}
		}
	}
	return vs
}

// Choice checks a client's answer to one of the session's permission
// requests that picks the option optionID. An agent that names an option
// after one of the session's modes switches the session into it when it is
// picked (claude-code-acp's "Always Allow" is "acceptEdits"): outside the
// mode list, such an answer is refused. nil: it passes.
func (s *Seen) Choice(optionID string, ls Lists) *policy.Refusal {
	cur := s.p.Load()
	if !ls.Modes.Restricts() || cur == nil || ls.Modes.Allows(optionID) || !slices.Contains(cur.offered[kindMode], optionID) {
		return nil
	}
	return refusal(jsonrpc.CodeInvalidParams, kindMode, "the permission option "+quote(optionID)+" switches the session to that mode, which the gateway policy does not allow ("+
		listed(kindMode, ls.Modes)+")")
}

// switched records that the session runs on to (of kind k) now.
func (s *Seen) switched(k kind, to string) {
	for {
		old := s.p.Load()
		next := seen{}
		if old != nil {
			next = *old
		}
		next.current[k] = to
		if s.p.CompareAndSwap(old, &next) {
			return
		}
	}
}

// Edits appends to edits those that apply the lists to the selectors m,
// a session/update, carries, and notes them as the session's (a
// config_option_update's options, a current_mode_update's mode). A message
// without selectors costs one pass over its located fields; one that does
// not parse is left as it is (the scanner has validated it: only a shape
// the schema does not allow).
func (s *Seen) Edits(m *jsonrpc.Message, ls Lists, edits []jsonrpc.Edit) []jsonrpc.Edit {
	edits, _, _ = s.Answer(m, ls, false, "", edits)
	return edits
}

// Answer is Edits for an agent's answer about the session. When the
// answer made or loaded the session (establishes; sid is the agent's ID
// of it) and leaves it on a model or mode outside its list, it also
// returns the switch to make before the client gets the answer ([Switch];
// a model's, then a mode's), or an error when the agent offers no allowed
// one (the session is refused).
func (s *Seen) Answer(m *jsonrpc.Message, ls Lists, establishes bool, sid string, edits []jsonrpc.Edit) ([]jsonrpc.Edit, *Switch, error) {
	if m.IsError {
		return edits, nil, nil
	}
	l, any := locate(m)
	if !any {
		return edits, nil, nil
	}
	opts, apis, err := l.selectors(m.Raw)
	if err != nil {
		return edits, nil, nil
	}
	mode := ""
	if l.hasMode {
		if v, ok := m.String(l.mode); ok {
			mode = v
		}
	}
	s.note(opts, apis, l.hasOpts, mode)
	if !ls.Restricts() {
		return edits, nil, nil
	}
	var sw *Switch
	if establishes {
		for i := len(selecting) - 1; i >= 0; i-- { // the model's first
			k := selecting[i]
			if !ls.of(k).Restricts() {
				continue
			}
			next, err := plan(opts, apis[k], k, ls.of(k), sid)
			if err != nil {
				return edits, nil, err
			}
			if next != nil {
				next.next, sw = sw, next
			}
		}
	}
	return l.filter(edits, opts, apis, ls), sw, nil
}

// Check applies the lists to a client message about the session (scanned
// with acp.ClientSpec): a session/set_config_option of one of the
// session's model or mode options, a session/set_model or a
// session/set_mode, to a value outside its list is refused with -32602; a
// session/prompt while the session's model or mode is outside its list, or
// not known, with -32600. Unknown is not allowed: while the session's
// options are not known, a set_config_option's value must be one every
// restricting list allows. nil: it passes.
func (s *Seen) Check(m *jsonrpc.Message, ls Lists) *policy.Refusal {
	if !ls.Restricts() {
		return nil
	}
	cur := s.p.Load()
	if cur == nil {
		cur = &seen{}
	}
	switch m.Method {
	case acp.SessionPrompt:
		for _, k := range selecting {
			allow, o := ls.of(k), kinds[k]
			switch {
			case !allow.Restricts():
			case cur.current[k] == "":
				return refusal(jsonrpc.CodeInvalidRequest, k, "the gateway could not learn which "+o.name+" this session runs on (the agent did not report it), and the gateway policy restricts "+
					o.name+"s ("+listed(k, allow)+"); switch it to an allowed "+o.name+" first")
			case !allow.Allows(cur.current[k]):
				return refusal(jsonrpc.CodeInvalidRequest, k, "this session runs on "+o.name+" "+quote(cur.current[k])+
					", which the gateway policy does not allow ("+listed(k, allow)+"); switch it to an allowed "+o.name+" first")
			}
		}
	case acp.SessionSetConfigOption:
		id, _ := tag(m, acp.LabelConfigID)
		which := selecting[:]
		if cur.opts {
			which = nil
			for _, k := range selecting {
				if slices.Contains(cur.ids[k], id) {
					which = append(which, k)
				}
			}
		}
		for _, k := range which {
			if !ls.of(k).Restricts() {
				continue
			}
			f, ok := acp.Tagged(m, acp.LabelConfigValue)
			v, isStr := "", false
			if ok {
				v, isStr = m.String(f)
			}
			if !isStr {
				return refusal(jsonrpc.CodeInvalidParams, k, "params.value: the "+kinds[k].name+" option "+quote(id)+" takes a "+kinds[k].name+" ID (a string)")
			}
			if r := check(k, v, ls.of(k)); r != nil {
				return r
			}
		}
	case acp.SessionSetModel:
		v, _ := tag(m, acp.LabelModelID)
		return check(kindModel, v, ls.Models)
	case acp.SessionSetMode:
		v, _ := tag(m, acp.LabelModeID)
		return check(kindMode, v, ls.Modes)
	}
	return nil
}

func check(k kind, id string, allow policy.ModelPolicy) *policy.Refusal {
	if allow.Allows(id) {
		return nil
	}
	return refusal(jsonrpc.CodeInvalidParams, k, kinds[k].name+" "+quote(id)+" is not allowed by the gateway policy ("+listed(k, allow)+")")
}

func refusal(code int, k kind, msg string) *policy.Refusal {
	return &policy.Refusal{Code: code, Reason: kinds[k].name, Err: &policy.Error{Kind: policy.ErrNotAllowed, Msg: msg}}
}

func tag(m *jsonrpc.Message, label string) (string, bool) {
	f, ok := acp.Tagged(m, label)
	if !ok {
		return "", false
	}
	return m.String(f)
}

func listed(k kind, allow policy.ModelPolicy) string {
	return kinds[k].setting + ": " + allow.Describe()
}

// quote quotes a peer's string for a message, cut to a reasonable length.
func quote(s string) string { return logx.Quote(s, 80) }

// Switch is a switch of a session's model or mode that the gateway asks
// the agent for before it answers the request that made or loaded the
// session: the answer is held back meanwhile.
type Switch struct {
	kind   kind
	method string // session/set_config_option, session/set_model or session/set_mode
	params []byte
	to     string  // the value switched to
	held   []byte  // the answer held back
	next   *Switch // the switch to make after this one (a mode's after a model's)
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

// Next is the switch to make once this one is done (nil: none), holding
// the same answer.
func (sw *Switch) Next() *Switch {
	if sw.next != nil {
		sw.next.held = sw.held
	}
	return sw.next
}

// Done takes the agent's answer m to the switch: on success the session
// (seen) runs on the allowed value now; an error says why it does not.
func (sw *Switch) Done(m *jsonrpc.Message, seen *Seen) error {
	if m.IsError {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(m.Payload, &e)
		return errors.New("the agent did not switch the session to the allowed " + kinds[sw.kind].name + " " + quote(sw.to) + ": " + quote(e.Message))
	}
	seen.switched(sw.kind, sw.to)
	return nil
}

// plan is the switch of kind k a session whose selectors are opts and api
// needs (nil: none), or why it cannot have one.
func plan(opts []selector, api selector, k kind, allow policy.ModelPolicy, sid string) (*Switch, error) {
	ls := Lists{}
	if k == kindMode {
		ls.Modes = allow
	} else {
		ls.Models = allow
	}
	var off []*selector // selectors on a value outside the list
	for i := range opts {
		if o := &opts[i]; o.kind == k && o.filters(ls) && !(o.curOK && allow.Allows(o.cur)) {
			off = append(off, o)
		}
	}
	if len(off) == 0 && api.api && len(optionsOf(opts, k, ls)) == 0 && !(api.curOK && allow.Allows(api.cur)) {
		off = append(off, &api)
	}
	o := kinds[k]
	switch {
	case len(off) == 0:
		return nil, nil
	case len(off) > 1:
		return nil, errors.New("the agent runs the session on more than one " + o.name + " selector outside the gateway policy (" + listed(k, allow) + ")")
	}
	sel := off[0]
	to, ok := sel.first(allow)
	if !ok {
		return nil, errors.New("the agent offers no " + o.name + " that the gateway policy allows (offered: " + offered(sel) + "; " + listed(k, allow) + ")")
	}
	sw := &Switch{kind: k, to: to, method: acp.SessionSetConfigOption}
	p := append(jsonrpc.AppendQuote([]byte(`{"sessionId":`), sid), ',')
	switch {
	case sel.api:
		sw.method = o.method
		p = append(jsonrpc.AppendQuote(append(p, `"`+o.param+`":`...), to), '}')
	case sel.v2:
		p = append(jsonrpc.AppendQuote(append(p, `"configId":`...), sel.id), `,"type":"id","value":`...)
		p = append(jsonrpc.AppendQuote(p, to), '}')
	default:
		p = append(jsonrpc.AppendQuote(append(p, `"configId":`...), sel.id), `,"value":`...)
		p = append(jsonrpc.AppendQuote(p, to), '}')
	}
	sw.params = p
	return sw, nil
}

// optionsOf are the config options that select a value of kind k.
func optionsOf(opts []selector, k kind, ls Lists) []*selector {
	var out []*selector
	for i := range opts {
		if opts[i].kind == k && opts[i].filters(ls) {
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

// FilterState applies the lists to a session's recorded selectors (a
// configOptions array, a models object and a modes object, raw JSON; nil:
// none), as session/attach reports them: the same edits as [Seen.Edits],
// spliced.
func FilterState(configOpts, modelsObj, modesObj []byte, ls Lists) ([]byte, []byte, []byte) {
	if !ls.Restricts() {
		return configOpts, modelsObj, modesObj
	}
	if len(configOpts) > 0 {
		l := located{opts: jsonrpc.Field{Start: 0, End: len(configOpts)}, hasOpts: true}
		if opts, _, err := l.selectors(configOpts); err == nil {
			configOpts = jsonrpc.Splice(nil, configOpts, l.filter(nil, opts, [nKinds]selector{}, ls))
		}
	}
	obj := func(raw []byte, k kind) []byte {
		if len(raw) == 0 {
			return raw
		}
		l := located{}
		l.api[k], l.hasAPI[k] = jsonrpc.Field{Start: 0, End: len(raw)}, true
		if _, apis, err := l.selectors(raw); err == nil && apis[k].api {
			return jsonrpc.Splice(nil, raw, l.filter(nil, nil, apis, ls))
		}
		return raw
	}
	return configOpts, obj(modelsObj, kindModel), obj(modesObj, kindMode)
}
