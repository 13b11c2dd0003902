package config

import (
	"strings"
	"testing"
)

// check-config refuses a bad rule and says where: an unknown kind or
// decide, a bad glob, an absolute path, one that climbs with "..", an
// unknown key; in the top-level list and in a tenant's.
func TestPermissionsRefused(t *testing.T) {
	data := "permissions:\n" +
		"  - {kind: reed, decide: allow}\n" +
		"  - {path: \"../secrets/**\", decide: allow}\n" +
		"  - {path: \"/etc/**\", decide: deny}\n" +
		"  - {title: \"rm [\", decide: deny}\n" +
		"  - {kind: read, decide: sure}\n" +
		sharingTenants(t, t.TempDir(), []string{"a"}, []string{"    permissions:\n      - {path: \"docs/[x\", decide: allow}\n"})
	ps := problems(t, data)
	if len(ps) != 6 {
		t.Fatalf("want 6 problems, got %d:\n%s", len(ps), list(ps))
	}
	for i, want := range []string{
		`permissions[0].kind: "reed" is not an ACP tool kind`,
		`permissions[1].path: "../secrets/**": must not climb out with ".."`,
		`permissions[2].path: "/etc/**": must be relative to the tenant's root, not absolute`,
		`permissions[3].title: "rm [": has a [ without its ]`,
		`permissions[4].decide: "sure" is not allow, deny or ask`,
		`tenants[0].permissions[0].path: "docs/[x": segment "[x": syntax error in pattern`,
	} {
		p := findProblem(t, ps, want)
		if line := []int{2, 3, 4, 5, 6, 13}[i]; p.Line != line {
			t.Errorf("%q at line %d, want %d", want, p.Line, line)
		}
	}
	if ps := problems(t, "permissions:\n  - {kinds: read, decide: allow}\n"); len(ps) != 1 || !strings.Contains(ps[0].Msg, "kinds") {
		t.Errorf("an unknown rule key: %s", list(ps))
	}
}

// A tenant without a list takes the top-level one (relative to its own
// root); one with an empty list has none; the rules are named for the
// audit trail by the list they are in.
func TestPermissionTable(t *testing.T) {
	dir := t.TempDir()
	cfg := mustParse(t, "permissions:\n  - {kind: read, decide: allow}\n"+sharingTenants(t, dir, []string{"a", "b", "c"}, []string{
		"", "    permissions: []\n",
		"    virtual_root: /workspace\n    permissions:\n      - {path: \"docs/**\", decide: deny}\n",
	}))
	tbl, err := cfg.PermissionTable()
	if err != nil {
		t.Fatal(err)
	}
	read := []byte(`{"params":{"toolCall":{"kind":"read"},"options":[{"optionId":"y","kind":"allow_once"}]}}`)
	if v := tbl.Tenants["a"].Decide(read, ""); v.Decide != "allow" || v.Rule != `permissions[0] {kind: "read", decide: allow}` {
		t.Errorf("a (the top-level list): %+v", v)
	}
	if v := tbl.Tenants["b"].Decide(read, ""); v.Decide != "" {
		t.Errorf("b (an empty list): %+v", v)
	}
	docs := []byte(`{"params":{"toolCall":{"kind":"edit","locations":[{"path":"/workspace/docs/x"}]}}}`)
	if v := tbl.Tenants["c"].Decide(docs, ""); v.Decide != "deny" || !strings.HasPrefix(v.Rule, "tenants[c].permissions[0] ") {
		t.Errorf("c (its own list, under its virtual root): %+v", v)
	}
	if tbl.Default != nil {
		t.Error("with tenants, the default list has no root and must not apply")
	}
	tbl, err = mustParse(t, "permissions:\n  - {decide: deny}\n").PermissionTable()
	if err != nil || tbl.Default == nil {
		t.Fatalf("without tenants the top-level list applies: %v %v", tbl, err)
	}
}
