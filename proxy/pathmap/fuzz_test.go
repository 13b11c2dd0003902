package pathmap

import (
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

// cleanPath is an oracle for path.Clean on absolute paths, written
// independently: a stack of segments.
func cleanPath(p string) string {
	var stack []string
	for _, seg := range strings.Split(p, "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		default:
			stack = append(stack, seg)
		}
	}
	return "/" + strings.Join(stack, "/")
}

// under reports whether the clean path c is root or below it.
func under(c, root string) bool {
	return root == "/" || c == root || strings.HasPrefix(c, root+"/")
}

var toAgentSeeds = []string{
	"/workspace", "/workspace/", "/workspace/src/main.go", "/workspace//src/./main.go",
	"/workspace/../etc/passwd", "/workspace/src/../../etc", "/workspace/..", "/workspace2/x",
	"/workspacefoo", "/", "", "rel/x", "/workspace/a\x00b", "/workspace/etc/passwd",
	"/workspace/sibling/secret.txt", "/workspace/sibling/new/nested.txt", "/workspace/sub/up/acme2/secret.txt",
	"/workspace/sub/up/acme/src", "/workspace/chain1/secret.txt", "/workspace/dangling-out/x",
	"/workspace/dangling-sib", "/workspace/dangling-in", "/workspace/link-in/../etc/passwd",
	"/workspace/there-and-back/main.go", "/workspace/loop", "/workspace/link-in-abs/dir",
	"/workspace/sub/back/../../sibling", "/workspace/src/main.go/x", `/workspace\..\etc`,
}

func FuzzToAgent(f *testing.F) {
	tr := newTree(f)
	mappers := []*Mapper{mustNew(f, tr.root, "/workspace"), mustNew(f, tr.root, "/")}
	for _, s := range toAgentSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if p != "" && p[0] == '/' && isCleanAbs(p) != (cleanPath(p) == p) {
			t.Fatalf("isCleanAbs(%q) = %v", p, isCleanAbs(p))
		}
		for _, m := range mappers {
			got, err := m.ToAgent(p)
			absolute := p != "" && p[0] == '/' && !strings.ContainsRune(p, 0)
			if err != nil {
				var pe *PathError
				if !errors.As(err, &pe) || pe.Path != p {
					t.Fatalf("[%s] ToAgent(%q) error %v is not a *PathError for the input", m.vroot, p, err)
				}
				if absolute && !under(cleanPath(p), m.vroot) && !errors.Is(err, ErrOutside) {
					t.Fatalf("[%s] ToAgent(%q) error %v, want ErrOutside", m.vroot, p, err)
				}
				continue
			}
			if !absolute {
				t.Fatalf("[%s] ToAgent accepted %q", m.vroot, p)
			}
			c := cleanPath(p)
			if !under(c, m.vroot) {
				t.Fatalf("[%s] ToAgent(%q) = %q: the path leaves the virtual root", m.vroot, p, got)
			}
			want := tr.root + strings.TrimPrefix(c, m.vroot)
			if m.vroot == "/" {
				want = tr.root + c
				if c == "/" {
					want = tr.root
				}
			}
			if got != want || cleanPath(got) != got || !under(got, tr.root) {
				t.Fatalf("[%s] ToAgent(%q) = %q, want %q", m.vroot, p, got, want)
			}
			if ev, err := filepath.EvalSymlinks(got); err == nil && !under(ev, tr.root) {
				t.Fatalf("[%s] ToAgent(%q) = %q, which resolves to %q outside the root", m.vroot, p, got, ev)
			}
			if back, ok := m.ToClient(got); !ok || back != c {
				t.Fatalf("[%s] ToClient(ToAgent(%q)) = %q, %v; want %q", m.vroot, p, back, ok, c)
			}
		}
	})
}

// oracleFileURI splits and decodes a file URI independently of the package,
// with net/url's decoder: ok is false when it must be refused.
func oracleFileURI(u string) (p, suffix string, ok bool) {
	rest := u[len("file:"):]
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest, suffix = rest[:i], rest[i:]
	}
	if after, found := strings.CutPrefix(rest, "//"); found {
		host, p0, found := strings.Cut(after, "/")
		if !found || host != "" && !strings.EqualFold(host, "localhost") {
			return "", "", false
		}
		rest = "/" + p0
	}
	if !strings.HasPrefix(rest, "/") || strings.Contains(strings.ToLower(rest), "%2f") {
		return "", "", false
	}
	p, err := url.PathUnescape(rest)
	if err != nil || strings.ContainsRune(p, 0) {
		return "", "", false
	}
	return p, suffix, true
}

