package audit

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	key1 = bytes.Repeat([]byte{1}, 32)
	key2 = bytes.Repeat([]byte{2}, 32)
)

// keyedTrail writes n events under key and returns the file and its lines.
func keyedTrail(t *testing.T, n int, key []byte) (string, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trail.jsonl")
	l, err := Open(Config{File: path, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, n)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path, readLines(t, path)
}

func writeLines(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edited.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Every line of a keyed trail carries its key's ID and a MAC over the
// line up to it, seq and prev included; Verify checks them with the key.
func TestKeyedLines(t *testing.T) {
	path, lines := keyedTrail(t, 3, key1)
	kid := KeyID(key1)
	for i, l := range lines {
		body, mac, ok := splitMAC([]byte(l))
		if !ok || !strings.HasSuffix(string(body), `,"kid":"`+kid+`"`) || mac != lineMAC(key1, body) {
			t.Fatalf("line %d has no MAC of its body: %s", i+1, l)
		}
	}
	if bytes.Contains([]byte(strings.Join(lines, "")), []byte(hex.EncodeToString(key1))) {
		t.Fatal("the key is in the trail")
	}
	rep, err := Verify([]string{path}, [][]byte{key1})
	if err != nil || rep.Lines != 5 || rep.MACs != 5 {
		t.Fatalf("Verify with the key: %+v, %v", rep, err)
	}
	if rep := mustVerify(t, 5, path); rep.Unchecked != 5 {
		t.Errorf("Verify without the key: %d MACs unchecked, want 5", rep.Unchecked)
	}
	if _, err := Verify([]string{path}, [][]byte{key2}); err == nil ||
		!strings.HasPrefix(err.Error(), path+": line 1: MAC under key "+kid+", which no key given is") {
		t.Errorf("Verify with another key: %v", err)
	}
	unkeyed := trail(t, 1)
	if _, err := Verify([]string{writeLines(t, unkeyed)}, [][]byte{key1}); err == nil || !strings.Contains(err.Error(), "line 1: no MAC") {
		t.Errorf("Verify of an unkeyed trail with a key: %v", err)
	}
	if _, err := Open(Config{File: path, Key: key1[:31]}, nil); err == nil {
		t.Error("Open with a 31-byte key: no error")
	}
}

// The forged re-chained trail: line k edited and every later prev
// recomputed, as anyone who can write the file can. The chain holds, so
// Verify without the key passes it; with the key it fails, naming line k.
func TestForgedRechainedTrail(t *testing.T) {
	_, lines := keyedTrail(t, 6, key1)
	const k = 4 // line 4: the third event
	forged := append([]string(nil), lines...)
	forged[k-1] = strings.Replace(forged[k-1], `"subject":"alice"`, `"subject":"bob"`, 1)
	if forged[k-1] == lines[k-1] {
		t.Fatal("the edit changed nothing")
	}
	path := writeLines(t, rechain(forged))
	if rep := mustVerify(t, len(lines), path); rep.Unchecked != len(lines) {
		t.Errorf("without the key: %+v", rep)
	}
	_, err := Verify([]string{path}, [][]byte{key1})
	if err == nil || err.Error() != path+": line 4: MAC does not match: the line was changed (or made by someone without the key)" {
		t.Errorf("Verify with the key: %v; want line %d named", err, k)
	}
	// Its MAC made again too, under a key of the forger's own: the kid
	// names a key not given.
	re := append([]string(nil), forged...)
	body, _, _ := splitMAC([]byte(re[k-1]))
	re[k-1] = string(body[:len(body)-len(`,"kid":"`)-16-1]) + `,"kid":"` + KeyID(key2) + `"`
	re[k-1] += `,"mac":"` + lineMAC(key2, []byte(re[k-1])) + `"}`
	path = writeLines(t, rechain(re))
	if _, err := Verify([]string{path}, [][]byte{key1}); err == nil || !strings.HasPrefix(err.Error(), path+": line 4: MAC under key") {
		t.Errorf("Verify of a line MACed under another key: %v", err)
	}
}

// SetKey: the lines after it name the new key; Verify needs both keys
// for the whole trail, and says which key a line needs.
func TestSetKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trail.jsonl")
	l, err := Open(Config{File: path, Key: key1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 2)
	if err := l.SetKey(key2[:16]); err == nil {
		t.Error("SetKey with 16 bytes: no error")
	}
	if err := l.SetKey(key2); err != nil {
		t.Fatal(err)
	}
	recordN(l, 2, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.SetKey(key1); err == nil {
		t.Error("SetKey after Close: no error")
	}
	lines := readLines(t, path)
	if !strings.Contains(lines[2], KeyID(key1)) || !strings.Contains(lines[3], KeyID(key2)) {
		t.Fatalf("lines 3 and 4 should name the old and new key:\n%s\n%s", lines[2], lines[3])
	}
	if rep, err := Verify([]string{path}, [][]byte{key1, key2}); err != nil || rep.MACs != 5 {
		t.Errorf("Verify with both keys: %+v, %v", rep, err)
	}
	if _, err := Verify([]string{path}, [][]byte{key1}); err == nil || !strings.Contains(err.Error(), "line 4: MAC under key "+KeyID(key2)) {
		t.Errorf("Verify with the old key only: %v", err)
	}
}

// A key file: hex, 32 bytes or more, and not readable by group or others
// for the gateway (verify takes any mode).
func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", hex.EncodeToString(key1)+"\n", 0o600)
	if k, err := ReadKeyFile(good); err != nil || !bytes.Equal(k, key1) {
		t.Errorf("ReadKeyFile: %x, %v", k, err)
	}
	open := write("open", hex.EncodeToString(key1), 0o640)
	if _, err := ReadKeyFile(open); err == nil || !strings.Contains(err.Error(), "mode 0640 lets its group or others read it") {
		t.Errorf("ReadKeyFile of a 0640 file: %v", err)
	}
	if k, err := ReadVerifyKey(open); err != nil || !bytes.Equal(k, key1) {
		t.Errorf("ReadVerifyKey of a 0640 file: %v", err)
	}
	short := write("short", hex.EncodeToString(key1[:31]), 0o400)
	raw := write("raw", string(key1), 0o400)
	for _, p := range []string{short, raw} {
		_, err := ReadKeyFile(p)
		if err == nil || !strings.Contains(err.Error(), "at least 32 bytes as hex") || strings.Contains(err.Error(), hex.EncodeToString(key1[:8])) {
			t.Errorf("ReadKeyFile(%s): %v", filepath.Base(p), err)
		}
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("ReadKeyFile of a missing file: no error")
	}
}

// Config.Redact takes secrets out of each event's line before it is
// chained and MACed: the trail holds none and still verifies.
func TestRedactedLines(t *testing.T) {
	const secret = "sk-audit-secret-0123"
	path := filepath.Join(t.TempDir(), "trail.jsonl")
	l, err := Open(Config{File: path, Key: key1, Redact: func(s string) string { return strings.ReplaceAll(s, secret, "[REDACTED]") }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Event: "session.created", Tenant: "acme", Fields: []Field{F("error", "agent said "+secret), F("n", 1)}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(readLines(t, path), "\n")
	if strings.Contains(all, secret) || !strings.Contains(all, `"error":"agent said [REDACTED]"`) {
		t.Errorf("the trail:\n%s", all)
	}
	if rep, err := Verify([]string{path}, [][]byte{key1}); err != nil || rep.MACs != 3 {
		t.Errorf("Verify: %+v, %v", rep, err)
	}
}
