package proxy

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
		params  fsParams
		want    string // the result's content, for a read
		code    int    // the error code wanted (0 = success)
		errPart string
	}{
		{name: "whole file", method: mFsRead, params: fsParams{Path: root + "/a.txt"}, want: "one\ntwo\nthree\nfour"},
		{name: "line and limit", method: mFsRead, params: fsParams{Path: root + "/a.txt", Line: n(2), Limit: n(2)}, want: "two\nthree\n"},
		{name: "from a line", method: mFsRead, params: fsParams{Path: root + "/a.txt", Line: n(3)}, want: "three\nfour"},
		{name: "limit only", method: mFsRead, params: fsParams{Path: root + "/a.txt", Limit: n(1)}, want: "one\n"},
		{name: "past the end", method: mFsRead, params: fsParams{Path: root + "/a.txt", Line: n(9)}, want: ""},
		{name: "line 0", method: mFsRead, params: fsParams{Path: root + "/a.txt", Line: n(0)}, code: jsonrpc.CodeInvalidParams, errPart: "starts at 1"},
		{name: "negative limit", method: mFsRead, params: fsParams{Path: root + "/a.txt", Limit: n(-1)}, code: jsonrpc.CodeInvalidParams},
		{name: "cleaned inside", method: mFsRead, params: fsParams{Path: root + "/sub/../sub/./b.txt"}, want: "bee\n"},
		{name: "symlink inside", method: mFsRead, params: fsParams{Path: root + "/inner-link.txt"}, want: "bee\n"},
		{name: "missing", method: mFsRead, params: fsParams{Path: root + "/nope.txt"}, code: jsonrpc.CodeNotFound, errPart: "no such file"},
		{name: "relative", method: mFsRead, params: fsParams{Path: "a.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "absolute"},
		{name: "dot dot out", method: mFsRead, params: fsParams{Path: root + "/../" + filepath.Base(outside) + "/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "another dir", method: mFsRead, params: fsParams{Path: outside + "/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "symlink out", method: mFsRead, params: fsParams{Path: root + "/link.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "through a linked dir", method: mFsRead, params: fsParams{Path: root + "/linkdir/secret.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "outside the workspace"},
		{name: "the root itself", method: mFsRead, params: fsParams{Path: root}, code: jsonrpc.CodeInvalidParams},
		{name: "a directory", method: mFsRead, params: fsParams{Path: root + "/sub"}, code: jsonrpc.CodeInternalError, errPart: "directory"},
		{name: "over the cap", method: mFsRead, params: fsParams{Path: root + "/big.txt"}, code: jsonrpc.CodeInvalidParams, errPart: "1024-byte"},
		{name: "no root", method: mFsRead, root: "-", params: fsParams{Path: root + "/a.txt"}, code: jsonrpc.CodeInternalError, errPart: "no workspace root"},
		{name: "write", method: mFsWrite, params: fsParams{Path: root + "/new/dir/c.txt", Content: s("written")}},
		{name: "write without content", method: mFsWrite, params: fsParams{Path: root + "/c.txt"}, code: jsonrpc.CodeInvalidParams},
		{name: "write through a symlink", method: mFsWrite, params: fsParams{Path: root + "/link.txt", Content: s("overwritten")}, code: jsonrpc.CodeInvalidParams},
		{name: "write into a linked dir", method: mFsWrite, params: fsParams{Path: root + "/linkdir/new.txt", Content: s("x")}, code: jsonrpc.CodeInvalidParams},
		{name: "write outside", method: mFsWrite, params: fsParams{Path: outside + "/new.txt", Content: s("x")}, code: jsonrpc.CodeInvalidParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := root
			if tc.root == "-" {
				r = ""
			}
			res, _, err := serveFs(tc.method, r, &tc.params, 1024)
			if tc.code != 0 {
				var fe *fsError
				if !errors.As(err, &fe) || fe.code != tc.code || !strings.Contains(fe.msg, tc.errPart) {
					t.Fatalf("got %s, %v; want error %d containing %q", res, err, tc.code, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.method == mFsWrite {
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
