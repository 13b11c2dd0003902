package jsonrpc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// LineTooLongError reports a line over the reader's limit. The line has
// been consumed; the next call to Next reads the line after it.
type LineTooLongError struct {
	Limit int
	Size  int // bytes seen before the newline
}

func (e *LineTooLongError) Error() string {
	return fmt.Sprintf("line of %d bytes exceeds the %d byte limit", e.Size, e.Limit)
}

// LineReader splits newline-delimited JSON-RPC (the ACP stdio transport).
// It is not safe for concurrent use.
type LineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewLineReader reads lines of at most max bytes (without the newline).
func NewLineReader(r io.Reader, max int) *LineReader {
	size := 64 << 10
	if max < size {
		size = max + 1
	}
	return &LineReader{r: bufio.NewReaderSize(r, size), max: max}
}

// Next returns the next non-empty line without its "\n" or "\r\n". The slice
// is only valid until the next call. At the end of input it returns io.EOF
// (a last line without a newline is still returned first).
func (l *LineReader) Next() ([]byte, error) {
	for {
		line, err := l.next()
		if err != nil {
			return nil, err
		}
		line = bytes.TrimRight(line, "\r")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return line, nil
	}
}

func (l *LineReader) next() ([]byte, error) {
	frag, err := l.r.ReadSlice('\n')
	if err == nil {
		// Fast path: the line fits the buffer (which is never smaller than
		// 16 bytes, so the limit is still checked).
		if len(frag)-1 > l.max {
			return nil, &LineTooLongError{Limit: l.max, Size: len(frag) - 1}
		}
		return frag[:len(frag)-1], nil
	}
	l.buf = append(l.buf[:0], frag...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(l.buf) > l.max {
			return nil, l.discard(len(l.buf))
		}
		frag, err = l.r.ReadSlice('\n')
		l.buf = append(l.buf, frag...)
	}
	switch {
	case err == nil:
		l.buf = l.buf[:len(l.buf)-1]
	case err == io.EOF && len(l.buf) > 0:
	default:
		return nil, err
	}
	if len(l.buf) > l.max {
		return nil, &LineTooLongError{Limit: l.max, Size: len(l.buf)}
	}
	return l.buf, nil
}

// discard skips to the end of an over-long line.
func (l *LineReader) discard(seen int) error {
	l.buf = l.buf[:0]
	for {
		frag, err := l.r.ReadSlice('\n')
		seen += len(frag)
		if err == nil {
			return &LineTooLongError{Limit: l.max, Size: seen - 1}
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if err == io.EOF {
				return &LineTooLongError{Limit: l.max, Size: seen}
			}
			return err
		}
	}
}
