package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/proxy/metrics"
	"github.com/acpgate/acpgate/proxy/policy"
	"github.com/acpgate/acpgate/proxy/usage"
)

// usageAgent plays what each prompt's text says: {"updates":[…],
// "result":{…}}, the updates sent as session/update before the answer.
// session/load replays the last usage_update of the session, and
// "_usage/update" sends one update of the session outside any turn.
func usageAgent() {
	out := bufio.NewWriter(os.Stdout)
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	last := map[string]json.RawMessage{} // session → its last usage_update
	update := func(sid string, u json.RawMessage) {
		var k struct {
			SessionUpdate string `json:"sessionUpdate"`
		}
		if json.Unmarshal(u, &k) == nil && k.SessionUpdate == "usage_update" {
			last[sid] = u
		}
		fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":%s}}`+"\n", sid, u)
	}
	n := 0
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				SessionID string          `json:"sessionId"`
				Update    json.RawMessage `json:"update"`
				Prompt    []struct {
					Text string `json:"text"`
				} `json:"prompt"`
			} `json:"params"`
		}
		_ = json.Unmarshal(line, &m)
		sid := m.Params.SessionID
		result := `{}`
		switch m.Method {
		case "initialize":
			result = `{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}`
		case "session/new":
			n++
			result = fmt.Sprintf(`{"sessionId":"s%d"}`, n)
		case "session/load":
			if u := last[sid]; u != nil {
				update(sid, u)
			}
		case "_usage/update":
			update(sid, m.Params.Update)
		case "session/prompt":
			var script struct {
				Updates []json.RawMessage `json:"updates"`
				Result  json.RawMessage   `json:"result"`
			}
			if len(m.Params.Prompt) > 0 {
				_ = json.Unmarshal([]byte(m.Params.Prompt[0].Text), &script)
			}
			for _, u := range script.Updates {
				update(sid, u)
			}
			result = string(script.Result)
		}
		if len(m.ID) > 0 {
			fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
		}
		out.Flush()
	}
}

// usageRelay is a relay on the usage agent with metrics and an audit trail.
func usageRelay(t *testing.T, prompts bool) (*Relay, *prometheus.Registry, *audit.Memory) {
	t.Helper()
	reg := prometheus.NewRegistry()
	evs := &audit.Memory{}
	r := testPool(t, "usage", func(p *PoolConfig) { p.MaxProcesses = 1 }, func(c *Config) {
		pol := policy.Default()
		pol.Extensions = []string{"_usage/*"}
		c.Metrics = metrics.New(reg, 10)
		c.Tenants = []TenantConfig{{Name: "acme", Policy: &pol}}
		c.Audit, c.AuditPrompts = evs, prompts
	})
	return r, reg, evs
}

