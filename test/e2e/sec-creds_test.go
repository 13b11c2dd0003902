package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acpgate/acpgate/internal/syncbuf"
	"github.com/acpgate/acpgate/proxy/sandbox"
	"github.com/acpgate/acpgate/test/internal/harness"
)

// Issue #36, findings 2 and 7: a tenant's agent credentials (agent_env)
// stay in that tenant on every host where the gateway starts, and out of
// every line the gateway writes.

// credsApartMissing is what serve and check-config say when agent_env is
// configured on a host without Landlock.
const credsApartMissing = "tenants[].agent_env needs Landlock to keep one tenant's agents from reading another's credentials"

// runCmd runs the binary with args and env to its end (20 s at most).
func runCmd(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCredsRefusedWithoutLandlock (finding 2): on a host without Landlock
// (forced by the probe's test switch) every tenant's agents run as one
// user and could read each other's /proc/<pid>/environ, so with agent_env
// the gateway refuses to start in sandbox.mode auto and says what is
// missing; check-config says the same. Without agent_env it still starts.
// A SIGHUP that adds agent_env there is refused and the running
// configuration stays.
func TestCredsRefusedWithoutLandlock(t *testing.T) {
	force := sandbox.ForceNoLandlockEnv + "=1"
	secret := "sk-nolandlock-" + harness.RandomHex(t, 16)
	e := newIsoEnv(t)
	credFile := filepath.Join(e.dir, "acme.credential")
	writeFile(t, credFile, []byte(secret+"\n"))
	withCreds := map[string]string{"acme": fmt.Sprintf("    agent_env: {%s: {file: %q}}\n", credVar, credFile)}
	homes := fmt.Sprintf("sandbox: {home: %q}\n", filepath.Join(e.dir, "homes"))
	writeCfg := func(tenantYAML map[string]string) string {
		e.tenantYAML = tenantYAML
		path := filepath.Join(t.TempDir(), "acpgate.yaml")
		writeFile(t, path, []byte(fakeAgentConfig(t, "")+e.config(e.keyFile, nil)+homes+policyAllowFake))
		return path
	}

	t.Run("agent_env without Landlock refuses to start", func(t *testing.T) {
		path := writeCfg(withCreds)
		out, err := runCmd(t, append(gatewayEnv(), force), "serve", "--listen", "127.0.0.1:0", "--config", path)
		if err == nil {
			t.Fatalf("the gateway started with agent_env and no Landlock:\n%s", out)
		}
		if !strings.Contains(out, credsApartMissing) || !strings.Contains(out, "forced off by "+sandbox.ForceNoLandlockEnv) {
			t.Errorf("the refusal does not name the missing condition:\n%s", out)
		}
		if strings.Contains(out, secret) {
			t.Errorf("the refusal shows the credential")
		}
		out, err = runCmd(t, append(gatewayEnv(), force), "check-config", "--config", path)
		if err == nil {
			t.Errorf("check-config passed agent_env on a host without Landlock:\n%s", out)
		}
		if !strings.Contains(out, "agent_env: REFUSED on this host") || !strings.Contains(out, credsApartMissing) {
			t.Errorf("check-config does not say agent_env is refused here:\n%s", out)
		}
	})

	t.Run("agent_env with Landlock: check-config names it", func(t *testing.T) {
		abi := requireLandlock(t)
		out, err := runCmd(t, gatewayEnv(), "check-config", "--config", writeCfg(withCreds))
		if err != nil {
			t.Fatalf("check-config: %v\n%s", err, out)
		}
		want := fmt.Sprintf("agent_env: tenants' credentials are kept apart by Landlock ABI %d on this host", abi)
		if !strings.Contains(out, want) {
			t.Errorf("check-config lacks %q:\n%s", want, out)
		}
	})

	t.Run("no agent_env without Landlock starts in auto; a reload adding agent_env is refused", func(t *testing.T) {
		path := writeCfg(nil)
		out, err := runCmd(t, append(gatewayEnv(), force), "check-config", "--config", path)
		if err != nil {
			t.Fatalf("check-config without agent_env: %v\n%s", err, out)
		}
		if !strings.Contains(out, "NO Landlock") || strings.Contains(out, "agent_env:") {
			t.Errorf("check-config without agent_env:\n%s", out)
		}
		g := startGateway(t, gwOpts{config: string(mustRead(t, path)), env: []string{force}})
		g.WaitLog(t, "agents run WITHOUT Landlock", "", "", 5*time.Second)
		cfgPath := g.Cmd.Args[len(g.Cmd.Args)-1]
		e.tenantYAML = withCreds
		writeFile(t, cfgPath, []byte(fakeAgentConfig(t, "")+e.config(e.keyFile, nil)+homes+policyAllowFake))
		if err := g.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		g.WaitLog(t, "configuration reload refused; keeping the running configuration", "", "", 20*time.Second)
		if log := g.LogText(); !strings.Contains(log, credsApartMissing) {
			t.Errorf("the refused reload does not say why")
		}
		if n := g.CountLogs("configuration reloaded", "", ""); n != 0 {
			t.Errorf("the reload adding agent_env was applied (%d)", n)
		}
		// The running configuration stays: acme's agent has no credential.
		c := dialToken(t, g, e.tokens["acme"])
		sid := c.newSession(vroot)
		if got := credOf(t, c, sid); got.sum != "" {
			t.Errorf("acme's agent got a credential after the refused reload")
		}
	})
}

// TestCredsApartByAccount (finding 2, the other way): without Landlock,
// a gateway running as root with an account of its own for every tenant
// (tenants[].sandbox.user) starts with agent_env, and one tenant's agent
// scanning every /proc/<pid>/environ finds its own credential only; two
// tenants with one account are refused.
func TestCredsApartByAccount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: tenants[].sandbox.user needs the gateway to run as root")
	}
	force := sandbox.ForceNoLandlockEnv + "=1"
	uids := map[string]int{"acme": 61001, "globex": 61002}
	secrets := map[string]string{"acme": "sk-acct-acme-" + harness.RandomHex(t, 16), "globex": "sk-acct-globex-" + harness.RandomHex(t, 16)}
	e := newIsoEnv(t)
	state := t.TempDir()
	for _, d := range []string{filepath.Dir(e.dir), e.dir, state, filepath.Dir(fakeAgentBin(t))} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	credFile := filepath.Join(e.dir, "acme.credential")
	writeFile(t, credFile, []byte(secrets["acme"]+"\n"))
	tenantYAML := func(acmeUID, globexUID int) map[string]string {
		return map[string]string{
			"acme":   fmt.Sprintf("    agent_env: {%s: {file: %q}}\n    sandbox: {user: \"%d:%d\"}\n", credVar, credFile, acmeUID, acmeUID),
			"globex": fmt.Sprintf("    agent_env: {%s: {env: %s}}\n    sandbox: {user: \"%d:%d\"}\n", credVar, credSourceEnv, globexUID, globexUID),
		}
	}
	for name, uid := range uids {
		if err := os.Chown(e.roots[name], uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{force, credSourceEnv + "=" + secrets["globex"]}

	t.Run("one account for two tenants is refused", func(t *testing.T) {
		e.tenantYAML = tenantYAML(uids["acme"], uids["acme"])
		path := filepath.Join(t.TempDir(), "acpgate.yaml")
		writeFile(t, path, []byte(fakeAgentConfig(t, "")+e.config(e.keyFile, nil)+policyAllowFake))
		out, err := runCmd(t, append(gatewayEnv(), env...), "serve", "--listen", "127.0.0.1:0", "--config", path)
		if err == nil || !strings.Contains(out, fmt.Sprintf("uid %d is also tenant \"acme\"'s", uids["acme"])) {
			t.Errorf("serve with one account for two tenants: %v\n%s", err, out)
		}
	})

	e.tenantYAML = tenantYAML(uids["acme"], uids["globex"])
	cfg := fakeAgentConfig(t, "") + e.config(e.keyFile, nil) + policyAllowFake
	g := startGateway(t, gwOpts{stateDir: state, config: cfg, env: env})
	g.WaitLog(t, "agents run WITHOUT Landlock", "", "", 5*time.Second)
	out, err := runCmd(t, append(gatewayEnv(), env...), "check-config", "--config", g.Cmd.Args[len(g.Cmd.Args)-1])
	if err != nil || !strings.Contains(out, "agent_env: tenants' credentials are kept apart by one account per tenant") {
		t.Errorf("check-config: %v\n%s", err, out)
	}
	gc := dialToken(t, g, e.tokens["globex"])
	gsid := gc.newSession(vroot)
	if got := credOf(t, gc, gsid); got.sum != hexSHA256(secrets["globex"]) {
		t.Fatalf("globex's agent lacks its credential")
	}
	ac := dialToken(t, g, e.tokens["acme"])
	asid := ac.newSession(vroot)
	scan := `for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null | grep "^` + credVar + `=" | sed "s|^|$f |"; done`
	a := host(t, ac, map[string]any{"sessionId": asid, "op": "exec", "argv": []string{"/bin/sh", "-c", scan}})
	if strings.Contains(a.Data, secrets["globex"]) {
		t.Errorf("acme's agent read globex's credential:\n%s", a.Data)
	}
	if !strings.Contains(a.Data, secrets["acme"]) { // the scan works: it finds acme's own
		t.Errorf("the scan did not find acme's own credential (%s):\n%s", a.Err, a.Data)
	}
}

// credLogAgent is a shell agent that writes its credential to stderr in
// several forms, among them lines cut by the gateway's 512- and 2048-byte
// bounds right inside the value, and exits before it initializes.
const credLogAgent = `k="$` + credVar + `"
echo "invalid x-api-key $k" >&2
printf '{"error":{"message":"bad key","key":"%s"}}\n' "$k" >&2
printf 'Authorization: Bearer %s, again: %s.\n' "$k" "$k" >&2
printf '%500s%s tail\n' '' "$k" >&2
printf '%2040s%s tail\n' '' "$k" >&2
exit 3`

// TestCredsNeverLogged (finding 7): an agent that prints its tenant's
// credential to stderr, in many forms, then dies: the gateway's whole log
// at debug level, as JSON and as text, and the audit trail hold no
// credential; the lines are there with [REDACTED] in its place.
func TestCredsNeverLogged(t *testing.T) {
	requireLandlock(t)
	secrets := map[string]string{
		"acme":   "sk-acme-" + harness.RandomHex(t, 16),
		"globex": "sk-globex-" + harness.RandomHex(t, 16),
	}
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			e := newIsoEnv(t)
			credFile := filepath.Join(e.dir, "acme.credential")
			writeFile(t, credFile, []byte(secrets["acme"]+"\n"))
			e.tenantYAML = map[string]string{
				"acme":   fmt.Sprintf("    agent_env: {%s: {file: %q}}\n", credVar, credFile),
				"globex": fmt.Sprintf("    agent_env: {%s: {env: %s}}\n", credVar, credSourceEnv),
			}
			trail := filepath.Join(e.dir, "audit.jsonl")
			cfg := fmt.Sprintf("agent: {command: [/bin/sh, -c, %q], stop_grace: 1s}\n", credLogAgent) +
				strings.Replace(e.config(e.keyFile, nil), "min_idle: 1", "min_idle: 2", 1) + fmt.Sprintf("sandbox: {home: %q}\naudit: {file: %q}\n", filepath.Join(e.dir, "homes"), trail)
			path := filepath.Join(e.dir, "acpgate.yaml")
			writeFile(t, path, []byte(cfg))

			var log syncbuf.Buffer
			cmd := exec.Command(binPath, "serve", "--listen", "127.0.0.1:0", "--config", path,
				"--log-format", format, "--log-level", "debug")
			cmd.Env = append(gatewayEnv(), credSourceEnv+"="+secrets["globex"])
			cmd.Stdout, cmd.Stderr = &log, &log
			cmd.WaitDelay = 5 * time.Second // for an agent still holding the log's pipe
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }() // ends when the gateway exits: below, by SIGTERM or SIGKILL
			defer func() {
				select {
				case <-done:
				default:
					_ = cmd.Process.Kill()
					<-done
				}
			}()
			// Both tenants' warm agents die, again and again, each one's
			// tail logged; then the gateway stops.
			exited := func() int {
				text := log.String()
				for _, tenant := range []string{"acme", "globex"} {
					if !strings.Contains(text, `"tenant":"`+tenant+`"`) && !strings.Contains(text, "tenant="+tenant) {
						return 0
					}
				}
				return strings.Count(text, "agent exited")
			}
			deadline := time.Now().Add(30 * time.Second)
			for exited() < 6 {
				if time.Now().After(deadline) {
					t.Fatalf("agents' exits not logged within 30 s (%d):\n%s", exited(), log.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Error("the gateway did not stop within 20 s of SIGTERM")
			}
			text := log.String()
			audit, err := os.ReadFile(trail)
			if err != nil {
				t.Fatal(err)
			}
			for who, v := range secrets {
				for _, part := range []string{v, v[:len(v)-4], v[4:]} {
					if strings.Contains(text, part) {
						t.Errorf("%s's credential (or part of it) is in the gateway's %s log", who, format)
					}
					if strings.Contains(string(audit), part) {
						t.Errorf("%s's credential (or part of it) is in the audit trail", who)
					}
				}
			}
			for _, want := range []string{"invalid x-api-key [REDACTED]", "Bearer [REDACTED], again: [REDACTED].", "[REDACTED] tail"} {
				if !strings.Contains(text, want) {
					t.Errorf("the %s log lacks %q", format, want)
				}
			}
			if !strings.Contains(text, "stderr_tail") || !strings.Contains(text, "agent stderr") {
				t.Errorf("the %s log lacks the stderr lines (agent stderr, stderr_tail)", format)
			}
			if t.Failed() {
				t.Logf("gateway log (%s):\n%s", format, text)
			}
		})
	}
}
