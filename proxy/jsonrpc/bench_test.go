package jsonrpc

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

// benchSessionID is an agent's own session ID (a UUID, as most agents use).
const benchSessionID = "0f5c3c1e-8a9b-4c2d-9e1f-2a3b4c5d6e7f"

var benchSpec = &Spec{Fields: map[string]*Spec{"sessionId": {Kind: FieldSessionID}}}

// benchText is assistant output: prose, Markdown, code with quotes,
// backslashes and newlines that JSON escapes, and some non-ASCII.
const benchText = "Sure! Here's how the relay rewrites a message without re-encoding it.\n\n" +
	"## Steps\n\n1. Scan the envelope once with a streaming decoder.\n" +
	"2. Record where `params.sessionId` sits.\n3. Splice the sealed ID in.\n\n" +
	"```go\nfunc main() {\n\tfmt.Println(\"hello, \\\"world\\\"\")\n\tpath := `C:\\Users\\dev`\n}\n```\n\n" +
	"Unicode is kept verbatim: café, naïve, 日本語, emoji 🚀. Tabs\tand quotes \"too\".\n"

// sessionUpdate builds an agent→client session/update notification
// (agent_message_chunk) of exactly size bytes.
func sessionUpdate(size int) []byte {
	build := func(text string) []byte {
		b := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + benchSessionID +
			`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":`)
		b = AppendQuote(b, text)
		return append(b, `}}}}`...)
	}
	src := strings.Repeat(benchText, size/len(benchText)+1)
	// The longest prefix of src (on a rune boundary) that fits, then
	// pad with single-byte characters.
	lo, hi := 0, len(src)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if len(build(src[:mid])) <= size {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	text := strings.ToValidUTF8(src[:lo], "")
	msg := build(text)
	msg = build(text + strings.Repeat(".", size-len(msg)))
	if len(msg) != size || !json.Valid(msg) {
		panic("sessionUpdate: bad size or JSON")
	}
	return msg
}

var (
	bench300  = sessionUpdate(300)
	bench20KB = sessionUpdate(20 << 10)
	benchLog  sync.Once
)

func logSizes(b *testing.B) {
	benchLog.Do(func() {
		b.Logf("session/update sizes: %d bytes and %d bytes; replacement session ID %d characters", len(bench300), len(bench20KB), len(sealedLike))
	})
}

// rewriter is the relay's hot path: scan, locate params.sessionId, splice
// in the sealed ID, reusing the scanner, message, edits and output buffer.
type rewriter struct {
	s     Scanner
	m     Message
	repl  []byte
	edits []Edit
	dst   []byte // the last rewritten message
}

// newRewriter returns a rewriter whose output buffer holds a rewritten
// message of up to size bytes.
func newRewriter(size int) *rewriter {
	r := &rewriter{
		s:     Scanner{Methods: map[string]string{"session/update": "session/update"}},
		repl:  AppendQuote(nil, sealedLike),
		edits: make([]Edit, 0, 4),
	}
	r.dst = make([]byte, 0, size+len(r.repl))
	return r
}

func (r *rewriter) rewrite(tb testing.TB, msg []byte) {
	if err := r.s.Scan(msg, &r.m, func(*Message) *Spec { return benchSpec }); err != nil {
		tb.Fatal(err)
	}
	f, ok := r.m.FieldOf(FieldSessionID, -1)
	if !ok {
		tb.Fatal("no sessionId")
	}
	r.edits = append(r.edits[:0], Edit{Start: f.Start, End: f.End, Repl: r.repl})
	SortEdits(r.edits)
	r.dst = Splice(r.dst[:0], msg, r.edits)
}

func benchRewrite(b *testing.B, msg []byte) {
	logSizes(b)
	r := newRewriter(len(msg))
	r.rewrite(b, msg)
	want := bytes.Replace(msg, []byte(`"`+benchSessionID+`"`), r.repl, 1)
	if !bytes.Equal(r.dst, want) {
		b.Fatalf("rewrite produced\n%s", r.dst)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		r.rewrite(b, msg)
	}
}

