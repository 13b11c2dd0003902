package pathmap

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// tree is a tenant layout on disk:
//
//	base/tenants/acme          the tenant root
//	base/tenants/acme2         a sibling tenant (secret.txt)
//	base/tenants/acme-link ->  acme
//	base/tenants/file.txt      a regular file
type tree struct {
	base, tenants, root, sibling string
}

func newTree(t testing.TB) tree {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tr := tree{base: base, tenants: base + "/tenants"}
	tr.root = tr.tenants + "/acme"
	tr.sibling = tr.tenants + "/acme2"
	dirs := []string{tr.root + "/src", tr.root + "/sub/dir", tr.sibling}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{tr.root + "/src/main.go", tr.sibling + "/secret.txt", tr.tenants + "/file.txt"}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		tr.tenants + "/acme-link":    "acme",
		tr.root + "/link-in":         "src",            // inside, relative
		tr.root + "/link-in-abs":     tr.root + "/sub", // inside, absolute
		tr.root + "/sub/back":        "../src",         // inside, via ..
		tr.root + "/etc":             "/etc",           // escape to the host
		tr.root + "/sibling":         "../acme2",       // escape to a sibling tenant
		tr.root + "/sibling-abs":     tr.sibling,       // the same, absolute
		tr.root + "/sub/up":          "../..",          // escape to the tenants dir
		tr.root + "/chain1":          "chain2",         // a chain ending outside
		tr.root + "/chain2":          "sub/up/acme2",   //
		tr.root + "/dangling-out":    "/nonexistent-pathmap-test-dir/x",
		tr.root + "/dangling-sib":    "../acme2/new.txt", // dangling, into the sibling
		tr.root + "/dangling-in":     "sub/new.txt",      // dangling, inside
		tr.root + "/dangling-in-dir": "sub/newdir",       // dangling, inside, used as a dir
		tr.root + "/loop":            "loop",
		tr.root + "/there-and-back":  "../acme2/../acme/src", // passes outside, ends inside
	}
	for name, target := range links {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

func mustNew(t testing.TB, root, vroot string) *Mapper {
	t.Helper()
	m, err := New(root, vroot)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNew(t *testing.T) {
	tr := newTree(t)
	tests := []struct {
		name, root, vroot string
		wantRoot, wantV   string
		wantErr           string
	}{
		{name: "plain", root: tr.root, vroot: "/workspace", wantRoot: tr.root, wantV: "/workspace"},
		{name: "cleaned", root: tr.root + "//src/../", vroot: "/workspace/./", wantRoot: tr.root, wantV: "/workspace"},
		{name: "symlinked root is resolved", root: tr.tenants + "/acme-link", vroot: "/w", wantRoot: tr.root, wantV: "/w"},
		{name: "virtual root defaults to resolved root", root: tr.tenants + "/acme-link/", wantRoot: tr.root, wantV: tr.root},
		{name: "virtual root slash", root: tr.root, vroot: "/", wantRoot: tr.root, wantV: "/"},
		{name: "root slash", root: "/", wantErr: `root "/" is not allowed`},
		{name: "root slash uncleaned", root: "//.", wantErr: `root "/" is not allowed`},
		{name: "root relative", root: "srv/acme", wantErr: "not absolute"},
		{name: "root empty", root: "", wantErr: "empty"},
		{name: "root NUL", root: tr.root + "\x00", wantErr: "NUL"},
		{name: "root missing", root: tr.root + "/missing", wantErr: "no such file"},
		{name: "root is a file", root: tr.tenants + "/file.txt", wantErr: "not a directory"},
		{name: "root resolving to slash", root: tr.root + "/sub/up/../../../../../../../../..", wantErr: `root "/" is not allowed`},
		{name: "virtual root relative", root: tr.root, vroot: "workspace", wantErr: "not absolute"},
		{name: "virtual root NUL", root: tr.root, vroot: "/work\x00", wantErr: "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(tt.root, tt.vroot)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New(%q, %q) error = %v, want containing %q", tt.root, tt.vroot, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q, %q): %v", tt.root, tt.vroot, err)
			}
			if m.Root() != tt.wantRoot || m.VirtualRoot() != tt.wantV {
				t.Fatalf("Root, VirtualRoot = %q, %q, want %q, %q", m.Root(), m.VirtualRoot(), tt.wantRoot, tt.wantV)
			}
		})
	}
}

