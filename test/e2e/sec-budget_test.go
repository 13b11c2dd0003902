package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/internal/redistest"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// Issue #36, finding 5 of the review at 99b340a: spend counts once,
// whoever loads. The first cost report after a session/load was a
// baseline, so a client that reloaded its session before each turn spent
// for free; now a load's first report counts over the load's own
// baseline (the total its replay carried, else 0; usage.cost_total:
// per_load) or, for an agent set per_session, over the session's last
// counted total, which the ledger's store keeps: on one gateway, after a
// restart and across gateways on one Redis. Against the fake agent's
// "spend" prompts (test/fakeagent, FAKE_MODE=sessions).

// secBudgetConfig is a budget test's gateway config (budgetEnv.config)
// with the fake agent keeping its sessions (shared between processes, in
// acme's root), and a session key in dir (IDs survive a restart and work
// on another gateway).
func secBudgetConfig(t *testing.T, e *budgetEnv, top, dir string, budgets map[string]string) string {
	t.Helper()
	key := filepath.Join(dir, "session.key")
	if _, err := os.Stat(key); err != nil {
		if err := os.WriteFile(key, []byte(harness.RandomHex(t, 32)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	shared := filepath.Join(e.roots["acme"], ".fake-sessions") // where acme's sandboxed agents may write
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(t, fmt.Sprintf("session_key_file: %q\n%s", key, top), budgets)
	env := fmt.Sprintf("env: {FAKE_MODE: sessions, FAKE_SESSIONS_DIR: %q}, stop_grace: 1s}", shared)
	if !strings.Contains(cfg, "stop_grace: 1s}") {
		t.Fatal("the budget config's agent line changed")
	}
	return strings.Replace(cfg, "stop_grace: 1s}", env, 1)
}

// secSpent waits until the admin API says tenant spent tokens and usd
// (the ledger has it a moment after the report), and fails with what it
// says after 10 s.
func secSpent(t *testing.T, g *gateway, tenant, step string, tokens int64, usd float64) {
	t.Helper()
	var got budgetStatus
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = listBudgets(t, g)[tenant]
		if got.Spent.Tokens == tokens && math.Abs(got.Spent.Cost["USD"]-usd) < 1e-9 {
			// Nothing more comes: read again a little later.
			time.Sleep(150 * time.Millisecond)
			if again := listBudgets(t, g)[tenant]; again.Spent.Tokens == tokens && math.Abs(again.Spent.Cost["USD"]-usd) < 1e-9 {
				return
			}
		}
	}
	t.Fatalf("%s: tenant %s spent %d tokens, %v USD; want %d tokens, %v USD", step, tenant, got.Spent.Tokens, got.Spent.Cost["USD"], tokens, usd)
}

// secLoad loads sid on p (a new connection) and fails unless it is served.
func secLoad(t *testing.T, p subjPeer, who, sid, cwd string) {
	t.Helper()
	m, _ := subjCall(t, p, who+"'s session/load", "session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": []any{}})
	if m.Error != nil {
		t.Fatalf("%s's session/load: %s", who, m.Raw)
	}
}

// secPrompt prompts text in sid on p and returns the answer.
func secPrompt(t *testing.T, p subjPeer, what, sid, text string) rpcMsg {
	t.Helper()
	m, _ := subjCall(t, p, what, "session/prompt", textPrompt(sid, text))
	return m
}

// The review's run, over each transport: a session spends 3 USD and 200
// tokens; a new connection loads it (the fake agent's total carries on,
// and its replay tells it: the replay counts nothing) and reports 5
// (counts 2 over the replayed 3; at 99b340a nothing, the load's
// baseline); a third loads it and reports the same total (counts nothing
// more), then 50 (counts 45: the turn is cancelled,
// past the cap of 10 USD); a fourth that loads it to spend 500 is refused.
func TestSecBudgetReloadCountsOnce(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: secBudgetConfig(t, e, "", t.TempDir(),
				map[string]string{"acme": "{tokens: 100000, cost: {USD: 10}}"})})
			cwd := e.roots["acme"]
			p := tr.dial(t, g, e.tokens["acme"])
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			if r := secPrompt(t, p, "the first turn", sid, "spend 3 every=1ms tokens=100,100"); stopReason(t, r) != "end_turn" {
				t.Fatalf("the first turn: %s", r.Raw)
			}
			secSpent(t, g, "acme", "after the first turn", 200, 3)

			p2 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p2, "a second connection", sid, cwd)
			secSpent(t, g, "acme", "the load's replay of 3", 200, 3) // a replay's report never counts
			if r := secPrompt(t, p2, "a turn after a load", sid, "spend 5 every=1ms"); stopReason(t, r) != "end_turn" {
				t.Fatalf("a turn after a load: %s", r.Raw)
			}
			secSpent(t, g, "acme", "spend 5 after a load", 200, 5)

			p3 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p3, "a third connection", sid, cwd)
			if r := secPrompt(t, p3, "the same total after another load", sid, "spend 5 every=1ms"); stopReason(t, r) != "end_turn" {
				t.Fatalf("the same total after another load: %s", r.Raw)
			}
			secSpent(t, g, "acme", "the same total reported after another load", 200, 5)
			// Its report crosses the cap: the turn is cancelled, saying why.
			if r := secPrompt(t, p3, "spend 50", sid, "spend 50 every=10s"); stopReason(t, r) != "cancelled" ||
				!strings.Contains(string(r.Result), `"budget":{"tenant":"acme","period":"day","unit":"USD","spent":50,"limit":10`) {
				t.Fatalf("spend 50: %s; want it cancelled at 50 of 10 USD", r.Raw)
			}
			secSpent(t, g, "acme", "spend 50", 200, 50)

			p4 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p4, "a fourth connection", sid, cwd)
			r := secPrompt(t, p4, "spend 500 after another load", sid, "spend 500 every=1ms")
			refusedForBudget(t, r, "budget for tenant acme exhausted: 50.00 of 10.00 USD this day",
				budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 50, Limit: 10})
		})
	}
}

