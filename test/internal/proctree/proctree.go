// Package proctree reads the process tree from /proc for tests that check no
// agent process outlives the gateway (Linux only).
package proctree

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Descendants lists the live (non-zombie) processes below pid, with their
// command lines (arguments joined by spaces).
func Descendants(pid int) map[int]string {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, state, ok := Stat(p); ok && state != "Z" {
			children[pp] = append(children[pp], p)
		}
	}
	out := map[int]string{}
	queue := []int{pid}
	for len(queue) > 0 && len(out) < 10000 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c))
			out[c] = strings.ReplaceAll(string(cmd), "\x00", " ")
			queue = append(queue, c)
		}
	}
	return out
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
