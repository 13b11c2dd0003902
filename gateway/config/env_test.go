package config

import (
	"slices"
	"testing"
	"time"
)

func TestApplyEnv(t *testing.T) {
	c := Default()
	unknown, err := c.ApplyEnv([]string{
		"ACPGATE_LISTEN=127.0.0.1:9999",
		"ACPGATE_POOL_MAX_PROCESSES=3",
		"ACPGATE_SHUTDOWN_GRACE=7s",
		"ACPGATE_AGENT_COMMAND=node 'my agent.mjs' --flag",
		"ACPGATE_AUTH_ALLOWED_ORIGINS=https://a.example, https://b.example",
		"ACPGATE_ALLOW_UNAUTHENTICATED=true",
		"ACPGATE_OBSERVABILITY_TENANT_LABEL_LIMIT=5",
		"ACPGATE_NOT_A_SETTING=1",
		"OTHER=x",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9999" || c.Pool.MaxProcesses != 3 || c.ShutdownGrace.D() != 7*time.Second ||
		!slices.Equal(c.Agent.Command, []string{"node", "my agent.mjs", "--flag"}) ||
		!slices.Equal(c.Auth.AllowedOrigins, []string{"https://a.example", "https://b.example"}) ||
		!c.AllowUnauthenticated || c.Observability.TenantLabelLimit != 5 {
		t.Fatalf("settings not applied: %+v", c)
	}
	if !slices.Equal(unknown, []string{"ACPGATE_NOT_A_SETTING"}) {
		t.Fatalf("unknown = %v", unknown)
	}
	if _, err := Default().ApplyEnv([]string{"ACPGATE_POOL_MIN_IDLE=many", "ACPGATE_SHUTDOWN_GRACE=soon"}); err == nil {
		t.Fatal("bad values were accepted")
	}
	names := EnvNames()
	for _, want := range []string{"ACPGATE_LISTEN", "ACPGATE_POOL_ISOLATION", "ACPGATE_LIMITS_MAX_MESSAGE_BYTES", "ACPGATE_SESSION_KEY_FILE"} {
		if !slices.Contains(names, want) {
			t.Errorf("EnvNames lacks %s: %v", want, names)
		}
	}
}
