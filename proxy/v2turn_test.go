package proxy

import (
	"strconv"
	"testing"
)

// A session's idempotencyKeys: a key seen is a retry, its messageId is the
// first acknowledgement's, and the oldest of more than maxPromptKeys is
// forgotten (a prompt with it then runs as a new one).
func TestPromptKeys(t *testing.T) {
	var k promptKeys
	if !k.add("a") || k.add("a") {
		t.Fatal(`add("a") twice: want true, then false`)
	}
	k.answered("a", "m1")
	k.answered("a", "m2")
	if id, ok := k.get("a"); !ok || id != "m1" {
		t.Errorf(`get("a") = %q, %v; want the first acknowledgement's "m1"`, id, ok)
	}
	for i := 1; i < maxPromptKeys; i++ {
		k.add(strconv.Itoa(i))
	}
	if _, ok := k.get("a"); !ok {
		t.Fatalf("forgot a key with %d kept", maxPromptKeys)
	}
	k.add("one more")
	if _, ok := k.get("a"); ok || len(k.ids) != maxPromptKeys || len(k.order) != maxPromptKeys {
		t.Errorf("after %d keys: the oldest kept %v, %d keys, %d in order; want it forgotten, %d", maxPromptKeys+1, ok, len(k.ids), len(k.order), maxPromptKeys)
	}
	if !k.add("a") {
		t.Error("a forgotten key is a retry")
	}
}
