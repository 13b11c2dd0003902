package access

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// One rule for every action: the table is the whole of it.
func TestDecide(t *testing.T) {
	const alice, bob = "token:alice", "jwt:bob"
	rofo := Sharing{Attach: Tenant, ReadOnlyForOthers: true}
	for _, tc := range []struct {
		sharing       Sharing
		caller, owner string
		list, att, ld Verdict
		write         Verdict
	}{
		{Sharing{}, alice, alice, Allowed, Allowed, Allowed, Allowed},
		{Sharing{}, bob, alice, Refused, Refused, Refused, Refused},
		{Sharing{Attach: SameSubject}, bob, alice, Refused, Refused, Refused, Refused},
		{Sharing{Attach: Off}, bob, alice, Refused, Refused, Refused, Refused},
		{Sharing{Attach: Off}, alice, alice, Allowed, Allowed, Allowed, Allowed},
		{Sharing{Attach: Tenant}, bob, alice, Allowed, Allowed, Allowed, Allowed},
		{rofo, bob, alice, Allowed, ReadOnly, ReadOnly, ReadOnly},
		{rofo, alice, alice, Allowed, Allowed, Allowed, Allowed},
		// The empty owner is nobody's, but for a gateway without credentials.
		{Sharing{}, alice, "", Refused, Refused, Refused, Refused},
		{Sharing{Attach: Tenant}, alice, "", Allowed, Allowed, Allowed, Allowed},
		{rofo, alice, "", Allowed, ReadOnly, ReadOnly, ReadOnly},
		{Sharing{}, "", "", Allowed, Allowed, Allowed, Allowed},
	} {
		name := fmt.Sprintf("%+v/%s/%s", tc.sharing, tc.caller, tc.owner)
		for a, want := range map[Action]Verdict{List: tc.list, Attach: tc.att, Load: tc.ld, Write: tc.write} {
			if got := tc.sharing.Decide(tc.caller, tc.owner, a); got != want {
				t.Errorf("%s: action %d: %d, want %d", name, a, got, want)
			}
		}
	}
}

func TestOwners(t *testing.T) {
	var o Owners
	o.Note("acme", "s1", "token:alice")
	o.Note("acme", "s1", "jwt:bob") // a session's maker never changes
	o.Note("acme", "s2", "")        // nobody: not recorded
	if got := o.Of("acme", "s1"); got != "token:alice" {
		t.Errorf("s1: %q", got)
	}
	if got := o.Of("globex", "s1"); got != "" {
		t.Errorf("another scope's s1: %q", got)
	}
	if got := o.Of("acme", "s2"); got != "" {
		t.Errorf("s2: %q", got)
	}
	// Bounded: past maxOwners the oldest is forgotten first.
	for i := range maxOwners {
		o.Note("acme", fmt.Sprint("n", i), "token:carol")
	}
	if len(o.m) != maxOwners {
		t.Errorf("%d entries kept, want %d", len(o.m), maxOwners)
	}
	if got := o.Of("acme", "s1"); got != "" {
		t.Errorf("the oldest entry is still kept: %q", got)
	}
	if got := o.Of("acme", fmt.Sprint("n", maxOwners-1)); got != "token:carol" {
		t.Errorf("the newest entry: %q", got)
	}
}

// A file keeps the owners across a restart; a session's maker never
// changes there either.
func TestOwnersFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "owners.db")
	o, err := OpenOwners(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Note("acme", "s1", "token:alice")
	o.Note("acme", "s1", "jwt:bob")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o, err = OpenOwners(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	o.Note("acme", "s1", "jwt:bob") // known from the file
	if got := o.Of("acme", "s1"); got != "token:alice" {
		t.Errorf("after a restart: %q", got)
	}
	if got := o.Of("acme", "s2"); got != "" {
		t.Errorf("an unknown session: %q", got)
	}
	o.Note("acme", "s1", "jwt:bob") // known from the file now
	if got := o.Of("acme", "s1"); got != "token:alice" {
		t.Errorf("a later note changed the maker: %q", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the file: %v %v", fi.Mode(), err)
	}
	// Closed (a shutdown racing a late session): a note is kept in memory
	// only, never sent to the closed writer; Close runs twice.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o.Note("acme", "late", "token:carol")
	if got := o.Of("acme", "late"); got != "token:carol" {
		t.Errorf("a note after Close: %q", got)
	}
}
