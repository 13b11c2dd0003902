package jsonrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSplice(t *testing.T) {
	raw := []byte("{\"jsonrpc\":\"2.0\", \"id\": 17,\n \"method\":\"session/prompt\",\"params\":{\"sessionId\":\"old\",\"_meta\":{\"k\":\"v\"}}}")
	var s Scanner
	var m Message
	if err := s.Scan(raw, &m, testResolve); err != nil {
		t.Fatal(err)
	}
	f, _ := m.FieldOf(FieldSessionID, -1)
	edits := []Edit{
		{Start: f.Start, End: f.End, Repl: []byte(`"` + sealedLike + `"`)},
		{Start: m.IDPos[0], End: m.IDPos[1], Repl: []byte(`123456`)},
	}
	SortEdits(edits)
	if edits[0].Start != m.IDPos[0] {
		t.Fatalf("SortEdits did not order edits: %+v", edits)
	}
	out := Splice(nil, raw, edits)
	want := "{\"jsonrpc\":\"2.0\", \"id\": 123456,\n \"method\":\"session/prompt\",\"params\":{\"sessionId\":\"" + sealedLike + "\",\"_meta\":{\"k\":\"v\"}}}"
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	checkSegments(t, raw, out, edits)

	// No edits: a verbatim copy.
	if got := Splice(nil, raw, nil); !bytes.Equal(got, raw) {
		t.Fatalf("Splice without edits changed the message")
	}
	// Edits at the very start and end, empty replacement, insertion.
	got := Splice(nil, []byte("abcdef"), []Edit{{0, 1, []byte("X")}, {2, 2, []byte("+")}, {3, 4, nil}, {5, 6, []byte("YZ")}})
	if string(got) != "Xb+ceYZ" {
		t.Fatalf("got %q", got)
	}
	// Empty raw.
	if got := Splice([]byte("p"), nil, nil); string(got) != "p" {
		t.Fatalf("got %q", got)
	}
}

func TestSpliceAppendsToDst(t *testing.T) {
	raw := []byte(`{"a":"bb","c":"dd"}`)
	edits := []Edit{{Start: 5, End: 9, Repl: []byte(`"x"`)}, {Start: 14, End: 18, Repl: []byte(`"yyyy"`)}}
	want := `{"a":"x","c":"yyyy"}`

	// dst with content and spare capacity: content kept, buffer reused.
	buf := make([]byte, 0, 256)
	buf = append(buf, "prefix:"...)
	out := Splice(buf, raw, edits)
	if string(out) != "prefix:"+want {
		t.Fatalf("got %q", out)
	}
	if &out[0] != &buf[:1][0] {
		t.Errorf("Splice reallocated although dst had room")
	}
	// The relay's pattern: reuse one buffer across messages.
	out2 := Splice(out[:0], raw, edits)
	if string(out2) != want || &out2[0] != &buf[:1][0] {
		t.Errorf("Splice(dst[:0]) = %q, reused %v", out2, &out2[0] == &buf[:1][0])
	}
	allocs := testing.AllocsPerRun(100, func() { out2 = Splice(out2[:0], raw, edits) })
	if allocs != 0 {
		t.Errorf("Splice into a large enough buffer allocates %v times", allocs)
	}
	// dst too small: contents still kept.
	small := []byte("ab")
	out3 := Splice(small[:2:2], raw, edits)
	if string(out3) != "ab"+want {
		t.Fatalf("got %q", out3)
	}
}

