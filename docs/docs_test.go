// Package docs holds the tests of the repository's Markdown: every relative
// link resolves, and every #anchor names a heading (or an <a id>) of the
// file it points into.
package docs

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/gateway/config"
)

// linkedDocs are the documents whose links are checked, relative to the
// repository's root (globs allowed).
var linkedDocs = []string{
	"README.md", "SECURITY.md", "BENCHMARKS.md", "deploy/README.md",
	"docs/*.md", "docs/benchmarks/*.md",
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*#*\s*$`)
	idRE      = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	schemeRE  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading: its text lowercased, inline
// link targets dropped, punctuation other than - and _ removed, spaces
// turned to -.
func slug(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127 && isLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetter(r rune) bool { return strings.ToUpper(string(r)) != strings.ToLower(string(r)) }

// prose returns the lines of md outside fenced code blocks, each with its
// 1-based line number.
func prose(md string) (lines []string, numbers []int) {
	fence := ""
	for i, l := range strings.Split(md, "\n") {
		t := strings.TrimLeft(l, " ")
		if fence != "" {
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fence = t[:3]
			continue
		}
		lines, numbers = append(lines, l), append(numbers, i+1)
	}
	return lines, numbers
}

// anchors are the anchors of a Markdown file, as GitHub makes them: one
// per heading (a repeated one gets -1, -2, ...) and one per <a id>.
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines, _ := prose(md)
	for _, l := range lines {
		for _, m := range idRE.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Resume after a drop":                                            "resume-after-a-drop",
		"Reloading (SIGHUP)":                                             "reloading-sighup",
		"claude-code-acp and `_meta`":                                    "claude-code-acp-and-_meta",
		"Metrics, probes, logs, drain and reload":                        "metrics-probes-logs-drain-and-reload",
		"The stream side by side with 99b340a, after issues #36 and #37": "the-stream-side-by-side-with-99b340a-after-issues-36-and-37",
		"See [the guide](docs/x.md) now":                                 "see-the-guide-now",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
	a := anchors("# A\n## A\n```\n# B\n```\n<a id=\"c\"></a>text\n")
	if !a["a"] || !a["a-1"] || a["b"] || !a["c"] {
		t.Errorf("anchors = %v, want a, a-1 and c, not b (in a fence)", a)
	}
}

// TestLinks checks that every relative link of the documents resolves:
// the file or directory exists, and an #anchor into a Markdown file names
// one of its headings.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, g := range linkedDocs {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	for _, must := range []string{"README.md", "docs/configuration.md", "docs/operations.md", "docs/protocol.md", "deploy/README.md"} {
		if !slices.Contains(files, filepath.Join(root, must)) {
			t.Errorf("%s is missing", must)
		}
	}
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cache[path] = anchors(string(b))
		return cache[path]
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		lines, numbers := prose(string(b))
		for i, l := range lines {
			for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				}
				if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
					t.Errorf("%s:%d: %s leads out of the repository", rel, numbers[i], target)
					continue
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: %s: no such file or directory", rel, numbers[i], target)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: %s: no heading or <a id> %q in %s", rel, numbers[i], target, anchor, filepath.Base(dest))
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links checked in %d files: the link pattern no longer matches", checked, len(files))
	}
}

