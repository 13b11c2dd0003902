package pathmap

import (
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
)

func TestURIToAgent(t *testing.T) {
	tr := newTree(t)
	m := mustNew(t, tr.root, "/workspace")
	fr := "file://" + tr.root // the tree's temp path needs no escaping
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{in: "file:///workspace/src/main.go", want: fr + "/src/main.go"},
		{in: "file:///workspace", want: fr},
		{in: "file:///workspace/", want: fr},
		{in: "file://localhost/workspace/src/main.go", want: fr + "/src/main.go"},
		{in: "file://LocalHost/workspace/x", want: fr + "/x"},
		{in: "FILE:///workspace/x", want: fr + "/x"},
		{in: "file:/workspace/x", want: fr + "/x"},
		{in: "file:///workspace/my%20file.txt", want: fr + "/my%20file.txt"},
		{in: "file:///workspace/my file.txt", want: fr + "/my%20file.txt"}, // lenient in, canonical out
		{in: "file:///workspace/caf%c3%a9", want: fr + "/caf%C3%A9"},
		{in: "file:///workspace/caf\u00e9", want: fr + "/caf%C3%A9"},
		{in: "file:///workspace/%5Bx%5D%23%25%3F", want: fr + "/%5Bx%5D%23%25%3F"},
		{in: "file:///workspace/a%40b%3Ac", want: fr + "/a@b:c"},
		{in: "file:///workspace/x.go?line=3#L10", want: fr + "/x.go?line=3#L10"},
		{in: "file:///workspace#frag", want: fr + "#frag"},
		{in: "file:///workspace/./src//x", want: fr + "/src/x"},
		{in: "file:///workspace/link-in/main.go", want: fr + "/link-in/main.go"},
		{in: "/workspace/src/main.go", want: tr.root + "/src/main.go"}, // bare path: mapped as a path
		// Other schemes pass unchanged.
		{in: "https://example.com/workspace/x?y#z", want: "https://example.com/workspace/x?y#z"},
		{in: "zed://settings", want: "zed://settings"},
		{in: "untitled:Untitled-1", want: "untitled:Untitled-1"},
		{in: "data:text/plain;base64,aGk=", want: "data:text/plain;base64,aGk="},
		{in: "mailto:a@b.c", want: "mailto:a@b.c"},
		{in: "filex:///etc/passwd", want: "filex:///etc/passwd"},
		{in: "files:///etc/passwd", want: "files:///etc/passwd"},
		// Refused.
		{in: "file:///workspace/a%2Fb", wantErr: ErrEncodedSlash},
		{in: "file:///workspace/..%2f..%2fetc", wantErr: ErrEncodedSlash},
		{in: "file:///workspace/%2E%2E/etc/passwd", wantErr: ErrOutside},
		{in: "file:///workspace/../etc/passwd", wantErr: ErrOutside},
		{in: "file:///workspace2/x", wantErr: ErrOutside},
		{in: "file:///workspacefoo", wantErr: ErrOutside},
		{in: "file:///etc/passwd", wantErr: ErrOutside},
		{in: "file:" + tr.root + "/src", wantErr: ErrOutside},
		{in: "file:///workspace/etc/passwd", wantErr: ErrSymlinkEscape},
		{in: "file:///workspace/sibling/secret.txt", wantErr: ErrSymlinkEscape},
		{in: "file:///workspace/sibling%2Fsecret.txt", wantErr: ErrEncodedSlash},
		{in: "file:///workspace/a%zz", wantErr: ErrBadURI},
		{in: "file:///workspace/a%", wantErr: ErrBadURI},
		{in: "file:///workspace/a%4", wantErr: ErrBadURI},
		{in: "file:///workspace/a%00b", wantErr: ErrBadURI},
		{in: "file:///workspace/a\x00b", wantErr: ErrBadURI},
		{in: "file://", wantErr: ErrBadURI},
		{in: "file:", wantErr: ErrBadURI},
		{in: "file:workspace/x", wantErr: ErrBadURI},
		{in: "file://localhost", wantErr: ErrBadURI},
		{in: "file://?x", wantErr: ErrBadURI},
		{in: "file://evil.example/workspace/x", wantErr: ErrRemoteHost},
		{in: "file://localhost:80/workspace/x", wantErr: ErrRemoteHost},
		{in: "file://user@localhost/workspace/x", wantErr: ErrRemoteHost},
		{in: "/etc/passwd", wantErr: ErrOutside},
		{in: "", wantErr: ErrNotURI},
		{in: "workspace/x", wantErr: ErrNotURI},
		{in: "../etc/passwd", wantErr: ErrNotURI},
		{in: "//evil.example/x", wantErr: ErrOutside}, // leading "/": a bare path, /evil.example/x
		{in: ":x", wantErr: ErrNotURI},
		{in: "1http://x", wantErr: ErrNotURI},
	}
	for _, tt := range tests {
		got, err := m.URIToAgent(tt.in)
		if tt.wantErr != nil {
			var pe *PathError
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &pe) || pe.Path != tt.in {
				t.Errorf("URIToAgent(%q) = %q, %v; want *PathError %v", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("URIToAgent(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		if !hasFileScheme(tt.in) {
			continue
		}
		// Round trip: the agent's URI maps back to the canonical client URI.
		back, ok := m.URIToClient(got)
		raw, suffix, _, _ := splitFileURI(tt.in)
		p, _ := unescapePath(raw)
		want := "file://" + escapePath(cleanPath(p)) + suffix
		if !ok || back != want {
			t.Errorf("URIToClient(URIToAgent(%q)) = %q, %v; want %q", tt.in, back, ok, want)
		}
	}
}

func TestURIToClient(t *testing.T) {
	tr := newTree(t)
	r := tr.root
	m := mustNew(t, r, "/workspace")
	slash := mustNew(t, r, "/")
	ident := mustNew(t, r, "")
	const red = "file:///%3Coutside-workspace%3E"
	tests := []struct {
		m      *Mapper
		in     string
		want   string
		wantOK bool
	}{
		{m, "file://" + r + "/src/main.go", "file:///workspace/src/main.go", true},
		{m, "file://" + r, "file:///workspace", true},
		{m, "file://" + r + "/", "file:///workspace", true},
		{m, "file://localhost" + r + "/x", "file:///workspace/x", true},
		{m, "File:" + r + "/x", "file:///workspace/x", true},
		{m, "file://" + r + "/my%20file.txt", "file:///workspace/my%20file.txt", true},
		{m, "file://" + r + "/my file.txt", "file:///workspace/my%20file.txt", true},
		{m, "file://" + r + "/%41%62", "file:///workspace/Ab", true},
		{m, "file://" + r + "/x.go?q=1#L3", "file:///workspace/x.go?q=1#L3", true},
		{m, "file://" + r + "?q#f", "file:///workspace?q#f", true},
		{m, "file://" + r + "//src/./a/../x", "file:///workspace/src/x", true},
		{m, "file://" + r + "/a%2Fb", red, false},
		{m, "file://" + r + "/a%zz", red, false},
		{m, "file://" + r + "/a%00", red, false},
		{m, "file://host" + r + "/x", red, false},
		{m, "file://", red, false},
		{m, "file://" + tr.sibling + "/secret.txt", red + "/secret.txt", false},
		{m, "file://" + r + "2/x", red + "/x", false},
		{m, "file://" + r + "/../acme2/secret.txt", red + "/secret.txt", false},
		{m, "file://" + r + "/%2E%2E/acme2/my%20secret?x#y", red + "/my%20secret", false},
		{m, "file:///etc/passwd", red + "/passwd", false},
		{m, "file:///", red, false},
		{m, "file:///workspace/x", red + "/x", false},
		// Bare paths are mapped as paths.
		{m, r + "/x", "/workspace/x", true},
		{m, "/etc/passwd", "/<outside-workspace>/passwd", false},
		// Other strings pass unchanged.
		{m, "https://example.com" + r + "/x", "https://example.com" + r + "/x", true},
		{m, "zed://x", "zed://x", true},
		{m, "untitled:Untitled-1", "untitled:Untitled-1", true},
		{m, "data:,hi", "data:,hi", true},
		{m, "relative/x", "relative/x", true},
		{m, "", "", true},
		{slash, "file://" + r, "file:///", true},
		{slash, "file://" + r + "/src/a%20b", "file:///src/a%20b", true},
		{slash, "file://" + r + "/src/x", "file:///src/x", true},
		{ident, "file://" + r + "/src/x?y", "file://" + r + "/src/x?y", true},
		{ident, "file://localhost" + r + "/src/x", "file://" + r + "/src/x", true},
		{ident, "file://" + r + "/src/a%20b", "file://" + r + "/src/a%20b", true},
	}
	for _, tt := range tests {
		got, ok := tt.m.URIToClient(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("[vroot %s] URIToClient(%q) = %q, %v; want %q, %v", tt.m.VirtualRoot(), tt.in, got, ok, tt.want, tt.wantOK)
		}
		if ok && hasFileScheme(tt.in) {
			checkFileURI(t, got, tt.m.VirtualRoot())
		}
	}
}

// checkFileURI fails unless u parses as a file URI with an empty host whose
// path is under root.
func checkFileURI(t testing.TB, u, root string) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("%q does not parse: %v", u, err)
	}
	if pu.Scheme != "file" || pu.Host != "" || pu.Opaque != "" || pu.User != nil {
		t.Fatalf("%q is not a file:/// URI: %#v", u, pu)
	}
	if _, ok := cutRoot(pu.Path, root); !ok || cleanPath(pu.Path) != pu.Path {
		t.Fatalf("%q: path %q is not a clean path under %q", u, pu.Path, root)
	}
}

