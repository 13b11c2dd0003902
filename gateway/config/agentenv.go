package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/internal/redact"
)

// AgentEnvSource is where one of a tenant's agent credentials comes from
// (tenants[].agent_env): a file, read without following a symbolic link
// and with one trailing newline trimmed, or a variable of the gateway's own
// environment. Exactly one of the two is set.
//
// Only the source is configuration; the value is read by ReadValue and
// must never reach a log, an error, the audit trail or any output.
type AgentEnvSource struct {
	// File is a file holding the value.
	File string `yaml:"file"`
	// Env names a variable of the gateway's own environment holding it.
	Env string `yaml:"env"`
}

// String names the source, never its value.
func (s AgentEnvSource) String() string {
	if s.File != "" {
		return "file " + s.File
	}
	return "the gateway's environment variable " + s.Env
}

// maxAgentEnvBytes bounds one credential file.
const maxAgentEnvBytes = 64 << 10

// ReadValue reads the credential. Its errors name the source and why, never
// what was read: a file that is a symbolic link (O_NOFOLLOW), not a
// regular file, over 64 KiB, empty, holding a NUL byte or a value shorter
// than redact.MinLen (which the logs could not be kept free of) is
// refused, as is an unset or empty environment variable.
func (s AgentEnvSource) ReadValue() (string, error) {
	var v string
	if s.File == "" {
		var ok bool
		if v, ok = os.LookupEnv(s.Env); !ok {
			return "", fmt.Errorf("%s is not set", s)
		}
	} else {
		b, err := readSecretFile(s.File)
		if err != nil {
			return "", err
		}
		b = bytes.TrimSuffix(b, []byte("\n"))
		v = string(bytes.TrimSuffix(b, []byte("\r")))
	}
	switch {
	case v == "":
		return "", fmt.Errorf("%s is empty", s)
	case strings.IndexByte(v, 0) >= 0:
		return "", fmt.Errorf("%s holds a NUL byte, which no environment variable can", s)
	case len(v) < redact.MinLen:
		return "", fmt.Errorf("%s holds a value shorter than %d bytes, too short to be told from ordinary text and "+
			"redacted from the logs; refused", s, redact.MinLen)
	}
	return v, nil
}

// readSecretFile reads a regular file that is not a symbolic link. Opening
// with O_NONBLOCK keeps a FIFO put in its place from blocking the reader.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("file %s is a symbolic link; refused (name the file itself)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("agent credential: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("agent credential: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("file %s is not a regular file; refused", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAgentEnvBytes+1))
	if err != nil {
		return nil, fmt.Errorf("agent credential: read %s: %w", path, err)
	}
	if len(b) > maxAgentEnvBytes {
		return nil, fmt.Errorf("file %s is over %d bytes; refused", path, maxAgentEnvBytes)
	}
	return b, nil
}

// validEnvName reports whether k can name an environment variable (the
// rule of agent.env and agent.inherit_env).
func validEnvName(k string) bool { return k != "" && !strings.ContainsAny(k, "=\x00") }

// reservedAgentEnv reports why the gateway keeps a variable name to itself
// for agents, or "": HOME and TMPDIR (the sandbox's private home), the
// tracing resource attributes that name the tenant, and ACPGATE_* (among
// them the supervisor's sandbox spec).
func reservedAgentEnv(k string) string {
	switch {
	case k == "HOME" || k == "TMPDIR":
		return "the sandbox sets it to the tenant's private home"
	case k == "OTEL_RESOURCE_ATTRIBUTES":
		return "the gateway sets it to name the agent and tenant in traces"
	case strings.HasPrefix(k, EnvPrefix):
		return "ACPGATE_* variables are the gateway's own"
	}
	return ""
}

// validateAgentEnv checks tenants[i].agent_env: valid names the gateway
// does not set itself, one absolute file or one environment variable each,
// tenant isolation on every agent the tenant may use, and the sandbox on
// (with it off, every agent gets the gateway's whole environment and can
// read whatever the gateway's user can, other tenants' credentials
// included).
func (c *Config) validateAgentEnv(i int, at nodeAt, item func(i int, key string) *yaml.Node) {
	t := &c.Tenants[i]
	if len(t.AgentEnv) == 0 {
		return
	}
	n := item(i, "agent_env")
	where := fmt.Sprintf("tenants[%d].agent_env", i)
	for _, k := range slices.Sorted(maps.Keys(t.AgentEnv)) {
		src := t.AgentEnv[k]
		switch {
		case !validEnvName(k):
			at(n, "%s: %q is not a valid environment variable name", where, k)
		case reservedAgentEnv(k) != "":
			at(n, "%s: %s is set by the gateway for every agent (%s)", where, k, reservedAgentEnv(k))
		}
		switch {
		case (src.File == "") == (src.Env == ""):
			at(n, "%s.%s: give exactly one of file: PATH or env: NAME", where, k)
		case src.File != "" && !filepath.IsAbs(src.File):
			at(n, "%s.%s: file %q must be an absolute path", where, k, src.File)
		case src.Env != "" && !validEnvName(src.Env):
			at(n, "%s.%s: env %q is not a valid environment variable name", where, k, src.Env)
		}
		for _, a := range c.AgentList() {
			if src.Env != "" && slices.Contains(a.InheritEnv, src.Env) {
				at(n, "%s.%s: env %s is in agent %q's inherit_env, so every tenant's agents would get it", where, k, src.Env, a.Name)
			}
		}
	}
	for _, a := range c.AgentList() {
		if t.MayUse(a.Name) && a.Pool.Isolation != "tenant" {
			at(n, "%s: needs pool.isolation: tenant, and agent %q has isolation: %s, where tenants share agent processes "+
				"(one tenant's credentials would reach another's sessions)", where, a.Name, a.Pool.Isolation)
		}
	}
	if c.SandboxMode() == "off" {
		at(n, "%s: needs the sandbox (sandbox.mode auto or required): with sandbox.mode: off every agent gets the gateway's "+
			"whole environment and every file its user can read, other tenants' credentials included", where)
	}
}

// HasAgentEnv reports whether any tenant has agent credentials
// (tenants[].agent_env).
func (c *Config) HasAgentEnv() bool {
	for i := range c.Tenants {
		if len(c.Tenants[i].AgentEnv) > 0 {
			return true
		}
	}
	return false
}

// agentEnvFiles lists the tenants' credential files, for exposedSecrets.
func (c *Config) agentEnvFiles() (keys, files []string) {
	for i := range c.Tenants {
		t := &c.Tenants[i]
		for _, k := range slices.Sorted(maps.Keys(t.AgentEnv)) {
			if f := t.AgentEnv[k].File; f != "" {
				keys = append(keys, fmt.Sprintf("tenants[%d].agent_env.%s", i, k))
				files = append(files, f)
			}
		}
	}
	return keys, files
}
