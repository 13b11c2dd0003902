package audit

import (
	"io"
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

// forge is a line chaining to after.
func forge(after string) string {
	return `{"ts":"2026-01-01T00:00:00.000000000Z","event":"x","prev":"` + sum([]byte(after)) + `"}`
}

func TestVerifyFindsBreaks(t *testing.T) {
	lines := trail(t, 6)
	edit := func(f func([]string) []string) string {
		return strings.Join(f(append([]string(nil), lines...)), "\n") + "\n"
	}
	for _, tc := range []struct {
		name, data, want string
	}{
		{"changed", edit(func(l []string) []string {
			l[2] = strings.Replace(l[2], `"alice"`, `"mallory"`, 1)
			return l
		}), "line 4: prev is not the SHA-256 of line 3: line 3 was changed, or lines were removed between them"},
		{"changed prev", edit(func(l []string) []string {
			l[2] = l[2][:len(l[2])-3] + map[bool]string{true: "0", false: "1"}[l[2][len(l[2])-3] != '0'] + `"}`
			return l
		}), "line 3: prev is not the SHA-256 of line 2"},
		{"removed", edit(func(l []string) []string { return append(l[:2], l[3:]...) }),
			"line 3: prev is not the SHA-256 of line 2: line 2 was changed, or lines were removed between them"},
		{"removed last two", edit(func(l []string) []string { return l[:4] }), ""},
		{"inserted copy", edit(func(l []string) []string { return append(l[:3], append([]string{l[1]}, l[3:]...)...) }),
			"line 4: inserted or moved here: the line after it chains to the line before it"},
		{"inserted forged", edit(func(l []string) []string { return append(l[:3], append([]string{forge(l[2])}, l[3:]...)...) }),
			"line 4: inserted or moved here: the line after it chains to the line before it"},
		{"inserted last", edit(func(l []string) []string { return append(l, l[0]) }),
			"line 7: prev is not the SHA-256 of line 6"},
		{"swapped", edit(func(l []string) []string { l[2], l[3] = l[3], l[2]; return l }),
			"line 3: inserted or moved here"},
		{"cut off", strings.TrimSuffix(edit(func(l []string) []string { return l }), "\n"), "line 6: cut off (no newline at its end)"},
		{"not JSON", edit(func(l []string) []string { l[4] = "garbage"; return l }), "line 5: not a JSON object"},
		{"no prev", edit(func(l []string) []string { l[4] = `{"ts":"x"}`; return l }), "line 5: no prev"},
		{"bad prev", edit(func(l []string) []string { l[4] = `{"prev":"ABC"}`; return l }), `line 5: prev "ABC" is not a hex SHA-256`},
		{"blank line", edit(func(l []string) []string { return append(l[:3], append([]string{""}, l[3:]...)...) }),
			"line 4: not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Verify([]string{path}, io.Discard)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Verify: %v; want no error", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), path+": "+tc.want)):
				t.Errorf("Verify: %v\nwant %s: %s…", err, path, tc.want)
			}
		})
	}
}

// A line removed from the start of the first file is only noted: the chain
// cannot tell it from a trail given from its middle.
func TestVerifyFirstLine(t *testing.T) {
	lines := trail(t, 3)
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines[1:], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustVerify(t, 2, path); !strings.HasPrefix(out, path+": line 1 chains to a line not given") {
		t.Errorf("notes %q", out)
	}
	empty := filepath.Join(t.TempDir(), "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, 2, empty, path, empty)
	if _, err := Verify([]string{filepath.Join(t.TempDir(), "missing")}, io.Discard); err == nil {
		t.Error("Verify of a missing file: no error")
	}
}

// Across files: a file left out between two is found at the next file's
// first line.
func TestVerifyFiles(t *testing.T) {
	lines := trail(t, 6)
	dir := t.TempDir()
	var files []string
	for i := range 3 {
		f := filepath.Join(dir, string(rune('a'+i)))
		if err := os.WriteFile(f, []byte(strings.Join(lines[2*i:2*i+2], "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	mustVerify(t, 6, files...)
	_, err := Verify([]string{files[0], files[2]}, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), files[2]+": line 1: prev is not the SHA-256 of the last line of "+files[0]+" (line 2)") {
		t.Errorf("Verify without the middle file: %v", err)
	}
}
