package audit

import (
	"bufio"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Report is what Verify found in a trail that holds together as far as
// it read.
type Report struct {
	Lines int   // lines checked
	MACs  int   // of them, lines whose MAC was checked (a key given)
	Gaps  []Gap // the gap lines, in order
	// Head is set when the first line does not chain to Genesis: the trail
	// began before the files given (or its first lines were removed).
	Head string
	// Unchecked counts lines that carry a MAC no key was given for
	// (verified without --key).
	Unchecked int
	// Unnumbered counts lines without seq before the first numbered one
	// (written by an acpgate before seq numbers).
	Unnumbered int
	// Keys are the keys the trail's lines are MACed under, in the order
	// they took over: the first is the first keyed line's, each next one
	// follows an audit.key_changed line (or a gateway.started line: a run
	// begun under another key). The last is the key the trail ends under.
	Keys []KeyUse
}

// KeyUse is a key's turn in a trail: its kid and the line it begins at.
type KeyUse struct {
	Kid  string
	File string
	Line int
}

func (k KeyUse) String() string { return fmt.Sprintf("%s (from %s line %d)", k.Kid, k.File, k.Line) }

// Gap is an audit.gap line: events lost before it.
type Gap struct {
	File   string
	Line   int
	Lost   int64 // -1: unknown
	Reason string
}

func (g Gap) String() string {
	n := "an unknown number of events"
	if g.Lost >= 0 {
		n = fmt.Sprintf("%d events", g.Lost)
	}
	return fmt.Sprintf("%s: line %d: gap: %s lost (%s)", g.File, g.Line, n, g.Reason)
}

// Verify checks the trail in files, given old to new: every line is JSON
// whose prev is the SHA-256 of the line before it (the first line of each
// file after the first chaining to the last line of the file before);
// within one run (from a gateway.started line, seq 1) the seq numbers
// follow each other; with keys, every line carries a MAC under one of them
// (found by its kid). Keys are ordered, keys given or not: a line's kid is
// the key in use, or a new one at an audit.key_changed line naming the
// key in use as its old_kid (with keys, its mac_old checked under that
// key) or at a gateway.started line (a run begun under another key); a
// key once replaced MACs no later line. It returns what it checked and, at the first break,
// an error "FILE: line N: …". Gaps the trail says it has, and a missing
// head, are in the Report, not errors.
//
// A chain cannot tell lines cut off its end: nothing follows the last
// line (compare its hash, which Last returns, or its seq with one kept
// elsewhere).
func Verify(files []string, keys [][]byte) (*Report, error) {
	byID := map[string][]byte{}
	for _, k := range keys {
		byID[KeyID(k)] = k
	}
	rep := &Report{}
	r := &lineReader{files: files}
	defer r.close()
	var before, before2 *trailLine // the two lines before cur
	numbered := false              // a line with seq was seen
	order := keyOrder{retired: map[string]*trailLine{}}
	for {
		cur, err := r.next()
		if err != nil {
			return rep, err
		}
		if cur == nil {
			return rep, nil
		}
		if cur.problem != "" {
			return rep, cur.errorf("%s", cur.problem)
		}
		switch {
		case before == nil:
			if cur.prev != Genesis {
				rep.Head = fmt.Sprintf("%s: line %d chains to a line not given (%s…): the trail began before it "+
					"(or its first lines were removed)", cur.file, cur.n, cur.prev[:16])
			}
		case cur.prev != before.hash:
			return rep, r.broken(cur, before, before2)
		}
		if err := order.check(cur, rep); err != nil {
			return rep, err
		}
		if err := checkMAC(cur, byID, rep); err != nil {
			return rep, err
		}
		switch {
		case cur.seq == nil && numbered:
			return rep, cur.errorf("no seq, after numbered lines")
		case cur.seq == nil:
			rep.Unnumbered++
		case cur.event == EventStarted && *cur.seq != 1:
			return rep, cur.errorf("%s with seq %d, not 1", EventStarted, *cur.seq)
		case cur.event != EventStarted && before != nil && before.seq != nil && *cur.seq != *before.seq+1:
			if *cur.seq > *before.seq+1 {
				return rep, cur.errorf("seq %d follows seq %d (line %d): %d lines missing within one run",
					*cur.seq, *before.seq, before.n, *cur.seq-*before.seq-1)
			}
			return rep, cur.errorf("seq %d follows seq %d (line %d): lines out of order or repeated", *cur.seq, *before.seq, before.n)
		}
		numbered = numbered || cur.seq != nil
		if cur.event == EventGap {
			rep.Gaps = append(rep.Gaps, Gap{File: cur.file, Line: cur.n, Lost: cur.lost, Reason: cur.reason})
		}
		rep.Lines++
		before2, before = before, cur
	}
}

// checkMAC checks cur's MAC under the key its kid names, when keys are
// given: then every line must carry one.
func checkMAC(cur *trailLine, keys map[string][]byte, rep *Report) error {
	if len(keys) == 0 {
		if cur.kid != "" {
			rep.Unchecked++
		}
		return nil
	}
	if cur.kid == "" {
		return cur.errorf("no MAC (kid and mac), and a key was given: the line was written without a key, or changed")
	}
	key, ok := keys[cur.kid]
	if !ok {
		return cur.errorf("MAC under key %s, which no key given is", cur.kid)
	}
	body, mac, ok := splitMAC(cur.raw)
	if !ok || mac != cur.mac || !hmac.Equal([]byte(lineMAC(key, body)), []byte(mac)) {
		return cur.errorf("MAC does not match: the line was changed (or made by someone without the key)")
	}
	if cur.event == EventKeyChanged && cur.oldKid != "" {
		old, ok := keys[cur.oldKid]
		if !ok {
			return cur.errorf("key change from key %s, which no key given is: its MAC under that key is not checked", cur.oldKid)
		}
		oldBody, macOld, ok := splitMACOld(body)
		if !ok || macOld != cur.macOld || !hmac.Equal([]byte(lineMAC(old, oldBody)), []byte(macOld)) {
			return cur.errorf("key change's MAC under the old key %s (mac_old) does not match: "+
				"the line was changed (or made by someone without that key)", cur.oldKid)
		}
	}
	rep.MACs++
	return nil
}

// keyOrder follows which key the trail is under.
type keyOrder struct {
	now     string                // kid of the key in use ("": no keyed line yet)
	retired map[string]*trailLine // kid → the line that replaced it
}

// check checks that cur is MACed under the key in use, or takes over
// from it as a key change or a run's first line may, and notes a new key
// in rep.Keys.
func (k *keyOrder) check(cur *trailLine, rep *Report) error {
	if cur.event == EventKeyChanged {
		switch {
		case cur.kid == "":
			return cur.errorf("key change without a MAC (kid and mac)")
		case cur.oldKid == cur.kid:
			return cur.errorf("key change from key %s to itself", cur.kid)
		case cur.oldKid != "" && cur.macOld == "":
			return cur.errorf("key change from key %s without its MAC under that key (mac_old)", cur.oldKid)
		case k.now != "" && cur.oldKid != k.now:
			return cur.errorf("key change from key %s, but the lines before it are under key %s", cur.oldKid, k.now)
		}
	}
	if cur.kid == "" || cur.kid == k.now {
		return nil
	}
	if by, ok := k.retired[cur.kid]; ok {
		return cur.errorf("MAC under key %s, which %s line %d replaced: a key replaced MACs no later line "+
			"(the line was made by someone holding the old key)", cur.kid, by.file, by.n)
	}
	if k.now != "" && cur.event != EventKeyChanged && cur.event != EventStarted {
		return cur.errorf("MAC under key %s, after lines under key %s with no key change (%s) between them",
			cur.kid, k.now, EventKeyChanged)
	}
	if k.now != "" {
		k.retired[k.now] = cur
	}
	k.now = cur.kid
	rep.Keys = append(rep.Keys, KeyUse{Kid: cur.kid, File: cur.file, Line: cur.n})
	return nil
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
	raw     []byte // without its newline
	hash    string // of its bytes
	prev    string
	event   string
	seq     *uint64
	kid     string
	mac     string
	oldKid  string // a key change's
	macOld  string
	lost    int64 // a gap's (-1: unknown)
	reason  string
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
	l.raw, l.hash = b, sum(b)
	var v struct {
		Prev   *string `json:"prev"`
		Event  string  `json:"event"`
		Seq    *uint64 `json:"seq"`
		Kid    string  `json:"kid"`
		MAC    string  `json:"mac"`
		OldKid string  `json:"old_kid"`
		MACOld string  `json:"mac_old"`
		Lost   *int64  `json:"lost"`
		Reason string  `json:"reason"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		l.problem = "not a JSON object: " + err.Error()
		return l
	}
	l.event, l.seq, l.kid, l.mac, l.reason, l.lost = v.Event, v.Seq, v.Kid, v.MAC, v.Reason, -1
	l.oldKid, l.macOld = v.OldKid, v.MACOld
	if v.Lost != nil {
		l.lost = *v.Lost
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
