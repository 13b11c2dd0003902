package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/test/internal/harness"
	"github.com/acpgate/acpgate/test/internal/metricscrape"
)

// Tenants' budgets (issue #31), against the real binary and the fake
// agent's "spend" prompts (test/fakeagent): a prompt of a tenant past a
// cap is refused before it reaches the agent, a running turn whose
// reports cross a cap is cancelled, the file ledger survives a restart,
// administrators list and reset budgets, hostile reports count nothing,
// Redis is shared by gateways and may fail.

// budgetTenants are the tenants of a budget test: acme and globex have
// budgets (as the test says), initech never has one.
var budgetTenants = []string{"acme", "globex", "initech"}

// budgetEnv is the tenants' roots and tokens, the audit trail's path.
type budgetEnv struct {
	tokens map[string]string
	roots  map[string]string
	trail  string
}

func newBudgetEnv(t *testing.T) *budgetEnv {
	t.Helper()
	fakeAgentBin(t)
	e := &budgetEnv{tokens: map[string]string{}, roots: map[string]string{}, trail: filepath.Join(t.TempDir(), "audit.jsonl")}
	for _, name := range budgetTenants {
		e.roots[name] = t.TempDir()
		e.tokens[name] = name + "-" + harness.RandomHex(t, 24)
	}
	return e
}

// config is the gateway's YAML: the fake agent, an operations listener
// with the admin API, the audit trail, the budgets section top (YAML, ""
// for none) and each tenant's budget (a YAML flow mapping).
func (e *budgetEnv) config(t *testing.T, top string, budgets map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent: {command: [%q], stop_grace: 1s}\n", fakeAgentBin(t))
	fmt.Fprintf(&b, "pool: {min_idle: 0}\nobservability: {metrics_listen: 127.0.0.1:0}\naudit: {file: %q}\n", e.trail)
	fmt.Fprintf(&b, "admin: {tokens_sha256: [%q]}\n%s", hexSHA256(adminTok), top)
	b.WriteString("tenants:\n")
	for _, name := range budgetTenants {
		fmt.Fprintf(&b, "  - name: %s\n    tokens_sha256: [%q]\n    root: %q\n", name, hexSHA256(e.tokens[name]), e.roots[name])
		if bud := budgets[name]; bud != "" {
			fmt.Fprintf(&b, "    budget: %s\n", bud)
		}
	}
	return b.String()
}

// budgetSession connects as tenant and opens a session in its root.
func (e *budgetEnv) session(t *testing.T, g *gateway, tenant string) (*client, string) {
	t.Helper()
	c := dialToken(t, g, e.tokens[tenant])
	return c, c.newSession(e.roots[tenant])
}

// prompt sends a prompt and returns its answer, the session/updates
// before it passed to seen (nil: ignored).
func prompt(t *testing.T, c *client, sid, text string, timeout time.Duration, seen func(rpcMsg)) rpcMsg {
	t.Helper()
	id := c.Request("session/prompt", textPrompt(sid, text))
	return c.Await(id, timeout, func(m rpcMsg) {
		if seen != nil {
			seen(m)
		}
	})
}

// budgetData is a refusal's error.data and _meta.acpgate.budget.
type budgetData struct {
	Tenant, Period, Unit, Resets string
	Spent, Limit                 float64
}

// refusedForBudget checks that m refuses a prompt with -32006, message
// msg (its reset time added) and error.data saying the same.
func refusedForBudget(t *testing.T, m rpcMsg, msg string, want budgetData) {
	t.Helper()
	_, next := dayBounds()
	want.Resets = next.Format(time.RFC3339)
	if want.Period == "month" {
		now := time.Now().UTC()
		want.Resets = time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)
	}
	msg += "; resets " + want.Resets
	if m.Error == nil || m.Error.Code != -32006 || m.Error.Message != msg {
		t.Fatalf("want the refusal -32006 %q, got %s", msg, m.Raw)
	}
	var got budgetData
	err := json.Unmarshal(m.Error.Data, &got)
	if math.Abs(got.Spent-want.Spent) < 1e-9 {
		got.Spent = want.Spent
	}
	if err != nil || got != want {
		t.Errorf("error.data %s, want %+v", m.Error.Data, want)
	}
}

