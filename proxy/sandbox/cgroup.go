package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PrepareCgroup checks that parent is a cgroup v2 directory the gateway may
// create children in, and enables the memory and pids controllers for its
// children as far as limits need them.
func PrepareCgroup(parent string, memory, pids bool) error {
	ctrl, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("sandbox.cgroup %s is not a cgroup v2 directory: %w", parent, err)
	}
	have := strings.Fields(string(ctrl))
	var want []string
	if memory {
		want = append(want, "memory")
	}
	if pids {
		want = append(want, "pids")
	}
	for _, c := range want {
		if !slices.Contains(have, c) {
			return fmt.Errorf("sandbox.cgroup %s: the %s controller is not available there (cgroup.controllers: %q); delegate it to this cgroup", parent, c, strings.TrimSpace(string(ctrl)))
		}
	}
	sub, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("sandbox.cgroup %s: %w", parent, err)
	}
	for _, c := range want {
		if slices.Contains(strings.Fields(string(sub)), c) {
			continue
		}
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			return fmt.Errorf("sandbox.cgroup %s: enable the %s controller for agents: %w", parent, c, err)
		}
	}
	return nil
}

// Cgroup is one agent process's cgroup.
type Cgroup struct{ dir string }

// NewCgroup creates parent/name with the given limits (0 = none).
func NewCgroup(parent, name string, memory, pids int64) (*Cgroup, error) {
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	cg := &Cgroup{dir: dir}
	set := func(file, v string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			cg.Close()
			return fmt.Errorf("cgroup %s: set %s to %s: %w", dir, file, v, err)
		}
		return nil
	}
	if memory > 0 {
		if err := set("memory.max", strconv.FormatInt(memory, 10)); err != nil {
			return nil, err
		}
		// Swap would let an agent past its memory limit; not every kernel
		// has swap accounting, so a missing file is fine.
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			if err := set("memory.swap.max", "0"); err != nil {
				return nil, err
			}
		}
	}
	if pids > 0 {
		if err := set("pids.max", strconv.FormatInt(pids, 10)); err != nil {
			return nil, err
		}
	}
	return cg, nil
}

// Path is the cgroup's directory.
func (c *Cgroup) Path() string { return c.dir }

// Close removes the cgroup once its processes are gone and says which limit,
// if any, it enforced: "killed by the memory limit" (an OOM kill) or "hit
// the process limit".
func (c *Cgroup) Close() string {
	var why []string
	if n := eventCount(filepath.Join(c.dir, "memory.events"), "oom_kill"); n > 0 {
		why = append(why, fmt.Sprintf("killed by the memory limit (%d OOM kills)", n))
	}
	if n := eventCount(filepath.Join(c.dir, "pids.events"), "max"); n > 0 {
		why = append(why, fmt.Sprintf("hit the process limit %d times", n))
	}
	// The supervisor has reaped everything it started; a straggler may
	// still be leaving the cgroup.
	for i := 0; ; i++ {
		err := os.Remove(c.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) || i == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return strings.Join(why, "; ")
}

// eventCount reads one "key value" line of a cgroup events file.
func eventCount(file, key string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
