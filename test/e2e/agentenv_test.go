package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// The agent credentials suite: tenants[].agent_env gives each tenant's
// sandboxed agent processes that tenant's own credential (acme's from a
// file, globex's from the gateway's environment), and nothing else shows
// it: not the other tenant's agents, the gateway's log, check-config, the
// admin API or the audit trail. A SIGHUP re-reads it: new sessions get
// the new value on fresh processes, running ones keep their process; a
// file that became a symbolic link, or went away, keeps the value read
// before.

const (
	credVar       = "ANTHROPIC_API_KEY"
	credSourceEnv = "GLOBEX_CRED_SOURCE" // globex's credential, in the gateway's environment only
	credAdminTok  = "agentenv-admin-token"
)

type credEnv struct {
	*isoEnv
	g        *gateway
	cfgPath  string
	trail    string
	acmeFile string
	// secrets are every credential value the test used, none of which
	// may show anywhere but in its own tenant's agents.
	secrets map[string]string // acme-1, acme-2, ..., globex
}

// startCreds runs a gateway whose tenants have agent_env.
func startCreds(t *testing.T) *credEnv {
	t.Helper()
	e := &credEnv{isoEnv: newIsoEnv(t), secrets: map[string]string{}}
	for _, k := range []string{"acme-1", "acme-2", "acme-3-via-link", "acme-4", "globex"} {
		e.secrets[k] = "sk-" + k + "-" + harness.RandomHex(t, 16)
	}
	e.acmeFile = filepath.Join(e.dir, "acme.credential")
	writeFile(t, e.acmeFile, []byte(e.secrets["acme-1"]+"\n"))
	e.tenantYAML = map[string]string{
		"acme":   fmt.Sprintf("    agent_env: {%s: {file: %q}}\n", credVar, e.acmeFile),
		"globex": fmt.Sprintf("    agent_env: {%s: {env: %s}}\n", credVar, credSourceEnv),
	}
	e.trail = filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := fakeAgentConfig(t, "") + e.config(e.keyFile, nil) + policyAllowFake +
		fmt.Sprintf("audit: {file: %q}\nobservability: {metrics_listen: 127.0.0.1:0}\nadmin:\n  tokens_sha256: [%q]\n", e.trail, hexSHA256(credAdminTok))
	e.g = startGateway(t, gwOpts{config: cfg, env: []string{credSourceEnv + "=" + e.secrets["globex"]}})
	e.cfgPath = e.g.Cmd.Args[slices.Index(e.g.Cmd.Args, "--config")+1]
	return e
}

// agentCred is what the agent process serving a session holds: the
// SHA-256 of its credential ("" when unset), the names of its environment
// and its pid. The agent never sends a value back: what the gateway
// relays and logs of its answers holds no secret.
type agentCred struct {
	sum   string
	names []string
	pid   int
}

func credOf(t *testing.T, c *client, sid string) agentCred {
	t.Helper()
	script := `printf 'pid %s\n' "$PPID"; env | cut -d= -f1 | sed 's/^/name /'; ` +
		`if [ -n "${` + credVar + `+x}" ]; then printf %s "$` + credVar + `" | sha256sum | sed 's/ .*//; s/^/sum /'; fi`
	a := host(t, c, map[string]any{"sessionId": sid, "op": "exec", "argv": []string{"/bin/sh", "-c", script}})
	if !a.OK {
		t.Fatalf("the agent's shell: %s %s", a.Err, a.Data)
	}
	var r agentCred
	for _, line := range strings.Split(a.Data, "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "pid":
			r.pid, _ = strconv.Atoi(v)
		case "name":
			r.names = append(r.names, v)
		case "sum":
			r.sum = v
		}
	}
	if r.pid == 0 {
		t.Fatalf("no pid in %q", a.Data)
	}
	return r
}

// wantCred fails unless the agent holds the credential named (a key of
// e.secrets).
func (e *credEnv) wantCred(t *testing.T, who string, got agentCred, want string) {
	t.Helper()
	if got.sum != hexSHA256(e.secrets[want]) {
		for k, v := range e.secrets {
			if got.sum == hexSHA256(v) {
				t.Errorf("%s: the agent holds credential %s, want %s", who, k, want)
				return
			}
		}
		t.Errorf("%s: the agent's %s is not credential %s (sum %q; environment %v)", who, credVar, want, got.sum, got.names)
	}
}

