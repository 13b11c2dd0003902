//go:build unix

package browser

import (
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserAttach: several pages on one session (issue #22), the built-in
// demo agent without authentication (every client is the same subject, so
// each may attach). Page A starts a session and shares it; page B opens the
// link (attached, the history replayed, presence shown); a permission card
// A's agent asks for is answered in B and collapses in A; B prompts and A
// sees it; a page C opened with the read-only link cannot send, cancel or
// answer, and sees the card settled by A; B and C leave and A's session
// goes on.
func TestBrowserAttach(t *testing.T) {
	node := requirePrereqs(t)
	bin := binary(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "acpgate.yaml")
	harness.WriteFile(t, config, "listen: 127.0.0.1:0\nshutdown_grace: 2s\n", 0o644)
	env := []string{"ACPGATE_DEMO_STATE_DIR=" + filepath.Join(dir, "state")}

	log := &harness.SyncBuffer{}
	gw := startGateway(t, bin, config, env, log, "")
	defer gw.stop()
	runScript(t, node, "http://"+gw.Addr+"/", "attach", nil, nil, log)
	gw.stop()
	saveLog(t, "attach-gateway.log", log)
}