func readRepo(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeFirstScreen checks the README's shape: at most 300 lines,
// exactly the two set-up commands in its first code block (.ci/run runs
// the second, ./test/run.sh), and, within its first 40 lines, the links to
// the quick start, the configuration reference, the operator's guide and
// the client author's guide.
func TestReadmeFirstScreen(t *testing.T) {
	readme := readRepo(t, "README.md")
	lines := strings.Split(strings.TrimRight(readme, "\n"), "\n")
	if len(lines) > 300 {
		t.Errorf("README.md has %d lines, more than 300", len(lines))
	}
	_, rest, _ := strings.Cut(readme, "```sh\n")
	block, _, _ := strings.Cut(rest, "```")
	var cmds []string
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		cmd, _, _ := strings.Cut(l, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	if !slices.Equal(cmds, []string{"go run ./cmd/acpgate", "./test/run.sh"}) {
		t.Errorf("README.md's first code block holds %q, want the two set-up commands", cmds)
	}
	if ci := readRepo(t, ".ci/run"); !strings.Contains(ci, "./test/run.sh") {
		t.Errorf(".ci/run no longer runs ./test/run.sh, README's test command")
	}
	first := strings.Join(lines[:min(40, len(lines))], "\n")
	for _, want := range []string{"(#the-web-client)", "(docs/configuration.md)", "(docs/operations.md)", "(docs/protocol.md)"} {
		if !strings.Contains(first, want) {
			t.Errorf("README.md's first 40 lines do not link %s", want)
		}
	}
}

// TestReadmeSecureConfig checks that the README's minimal secure
// configuration is one the gateway accepts, with its paths made real.
func TestReadmeSecureConfig(t *testing.T) {
	readme := readRepo(t, "README.md")
	_, section, ok := strings.Cut(readme, "## A minimal secure configuration")
	if !ok {
		t.Fatal("README.md has no section A minimal secure configuration")
	}
	_, rest, _ := strings.Cut(section, "```yaml\n")
	yml, _, _ := strings.Cut(rest, "```")
	dir := t.TempDir()
	key := filepath.Join(dir, "session.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "acme")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	yml = strings.NewReplacer(
		"/etc/acpgate/session.key", key,
		"/srv/tenants/acme", root,
		"<the sha256sum above>", strings.Repeat("0", 64),
		"mode: required", "mode: off", // the sandbox's kernel support is the host's, not the file's
	).Replace(yml)
	for _, want := range []string{"tenants:", "session_key_file:", "allowed_origins:", "metrics_listen:", "sandbox:"} {
		if !strings.Contains(yml, want) {
			t.Errorf("the secure configuration lacks %s", want)
		}
	}
	cfg, err := config.Parse("README.md", []byte(yml))
	if err != nil {
		t.Fatalf("the README's secure configuration is refused:\n%v\n%s", err, yml)
	}
	if !cfg.AuthEnabled() || cfg.Listen != "0.0.0.0:8080" || cfg.Observability.MetricsListen == "" {
		t.Errorf("parsed: auth %v, listen %q, metrics_listen %q", cfg.AuthEnabled(), cfg.Listen, cfg.Observability.MetricsListen)
	}
}

// TestProtocolNamesEveryExtension checks that docs/protocol.md's list of
// extensions names every _acpgate/ method the code sends and every key it
// puts under _meta.acpgate.
func TestProtocolNamesEveryExtension(t *testing.T) {
	doc := readRepo(t, "docs/protocol.md")
	_, list, ok := strings.Cut(doc, "## Every extension, in one list")
	if !ok {
		t.Fatal("docs/protocol.md has no section Every extension, in one list")
	}
	methodRE := regexp.MustCompile(`"(_acpgate/[a-z_]+)"`)
	// The keys the gateway writes under _meta.acpgate: the members of
	// the maps and structs it marshals there, and the fields WithAcpgateMeta
	// adds.
	keyRE := regexp.MustCompile(`"acpgate":\s*map\[string\]any\{([^}]*)\}|` + "`" + `"([a-zA-Z]+)":` + "`" + `\+|map\[string\]any\{"(turn)"`)
	memberRE := regexp.MustCompile(`"([a-zA-Z]+)":`)
	found := map[string]bool{}
	err := filepath.WalkDir(filepath.Join("..", "proxy"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		for _, m := range methodRE.FindAllStringSubmatch(src, -1) {
			found[m[1]] = true
		}
		for _, m := range keyRE.FindAllStringSubmatch(src, -1) {
			for _, k := range memberRE.FindAllStringSubmatch(m[1], -1) {
				found["_meta.acpgate."+k[1]] = true
			}
			if m[2] != "" {
				found["_meta.acpgate."+m[2]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"_acpgate/resumed", "_acpgate/session_ended", "_acpgate/turn_ended", "_meta.acpgate.resumeToken", "_meta.acpgate.replayed"} {
		if !found[must] {
			t.Fatalf("the scan of proxy/ misses %s (found %v): its pattern no longer matches the code", must, slices.Sorted(maps.Keys(found)))
		}
	}
	for name := range found {
		short := strings.TrimPrefix(name, "_meta.acpgate.")
		if !strings.Contains(list, "`"+name+"`") && !regexp.MustCompile(`\b`+short+`\b`).MatchString(list) {
			t.Errorf("docs/protocol.md's list of extensions does not name %s", name)
		}
	}
}