// sighup reloads the configuration and waits for the reload's log record.
func (e *credEnv) sighup(t *testing.T) {
	t.Helper()
	n := e.g.CountLogs("configuration reloaded", "", "")
	if err := e.g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	e.g.waitMoreLogs(t, "configuration reloaded", n, 20*time.Second)
}

// checkConfig runs check-config on the running configuration, in the
// gateway's environment.
func (e *credEnv) checkConfig(t *testing.T) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "check-config", "--config", e.cfgPath)
	cmd.Env = append(gatewayEnv(), credSourceEnv+"="+e.secrets["globex"]) // as serve's
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// noSecrets fails if any credential value shows in what.
func (e *credEnv) noSecrets(t *testing.T, where, what string) {
	t.Helper()
	for k, v := range e.secrets {
		if strings.Contains(what, v) {
			t.Errorf("credential %s shows in %s", k, where)
		}
	}
}

// adminAnswers are the admin API's lists, as sent.
func (e *credEnv) adminAnswers(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	for _, path := range []string{"/v1/admin/connections", "/v1/admin/sessions"} {
		var body json.RawMessage
		if code := adminDo(t, "GET", "http://"+e.g.MetricsAddr()+path, credAdminTok, &body); code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		all.Write(body)
	}
	return all.String()
}

// TestAgentEnvTenants: each tenant's agents get its own credential and
// not the other's, nor the gateway's variable globex's comes from; a
// tenant's agent cannot read another's credential file; check-config
// lists the credentials by name and source; no value shows in the
// gateway's log, check-config's output, the admin API or the audit trail.
func TestAgentEnvTenants(t *testing.T) {
	e := startCreds(t)
	g := e.g
	clients, sids, creds := map[string]*client{}, map[string]string{}, map[string]agentCred{}
	for _, name := range tenantNames {
		c := dialToken(t, g, e.tokens[name])
		clients[name], sids[name] = c, c.newSession(vroot)
		creds[name] = credOf(t, c, sids[name])
	}
	e.wantCred(t, "acme", creds["acme"], "acme-1")
	e.wantCred(t, "globex", creds["globex"], "globex")
	if creds["acme"].pid == creds["globex"].pid {
		t.Fatalf("both tenants' sessions on agent process %d", creds["acme"].pid)
	}
	for name, c := range creds {
		if slices.Contains(c.names, credSourceEnv) {
			t.Errorf("%s's agent sees the gateway's %s", name, credSourceEnv)
		}
		if n := strings.Count(strings.Join(c.names, "\n")+"\n", credVar+"\n"); n != 1 {
			t.Errorf("%s's agent has %s %d times", name, credVar, n)
		}
	}
	if _, err := sandbox.Probe(); err == nil {
		if a := host(t, clients["globex"], map[string]any{"sessionId": sids["globex"], "op": "read", "path": e.acmeFile}); a.OK {
			t.Error("globex's agent read acme's credential file")
		}
	}

	out, err := e.checkConfig(t)
	if err != nil {
		t.Fatalf("check-config: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("%s from file %s: readable", credVar, e.acmeFile),
		fmt.Sprintf("%s from the gateway's environment variable %s", credVar, credSourceEnv),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config's output lacks %q:\n%s", want, out)
		}
	}
	e.noSecrets(t, "check-config's output", out)
	e.noSecrets(t, "the admin API's answers", e.adminAnswers(t))
	for _, c := range clients {
		c.Close()
	}
	g.Stop(syscall.SIGTERM)
	e.noSecrets(t, "the gateway's log", g.LogText())
	e.noSecrets(t, "the audit trail", string(mustRead(t, e.trail)))
}

