package roomsize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	long := "package p\n\ntype T struct{}\n\nfunc (*T) a() {}\nfunc (T) b() {}\n\nfunc f() {\n" + strings.Repeat("\t_ = 1\n", 10) + "}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "skipped"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "skipped", "q.go"), []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Check(dir, Limits{MaxMethods: 1, MaxFuncLines: 5, Skip: []string{"skipped"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Methods[filepath.Join(dir, "T")]; n != 2 {
		t.Fatalf("T has %d methods counted, want 2 (%v)", n, r.Methods)
	}
	if len(r.Problems) != 2 || !strings.Contains(r.Problems[0], "f has 12 lines") || !strings.Contains(r.Problems[1], "T has 2 methods") {
		t.Fatalf("problems %q", r.Problems)
	}
}
