//go:build unix

package browser

import "testing"

// TestBrowserShareAffinity: a gateway behind a balancer that routes by a
// cookie (sessions.affinity_cookie, issue #22 item 8). The first page's
// requests carry the cookie, so the gateway gives it back in the
// initialize result; the page's share link carries it, and a page in a
// fresh browser (no cookie) that opens the link sets it before it
// connects: its upgrade carries it, so the gateway echoes it to that page
// too, and the page attaches. A link naming another cookie than the one
// the gateway names to its page sets nothing (issue #30 item 7).
func TestBrowserShareAffinity(t *testing.T) {
	r := newRig(t)
	// Every page the scenario opens stays a client of A's session (held for
	// a resume), more than the default 8.
	const cookie = "ACPGATE_AFFINITY=replica-2.pool:7~a|b+c/d="
	r.scenario(t, writeConfig(t, r.dir, "sessions:\n  affinity_cookie: ACPGATE_AFFINITY\n  max_clients: 32\n"), "affinity",
		[]string{"ACPGATE_AFFINITY=" + cookie})
}

// TestBrowserShareAffinityOff: a gateway without sessions.affinity_cookie
// names no cookie to its page, so a share link sets none, whatever cookie
// the link names (issue #30 item 7).
func TestBrowserShareAffinityOff(t *testing.T) {
	r := newRig(t)
	r.scenario(t, writeConfig(t, r.dir, ""), "affinity-off", nil)
}