func TestNewRootResolvingToSlash(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/", dir+"/slash"); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dir+"/slash", ""); err == nil || !strings.Contains(err.Error(), `resolves to "/"`) {
		t.Fatalf("New(symlink to /) error = %v", err)
	}
}

func TestToAgent(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/workspace")
	r := tr.root
	tests := []struct {
		in      string
		want    string // "" when an error is expected
		wantErr error
	}{
		// Accepted.
		{in: "/workspace", want: r},
		{in: "/workspace/", want: r},
		{in: "/workspace/.", want: r},
		{in: "/workspace//", want: r},
		{in: "/workspace/src/main.go", want: r + "/src/main.go"},
		{in: "/workspace//src/./main.go", want: r + "/src/main.go"},
		{in: "//workspace/src/main.go", want: r + "/src/main.go"},
		{in: "/workspace/src/../src/main.go", want: r + "/src/main.go"},
		{in: "/workspace/../workspace/src", want: r + "/src"}, // cleaned first: never leaves
		{in: "/./workspace/src", want: r + "/src"},
		{in: "/workspace/new/deeply/nested/file.txt", want: r + "/new/deeply/nested/file.txt"},
		{in: "/workspace/src/main.go/below-a-file", want: r + "/src/main.go/below-a-file"},
		{in: "/workspace/link-in/main.go", want: r + "/link-in/main.go"}, // not resolved
		{in: "/workspace/link-in/new/nested.txt", want: r + "/link-in/new/nested.txt"},
		{in: "/workspace/link-in-abs/dir/x", want: r + "/link-in-abs/dir/x"},
		{in: "/workspace/sub/back/main.go", want: r + "/sub/back/main.go"},
		{in: "/workspace/dangling-in", want: r + "/dangling-in"},
		{in: "/workspace/dangling-in-dir/a/b", want: r + "/dangling-in-dir/a/b"},
		{in: "/workspace/there-and-back/main.go", want: r + "/there-and-back/main.go"},
		{in: "/workspace/sub/up/acme/src", want: r + "/sub/up/acme/src"}, // only where it ends counts
		{in: `/workspace/a\b`, want: r + `/a\b`},
		{in: `/workspace\..\etc`, wantErr: ErrOutside}, // backslash is a byte: "/workspace\..\etc" is one name
		{in: "/workspace/Src/Main.go", want: r + "/Src/Main.go"},
		{in: "/workspace/...", want: r + "/..."},
		{in: "/workspace/..foo", want: r + "/..foo"},
		{in: "/workspace/sub/up-not-a-link/..", want: r + "/sub"},
		// Malformed.
		{in: "", wantErr: ErrEmpty},
		{in: "workspace/src", wantErr: ErrRelative},
		{in: "./workspace", wantErr: ErrRelative},
		{in: "../etc/passwd", wantErr: ErrRelative},
		{in: "~/x", wantErr: ErrRelative},
		{in: "C:\\workspace", wantErr: ErrRelative},
		{in: "/workspace/a\x00b", wantErr: ErrNUL},
		// Outside the virtual root, lexically.
		{in: "/workspace/../etc/passwd", wantErr: ErrOutside},
		{in: "/workspace/src/../../etc", wantErr: ErrOutside},
		{in: "/workspace/..", wantErr: ErrOutside},
		{in: "/workspace/../workspace2/x", wantErr: ErrOutside},
		{in: "/workspace2", wantErr: ErrOutside},
		{in: "/workspace2/x", wantErr: ErrOutside},
		{in: "/workspacefoo", wantErr: ErrOutside},
		{in: "/Workspace/x", wantErr: ErrOutside},
		{in: "/work", wantErr: ErrOutside},
		{in: "/", wantErr: ErrOutside},
		{in: "/etc/passwd", wantErr: ErrOutside},
		{in: r + "/src/main.go", wantErr: ErrOutside}, // a host path is not a client path
		// Through symlinks, to outside the host root.
		{in: "/workspace/etc", wantErr: ErrSymlinkEscape},
		{in: "/workspace/etc/passwd", wantErr: ErrSymlinkEscape},
		{in: "/workspace/etc/new-file", wantErr: ErrSymlinkEscape},
		{in: "/workspace/link-in/../etc/passwd", wantErr: ErrSymlinkEscape}, // lexically /workspace/etc/passwd
		{in: "/workspace/sibling", wantErr: ErrSymlinkEscape},
		{in: "/workspace/sibling/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "/workspace/sibling/new/nested/file.txt", wantErr: ErrSymlinkEscape},
		{in: "/workspace/sibling-abs/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "/workspace/sub/up", wantErr: ErrSymlinkEscape},
		{in: "/workspace/sub/up/acme2/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "/workspace/chain1/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "/workspace/dangling-out", wantErr: ErrSymlinkEscape},
		{in: "/workspace/dangling-out/below", wantErr: ErrSymlinkEscape},
		{in: "/workspace/dangling-sib", wantErr: ErrSymlinkEscape},
		// Unresolvable.
		{in: "/workspace/loop", wantErr: ErrResolve},
		{in: "/workspace/loop/x", wantErr: ErrResolve},
		{in: "/workspace/" + strings.Repeat("n", 300) + "/x", wantErr: ErrResolve},
	}
	for _, tt := range tests {
		got, err := m.ToAgent(tt.in)
		if tt.wantErr != nil {
			var pe *PathError
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &pe) || pe.Path != tt.in {
				t.Errorf("ToAgent(%q) = %q, %v; want *PathError %v", tt.in, got, err, tt.wantErr)
			} else if strings.Contains(err.Error(), tr.base) && !strings.Contains(tt.in, tr.base) {
				t.Errorf("ToAgent(%q) error %q leaks the host layout", tt.in, err)
			}
			continue
		}
		checkToAgent(t, m, tt.in, got, err, tt.want)
	}
}

// checkToAgent checks that ToAgent(in) gave (got, err) = (want, nil), and
// the round trip: ToClient(ToAgent(in)) == Clean(in).
func checkToAgent(t *testing.T, m *Mapper, in, got string, err error, want string) {
	t.Helper()
	if err != nil || got != want {
		t.Errorf("ToAgent(%q) = %q, %v; want %q", in, got, err, want)
		return
	}
	if back, ok := m.ToClient(got); !ok || back != path.Clean(in) {
		t.Errorf("ToClient(ToAgent(%q)) = %q, %v; want %q", in, back, ok, path.Clean(in))
	}
}

func TestToAgentVirtualRootSlash(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/")
	r := tr.root
	tests := []struct {
		in, want string
		wantErr  error
	}{
		{in: "/", want: r},
		{in: "//", want: r},
		{in: "/..", want: r},
		{in: "/../../src", want: r + "/src"},
		{in: "/src/main.go", want: r + "/src/main.go"},
		{in: "/usr/bin/env", want: r + "/usr/bin/env"},
		{in: "/etc/passwd", wantErr: ErrSymlinkEscape}, // root/etc is a link to /etc
		{in: "/sibling/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "rel", wantErr: ErrRelative},
	}
	for _, tt := range tests {
		got, err := m.ToAgent(tt.in)
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("ToAgent(%q) = %q, %v; want %v", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		checkToAgent(t, m, tt.in, got, err, tt.want)
	}
}

func TestToAgentIdentity(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.tenants+"/acme-link", "")
	if got, err := m.ToAgent(tr.root + "/src/x"); err != nil || got != tr.root+"/src/x" {
		t.Errorf("ToAgent = %q, %v", got, err)
	}
	// The unresolved spelling of the root is not the virtual root.
	if _, err := m.ToAgent(tr.tenants + "/acme-link/src"); !errors.Is(err, ErrOutside) {
		t.Errorf("ToAgent(unresolved root) error = %v, want ErrOutside", err)
	}
	if _, err := m.ToAgent(tr.sibling + "/secret.txt"); !errors.Is(err, ErrOutside) {
		t.Errorf("ToAgent(sibling) error = %v, want ErrOutside", err)
	}
}

func TestToAgentUnreadableDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every directory")
	}
	tr := newTree(t)
	locked := tr.root + "/locked"
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(locked, 0o755) })
	m := mustNew(t, tr.root, "/workspace")
	var pe *PathError
	_, err := m.ToAgent("/workspace/locked/x")
	if !errors.Is(err, ErrResolve) || !errors.As(err, &pe) || pe.Cause == nil {
		t.Fatalf("ToAgent(unreadable) error = %v, want ErrResolve with a cause", err)
	}
	if strings.Contains(err.Error(), tr.base) {
		t.Errorf("error %q leaks the host layout", err)
	}
}

