// Package gwlog reads the JSON log lines an acpgate process writes to its
// stderr, for the test harnesses that run the binary.
package gwlog

import (
	"bufio"
	"encoding/json"
	"io"
)

// MaxLine is the longest log line read whole.
const MaxLine = 1 << 20

// Read calls each for every line of r until r ends, with the line decoded
// (a line that is not a JSON object becomes {"msg": "raw", "line": text})
// and as read. A line over MaxLine, or a read error, is passed on as one
// last "raw" record saying so, and the rest of r is drained, so that the
// process never blocks on a full pipe and a test sees why its log stopped.
func Read(r io.Reader, each func(rec map[string]any, line []byte)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec == nil {
			rec = map[string]any{"msg": "raw", "line": sc.Text()}
		}
		each(rec, sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		line := "gwlog: the log stopped being read: " + err.Error()
		each(map[string]any{"msg": "raw", "line": line}, []byte(line))
		_, _ = io.Copy(io.Discard, r)
	}
}
