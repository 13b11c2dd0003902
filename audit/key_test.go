package audit

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	key1 = bytes.Repeat([]byte{1}, 32)
	key2 = bytes.Repeat([]byte{2}, 32)
	key3 = bytes.Repeat([]byte{3}, 32)
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

// SetKey: an audit.key_changed line, then the lines after it name the
// new key; Verify needs both keys for the whole trail, and says which key
// a line needs.
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
	if !strings.Contains(lines[3], `"event":"audit.key_changed","old_kid":"`+KeyID(key1)+`"`) {
		t.Fatalf("line 4 is not the key change from the old key: %s", lines[3])
	}
	if rep, err := Verify([]string{path}, [][]byte{key1, key2}); err != nil || rep.MACs != 6 {
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

// remac makes line's MAC again under key, as someone holding key can: its
// kid and mac replaced (a key change's mac_old dropped).
func remac(line string, key []byte) string {
	body := line[:strings.Index(line, `,"kid":"`)]
	body += `,"kid":"` + KeyID(key) + `"`
	return body + `,"mac":"` + lineMAC(key, []byte(body)) + `"}`
}

// rotated writes started, two events under key1, a key change to key2,
// three events and stopped, and returns the file and its lines.
func rotated(t *testing.T) (string, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trail.jsonl")
	l, err := Open(Config{File: path, Key: key1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, 2)
	if err := l.SetKey(key2); err != nil {
		t.Fatal(err)
	}
	recordN(l, 2, 5)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path, readLines(t, path)
}

// The key change line is MACed under both keys: mac_old under the old
// over the line up to its kid, mac under the new over all before it; a
// change to either MAC, or to what they cover, fails.
func TestKeyChangeLine(t *testing.T) {
	path, lines := rotated(t)
	kc := []byte(lines[3])
	body, mac, ok := splitMAC(kc)
	if !ok || mac != lineMAC(key2, body) {
		t.Fatalf("the key change's mac is not the new key's: %s", kc)
	}
	oldBody, macOld, ok := splitMACOld(body)
	if !ok || macOld != lineMAC(key1, oldBody) || !strings.HasSuffix(string(oldBody), `,"kid":"`+KeyID(key2)+`"`) {
		t.Fatalf("the key change's mac_old is not the old key's over the line up to its kid: %s", kc)
	}
	rep, err := Verify([]string{path}, [][]byte{key2, key1}) // any order
	if err != nil || rep.MACs != 8 || len(rep.Keys) != 2 || rep.Keys[0].Kid != KeyID(key1) || rep.Keys[1] != (KeyUse{KeyID(key2), path, 4}) {
		t.Fatalf("Verify with both keys: %+v, %v", rep, err)
	}
	// Its mac_old made by someone without the old key (with the new one:
	// the line's mac made again over it).
	re := append([]string(nil), lines...)
	forgedOld := string(oldBody) + `,"mac_old":"` + lineMAC(key2, oldBody) + `"`
	re[3] = forgedOld + `,"mac":"` + lineMAC(key2, []byte(forgedOld)) + `"}`
	p := writeLines(t, rechain(re))
	if _, err := Verify([]string{p}, [][]byte{key1, key2}); err == nil ||
		err.Error() != p+": line 4: key change's MAC under the old key "+KeyID(key1)+" (mac_old) does not match: "+
			"the line was changed (or made by someone without that key)" {
		t.Errorf("a key change with a forged mac_old: %v", err)
	}
	// Without mac_old at all.
	re[3] = remac(lines[3][:strings.Index(lines[3], `,"kid":"`)]+`,"kid":"x"}`, key2)
	p = writeLines(t, rechain(re))
	if _, err := Verify([]string{p}, nil); err == nil || !strings.Contains(err.Error(), "line 4: key change from key "+KeyID(key1)+" without its MAC under that key") {
		t.Errorf("a key change without mac_old: %v", err)
	}
	// The rotated trail's later file, from the key change on, needs the
	// old key for the change's mac_old.
	if _, err := Verify([]string{writeLines(t, lines[3:])}, [][]byte{key2}); err == nil ||
		!strings.Contains(err.Error(), "line 1: key change from key "+KeyID(key1)+", which no key given is") {
		t.Errorf("the key change with the new key only: %v", err)
	}
}

// Finding 10: someone holding the retired key (leaked: the usual reason
// to rotate) rewrites lines written after the rotation, MACs them under
// it and re-chains the trail. With both keys given, Verify fails at the
// first such line, naming the line that retired the key; without keys,
// too.
func TestRetiredKeyForgery(t *testing.T) {
	path, lines := rotated(t)
	if _, err := Verify([]string{path}, [][]byte{key1, key2}); err != nil {
		t.Fatal(err)
	}
	forged := append([]string(nil), lines...)
	for i := 5; i < len(forged); i++ { // lines 6 on: the second event after the change, and stopped
		forged[i] = strings.Replace(forged[i], `"subject":"alice"`, `"subject":"bob"`, 1)
	}
	forged = rechain(forged)
	for i := 5; i < len(forged); i++ {
		forged[i] = remac(forged[i], key1)
		if i+1 < len(forged) {
			forged = rechain(forged)
		}
	}
	p := writeLines(t, forged)
	want := p + ": line 6: MAC under key " + KeyID(key1) + ", which " + p + " line 4 replaced: a key replaced MACs no later line " +
		"(the line was made by someone holding the old key)"
	if _, err := Verify([]string{p}, [][]byte{key1, key2}); err == nil || err.Error() != want {
		t.Errorf("Verify with both keys: %v\nwant %s", err, want)
	}
	if rep, err := Verify([]string{p}, nil); err == nil || err.Error() != want {
		t.Errorf("Verify without keys: %+v, %v", rep, err)
	}
	// A line under the new key with no key change before it (the change
	// line dropped, the lines re-chained and renumbered) fails too.
	dropped := append(append([]string(nil), lines[:3]...), lines[4:]...)
	for i := 3; i < len(dropped); i++ {
		dropped[i] = strings.Replace(dropped[i], fmt.Sprintf(`"seq":%d,`, i+2), fmt.Sprintf(`"seq":%d,`, i+1), 1)
	}
	p = writeLines(t, rechain(dropped))
	if _, err := Verify([]string{p}, nil); err == nil ||
		!strings.Contains(err.Error(), "line 4: MAC under key "+KeyID(key2)+", after lines under key "+KeyID(key1)+" with no key change") {
		t.Errorf("a new key without a key change: %v", err)
	}
}

// A run started under another key (a restart with a new key file) begins
// under it at its gateway.started line, which retires the old key just
// as a key change does; reading the key in use again changes nothing.
func TestRestartUnderAnotherKey(t *testing.T) {
	path, _ := keyedTrail(t, 2, key1)
	l, err := Open(Config{File: path, Key: key2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 2, 3)
	if err := l.SetKey(key2); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	if len(lines) != 7 || strings.Contains(strings.Join(lines, ""), EventKeyChanged) {
		t.Fatalf("want 7 lines and no key change:\n%s", strings.Join(lines, "\n"))
	}
	rep, err := Verify([]string{path}, [][]byte{key1, key2})
	if err != nil || len(rep.Keys) != 2 || rep.Keys[1].Line != 5 {
		t.Fatalf("Verify: %+v, %v", rep, err)
	}
	lines[6] = remac(lines[6], key1)
	p := writeLines(t, rechain(lines))
	if _, err := Verify([]string{p}, [][]byte{key1, key2}); err == nil || !strings.Contains(err.Error(), "line 7: MAC under key "+KeyID(key1)+", which "+p+" line 5 replaced") {
		t.Errorf("a line under the key the restart retired: %v", err)
	}
}

// A key change whose write fails is owed again, from the key the file's
// lines end under: two rotations while the disk is full (key1 to key2 to
// key3) leave one audit.key_changed line, from key1 to key3, and the
// trail verifies with key1 and key3.
func TestKeyChangeWriteFails(t *testing.T) {
	sink := &fakeSink{}
	var c counters
	l := start(c.config(Config{File: "fake", FlushEvery: time.Millisecond, Key: key1}), slog.New(slog.DiscardHandler), sink, tail{hash: Genesis})
	recordN(l, 0, 1)
	waitFor(t, func() bool { return c.written.Load() == 2 }) // started and one event
	sink.setFail(true)
	if err := l.SetKey(key2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.errors.Load() >= 1 })
	recordN(l, 1, 2) // lost
	if err := l.SetKey(key3); err != nil {
		t.Fatal(err)
	}
	n := c.errors.Load()
	waitFor(t, func() bool { return c.errors.Load() > n })
	sink.setFail(false)
	recordN(l, 2, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, sink.data, 0o600); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	var changes []string
	for _, l := range lines {
		if strings.Contains(l, `"event":"`+EventKeyChanged+`"`) {
			changes = append(changes, l)
		}
	}
	if len(changes) != 1 || !strings.Contains(changes[0], `"old_kid":"`+KeyID(key1)+`"`) || !strings.Contains(changes[0], `"kid":"`+KeyID(key3)+`"`) {
		t.Fatalf("key changes %q, want one from key1 to key3:\n%s", changes, strings.Join(lines, "\n"))
	}
	rep, err := Verify([]string{path}, [][]byte{key1, key3})
	if err != nil || len(rep.Gaps) != 1 || len(rep.Keys) != 2 || rep.Keys[1].Kid != KeyID(key3) {
		t.Fatalf("Verify: %+v, %v", rep, err)
	}
}