// TestEncodedRoot uses roots whose names need percent-encoding.
func TestEncodedRoot(t *testing.T) {
	tr := newTree(t)
	root := tr.tenants + "/my tenant#1%"
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	m := mustNew(t, root, "/work space")
	enc := "file://" + strings.ReplaceAll(tr.tenants, " ", "%20") + "/my%20tenant%231%25"
	got, err := m.URIToAgent("file:///work%20space/a%20b.txt")
	if want := enc + "/a%20b.txt"; err != nil || got != want {
		t.Fatalf("URIToAgent = %q, %v; want %q", got, err, want)
	}
	back, ok := m.URIToClient(got)
	if want := "file:///work%20space/a%20b.txt"; !ok || back != want {
		t.Fatalf("URIToClient = %q, %v; want %q", back, ok, want)
	}
	// A raw space (which should have been escaped) is taken leniently as itself.
	if back, ok := m.URIToClient("file://" + tr.tenants + "/my tenant%231%25/x"); !ok || back != "file:///work%20space/x" {
		t.Errorf("URIToClient(raw) = %q, %v", back, ok)
	}
	if _, ok := m.URIToClient("file://" + tr.tenants + "/my%20tenant%231%25x/y"); ok {
		t.Error("prefix confusion through encoding")
	}
}

func TestEscapeUnescape(t *testing.T) {
	for c := 0; c < 256; c++ {
		if c == 0 || c == '/' {
			continue
		}
		p := "/a" + string([]byte{byte(c)}) + "b"
		e := escapePath(p)
		for i := 0; i < len(e); i++ {
			if !isSafe(e[i]) && e[i] != '%' {
				t.Fatalf("escapePath(%q) = %q keeps %q", p, e, e[i])
			}
		}
		d, err := unescapePath(e)
		if err != nil || d != p {
			t.Fatalf("unescapePath(escapePath(%q)) = %q, %v", p, d, err)
		}
		pu, err := url.Parse("file://" + e)
		if err != nil || pu.Path != p {
			t.Fatalf("net/url reads %q as %#v, %v", e, pu, err)
		}
	}
}
