package models

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/policy"
)

var sonnet = Lists{Models: policy.ModelPolicy{Allow: []string{"claude-sonnet-*"}}}

// scanResult scans an agent's answer to method as the relay does.
func scanResult(t testing.TB, method, raw string) *jsonrpc.Message {
	t.Helper()
	var sc jsonrpc.Scanner
	m := &jsonrpc.Message{}
	if err := sc.Scan([]byte(raw), m, func(m *jsonrpc.Message) *jsonrpc.Spec { return acp.ResultSpec(method, m.IsError, false) }); err != nil {
		t.Fatal(err)
	}
	return m
}

// scanParams scans a request or notification as the relay does (agent
// output with or without paths; client messages with acp.ClientSpec).
func scanParams(t testing.TB, raw string, resolve jsonrpc.Resolver) *jsonrpc.Message {
	t.Helper()
	var sc jsonrpc.Scanner
	m := &jsonrpc.Message{}
	if err := sc.Scan([]byte(raw), m, resolve); err != nil {
		t.Fatal(err)
	}
	return m
}

func agentSpec(paths bool) jsonrpc.Resolver {
	return func(m *jsonrpc.Message) *jsonrpc.Spec { return acp.ParamsSpec(m.Method, paths) }
}

func apply(m *jsonrpc.Message, edits []jsonrpc.Edit) string {
	jsonrpc.SortEdits(edits)
	return string(jsonrpc.Splice(nil, m.Raw, edits))
}

// values lists a result's model values: the options of its model config
// options and its availableModels, with the current values.
type shown struct {
	ConfigOptions []struct {
		ID           string            `json:"id"`
		ConfigID     string            `json:"configId"`
		Category     string            `json:"category"`
		CurrentValue string            `json:"currentValue"`
		Options      []json.RawMessage `json:"options"`
	} `json:"configOptions"`
	Models *struct {
		CurrentModelID  string `json:"currentModelId"`
		AvailableModels []struct {
			ModelID string `json:"modelId"`
		} `json:"availableModels"`
	} `json:"models"`
}

