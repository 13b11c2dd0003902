package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trail writes a trail of n lines and returns them.
func trail(t *testing.T, n int) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trail.jsonl")
	l, err := Open(Config{File: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(l, 0, n)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return readLines(t, path)
}

// forge is a line chaining to after, numbered seq.
func forge(after string, seq int) string {
	return fmt.Sprintf(`{"ts":"2026-01-01T00:00:00.000000000Z","event":"x","seq":%d,"prev":"%s"}`, seq, sum([]byte(after)))
}

// rechain recomputes the prev of every line from the first, as someone
// who can write the file but holds no key can.
func rechain(lines []string) []string {
	out := append([]string(nil), lines...)
	for i := 1; i < len(out); i++ {
		j := strings.Index(out[i], `"prev":"`) + len(`"prev":"`)
		out[i] = out[i][:j] + sum([]byte(out[i-1])) + out[i][j+64:]
	}
	return out
}

func TestVerifyFindsBreaks(t *testing.T) {
	lines := trail(t, 6) // started, 6 events, stopped
	edit := func(f func([]string) []string) string {
		return strings.Join(f(append([]string(nil), lines...)), "\n") + "\n"
	}
	for _, tc := range []struct {
		name, data, want string
	}{
		{"changed", edit(func(l []string) []string {
			l[3] = strings.Replace(l[3], `"alice"`, `"mallory"`, 1)
			return l
		}), "line 5: prev is not the SHA-256 of line 4: line 4 was changed, or lines were removed between them"},
		{"changed prev", edit(func(l []string) []string {
			l[3] = l[3][:len(l[3])-3] + map[bool]string{true: "0", false: "1"}[l[3][len(l[3])-3] != '0'] + `"}`
			return l
		}), "line 4: prev is not the SHA-256 of line 3"},
		{"removed", edit(func(l []string) []string { return append(l[:3], l[4:]...) }),
			"line 4: prev is not the SHA-256 of line 3: line 3 was changed, or lines were removed between them"},
		{"removed and re-chained", edit(func(l []string) []string { return rechain(append(l[:3], l[4:]...)) }),
			"line 4: seq 5 follows seq 3 (line 3): 1 lines missing within one run"},
		{"removed last two", edit(func(l []string) []string { return l[:6] }), ""},
		{"inserted copy", edit(func(l []string) []string { return append(l[:4], append([]string{l[2]}, l[4:]...)...) }),
			"line 5: inserted or moved here: the line after it chains to the line before it"},
		{"inserted forged", edit(func(l []string) []string { return append(l[:4], append([]string{forge(l[3], 5)}, l[4:]...)...) }),
			"line 5: inserted or moved here: the line after it chains to the line before it"},
		{"inserted forged and re-chained", edit(func(l []string) []string {
			return rechain(append(l[:4], append([]string{forge(l[3], 5)}, l[4:]...)...))
		}), "line 6: seq 5 follows seq 5 (line 5): lines out of order or repeated"},
		{"inserted last", edit(func(l []string) []string { return append(l, l[0]) }),
			"line 9: prev is not the SHA-256 of line 8"},
		{"swapped", edit(func(l []string) []string { l[3], l[4] = l[4], l[3]; return l }),
			"line 4: inserted or moved here"},
		{"cut off", strings.TrimSuffix(edit(func(l []string) []string { return l }), "\n"), "line 8: cut off (no newline at its end)"},
		{"not JSON", edit(func(l []string) []string { l[5] = "garbage"; return l }), "line 6: not a JSON object"},
		{"no prev", edit(func(l []string) []string { l[5] = `{"ts":"x"}`; return l }), "line 6: no prev"},
		{"bad prev", edit(func(l []string) []string { l[5] = `{"prev":"ABC"}`; return l }), `line 6: prev "ABC" is not a hex SHA-256`},
		{"blank line", edit(func(l []string) []string { return append(l[:4], append([]string{""}, l[4:]...)...) }),
			"line 5: not a JSON object"},
		{"seq removed and re-chained", edit(func(l []string) []string {
			l[3] = strings.Replace(l[3], `"seq":4,`, ``, 1)
			return rechain(l)
		}), "line 4: no seq, after numbered lines"},
		{"started renumbered", edit(func(l []string) []string {
			return rechain(append(l[:4], append([]string{strings.Replace(l[0], `"seq":1,`, `"seq":2,`, 1)}, l[4:]...)...))
		}), "line 5: gateway.started with seq 2, not 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Verify([]string{path}, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Verify: %v; want no error", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), path+": "+tc.want)):
				t.Errorf("Verify: %v\nwant %s: %s…", err, path, tc.want)
			}
		})
	}
}

// A line removed from the start of the first file is reported as a
// missing head (the CLI fails on it unless told not to): the chain cannot
// tell it from a trail given from its middle.
func TestVerifyFirstLine(t *testing.T) {
	lines := trail(t, 3)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines[1:], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, 4, path); !strings.HasPrefix(rep.Head, path+": line 1 chains to a line not given") {
		t.Errorf("head %q", rep.Head)
	}
	empty := filepath.Join(t.TempDir(), "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, 4, empty, path, empty)
	if _, err := Verify([]string{filepath.Join(t.TempDir(), "missing")}, nil); err == nil {
		t.Error("Verify of a missing file: no error")
	}
}

// Across files: a file left out between two is found at the next file's
// first line.
func TestVerifyFiles(t *testing.T) {
	lines := trail(t, 6)
	dir := t.TempDir()
	var files []string
	for i := range 4 {
		f := filepath.Join(dir, string(rune('a'+i)))
		if err := os.WriteFile(f, []byte(strings.Join(lines[2*i:2*i+2], "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	mustVerify(t, 8, files...)
	_, err := Verify([]string{files[0], files[2]}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), files[2]+": line 1: prev is not the SHA-256 of the last line of "+files[0]+" (line 2)") {
		t.Errorf("Verify without the middle file: %v", err)
	}
}
