package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/acpgate/acpgate/gateway/config"
)

// agentCreds holds each tenant's agent credentials (tenants[].agent_env):
// read at start and again on every reload, given by the launcher to that
// tenant's agent processes only, through their environment. A value is
// never logged, put in an error or written anywhere else: only names and
// sources are.
type agentCreds struct {
	log *slog.Logger

	mu      sync.Mutex
	vals    map[string]map[string]string // tenant → variable → value
	retired map[string]bool              // values a reload replaced: agents started before it may still hold them
}

// newAgentCreds reads cfg's credentials; any that cannot be read is an
// error (there is no older value to keep).
func newAgentCreds(cfg *config.Config, log *slog.Logger) (*agentCreds, error) {
	c := &agentCreds{log: log, vals: map[string]map[string]string{}}
	next, _, err := c.read(cfg)
	if err != nil {
		return nil, err
	}
	c.vals = next
	return c, nil
}

// read reads cfg's credentials over the ones held. A variable that cannot
// be read keeps the value it had, which is logged (its name, source and
// why); one with no value yet is an error. changed lists the tenants
// whose values differ from those held (given, changed or taken away), in
// configured order.
func (c *agentCreds) read(cfg *config.Config) (next map[string]map[string]string, changed []string, err error) {
	c.mu.Lock()
	cur := c.vals
	c.mu.Unlock()
	next = map[string]map[string]string{}
	var errs []error
	for i := range cfg.Tenants {
		t := &cfg.Tenants[i]
		if len(t.AgentEnv) == 0 {
			continue
		}
		vals := map[string]string{}
		for _, k := range slices.Sorted(maps.Keys(t.AgentEnv)) {
			v, rerr := t.AgentEnv[k].ReadValue()
			if rerr == nil {
				vals[k] = v
				continue
			}
			old, ok := cur[t.Name][k]
			if !ok {
				errs = append(errs, fmt.Errorf("tenant %q agent_env %s: %w", t.Name, k, rerr))
				continue
			}
			vals[k] = old
			c.log.Error("agent credential not re-read; the tenant's agents keep the value read before",
				"tenant", t.Name, "name", k, "err", rerr)
		}
		next[t.Name] = vals
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	for i := range cfg.Tenants { // a removed tenant's processes go with it
		if name := cfg.Tenants[i].Name; !maps.Equal(next[name], cur[name]) {
			changed = append(changed, name)
		}
	}
	return next, changed, nil
}

// set makes next the credentials agents start with from now on.
func (c *agentCreds) set(next map[string]map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, vars := range c.vals {
		for k, v := range vars {
			if next[t][k] != v {
				if c.retired == nil {
					c.retired = map[string]bool{}
				}
				c.retired[v] = true
			}
		}
	}
	c.vals = next
}

// of returns a copy of tenant's credentials (nil: none).
func (c *agentCreds) of(tenant string) map[string]string {
	if c == nil || tenant == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.vals[tenant])
}

// all returns a copy of every tenant's credentials, and under "(retired)"
// every value a reload replaced: a process started before still holds it
// in its environment, so the redactor must know it for the gateway's life.
func (c *agentCreds) all() map[string]map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[string]string, len(c.vals)+1)
	for t, v := range c.vals {
		out[t] = maps.Clone(v)
	}
	if len(c.retired) > 0 {
		r := make(map[string]string, len(c.retired))
		for v := range c.retired {
			r[strconv.Itoa(len(r))] = v
		}
		out["(retired)"] = r
	}
	return out
}

// mergeCreds is every value of a and b, under tenant names that keep both
// apart where they differ (for the redactor, which only needs the values).
func mergeCreds(a, b map[string]map[string]string) map[string]map[string]string {
	out := make(map[string]map[string]string, len(a)+len(b))
	for t, v := range a {
		out[t+" (before the reload)"] = v
	}
	maps.Copy(out, b)
	return out
}