func parseShown(t *testing.T, out string, inResult bool) shown {
	t.Helper()
	var env struct {
		Result shown `json:"result"`
		Params struct {
			Update shown `json:"update"`
		} `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &env); err != nil {
		t.Fatalf("invalid JSON after the edits: %v\n%s", err, out)
	}
	if inResult {
		return env.Result
	}
	return env.Params.Update
}

// optionValues flattens options (values, or groups of them).
func optionValues(t *testing.T, opts []json.RawMessage) []string {
	t.Helper()
	var out []string
	for _, o := range opts {
		var e struct {
			Value   *string `json:"value"`
			Options []struct {
				Value string `json:"value"`
			} `json:"options"`
		}
		if err := json.Unmarshal(o, &e); err != nil {
			t.Fatal(err)
		}
		if e.Value != nil {
			out = append(out, *e.Value)
		}
		for _, v := range e.Options {
			out = append(out, v.Value)
		}
	}
	return out
}

const newResultV1 = `{"jsonrpc":"2.0","id":7,"result":{"sessionId":"s1","unknown":{"keep":[1,2]},` +
	`"configOptions":[` +
	`{"id":"mode","name":"Mode","category":"mode","type":"select","currentValue":"ask","options":[{"value":"ask","name":"Ask"},{"value":"code","name":"Code"}]},` +
	`{"id":"model","name":"Model","category":"model","type":"select","currentValue":"claude-opus-4","options":[` +
	`{"value":"claude-opus-4","name":"Opus","_meta":{"x":1}},{"value":"claude-sonnet-4","name":"Sonnet"},{"value":"claude-haiku-3","name":"Haiku"},{"value":"claude-sonnet-4-5","name":"Sonnet 4.5"}],"_meta":{"m":true}}],` +
	`"models":{"currentModelId":"claude-opus-4","availableModels":[{"modelId":"claude-opus-4","name":"Opus"},{"modelId":"claude-sonnet-4","name":"Sonnet"}],"_meta":{"k":"v"}},` +
	`"_meta":{"vendor":{"a":"b"}}}}`

// Both shapes of v1 in a session/new result: the values outside the list
// go, the current ones become the first allowed, and every other byte
// passes as it was.
func TestEditsNewResultV1(t *testing.T) {
	m := scanResult(t, acp.SessionNew, newResultV1)
	var seen Seen
	out := apply(m, seen.Edits(m, sonnet, nil))
	got := parseShown(t, out, true)
	if len(got.ConfigOptions) != 2 {
		t.Fatalf("configOptions: %s", out)
	}
	mode, model := got.ConfigOptions[0], got.ConfigOptions[1]
	if v := optionValues(t, mode.Options); strings.Join(v, ",") != "ask,code" || mode.CurrentValue != "ask" {
		t.Errorf("the mode option changed: %s", out)
	}
	if v := optionValues(t, model.Options); strings.Join(v, ",") != "claude-sonnet-4,claude-sonnet-4-5" {
		t.Errorf("model options %v: %s", v, out)
	}
	if model.CurrentValue != "claude-sonnet-4" {
		t.Errorf("currentValue %q", model.CurrentValue)
	}
	if got.Models == nil || got.Models.CurrentModelID != "claude-sonnet-4" || len(got.Models.AvailableModels) != 1 || got.Models.AvailableModels[0].ModelID != "claude-sonnet-4" {
		t.Errorf("models: %s", out)
	}
	for _, keep := range []string{`"unknown":{"keep":[1,2]}`, `"_meta":{"vendor":{"a":"b"}}`, `"_meta":{"m":true}`, `"_meta":{"k":"v"}`,
		`{"id":"mode","name":"Mode","category":"mode","type":"select","currentValue":"ask","options":[{"value":"ask","name":"Ask"},{"value":"code","name":"Code"}]}`} {
		if !strings.Contains(out, keep) {
			t.Errorf("%s did not pass as it was: %s", keep, out)
		}
	}
	// What the session's selectors are: the model option's ID and its
	// (agent's) current model.
	if s := seen.p.Load(); s == nil || len(s.ids[kindModel]) != 1 || s.ids[kindModel][0] != "model" || s.current[kindModel] != "claude-opus-4" {
		t.Errorf("seen: %+v", s)
	}
	// No list: nothing changes, the selectors are still noted.
	var all Seen
	if e := all.Edits(m, Lists{}, nil); len(e) != 0 || all.p.Load() == nil {
		t.Errorf("no list: %d edits", len(e))
	}
}

// The v2 draft's shape: configId, grouped options under groupId, in a
// config_option_update (with and without path mapping's spec); a group
// left empty goes; an option left empty goes.
func TestEditsUpdateV2Grouped(t *testing.T) {
	const upd = `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"config_option_update","configOptions":[` +
		`{"configId":"model","name":"Model","category":"model","type":"select","currentValue":"claude-sonnet-4","options":[` +
		`{"groupId":"opus","name":"Opus","options":[{"value":"claude-opus-4","name":"Opus 4"},{"value":"claude-opus-4-1","name":"Opus 4.1"}]},` +
		`{"groupId":"sonnet","name":"Sonnet","options":[{"value":"claude-opus-x","name":"odd"},{"value":"claude-sonnet-4","name":"Sonnet 4"}],"_meta":{"g":1}}]},` +
		`{"configId":"fast","name":"Fast model","category":"model","type":"select","currentValue":"gpt-4o","options":[{"value":"gpt-4o","name":"4o"}]},` +
		`{"configId":"effort","name":"Effort","category":"thought_level","type":"select","currentValue":"high","options":[{"value":"high","name":"High"}]}]}}}`
	for _, paths := range []bool{false, true} {
		m := scanParams(t, upd, agentSpec(paths))
		var seen Seen
		out := apply(m, seen.Edits(m, sonnet, nil))
		got := parseShown(t, out, false)
		if len(got.ConfigOptions) != 2 || got.ConfigOptions[0].ConfigID != "model" || got.ConfigOptions[1].ConfigID != "effort" {
			t.Fatalf("paths %v: %s", paths, out)
		}
		if v := optionValues(t, got.ConfigOptions[0].Options); strings.Join(v, ",") != "claude-sonnet-4" {
			t.Errorf("paths %v: model values %v: %s", paths, v, out)
		}
		if !strings.Contains(out, `{"groupId":"sonnet","name":"Sonnet","options":[{"value":"claude-sonnet-4","name":"Sonnet 4"}],"_meta":{"g":1}}`) {
			t.Errorf("paths %v: the kept group: %s", paths, out)
		}
		if s := seen.p.Load(); s == nil || strings.Join(s.ids[kindModel], ",") != "model,fast" || s.current[kindModel] != "claude-sonnet-4" {
			t.Errorf("seen %+v", s)
		}
	}
}

// Every selector empty: the array is emptied and the models object is
// null.
func TestEditsNoneAllowed(t *testing.T) {
	m := scanResult(t, acp.SessionLoad, `{"jsonrpc":"2.0","id":1,"result":{"configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"a","options":[{"value":"a","name":"A"}]}],"models":{"currentModelId":"a","availableModels":[{"modelId":"a","name":"A"}]}}}`)
	var seen Seen
	out := apply(m, seen.Edits(m, Lists{Models: policy.ModelPolicy{Allow: []string{}}}, nil))
	if out != `{"jsonrpc":"2.0","id":1,"result":{"configOptions":[],"models":null}}` {
		t.Errorf("got %s", out)
	}
}

// Without selectors: no edits, no decoding.
func TestEditsWithout(t *testing.T) {
	m := scanParams(t, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"configOptions models"}}}}`, agentSpec(false))
	var seen Seen
	if e := seen.Edits(m, sonnet, nil); len(e) != 0 || seen.p.Load() != nil {
		t.Errorf("%d edits", len(e))
	}
	if n := testing.AllocsPerRun(100, func() { seen.Edits(m, sonnet, nil) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// planFor runs Seen.Answer for an answer that made or loaded session sid.
func planFor(t *testing.T, m *jsonrpc.Message, allow Lists, sid string) (*Switch, error) {
	t.Helper()
	var seen Seen
	_, sw, err := seen.Answer(m, allow, true, sid, nil)
	return sw, err
}

func TestAnswerSwitch(t *testing.T) {
	t.Run("config option v1", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, newResultV1)
		var seen Seen
		edits, sw, err := seen.Answer(m, sonnet, true, "s1", nil)
		if err != nil || sw == nil {
			t.Fatalf("%v %v", sw, err)
		}
		if got := string(sw.Request(42)); got != `{"jsonrpc":"2.0","id":42,"method":"session/set_config_option","params":{"sessionId":"s1","configId":"model","value":"claude-sonnet-4"}}`+"\n" {
			t.Errorf("request %s", got)
		}
		// The answer the client gets says the model switched to; until the
		// switch is done the session is known to be on opus: its prompts
		// are refused.
		out := apply(m, edits)
		if got := parseShown(t, out, true); got.ConfigOptions[1].CurrentValue != "claude-sonnet-4" {
			t.Errorf("answer: %s", out)
		}
		prompt := scanParams(t, `{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}`, acp.ClientSpec)
		if seen.Check(prompt, sonnet) == nil {
			t.Error("a prompt passed while the session is on opus")
		}
		sw.Hold([]byte(out))
		done := scanResult(t, acp.SessionSetConfigOption, `{"jsonrpc":"2.0","id":42,"result":{"configOptions":[]}}`)
		if err := sw.Done(done, &seen); err != nil || string(sw.Held()) != out {
			t.Fatalf("done: %v", err)
		}
		if r := seen.Check(prompt, sonnet); r != nil || seen.p.Load().current[kindModel] != "claude-sonnet-4" {
			t.Errorf("after the switch: %v", r)
		}
		// A refused switch says why.
		bad := scanResult(t, acp.SessionSetConfigOption, `{"jsonrpc":"2.0","id":42,"error":{"code":-32602,"message":"no such model"}}`)
		if err := sw.Done(bad, &seen); err == nil || !strings.Contains(err.Error(), `"no such model"`) || !strings.Contains(err.Error(), `"claude-sonnet-4"`) {
			t.Errorf("refused switch: %v", err)
		}
		// Not a session-making answer (a set_config_option result): no switch.
		if _, sw, err := seen.Answer(m, sonnet, false, "s1", nil); sw != nil || err != nil {
			t.Errorf("%v %v", sw, err)
		}
	})
	t.Run("config option v2", func(t *testing.T) {
		m := scanResult(t, acp.SessionLoad, `{"jsonrpc":"2.0","id":1,"result":{"configOptions":[{"configId":"m","name":"M","category":"model","type":"select","currentValue":"x","options":[{"groupId":"g","name":"G","options":[{"value":"x","name":"X"},{"value":"claude-sonnet-9","name":"S"}]}]}]}}`)
		sw, err := planFor(t, m, sonnet, "loaded")
		if err != nil || sw == nil {
			t.Fatal(err)
		}
		if got := string(sw.Request(1)); !strings.Contains(got, `"params":{"sessionId":"loaded","configId":"m","type":"id","value":"claude-sonnet-9"}`) {
			t.Errorf("request %s", got)
		}
	})
	t.Run("models API", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","models":{"currentModelId":"opus","availableModels":[{"modelId":"opus","name":"O"},{"modelId":"claude-sonnet-4","name":"S"}]}}}`)
		sw, err := planFor(t, m, sonnet, "n")
		if err != nil || sw == nil || sw.Method() != acp.SessionSetModel || !strings.Contains(string(sw.Request(3)), `"method":"session/set_model","params":{"sessionId":"n","modelId":"claude-sonnet-4"}`) {
			t.Fatalf("%v %v", sw, err)
		}
	})
	t.Run("allowed already", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"claude-sonnet-4","options":[{"value":"opus","name":"O"},{"value":"claude-sonnet-4","name":"S"}]}],"models":{"currentModelId":"opus","availableModels":[]}}}`)
		if sw, err := planFor(t, m, sonnet, "n"); sw != nil || err != nil {
			t.Errorf("%v %v", sw, err)
		}
	})
	t.Run("none allowed", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"opus","options":[{"value":"opus","name":"O"},{"value":"haiku","name":"H"}]}]}}`)
		sw, err := planFor(t, m, sonnet, "n")
		if err == nil || !strings.Contains(err.Error(), `offered: "opus", "haiku"; policy.models.allow: "claude-sonnet-*"`) || sw != nil {
			t.Errorf("%v %v", sw, err)
		}
	})
	t.Run("no selectors, an error, no list", func(t *testing.T) {
		for _, raw := range []string{`{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n"}}`, `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}`} {
			if sw, err := planFor(t, scanResult(t, acp.SessionNew, raw), sonnet, "n"); sw != nil || err != nil {
				t.Errorf("%s: %v %v", raw, sw, err)
			}
		}
		if sw, err := planFor(t, scanResult(t, acp.SessionNew, newResultV1), Lists{}, "n"); sw != nil || err != nil {
			t.Errorf("no list: %v %v", sw, err)
		}
	})
}

