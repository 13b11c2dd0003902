package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/audit"
)

// writeTrail writes n audit events to path, reopening it after each
// rotation (a rename to path.1, path.2…) as SIGHUP does.
func writeTrail(t *testing.T, path string, n int, rotateAt ...int) {
	t.Helper()
	l, err := audit.Open(audit.Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		for k, at := range rotateAt {
			if i == at {
				if err := os.Rename(path, path+"."+string(rune('1'+k))); err != nil {
					t.Fatal(err)
				}
				if err := l.Reopen(); err != nil {
					t.Fatal(err)
				}
			}
		}
		l.Record(audit.Event{Event: "prompt.started", Tenant: "acme", Subject: "alice", Session: "s", Fields: []audit.Field{audit.F("n", i)}})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAuditVerify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeTrail(t, path, 5, 2)
	code, out, errOut := runCmd(t, "audit", "verify", path+".1", path)
	if code != 0 || out != "5 lines intact in 2 files\n" || errOut != "" {
		t.Fatalf("audit verify: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCmd(t, "audit", "verify", path)
	if code != 0 || !strings.Contains(out, path+": line 1 chains to a line not given") || !strings.HasSuffix(out, "3 lines intact in 1 file\n") {
		t.Errorf("audit verify of the newer file alone: code %d, stdout %q", code, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	changed := strings.Join(append([]string{strings.Replace(lines[0], `"n":2`, `"n":7`, 1)}, lines[1:]...), "")
	if err := os.WriteFile(path, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, "audit", "verify", path+".1", path)
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "acpgate audit verify: "+path+": line 2: prev is not the SHA-256 of line 1") ||
		!strings.Contains(errOut, "3 lines intact before it") {
		t.Errorf("audit verify of a changed line: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, args := range [][]string{{"audit"}, {"audit", "verify"}, {"audit", "check", path}, {"audit", "verify", "--x"}} {
		if code, _, errOut := runCmd(t, args...); code != 2 || !strings.Contains(errOut, "usage: acpgate audit verify FILE...") {
			t.Errorf("acpgate %s: code %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
	if code, _, errOut := runCmd(t, "audit", "verify", path+".missing"); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("audit verify of a missing file: code %d, stderr %q", code, errOut)
	}
}

func TestCheckConfigAuditUnwritable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing", "audit.jsonl")
	path := writeFile(t, "audit.yaml", "audit:\n  file: "+missing+"\n")
	code, out, errOut := runCmd(t, "check-config", "--config", path)
	if code != 1 || out != "" || !strings.Contains(errOut, path+": line 2, column 9: audit.file: \""+missing+"\": its directory "+
		filepath.Dir(missing)+" does not exist") {
		t.Errorf("check-config: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	dir := t.TempDir()
	ok := writeFile(t, "audit.yaml", "audit:\n  file: "+filepath.Join(dir, "audit.jsonl")+"\n")
	if code, _, errOut := runCmd(t, "check-config", "--config", ok); code != 0 {
		t.Errorf("check-config with a writable audit.file: code %d, stderr %q", code, errOut)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("check-config left %v behind", entries)
	}
}
