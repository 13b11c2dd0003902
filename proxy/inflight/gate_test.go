package inflight

import (
	"errors"
	"testing"
)

// A gate holds in order while a wait is open; the last Open drains, and
// what arrives while draining is held behind; a wait opened meanwhile
// stops the drain, and its Open resumes it.
func TestGateHoldsInOrder(t *testing.T) {
	var g Gate[int]
	if held, err := g.Hold(0, 1); held || err != nil || g.Active() {
		t.Fatal("an idle gate held a message")
	}
	if !g.Close() || g.Close() {
		t.Fatal("Close: first only for the first wait")
	}
	for i := 1; i <= 3; i++ {
		if held, err := g.Hold(i, 10); !held || err != nil {
			t.Fatalf("hold %d: %v %v", i, held, err)
		}
	}
	if drain, idle := g.Open(); drain || idle {
		t.Fatal("one of two waits ended: no drain")
	}
	if drain, idle := g.Open(); !drain || idle {
		t.Fatal("the last wait ended: drain")
	}
	if drain, idle := g.Open(); drain || idle {
		t.Fatal("an Open with no wait did something")
	}
	if v, n, ok, _ := g.Next(); !ok || v != 1 || n != 10 {
		t.Fatalf("next: %d %d %v", v, n, ok)
	}
	if held, _ := g.Hold(4, 10); !held {
		t.Fatal("a message while draining passed the held ones")
	}
	g.Close() // a new load: the drain stops
	if _, _, ok, idle := g.Next(); ok || idle {
		t.Fatal("the drain went on past a new wait")
	}
	if drain, _ := g.Open(); !drain {
		t.Fatal("the new wait's end does not drain the rest")
	}
	var got []int
	for {
		v, _, ok, idle := g.Next()
		if !ok {
			if !idle {
				t.Fatal("the drain stopped with nothing waiting")
			}
			break
		}
		got = append(got, v)
	}
	if len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 4 {
		t.Fatalf("drained %v, want [2 3 4]", got)
	}
	if held, _ := g.Hold(5, 1); held || g.Active() {
		t.Fatal("the drained gate still holds")
	}
}

// A gate is bounded in number and bytes; Drop gives back everything held.
func TestGateBoundsAndDrop(t *testing.T) {
	var g Gate[int]
	g.Close()
	if held, err := g.Hold(0, MaxGatedBytes+1); held || !errors.Is(err, ErrGateBytes) {
		t.Fatalf("too big: %v %v", held, err)
	}
	for i := range MaxGated {
		if held, err := g.Hold(i, 1); !held || err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
	}
	if held, err := g.Hold(MaxGated, 1); held || !errors.Is(err, ErrGateFull) {
		t.Fatalf("too many: %v %v", held, err)
	}
	vs, ns, idle := g.Drop()
	if len(vs) != MaxGated || len(ns) != MaxGated || vs[0] != 0 || vs[MaxGated-1] != MaxGated-1 || idle {
		t.Fatalf("drop: %d values, idle %v (a wait is still open)", len(vs), idle)
	}
	if drain, idle := g.Open(); drain || !idle {
		t.Fatal("the wait's end after a drop: idle, nothing to drain")
	}
}