func dayBounds() (start, next time.Time) {
	now := time.Now().UTC()
	start = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 0, 1)
}

// agentSaw reports whether the fake agent logged the prompt text (its
// stderr is in the gateway's debug log).
func agentSaw(g *gateway, text string) bool {
	for _, r := range g.Logs() {
		if line, _ := r["line"].(string); r["msg"] == "agent stderr" && strings.HasPrefix(line, "fakeagent: prompt ") && strings.HasSuffix(line, " "+text) {
			return true
		}
	}
	return false
}

// neverSeen checks that the agent never saw text: another tenant's
// prompt, sent after it, is seen first.
func neverSeen(t *testing.T, g *gateway, other *client, otherSID, text string) {
	t.Helper()
	marker := "sentinel " + harness.RandomHex(t, 4)
	if r := prompt(t, other, otherSID, marker, 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("sentinel: %s", r.Raw)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !agentSaw(g, marker) {
		if time.Now().After(deadline) {
			t.Fatal("the agent's stderr never showed the sentinel prompt")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if agentSaw(g, text) {
		t.Errorf("the agent saw the refused prompt %q", text)
	}
}

// A tenant over its cost cap and one over its token cap are refused with
// -32006 naming the budget, their prompts never reaching the agent; a
// tenant without a budget is served throughout. The turn whose report
// took acme past its cap was cancelled by the gateway.
func TestBudgetRefusesOverCaps(t *testing.T) {
	e := newBudgetEnv(t)
	g := startGateway(t, gwOpts{config: e.config(t, "", map[string]string{
		"acme":   "{cost: {USD: 25}}",
		"globex": "{tokens: 1000, cost: {EUR: 100}}",
	})})
	acme, acmeSID := e.session(t, g, "acme")
	globex, globexSID := e.session(t, g, "globex")
	initech, initechSID := e.session(t, g, "initech")

	if r := prompt(t, acme, acmeSID, "spend 20 every=10ms", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("acme under its cap: %s", r.Raw)
	}
	if r := prompt(t, acme, acmeSID, "spend 25.10 every=500ms", 10*time.Second, nil); stopReason(t, r) != "cancelled" {
		t.Fatalf("acme's turn crossing its cap: %s", r.Raw)
	}
	r := prompt(t, acme, acmeSID, "acme refused prompt", 10*time.Second, nil)
	refusedForBudget(t, r, "budget for tenant acme exhausted: 25.10 of 25.00 USD this day",
		budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 25.1, Limit: 25})
	neverSeen(t, g, initech, initechSID, "acme refused prompt")

	// Tokens: input + output of each turn.
	if r := prompt(t, globex, globexSID, "spend 1 every=1ms tokens=600,300", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("globex under its cap: %s", r.Raw)
	}
	if r := prompt(t, globex, globexSID, "spend 1 every=1ms tokens=100,50", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("globex's turn that reaches its cap: %s", r.Raw)
	}
	r = prompt(t, globex, globexSID, "globex refused prompt", 10*time.Second, nil)
	refusedForBudget(t, r, "budget for tenant globex exhausted: 1050 of 1000 tokens this day",
		budgetData{Tenant: "globex", Period: "day", Unit: "tokens", Spent: 1050, Limit: 1000})
	neverSeen(t, g, initech, initechSID, "globex refused prompt")

	// A tenant without a budget spends what it likes.
	if r := prompt(t, initech, initechSID, "spend 1000 every=1ms tokens=100000,100000", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("initech: %s", r.Raw)
	}
	if r := prompt(t, initech, initechSID, "still served", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("initech after spending: %s", r.Raw)
	}
	// Another session of a refused tenant is refused too.
	acme2, acme2SID := e.session(t, g, "acme")
	if r := prompt(t, acme2, acme2SID, "acme second session", 10*time.Second, nil); r.Error == nil || r.Error.Code != -32006 {
		t.Errorf("acme's second session: %s", r.Raw)
	}
	m := budgetMetrics(t, g)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"acpgate_budget_refusals_total", `tenant="acme"`, 2},
		{"acpgate_budget_refusals_total", `tenant="globex"`, 1},
		{"acpgate_budget_limit", `tenant="acme",unit="USD"`, 25},
		{"acpgate_budget_limit", `tenant="globex",unit="tokens"`, 1000},
		{"acpgate_budget_spent", `tenant="globex",unit="tokens"`, 1050},
		{"acpgate_budget_store_errors_total", "", 0},
	} {
		if got := metricscrape.Sample(m, c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if metricscrape.Sample(m, "acpgate_budget_spent", `tenant="initech",unit="tokens"`) != -1 {
		t.Error("a tenant without a budget has a budget metric")
	}
}

// A running turn whose reports take its tenant past the cap is cancelled
// within a second of the report that crossed it: its answer is stopReason
// cancelled with _meta.acpgate.budget saying why.
func TestBudgetCancelsRunningTurn(t *testing.T) {
	e := newBudgetEnv(t)
	g := startGateway(t, gwOpts{config: e.config(t, "", map[string]string{"acme": "{cost: {USD: 1}}"})})
	c, sid := e.session(t, g, "acme")
	// 0.2 a report every 200 ms: the fifth (1.0) crosses the cap at about
	// 0.8 s; uncancelled, the turn would run 3 s.
	var crossed time.Time
	reports := 0
	start := time.Now()
	r := prompt(t, c, sid, "spend 0.2,0.4,0.6,0.8,1.0,1.2,1.4,1.6,1.8,2.0,2.2,2.4,2.6,2.8,3.0 every=200ms", 10*time.Second, func(m rpcMsg) {
		var p struct {
			Update struct {
				Kind string `json:"sessionUpdate"`
				Cost struct{ Amount float64 }
			} `json:"update"`
		}
		if m.Method == "session/update" && json.Unmarshal(m.Params, &p) == nil && p.Update.Kind == "usage_update" {
			reports++
			if p.Update.Cost.Amount >= 1 && crossed.IsZero() {
				crossed = time.Now()
			}
		}
	})
	answered := time.Now()
	if stopReason(t, r) != "cancelled" {
		t.Fatalf("the turn past its budget: %s", r.Raw)
	}
	if crossed.IsZero() {
		t.Fatalf("no report crossed the cap before the answer (%d reports): %s", reports, r.Raw)
	}
	t.Logf("cap crossed %v after the prompt; answered %v after that, %d reports seen", crossed.Sub(start).Round(time.Millisecond),
		answered.Sub(crossed).Round(time.Millisecond), reports)
	if d := answered.Sub(crossed); d > time.Second {
		t.Errorf("answered %v after the report that crossed the cap, want within 1 s", d)
	}
	var res struct {
		Meta struct {
			Acpgate struct{ Budget budgetData } `json:"acpgate"`
		} `json:"_meta"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil || res.Meta.Acpgate.Budget.Unit != "USD" || res.Meta.Acpgate.Budget.Limit != 1 ||
		res.Meta.Acpgate.Budget.Tenant != "acme" || res.Meta.Acpgate.Budget.Spent < 1 {
		t.Errorf("_meta.acpgate.budget of the answer: %s", r.Result)
	}
	if g.CountLogs("budgets: turn cancelled, its tenant's budget exhausted", "tenant", "acme") != 1 {
		t.Error("the cancellation is not logged with its tenant")
	}
}

// budgetMetrics is the operations listener's /metrics.
func budgetMetrics(t *testing.T, g *gateway) string {
	t.Helper()
	_, body, err := metricscrape.Get(g.MetricsAddr())
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return body
}

// waitSpent waits until acpgate_budget_spent says the store holds want
// (the ledger sets it from what the store answers an addition).
func waitSpent(t *testing.T, g *gateway, tenant, unit string, want float64) {
	t.Helper()
	labels := fmt.Sprintf("tenant=%q,unit=%q", tenant, unit)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got := metricscrape.Sample(budgetMetrics(t, g), "acpgate_budget_spent", labels); got == want {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("acpgate_budget_spent{%s} is %v after 10 s, want %v", labels, got, want)
		}
	}
}

// budgetStatus is one entry of GET /v1/admin/budgets.
type budgetStatus struct {
	Tenant, Period, Start, Resets string
	Spent                         struct {
		Tokens int64
		Cost   map[string]float64
	}
	Limits struct {
		Tokens int64
		Cost   map[string]float64
	}
	Exhausted *budgetData
}

func listBudgets(t *testing.T, g *gateway) map[string]budgetStatus {
	t.Helper()
	var out struct{ Budgets []budgetStatus }
	if code := adminDo(t, http.MethodGet, "http://"+g.MetricsAddr()+"/v1/admin/budgets", adminTok, &out); code != http.StatusOK {
		t.Fatalf("GET /v1/admin/budgets: %d", code)
	}
	m := map[string]budgetStatus{}
	for _, b := range out.Budgets {
		m[b.Tenant] = b
	}
	return m
}

// Administrators list the budgets and reset one: the tenant is served
// again; a tenant without a budget is 404; tenants' tokens are refused;
// budget.exceeded and budget.reset are in the audit trail.
func TestBudgetAdmin(t *testing.T) {
	e := newBudgetEnv(t)
	g := startGateway(t, gwOpts{config: e.config(t, "", map[string]string{
		"acme": "{period: month, tokens: 5000, cost: {USD: 2}}", "globex": "{tokens: 100}"})})
	c, sid := e.session(t, g, "acme")
	if r := prompt(t, c, sid, "spend 1.5 every=1ms tokens=10,20", 10*time.Second, nil); r.Error != nil {
		t.Fatal(r.Raw)
	}
	if r := prompt(t, c, sid, "spend 2.5 every=1ms", 10*time.Second, nil); r.Error != nil {
		t.Fatal(r.Raw)
	}
	all := listBudgets(t, g)
	a, gl := all["acme"], all["globex"]
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if len(all) != 2 || a.Period != "month" || a.Start != month.Format(time.RFC3339) || a.Resets != month.AddDate(0, 1, 0).Format(time.RFC3339) ||
		a.Spent.Cost["USD"] != 2.5 || a.Spent.Tokens != 30 || a.Limits.Tokens != 5000 || a.Limits.Cost["USD"] != 2 ||
		a.Exhausted == nil || a.Exhausted.Unit != "USD" || gl.Exhausted != nil || gl.Limits.Tokens != 100 || gl.Period != "day" {
		t.Fatalf("budgets: %+v", all)
	}
	if r := prompt(t, c, sid, "refused before the reset", 10*time.Second, nil); r.Error == nil || r.Error.Code != -32006 {
		t.Fatalf("over the cap: %s", r.Raw)
	}
	ops := "http://" + g.MetricsAddr() + "/v1/admin/budgets/"
	if code := adminDo(t, http.MethodPost, ops+"acme/reset", e.tokens["acme"], nil); code != http.StatusForbidden {
		t.Errorf("a tenant's own reset: %d", code)
	}
	if code := adminDo(t, http.MethodPost, ops+"initech/reset", adminTok, nil); code != http.StatusNotFound {
		t.Errorf("reset of a tenant without a budget: %d", code)
	}
	if code := adminDo(t, http.MethodPost, ops+"acme/reset", adminTok, nil); code != http.StatusOK {
		t.Fatalf("reset: %d", code)
	}
	if r := prompt(t, c, sid, "served after the reset", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("after the reset: %s", r.Raw)
	}
	if a := listBudgets(t, g)["acme"]; a.Spent.Tokens != 0 || a.Spent.Cost["USD"] != 0 || a.Exhausted != nil {
		t.Errorf("after the reset: %+v", a)
	}
	g.Stop(syscall.SIGTERM) // the trail is complete
	var exceeded, reset int
	for _, rec := range readTrail(t, e.trail) {
		switch rec.Event {
		case "budget.exceeded":
			exceeded++
			if rec.Tenant != "acme" || rec.Fields["unit"] != "USD" || rec.Fields["limit"] != 2.0 {
				t.Errorf("budget.exceeded: %s", rec.line)
			}
		case "budget.reset":
			reset++
			if rec.Tenant != "acme" || rec.Subject == "" || rec.Fields["by"] != rec.Subject {
				t.Errorf("budget.reset: %s", rec.line)
			}
		}
	}
	if exceeded != 1 || reset != 1 {
		t.Errorf("%d budget.exceeded, %d budget.reset in the trail, want 1 each", exceeded, reset)
	}
	if code, out := verifyTrail(t, e.trail); code != 0 {
		t.Errorf("audit verify: %d %s", code, out)
	}
}

// With budgets.store file:, what a tenant spent survives a restart.
func TestBudgetFileSurvivesRestart(t *testing.T) {
	e := newBudgetEnv(t)
	ledger := filepath.Join(t.TempDir(), "ledger", "budget.db")
	cfg := e.config(t, fmt.Sprintf("budgets: {store: %q}\n", "file:"+ledger), map[string]string{"acme": "{cost: {USD: 1}}"})
	g := startGateway(t, gwOpts{config: cfg})
	c, sid := e.session(t, g, "acme")
	if r := prompt(t, c, sid, "spend 1.5 every=1ms", 10*time.Second, nil); r.Error != nil {
		t.Fatal(r.Raw)
	}
	if r := prompt(t, c, sid, "refused before the restart", 10*time.Second, nil); r.Error == nil || r.Error.Code != -32006 {
		t.Fatalf("over the cap: %s", r.Raw)
	}
	g.Stop(syscall.SIGTERM)
	if st, err := os.Stat(ledger); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the ledger file: %v %v", st, err)
	}
	g = startGateway(t, gwOpts{config: cfg})
	c, sid = e.session(t, g, "acme")
	r := prompt(t, c, sid, "refused after the restart", 10*time.Second, nil)
	refusedForBudget(t, r, "budget for tenant acme exhausted: 1.50 of 1.00 USD this day",
		budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 1.5, Limit: 1})
	if strings.Contains(g.LogText(), "the ledger is in memory") {
		t.Error("a file ledger is said to be in memory")
	}
}

// What an agent reports that is not spend (a negative, huge or
// non-numeric cost, a cost lower than before, negative or non-numeric
// token counts) changes nothing in the ledger.
func TestBudgetHostileReports(t *testing.T) {
	e := newBudgetEnv(t)
	g := startGateway(t, gwOpts{config: e.config(t, "", map[string]string{"acme": "{tokens: 1000, cost: {USD: 10}}"})})
	c, sid := e.session(t, g, "acme")
	for _, p := range []string{
		`spend 2 every=1ms tokens=5,5`,         // counted: 2 USD, 10 tokens
		`spend -5,"x",null,{},1e400 every=1ms`, // negative, non-numeric, missing, huge
		`spend 1 every=1ms`,                    // lower than 2: the counter restarted
		`spend 1e300 every=1ms`,                // a jump beyond any real cost
		`spend 2 every=1ms tokens=-5,"x"`,      // below the baseline; bad counts
		`spend 2 every=1ms tokens=1e13,1.5`,    // too many; not an integer
	} {
		if r := prompt(t, c, sid, p, 10*time.Second, nil); r.Error != nil {
			t.Fatalf("%s: %s", p, r.Raw)
		}
	}
	a := listBudgets(t, g)["acme"]
	if a.Spent.Tokens != 10 || math.Abs(a.Spent.Cost["USD"]-2) > 1e-9 || len(a.Spent.Cost) != 1 || a.Exhausted != nil {
		t.Errorf("after hostile reports: %+v, want 10 tokens and 2 USD", a.Spent)
	}
	if r := prompt(t, c, sid, "still served", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Errorf("after hostile reports: %s", r.Raw)
	}
}

// 20 turns of one tenant race its cap: every turn is cancelled, and the
// spend passes the cap by what the turns reported before their
// cancellation reached them. The figure is logged (docs/operations.md, Budgets).
func TestBudgetConcurrentTurnsOvershoot(t *testing.T) {
	const turns, limit, step = 20, 10.0, 0.25
	e := newBudgetEnv(t)
	g := startGateway(t, gwOpts{config: e.config(t, "", map[string]string{"acme": fmt.Sprintf("{cost: {USD: %v}}", limit)})})
	c := dialToken(t, g, e.tokens["acme"])
	var sids []string
	for range turns {
		sids = append(sids, c.newSession(e.roots["acme"]))
	}
	// Each turn reports 0.25 more every 50 ms, 5 USD in 1 s if it runs
	// to its end: together 100 USD a second.
	var amounts []string
	for i := 1; i <= 20; i++ {
		amounts = append(amounts, fmt.Sprint(float64(i)*step))
	}
	text := "spend " + strings.Join(amounts, ",") + " every=50ms"
	ids := map[int]bool{}
	for _, sid := range sids {
		ids[c.Request("session/prompt", textPrompt(sid, text))] = true
	}
	stops := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for len(ids) > 0 {
		m := c.Next(time.Until(deadline))
		if m.Method != "" {
			continue
		}
		var id int
		if json.Unmarshal(m.ID, &id) != nil || !ids[id] {
			t.Fatalf("unexpected answer: %s", m.Raw)
		}
		delete(ids, id)
		stops[stopReason(t, m)]++
	}
	// The ledger has everything once nothing is pending: read until it
	// stops changing.
	var spent float64
	for prev := -1.0; spent != prev; time.Sleep(300 * time.Millisecond) {
		prev, spent = spent, listBudgets(t, g)["acme"].Spent.Cost["USD"]
	}
	over := spent - limit
	t.Logf("%d turns, reports of %.2f every 50 ms, cap %.2f: spent %.2f, overshoot %.2f USD (%.1f reports' worth, %.2f a turn); stop reasons %v",
		turns, step, limit, spent, over, over/step, over/turns, stops)
	if stops["cancelled"] != turns {
		t.Errorf("stop reasons %v, want every turn cancelled", stops)
	}
	if spent < limit || over > turns*step*2 {
		t.Errorf("spent %.2f against a cap of %.2f: want an overshoot of at most two reports a turn (%.2f)", spent, limit, turns*step*2)
	}
	if r := prompt(t, c, sids[0], "after the race", 10*time.Second, nil); r.Error == nil || r.Error.Code != -32006 {
		t.Errorf("after the race: %s", r.Raw)
	}
}

// The store's name in errors and logs never shows a Redis password:
// check-config's problems, and the error a prompt gets while the store is
// unreachable (on_store_error deny), which names it.
func TestBudgetStoreNamedWithoutPassword(t *testing.T) {
	e := newBudgetEnv(t)
	const secret = "hunter2-budget-secret"
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, []byte(e.config(t, "budgets: {store: \"redis://:"+secret+"@127.0.0.1:notaport/0\", on_store_error: maybe}\n",
		map[string]string{"acme": "{period: week, tokens: -1, cost: {\"US$\": 1}}"})))
	out, err := exec.Command(binPath, "check-config", "--config", bad).CombinedOutput()
	for _, want := range []string{"budgets.store: redis://xxxxx@127.0.0.1:notaport/0", `budgets.on_store_error: "maybe" is not deny or allow`,
		`tenants[0].budget.period: "week" is not day or month`, "tenants[0].budget.tokens: must not be negative",
		`tenants[0].budget.cost: "US$" is not a currency`} {
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("check-config: %v, output lacks %q:\n%s", err, want, out)
		}
	}
	if strings.Contains(string(out), secret) {
		t.Errorf("check-config shows the password:\n%s", out)
	}

	closed := harness.FreeAddr(t)
	g := startGateway(t, gwOpts{config: e.config(t, "budgets: {store: \"redis://:"+secret+"@"+closed+"/0\"}\n",
		map[string]string{"acme": "{cost: {USD: 1}}"})})
	c, sid := e.session(t, g, "acme")
	r := prompt(t, c, sid, "while the store is unreachable", 15*time.Second, nil)
	if r.Error == nil || r.Error.Code != -32603 || !strings.Contains(r.Error.Message, "redis://:xxxxx@"+closed+"/0") {
		t.Errorf("want an error naming the store: %s", r.Raw)
	}
	initech, isid := e.session(t, g, "initech")
	if r := prompt(t, initech, isid, "a tenant without a budget", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Errorf("a tenant without a budget while the store is down: %s", r.Raw)
	}
	if strings.Contains(string(r.Raw), secret) || strings.Contains(g.LogText(), secret) {
		t.Error("the password is in an error or the log")
	}
}

// Two gateways sharing one Redis share the ledger: what a tenant spends
// on one refuses its prompts on the other, and a reset on either serves it
// on both.
func TestBudgetRedisSharedByGateways(t *testing.T) {
	redis := redistest.Start(t)
	e := newBudgetEnv(t)
	cfg := e.config(t, fmt.Sprintf("budgets: {store: %q}\n", redis.URL(0)), map[string]string{"acme": "{cost: {USD: 1}}"})
	g1 := startGateway(t, gwOpts{config: cfg})
	g2 := startGateway(t, gwOpts{config: cfg})
	c1, sid1 := e.session(t, g1, "acme")
	c2, sid2 := e.session(t, g2, "acme")
	if r := prompt(t, c2, sid2, "served on the second", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Fatalf("before any spend: %s", r.Raw)
	}
	if r := prompt(t, c1, sid1, "spend 1.25 every=1ms", 10*time.Second, nil); r.Error != nil {
		t.Fatal(r.Raw)
	}
	// The other gateway knows once the first has written it (a
	// millisecond or so after the report).
	waitSpent(t, g1, "acme", "USD", 1.25)
	r := prompt(t, c2, sid2, "refused on the second", 10*time.Second, nil)
	refusedForBudget(t, r, "budget for tenant acme exhausted: 1.25 of 1.00 USD this day",
		budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 1.25, Limit: 1})
	if code := adminDo(t, http.MethodPost, "http://"+g2.MetricsAddr()+"/v1/admin/budgets/acme/reset", adminTok, nil); code != http.StatusOK {
		t.Fatalf("reset on the second: %d", code)
	}
	if r := prompt(t, c1, sid1, "served on the first after the reset", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
		t.Errorf("after a reset on the other gateway: %s", r.Raw)
	}
}

// Redis is killed mid-run and started again (empty). With on_store_error
// deny, the budgeted tenant's prompts get an error naming the store while
// it is down and are served once it is back, without a restart; a tenant
// without a budget is served throughout. With allow, its prompts run
// while Redis is down, and what they spent meanwhile is added once it is
// back.
func TestBudgetRedisDown(t *testing.T) {
	for _, mode := range []string{"deny", "allow"} {
		t.Run(mode, func(t *testing.T) {
			redis := redistest.Start(t)
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: e.config(t, fmt.Sprintf("budgets: {store: %q, on_store_error: %s}\n", redis.URL(0), mode),
				map[string]string{"acme": "{cost: {USD: 1}}"})})
			c, sid := e.session(t, g, "acme")
			initech, isid := e.session(t, g, "initech")
			if r := prompt(t, c, sid, "spend 0.5 every=1ms", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
				t.Fatalf("before the outage: %s", r.Raw)
			}
			waitSpent(t, g, "acme", "USD", 0.5) // in Redis, not on its way there
			redis.Kill()
			if r := prompt(t, initech, isid, "no budget, no store", 10*time.Second, nil); stopReason(t, r) != "end_turn" {
				t.Errorf("a tenant without a budget while Redis is down: %s", r.Raw)
			}
			r := prompt(t, c, sid, "spend 1.5 every=1ms", 10*time.Second, nil)
			switch {
			case mode == "deny" && (r.Error == nil || r.Error.Code != -32603 || !strings.Contains(r.Error.Message, redis.URL(0))):
				t.Fatalf("deny: want an error naming the store %s: %s", redis.URL(0), r.Raw)
			case mode == "allow" && r.Error != nil:
				t.Fatalf("allow: refused while Redis is down: %s", r.Raw)
			}
			redis.Restart() // empty: it kept nothing
			// deny: served again, nothing spent meanwhile; allow: the 1 USD
			// spent meanwhile (1.5 less the 0.5 before) is added.
			deadline := time.Now().Add(10 * time.Second)
			for {
				r = prompt(t, c, sid, "after the outage", 10*time.Second, nil)
				if mode == "deny" && r.Error == nil || mode == "allow" && r.Error != nil && r.Error.Code == -32006 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: 10 s after Redis came back: %s", mode, r.Raw)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if mode == "allow" {
				refusedForBudget(t, r, "budget for tenant acme exhausted: 1.00 of 1.00 USD this day",
					budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 1, Limit: 1})
			}
			// Both are logged (the log is read as it comes: wait for it).
			g.WaitLogs(t, "budget ledger store failing", 1, 5*time.Second)
			g.WaitLogs(t, "budget ledger store back", 1, 5*time.Second)
		})
	}
}
