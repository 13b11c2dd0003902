package tracing

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("x", MaxValue), strings.Repeat("x", MaxValue+1),
		strings.Repeat("é", MaxValue), strings.Repeat("€", MaxValue), strings.Repeat("😀", MaxValue)} {
		got := Truncate(s)
		if len(got) > MaxValue || !utf8.ValidString(got) {
			t.Errorf("Truncate of %d bytes = %d bytes, valid UTF-8 %v", len(s), len(got), utf8.ValidString(got))
		}
		if len(s) <= MaxValue && got != s {
			t.Errorf("Truncate changed %q of %d bytes", got, len(s))
		}
		if len(s) > MaxValue && (!strings.HasSuffix(got, "…") || !strings.HasPrefix(s, strings.TrimSuffix(got, "…")) || len(got) < MaxValue-3) {
			t.Errorf("Truncate of %d bytes = %.20q… of %d bytes", len(s), got, len(got))
		}
	}
}
