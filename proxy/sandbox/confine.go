package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Confine applies spec to the calling OS thread, which the caller must
// have locked (runtime.LockOSThread) and must never unlock: a process the
// thread starts afterwards inherits the confinement. The cgroup and the
// rlimits apply to the whole process.
//
// The order matters: the cgroup is joined and the limits set while the
// thread still may; then every capability goes, the account changes if
// asked, no_new_privs is set, and Landlock comes last (it needs
// no_new_privs). It returns a line for the log saying what was applied.
func Confine(spec *Spec) (string, error) {
	var did []string
	if spec.Cgroup != "" {
		if err := os.WriteFile(filepath.Join(spec.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return "", fmt.Errorf("join cgroup %s: %w", spec.Cgroup, err)
		}
		did = append(did, "cgroup "+spec.Cgroup)
	}
	for _, l := range []struct {
		res  int
		name string
		v    uint64
	}{
		{unix.RLIMIT_NOFILE, "nofile", spec.Limits.OpenFiles},
		{unix.RLIMIT_NPROC, "nproc", spec.Limits.Processes},
		{unix.RLIMIT_DATA, "data", spec.Limits.DataBytes},
	} {
		if l.v == 0 {
			continue
		}
		if err := syscall.Setrlimit(l.res, &syscall.Rlimit{Cur: l.v, Max: l.v}); err != nil {
			return "", fmt.Errorf("set rlimit %s to %d: %w", l.name, l.v, err)
		}
		did = append(did, fmt.Sprintf("%s=%d", l.name, l.v))
	}
	// The ruleset is built while the thread may still open every path it
	// names (an agents' user may not be able to); it is enforced after the
	// privileges are gone.
	var rs *ruleset
	if spec.Landlock {
		var err error
		if rs, err = newRuleset(spec); err != nil {
			return "", err
		}
		defer syscall.Close(rs.fd)
	}
	if err := dropPrivileges(spec.User); err != nil {
		return "", err
	}
	if spec.User != nil {
		did = append(did, fmt.Sprintf("uid=%d gid=%d", spec.User.UID, spec.User.GID))
	}
	did = append(did, "no capabilities", "no_new_privs")
	if rs != nil {
		if err := llsyscall.LandlockRestrictSelf(rs.fd, rs.flags); err != nil {
			return "", fmt.Errorf("landlock restrict_self: %w", err)
		}
		did = append(did, fmt.Sprintf("landlock v%d (%s)", rs.abi, Features(rs.abi, spec.Net != nil)))
	}
	return strings.Join(did, ", "), nil
}

// ruleset is a Landlock ruleset built but not yet enforced.
type ruleset struct {
	fd    int
	flags uint32
	abi   int
}

// Linux capability and securebits constants not in x/sys/unix.
const (
	capSetPCap                  = 8
	secbitNoRoot                = 1 << 0
	secbitNoRootLocked          = 1 << 1
	secbitNoCapAmbientRaise     = 1 << 6
	secbitNoCapAmbientRaiseLock = 1 << 7
)

// dropPrivileges leaves the calling thread with no capability in any set
// (bounding, inheritable, ambient, permitted, effective), as user if one is
// given, and with no_new_privs, so that nothing it executes regains any.
// Every call is the raw, thread-local system call: Go's own Setuid and
// friends would change every thread of the supervisor.
func dropPrivileges(user *User) error {
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if data[0].Effective&(1<<capSetPCap) != 0 {
		// Root's file capabilities come from the bounding set on every
		// exec: empty it, and have the kernel stop treating uid 0 as
		// special.
		for c := 0; c <= capLastCap(); c++ {
			if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0, 0); e != 0 && e != syscall.EINVAL {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
			}
		}
		bits := uintptr(secbitNoRoot | secbitNoRootLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLock)
		if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_SECUREBITS, bits, 0, 0, 0, 0); e != 0 {
			return fmt.Errorf("set securebits: %w", e)
		}
	}
	if user != nil {
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			return fmt.Errorf("setgroups: %w", e)
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(user.GID), uintptr(user.GID), uintptr(user.GID)); e != 0 {
			return fmt.Errorf("setresgid %d: %w", user.GID, e)
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(user.UID), uintptr(user.UID), uintptr(user.UID)); e != 0 {
			return fmt.Errorf("setresuid %d: %w", user.UID, e)
		}
	}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 && e != syscall.EINVAL {
		return fmt.Errorf("clear ambient capabilities: %w", e)
	}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	// Nothing left to drop is not asked for: a seccomp filter may forbid
	// capset (systemd's ~@privileged does).
	if data != ([2]unix.CapUserData{}) {
		data = [2]unix.CapUserData{}
		if err := unix.Capset(&hdr, &data[0]); err != nil { // the calling thread only
			return fmt.Errorf("capset: %w", err)
		}
	}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("set no_new_privs: %w", e)
	}
	return nil
}

// newRuleset builds the Landlock part of spec with the best ABI the kernel
// offers.
func newRuleset(spec *Spec) (*ruleset, error) {
	abi, err := Probe()
	if err != nil {
		return nil, err
	}
	cfg := landlock.Config{HandledAccessFS: landlock.V11.HandledAccessFS, Scoped: landlock.V11.Scoped}
	rules := []landlock.Rule{}
	for _, p := range spec.ReadOnly {
		rules = append(rules, pathRule(p, false))
	}
	for _, p := range spec.ReadWrite {
		rules = append(rules, pathRule(p, true))
	}
	if len(spec.Devices) > 0 {
		rules = append(rules, landlock.RWFiles(spec.Devices...).IgnoreIfMissing())
	}
	if len(spec.DevicesRO) > 0 {
		rules = append(rules, landlock.ROFiles(spec.DevicesRO...).IgnoreIfMissing())
	}
	if n := spec.Net; n != nil {
		cfg.HandledAccessNet = landlock.V4.HandledAccessNet
		for _, p := range n.ConnectTCP {
			rules = append(rules, landlock.ConnectTCP(p))
		}
		for _, p := range n.BindTCP {
			rules = append(rules, landlock.BindTCP(p))
		}
	}
	fd, flags, err := cfg.BestEffort().NewRulesetFD(rules...)
	if err != nil {
		return nil, fmt.Errorf("landlock ruleset: %w", err)
	}
	if fd < 0 {
		return nil, errors.New("landlock: nothing could be enforced on this kernel")
	}
	return &ruleset{fd: fd, flags: flags, abi: abi}, nil
}

// pathRule grants a directory (or a file) read and execute, or everything
// but device ioctls. Writable trees also get refer (moving files between
// their directories) and resolve-unix (their own sockets).
func pathRule(p string, write bool) landlock.Rule {
	dir := true
	if st, err := os.Stat(p); err == nil && !st.IsDir() {
		dir = false
	}
	switch {
	case write && dir:
		return landlock.RWDirs(p).WithRefer().WithResolveUnix().IgnoreIfMissing()
	case write:
		return landlock.RWFiles(p).IgnoreIfMissing()
	case dir:
		return landlock.RODirs(p).IgnoreIfMissing()
	default:
		return landlock.ROFiles(p).IgnoreIfMissing()
	}
}