// The cancel evasion, over each transport: on a loaded session, a turn
// reports cost, then the client cancels it before its end; the agent's
// answer carries the tokens it used. What it reported counts: the cost
// over the session's kept value and the cancelled turn's tokens. At
// 99b340a the cost counted nothing (the load's baseline).
func TestSecBudgetCancelledTurnCounts(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: secBudgetConfig(t, e, "", t.TempDir(),
				map[string]string{"acme": "{tokens: 10000000, cost: {USD: 100}}"})})
			cwd := e.roots["acme"]
			p := tr.dial(t, g, e.tokens["acme"])
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			if r := secPrompt(t, p, "the first turn", sid, "spend 1 every=1ms tokens=10,10"); stopReason(t, r) != "end_turn" {
				t.Fatalf("the first turn: %s", r.Raw)
			}
			secSpent(t, g, "acme", "after the first turn", 20, 1)

			p2 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p2, "a second connection", sid, cwd)
			id := p2.request("session/prompt", textPrompt(sid, "spend 1.5,1.75 every=2s tokens=400000,400000 cancel=usage"))
			reported := false
			subjUntil(t, p2, "the turn's first usage_update", func(m rpcMsg) bool {
				reported = m.Method == "session/update" && strings.Contains(string(m.Params), `"usage_update"`)
				return reported
			})
			p2.request("session/cancel", map[string]any{"sessionId": sid})
			r := subjAwait(t, p2, "the cancelled turn", id, func(rpcMsg) {})
			if stopReason(t, r) != "cancelled" {
				t.Fatalf("the cancelled turn: %s", r.Raw)
			}
			var res struct {
				Usage json.RawMessage `json:"usage"`
			}
			if json.Unmarshal(r.Result, &res) != nil || len(res.Usage) == 0 {
				t.Fatalf("the agent's cancelled answer carries no usage: %s", r.Raw)
			}
			secSpent(t, g, "acme", "after the cancelled turn", 800020, 1.5)
		})
	}
}

