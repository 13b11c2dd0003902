package pathrewrite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/pathmap"
)

// mapperAt maps a fresh directory to virtual.
func mapperAt(t *testing.T, virtual string) *pathmap.Mapper {
	t.Helper()
	root := filepath.Join(t.TempDir(), "acme")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := pathmap.New(root, virtual)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestScrubHostRoot(t *testing.T) {
	m := mapperAt(t, "/workspace")
	real := m.Root()
	for _, tc := range []struct{ in, want string }{
		{`{"title":"Read ` + real + `/notes.txt"}`, `{"title":"Read /workspace/notes.txt"}`},
		{`{"cwd":"` + real + `"}`, `{"cwd":"/workspace"}`},
		{`{"t":"` + real + `2/x and ` + real + `/y"}`, `{"t":"` + real + `2/x and /workspace/y"}`},
		{`{"t":"x` + real + `/y"}`, `{"t":"x` + real + `/y"}`}, // not at a path start
		{`{"t":"(` + real + `/a) '` + real + `/b'"}`, `{"t":"(/workspace/a) '/workspace/b'"}`},
		{`{"t":"nothing here"}`, `{"t":"nothing here"}`},
	} {
		if got := string(ScrubHostRoot(m, []byte(tc.in))); got != tc.want {
			t.Errorf("scrub(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
	// Virtual root "/": the root becomes "/".
	slash, err := pathmap.New(real, "/")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(ScrubHostRoot(slash, []byte(`"`+real+`" "`+real+`/a"`))); got != `"/" "/a"` {
		t.Errorf("virtual root /: %s", got)
	}
	if got := string(ScrubHostRoot(nil, []byte(`"`+real+`"`))); got != `"`+real+`"` {
		t.Errorf("no mapper: %s", got)
	}
}

// spec locates params.path (a path) and params.uri (a URI).
var spec = &jsonrpc.Spec{Fields: map[string]*jsonrpc.Spec{
	"path": {Kind: jsonrpc.FieldPath, Label: "path"},
	"uri":  {Kind: jsonrpc.FieldURI, Label: "uri"},
}}

// request is a request with params.
func request(params string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"x","params":` + params + `}`
}

// scan scans a request with params.
func scan(t *testing.T, params string) *jsonrpc.Message {
	t.Helper()
	var s jsonrpc.Scanner
	m := &jsonrpc.Message{}
	raw := []byte(request(params))
	if err := s.Scan(raw, m, func(*jsonrpc.Message) *jsonrpc.Spec { return spec }); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestToAgent(t *testing.T) {
	m := mapperAt(t, "/workspace")
	for _, tc := range []struct{ params, want, err string }{
		{`{"path":"/workspace/a.txt","uri":"file:///workspace/b.txt"}`,
			`{"path":"` + m.Root() + `/a.txt","uri":"file://` + m.Root() + `/b.txt"}`, ""},
		{`{"path":"/etc/passwd"}`, "", "params.path: "},
		{`{"uri":"file:///etc/passwd"}`, "", "params.uri: "},
		{`{"path":5}`, "", "params.path: must be a string"},
	} {
		msg := scan(t, tc.params)
		edits, err := ToAgent(m, msg, nil)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error starting %q", tc.params, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.params, err)
		}
		if got := string(jsonrpc.Splice(nil, msg.Raw, edits)); got != request(tc.want) {
			t.Errorf("%s: %s, want %s", tc.params, got, tc.want)
		}
	}
	if edits, err := ToAgent(nil, scan(t, `{"path":"/etc/passwd"}`), nil); edits != nil || err != nil {
		t.Errorf("no mapper: %v, %v", edits, err)
	}
}

func TestToClient(t *testing.T) {
	m := mapperAt(t, "/workspace")
	msg := scan(t, `{"path":"`+m.Root()+`/a.txt","uri":"file:///etc/passwd"}`)
	edits, outside := ToClient(m, msg, nil, false)
	if got, want := string(jsonrpc.Splice(nil, msg.Raw, edits)),
		request(`{"path":"/workspace/a.txt","uri":"file:///%3Coutside-workspace%3E/passwd"}`); got != want || outside != "" {
		t.Errorf("redacted: %s %q, want %s", got, outside, want)
	}
	if _, outside := ToClient(m, msg, nil, true); outside != "uri" {
		t.Errorf("confined: outside %q, want uri", outside)
	}
}
