package audit

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Verify checks the chain of the trail in files, given old to new: every
// line is JSON whose prev is the SHA-256 of the line before it, the first
// line of each file after the first chaining to the last line of the file
// before. It returns how many lines it checked and, at the first break, an
// error "FILE: line N: …". Notes (the first line chains to a line not
// given) go to out.
//
// A chain cannot tell lines cut off its ends: the first line's prev is
// taken as given, and nothing follows the last line (compare the last
// line's hash, which Last returns, with one kept elsewhere).
func Verify(files []string, out io.Writer) (n int, err error) {
	r := &lineReader{files: files}
	defer r.close()
	var before, before2 *trailLine // the two lines before cur
	for {
		cur, err := r.next()
		if err != nil {
			return n, err
		}
		if cur == nil {
			return n, nil
		}
		if cur.problem != "" {
			return n, cur.errorf("%s", cur.problem)
		}
		switch {
		case before == nil:
			if cur.prev != Genesis {
				fmt.Fprintf(out, "%s: line %d chains to a line not given (%s…): the trail began before it\n",
					cur.file, cur.n, cur.prev[:16])
			}
		case cur.prev != before.hash:
			return n, r.broken(cur, before, before2)
		}
		n++
		before2, before = before, cur
	}
}

// Last returns the hex SHA-256 of the last line of the trail in files ("":
// none), which a later file's first line will chain to.
func Last(files []string) (string, error) {
	r := &lineReader{files: files}
	defer r.close()
	last := ""
	for {
		l, err := r.next()
		if err != nil || l == nil {
			return last, err
		}
		last = l.hash
	}
}

// broken says what is wrong where cur does not chain to the line before.
func (r *lineReader) broken(cur, before, before2 *trailLine) error {
	if after, err := r.next(); err == nil && after != nil && after.problem == "" && after.prev == before.hash {
		return cur.errorf("inserted or moved here: the line after it chains to the line before it")
	}
	if before2 != nil && cur.prev == before2.hash {
		return before.errorf("inserted or moved here: the line after it chains to the line before it")
	}
	if cur.n == 1 {
		return cur.errorf("prev is not the SHA-256 of the last line of %s (line %d): a file missing or out of order, "+
			"that line changed, or lines removed between them", before.file, before.n)
	}
	return cur.errorf("prev is not the SHA-256 of line %d: line %d was changed, or lines were removed between them",
		before.n, before.n)
}

// trailLine is one line of a trail file.
type trailLine struct {
	file    string
	n       int    // from 1
	hash    string // of its bytes
	prev    string
	problem string // what is wrong with the line itself
}

func (l *trailLine) errorf(format string, args ...any) error {
	return fmt.Errorf("%s: line %d: %s", l.file, l.n, fmt.Sprintf(format, args...))
}

// lineReader reads the lines of files in turn.
type lineReader struct {
	files []string
	f     *os.File
	br    *bufio.Reader
	name  string
	n     int
}

// next returns the next line, or nil after the last.
func (r *lineReader) next() (*trailLine, error) {
	for {
		if r.br == nil {
			if len(r.files) == 0 {
				return nil, nil
			}
			f, err := os.Open(r.files[0])
			if err != nil {
				return nil, err
			}
			r.f, r.br, r.name, r.n, r.files = f, bufio.NewReaderSize(f, 64<<10), r.files[0], 0, r.files[1:]
		}
		b, err := r.br.ReadBytes('\n')
		if len(b) > 0 {
			r.n++
			return parseLine(r.name, r.n, b), nil
		}
		if !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		r.close()
	}
}

func (r *lineReader) close() {
	if r.f != nil {
		_ = r.f.Close()
		r.f, r.br = nil, nil
	}
}

// parseLine reads a line's prev and hashes it.
func parseLine(file string, n int, b []byte) *trailLine {
	l := &trailLine{file: file, n: n}
	if b[len(b)-1] != '\n' {
		l.problem = "cut off (no newline at its end)"
		return l
	}
	b = b[:len(b)-1]
	l.hash = sum(b)
	var v struct {
		Prev *string `json:"prev"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		l.problem = "not a JSON object: " + err.Error()
		return l
	}
	if v.Prev == nil {
		l.problem = "no prev"
		return l
	}
	if h, err := hex.DecodeString(*v.Prev); err != nil || len(h) != 32 || hex.EncodeToString(h) != *v.Prev {
		l.problem = fmt.Sprintf("prev %q is not a hex SHA-256", *v.Prev)
		return l
	}
	l.prev = *v.Prev
	return l
}