// The file ledger keeps the sessions' values over a restart: a session
// spends 2, the gateway restarts, a load (its replay carries 2, and counts
// nothing) reports 5 (counts 3; at 99b340a nothing), another load 5 again
// (nothing more) then 6 (counts 1).
func TestSecBudgetKeptOverRestart(t *testing.T) {
	e := newBudgetEnv(t)
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger", "budget.db")
	cfg := secBudgetConfig(t, e, fmt.Sprintf("budgets: {store: %q}\n", "file:"+ledger), dir,
		map[string]string{"acme": "{cost: {USD: 100}}"})
	g := startGateway(t, gwOpts{config: cfg})
	cwd := e.roots["acme"]
	p := subjWS{dialToken(t, g, e.tokens["acme"])}
	m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("session/new: %s", m.Raw)
	}
	if r := secPrompt(t, p, "before the restart", sid, "spend 2 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("before the restart: %s", r.Raw)
	}
	secSpent(t, g, "acme", "before the restart", 0, 2)
	g.Stop(syscall.SIGTERM)

	g = startGateway(t, gwOpts{config: cfg})
	p = subjWS{dialToken(t, g, e.tokens["acme"])}
	secLoad(t, p, "the client after the restart", sid, cwd)
	secSpent(t, g, "acme", "the load's replay of 2", 0, 2)
	if r := secPrompt(t, p, "more after the restart", sid, "spend 5 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("more after the restart: %s", r.Raw)
	}
	secSpent(t, g, "acme", "5 after the restart", 0, 5)

	p2 := subjWS{dialToken(t, g, e.tokens["acme"])}
	secLoad(t, p2, "another client after the restart", sid, cwd)
	if r := secPrompt(t, p2, "the same total on another load", sid, "spend 5,6 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("the same total on another load: %s", r.Raw)
	}
	secSpent(t, g, "acme", "5 again, then 6", 0, 6)
}

// Two gateways on one Redis ledger: a session made and spent (3) on the
// first is loaded on the second (its replay carries 3 and counts
// nothing), whose report of 8 counts 5 (at 99b340a nothing); loaded back
// on the first, 8 again counts nothing (not twice), then 9 counts 1.
func TestSecBudgetKeptAcrossGateways(t *testing.T) {
	redis := redistest.Start(t)
	e := newBudgetEnv(t)
	dir := t.TempDir()
	cfg := secBudgetConfig(t, e, fmt.Sprintf("budgets: {store: %q}\n", redis.URL(0)), dir,
		map[string]string{"acme": "{cost: {USD: 100}}"})
	g1 := startGateway(t, gwOpts{config: cfg})
	g2 := startGateway(t, gwOpts{config: cfg})
	cwd := e.roots["acme"]
	p1 := subjWS{dialToken(t, g1, e.tokens["acme"])}
	m, _ := subjCall(t, p1, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	sid := m.NewSessionID()
	if sid == "" {
		t.Fatalf("session/new: %s", m.Raw)
	}
	if r := secPrompt(t, p1, "on the first gateway", sid, "spend 3 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("on the first gateway: %s", r.Raw)
	}
	secSpent(t, g1, "acme", "on the first gateway", 0, 3)

	p2 := subjWS{dialToken(t, g2, e.tokens["acme"])}
	secLoad(t, p2, "the client on the second gateway", sid, cwd)
	secSpent(t, g2, "acme", "the load's replay of 3 on the second gateway", 0, 3)
	if r := secPrompt(t, p2, "more on the second", sid, "spend 8 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("more on the second: %s", r.Raw)
	}
	secSpent(t, g2, "acme", "8 on the second gateway", 0, 8)

	p3 := subjWS{dialToken(t, g1, e.tokens["acme"])}
	secLoad(t, p3, "the client back on the first gateway", sid, cwd)
	if r := secPrompt(t, p3, "back on the first", sid, "spend 8,9 every=1ms"); stopReason(t, r) != "end_turn" {
		t.Fatalf("back on the first: %s", r.Raw)
	}
	secSpent(t, g1, "acme", "9 back on the first gateway", 0, 9)
	secSpent(t, g2, "acme", "9 as the second gateway reads it", 0, 9)
}

// A turn the gateway ends because the agent did not answer in time
// (timeouts.prompt) still counts the usage the agent's answer brings
// after it, over each transport. At 99b340a that answer was dropped as
// unknown and its tokens never counted.
func TestSecBudgetTimedOutTurnCounts(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: secBudgetConfig(t, e, "timeouts: {prompt: 1s}\n", t.TempDir(),
				map[string]string{"acme": "{tokens: 10000000, cost: {USD: 100}}"})})
			p := tr.dial(t, g, e.tokens["acme"])
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": e.roots["acme"], "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			// Its second report would come after 3 s: the gateway answers
			// for the agent first and cancels the turn; the agent's answer
			// (cancelled, with its usage) comes after.
			r := secPrompt(t, p, "a turn past timeouts.prompt", sid, "spend 1,2 every=3s tokens=400000,400000 cancel=usage")
			if r.Error == nil || !strings.Contains(r.Error.Message, "did not answer session/prompt") {
				t.Fatalf("a turn past timeouts.prompt: %s; want the gateway's timeout error", r.Raw)
			}
			secSpent(t, g, "acme", "after the timed-out turn", 800000, 1)
		})
	}
}

