package jsonrpc

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// Long string values dominate the scan of a big message (an agent streaming
// a file, a long text chunk): jsontext validates them a byte at a time. The
// scanner instead validates such strings itself, eight bytes at a time, and
// hands jsontext a shadow of the message in which each of them is "". The
// shadow has the same structure, so jsontext still decides everything else:
// nesting, numbers, literals, duplicate names (names are never elided).
// Offsets are mapped back to the original message afterwards.
//
// The fast validator only has to be right when it accepts: a string it does
// not accept (a control character, a surrogate escape, invalid UTF-8) is
// left in place for jsontext, and a message that fails to scan is scanned
// again without elision, so errors are jsontext's own, with its offsets.
const (
	elideMinMessage = 1024 // smaller messages are scanned as they are
	elideMinString  = 128  // shorter strings are left in place
	maxKeptShadow   = 64 << 10
)

// elision records one string shortened to "" in the shadow: at shadow
// offsets at or past end, raw offsets are larger by delta (cumulative).
type elision struct {
	end, delta int
}

// shadow builds the shadow of raw in s.shadow and records the elisions;
// it reports false when no string was worth eliding.
func (s *Scanner) shadow(raw []byte, minString int) bool {
	s.elisions = s.elisions[:0]
	out := s.shadowBuf[:0]
	prev, delta := 0, 0
	for i := 0; i < len(raw); {
		q := indexQuote(raw[i:])
		if q < 0 {
			break
		}
		start := i + q // the opening quote
		end, ok := scanString(raw, start+1)
		if !ok {
			break // left to jsontext from here on
		}
		i = end
		if end-start < minString || isName(raw, end) {
			continue
		}
		out = append(out, raw[prev:start+1]...)
		out = append(out, '"')
		delta += end - start - 2
		s.elisions = append(s.elisions, elision{end: len(out), delta: delta})
		prev = end
	}
	if len(s.elisions) == 0 {
		s.shadowBuf = out
		return false
	}
	out = append(out, raw[prev:]...)
	s.shadowBuf = out
	return true
}

// rawOffset maps a shadow offset to the original message (a binary search:
// a big message can have thousands of elisions and of located fields).
func (s *Scanner) rawOffset(p int) int {
	i, _ := slices.BinarySearchFunc(s.elisions, p, func(e elision, p int) int { return cmp.Compare(e.end, p+1) })
	if i == 0 {
		return p
	}
	return p + s.elisions[i-1].delta
}

func indexQuote(b []byte) int {
	for i, c := range b {
		if c == '"' {
			return i
		}
	}
	return -1
}

// isName reports whether the string ending at end is an object member name
// (followed by optional whitespace and a colon).
func isName(raw []byte, end int) bool {
	for ; end < len(raw); end++ {
		switch raw[end] {
		case ' ', '\t', '\r', '\n':
			continue
		case ':':
			return true
		}
		return false
	}
	return false
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special has the high bit set in each byte of w that needs a closer look:
// a control character, quote, backslash or non-ASCII byte. It works on the
// low seven bits of each byte, where no sum carries into the next byte.
func special(w uint64) uint64 {
	w7 := w &^ msb
	ctl := w7 + (0x80-0x20)*lsb        // high bit clear: below 0x20
	quote := (w7 ^ '"'*lsb) + 0x7f*lsb // high bit clear: a quote
	bs := (w7 ^ '\\'*lsb) + 0x7f*lsb   // high bit clear: a backslash
	return (w | ^(ctl & quote & bs)) & msb
}

// scanString validates the JSON string whose contents start at raw[i] and
// returns the offset just past its closing quote. It accepts a subset of
// what jsontext accepts: printable ASCII, valid UTF-8, and the escapes
// \" \\ \/ \b \f \n \r \t, \uXXXX outside the surrogate range, and
// surrogate pairs (\uD83D\uDE00: what ASCII-only encoders write for emoji).
func scanString(raw []byte, i int) (int, bool) {
	for {
		for i+16 <= len(raw) {
			w := raw[i : i+16]
			m1, m2 := special(binary.LittleEndian.Uint64(w)), special(binary.LittleEndian.Uint64(w[8:]))
			if m1|m2 != 0 {
				if m1 == 0 {
					i, m1 = i+8, m2
				}
				i += bits.TrailingZeros64(m1) >> 3 // the first byte to look at
				goto look
			}
			i += 16
		}
		for i+8 <= len(raw) {
			if m := special(binary.LittleEndian.Uint64(raw[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
	look:
		if i >= len(raw) {
			return 0, false
		}
		switch c := raw[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(raw) {
				return 0, false
			}
			switch raw[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(raw) {
					return 0, false
				}
				v, ok := hex4(raw[i+2 : i+6])
				switch {
				case !ok:
					return 0, false
				case v >= 0xD800 && v <= 0xDBFF: // a high surrogate: a low one must follow
					if i+12 > len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
						return 0, false
					}
					if lo, ok := hex4(raw[i+8 : i+12]); !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, false
					}
					i += 12
				case v >= 0xDC00 && v <= 0xDFFF: // a low surrogate alone
					return 0, false
				default:
					i += 6
				}
			default:
				return 0, false
			}
		case c < 0x20:
			return 0, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n == 1 {
				return 0, false
			}
			i += n
		}
	}
}

func hex4(b []byte) (uint16, bool) {
	var v uint16
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(c)
	}
	return v, true
}
