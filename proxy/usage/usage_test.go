package usage

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// Each currency has a baseline of its own, even two whose label is
// "other"; a report counted as too large moves the baseline too.
func TestCostBaselinePerCurrency(t *testing.T) {
	var mt Meter
	var total float64
	report := func(cur string, amount float64) string {
		c, label, ok := currencyOf([]byte(`"` + cur + `"`))
		if !ok {
			t.Fatalf("currency %q refused", cur)
		}
		inc, _, reject := mt.NoteCost(c, label, amount)
		total += inc
		return reject
	}
	for range 3 { // two odd currencies, one label, alternating
		report("crédits", 100)
		report("$$", 5)
	}
	if total != 105 {
		t.Fatalf("counted %v for 100 crédits and 5 $$, each reported three times; want 105", total)
	}
	if got := mt.Usage().Cost["other"]; got != 105 {
		t.Fatalf("the session's cost under other: %v, want 105", got)
	}
	total = 0
	report("USD", 1)
	if r := report("USD", 2e9); r != RejectTooLarge {
		t.Fatalf("a rise of 2e9: %q, want %q", r, RejectTooLarge)
	}
	report("USD", 2e9+3)
	if total != 4 {
		t.Fatalf("counted %v after a too-large report; want 1 before it and 3 after", total)
	}
}

// A cumulative cost that goes down counts nothing and is the new baseline.
func TestCostDecreased(t *testing.T) {
	var mt Meter
	for _, step := range []struct {
		amount, inc float64
		reject      string
	}{{5, 5, ""}, {3, 0, RejectDecreased}, {4, 1, ""}, {4, 0, ""}} {
		inc, _, reject := mt.NoteCost("USD", "USD", step.amount)
		if inc != step.inc || reject != step.reject {
			t.Errorf("report %v: %v, %q; want %v, %q", step.amount, inc, reject, step.inc, step.reject)
		}
	}
	if got := mt.Usage().Cost["USD"]; got != 6 {
		t.Errorf("session cost %v, want 6", got)
	}
}

// A session tracks MaxCurrencies currencies; a further one counts nothing,
// the ones it knows still count.
func TestCostCurrenciesCap(t *testing.T) {
	var mt Meter
	for i := range MaxCurrencies {
		cur := string(rune('A' + i))
		if _, _, reject := mt.NoteCost(cur, cur, 1); reject != "" {
			t.Fatalf("currency %d of %d: %q", i+1, MaxCurrencies, reject)
		}
	}
	if inc, _, reject := mt.NoteCost("Z", "Z", 1); inc != 0 || reject != RejectCurrencies {
		t.Errorf("one currency too many: %v, %q; want 0, %q", inc, reject, RejectCurrencies)
	}
	if inc, _, reject := mt.NoteCost("A", "A", 3); inc != 2 || reject != "" {
		t.Errorf("a known currency after the cap: %v, %q; want 2", inc, reject)
	}
}

// What a replay brings, and a loaded session's first amount, only set the
// baseline; the turn's share is what it counted since it started.
func TestCostReplayAndLoad(t *testing.T) {
	var mt Meter
	mt.ReplayStarted()
	if inc, _, reject := mt.NoteCost("USD", "USD", 10); inc != 0 || reject != "" {
		t.Errorf("during a replay: %v, %q; want 0", inc, reject)
	}
	mt.ReplayEnded()
	mt.TurnStarted()
	if inc, _, _ := mt.NoteCost("USD", "USD", 12); inc != 2 {
		t.Errorf("after the replay: %v, want 2", inc)
	}
	if got := mt.TurnCost(); !maps.Equal(got, map[string]float64{"USD": 2}) {
		t.Errorf("turn cost %v", got)
	}
	mt.TurnStarted()
	if got := mt.TurnCost(); len(got) != 0 {
		t.Errorf("turn cost after a new turn started: %v", got)
	}

	var loaded Meter
	loaded.Loaded()
	if inc, _, _ := loaded.NoteCost("EUR", "EUR", 7); inc != 0 {
		t.Errorf("a loaded session's first amount counted %v", inc)
	}
	if inc, _, _ := loaded.NoteCost("EUR", "EUR", 8); inc != 1 {
		t.Errorf("a loaded session's second amount counted %v, want 1", inc)
	}
}

