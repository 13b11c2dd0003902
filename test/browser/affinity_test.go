//go:build unix

package browser

import (
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserShareAffinity: a gateway behind a balancer that routes by a
// cookie (sessions.affinity_cookie, issue #22 item 8). The first page's
// requests carry the cookie, so the gateway gives it back in the
// initialize result; the page's share link carries it, and a page in a
// fresh browser (no cookie) that opens the link sets it before it
// connects: its upgrade carries it, so the gateway echoes it to that page
// too, and the page attaches.
func TestBrowserShareAffinity(t *testing.T) {
	node := requirePrereqs(t)
	bin := binary(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "acpgate.yaml")
	harness.WriteFile(t, config, "listen: 127.0.0.1:0\nshutdown_grace: 2s\nsessions:\n  affinity_cookie: ACPGATE_AFFINITY\n", 0o644)
	env := []string{"ACPGATE_DEMO_STATE_DIR=" + filepath.Join(dir, "state")}

	log := &harness.SyncBuffer{}
	gw := startGateway(t, bin, config, env, log, "")
	defer gw.stop()
	const cookie = "ACPGATE_AFFINITY=replica-2.pool:7~a|b+c/d="
	runScript(t, node, "http://"+gw.Addr+"/", "affinity", []string{"ACPGATE_AFFINITY=" + cookie}, nil, log)
	gw.stop()
	saveLog(t, "affinity-gateway.log", log)
}
