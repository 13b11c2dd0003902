package gwlog

import (
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	in := `{"msg":"listening","addr":"127.0.0.1:1"}` + "\nnot json\n" + strings.Repeat("x", MaxLine+10) + "\n" + `{"msg":"after"}` + "\n"
	var msgs, lines []string
	Read(strings.NewReader(in), func(rec map[string]any, line []byte) {
		msgs = append(msgs, rec["msg"].(string))
		lines = append(lines, string(line))
	})
	if len(msgs) != 3 || msgs[0] != "listening" || msgs[1] != "raw" || lines[1] != "not json" || msgs[2] != "raw" ||
		!strings.Contains(lines[2], "the log stopped being read") {
		t.Fatalf("records %q, lines %q", msgs, lines)
	}
}