// Which reports are live, what a budget counts against the session's kept
// value (finding 5 of the review at 99b340a): a loaded session's first
// report is one, though this meter takes it as its baseline (at 99b340a it
// reached no budget: a reload made the next turn free), and so are a
// decrease and a jump; a replay's reports and a currency past the cap are
// not.
func TestCostLiveReports(t *testing.T) {
	var loaded Meter
	loaded.Loaded()
	loaded.ReplayStarted()
	if inc, b, reject := loaded.NoteCost("USD", "USD", 3); inc != 0 || b.Live || reject != "" {
		t.Errorf("a replay's report: %v, live %v, %q; want 0, not live", inc, b.Live, reject)
	}
	loaded.ReplayEnded()
	for _, step := range []struct {
		amount, inc float64
		reject      string
	}{{50, 47, ""}, {40, 0, RejectDecreased}, {40 + MaxCostIncrease*2, 0, RejectTooLarge}} {
		inc, b, reject := loaded.NoteCost("USD", "USD", step.amount)
		if inc != step.inc || !b.Live || reject != step.reject {
			t.Errorf("live report %v: %v, live %v, %q; want %v, live, %q", step.amount, inc, b.Live, reject, step.inc, step.reject)
		}
	}
	var fresh Meter
	fresh.Loaded()
	if inc, b, reject := fresh.NoteCost("EUR", "EUR", 7); inc != 0 || !b.Live || reject != "" {
		t.Errorf("a loaded session's first report without a replay: %v, live %v, %q; want 0 here, live", inc, b.Live, reject)
	}
	for i := range MaxCurrencies - 1 {
		fresh.NoteCost(string(rune('A'+i)), "x", 1)
	}
	if _, b, reject := fresh.NoteCost("Z", "Z", 1); b.Live || reject != RejectCurrencies {
		t.Errorf("a currency past the cap: live %v, %q; want not live, %q", b.Live, reject, RejectCurrencies)
	}
}

// What budgets count a live report from: a session made here counts its
// reports' increases from zero; after each load or resume (even of a
// session live on this meter) the first live report of each currency
// counts over the load's baseline: the last amount its replay carried
// (below it, the total started again: from 0), else 0 with per_load (the
// default), or First (the session's kept value decides) with
// per_session; a replay's report counts nothing, and a decrease within a
// load leaves From where it was (7, 6, 8 counts 8 from 7). At the
// branch's previous state a load's first report without a replay was
// always First: with a total that starts again at each load, a reload
// before each turn of equal cost counted only the first turn.
func TestCostBudgetedFrom(t *testing.T) {
	for _, perSession := range []bool{false, true} {
		var mt Meter
		if perSession {
			mt.SetPerSession()
		}
		check := func(step, cur string, amount float64, want Budgeted) {
			t.Helper()
			if _, b, _ := mt.NoteCost(cur, cur, amount); b != want {
				t.Errorf("per-session %v: %s: %+v; want %+v", perSession, step, b, want)
			}
		}
		check("a new session's first report", "USD", 3, Budgeted{Live: true, From: 0})
		check("its second", "USD", 5, Budgeted{Live: true, From: 3})
		mt.ReplayStarted()
		check("a load's replay", "USD", 9, Budgeted{})
		mt.ReplayEnded()
		check("the load's first live report, over the replayed 9", "USD", 10, Budgeted{Live: true, From: 9})
		check("the load's second", "USD", 12, Budgeted{Live: true, From: 10})
		mt.ReplayStarted()
		check("another load's replay", "USD", 9, Budgeted{})
		mt.ReplayEnded()
		check("the load's first live report, below the replayed 9: in full", "USD", 1, Budgeted{Live: true, From: 0})
		check("the load's second", "USD", 7, Budgeted{Live: true, From: 1})
		check("a decrease", "USD", 6, Budgeted{Live: true, From: 7})
		check("back up", "USD", 8, Budgeted{Live: true, From: 7})
		noReplay := Budgeted{Live: true, From: 0} // per_load: in full
		if perSession {
			noReplay = Budgeted{Live: true, First: true, From: 2} // the kept value decides
		}
		check("another currency's first since the load, none replayed", "EUR", 2, noReplay)
		mt.Loaded()
		mt.ReplayStarted()
		mt.ReplayEnded()
		noReplay = Budgeted{Live: true, From: 0}
		if perSession {
			noReplay = Budgeted{Live: true, First: true, From: 8}
		}
		check("the first after a load that replayed nothing", "USD", 8, noReplay)
		check("then", "USD", 8.5, Budgeted{Live: true, From: 8})
	}
}