func TestToClient(t *testing.T) {
	tr := newTree(t)
	r := tr.root
	m := mustNew(t, r, "/workspace")
	slash := mustNew(t, r, "/")
	ident := mustNew(t, r, "")
	tests := []struct {
		m      *Mapper
		in     string
		want   string
		wantOK bool
	}{
		{m, r, "/workspace", true},
		{m, r + "/", "/workspace", true},
		{m, r + "/src/main.go", "/workspace/src/main.go", true},
		{m, r + "//src/./x/../main.go", "/workspace/src/main.go", true},
		{m, r + "/link-in/main.go", "/workspace/link-in/main.go", true}, // lexical: links are not followed
		{m, r + "/etc/passwd", "/workspace/etc/passwd", true},
		{m, r + `/a\b`, `/workspace/a\b`, true},
		{m, r + "/../acme/src", "/workspace/src", true},
		{m, r + "/../acme2/secret.txt", "/<outside-workspace>/secret.txt", false},
		{m, tr.sibling + "/secret.txt", "/<outside-workspace>/secret.txt", false}, // acme vs acme2
		{m, tr.sibling, "/<outside-workspace>/acme2", false},
		{m, r + "foo", "/<outside-workspace>/acmefoo", false},
		{m, tr.tenants, "/<outside-workspace>/tenants", false},
		{m, tr.tenants + "/acme-link/src", "/<outside-workspace>/src", false}, // lexical: the unresolved root is outside
		{m, "/etc/passwd", "/<outside-workspace>/passwd", false},
		{m, "/", "/<outside-workspace>", false},
		{m, "/workspace/src", "/<outside-workspace>/src", false}, // a client path is not a host path
		{m, "src/main.go", "/<outside-workspace>/main.go", false},
		{m, "", "/<outside-workspace>", false},
		{slash, r, "/", true},
		{slash, r + "/", "/", true},
		{slash, r + "/src/main.go", "/src/main.go", true},
		{slash, tr.sibling, "/<outside-workspace>/acme2", false},
		{ident, r + "/src/main.go", r + "/src/main.go", true},
		{ident, r + "/src//main.go", r + "/src/main.go", true},
		{ident, r + "/", r, true},
		{ident, tr.sibling + "/x", "/<outside-workspace>/x", false},
	}
	for _, tt := range tests {
		got, ok := tt.m.ToClient(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("[vroot %s] ToClient(%q) = %q, %v; want %q, %v", tt.m.VirtualRoot(), tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestPrefixConfusion pairs roots and virtual roots whose names prefix each other.
func TestPrefixConfusion(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/workspace")
	m2 := mustNew(t, tr.sibling, "/workspace2")
	if _, ok := m.ToClient(tr.sibling + "/secret.txt"); ok {
		t.Error("acme's mapper maps acme2's files")
	}
	if got, ok := m2.ToClient(tr.sibling + "/secret.txt"); !ok || got != "/workspace2/secret.txt" {
		t.Errorf("acme2 ToClient = %q, %v", got, ok)
	}
	if _, err := m.ToAgent("/workspace2/secret.txt"); !errors.Is(err, ErrOutside) {
		t.Errorf("acme ToAgent(/workspace2/...) error = %v", err)
	}
	if _, err := m2.ToAgent("/workspace/secret.txt"); !errors.Is(err, ErrOutside) {
		t.Errorf("acme2 ToAgent(/workspace/...) error = %v", err)
	}
	if got, err := m2.ToAgent("/workspace2/secret.txt"); err != nil || got != tr.sibling+"/secret.txt" {
		t.Errorf("acme2 ToAgent = %q, %v", got, err)
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/etc/passwd", "/<outside-workspace>/passwd"},
		{"/srv/tenants/acme2/", "/<outside-workspace>/acme2"},
		{"/srv/tenants/acme2/x/..", "/<outside-workspace>/acme2"},
		{"/", "/<outside-workspace>"},
		{"", "/<outside-workspace>"},
		{".", "/<outside-workspace>"},
		{"../..", "/<outside-workspace>"},
		{"rel/name.txt", "/<outside-workspace>/name.txt"},
		{`C:\Users\me\x.txt`, `/<outside-workspace>/C:\Users\me\x.txt`},
	}
	for _, tt := range tests {
		if got := Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestPathErrorMessage(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/workspace")
	_, err := m.ToAgent("/workspace/../etc/passwd")
	if want := `"/workspace/../etc/passwd": path is outside the workspace "/workspace"`; err == nil || err.Error() != want {
		t.Errorf("error = %v, want %s", err, want)
	}
	_, err = m.ToAgent("/workspace/sibling/secret.txt")
	if want := `"/workspace/sibling/secret.txt": path resolves through a symbolic link to outside the workspace`; err == nil || err.Error() != want {
		t.Errorf("error = %v, want %s", err, want)
	}
	long := "/x" + strings.Repeat("y", 2000)
	_, err = m.ToAgent(long)
	if err == nil || len(err.Error()) > maxQuoted+100 {
		t.Errorf("long path error is %d bytes", len(err.Error()))
	}
}

func TestConcurrentUse(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/workspace")
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 200 {
				if _, err := m.ToAgent("/workspace/link-in/x"); err != nil {
					t.Error(err)
					return
				}
				if _, ok := m.URIToClient("file://" + tr.root + "/a%20b"); !ok {
					t.Error("URIToClient failed")
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}

// Resolve gives the client path a path really names: links inside the
// root followed and mapped back under the virtual root, a missing rest
// kept; a path that escapes, or cannot be examined, is an error.
func TestResolve(t *testing.T) {
	tr := newTree(t)
	m, err := New(tr.root, "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"/workspace", "/workspace", nil},
		{"/workspace/src/main.go", "/workspace/src/main.go", nil},
		{"/workspace/link-in/main.go", "/workspace/src/main.go", nil},
		{"/workspace/link-in-abs/dir/new", "/workspace/sub/dir/new", nil},
		{"/workspace/sub/back/x", "/workspace/src/x", nil},
		{"/workspace/dangling-in", "/workspace/sub/new.txt", nil},
		{"/workspace/there-and-back/main.go", "/workspace/src/main.go", nil},
		{"/workspace/src/../sub", "/workspace/sub", nil},
		{"/workspace/etc/passwd", "", ErrSymlinkEscape},
		{"/workspace/sibling/secret.txt", "", ErrSymlinkEscape},
		{"/workspace/dangling-sib", "", ErrSymlinkEscape},
		{"/workspace/loop/x", "", ErrResolve},
		{"/workspace/../etc", "", ErrOutside},
		{"/workspace2/x", "", ErrOutside},
		{"workspace/x", "", ErrRelative},
	} {
		got, err := m.Resolve(tc.in)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
