package inflight

import (
	"slices"
	"testing"
)

// clientReq and agentReq stand for the two kinds of request.
type clientReq struct{ id string }
type agentReq struct{ method string }

func newTable() *Table[*clientReq, *agentReq] {
	t := NewTable[*clientReq, *agentReq]()
	return &t
}

func TestTableTracksBothWays(t *testing.T) {
	q := newTable()
	if !q.Empty() || q.Busy() || q.Pending() != 0 {
		t.Fatal("a new table is not empty")
	}
	r := &clientReq{"1"}
	if !q.TrackClient([]byte(`"1"`), r) {
		t.Fatal("TrackClient refused on an open table")
	}
	if q.Client([]byte(`"1"`)) != r || q.Client([]byte(`1`)) != nil {
		t.Fatal("Client does not find the request by its raw id only")
	}
	if q.Pending() != 1 || !q.Busy() || q.Empty() {
		t.Fatal("a tracked client request is not in flight")
	}
	// A request tracked later with the same id is not forgotten for the
	// earlier one.
	r2 := &clientReq{"1 again"}
	q.TrackClient([]byte(`"1"`), r2)
	q.ForgetClient([]byte(`"1"`), r)
	if q.Client([]byte(`"1"`)) != r2 {
		t.Fatal("ForgetClient forgot another request with the same id")
	}
	q.ForgetClient([]byte(`"1"`), r2)
	if !q.Empty() {
		t.Fatal("ForgetClient left the request")
	}

	a, b := &agentReq{"a"}, &agentReq{"b"}
	ida, ok := q.AddAgent(a)
	idb, okb := q.AddAgent(b)
	if !ok || !okb || ida == idb {
		t.Fatalf("AddAgent: ids %d, %d (%v, %v)", ida, idb, ok, okb)
	}
	if !q.Busy() || q.Pending() != 0 {
		t.Fatal("agent requests are not in flight, or are counted as the client's")
	}
	if q.TakeAgent(ida) != a || q.TakeAgent(ida) != nil {
		t.Fatal("TakeAgent does not take the request once")
	}
	q.ForgetAgent(idb)
	if !q.Empty() {
		t.Fatal("ForgetAgent left the request")
	}
}

func TestTableClosedTakesNothing(t *testing.T) {
	q := newTable()
	r, a := &clientReq{"1"}, &agentReq{"a"}
	q.TrackClient([]byte(`1`), r)
	id, _ := q.AddAgent(a)
	client, agent := q.Close()
	if client[`1`] != r || agent[id] != a || len(client) != 1 || len(agent) != 1 {
		t.Fatalf("Close took %v, %v", client, agent)
	}
	if q.TrackClient([]byte(`2`), &clientReq{"2"}) {
		t.Fatal("a closed table tracked a client request")
	}
	if id, ok := q.AddAgent(&agentReq{"b"}); ok || id != 0 {
		t.Fatalf("a closed table added an agent request as %d", id)
	}
	if !q.Empty() || q.Client([]byte(`1`)) != nil || q.TakeAgent(id) != nil {
		t.Fatal("a closed table still holds requests")
	}
	q.ForgetClient([]byte(`1`), r) // no panic on the closed table
	q.Withdraw(id)
	if client, agent := q.Close(); len(client) != 0 || len(agent) != 0 {
		t.Fatalf("a second Close took %v, %v", client, agent)
	}
}

func TestTableWithdrawnOnceAndBounded(t *testing.T) {
	q := newTable()
	a := &agentReq{"a"}
	id, _ := q.AddAgent(a)
	q.Withdraw(id)
	if q.TakeAgent(id) != nil {
		t.Fatal("a withdrawn request is still in flight")
	}
	if !q.WasWithdrawn(id) {
		t.Fatal("a withdrawn id was not remembered")
	}
	if q.WasWithdrawn(id) {
		t.Fatal("a withdrawn id was remembered twice")
	}
	if q.WasWithdrawn(id + 1) {
		t.Fatal("an id never withdrawn was")
	}

	// The remembered ids are bounded: past maxWithdrawn the old ones go.
	for i := range int64(maxWithdrawn) {
		q.Withdraw(100 + i)
	}
	q.Withdraw(1000)
	if n := len(q.withdrawn); n > maxWithdrawn {
		t.Fatalf("%d withdrawn ids remembered, more than %d", n, maxWithdrawn)
	}
	if !q.WasWithdrawn(1000) {
		t.Fatal("the latest withdrawn id was forgotten")
	}
	if q.WasWithdrawn(100) {
		t.Fatal("the oldest withdrawn id was kept past the bound")
	}
}

func TestTableTakeIfOursTakesOnlyTheSameRequest(t *testing.T) {
	q := newTable()
	a, other := &agentReq{"a"}, &agentReq{"other"}
	id, _ := q.AddAgent(a)
	if q.TakeIfOurs(id, other) {
		t.Fatal("TakeIfOurs took another request")
	}
	if q.TakeIfOurs(id+1, a) {
		t.Fatal("TakeIfOurs took the request under another id")
	}
	if !q.TakeIfOurs(id, a) {
		t.Fatal("TakeIfOurs did not take the request")
	}
	if q.TakeIfOurs(id, a) || !q.Empty() {
		t.Fatal("TakeIfOurs took the request twice")
	}
}

func TestSetClose(t *testing.T) {
	var s Set[*agentReq]
	if len(s.List()) != 0 {
		t.Fatal("the zero set is not empty")
	}
	a, b := &agentReq{"a"}, &agentReq{"b"}
	if !s.Add(a) || !s.Add(b) || !s.Add(a) {
		t.Fatal("an open set refused a request")
	}
	got := s.List()
	if len(got) != 2 || !slices.Contains(got, a) || !slices.Contains(got, b) {
		t.Fatalf("List = %v", got)
	}
	s.Done(a)
	if got := s.List(); len(got) != 1 || got[0] != b {
		t.Fatalf("List after Done = %v", got)
	}
	s.Close()
	if len(s.List()) != 0 {
		t.Fatal("Close kept requests")
	}
	if s.Add(a) || len(s.List()) != 0 {
		t.Fatal("a closed set took a request")
	}
	s.Done(b) // no panic on the closed set
}

// A budget holds up to its bound and no more; what is released is free.
func TestBudget(t *testing.T) {
	b := Budget{Max: 10}
	if !b.Hold(6) || !b.Hold(4) || b.Hold(1) {
		t.Fatal("a budget of 10 took 6 and 4 but not 1 more?")
	}
	if b.Held() != 10 {
		t.Fatalf("held %d after a refusal, want 10", b.Held())
	}
	b.Release(4)
	if !b.Hold(3) || b.Held() != 9 {
		t.Fatalf("held %d after releasing 4 and taking 3, want 9", b.Held())
	}
}

// Recent forgets its oldest key past Max.
func TestRecent(t *testing.T) {
	r := Recent[string]{Max: 2}
	r.Add("a")
	r.Add("b")
	r.Add("a") // already there: nothing moves
	r.Add("c")
	if r.Has("a") || !r.Has("b") || !r.Has("c") {
		t.Fatalf("after a, b, a, c with room for 2: a %v, b %v, c %v", r.Has("a"), r.Has("b"), r.Has("c"))
	}
}