// TestSpliceRandomEdits: random non-overlapping edits keep every byte
// outside them.
func TestSpliceRandomEdits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	raw := []byte(fuzzSeeds[1])
	for iter := 0; iter < 500; iter++ {
		var cuts []int
		for i := rng.IntN(8); i > 0; i-- {
			cuts = append(cuts, rng.IntN(len(raw)+1))
		}
		cuts = append(cuts, 0, len(raw))
		sortInts(cuts)
		var edits []Edit
		for i := 1; i+1 < len(cuts); i += 2 {
			repl := []byte(strings.Repeat("#", rng.IntN(5)))
			if rng.IntN(3) == 0 {
				repl = nil
			}
			edits = append(edits, Edit{Start: cuts[i], End: cuts[i+1], Repl: repl})
		}
		shuffled := append([]Edit(nil), edits...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		SortEdits(shuffled)
		for i := range edits {
			if edits[i].Start != shuffled[i].Start {
				t.Fatalf("SortEdits: %+v", shuffled)
			}
		}
		out := Splice(nil, raw, shuffled)
		checkSegments(t, raw, out, edits)
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func TestSortEdits(t *testing.T) {
	for _, n := range []int{0, 1, 2, 5} {
		var edits []Edit
		for i := n - 1; i >= 0; i-- {
			edits = append(edits, Edit{Start: i * 10, End: i*10 + 1})
		}
		SortEdits(edits)
		for i := range edits {
			if edits[i].Start != i*10 {
				t.Fatalf("n=%d: %+v", n, edits)
			}
		}
	}
}

// sessionList returns a session/list response whose sessions array is arr,
// with the element ranges the scanner locates.
func sessionList(t *testing.T, arr string) ([]byte, []Field) {
	t.Helper()
	raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"sessions":` + arr + `}}`)
	_, elems := scanElements(t, raw)
	return raw, elems
}

// scanElements scans raw and returns the message and the array elements the
// scanner located.
func scanElements(t *testing.T, raw []byte) (*Message, []Field) {
	t.Helper()
	var s Scanner
	var m Message
	if err := s.Scan(raw, &m, testResolve); err != nil {
		t.Fatalf("scan %s: %v", raw, err)
	}
	var elems []Field
	for _, f := range m.Fields {
		if f.Kind == FieldElement {
			elems = append(elems, f)
		}
	}
	return &m, elems
}

func decodeSessions(t *testing.T, out []byte) []any {
	t.Helper()
	if !json.Valid(out) {
		t.Fatalf("invalid JSON: %s", out)
	}
	var v struct {
		Result struct {
			Sessions []any `json:"sessions"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	if v.Result.Sessions == nil {
		v.Result.Sessions = []any{}
	}
	return v.Result.Sessions
}

func TestDeleteElementsOne(t *testing.T) {
	tests := []struct {
		arr  string
		del  int
		want string // the array after deletion, exactly
	}{
		{`[1]`, 0, `[]`},
		{`[ 1 ]`, 0, `[  ]`},
		{`[1,2,3]`, 0, `[2,3]`},
		{`[1,2,3]`, 1, `[1,3]`},
		{`[1,2,3]`, 2, `[1,2]`},
		{`[1, 2, 3]`, 0, `[2, 3]`},
		{`[1, 2, 3]`, 1, `[1, 3]`},
		{`[1, 2, 3]`, 2, `[1, 2]`},
		{"[\n  {\"sessionId\":\"a\"},\n  {\"sessionId\":\"b\"}\n]", 0, "[\n  {\"sessionId\":\"b\"}\n]"},
		{"[\n  {\"sessionId\":\"a\"},\n  {\"sessionId\":\"b\"}\n]", 1, "[\n  {\"sessionId\":\"a\"}\n]"},
		{"[\r\n\t\"a\" ,\r\n\t\"b\" ,\r\n\t\"c\"\r\n]", 1, "[\r\n\t\"a\" ,\r\n\t\"c\"\r\n]"},
		{`[{"s":[1,2]},{"s":","},"]"]`, 1, `[{"s":[1,2]},"]"]`},
		{`[{"s":[1,2]},{"s":","},"]"]`, 2, `[{"s":[1,2]},{"s":","}]`},
		{`[[],[[]],{}]`, 0, `[[[]],{}]`},
	}
	for _, tt := range tests {
		raw, elems := sessionList(t, tt.arr)
		el := elems[tt.del]
		_ = el
		out := Splice(nil, raw, deleteElements(raw, elems, func(i int) bool { return i == tt.del }))
		wantRaw := `{"jsonrpc":"2.0","id":1,"result":{"sessions":` + tt.want + `}}`
		if string(out) != wantRaw {
			t.Errorf("delete %d from %q:\n got %q\nwant %q", tt.del, tt.arr, out, wantRaw)
			continue
		}
		var before []any
		if err := json.Unmarshal([]byte(tt.arr), &before); err != nil {
			t.Fatal(err)
		}
		want := append(append([]any{}, before[:tt.del]...), before[tt.del+1:]...)
		if got := decodeSessions(t, out); !reflect.DeepEqual(got, want) {
			t.Errorf("delete %d from %s: decoded %v, want %v", tt.del, tt.arr, got, want)
		}
	}
}

// deleteElements returns the edits that drop the elements of one array
// (elems: all of its elements, in order) for which drop(i) is true, as the
// relay builds them for session/list.
func deleteElements(raw []byte, elems []Field, drop func(int) bool) []Edit {
	ranges := make([][2]int, len(elems))
	for i, el := range elems {
		ranges[i] = [2]int{el.Start, el.End}
	}
	return DeleteElements(nil, ranges, drop)
}