func benchScan(b *testing.B, msg []byte) { benchScanWith(b, msg, 0) }

// BenchmarkScanOnly20KBJSONText scans without eliding long strings (see
// elide.go): jsontext reads every byte, as before elision.
func BenchmarkScanOnly20KBJSONText(b *testing.B) { benchScanWith(b, bench20KB, 1<<30) }

func benchScanWith(b *testing.B, msg []byte, minMessage int) {
	logSizes(b)
	s := Scanner{Methods: map[string]string{"session/update": "session/update"}, minMessage: minMessage}
	var m Message
	resolve := func(*Message) *Spec { return benchSpec }
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if err := s.Scan(msg, &m, resolve); err != nil {
			b.Fatal(err)
		}
	}
	if len(m.Fields) != 1 {
		b.Fatal("no sessionId")
	}
}

// benchMapAny is the baseline: decode into map[string]any, replace the
// session ID and marshal again (reorders keys, re-escapes strings).
func benchMapAny(b *testing.B, msg []byte) {
	logSizes(b)
	rewrite := func() []byte {
		var v map[string]any
		if err := json.Unmarshal(msg, &v); err != nil {
			b.Fatal(err)
		}
		params, _ := v["params"].(map[string]any)
		if params["sessionId"] != benchSessionID {
			b.Fatal("no sessionId")
		}
		params["sessionId"] = sealedLike
		out, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	if out := rewrite(); !bytes.Contains(out, []byte(sealedLike)) {
		b.Fatal("rewrite lost the session ID")
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		rewrite()
	}
}

func BenchmarkRewriteSessionUpdate300B(b *testing.B) { benchRewrite(b, bench300) }
func BenchmarkRewriteSessionUpdate20KB(b *testing.B) { benchRewrite(b, bench20KB) }
func BenchmarkScanOnly300B(b *testing.B)             { benchScan(b, bench300) }
func BenchmarkScanOnly20KB(b *testing.B)             { benchScan(b, bench20KB) }
func BenchmarkMapAny300B(b *testing.B)               { benchMapAny(b, bench300) }
func BenchmarkMapAny20KB(b *testing.B)               { benchMapAny(b, bench20KB) }

func BenchmarkRewriteSessionUpdate300BParallel(b *testing.B) {
	logSizes(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(bench300)))
	b.RunParallel(func(pb *testing.PB) {
		r := newRewriter(len(bench300))
		for pb.Next() {
			r.rewrite(b, bench300)
		}
	})
}

// TestBenchMessages checks the benchmark inputs are what they claim.
func TestBenchMessages(t *testing.T) {
	for _, msg := range [][]byte{bench300, bench20KB} {
		var s Scanner
		var m Message
		if err := s.Scan(msg, &m, func(*Message) *Spec { return benchSpec }); err != nil {
			t.Fatal(err)
		}
		if m.Kind != KindNotification || m.Method != "session/update" || len(m.Fields) != 1 {
			t.Fatalf("%+v", m)
		}
	}
	if len(bench300) != 300 || len(bench20KB) != 20<<10 || len(sealedLike) != 87 {
		t.Fatalf("sizes %d %d %d", len(bench300), len(bench20KB), len(sealedLike))
	}
}

// TestRewriteDoesNotAllocate guards the relay's steady state: with a known
// method, a reused Scanner, Message, edits and output buffer, scanning and
// splicing a session/update allocates nothing.
func TestRewriteDoesNotAllocate(t *testing.T) {
	r := newRewriter(len(bench20KB))
	for _, msg := range [][]byte{bench300, bench20KB} {
		allocs := testing.AllocsPerRun(50, func() { r.rewrite(t, msg) })
		if allocs != 0 {
			t.Errorf("%d-byte rewrite: %v allocations per message", len(msg), allocs)
		}
	}
}