// TestAgentEnvReload: a SIGHUP after acme's credential file changed
// retires acme's processes: a running session keeps its process and the
// old value, a new session gets a fresh process with the new one, and
// globex's process stays. The file replaced by a symbolic link, then
// removed, is refused at the next reloads (logged, check-config fails)
// and acme's agents keep the value read before; restored, it is read
// again. No value shows in any log, output or answer.
func TestAgentEnvReload(t *testing.T) {
	e := startCreds(t)
	g := e.g
	dialAcme := func() (*client, string) {
		c := dialToken(t, g, e.tokens["acme"])
		return c, c.newSession(vroot)
	}
	old, oldSID := dialAcme()
	before := credOf(t, old, oldSID)
	e.wantCred(t, "acme before the reload", before, "acme-1")
	gx := dialToken(t, g, e.tokens["globex"])
	gxSID := gx.newSession(vroot)
	gxBefore := credOf(t, gx, gxSID)

	// Rotated.
	writeFile(t, e.acmeFile, []byte(e.secrets["acme-2"]+"\n"))
	changed := g.CountLogs("agent credentials changed: the tenant's agent processes are replaced; running sessions finish on the old ones", "tenant", "acme")
	e.sighup(t)
	if n := g.CountLogs("agent credentials changed: the tenant's agent processes are replaced; running sessions finish on the old ones", "tenant", "acme"); n != changed+1 {
		t.Errorf("%d logs of acme's credentials changing after the SIGHUP, want %d", n, changed+1)
	}
	running := credOf(t, old, oldSID)
	e.wantCred(t, "acme's running session", running, "acme-1")
	if running.pid != before.pid {
		t.Errorf("the running session moved from agent process %d to %d", before.pid, running.pid)
	}
	fresh, freshSID := dialAcme()
	now := credOf(t, fresh, freshSID)
	e.wantCred(t, "acme's new session", now, "acme-2")
	if now.pid == before.pid {
		t.Errorf("the new session is on the retired process %d", now.pid)
	}
	if gxNow := credOf(t, gx, gxSID); gxNow.pid != gxBefore.pid {
		t.Errorf("globex's session moved from agent process %d to %d", gxBefore.pid, gxNow.pid)
	}
	fresh.Close()

	// Hostile: the file replaced by a symbolic link to another value.
	link := filepath.Join(e.dir, "elsewhere")
	writeFile(t, link, []byte(e.secrets["acme-3-via-link"]+"\n"))
	if err := os.Remove(e.acmeFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(link, e.acmeFile); err != nil {
		t.Fatal(err)
	}
	kept := g.CountLogs("agent credential not re-read; the tenant's agents keep the value read before", "tenant", "acme")
	e.sighup(t)
	if n := g.CountLogs("agent credential not re-read; the tenant's agents keep the value read before", "tenant", "acme"); n != kept+1 ||
		!strings.Contains(g.LogText(), "is a symbolic link; refused") {
		t.Errorf("the symbolic link is not logged as refused (%d records)", n-kept)
	}
	c3, sid3 := dialAcme()
	e.wantCred(t, "acme after the symbolic link", credOf(t, c3, sid3), "acme-2")
	c3.Close()

	// Unreadable: the file gone.
	if err := os.Remove(e.acmeFile); err != nil {
		t.Fatal(err)
	}
	e.sighup(t)
	if n := g.CountLogs("agent credential not re-read; the tenant's agents keep the value read before", "tenant", "acme"); n != kept+2 {
		t.Errorf("the missing file is not logged (%d records)", n-kept)
	}
	c4, sid4 := dialAcme()
	e.wantCred(t, "acme with its file gone", credOf(t, c4, sid4), "acme-2")
	c4.Close()
	out, err := e.checkConfig(t)
	if err == nil || !strings.Contains(out, credVar+" from file "+e.acmeFile+": CANNOT BE READ") {
		t.Errorf("check-config with the file gone: %v\n%s", err, out)
	}
	e.noSecrets(t, "check-config's output", out)

	// Restored: read again.
	writeFile(t, e.acmeFile, []byte(e.secrets["acme-4"]+"\n"))
	e.sighup(t)
	c5, sid5 := dialAcme()
	e.wantCred(t, "acme restored", credOf(t, c5, sid5), "acme-4")
	e.noSecrets(t, "the admin API's answers", e.adminAnswers(t))
	c5.Close()
	old.Close()
	gx.Close()
	g.Stop(syscall.SIGTERM)

	e.noSecrets(t, "the gateway's log", g.LogText())
	trail := string(mustRead(t, e.trail))
	e.noSecrets(t, "the audit trail", trail)
	var changes []string
	for _, r := range readTrail(t, e.trail) {
		if r.Event == "config.reloaded" {
			changes = append(changes, fmt.Sprint(r.Fields["agent_env_changed"]))
		}
	}
	if want := []string{"[acme]", "<nil>", "<nil>", "[acme]"}; !slices.Equal(changes, want) {
		t.Errorf("config.reloaded agent_env_changed: %v, want %v", changes, want)
	}
}
