package pool

import "syscall"

// killGroup sends SIGKILL to a whole process group.
func killGroup(pgid int) error { return syscall.Kill(-pgid, syscall.SIGKILL) }
