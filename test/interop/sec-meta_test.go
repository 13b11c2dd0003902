package interop

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/acpclient"
)

// TestClaudeCodeACPMetaExecutableArgs is finding 1 of the security review
// at 99b340a, run against the real claude-code-acp: a tenant's client
// sends session/new with _meta.claudeCode.options.executableArgs ["-e",
// <js>], which claude-code-acp spreads into its SDK's options, so that
// node runs the client's JavaScript in the agent, with the tenant's
// agent_env key. The script writes a marker file, with the key, into the
// tenant root. At 99b340a the marker appeared, holding the key. Now the
// gateway removes _meta.claudeCode (policy.meta.allow, default deny): the
// session/new must be answered (success or a clear error, never a hang)
// and no marker may appear.
func TestClaudeCodeACPMetaExecutableArgs(t *testing.T) {
	if _, err := sandbox.Probe(); err != nil {
		t.Skipf("skipped: agent_env needs the sandbox, and this kernel has no Landlock: %v", err)
	}
	node := requireNode(t, "@zed-industries/claude-code-acp/dist/index.js")
	modules, err := filepath.EvalSymlinks(filepath.Join(interopDir, "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(modules, "@zed-industries", "claude-code-acp", "dist", "index.js")
	h := newHarness(t)
	root := h.mkdir("tenant-root")
	home := h.mkdir("home-gateway")
	homes := filepath.Join(h.base, "homes")
	const secret = "ACME-SECRET-KEY-123"
	keyFile := filepath.Join(h.mkdir("creds"), "acme.key")
	if err := os.WriteFile(keyFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	token := "interop-" + hex.EncodeToString([]byte(h.mark))
	sum := sha256.Sum256([]byte(token))
	readOnly := []string{fmt.Sprintf("%q", modules)}
	if nodeDir, _ := filepath.EvalSymlinks(filepath.Dir(node)); !strings.HasPrefix(nodeDir, "/usr/") {
		readOnly = append(readOnly, fmt.Sprintf("%q", filepath.Dir(nodeDir))) // a node outside /usr, with its lib
	}
	// The default policy: nothing about _meta is configured.
	cfg := fmt.Sprintf(`sandbox: {mode: required, home: %q, read_only: [%s]}
agent:
  inherit_env: [PATH, LANG, %s, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, DISABLE_AUTOUPDATER]
pool: {isolation: tenant}
tenants:
  - name: acme
    root: %q
    tokens_sha256: [%q]
    agent_env:
      ANTHROPIC_API_KEY: {file: %q}
`, homes, strings.Join(readOnly, ", "), markEnv, root, hex.EncodeToString(sum[:]), keyFile)
	g := h.startGatewayWith(t, cfg, shellJoin(node, script), home, root)
	g.waitReady(t, readyLimit)

	c, resp, err := acpclient.DialClient(t, g.url(), http.Header{"Authorization": {"Bearer " + token}}, []string{"acp"})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	c.Initialize("interop", false)
	marker := filepath.Join(root, "pwned-meta.json")
	js := fmt.Sprintf("require('fs').writeFileSync(%q, JSON.stringify({key: process.env.ANTHROPIC_API_KEY, argv: process.argv.slice(0, 3)}))", marker)
	params, _ := json.Marshal(map[string]any{"cwd": root, "mcpServers": []any{},
		"_meta": map[string]any{"claudeCode": map[string]any{"options": map[string]any{"executableArgs": []string{"-e", js}}}}})
	c.SendRaw(`{"jsonrpc":"2.0","id":3,"method":"session/new","params":` + string(params) + `}`)

	// Until the answer (at most a minute: the SDK starts its CLI) and for
	// three seconds after it, the marker must not appear.
	ran := func() {
		t.Helper()
		if b, err := os.ReadFile(marker); err == nil {
			t.Fatalf("the client's code ran in the agent (key leaked: %v): %s", strings.Contains(string(b), secret), b)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	var answer acpclient.Msg
	for answer.ID == nil {
		ran()
		if time.Now().After(deadline) {
			t.Fatal("session/new with _meta.claudeCode was not answered within 60s")
		}
		select {
		case m, ok := <-c.In:
			if !ok {
				t.Fatalf("the connection ended: %v", c.Err())
			}
			if m.IsResponseTo(3) {
				answer = m
			}
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Logf("session/new answered: %.300s", answer.Raw)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ran()
	}
	if answer.Error != nil && answer.Error.Message == "" {
		t.Errorf("session/new failed without a message: %s", answer.Raw)
	}
	logs := strings.Join(g.logs.snapshot(), "\n")
	if strings.Contains(logs, secret) {
		t.Errorf("the tenant's key is in the gateway log")
	}
	g.stop(t)
}