// TestDeleteElementsMany deletes several entries of one array at once,
// which the relay does when it drops the session/list entries a
// connection may not see (agentReader.listEdits). Every subset must give valid
// JSON with exactly the kept entries.
func TestDeleteElementsMany(t *testing.T) {
	for _, arr := range []string{
		`[{"sessionId":"a"},{"sessionId":"b"}]`,
		`[{"sessionId":"a"},{"sessionId":"b"},{"sessionId":"c"}]`,
		"[\n  {\"sessionId\":\"a\"} ,\n  {\"sessionId\":\"b\"},\n  {\"sessionId\":\"c\"},\n  {\"sessionId\":\"d\"}\n]",
	} {
		raw, elems := sessionList(t, arr)
		var all []any
		if err := json.Unmarshal([]byte(arr), &all); err != nil {
			t.Fatal(err)
		}
		for mask := 0; mask < 1<<len(elems); mask++ {
			drop := func(i int) bool { return mask&(1<<i) != 0 }
			edits := deleteElements(raw, elems, drop)
			want := []any{}
			for i := range elems {
				if !drop(i) {
					want = append(want, all[i])
				}
			}
			name := fmt.Sprintf("%d elements, delete mask %0*b", len(elems), len(elems), mask)
			t.Run(name, func(t *testing.T) {
				for i := 1; i < len(edits); i++ {
					if edits[i].Start < edits[i-1].End {
						t.Fatalf("DeleteElements edits overlap %+v (Splice panics or corrupts):\n%s", edits, raw)
					}
				}
				out := Splice(nil, raw, edits)
				if got := decodeSessions(t, out); !reflect.DeepEqual(got, want) {
					t.Fatalf("got %v, want %v", got, want)
				}
			})
		}
	}
}

