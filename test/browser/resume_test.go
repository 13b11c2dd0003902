//go:build unix

package browser

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserResume: the page keeps its conversation when the socket drops
// and the gateway kept the connection (sessions.detach_timeout, 5 minutes by
// default). A TCP proxy on 127.0.0.1 sits between the browser and the
// gateway; the page is loaded through it, so its WebSocket goes through it
// too. The script has the proxy cut every connection (both sides reset)
// during a streamed turn and while a permission request waits, and has it
// stop accepting for a while (the page retries until it is back). The page
// must resume (GET /acp?resume=…&received=…) instead of reloading the
// session, and show each chunk exactly once.
func TestBrowserResume(t *testing.T) {
	r := newRig(t)
	config := writeConfig(t, r.dir, "")
	gw := r.start(t, config, "")
	defer gw.stop()
	px := startCutProxy(t, gw.Addr)
	defer px.close()

	var actions []string
	r.runScript(t, "http://"+px.addr+"/", "resume", nil, func(action string) error {
		actions = append(actions, action)
		switch action {
		case "cut":
			n := px.cut()
			t.Logf("proxy: cut %d connections", n)
			if n == 0 {
				return errors.New("no connection to cut")
			}
		case "hold":
			n := px.hold()
			t.Logf("proxy: not accepting; cut %d connections", n)
		case "release":
			return px.release()
		default:
			return fmt.Errorf("unknown harness action %q", action)
		}
		return nil
	})
	px.close()
	gw.stop()
	r.saveLog(t, "resume-gateway.log")

	// Every WebSocket upgrade that went through the proxy.
	var plain, resumes int
	var tokens []string
	for _, target := range px.upgrades() {
		u, err := url.Parse(target)
		if err != nil {
			t.Errorf("upgrade target %q: %v", target, err)
			continue
		}
		q := u.Query()
		if tok := q.Get("resume"); tok != "" {
			resumes++
			tokens = append(tokens, tok)
			if q.Get("received") == "" {
				t.Errorf("a resume upgrade without received=")
			}
		} else {
			plain++
		}
		if q.Has("token") || strings.Contains(target, "bearer") {
			t.Errorf("an upgrade URL carries a credential")
		}
	}
	t.Logf("upgrades through the proxy: %d plain, %d resume", plain, resumes)
	if plain != 1 {
		t.Errorf("%d plain upgrades, want 1: a resume failed and the page connected anew", plain)
	}
	if resumes < 4 {
		t.Errorf("%d resume upgrades, want at least 4 (three cuts, a hold and a reload)", resumes)
	}
	for _, tok := range tokens {
		if strings.Contains(r.log.String(), tok) {
			t.Errorf("the gateway log contains a resume token")
			break
		}
	}
	if got, want := strings.Join(actions, ","), "cut,cut,cut,hold,release"; got != want {
		t.Errorf("harness actions %q, want %q", got, want)
	}
}

// cutProxy relays TCP connections from 127.0.0.1 to the gateway and can
// reset all of them at once, as a network failure would.
type cutProxy struct {
	t      *testing.T
	addr   string // where it listens (kept across hold/release)
	target string

	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]struct{}
	requests []string // the request target of each connection's first request
	closed   bool
	wg       sync.WaitGroup
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln := harness.Listen(t)
	p := &cutProxy{t: t, addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve(ln)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *cutProxy) relay(c net.Conn) {
	defer p.wg.Done()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	defer p.untrack(c, up)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	_, _ = io.Copy(up, &firstLine{r: c, p: p})
	up.Close()
	<-done
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *cutProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

// cut resets every relayed connection, on both sides (RST, no close frame).
func (p *cutProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
	return n
}

// hold stops accepting (connections are refused) and cuts every connection.
func (p *cutProxy) hold() int {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	return p.cut()
}

// release accepts again, on the same address.
func (p *cutProxy) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return errors.New("the proxy is not on hold")
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("listening again on %s: %v", p.addr, err)
	}
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
	return nil
}

func (p *cutProxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// upgrades returns the request targets of the WebSocket upgrades seen.
func (p *cutProxy) upgrades() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.requests {
		if strings.HasPrefix(r, "/acp?") || r == "/acp" {
			out = append(out, r)
		}
	}
	return out
}

// firstLine passes a connection's bytes through and records the target of
// its first HTTP request (a WebSocket upgrade has a connection of its own).
type firstLine struct {
	r    io.Reader
	p    *cutProxy
	buf  []byte
	done bool
}

func (f *firstLine) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if !f.done && n > 0 {
		f.buf = append(f.buf, b[:n]...)
		if i := bytes.Index(f.buf, []byte("\r\n")); i >= 0 || len(f.buf) > 8192 {
			f.done = true
			line, _, _ := bufio.NewReader(bytes.NewReader(f.buf)).ReadLine()
			if parts := strings.Fields(string(line)); len(parts) == 3 {
				f.p.mu.Lock()
				f.p.requests = append(f.p.requests, parts[1])
				f.p.mu.Unlock()
			}
			f.buf = nil
		}
	}
	return n, err
}
