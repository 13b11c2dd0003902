package jsonrpc

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// jsontextString is what jsontext makes of a string token at the start of b:
// its length, or -1 if it rejects it.
func jsontextString(b []byte) int {
	d := jsontext.NewDecoder(bytes.NewReader(b))
	v, err := d.ReadValue()
	if err != nil || v.Kind() != '"' {
		return -1
	}
	return len(v)
}

func TestScanString(t *testing.T) {
	long := strings.Repeat("abcdefgh", 40)
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`""`, true},
		{`"` + long + `"`, true},
		{`"` + long + `\n` + long + `"`, true},
		{`"\" \\ \/ \b \f \n \r \t \u0041 \u00e9 \uFFFF"`, true},
		{`"héllo wörld ✓ 😀 ` + long + `"`, true},
		{"\"\xef\xbf\xbd\"", true}, // U+FFFD, encoded properly
		{"\"tab\there\"", false},   // a raw control character
		{"\"" + long + "\x00\"", false},
		{"\"bad \xff utf8\"", false},
		{"\"surrogate \xed\xa0\x80\"", false},
		{"\"overlong \xc0\xaf\"", false},
		{`"\ud83d\ude00 \uD83D\uDE00"`, true}, // surrogate pairs
		{`"\ud800"`, false},
		{`"\ud800\u0041"`, false},
		{`"\ud800\ud800"`, false},
		{`"\udc00\ud800"`, false},
		{`"\ud800\udc0"`, false},
		{`"\ud800x\udc00"`, false},
		{`"\x"`, false},
		{`"\u12"`, false},
		{`"\u12g4"`, false},
		{`"unterminated`, false},
		{`"` + long, false},
		{`"ends in a backslash\`, false},
	} {
		end, ok := scanString([]byte(tc.in), 1)
		if ok != tc.ok {
			t.Errorf("scanString(%q) = %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if ok && end != len(tc.in) {
			t.Errorf("scanString(%q) ends at %d, want %d", tc.in, end, len(tc.in))
		}
		if ok && jsontextString([]byte(tc.in)) != len(tc.in) {
			t.Errorf("scanString accepts %q, jsontext does not", tc.in)
		}
	}
}

// FuzzScanString: what the fast validator accepts, jsontext accepts, with the
// same end.
func FuzzScanString(f *testing.F) {
	for _, s := range []string{`"abc"`, `"\n\u0041é"`, "\"\xff\"", `"\ud800\udc00"`, `"a\"b" tail`, "\"12345678\x1f\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '"' {
			return
		}
		end, ok := scanString(b, 1)
		if !ok {
			return
		}
		if n := jsontextString(b[:end]); n != end {
			t.Fatalf("scanString accepts %q (end %d), jsontext: %d", b[:end], end, n)
		}
	})
}

// TestSpecial: special finds the first byte that needs a look, whatever
// follows it, and only such bytes.
func TestSpecial(t *testing.T) {
	isSpecial := func(c byte) bool { return c < 0x20 || c >= 0x80 || c == '"' || c == '\\' }
	fill := []byte{'a', 0, 0x1f, 0x20, '"', '\\', 0x7f, 0x80, 0xff, 0x21}
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 8; pos++ {
			for _, after := range fill {
				w := []byte("abcdefgh")
				w[pos] = byte(c)
				for i := pos + 1; i < 8; i++ {
					w[i] = after
				}
				want := 8
				for i, b := range w {
					if isSpecial(b) {
						want = i
						break
					}
				}
				got := 8
				if m := special(binary.LittleEndian.Uint64(w)); m != 0 {
					got = bits.TrailingZeros64(m) >> 3
				}
				if got != want {
					t.Fatalf("special(%q): first byte %d, want %d", w, got, want)
				}
			}
		}
	}
}

// TestScanElides: a big message with long strings is scanned through its
// shadow, and gives what a scan of the message as sent gives.
func TestScanElides(t *testing.T) {
	long := strings.Repeat("0123456789 \\n ", 200)
	raw := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + strings.Repeat("s", 200) +
		`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"` + long + `"}}}}`)
	var s Scanner
	var m Message
	if err := s.Scan(raw, &m, testResolve); err != nil {
		t.Fatal(err)
	}
	if len(s.elisions) != 2 {
		t.Fatalf("%d strings elided, want 2 (the session ID and the text)", len(s.elisions))
	}
	checkElision(t, raw, nil, &m)
	f, ok := m.FieldOf(FieldSessionID, -1)
	if !ok || string(m.Bytes(f)) != `"`+strings.Repeat("s", 200)+`"` {
		t.Fatalf("session ID field %+v = %q", f, m.Bytes(f))
	}
	// A long string that is not valid where it stands is still an error, with
	// jsontext's own message for the message as sent.
	bad := bytes.Replace(raw, []byte(`"text":"`), []byte(`"text" "`), 1)
	err := s.Scan(bad, &m, testResolve)
	var plainScanner = Scanner{minMessage: 1 << 30}
	err2 := plainScanner.Scan(bad, &m, testResolve)
	if err == nil || err.Error() != err2.Error() {
		t.Fatalf("error %v, want %v", err, err2)
	}
}

// proseString is 20 KB of ASCII prose with a JSON \n escape every 64 bytes
// (the load harness's agent text), quoted.
func proseString() []byte {
	s := []byte{'"'}
	for len(s) < 20<<10 {
		s = append(s, "The quick brown fox jumps over the lazy dog; then it rests. \\n"...)
	}
	return append(s, '"')
}

// BenchmarkScanStringProse: the fast validator on proseString.
func BenchmarkScanStringProse(b *testing.B) {
	s := proseString()
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		if end, ok := scanString(s, 1); !ok || end != len(s) {
			b.Fatal("rejected")
		}
	}
}

// BenchmarkScanStringProseJSONText is jsontext on the same string.
func BenchmarkScanStringProseJSONText(b *testing.B) {
	s := proseString()
	b.SetBytes(int64(len(s)))
	var d jsontext.Decoder
	for b.Loop() {
		d.Reset(bytes.NewBuffer(s))
		if _, err := d.ReadValue(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRawOffset: offsets before an elided string's end are unchanged by it,
// offsets at or past its end move by what it lost.
func TestRawOffset(t *testing.T) {
	s := Scanner{elisions: []elision{{end: 10, delta: 100}, {end: 20, delta: 250}}}
	for _, tc := range [][2]int{{0, 0}, {9, 9}, {10, 110}, {19, 119}, {20, 270}, {21, 271}} {
		if got := s.rawOffset(tc[0]); got != tc[1] {
			t.Errorf("rawOffset(%d) = %d, want %d", tc[0], got, tc[1])
		}
	}
}

// TestScanDropsBigShadow: a connection's scanner does not keep the shadow
// of one big message (a long string and a lot of structure) afterwards.
func TestScanDropsBigShadow(t *testing.T) {
	raw := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"x":"` + strings.Repeat("a", 200) + `","n":[` +
		strings.Repeat("1,", 100<<10) + `1]}}`)
	var s Scanner
	var m Message
	if err := s.Scan(raw, &m, testResolve); err != nil {
		t.Fatal(err)
	}
	if cap(s.shadowBuf) > maxKeptShadow {
		t.Fatalf("the scanner keeps a %d-byte shadow", cap(s.shadowBuf))
	}
}