func TestParseCost(t *testing.T) {
	for _, tc := range []struct {
		raw, cur, label string
		amount          float64
		reject          string
	}{
		{`{"amount":1.5,"currency":"USD"}`, "USD", "USD", 1.5, ""},
		{`{"amount":0,"currency":"crédits"}`, "crédits", "other", 0, ""},
		{`{"amount":1,"currency":""}`, "", "other", 1, ""},
		{`{"amount":1,"currency":"ABCDEFGHIJKLMNOPQ"}`, "ABCDEFGHIJKLMNOPQ", "other", 1, ""},
		{`{"amount":-1,"currency":"USD"}`, "USD", "USD", 0, RejectNegative},
		{`{"amount":-1e400,"currency":"USD"}`, "USD", "USD", 0, RejectNegative},
		{`{"amount":1e400,"currency":"USD"}`, "USD", "USD", 0, RejectTooLarge},
		{`{"amount":"1","currency":"USD"}`, "USD", "USD", 0, RejectInvalid},
		{`{"amount":1,"currency":5}`, "", "", 1, RejectInvalid},
		{`{"amount":1,"currency":"` + strings.Repeat("A", 65) + `"}`, "", "", 1, RejectInvalid},
		{`[1]`, "", "", 0, RejectInvalid},
	} {
		cur, label, amount, reject := ParseCost([]byte(tc.raw))
		if reject != tc.reject || reject == "" && (cur != tc.cur || label != tc.label || amount != tc.amount) {
			t.Errorf("%.40s: %q, %q, %v, %q; want %q, %q, %v, %q", tc.raw, cur, label, amount, reject,
				tc.cur, tc.label, tc.amount, tc.reject)
		}
	}
}

func TestParseTokens(t *testing.T) {
	tokens, rejects := ParseTokens([]byte(`{"inputTokens":3,"outputTokens":null,"thoughtTokens":1.5,
		"cachedReadTokens":-2,"cachedWriteTokens":2e12,"other":1,"totalTokens":9}`))
	if !maps.Equal(tokens, map[string]int64{"input": 3}) {
		t.Errorf("tokens %v", tokens)
	}
	if want := []string{RejectInvalid, RejectNegative, RejectTooLarge}; !slices.Equal(rejects, want) {
		t.Errorf("rejects %q, want %q", rejects, want)
	}
	if tokens, rejects := ParseTokens([]byte(`"x"`)); tokens != nil || !slices.Equal(rejects, []string{RejectInvalid}) {
		t.Errorf("not an object: %v, %q", tokens, rejects)
	}
	if tokens, rejects := ParseTokens([]byte(`{"inputTokens":1e12,"cachedReadTokens":0}`)); !maps.Equal(tokens, map[string]int64{"input": 1e12, "cached_read": 0}) || rejects != nil {
		t.Errorf("at the limit: %v, %q", tokens, rejects)
	}
}
