package browser

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/test/internal/harness"
)

// TestBrowserBudget: a tenant with a 2 USD budget a day, on test/fakeagent
// (whose "spend" prompt reports a rising cost). The turn that crosses the
// cap is stopped by the gateway and the page says so, naming the budget;
// the next prompt is refused and the page shows the refusal as what it is
// (the cap, what was spent, when it resets), not a generic error.
func TestBrowserBudget(t *testing.T) {
	r := newRig(t)
	fake := filepath.Join(r.dir, "fakeagent")
	if err := harness.BuildFakeAgent(fake); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(r.dir, "t1")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	const good = "budget-token"
	sum := sha256.Sum256([]byte(good))
	config := writeConfig(t, r.dir, fmt.Sprintf(`agent:
  command: [%q]
tenants:
  - name: t1
    tokens_sha256: [%q]
    root: %q
    virtual_root: /workspace
    budget: {period: day, cost: {USD: 2}}
`, fake, hex.EncodeToString(sum[:]), root))
	r.scenario(t, config, "budget", []string{"ACPGATE_GOOD_TOKEN=" + good})
}
