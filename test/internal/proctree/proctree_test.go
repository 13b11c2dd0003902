package proctree

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestSubtreeFindsAChild(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), "PROCTREE_TEST_MARK=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	table := Table()
	if p, ok := table[os.Getpid()]; !ok || p.PPID != os.Getppid() {
		t.Fatalf("this process in the table: %+v, %v", p, ok)
	}
	sub := Subtree(table, os.Getpid())
	if p, ok := sub[cmd.Process.Pid]; !ok || p.State == "Z" || !strings.HasPrefix(p.Cmd, "sleep 30") {
		t.Fatalf("the child in the subtree: %+v, %v", p, ok)
	}
	if cmdline, ok := Descendants(os.Getpid())[cmd.Process.Pid]; !ok || !strings.HasPrefix(cmdline, "sleep") {
		t.Fatalf("Descendants: %q, %v", cmdline, ok)
	}
	if got := WithEnv("PROCTREE_TEST_MARK=1"); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Fatalf("WithEnv: %v, want [%d]", got, cmd.Process.Pid)
	}
}
