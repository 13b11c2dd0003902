package fsstandin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

func TestServeFs(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(root, "a.txt", "one\ntwo\nthree\nfour")
	write(root, "sub/b.txt", "bee\n")
	write(root, "big.txt", strings.Repeat("x", 2048))
	write(outside, "secret.txt", "the secret\n")
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(root, "link.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/b.txt", filepath.Join(root, "inner-link.txt")); err != nil {
		t.Fatal(err)
	}
	n := func(v int) *int { return &v }
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		name    string
		method  string
		root    string
		params  Params
		want    string // the result's content, for a read
		code    int    // the error code wanted (0 = success)
		errPart string
	}{
		{name: "whole file", method: Read, params: Params{Path: root + "/a.txt"}, want: "one\ntwo\nthree\nfour"},
		{name: "line and limit", method: Read, params: Params{Path: root + "/a.txt", Line: n(2), Limit: n(2)}, want: "two\nthree\n"},
		{name: "from a line", method: Read, params: Params{Path: root + "/a.txt", Line: n(3)}, want: "three\nfour"},
		{name: "limit only", method: Read, params: Params{Path: root + "/a.txt", Limit: n(1)}, want: "one\n"},
		{name: "past the end", method: Read, params: Params{Path: root + "/a.txt", Line: n(9)}, want: ""},
		{name: "line 0", method: Read, params: Params{Path: root + "/a.txt", Line: n(0)}, code: jsonrpc.CodeInvalidParams, errPart: "starts at 1"},
		{name: "negative limit", method: Read, params: Params{Path: root + "/a.txt", Limit: n(-1)}, code: jsonrpc.CodeInvalidParams},
		{name: "cleaned inside", method: Read, params: Params{Path: root + "/sub/../sub/./b.txt"}, want: "bee\n"},
		{name: "symlink inside", method: Read, params: Params{Path: root + "/inner-link.txt"}, want: "bee\n"},
		{name: "missing", method: Read, params: Params{Path: root + "/nope.txt"}, code: jsonrpc.CodeNotFound, errPart: "no such file"},
		{name: "relative", method: Read, params: Params{Path: "a.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "absolute"},
		{name: "dot dot out", method: Read, params: Params{Path: root + "/../" + filepath.Base(outside) + "/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "another dir", method: Read, params: Params{Path: outside + "/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "symlink out", method: Read, params: Params{Path: root + "/link.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "through a linked dir", method: Read, params: Params{Path: root + "/linkdir/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "the root itself", method: Read, params: Params{Path: root}, code: jsonrpc.CodeInvalidParams},
		{name: "a directory", method: Read, params: Params{Path: root + "/sub"}, code: jsonrpc.CodeInternalError, errPart: "directory"},
		{name: "over the cap", method: Read, params: Params{Path: root + "/big.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "1024-byte"},
		{name: "no root", method: Read, root: "-", params: Params{Path: root + "/a.txt"}, code: jsonrpc.CodeInternalError, errPart: "no workspace root"},
		{name: "write", method: Write, params: Params{Path: root + "/new/dir/c.txt", Content: s("written")}},
		{name: "write without content", method: Write, params: Params{Path: root + "/c.txt"}, code: jsonrpc.CodeInvalidParams},
		{name: "write through a symlink", method: Write, params: Params{Path: root + "/link.txt", Content: s("overwritten")}, code: jsonrpc.CodeInvalidParams},
		{name: "write into a linked dir", method: Write, params: Params{Path: root + "/linkdir/new.txt", Content: s("x")}, code: jsonrpc.CodeInvalidParams},
		{name: "write outside", method: Write, params: Params{Path: outside + "/new.txt", Content: s("x")}, code: jsonrpc.CodeInvalidParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := root
			if tc.root == "-" {
				r = ""
			}
			res, _, err := Serve(tc.method, r, &tc.params, 1024)
			if tc.code != 0 {
				var fe *Error
				if !errors.As(err, &fe) || fe.Code != tc.code || !strings.Contains(fe.Msg, tc.errPart) {
					t.Fatalf("got %s, %v; want error %d containing %q", res, err, tc.code, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.method == Write {
				if string(res) != "{}" {
					t.Fatalf("write result %s", res)
				}
				return
			}
			var got struct{ Content *string }
			if json.Unmarshal(res, &got) != nil || got.Content == nil || *got.Content != tc.want {
				t.Fatalf("result %s, want content %q", res, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(root, "new/dir/c.txt")); err != nil || string(b) != "written" {
		t.Fatalf("the written file: %q, %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "the secret\n" {
		t.Fatalf("a write through a symlink changed a file outside the root: %q", b)
	}
	for _, name := range []string{"new.txt"} {
		if _, err := os.Stat(filepath.Join(outside, name)); err == nil {
			t.Fatalf("%s was written outside the root", name)
		}
	}
}