func TestCheck(t *testing.T) {
	var seen Seen
	seen.note([]selector{{id: "model", kind: kindModel, sel: true, cur: "claude-sonnet-4", curOK: true}}, [nKinds]selector{}, true, "")
	client := func(raw string) *jsonrpc.Message { return scanParams(t, raw, acp.ClientSpec) }
	for _, c := range []struct {
		raw  string
		code int // 0: passes
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"model","value":"claude-opus-4"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"m\u006fdel","type":"id","value":"claude-\u006fpus-4"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"model","value":"claude-sonnet-4-5"}}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"model","type":"boolean","value":true}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"mode","value":"claude-opus-4"}}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_model","params":{"sessionId":"s","modelId":"claude-opus-4"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_model","params":{"sessionId":"s","modelId":"claude-sonnet-4"}}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_model","params":{"sessionId":"s","modelId":"*"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}`, 0},
	} {
		r := seen.Check(client(c.raw), sonnet)
		switch {
		case c.code == 0 && r != nil:
			t.Errorf("%s refused: %v", c.raw, r.Err)
		case c.code != 0 && (r == nil || r.Code != c.code):
			t.Errorf("%s: %+v, want %d", c.raw, r, c.code)
		case r != nil && c.code == -32602 && strings.Contains(c.raw, "opus") && !strings.Contains(r.Err.Error(), `model "claude-opus-4" is not allowed by the gateway policy (policy.models.allow: "claude-sonnet-*")`):
			t.Errorf("message: %v", r.Err)
		}
	}
	// A session on a model outside the list (a reload narrowed it): its
	// prompts are refused; no list: everything passes.
	seen.note(nil, [nKinds]selector{kindModel: {api: true, kind: kindModel, cur: "claude-opus-4", curOK: true}}, false, "")
	prompt := client(`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}`)
	if r := seen.Check(prompt, sonnet); r != nil {
		t.Errorf("the model option's current value decides, not the models API's: %v", r.Err)
	}
	var other Seen
	other.note(nil, [nKinds]selector{kindModel: {api: true, kind: kindModel, cur: "claude-opus-4", curOK: true}}, false, "")
	if r := other.Check(prompt, sonnet); r == nil || r.Code != jsonrpc.CodeInvalidRequest || !strings.Contains(r.Err.Error(), `runs on model "claude-opus-4"`) {
		t.Errorf("prompt on a disallowed model: %+v", r)
	}
	if r := other.Check(prompt, Lists{}); r != nil {
		t.Errorf("no list: %v", r.Err)
	}

	// Unknown is not allowed: a session whose model the gateway has not
	// learnt (nothing seen, or selectors without a current model) runs no
	// turn; a switch to an allowed model passes, to another is refused,
	// whatever option it names while the session's options are unknown.
	var none, noCurrent Seen
	noCurrent.note([]selector{{id: "model", kind: kindModel, sel: true}}, [nKinds]selector{}, true, "")
	for _, s := range []*Seen{&none, &noCurrent} {
		if r := s.Check(prompt, sonnet); r == nil || r.Code != jsonrpc.CodeInvalidRequest || !strings.Contains(r.Err.Error(), "the gateway could not learn which model this session runs on") {
			t.Errorf("prompt with no known model: %+v", r)
		}
		if r := s.Check(prompt, Lists{}); r != nil {
			t.Errorf("no list, no known model: %v", r.Err)
		}
		if r := s.Check(client(`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"model","value":"claude-sonnet-4"}}`), sonnet); r != nil {
			t.Errorf("allowed switch with no known model: %v", r.Err)
		}
		if r := s.Check(client(`{"jsonrpc":"2.0","id":1,"method":"session/set_model","params":{"sessionId":"s","modelId":"claude-opus-4"}}`), sonnet); r == nil || r.Code != jsonrpc.CodeInvalidParams {
			t.Errorf("forbidden set_model with no known model: %+v", r)
		}
	}
	if r := none.Check(client(`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"other","value":"claude-opus-4"}}`), sonnet); r == nil || r.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("an option of a session whose options are unknown, to a forbidden model: %+v", r)
	}
}

