package proxy

import (
	"os"
	"path/filepath"
	"testing"
)

func TestScrubHostRoot(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "acme")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ten, err := newTenant(TenantConfig{Name: "acme", Root: root, VirtualRoot: "/workspace"}, nopMetrics())
	if err != nil {
		t.Fatal(err)
	}
	real := ten.mapper.Load().Root()
	for _, tc := range []struct{ in, want string }{
		{`{"title":"Read ` + real + `/notes.txt"}`, `{"title":"Read /workspace/notes.txt"}`},
		{`{"cwd":"` + real + `"}`, `{"cwd":"/workspace"}`},
		{`{"t":"` + real + `2/x and ` + real + `/y"}`, `{"t":"` + real + `2/x and /workspace/y"}`},
		{`{"t":"x` + real + `/y"}`, `{"t":"x` + real + `/y"}`}, // not at a path start
		{`{"t":"(` + real + `/a) '` + real + `/b'"}`, `{"t":"(/workspace/a) '/workspace/b'"}`},
		{`{"t":"nothing here"}`, `{"t":"nothing here"}`},
	} {
		if got := string(ten.scrubHostRoot([]byte(tc.in))); got != tc.want {
			t.Errorf("scrub(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
	// Virtual root "/": the root becomes "/".
	slash, _ := newTenant(TenantConfig{Name: "s", Root: root, VirtualRoot: "/"}, nopMetrics())
	if got := string(slash.scrubHostRoot([]byte(`"` + real + `" "` + real + `/a"`))); got != `"/" "/a"` {
		t.Errorf("virtual root /: %s", got)
	}
}
