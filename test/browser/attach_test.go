//go:build unix

package browser

import "testing"

// TestBrowserAttach: several pages on one session (issue #22), the built-in
// demo agent without authentication (every client is the same subject, so
// each may attach). Page A starts a session and shares it; page B opens the
// link (attached, the history replayed, presence shown); a permission card
// A's agent asks for is answered in B and collapses in A; B prompts and A
// sees it; a page C opened with the read-only link cannot send, cancel or
// answer, and sees the card settled by A; B and C leave and A's session
// goes on.
func TestBrowserAttach(t *testing.T) {
	r := newRig(t)
	r.scenario(t, writeConfig(t, r.dir, ""), "attach", nil)
}

// TestBrowserAttachSpoofedClientID: an attached page knows itself by the
// clientId the gateway answered (issue #30 item 6). Another client attaches
// asking for the page's clientId, with its clientInfo: the page still shows
// that client's prompt and its answer to a permission request as another
// client's, and lists itself after that client detaches.
func TestBrowserAttachSpoofedClientID(t *testing.T) {
	r := newRig(t)
	r.scenario(t, writeConfig(t, r.dir, ""), "spoof", nil)
}

// TestBrowserPolicyDecision: the gateway's standing permission rules
// decide (issue #32): the page holding the session is never asked, and an
// attached page shows "allowed by the gateway's rule …" and "rejected by
// the gateway's rule …", naming the rule.
func TestBrowserPolicyDecision(t *testing.T) {
	r := newRig(t)
	r.scenario(t, writeConfig(t, r.dir, "permissions:\n  - {kind: execute, decide: allow}\n  - {kind: edit, title: \"Write *\", decide: deny}\n"), "policy", nil)
}
