package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hostOp is what _fake/host does on the host itself, without ACP: what a
// real agent's own tools (file edits, shell commands) do. The sandbox tests
// use it to try every escape.
type hostOp struct {
	Op     string   `json:"op"`     // read, write, list, env, status, pid, link, symlink, kill, exec, dial, abstract, alloc
	Path   string   `json:"path"`   // the file or directory (read, write, list, link, symlink), or an abstract socket name
	Target string   `json:"target"` // link and symlink: the new name
	Data   string   `json:"data"`   // write
	PID    int      `json:"pid"`    // kill: signal 0 to it
	Argv   []string `json:"argv"`   // exec
	MiB    int      `json:"mib"`    // alloc: allocate and touch this much
}

// hostResult is the answer: ok with data or entries, or the error text.
type hostResult struct {
	OK      bool     `json:"ok"`
	Data    string   `json:"data,omitempty"`
	Entries []string `json:"entries,omitempty"`
	Err     string   `json:"err,omitempty"`
}

var keep [][]byte // alloc keeps its memory

func doHost(params json.RawMessage) hostResult {
	var op hostOp
	if err := json.Unmarshal(params, &op); err != nil {
		return hostResult{Err: err.Error()}
	}
	fail := func(err error) hostResult { return hostResult{Err: err.Error()} }
	switch op.Op {
	case "read":
		b, err := os.ReadFile(op.Path)
		if err != nil {
			return fail(err)
		}
		return hostResult{OK: true, Data: string(b[:min(len(b), 64<<10)])}
	case "write":
		if err := os.WriteFile(op.Path, []byte(op.Data), 0o600); err != nil {
			return fail(err)
		}
		return hostResult{OK: true}
	case "list":
		es, err := os.ReadDir(op.Path)
		if err != nil {
			return fail(err)
		}
		r := hostResult{OK: true}
		for _, e := range es {
			r.Entries = append(r.Entries, e.Name())
		}
		return r
	case "env":
		return hostResult{OK: true, Entries: os.Environ()}
	case "status":
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return fail(err)
		}
		wd, _ := os.Getwd()
		r := hostResult{OK: true, Data: wd}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "Cap") || strings.HasPrefix(line, "NoNewPrivs") || strings.HasPrefix(line, "Uid") {
				r.Entries = append(r.Entries, strings.Join(strings.Fields(line), " "))
			}
		}
		return r
	case "link":
		if err := os.Link(op.Path, op.Target); err != nil {
			return fail(err)
		}
		return hostResult{OK: true}
	case "symlink": // make Target point at Path, then read through it
		if err := os.Symlink(op.Path, op.Target); err != nil {
			return fail(err)
		}
		b, err := os.ReadFile(op.Target)
		if err != nil {
			return fail(err)
		}
		return hostResult{OK: true, Data: string(b)}
	case "pid":
		return hostResult{OK: true, Data: strconv.Itoa(os.Getpid())}
	case "kill":
		if err := syscall.Kill(op.PID, 0); err != nil {
			return fail(err)
		}
		return hostResult{OK: true}
	case "exec":
		if len(op.Argv) == 0 {
			return hostResult{Err: "no argv"}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, op.Argv[0], op.Argv[1:]...).CombinedOutput()
		if err != nil {
			return hostResult{Data: string(out), Err: err.Error()}
		}
		return hostResult{OK: true, Data: string(out)}
	case "dial": // a TCP connection to Path (host:port)
		c, err := net.DialTimeout("tcp", op.Path, 2*time.Second)
		if err != nil {
			return fail(err)
		}
		c.Close()
		return hostResult{OK: true}
	case "abstract":
		c, err := net.DialTimeout("unix", "@"+op.Path, 2*time.Second)
		if err != nil {
			return fail(err)
		}
		c.Close()
		return hostResult{OK: true}
	case "alloc":
		for range min(op.MiB, 4096) {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		return hostResult{OK: true}
	}
	return hostResult{Err: "unknown op " + op.Op}
}