func TestAppendQuote(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uo\te`, "new\nline\r\t", "\x00\x1f\x7f", "é😀", "\u2028\u2029", "<&>", "bad\xffutf8\xc3", "\xed\xa0\x80"} {
		q := AppendQuote([]byte("pre"), s)
		if !bytes.HasPrefix(q, []byte("pre")) {
			t.Fatalf("AppendQuote dropped dst")
		}
		q = q[3:]
		var got string
		if err := json.Unmarshal(q, &got); err != nil {
			t.Errorf("AppendQuote(%q) = %s: %v", s, q, err)
			continue
		}
		if !utf8.Valid(q) {
			t.Errorf("AppendQuote(%q) = %q is not valid UTF-8", s, q)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); utf8.ValidString(s) && got != s || !utf8.ValidString(s) && !strings.Contains(got, "\uFFFD") {
			t.Errorf("AppendQuote(%q) round-trips to %q (want %q)", s, got, want)
		}
	}
}

func TestAppendError(t *testing.T) {
	tests := []struct {
		id      []byte
		code    int
		msg     string
		data    []byte
		wantID  any
		wantMsg string
	}{
		{nil, CodeParseError, "parse error", nil, nil, "parse error"},
		{[]byte(`7`), CodeInvalidRequest, `bad "request"` + "\nline two", nil, 7.0, `bad "request"` + "\nline two"},
		{[]byte(`"abc"`), CodeNotFound, "not found", []byte(`{"sessionId":"x"}`), "abc", "not found"},
		{[]byte(`null`), CodeInternalError, "bad \xff byte", nil, nil, "bad \uFFFD byte"},
		{[]byte(`1`), CodeMethodNotFound, "\\ \t \u2028 \x01", []byte(`null`), 1.0, "\\ \t \u2028 \x01"},
	}
	for _, tt := range tests {
		out := AppendError([]byte("x"), tt.id, tt.code, tt.msg, tt.data)[1:]
		var v struct {
			JSONRPC string `json:"jsonrpc"`
			ID      any    `json:"id"`
			Error   struct {
				Code    int             `json:"code"`
				Message string          `json:"message"`
				Data    json.RawMessage `json:"data"`
			} `json:"error"`
		}
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("invalid JSON: %q", out)
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if v.JSONRPC != "2.0" || !reflect.DeepEqual(v.ID, tt.wantID) || v.Error.Code != tt.code || v.Error.Message != tt.wantMsg {
			t.Errorf("AppendError(%s, %q) = %s", tt.id, tt.msg, out)
		}
		if !bytes.Equal(v.Error.Data, tt.data) {
			t.Errorf("data = %s, want %s", v.Error.Data, tt.data)
		}
		// The gateway's own messages scan cleanly.
		var s Scanner
		var m Message
		if err := s.Scan(out, &m, nil); err != nil || m.Kind != KindResponse || !m.IsError {
			t.Errorf("scan %s: %v, kind %v", out, err, m.Kind)
		}
	}
}

func TestAppendResult(t *testing.T) {
	for _, tt := range []struct{ id, result string }{
		{`1`, `null`},
		{`"x\"y"`, `{"sessionId":"s","modes":[1,2]}`},
		{`-3`, `[]`},
	} {
		out := AppendResult(nil, []byte(tt.id), []byte(tt.result))
		var v map[string]json.RawMessage
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if string(v["jsonrpc"]) != `"2.0"` || string(v["id"]) != tt.id || string(v["result"]) != tt.result || len(v) != 3 {
			t.Errorf("AppendResult = %s", out)
		}
		var s Scanner
		var m Message
		if err := s.Scan(out, &m, nil); err != nil || m.Kind != KindResponse || m.IsError {
			t.Errorf("scan %s: %v", out, err)
		}
	}
}

func TestAppendRequest(t *testing.T) {
	tests := []struct {
		id     []byte
		method string
		params []byte
		kind   Kind
	}{
		{[]byte(`5`), "session/new", []byte(`{"cwd":"/"}`), KindRequest},
		{nil, "session/cancel", []byte(`{"sessionId":"s"}`), KindNotification},
		{nil, "initialized", nil, KindNotification},
		{[]byte(`"q"`), `weird "method"` + "\n", []byte(`[]`), KindRequest},
		{[]byte(`1`), "bad\xffmethod", nil, KindRequest},
	}
	for _, tt := range tests {
		out := AppendRequest(nil, tt.id, tt.method, tt.params)
		var v map[string]json.RawMessage
		if !utf8.Valid(out) {
			t.Fatalf("invalid UTF-8 %q", out)
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		var method string
		_ = json.Unmarshal(v["method"], &method)
		if method != strings.ToValidUTF8(tt.method, "\uFFFD") {
			t.Errorf("method = %q, want %q", method, tt.method)
		}
		if _, has := v["id"]; has != (tt.id != nil) || (tt.id != nil && string(v["id"]) != string(tt.id)) {
			t.Errorf("id in %s", out)
		}
		if _, has := v["params"]; has != (tt.params != nil) {
			t.Errorf("params in %s", out)
		}
		var s Scanner
		var m Message
		if err := s.Scan(out, &m, nil); err != nil || m.Kind != tt.kind || m.Method != method {
			t.Errorf("scan %s: %v, kind %v, method %q", out, err, m.Kind, m.Method)
		}
	}
}

// TestSpliceLine: a message for a line-reading agent keeps its meaning on
// one line: line breaks between tokens become spaces, so a value hiding a
// whole request on a line of its own never reaches the agent as one.
func TestSpliceLine(t *testing.T) {
	raw := []byte("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"_x/y\",\"params\":{\"a\":\r\n{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"session/new\",\"params\":{\"s\":\"\\n\"}}\n,\"b\":\r1}}")
	out := SpliceLine([]byte("keep"), raw, []Edit{{Start: 22, End: 23, Repl: []byte("77")}})
	want := "keep{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"_x/y\",\"params\":{\"a\":  {\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"session/new\",\"params\":{\"s\":\"\\n\"}} ,\"b\": 1}}\n"
	if string(out) != want {
		t.Fatalf("got  %q\nwant %q", out, want)
	}
	if !json.Valid(out[4:]) || bytes.Count(out, []byte("\n")) != 1 {
		t.Fatalf("not one valid line: %q", out)
	}
	if got := SpliceLine(nil, []byte(`{"a":1}`), nil); string(got) != "{\"a\":1}\n" {
		t.Fatalf("got %q", got)
	}
}

// BenchmarkSpliceLine is what making a client message one line costs over
// a plain splice, on a 20 KB prompt without a line break (the common case:
// two scans that find nothing).
func BenchmarkSpliceLine(b *testing.B) {
	raw := []byte(`{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"` + strings.Repeat("word ", 4000) + `"}]}}`)
	edits := []Edit{{Start: 22, End: 24, Repl: []byte("345")}}
	buf := make([]byte, 0, len(raw)+16)
	b.Run("splice", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			buf = append(Splice(buf[:0], raw, edits), '\n')
		}
	})
	b.Run("line", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			buf = SpliceLine(buf[:0], raw, edits)
		}
	})
}
