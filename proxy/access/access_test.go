package access

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
	// Bounded per scope: past PerScope the scope's oldest is forgotten
	// first.
	const n = 100
	o2 := NewOwners(OwnersConfig{PerScope: n})
	o2.Note("acme", "s1", "token:alice")
	for i := range n {
		o2.Note("acme", fmt.Sprint("n", i), "token:carol")
	}
	if got := o2.kept("acme"); got != n {
		t.Errorf("%d entries kept, want %d", got, n)
	}
	if got := o2.Of("acme", "s1"); got != "" {
		t.Errorf("the oldest entry is still kept: %q", got)
	}
	if got := o2.Of("acme", fmt.Sprint("n", n-1)); got != "token:carol" {
		t.Errorf("the newest entry: %q", got)
	}
}

// One tenant's churn never forgets another's owners (finding 8 of the
// review at 99b340a: one ring of 65,536 for every tenant forgot Alice's
// session after another tenant made that many, and her session/list lost
// it). Globex makes twice the per-scope bound (the default 65,536 in
// memory); acme's owner, noted first, is still known, in memory and with a
// file.
func TestOwnersPerTenant(t *testing.T) {
	withFile, err := OpenOwners(filepath.Join(t.TempDir(), "owners.db"), nil, OwnersConfig{PerScope: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer withFile.Close()
	for name, o := range map[string]*Owners{"memory, the default bound": {}, "file": withFile} {
		bound := o.cfg.perScope()
		o.Note("acme", "alice-1", "token:alice")
		for i := range 2 * bound {
			o.Note("globex", fmt.Sprint("g", i), "token:gina")
		}
		if got := o.Of("acme", "alice-1"); got != "token:alice" {
			t.Errorf("%s: after globex made %d sessions, acme's session's owner is %q, want token:alice", name, 2*bound, got)
		}
		if got := o.kept("globex"); got != bound {
			t.Errorf("%s: globex keeps %d owners in memory, want its bound %d", name, got, bound)
		}
		if got := (Sharing{}).Decide("token:alice", o.Of("acme", "alice-1"), List); got != Allowed {
			t.Errorf("%s: Alice may not list her own session: %d", name, got)
		}
	}
}

// Retention: an owner whose session was not used for owners_retention is
// forgotten, in memory and in the file, which shrinks at the next open; a
// session used since (a load) stays, and its maker with it.
func TestOwnersRetention(t *testing.T) {
	const retention = time.Hour
	// The clock is read by the owners file's writer goroutine too.
	var nowNs atomic.Int64
	setNow := func(t time.Time) { nowNs.Store(t.UnixNano()) }
	clock := func() time.Time { return time.Unix(0, nowNs.Load()) }
	setNow(time.Unix(1_800_000_000, 0))
	cfg := OwnersConfig{Retention: retention, Now: clock}

	mem := NewOwners(cfg)
	mem.Note("acme", "old", "token:alice")
	setNow(clock().Add(retention + time.Second))
	if got := mem.Of("acme", "old"); got != "" {
		t.Errorf("memory: an owner unused for longer than the retention: %q", got)
	}
	mem.Note("acme", "old", "jwt:bob") // forgotten: whoever makes it now is its maker
	if got := mem.Of("acme", "old"); got != "jwt:bob" {
		t.Errorf("memory: the maker after the retention: %q", got)
	}

	setNow(time.Unix(1_800_000_000, 0))
	path := filepath.Join(t.TempDir(), "owners.db")
	o, err := OpenOwners(path, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const many = 20_000
	for i := range many {
		o.Note("globex", fmt.Sprintf("churn-%05d-%s", i, strings.Repeat("x", 64)), "token:gina")
	}
	o.Note("acme", "kept", "token:alice")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	before := fileSize(t, path)

	// Half the retention later, Alice loads her session: a use; and an
	// eighth later, she ends it: a use too soon after the last for Note
	// to write it, written at Close.
	setNow(clock().Add(retention / 2))
	if o, err = OpenOwners(path, nil, cfg); err != nil {
		t.Fatal(err)
	}
	o.Note("acme", "kept", "token:alice")
	setNow(clock().Add(retention / 8))
	o.Note("acme", "kept", "token:alice")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}

	// Past the retention of the churn and of Alice's load, not of her
	// last use.
	setNow(clock().Add(retention - retention/16))
	if o, err = OpenOwners(path, nil, cfg); err != nil {
		t.Fatal(err)
	}
	if got := o.Of("acme", "kept"); got != "token:alice" {
		t.Errorf("a session used within the retention: owner %q, want token:alice", got)
	}
	if got := o.Of("globex", fmt.Sprintf("churn-%05d-%s", 7, strings.Repeat("x", 64))); got != "" {
		t.Errorf("a session unused past the retention: owner %q, want forgotten", got)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	after := fileSize(t, path)
	if after*4 > before {
		t.Errorf("the owners file is %d bytes after forgetting %d of %d records, %d before; want it to shrink to under a quarter", after, many, many+1, before)
	}
	t.Logf("owners file: %d bytes with %d records, %d after forgetting all but one", before, many+1, after)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A file keeps the owners across a restart; a session's maker never
// changes there either.
func TestOwnersFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "owners.db")
	o, err := OpenOwners(path, nil, OwnersConfig{})
	if err != nil {
		t.Fatal(err)
	}
	o.Note("acme", "s1", "token:alice")
	o.Note("acme", "s1", "jwt:bob")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o, err = OpenOwners(path, nil, OwnersConfig{})
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