// Reload before each turn, with an agent whose total starts again from
// zero at each load (claude-agent-acp: its SDK's total_cost_usd, a new
// query after session/load; the fake agent's "total=load"), over each
// transport: every turn counts. A session's turn costs 6; a new
// connection loads it and its turn costs 2 (the agent reports 2); the same
// connection loads it again and its turn reports 0.5 then 1; a third
// loads it for 0.75, a fourth for 0.5, which crosses the cap of 10 (the
// turn is cancelled at 10.25), and a fifth is refused. With the kept
// value the highest total (the branch before) every report after the
// first counted nothing, below 6; at 99b340a a load's first report was a
// baseline.
func TestSecBudgetRestartedTotalCountsEachTurn(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: secBudgetConfig(t, e, "", t.TempDir(),
				map[string]string{"acme": "{cost: {USD: 10}}"})})
			cwd := e.roots["acme"]
			p := tr.dial(t, g, e.tokens["acme"])
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			turn := func(p subjPeer, what, text string) {
				t.Helper()
				if r := secPrompt(t, p, what, sid, text); stopReason(t, r) != "end_turn" {
					t.Fatalf("%s: %s", what, r.Raw)
				}
			}
			turn(p, "the first turn", "spend 6 every=1ms total=load")
			secSpent(t, g, "acme", "the first turn", 0, 6)

			p2 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p2, "a second connection", sid, cwd)
			turn(p2, "a turn of 2 after a load", "spend 2 every=1ms total=load")
			secSpent(t, g, "acme", "a turn of 2 after a load", 0, 8)

			secLoad(t, p2, "the second connection again", sid, cwd)
			turn(p2, "a turn of 1 after a load on the same connection", "spend 0.5,1 every=1ms total=load")
			secSpent(t, g, "acme", "a turn of 1 after a load on the same connection", 0, 9)

			p3 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p3, "a third connection", sid, cwd)
			turn(p3, "a turn of 0.75 after a load", "spend 0.75 every=1ms total=load")
			secSpent(t, g, "acme", "a turn of 0.75 after a load", 0, 9.75)

			// Its report crosses the cap: the turn waits (every=10s) and
			// is cancelled, saying why.
			p4 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p4, "a fourth connection", sid, cwd)
			if r := secPrompt(t, p4, "a turn of 0.5 after a load", sid, "spend 0.5 every=10s total=load"); stopReason(t, r) != "cancelled" ||
				!strings.Contains(string(r.Result), `"budget":{"tenant":"acme","period":"day","unit":"USD","spent":10.25,"limit":10`) {
				t.Fatalf("a turn of 0.5 after a load: %s; want it cancelled at 10.25 of 10 USD", r.Raw)
			}
			secSpent(t, g, "acme", "a turn of 0.5 after a load", 0, 10.25)

			p5 := tr.dial(t, g, e.tokens["acme"])
			secLoad(t, p5, "a fifth connection", sid, cwd)
			r := secPrompt(t, p5, "a turn after the cap", sid, "spend 0.1 every=1ms total=load")
			refusedForBudget(t, r, "budget for tenant acme exhausted: 10.25 of 10.00 USD this day",
				budgetData{Tenant: "acme", Period: "day", Unit: "USD", Spent: 10.25, Limit: 10})
		})
	}
}

// secAgentWith is cfg (secBudgetConfig's) with the fake agent's env
// extended by env ("K: V, " items) and its agent keys by keys (", k: v").
func secAgentWith(t *testing.T, cfg, env, keys string) string {
	t.Helper()
	if !strings.Contains(cfg, "env: {FAKE_MODE: sessions, ") || !strings.Contains(cfg, ", stop_grace: 1s}") {
		t.Fatal("secBudgetConfig's agent line changed")
	}
	cfg = strings.Replace(cfg, "env: {FAKE_MODE: sessions, ", "env: {FAKE_MODE: sessions, "+env, 1)
	return strings.Replace(cfg, ", stop_grace: 1s}", ", stop_grace: 1s"+keys+"}", 1)
}

