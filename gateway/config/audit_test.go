package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAudit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	cfg := mustParse(t, "audit:\n  file: "+path+"\n  include_prompts: true\n")
	if cfg.Audit != (Audit{File: path, IncludePrompts: true}) {
		t.Errorf("audit = %+v", cfg.Audit)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the check left %s behind: %v", path, err)
	}
	if cfg := mustParse(t, "audit: {file: '-'}\n"); cfg.Audit.File != "-" {
		t.Errorf("audit.file = %q, want -", cfg.Audit.File)
	}
	if cfg := mustParse(t, ""); cfg.Audit != (Audit{}) {
		t.Errorf("default audit = %+v, want off", cfg.Audit)
	}
	if err := os.WriteFile(path, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustParse(t, "audit: {file: "+path+"}\n")
	if b, err := os.ReadFile(path); err != nil || string(b) != "x\n" {
		t.Errorf("the check changed an existing file: %q, %v", b, err)
	}
}

func TestAuditUnwritable(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		filepath.Join(dir, "missing", "audit.jsonl"): "its directory " + filepath.Join(dir, "missing") + " does not exist",
		dir: "is a directory",
	}
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		cases[filepath.Join(ro, "audit.jsonl")] = "cannot be created: permission denied"
		f := filepath.Join(dir, "ro-file")
		if err := os.WriteFile(f, nil, 0o400); err != nil {
			t.Fatal(err)
		}
		cases[f] = "cannot be written: permission denied"
	}
	for path, want := range cases {
		ps := problems(t, "audit:\n  file: "+path+"\n")
		if len(ps) != 1 || ps[0].Line != 2 || !strings.Contains(ps[0].Msg, "audit.file: \""+path+"\": "+want) {
			t.Errorf("audit.file %s: problems %v, want line 2: %s", path, ps, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ro", "audit.jsonl")); err == nil {
		t.Error("the check left a file behind")
	}
}

// audit.hmac_key_file: a hex key of 32 bytes or more, readable by the
// gateway's user only, and only with audit.file.
func TestAuditKeyFile(t *testing.T) {
	dir := t.TempDir()
	trail := filepath.Join(dir, "audit.jsonl")
	key := filepath.Join(dir, "audit.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("0f", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, "audit:\n  file: "+trail+"\n  hmac_key_file: "+key+"\n")
	if k, err := cfg.AuditKey(); err != nil || len(k) != 32 {
		t.Errorf("AuditKey: %d bytes, %v", len(k), err)
	}
	if k, err := mustParse(t, "").AuditKey(); k != nil || err != nil {
		t.Errorf("AuditKey unset: %v, %v", k, err)
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	ps := problems(t, "audit:\n  file: "+trail+"\n  hmac_key_file: "+key+"\n")
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "audit.hmac_key_file: audit key "+key+": mode 0644 lets its group or others read it") {
		t.Errorf("a 0644 key file: %v", ps)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte(strings.Repeat("0f", 31)), 0o400); err != nil {
		t.Fatal(err)
	}
	ps = problems(t, "audit:\n  hmac_key_file: "+short+"\n")
	if len(ps) != 2 || !strings.Contains(ps[0].Msg+ps[1].Msg, "audit.file is not") || !strings.Contains(ps[0].Msg+ps[1].Msg, "at least 32 bytes") {
		t.Errorf("a short key without audit.file: %v", ps)
	}
}
