package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acpgate/acpgate/gateway/config"
)

// A reload that fails at any step of its prepare, the last included,
// applies nothing: not the authenticator's tenants, the relay's, the admin
// tokens, the added agent nor the configuration. The same reload without
// the failure applies all of them.
func TestReloadFailingAtAnyStepAppliesNothing(t *testing.T) {
	ts := startServer(t, withAdmin(t, withAgents(t, "a", "a")))
	defer ts.shutdown()
	ts.waitReady()
	cur := ts.s.config()

	next := *cur
	next.Agents = cloneAgents(cur)
	c := *next.Agents["a"]
	next.Agents["c"] = &c
	next.Tenants = append([]config.Tenant(nil), cur.Tenants...)
	next.Tenants[0].MaxSessions = 1
	tok2 := sha256.Sum256([]byte("tok2"))
	next.Tenants = append(next.Tenants, config.Tenant{Name: "beta", TokensSHA256: []string{hex.EncodeToString(tok2[:])}, Root: t.TempDir()})
	admin2 := sha256.Sum256([]byte("admintok2"))
	next.Admin.TokensSHA256 = []string{hex.EncodeToString(admin2[:])}

	status := func(path, token string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ts.addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := ts.http.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	if len(reloadSteps) < 2 {
		t.Fatalf("%d prepare steps", len(reloadSteps))
	}
	injected := errors.New("injected")
	for _, step := range reloadSteps {
		ts.s.reloadFault = func(name string) error {
			if name == step.name {
				return injected
			}
			return nil
		}
		if err := ts.s.Reload(&next); !errors.Is(err, injected) {
			t.Fatalf("failing after step %q: Reload returned %v", step.name, err)
		}
		if ts.s.config() != cur {
			t.Errorf("after step %q: the configuration was swapped", step.name)
		}
		if code := status("/v1/agents", "tok2"); code != http.StatusUnauthorized {
			t.Errorf("after step %q: the new tenant's token: %d, want 401", step.name, code)
		}
		if code := status("/v1/admin/sessions", "admintok2"); code != http.StatusUnauthorized {
			t.Errorf("after step %q: the new admin token: %d, want 401", step.name, code)
		}
		if code := status("/v1/admin/sessions", "admintok"); code != http.StatusOK {
			t.Errorf("after step %q: the running admin token: %d, want 200", step.name, code)
		}
		if ts.s.relay.AgentPool("c") != nil {
			t.Errorf("after step %q: agent c was added", step.name)
		}
	}
	waitMetrics(t, ts, "every refused reload counted",
		`acpgate_config_reloads_total{result="failure"} `+strconv.Itoa(len(reloadSteps)))
	// The relay's tenants are as they were: acme's max_sessions is unset.
	ws := ts.dial(Subprotocol, "acp.bearer.tok")
	ws.initialize()
	newSession := func() rpcMsg {
		return ws.call("session/new", map[string]any{"cwd": cur.Tenants[0].Root, "mcpServers": []any{}})
	}
	for i := range 2 {
		if res := newSession(); res.Error != nil {
			t.Fatalf("session %d after the refused reloads: %d %s", i+1, res.Error.Code, res.Error.Message)
		}
	}

	ts.s.reloadFault = nil
	if err := ts.s.Reload(&next); err != nil {
		t.Fatalf("the reload without a failure: %v", err)
	}
	if ts.s.config() != &next {
		t.Error("the configuration was not swapped")
	}
	if code := status("/v1/agents", "tok2"); code != http.StatusOK {
		t.Errorf("the new tenant's token after the reload: %d", code)
	}
	if code := status("/v1/admin/sessions", "admintok2"); code != http.StatusOK {
		t.Errorf("the new admin token after the reload: %d", code)
	}
	if ts.s.relay.AgentPool("c") == nil {
		t.Error("agent c was not added")
	}
	if res := newSession(); res.Error == nil || !strings.Contains(strings.ToLower(res.Error.Message), "session") {
		t.Errorf("a third session with max_sessions 1: %+v", res)
	}
}
