// Package supervise runs an agent so that none of its descendants outlive
// the gateway.
//
// The gateway starts "acpgate supervise -- AGENT ARGS..." as the leader of
// a new process group with a parent-death signal (SIGTERM). The supervisor
// makes itself a child subreaper, so every orphaned descendant of the agent
// is re-parented to it rather than to init, and starts the agent. When the
// agent exits, the supervisor kills whatever the agent left behind. When the
// supervisor is told to stop (SIGTERM/SIGINT/SIGHUP, including the one the
// kernel sends when the gateway dies, even by SIGKILL), it forwards SIGTERM
// to every descendant, waits up to the grace period, then SIGKILLs them all,
// reaps them and exits with the agent's status.
//
// When the gateway passes a sandbox spec (sandbox.EnvVar), the supervisor
// confines the thread that starts the agent before it does (see package
// sandbox) and refuses to start the agent if it cannot.
package supervise

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/acpgate/acpgate/proxy/sandbox"
)

const prSetChildSubreaper = 36

// Run supervises argv until it and every descendant have exited and returns
// the exit code to use (the agent's, or 128+signal). parentPID is the
// gateway's PID: if the supervisor's parent is already someone else, the
// gateway died before the parent-death signal was armed. (The gateway may
// itself be PID 1 in a container, so "parent is 1" proves nothing.)
func Run(argv []string, grace time.Duration, parentPID int) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "acpgate supervise: no command")
		return 2
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "acpgate supervise: PR_SET_CHILD_SUBREAPER: %v\n", errno)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if parentPID > 0 && os.Getppid() != parentPID {
		fmt.Fprintf(os.Stderr, "acpgate supervise: the gateway (pid %d) is gone; not starting the agent\n", parentPID)
		return 1
	}
	agent, code := startAgent(argv)
	if agent == nil {
		return code
	}
	// Nothing of the gateway's is needed any more; the agent has its copies.
	os.Stdin.Close()
	os.Stdout.Close()
	return wait(agent.Pid, sigs, grace)
}

// startAgent confines itself if the gateway asked for a sandbox, then
// starts the agent. On failure it returns nil and the exit code to use.
func startAgent(argv []string) (*os.Process, int) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "acpgate supervise: %v\n", err)
		return nil, 127
	}
	env := os.Environ()
	if v, ok := os.LookupEnv(sandbox.EnvVar); ok {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, sandbox.EnvVar+"=") })
		spec, err := sandbox.Decode(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "acpgate supervise: %v; not starting the agent\n", err)
			return nil, 126
		}
		// This goroutine's thread is confined and starts the agent; it is
		// never unlocked, so no other goroutine runs on it.
		runtime.LockOSThread()
		did, err := sandbox.Confine(spec)
		if err != nil {
			fmt.Fprintf(os.Stderr, "acpgate supervise: sandbox: %v; not starting the agent\n", err)
			return nil, 126
		}
		fmt.Fprintf(os.Stderr, "acpgate supervise: sandbox: %s\n", did)
	}
	agent, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "acpgate supervise: start %q: %v\n", argv[0], err)
		return nil, 127
	}
	return agent, 0
}

// wait reaps every child until none is left and returns the agent's exit
// code. When the agent exits its descendants are killed; a signal passes
// SIGTERM on to them, and SIGKILL after grace.
func wait(agentPID int, sigs <-chan os.Signal, grace time.Duration) int {
	type exit struct {
		pid    int
		status syscall.WaitStatus
	}
	exits := make(chan exit, 16)
	go func() { // reaps every child, including re-parented orphans
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil { // ECHILD: no children left
				close(exits)
				return
			}
			exits <- exit{pid, ws}
		}
	}()

	code := -1
	var deadline <-chan time.Time
	for {
		select {
		case e, ok := <-exits:
			if !ok {
				if code < 0 {
					code = 1
				}
				return code
			}
			if e.pid == agentPID {
				code = exitCode(e.status)
				// The agent is gone: whatever it left behind goes too.
				signalDescendants(syscall.SIGKILL)
			}
		case <-sigs:
			if deadline == nil {
				signalDescendants(syscall.SIGTERM)
				deadline = time.After(grace)
			}
		case <-deadline:
			signalDescendants(syscall.SIGKILL)
			deadline = nil
		}
	}
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// signalDescendants signals every process below this one, found by walking
// parent links in /proc.
func signalDescendants(sig syscall.Signal) {
	for _, pid := range descendants(os.Getpid()) {
		_ = syscall.Kill(pid, sig)
	}
}

func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads the parent PID from /proc/PID/stat ("pid (comm) state ppid ...";
// comm may contain spaces and parentheses, so parse after the last ')').
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}
