package jsonrpc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func lines(ls ...string) []lineResult {
	out := make([]lineResult, len(ls))
	for i, l := range ls {
		out[i] = lineResult{line: l}
	}
	return out
}

func tooLong(size int) lineResult { return lineResult{tooLong: size} }

// readers returns the ways input reaches a LineReader: all at once, one
// byte at a time, and in odd-sized pieces.
func readers(input string) map[string]func() io.Reader {
	return map[string]func() io.Reader{
		"whole":    func() io.Reader { return strings.NewReader(input) },
		"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(input)) },
		"chunks":   func() io.Reader { return &chunkReader{data: []byte(input), sizes: []byte{6, 0, 12, 3}} },
		"half":     func() io.Reader { return iotest.HalfReader(strings.NewReader(input)) },
	}
}

func TestLineReader(t *testing.T) {
	tests := []struct {
		name  string
		input string
		max   int
		want  []lineResult
	}{
		{"LF", "{\"a\":1}\n{\"b\":2}\n", 100, lines(`{"a":1}`, `{"b":2}`)},
		{"CRLF", "{\"a\":1}\r\n{\"b\":2}\r\n", 100, lines(`{"a":1}`, `{"b":2}`)},
		{"mixed endings", "a\r\nb\nc\r\n", 100, lines("a", "b", "c")},
		{"blank lines skipped", "\n\n a \n\r\n   \n\t\r\n\nb\n\n", 100, lines(" a ", "b")},
		{"only blank lines", "\n\r\n \n\t\n", 100, nil},
		{"empty input", "", 100, nil},
		{"last line without newline", "a\nlast", 100, lines("a", "last")},
		{"last line CR without LF", "a\nlast\r", 100, lines("a", "last")},
		{"single line without newline", "only", 100, lines("only")},
		{"CR inside a line kept", "a\rb\n", 100, lines("a\rb")},
		{"exactly at limit", strings.Repeat("x", 20) + "\n", 20, lines(strings.Repeat("x", 20))},
		{"limit+1", strings.Repeat("x", 21) + "\n", 20, []lineResult{tooLong(21)}},
		{"exactly at limit at EOF", strings.Repeat("x", 20), 20, lines(strings.Repeat("x", 20))},
		{"limit+1 at EOF", strings.Repeat("x", 21), 20, []lineResult{tooLong(21)}},
		{"too long then good", strings.Repeat("x", 500) + "\n{\"ok\":true}\n", 20, []lineResult{tooLong(500), {line: `{"ok":true}`}}},
		{"too long twice then good", strings.Repeat("x", 50) + "\n" + strings.Repeat("y", 21) + "\nz\n", 20, []lineResult{tooLong(50), tooLong(21), {line: "z"}}},
		{"good, too long, good", "a\n" + strings.Repeat("x", 100) + "\r\nb\n", 20, []lineResult{{line: "a"}, tooLong(101), {line: "b"}}},
		{"too long blank line", strings.Repeat(" ", 30) + "\nok\n", 20, []lineResult{tooLong(30), {line: "ok"}}},
		{"limit 16", "0123456789abcdef\n0123456789abcdefg\nok\n", 16, []lineResult{{line: "0123456789abcdef"}, tooLong(17), {line: "ok"}}},
		{"limit 15", "0123456789abcde\n0123456789abcdef\nok\n", 15, []lineResult{{line: "0123456789abcde"}, tooLong(16), {line: "ok"}}},
	}
	for _, tt := range tests {
		for rname, mk := range readers(tt.input) {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				got := readLines(t, NewLineReader(mk(), tt.max), 1000)
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %+v\nwant %+v", got, tt.want)
				}
			})
		}
	}
}

// TestLineReaderTinyLimits: bufio.NewReaderSize never makes a buffer
// smaller than 16 bytes, so with a limit under 15 a line that fits
// bufio's buffer comes back from the fast path unchecked.
func TestLineReaderTinyLimits(t *testing.T) {
	for max := 0; max <= 16; max++ {
		t.Run(fmt.Sprint("limit ", max), func(t *testing.T) {
			input := "hello world!\nab\n" + strings.Repeat("z", max) + "\n"
			want := modelLines([]byte(input), max)
			got := readLines(t, NewLineReader(strings.NewReader(input), max), 100)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("limit %d: got %+v\nwant %+v", max, got, want)
			}
		})
	}
}