// metricValue is the sum of the series of name whose labels include want.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// turn sends a prompt whose text is the usage agent's script and waits
// for its answer.
func (tc *testConn) turn(id, sid string, updates []string, result string) msg {
	tc.t.Helper()
	script := `{"updates":[` + strings.Join(updates, ",") + `],"result":` + result + `}`
	params, _ := json.Marshal(map[string]any{"sessionId": sid, "prompt": []any{map[string]string{"type": "text", "text": script}}})
	tc.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"session/prompt","params":` + string(params) + `}`)
	return tc.await(id, nil)
}

func costUpdate(amount, currency string) string {
	return `{"sessionUpdate":"usage_update","used":1000,"size":200000,"cost":{"amount":` + amount + `,"currency":` + currency + `}}`
}

const chunk = `{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}`

func TestUsageCounted(t *testing.T) {
	r, reg, evs := usageRelay(t, false)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	c.turn("2", sid, []string{chunk, costUpdate("0.5", `"USD"`)},
		`{"stopReason":"end_turn","usage":{"inputTokens":100,"outputTokens":20,"thoughtTokens":5,"cachedReadTokens":7,"cachedWriteTokens":3,"totalTokens":135}}`)
	c.turn("3", sid, []string{costUpdate("0.75", `"USD"`), costUpdate("1.25", `"USD"`), chunk},
		`{"stopReason":"end_turn","usage":{"inputTokens":10,"outputTokens":2}}`)

	tok := func(kind string) float64 {
		return metricValue(t, reg, "acpgate_usage_tokens_total", map[string]string{"tenant": "acme", "kind": kind, "agent": DefaultAgent})
	}
	for kind, want := range map[string]float64{"input": 110, "output": 22, "thought": 5, "cached_read": 7, "cached_write": 3} {
		if got := tok(kind); got != want {
			t.Errorf("tokens %s = %v, want %v", kind, got, want)
		}
	}
	if got := metricValue(t, reg, "acpgate_usage_cost_total", map[string]string{"tenant": "acme", "currency": "USD"}); got != 1.25 {
		t.Errorf("cost = %v, want 1.25 (cumulative, counted once)", got)
	}
	if got := metricValue(t, reg, "acpgate_prompt_seconds_total", map[string]string{"tenant": "acme"}); got <= 0 {
		t.Errorf("prompt seconds = %v, want > 0", got)
	}
	s := sessionOf(c, sid)
	u := s.meter.Usage()
	if u.Tokens["input"] != 110 || u.Tokens["cached_write"] != 3 || u.Cost["USD"] != 1.25 {
		t.Errorf("session usage = %+v", u)
	}

	started, ended := evs.Events("prompt.started"), evs.Events("prompt.ended")
	if len(started) != 2 || len(ended) != 2 {
		t.Fatalf("%d prompt.started and %d prompt.ended, want 2 each", len(started), len(ended))
	}
	for _, ev := range started {
		if len(ev.Fields) != 0 || ev.Session != sid || ev.Tenant != "acme" {
			t.Errorf("prompt.started = %+v, want no fields (no prompt text without AuditPrompts) and the client's session ID", ev)
		}
	}
	f := fieldMap(ended[1])
	if f["stop_reason"] != "end_turn" || f["duration_ms"] == nil || ended[1].Session != sid {
		t.Errorf("prompt.ended = %+v", ended[1])
	}
	if u, _ := f["usage"].(map[string]int64); u["input"] != 10 || u["output"] != 2 || len(u) != 2 {
		t.Errorf("prompt.ended usage = %v, want input 10, output 2 only", f["usage"])
	}
	if cost, _ := f["cost"].(map[string]float64); cost["USD"] != 0.75 {
		t.Errorf("prompt.ended cost = %v, want USD 0.75 (this turn's increase)", f["cost"])
	}
}

func acmeConn(t *testing.T, r *Relay, name string) *testConn {
	s := &sink{ch: make(chan []byte, 1000)}
	c, err := r.NewConn(ConnInfo{ID: name, Tenant: "acme", Subject: "alice"}, s)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testConn{t: t, c: c, s: s}
	t.Cleanup(tc.c.Close)
	return tc
}

func sessionOf(tc *testConn, sid string) *Session {
	tc.c.mu.Lock()
	defer tc.c.mu.Unlock()
	return tc.c.sessions[sid]
}

func fieldMap(ev audit.Event) map[string]any {
	m := map[string]any{}
	for _, f := range ev.Fields {
		m[f.Key] = f.Value
	}
	return m
}

func TestUsagePromptTextAudited(t *testing.T) {
	r, _, evs := usageRelay(t, true)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	c.turn("2", sid, nil, `{"stopReason":"end_turn"}`)
	started := evs.Events("prompt.started")
	if len(started) != 1 {
		t.Fatalf("%d prompt.started", len(started))
	}
	if p, _ := fieldMap(started[0])["prompt"].(string); !strings.Contains(p, `"updates"`) {
		t.Errorf("prompt.started = %+v, want the prompt's text", started[0])
	}
	if f := fieldMap(evs.Events("prompt.ended")[0]); f["usage"] != nil || f["cost"] != nil {
		t.Errorf("prompt.ended = %v: usage or cost though none was reported", f)
	}
}

// A decrease counts nothing and is the new baseline; a load's replay
// only sets the baseline.
func TestUsageCostDecreaseAndReplay(t *testing.T) {
	r, reg, _ := usageRelay(t, false)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	cost := func() float64 {
		return metricValue(t, reg, "acpgate_usage_cost_total", map[string]string{"tenant": "acme", "currency": "EUR"})
	}
	c.turn("2", sid, []string{costUpdate("2", `"EUR"`)}, `{"stopReason":"end_turn"}`)
	c.turn("3", sid, []string{costUpdate("0.5", `"EUR"`)}, `{"stopReason":"end_turn"}`) // restarted
	if got := cost(); got != 2 {
		t.Fatalf("cost after a decrease = %v, want 2", got)
	}
	c.turn("4", sid, []string{costUpdate("1", `"EUR"`)}, `{"stopReason":"end_turn"}`)
	if got := cost(); got != 2.5 {
		t.Fatalf("cost after an increase from the new baseline = %v, want 2.5", got)
	}
	// A second client loads the session: the agent replays 1 EUR.
	d := acmeConn(t, r, "b")
	d.init(`{}`)
	d.send(`{"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":"` + sid + `","cwd":"/tmp","mcpServers":[]}}`)
	if m := d.await("5", nil); m.Error != nil {
		t.Fatalf("load: %s", m.raw)
	}
	if got := cost(); got != 2.5 {
		t.Fatalf("cost after a load's replay = %v, want 2.5", got)
	}
	d.turn("6", sid, []string{costUpdate("1.5", `"EUR"`)}, `{"stopReason":"end_turn"}`)
	if got := cost(); got != 3 {
		t.Fatalf("cost after a turn on the loaded session = %v, want 3", got)
	}
	if got := metricValue(t, reg, "acpgate_usage_rejected_total", map[string]string{"reason": usage.RejectDecreased}); got != 1 {
		t.Errorf("rejected decreased = %v, want 1", got)
	}
}

// Hostile reports count nothing, and never below zero.
func TestUsageHostile(t *testing.T) {
	r, reg, evs := usageRelay(t, false)
	c := acmeConn(t, r, "a")
	c.init(`{}`)
	sid := c.newSession("1")
	c.turn("2", sid, []string{
		costUpdate("-5", `"USD"`), costUpdate(`"NaN"`, `"USD"`), costUpdate(`"1e3"`, `"USD"`), costUpdate("null", `"USD"`),
		costUpdate("1e400", `"USD"`), costUpdate("5e9", `"USD"`), costUpdate("1", `7`), costUpdate("1", `{"x":1}`),
		`{"sessionUpdate":"usage_update","used":1,"size":2,"cost":"lots"}`,
		costUpdate("1", `"US$ dollars, really"`),
	}, `{"stopReason":"end_turn","usage":{"inputTokens":-3,"outputTokens":1e13,"thoughtTokens":"9","cachedReadTokens":1.5,"cachedWriteTokens":[1]}}`)
	c.turn("3", sid, nil, `{"stopReason":"end_turn","usage":"many"}`)
	for i := range 8 { // with USD (its too-large report set its baseline) and "other": the ninth and tenth refused
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"_usage/update","params":{"sessionId":%q,"update":%s}}`, 10+i, sid, costUpdate("0", fmt.Sprintf(`"C%d"`, i))))
		c.await(fmt.Sprint(10+i), nil)
	}
	if got := metricValue(t, reg, "acpgate_usage_tokens_total", nil); got != 0 {
		t.Errorf("tokens = %v, want 0", got)
	}
	// Only the malformed code counts (as "other", 1) among the costs.
	if got := metricValue(t, reg, "acpgate_usage_cost_total", map[string]string{"currency": "USD"}); got != 0 {
		t.Errorf("cost USD = %v, want 0", got)
	}
	if got := metricValue(t, reg, "acpgate_usage_cost_total", map[string]string{"currency": "other"}); got != 1 {
		t.Errorf("cost other = %v, want 1 (a malformed currency code)", got)
	}
	for reason, want := range map[string]float64{usage.RejectNegative: 2, usage.RejectTooLarge: 3, usage.RejectInvalid: 10, usage.RejectCurrencies: 2} {
		if got := metricValue(t, reg, "acpgate_usage_rejected_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("rejected %s = %v, want %v", reason, got, want)
		}
	}
	if u := sessionOf(c, sid).meter.Usage(); len(u.Tokens) != 0 {
		t.Errorf("session tokens = %v, want none", u.Tokens)
	}
	if f := fieldMap(evs.Events("prompt.ended")[0]); f["usage"] != nil {
		t.Errorf("prompt.ended usage = %v, want none", f["usage"])
	}
}
