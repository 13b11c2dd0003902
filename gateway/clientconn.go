package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Buffer sizes of a client connection. net/http's are 4 KiB each and would
// stay allocated for the life of every idle WebSocket; messages larger than
// these are read straight into the message buffer and written through the
// cork, so small buffers cost no extra system calls.
const (
	connReadBuffer  = 1024
	connWriteBuffer = 512
	// corkLimit is how much a corked connection holds before writing.
	corkLimit = 16 << 10
)

// upgradeWriter is the ResponseWriter handed to websocket.Accept: its
// Hijack returns the connection wrapped in a clientConn, with small
// buffers.
type upgradeWriter struct {
	http.ResponseWriter
	conn *clientConn // set by Hijack
}

func (u *upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(u.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("hijack: %w", err)
	}
	c := &clientConn{Conn: nc}
	// Bytes the client sent right after its upgrade request are already in
	// net/http's reader: they are read first.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		c.pending = append([]byte(nil), b...)
	}
	if n := brw.Writer.Buffered(); n > 0 { // net/http flushes the 101 before handing over
		if err := brw.Writer.Flush(); err != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("hijack: flush: %w", err)
		}
	}
	u.conn = c
	return c, bufio.NewReadWriter(bufio.NewReaderSize(c, connReadBuffer), bufio.NewWriterSize(c, connWriteBuffer)), nil
}

// clientConn is a client's TCP connection. While corked (the writer is
// sending a batch), writes collect in a buffer that goes out when it fills
// and at uncork, so a burst of small frames costs a few write(2) calls
// instead of one each. Control frames written meanwhile (pongs, pings) go
// out with the batch.
type clientConn struct {
	net.Conn
	pending []byte // read before the connection; only the reader uses it

	mu     sync.Mutex
	corked bool
	out    []byte  // what the cork holds; backed by box while corked
	box    *[]byte // from corkPool
}

func (c *clientConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *clientConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	if len(c.out)+len(p) > corkLimit {
		// What the cork holds and p leave in one writev(2).
		held := len(c.out)
		bufs := net.Buffers{c.out, p}
		n, err := bufs.WriteTo(c.Conn)
		c.out = c.out[:0]
		return max(int(n)-held, 0), err
	}
	if c.box == nil {
		c.box = corkPool.Get().(*[]byte)
		c.out = (*c.box)[:0]
	}
	c.out = append(c.out, p...)
	return len(p), nil
}

// closeFlushTimeout bounds how long Close spends sending what the cork holds.
const closeFlushTimeout = 500 * time.Millisecond

// Close sends what the cork holds before closing: coder/websocket writes a
// close frame of its own (answering a client's close, or for a message over
// the read limit) and closes the connection right after, possibly while the
// writer is corked. The write deadline also ends a write in progress that
// holds mu, so a close of a stuck connection still takes at most
// closeFlushTimeout.
//
// Then it half-closes and reads what the client still sends (the rest of a
// message over the limit), for up to closeLinger: closing a socket with
// unread input sends a reset, which can reach the client before the close
// frame and lose it (the client sees 1006, not 1009).
func (c *clientConn) Close() error {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	c.mu.Lock()
	c.corked = false
	_ = c.drainLocked()
	c.mu.Unlock()
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok && hc.CloseWrite() == nil {
		_ = c.Conn.SetReadDeadline(time.Now().Add(closeLinger))
		_, _ = io.CopyN(io.Discard, c.Conn, closeLingerBytes)
	}
	return c.Conn.Close()
}

// closeLinger and closeLingerBytes bound what Close reads after its
// half-close.
const (
	closeLinger      = 250 * time.Millisecond
	closeLingerBytes = 1 << 20
)

func (c *clientConn) flushLocked() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.out)
	c.out = c.out[:0]
	return err
}

func (c *clientConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what the cork holds and gives its buffer back.
func (c *clientConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.drainLocked()
}

// drainLocked writes what the cork holds and returns its buffer to the pool.
func (c *clientConn) drainLocked() error {
	err := c.flushLocked()
	if c.box != nil {
		*c.box = c.out[:0]
		corkPool.Put(c.box)
		c.box, c.out = nil, nil
	}
	return err
}

var corkPool = sync.Pool{New: func() any { b := make([]byte, 0, corkLimit); return &b }}