// Hostile: model IDs made of glob metacharacters are text, never
// patterns; duplicate IDs all go or all stay; a huge options list is
// filtered in one pass.
func TestEditsHostile(t *testing.T) {
	t.Run("metacharacters", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"claude-sonnet-4","options":[{"value":"*","name":"star"},{"value":"claude-sonnet-?","name":"q"},{"value":"[a-z]*","name":"class"},{"value":"claude-sonnet-4","name":"S"},{"value":"claude-sonnet-\u002a","name":"escaped star"}]}]}}`)
		var seen Seen
		out := apply(m, seen.Edits(m, sonnet, nil))
		got := parseShown(t, out, true)
		if v := optionValues(t, got.ConfigOptions[0].Options); strings.Join(v, "|") != "claude-sonnet-?|claude-sonnet-4|claude-sonnet-*" {
			t.Errorf("values %q", v)
		}
		// "claude-sonnet-?" as a pattern does not let "claude-sonnet-*"'s
		// text through as a pattern either.
		if (policy.ModelPolicy{Allow: []string{"claude-sonnet-?"}}).Allows("claude-sonnet-xx") {
			t.Error("? matched two characters")
		}
	})
	t.Run("duplicates", func(t *testing.T) {
		m := scanResult(t, acp.SessionNew, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"claude-sonnet-4","options":[{"value":"opus","name":"O"},{"value":"claude-sonnet-4","name":"S"},{"value":"opus","name":"O again"},{"value":"claude-sonnet-4","name":"S again"}]},{"id":"model","name":"M2","category":"model","type":"select","currentValue":"opus","options":[{"value":"opus","name":"O"}]}]}}`)
		var seen Seen
		out := apply(m, seen.Edits(m, sonnet, nil))
		got := parseShown(t, out, true)
		if len(got.ConfigOptions) != 1 || strings.Join(optionValues(t, got.ConfigOptions[0].Options), ",") != "claude-sonnet-4,claude-sonnet-4" {
			t.Errorf("got %s", out)
		}
		// Two options with one ID: a switch of it is checked.
		client := scanParams(t, `{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"model","value":"opus"}}`, acp.ClientSpec)
		if r := seen.Check(client, sonnet); r == nil {
			t.Error("passed")
		}
		// A session/new on two selectors outside the list is refused.
		if _, err := planFor(t, m, sonnet, "n"); err == nil {
			t.Error("two selectors to switch: not refused")
		}
		// A message with a duplicate member never gets here: the scanner
		// rejects it.
		var sc jsonrpc.Scanner
		var dm jsonrpc.Message
		if sc.Scan([]byte(`{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","currentValue":"a","currentValue":"b"}]}}`), &dm, func(*jsonrpc.Message) *jsonrpc.Spec { return acp.ResultSpec(acp.SessionNew, false, false) }) == nil {
			t.Error("a duplicate member was scanned")
		}
	})
	t.Run("huge list", func(t *testing.T) {
		const n = 50_000
		var b strings.Builder
		b.WriteString(`{"jsonrpc":"2.0","id":1,"result":{"sessionId":"n","configOptions":[{"id":"model","name":"M","category":"model","type":"select","currentValue":"m-0","options":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			id := fmt.Sprintf("m-%d", i)
			if i%1000 == 999 {
				id = fmt.Sprintf("claude-sonnet-%d", i)
			}
			fmt.Fprintf(&b, `{"value":%q,"name":"n"}`, id)
		}
		b.WriteString(`]}]}}`)
		m := scanResult(t, acp.SessionNew, b.String())
		start := time.Now()
		var seen Seen
		edits := seen.Edits(m, sonnet, nil)
		out := apply(m, edits)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("took %s", d)
		}
		got := parseShown(t, out, true)
		if v := optionValues(t, got.ConfigOptions[0].Options); len(v) != n/1000 || got.ConfigOptions[0].CurrentValue != "claude-sonnet-999" {
			t.Errorf("%d values, current %q", len(v), got.ConfigOptions[0].CurrentValue)
		}
		sw, err := planFor(t, m, sonnet, "n")
		if err != nil || !strings.Contains(string(sw.Request(1)), `"value":"claude-sonnet-999"`) {
			t.Errorf("plan: %v", err)
		}
		// Refused with none allowed: the message lists only the first ten.
		if _, err := planFor(t, m, Lists{Models: policy.ModelPolicy{Allow: []string{"gpt-*"}}}, "n"); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("(%d more)", n-10)) {
			t.Errorf("refusal: %v", err)
		}
	})
}

func TestFilterState(t *testing.T) {
	opts := []byte(`[{"id":"model","name":"M","category":"model","type":"select","currentValue":"opus","options":[{"value":"opus","name":"O"},{"value":"claude-sonnet-4","name":"S"}]}]`)
	mods := []byte(`{"currentModelId":"opus","availableModels":[{"modelId":"opus","name":"O"},{"modelId":"claude-sonnet-4","name":"S"}]}`)
	o, md, _ := FilterState(opts, mods, nil, sonnet)
	if string(o) != `[{"id":"model","name":"M","category":"model","type":"select","currentValue":"claude-sonnet-4","options":[{"value":"claude-sonnet-4","name":"S"}]}]` {
		t.Errorf("options %s", o)
	}
	if string(md) != `{"currentModelId":"claude-sonnet-4","availableModels":[{"modelId":"claude-sonnet-4","name":"S"}]}` {
		t.Errorf("models %s", md)
	}
	if o, md, _ := FilterState(nil, nil, nil, sonnet); o != nil || md != nil {
		t.Error("nothing recorded")
	}
	if o, _, _ := FilterState(opts, nil, nil, Lists{}); string(o) != string(opts) {
		t.Error("no list")
	}
	// A session/attach reports the session's modes through the mode list.
	modes := []byte(`{"currentModeId":"bypassPermissions","availableModes":[{"id":"bypassPermissions","name":"B"},{"id":"plan","name":"P"}]}`)
	if _, md, mo := FilterState(opts, mods, modes, noBypass); string(mo) != `{"currentModeId":"plan","availableModes":[{"id":"plan","name":"P"}]}` || !strings.Contains(string(md), `"currentModelId":"claude-sonnet-4"`) {
		t.Errorf("modes %s, models %s", mo, md)
	}
	if _, _, mo := FilterState(nil, nil, modes, sonnet); string(mo) != string(modes) {
		t.Errorf("no mode list: %s", mo)
	}
}

var noBypass = Lists{Models: sonnet.Models, Modes: policy.ModelPolicy{Allow: []string{"default", "plan"}}}

// Modes are handled as models are, by the same code: the modes object and
// the mode config option are filtered; a session that starts in a
// forbidden mode and on a forbidden model gets the model's switch, then
// the mode's, before its answer; set_mode and a mode option's switch to a
// forbidden mode are refused; a current_mode_update into one stops the
// session's turns.
func TestModes(t *testing.T) {
	const raw = `{"jsonrpc":"2.0","id":3,"result":{"sessionId":"s1",` +
		`"modes":{"currentModeId":"bypassPermissions","availableModes":[{"id":"bypassPermissions","name":"B"},{"id":"default","name":"D"},{"id":"acceptEdits","name":"A"},{"id":"plan","name":"P"}]},` +
		`"configOptions":[{"id":"mode","name":"Mode","category":"mode","type":"select","currentValue":"bypassPermissions","options":[{"value":"bypassPermissions","name":"B"},{"value":"default","name":"D"}]},` +
		`{"id":"model","name":"Model","category":"model","type":"select","currentValue":"claude-opus-4","options":[{"value":"claude-opus-4","name":"O"},{"value":"claude-sonnet-4","name":"S"}]}]}}`
	m := scanResult(t, acp.SessionNew, raw)
	var seen Seen
	edits, sw, err := seen.Answer(m, noBypass, true, "s1", nil)
	if err != nil || sw == nil {
		t.Fatalf("answer: %v %v", sw, err)
	}
	out := apply(m, edits)
	for _, want := range []string{
		`"modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]}`,
		`{"id":"mode","name":"Mode","category":"mode","type":"select","currentValue":"default","options":[{"value":"default","name":"D"}]}`,
		`"currentValue":"claude-sonnet-4","options":[{"value":"claude-sonnet-4","name":"S"}]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("%s\nlacks %s", out, want)
		}
	}
	if got := string(sw.Request(1)); !strings.Contains(got, `"params":{"sessionId":"s1","configId":"model","value":"claude-sonnet-4"}`) {
		t.Errorf("first switch: %s", got)
	}
	sw.Hold([]byte("answer"))
	ok := scanResult(t, acp.SessionSetConfigOption, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	if err := sw.Done(ok, &seen); err != nil {
		t.Fatal(err)
	}
	next := sw.Next()
	if next == nil || string(next.Held()) != "answer" || !strings.Contains(string(next.Request(2)), `"params":{"sessionId":"s1","configId":"mode","value":"default"}`) {
		t.Fatalf("the mode's switch: %+v", next)
	}
	prompt := scanParams(t, `{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}`, acp.ClientSpec)
	if r := seen.Check(prompt, noBypass); r == nil || !strings.Contains(r.Err.Error(), `this session runs on mode "bypassPermissions"`) {
		t.Errorf("a prompt before the mode's switch: %+v", r)
	}
	if err := next.Done(ok, &seen); err != nil || next.Next() != nil {
		t.Fatal(err)
	}
	if r := seen.Check(prompt, noBypass); r != nil {
		t.Errorf("a prompt after both switches: %v", r.Err)
	}

	client := func(raw string) *jsonrpc.Message { return scanParams(t, raw, acp.ClientSpec) }
	for _, c := range []struct {
		raw  string
		code int
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_mode","params":{"sessionId":"s","modeId":"bypassPermissions"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_mode","params":{"sessionId":"s","modeId":"plan"}}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"mode","value":"acceptEdits"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"mode","value":"plan"}}`, 0},
	} {
		r := seen.Check(client(c.raw), noBypass)
		switch {
		case c.code == 0 && r != nil:
			t.Errorf("%s refused: %v", c.raw, r.Err)
		case c.code != 0 && (r == nil || r.Code != c.code || !strings.Contains(r.Err.Error(), `is not allowed by the gateway policy (policy.modes.allow: "default", "plan")`)):
			t.Errorf("%s: %+v", c.raw, r)
		}
	}

	// A permission option named after a mode the session offers outside
	// the list is refused; one named after an allowed mode, or no mode, or
	// with no mode list, passes.
	if r := seen.Choice("acceptEdits", noBypass); r == nil || r.Code != jsonrpc.CodeInvalidParams || !strings.Contains(r.Err.Error(), `the permission option "acceptEdits" switches the session to that mode`) {
		t.Errorf("acceptEdits picked: %+v", r)
	}
	for _, ok := range []string{"plan", "allow", "reject"} {
		if r := seen.Choice(ok, noBypass); r != nil {
			t.Errorf("%s picked: %v", ok, r.Err)
		}
	}
	if r := seen.Choice("acceptEdits", sonnet); r != nil {
		t.Errorf("no mode list: %v", r.Err)
	}

	// The agent moves the session into a forbidden mode on its own: its
	// turns stop until it is switched back.
	u := scanParams(t, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"current_mode_update","currentModeId":"acceptEdits"}}}`, agentSpec(false))
	if e := seen.Edits(u, noBypass, nil); len(e) != 0 {
		t.Errorf("a current_mode_update was edited: %v", e)
	}
	if r := seen.Check(prompt, noBypass); r == nil || !strings.Contains(r.Err.Error(), `runs on mode "acceptEdits"`) {
		t.Errorf("a prompt in a mode the agent moved to: %+v", r)
	}
	if r := seen.Check(prompt, sonnet); r != nil {
		t.Errorf("no mode list: %v", r.Err)
	}
}
