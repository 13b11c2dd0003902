package interop

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/proctree"
)

// TestClaudeCodeACPSandboxed runs the real claude-code-acp as a tenant's
// agent with the sandbox required: it must start, initialize and create a
// session through the gateway while confined to the tenant root, its
// private home and the read-only paths (its node_modules).
func TestClaudeCodeACPSandboxed(t *testing.T) {
	abi, err := sandbox.Probe()
	if err != nil {
		t.Skipf("skipped: this kernel has no Landlock, so agents cannot be confined here: %v", err)
	}
	node := requireNode(t, "ws/package.json", "@zed-industries/claude-code-acp/dist/index.js")
	modules, err := filepath.EvalSymlinks(filepath.Join(interopDir, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(modules, "@zed-industries", "claude-code-acp", "dist", "index.js")
	h := newHarness(t)
	root := h.mkdir("tenant-root")
	home := h.mkdir("home-gateway")
	homes := filepath.Join(h.base, "homes")
	token := "interop-" + hex.EncodeToString([]byte(h.mark))
	sum := sha256.Sum256([]byte(token))
	readOnly := []string{modules}
	if nodeDir, _ := filepath.EvalSymlinks(filepath.Dir(node)); !strings.HasPrefix(nodeDir, "/usr/") {
		readOnly = append(readOnly, filepath.Dir(nodeDir)) // a node outside /usr, with its lib
	}
	quoted := make([]string, len(readOnly))
	for i, p := range readOnly {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	cfg := allowAllPolicy + fmt.Sprintf(`sandbox: {mode: required, home: %q, read_only: [%s]}
agent:
  inherit_env: [PATH, LANG, %s, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, DISABLE_AUTOUPDATER]
tenants:
  - name: interop
    root: %q
    tokens_sha256: [%q]
`, homes, strings.Join(quoted, ", "), markEnv, root, hex.EncodeToString(sum[:]))
	g := h.startGatewayWith(t, cfg, shellJoin(node, script), home, root)
	g.waitReady(t, readyLimit)
	run := h.runNode(t, home, root, runLimit, "probe.mjs", "--cwd", root, "--token", token,
		"--linger", "1500", "--timeout", msString(scriptTimeout), g.url())
	logProbe(t, "sandboxed, through the gateway", run)
	if run.err != nil {
		t.Fatalf("probe.mjs through the gateway failed: %v\n%s", run.err, run.dump())
	}
	init := response(t, run, "initialize")
	if init.Error != nil {
		t.Fatalf("initialize failed under the sandbox: %s", init.raw)
	}
	sn := sessionNew(t, run)
	if sn.Error != nil {
		t.Fatalf("session/new failed under the sandbox: %s", sn.raw)
	}
	if sid, _ := sn.Result["sessionId"].(string); sid == "" {
		t.Fatalf("session/new without a sessionId: %s", sn.raw)
	}

	logs := strings.Join(g.logs.snapshot(), "\n")
	if want := fmt.Sprintf(`"sandbox":"landlock v%d"`, abi); !strings.Contains(logs, want) {
		t.Errorf("no agent start logged with %s:\n%s", want, logs)
	}
	// The agent process itself: confined, unprivileged, in its own home.
	found := false
	for pid, cmd := range proctree.Descendants(g.Cmd.Process.Pid) {
		if !strings.Contains(cmd, "claude-code-acp") || strings.Contains(cmd, "supervise") {
			continue
		}
		found = true
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // it may have started and ended a helper meanwhile
		}
		for _, want := range []string{"NoNewPrivs:\t1", "CapEff:\t0000000000000000"} {
			if !strings.Contains(string(st), want) {
				t.Errorf("agent pid %d (%s): status lacks %q", pid, cmd, want)
			}
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if !strings.Contains(string(env), "HOME="+filepath.Join(homes, "interop")+"\x00") {
			t.Errorf("agent pid %d: HOME is not its tenant's private home", pid)
		}
		if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); cwd != root {
			if r, _ := filepath.EvalSymlinks(root); cwd != r {
				t.Errorf("agent pid %d works in %q, want the tenant root %q", pid, cwd, root)
			}
		}
	}
	if !found {
		t.Errorf("no claude-code-acp process below the gateway")
	}
	g.stop(t)
}