const fuzzRoot = "/srv/tenants/acme"

var uriSeeds = []string{
	"file://{root}/src/main.go", "file://{root}", "file://{root}/", "file://localhost{root}/x",
	"FILE:{root}/x", "file://{root}/my%20file.txt", "file://{root}/a%2Fb", "file://{root}/a%zz",
	"file://{root}/%2E%2E/acme2/x", "file://{root}2/x", "file://{root}/x?q=1#L3", "file://{root}?#",
	"file://host{root}/x", "file://", "file:", "file:x", "file:///etc/passwd", "{root}/x", "/etc/passwd",
	"https://example.com{root}/x", "untitled:Untitled-1", "data:,x", "", "relative", "file://{root}/caf%C3%A9",
	"file://{root}//./a/../b", "file://{root}/%00", "file://{root}/[x]",
}

func FuzzURIToClient(f *testing.F) {
	mappers := []*Mapper{
		newMapper(fuzzRoot, "/workspace"),
		newMapper(fuzzRoot, "/"),
		newMapper(fuzzRoot, fuzzRoot),
		newMapper(fuzzRoot, "/my work#1"),
	}
	for _, s := range uriSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		u = strings.ReplaceAll(u, "{root}", fuzzRoot)
		if u != "" && u[0] == '/' && isCleanAbs(u) != (cleanPath(u) == u) {
			t.Fatalf("isCleanAbs(%q) = %v", u, isCleanAbs(u))
		}
		for _, m := range mappers {
			out, ok := m.URIToClient(u)
			switch {
			case hasFileScheme(u):
				p, suffix, valid := oracleFileURI(u)
				inside := valid && under(cleanPath(p), fuzzRoot)
				if ok != inside {
					t.Fatalf("[%s] URIToClient(%q) = %q, %v; want ok=%v", m.vroot, u, out, ok, inside)
				}
				if !ok {
					if !strings.HasPrefix(out, redactedURI) || strings.Contains(out, fuzzRoot) {
						t.Fatalf("[%s] URIToClient(%q) = %q, not a redacted URI", m.vroot, u, out)
					}
					checkFileURI(t, out, "/<outside-workspace>")
					continue
				}
				if !strings.HasSuffix(out, suffix) {
					t.Fatalf("[%s] URIToClient(%q) = %q lost the suffix %q", m.vroot, u, out, suffix)
				}
				head := out[:len(out)-len(suffix)]
				if strings.ContainsAny(head, "?#") || !isPlain(strings.ReplaceAll(head[len("file:"):], "%", "")) {
					t.Fatalf("[%s] URIToClient(%q) = %q: path badly encoded", m.vroot, u, out)
				}
				checkFileURI(t, head, m.vroot)
				pu, _ := url.Parse(head)
				want := m.vroot + strings.TrimPrefix(cleanPath(p), fuzzRoot)
				if m.vroot == "/" {
					want = cleanPath("/" + strings.TrimPrefix(cleanPath(p), fuzzRoot))
				}
				if pu.Path != want {
					t.Fatalf("[%s] URIToClient(%q) = %q: path %q, want %q", m.vroot, u, out, pu.Path, want)
				}
			case u != "" && u[0] == '/':
				want, wantOK := m.ToClient(u)
				if out != want || ok != wantOK {
					t.Fatalf("[%s] URIToClient(%q) = %q, %v; want ToClient's %q, %v", m.vroot, u, out, ok, want, wantOK)
				}
			default:
				if out != u || !ok {
					t.Fatalf("[%s] URIToClient(%q) = %q, %v; want it unchanged", m.vroot, u, out, ok)
				}
			}
		}
	})
}

// isPlain reports whether s needs neither decoding nor encoding.
func isPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isSafe(s[i]) {
			return false
		}
	}
	return true
}
