// Package proctree reads the process tree from /proc for tests that check no
// agent process outlives the gateway (Linux only).
package proctree

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Proc is one process as /proc shows it.
type Proc struct {
	PID, PPID int
	State     string // "Z" for a zombie
	Cmd       string // the command line, arguments joined by spaces
}

// Table reads every process, zombies included.
func Table() map[int]Proc {
	out := map[int]Proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := Stat(pid)
		if !ok {
			continue
		}
		out[pid] = Proc{PID: pid, PPID: ppid, State: state, Cmd: Cmdline(pid)}
	}
	return out
}

// Subtree returns root's descendants in table, zombies included.
func Subtree(table map[int]Proc, root int) map[int]Proc {
	children := map[int][]int{}
	for _, p := range table {
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	out := map[int]Proc{}
	queue := []int{root}
	for len(queue) > 0 && len(out) < 100_000 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out[c] = table[c]
			queue = append(queue, c)
		}
	}
	return out
}

// Descendants lists the live (non-zombie) processes below pid, with their
// command lines.
func Descendants(pid int) map[int]string {
	out := map[int]string{}
	for c, p := range Subtree(Table(), pid) {
		if p.State != "Z" {
			out[c] = p.Cmd
		}
	}
	return out
}

// Cmdline is a process's command line, arguments joined by spaces ("" if
// it is gone).
func Cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// WithEnv lists the processes whose environment holds kv ("K=V") exactly.
func WithEnv(kv string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		for v := range strings.SplitSeq(string(b), "\x00") {
			if v == kv {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// Stat returns a process's parent and state from /proc/PID/stat. The
// command name may hold spaces and parentheses, so fields are read after
// the last ')'.
func Stat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	_, state, ok := Stat(pid)
	return ok && state != "Z"
}