// The reload attack on an agent whose total starts again from zero at
// each load and is not replayed (claude-agent-acp; the fake agent's
// "total=load"), over each transport, with usage.cost_total at its
// default (per_load): a client reloads its session before each turn and
// each turn costs as much as the one before (1, 1, 1 USD) or more (2, 3).
// Each load's first report counts over the load's baseline, 0 with no
// replayed total: every turn counts in full, 3 then 8 USD. At the
// branch's previous state a load's first report at or above the kept
// value counted its increase over it (1 of 3, then 3 of 8); at 99b340a
// it was a baseline (nothing).
func TestSecBudgetReloadEqualTurnsCountEach(t *testing.T) {
	for _, tr := range subjTransports {
		t.Run(tr.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			g := startGateway(t, gwOpts{config: secBudgetConfig(t, e, "", t.TempDir(),
				map[string]string{"acme": "{cost: {USD: 100}}"})})
			cwd := e.roots["acme"]
			p := tr.dial(t, g, e.tokens["acme"])
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			var want float64
			for i, cost := range []float64{1, 1, 1, 2, 3} {
				what := fmt.Sprintf("turn %d of %v USD after a reload", i+1, cost)
				pi := tr.dial(t, g, e.tokens["acme"])
				secLoad(t, pi, fmt.Sprintf("connection %d", i+2), sid, cwd)
				if r := secPrompt(t, pi, what, sid, fmt.Sprintf("spend %v every=1ms total=load", cost)); stopReason(t, r) != "end_turn" {
					t.Fatalf("%s: %s", what, r.Raw)
				}
				want += cost
				secSpent(t, g, "acme", what, 0, want)
			}
		})
	}
}

// usage.cost_total, for an agent whose total carries on across loads but
// whose replay does not tell it (FAKE_REPLAY_COST=off): a session spends
// 3; a new connection loads it and its turn reports 5. per_load (the
// default) cannot tell that total from one that started again: it counts
// the load's first report in full (8, an overcount of 3: the safe side);
// per_session counts it over the session's kept value (5), and another
// load's report of the same total counts nothing. At 99b340a (and the
// branch before) there was no such setting: the gateway refuses the
// config.
func TestSecBudgetCostTotalSetting(t *testing.T) {
	for _, tc := range []struct {
		name, keys  string
		load, again float64 // spent after the load's turn of 5, and another load's of 5, 6
	}{
		{"per_load", "", 8, 14},
		{"per_session", ", usage: {cost_total: per_session}", 5, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBudgetEnv(t)
			cfg := secAgentWith(t, secBudgetConfig(t, e, "", t.TempDir(), map[string]string{"acme": "{cost: {USD: 100}}"}),
				"FAKE_REPLAY_COST: \"off\", ", tc.keys)
			g := startGateway(t, gwOpts{config: cfg})
			cwd := e.roots["acme"]
			p := subjWS{dialToken(t, g, e.tokens["acme"])}
			m, _ := subjCall(t, p, "session/new", "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
			sid := m.NewSessionID()
			if sid == "" {
				t.Fatalf("session/new: %s", m.Raw)
			}
			if r := secPrompt(t, p, "the first turn", sid, "spend 3 every=1ms"); stopReason(t, r) != "end_turn" {
				t.Fatalf("the first turn: %s", r.Raw)
			}
			secSpent(t, g, "acme", "the first turn", 0, 3)

			p2 := subjWS{dialToken(t, g, e.tokens["acme"])}
			secLoad(t, p2, "a second connection", sid, cwd)
			if r := secPrompt(t, p2, "a turn after a load", sid, "spend 5 every=1ms"); stopReason(t, r) != "end_turn" {
				t.Fatalf("a turn after a load: %s", r.Raw)
			}
			secSpent(t, g, "acme", "5 after a load", 0, tc.load)

			p3 := subjWS{dialToken(t, g, e.tokens["acme"])}
			secLoad(t, p3, "a third connection", sid, cwd)
			if r := secPrompt(t, p3, "the same total after another load, then 6", sid, "spend 5,6 every=1ms"); stopReason(t, r) != "end_turn" {
				t.Fatalf("the same total after another load: %s", r.Raw)
			}
			secSpent(t, g, "acme", "5 again after another load, then 6", 0, tc.again)
		})
	}
}
