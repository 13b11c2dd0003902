package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// The setup scenario: how long a client waits for a session.
//
//   - warm gateway: min_idle 1, an initialized agent waiting; each sample is
//     a new connection: dial, initialize, session/new.
//   - cold gateway: min_idle 0, a fresh gateway per sample; initialize
//     starts the agent (under acpgate supervise) and waits for it.
//   - direct warm: session/new on an initialized agent over stdio.
//   - direct cold: start the agent, initialize, session/new.

type setupPath struct {
	Path    string `json:"path"`
	Samples int    `json:"samples"`
	// Phases, each from sending its request to its answer. Connect is the
	// TCP connection and WebSocket upgrade (or the process start).
	Connect    dist     `json:"connect"`
	Initialize dist     `json:"initialize"`
	SessionNew dist     `json:"session_new"`
	Total      dist     `json:"total"` // connect/start → session/new answered
	Errors     []string `json:"errors,omitempty"`
}

type setupResult struct {
	Paths []*setupPath `json:"paths"`
}

func (r *setupResult) problems() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, p := range r.Paths {
		if len(p.Errors) > 0 {
			out = append(out, fmt.Sprintf("setup %s: %s", p.Path, strings.Join(p.Errors, "; ")))
		}
		if p.SessionNew.N != p.Samples || p.Samples == 0 {
			out = append(out, fmt.Sprintf("setup %s: %d of %d samples", p.Path, p.SessionNew.N, p.Samples))
		}
	}
	return out
}

type setupSample struct{ connect, init, newSess, total time.Duration }

type setupCollector struct {
	p                      *setupPath
	conn, init, sess, totl []time.Duration
}

func (c *setupCollector) add(s setupSample, err error) {
	if err != nil {
		if len(c.p.Errors) < 5 {
			c.p.Errors = append(c.p.Errors, err.Error())
		}
		return
	}
	c.conn, c.init = append(c.conn, s.connect), append(c.init, s.init)
	c.sess, c.totl = append(c.sess, s.newSess), append(c.totl, s.total)
}

func (c *setupCollector) done() *setupPath {
	c.p.Connect, c.p.Initialize = summarize(c.conn), summarize(c.init)
	c.p.SessionNew, c.p.Total = summarize(c.sess), summarize(c.totl)
	return c.p
}

// wsSession times one connection through to its first session.
func wsSession(url string) (setupSample, error) {
	var s setupSample
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	t, err := dialWS(ctx, url, []string{"acp"})
	if err != nil {
		return s, err
	}
	defer t.Close()
	stop := time.AfterFunc(60*time.Second, func() { t.Close() })
	defer stop.Stop()
	s.connect = time.Since(start)
	err = timeSession(&rpcClient{t: t}, start, &s)
	return s, err
}

func (h *harness) runSetup() (*setupResult, error) {
	res := &setupResult{}
	var errs []string

	// Warm gateway.
	warm := &setupCollector{p: &setupPath{Path: "gateway, warm pool (min_idle 1)", Samples: h.c.SetupWarm}}
	if gw, err := h.startGateway(gwConfig{minIdle: 1, maxProcs: 4, perProc: 32}, true); err != nil {
		errs = append(errs, err.Error())
	} else {
		fmt.Fprintf(h.log, "load: setup: %d sessions through a warm pool\n", h.c.SetupWarm)
		for range h.c.SetupWarm {
			warm.add(wsSession(gw.url))
			time.Sleep(2 * time.Millisecond) // the previous connection's close settles
		}
		gw.stop()
	}
	res.Paths = append(res.Paths, warm.done())

	// Cold gateway: a fresh one per sample.
	cold := &setupCollector{p: &setupPath{Path: "gateway, cold pool (min_idle 0)", Samples: h.c.SetupCold}}
	fmt.Fprintf(h.log, "load: setup: %d first sessions through a cold pool\n", h.c.SetupCold)
	for range h.c.SetupCold {
		gw, err := h.startGateway(gwConfig{minIdle: 0, maxProcs: 4, perProc: 32}, false)
		if err != nil {
			cold.add(setupSample{}, err)
			continue
		}
		cold.add(wsSession(gw.url))
		gw.stop()
	}
	res.Paths = append(res.Paths, cold.done())

	// Direct, warm: one initialized agent.
	dw := &setupCollector{p: &setupPath{Path: "direct, initialized agent", Samples: h.c.SetupDirect}}
	if a, err := startStdio([]string{h.exe, "agent"}); err != nil {
		errs = append(errs, err.Error())
	} else {
		c := &rpcClient{t: a}
		watchdog := time.AfterFunc(60*time.Second, func() { _ = a.cmd.Process.Kill() })
		defer watchdog.Stop()
		if err := c.initialize(); err != nil {
			errs = append(errs, err.Error())
		} else {
			for range h.c.SetupDirect {
				t := time.Now()
				_, err := c.newSession()
				d := time.Since(t)
				dw.add(setupSample{newSess: d, total: d}, err)
			}
		}
		a.Close()
	}
	res.Paths = append(res.Paths, dw.done())

	// Direct, cold: start, initialize, session/new.
	dc := &setupCollector{p: &setupPath{Path: "direct, agent started per session", Samples: h.c.SetupCold}}
	for range h.c.SetupCold {
		dc.add(directCold(h.exe))
	}
	res.Paths = append(res.Paths, dc.done())
	if len(errs) > 0 {
		return res, errors.New(strings.Join(errs, "; "))
	}
	return res, nil
}

// timeSession times initialize and session/new on a connected client and
// fills s (start is when connecting began), so that every path is timed
// the same way.
func timeSession(c *rpcClient, start time.Time, s *setupSample) error {
	t1 := time.Now()
	if err := c.initialize(); err != nil {
		return err
	}
	s.init = time.Since(t1)
	t2 := time.Now()
	if _, err := c.newSession(); err != nil {
		return err
	}
	s.newSess = time.Since(t2)
	s.total = time.Since(start)
	return nil
}

func directCold(exe string) (setupSample, error) {
	var s setupSample
	start := time.Now()
	a, err := startStdio([]string{exe, "agent"})
	if err != nil {
		return s, err
	}
	defer a.Close()
	stop := time.AfterFunc(60*time.Second, func() { _ = a.cmd.Process.Kill() })
	defer stop.Stop()
	s.connect = time.Since(start)
	err = timeSession(&rpcClient{t: a}, start, &s)
	return s, err
}

func (r *setupResult) print(w io.Writer) {
	fmt.Fprintf(w, "\nSETUP: time to a session (p50 / p99 of samples)\n")
	tw := newTable(w)
	fmt.Fprintln(tw, "path\tsamples\tconnect/start\tinitialize\tsession/new p50\tsession/new p99\ttotal p50\ttotal p99\t")
	for _, p := range r.Paths {
		con, ini := fmtUS(p.Connect.P50), fmtUS(p.Initialize.P50)
		if p.Connect.P50 == 0 {
			con, ini = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Path, p.SessionNew.N, con, ini,
			fmtUS(p.SessionNew.P50), fmtUS(p.SessionNew.P99), fmtUS(p.Total.P50), fmtUS(p.Total.P99))
	}
	tw.Flush()
}
