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

// cluster: is off unless set; a variable for one of its keys turns it on,
// as a Kubernetes Deployment names each pod's replica from the downward
// API, and over a file's block a variable sets its key.
func TestApplyEnvCluster(t *testing.T) {
	c := Default()
	if _, err := c.ApplyEnv([]string{"ACPGATE_POOL_MIN_IDLE=2"}); err != nil || c.Cluster != nil {
		t.Fatalf("no cluster variable: cluster %+v, err %v; want none", c.Cluster, err)
	}
	unknown, err := c.ApplyEnv([]string{"ACPGATE_CLUSTER_NAME=acpgate-1", "ACPGATE_CLUSTER_ADVERTISE=http://10.0.0.7:7001"})
	if err != nil || len(unknown) > 0 || c.Cluster == nil || c.Cluster.Name != "acpgate-1" || c.Cluster.Advertise != "http://10.0.0.7:7001" {
		t.Fatalf("cluster %+v, unknown %v, err %v", c.Cluster, unknown, err)
	}
	if _, err := c.ApplyEnv([]string{"ACPGATE_CLUSTER_LEASE=3s"}); err != nil || c.Cluster.Lease.D() != 3*time.Second || c.Cluster.Name != "acpgate-1" {
		t.Fatalf("over the block: %+v, err %v", c.Cluster, err)
	}
	names := EnvNames()
	for _, want := range []string{"ACPGATE_CLUSTER_NAME", "ACPGATE_CLUSTER_STORE", "ACPGATE_CLUSTER_LISTEN", "ACPGATE_CLUSTER_ADVERTISE",
		"ACPGATE_CLUSTER_KEY_FILE", "ACPGATE_CLUSTER_LEASE"} {
		if !slices.Contains(names, want) {
			t.Errorf("EnvNames lacks %s", want)
		}
	}
	if Default().Cluster != nil {
		t.Fatal("EnvNames turned the default's cluster on")
	}
}