// TestLineReaderLargeLines covers lines longer than the 64 KiB internal
// buffer.
func TestLineReaderLargeLines(t *testing.T) {
	const buf = 64 << 10
	big := func(n int) string { return strings.Repeat("b", n) }
	tests := []struct {
		name  string
		input string
		max   int
		want  []lineResult
	}{
		{"200 KiB line under a 1 MiB limit", big(200<<10) + "\nnext\n", 1 << 20, lines(big(200<<10), "next")},
		{"200 KiB CRLF line", big(200<<10) + "\r\nnext\r\n", 1 << 20, lines(big(200<<10), "next")},
		{"200 KiB line at EOF", "first\n" + big(200<<10), 1 << 20, lines("first", big(200<<10))},
		{"line of buffer-1", big(buf-1) + "\n", 1 << 20, lines(big(buf - 1))},
		{"line of buffer size", big(buf) + "\n", 1 << 20, lines(big(buf))},
		{"line of buffer+1", big(buf+1) + "\n", 1 << 20, lines(big(buf + 1))},
		{"exactly at a 100000 limit", big(100000) + "\nx\n", 100000, lines(big(100000), "x")},
		{"limit+1 with a 100000 limit", big(100001) + "\nx\n", 100000, []lineResult{tooLong(100001), {line: "x"}}},
		{"far over a 100000 limit", big(1<<20) + "\nx\n", 100000, []lineResult{tooLong(1 << 20), {line: "x"}}},
		{"far over at EOF", big(300000), 100000, []lineResult{tooLong(300000)}},
		{"limit = buffer, at limit", big(buf) + "\nx\n", buf, lines(big(buf), "x")},
		{"limit = buffer, limit+1", big(buf+1) + "\nx\n", buf, []lineResult{tooLong(buf + 1), {line: "x"}}},
		{"limit = buffer-1, at limit", big(buf-1) + "\nx\n", buf - 1, lines(big(buf-1), "x")},
		{"limit = buffer-1, limit+1", big(buf) + "\nx\n", buf - 1, []lineResult{tooLong(buf), {line: "x"}}},
		{"limit = buffer-1, far over", big(5*buf) + "\nx\n", buf - 1, []lineResult{tooLong(5 * buf), {line: "x"}}},
	}
	for _, tt := range tests {
		for _, rname := range []string{"whole", "chunks"} {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				var r io.Reader = strings.NewReader(tt.input)
				if rname == "chunks" {
					r = &chunkReader{data: []byte(tt.input), sizes: []byte{200, 7, 255}}
				}
				got := readLines(t, NewLineReader(r, tt.max), 1000)
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %s\nwant %s", summarize(got), summarize(tt.want))
				}
			})
		}
	}
}

func summarize(rs []lineResult) string {
	var b strings.Builder
	for _, r := range rs {
		if r.tooLong > 0 {
			fmt.Fprintf(&b, "[too long %d] ", r.tooLong)
		} else if len(r.line) > 40 {
			fmt.Fprintf(&b, "[line of %d bytes] ", len(r.line))
		} else {
			fmt.Fprintf(&b, "%q ", r.line)
		}
	}
	return b.String()
}

func TestLineTooLongError(t *testing.T) {
	lr := NewLineReader(strings.NewReader(strings.Repeat("x", 40)+"\n"), 32)
	_, err := lr.Next()
	var tl *LineTooLongError
	if !errors.As(err, &tl) {
		t.Fatalf("err = %v", err)
	}
	if tl.Limit != 32 || tl.Size != 40 {
		t.Errorf("LineTooLongError = %+v", tl)
	}
	if msg := err.Error(); !strings.Contains(msg, "40") || !strings.Contains(msg, "32") {
		t.Errorf("message %q", msg)
	}
	if _, err := lr.Next(); err != io.EOF {
		t.Errorf("after the long line: %v", err)
	}
}

// TestLineReaderReadError: a read error other than EOF is returned, and a
// partial line before it is not returned as a complete one.
func TestLineReaderReadError(t *testing.T) {
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("ok\npartial"), iotest.ErrReader(boom))
	lr := NewLineReader(r, 100)
	if l, err := lr.Next(); err != nil || string(l) != "ok" {
		t.Fatalf("first: %q %v", l, err)
	}
	if l, err := lr.Next(); !errors.Is(err, boom) {
		t.Fatalf("second: %q %v, want boom", l, err)
	}

	// The same while discarding an over-long line.
	r = io.MultiReader(strings.NewReader(strings.Repeat("x", 100)), iotest.ErrReader(boom))
	lr = NewLineReader(r, 20)
	if l, err := lr.Next(); !errors.Is(err, boom) {
		t.Fatalf("discarding: %q %v, want boom", l, err)
	}
}

// TestLineReaderLineValidUntilNext documents the aliasing contract: the
// returned slice may be overwritten by the next call, so callers copy.
func TestLineReaderLineValidUntilNext(t *testing.T) {
	lr := NewLineReader(strings.NewReader("first\nsecond\n"), 100)
	a, _ := lr.Next()
	a = bytes.Clone(a)
	b, _ := lr.Next()
	if string(a) != "first" || string(b) != "second" {
		t.Fatalf("%q %q", a, b)
	}
}
