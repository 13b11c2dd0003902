package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	writeTrail(t, path, 5, 2) // started, 2 events | 3 events, stopped
	code, out, errOut := runCmd(t, "audit", "verify", path+".1", path)
	if code != 0 || out != "7 lines intact in 2 files\n" || errOut != "" {
		t.Fatalf("audit verify: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "audit", "verify", path)
	if code != 3 || !strings.Contains(out, path+": line 1 chains to a line not given") || !strings.HasPrefix(out, "4 lines intact in 1 file\n") ||
		!strings.Contains(errOut, "the trail's head is missing (--allow-missing-head accepts it)") {
		t.Errorf("audit verify of the newer file alone: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "audit", "verify", "--allow-missing-head", path); code != 0 {
		t.Errorf("audit verify --allow-missing-head of the newer file alone: code %d, stderr %q", code, errOut)
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
		!strings.Contains(errOut, "4 lines intact before it") {
		t.Errorf("audit verify of a changed line: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, args := range [][]string{{"audit"}, {"audit", "verify"}, {"audit", "check", path}, {"audit", "verify", "--x", path},
		{"audit", "verify", "--key"}} {
		if code, _, errOut := runCmd(t, args...); code != 2 || !strings.Contains(errOut, "usage: acpgate audit verify [--key FILE]...") {
			t.Errorf("acpgate %s: code %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
	if code, _, errOut := runCmd(t, "audit", "verify", path+".missing"); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("audit verify of a missing file: code %d, stderr %q", code, errOut)
	}
}

// A gap line (events lost to a full queue, a failed write, a crash) makes
// verify report it, naming the line and count, and exit 3 unless
// --allow-gaps.
func TestAuditVerifyGaps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	writeTrail(t, path, 2)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	// As if killed before it wrote its last line: the next start says so.
	if err := os.WriteFile(path, []byte(strings.Join(lines[:3], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	writeTrail(t, path, 1)
	code, out, errOut := runCmd(t, "audit", "verify", path)
	if code != 3 || !strings.Contains(out, path+": line 5: gap: an unknown number of events lost (unclean_shutdown)\n") ||
		!strings.Contains(errOut, "1 gaps: events the gateway lost (--allow-gaps accepts them)") {
		t.Errorf("audit verify of a trail with a gap: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ := runCmd(t, "audit", "verify", "--allow-gaps", path); code != 0 || !strings.Contains(out, "line 5: gap") {
		t.Errorf("audit verify --allow-gaps: code %d, stdout %q", code, out)
	}
}

// The forged re-chained trail: with the key, verify fails naming the
// edited line; without it the chain holds, and verify says the MACs went
// unchecked and exits 4.
func TestAuditVerifyKey(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "audit.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := audit.ReadKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "audit.jsonl")
	l, err := audit.Open(audit.Config{File: path, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		l.Record(audit.Event{Event: "prompt.started", Tenant: "acme", Subject: "alice", Fields: []audit.Field{audit.F("n", i)}})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kid := audit.KeyID(key)
	if code, out, errOut := runCmd(t, "audit", "verify", "--key", keyFile, path); code != 0 ||
		out != "6 lines intact in 1 file, every MAC checked\nkeys, in order: "+kid+" (from "+path+" line 1); the trail ends under key "+kid+"\n" {
		t.Fatalf("audit verify --key of the trail: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	lines[2] = strings.Replace(lines[2], `"subject":"alice"`, `"subject":"bob"`, 1) // line 3
	for i := 3; i < len(lines); i++ {                                               // every later prev recomputed
		sum := sha256.Sum256([]byte(lines[i-1]))
		j := strings.Index(lines[i], `"prev":"`) + len(`"prev":"`)
		lines[i] = lines[i][:j] + hex.EncodeToString(sum[:]) + lines[i][j+64:]
	}
	forged := filepath.Join(dir, "forged.jsonl")
	if err := os.WriteFile(forged, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Finding 10: without --key a keyed trail is not verified, forged or
	// not: exit 4, saying how many lines went unchecked.
	for _, p := range []string{path, forged} {
		code, out, errOut := runCmd(t, "audit", "verify", p)
		if code != 4 || !strings.Contains(out, "6 MACs not checked (no --key)") ||
			!strings.Contains(errOut, "6 of 6 lines carry a MAC that was not checked: the trail is keyed") {
			t.Errorf("audit verify %s without the key: code %d, stdout %q, stderr %q; want 4", filepath.Base(p), code, out, errOut)
		}
	}
	code, _, errOut := runCmd(t, "audit", "verify", "--key", keyFile, forged)
	if code != 1 || !strings.HasPrefix(errOut, "acpgate audit verify: "+forged+": line 3: MAC does not match") {
		t.Errorf("audit verify --key of the forged re-chained trail: code %d, stderr %q; want line 3 named", code, errOut)
	}
	if code, _, errOut := runCmd(t, "audit", "verify", "--key", filepath.Join(dir, "missing.key"), path); code != 2 || !strings.Contains(errOut, "audit key") {
		t.Errorf("audit verify with a missing key file: code %d, stderr %q", code, errOut)
	}
}

// Finding 10: a trail whose key was rotated verifies with both keys and
// lists them in order; a line after the rotation MACed again under the
// retired key fails, naming the line that retired it; and without --key
// the keyed trail exits 4 even when it has gaps (3).
func TestAuditVerifyRotatedKey(t *testing.T) {
	dir := t.TempDir()
	var keys [2][]byte
	var keyFiles [2]string
	for i := range keys {
		keyFiles[i] = filepath.Join(dir, fmt.Sprintf("k%d.key", i))
		if err := os.WriteFile(keyFiles[i], []byte(strings.Repeat(fmt.Sprintf("%02x", 0xa0+i), 32)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		k, err := audit.ReadKeyFile(keyFiles[i])
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	path := filepath.Join(dir, "audit.jsonl")
	l, err := audit.Open(audit.Config{File: path, Key: keys[0]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Record(audit.Event{Event: "prompt.started", Tenant: "acme", Subject: "alice"})
	if err := l.SetKey(keys[1]); err != nil {
		t.Fatal(err)
	}
	l.Record(audit.Event{Event: "prompt.started", Tenant: "acme", Subject: "alice"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kid0, kid1 := audit.KeyID(keys[0]), audit.KeyID(keys[1])
	code, out, errOut := runCmd(t, "audit", "verify", "--key", keyFiles[1], "--key", keyFiles[0], path)
	wantOut := "5 lines intact in 1 file, every MAC checked\nkeys, in order: " + kid0 + " (from " + path + " line 1), then " + kid1 +
		" (from " + path + " line 3); the trail ends under key " + kid1 + "\n"
	if code != 0 || out != wantOut {
		t.Fatalf("audit verify with both keys: code %d, stdout %q, stderr %q; want stdout %q", code, out, errOut, wantOut)
	}
	// Line 4, the event after the key change, MACed again under the
	// retired key (and line 5 re-chained and re-MACed after it).
	lines := strings.Split(strings.TrimSuffix(string(mustReadFile(t, path)), "\n"), "\n")
	for i := 3; i < len(lines); i++ {
		sum := sha256.Sum256([]byte(lines[i-1]))
		j := strings.Index(lines[i], `"prev":"`) + len(`"prev":"`)
		lines[i] = lines[i][:j] + hex.EncodeToString(sum[:]) + lines[i][j+64:]
		body := lines[i][:strings.Index(lines[i], `,"kid":"`)] + `,"kid":"` + kid0 + `"`
		m := hmac.New(sha256.New, keys[0])
		m.Write([]byte(body))
		lines[i] = body + `,"mac":"` + hex.EncodeToString(m.Sum(nil)) + `"}`
	}
	forged := filepath.Join(dir, "forged.jsonl")
	if err := os.WriteFile(forged, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCmd(t, "audit", "verify", "--key", keyFiles[0], "--key", keyFiles[1], forged)
	if code != 1 || !strings.HasPrefix(errOut, "acpgate audit verify: "+forged+": line 4: MAC under key "+kid0+", which "+forged+" line 3 replaced") {
		t.Errorf("audit verify of lines forged under the retired key: code %d, stderr %q", code, errOut)
	}
	// The files from line 3 on only: the head is missing (3), and no
	// --key: 4 wins.
	tailFile := filepath.Join(dir, "tail.jsonl")
	if err := os.WriteFile(tailFile, []byte(strings.Join(strings.Split(string(mustReadFile(t, path)), "\n")[2:], "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCmd(t, "audit", "verify", tailFile); code != 4 || !strings.Contains(errOut, "the trail's head is missing") ||
		!strings.Contains(errOut, "3 of 3 lines carry a MAC that was not checked") {
		t.Errorf("audit verify without --key of a keyed trail missing its head: code %d, stderr %q; want 4", code, errOut)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
