package browser

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserSubagent: the page (a v1 client) on a gateway whose agent is
// test/interop/v2-agent.mjs, on the official SDK's agentProtocolRouter (v1
// and v2 in one process). A plain prompt is an ordinary turn; "subagent"
// spawns a child session, which the page shows as a nested, collapsible
// transcript with its title, state and messages, under the gateway's
// sealed child ID (no attribute names the agent's own), over WebSocket and
// Streamable HTTP. It needs test/interop's node_modules (the SDK).
func TestBrowserSubagent(t *testing.T) {
	r := newRig(t)
	interop, err := filepath.Abs(filepath.Join("..", "interop"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(interop, "node_modules", "@agentclientprotocol", "sdk", "package.json")); err != nil {
		harness.Missing(t, "test/interop/node_modules has no @agentclientprotocol/sdk (npm ci in test/interop): "+err.Error(), requireEnv)
	}
	cwd := filepath.Join(r.dir, "work")
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	config := writeConfig(t, r.dir, fmt.Sprintf("agent:\n  command: [%q, %q]\n", r.node, filepath.Join(interop, "v2-agent.mjs")))
	r.scenario(t, config, "subagent", []string{"ACPGATE_CWD=" + cwd})
}
