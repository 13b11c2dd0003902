package scale

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// faultProxy stands between the other replicas and one replica's cluster
// listener (that replica advertises the proxy). It passes everything
// through, until armed: then the first connection that carries bytes
// from a forwarder and answers them has that answer withheld and is reset
// (TCP RST) towards the forwarder, which thus sent its whole request, had
// it delivered, and saw the hop fail: the case where a forwarder that
// retries could have a message executed twice.
type faultProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	armed bool
	cuts  int
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	p := &faultProxy{ln: harness.Listen(t), target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go func() { // ends when the listener closes
		defer p.wg.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.serve(c) }()
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

// arm makes the proxy cut the next answered request.
func (p *faultProxy) arm() {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
}

// cutCount returns how many connections it cut, and disarms it.
func (p *faultProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	return p.cuts
}

func (p *faultProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on && p.conns == nil {
		return false // closed
	}
	if on {
		p.conns[c] = true
	} else if p.conns != nil {
		delete(p.conns, c)
	}
	return true
}

func (p *faultProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// reset closes c with an RST.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// serve pipes one forwarder's connection to the target and back.
func (p *faultProxy) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil { // the replica is gone: as if its port were closed
		reset(client)
		return
	}
	if !p.track(client, true) || !p.track(server, true) {
		reset(client)
		_ = server.Close()
		return
	}
	defer p.track(client, false)
	defer p.track(server, false)
	var (
		mu   sync.Mutex
		sent bool // the forwarder sent bytes while the proxy was armed
	)
	done := make(chan struct{})
	go func() { // forwarder -> replica; ends with either side
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				armed := p.armed
				p.mu.Unlock()
				if armed {
					mu.Lock()
					sent = true
					mu.Unlock()
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = server.Close()
	}()
	buf := make([]byte, 64<<10)
	for { // replica -> forwarder
		n, err := server.Read(buf)
		if n > 0 {
			mu.Lock()
			s := sent
			mu.Unlock()
			p.mu.Lock()
			// An answer (not a protocol's few-byte acknowledgement) to
			// what the forwarder sent while armed: withhold it, reset.
			cut := p.armed && s && n >= 32
			if cut {
				p.armed = false
				p.cuts++
			}
			p.mu.Unlock()
			if cut {
				reset(client)
				break
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = client.Close()
	_ = server.Close()
	<-done
}
