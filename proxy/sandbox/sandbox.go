// Package sandbox confines an agent process: what it may read, write and
// execute (Landlock), which IPC it may reach (Landlock scopes), which
// privileges it keeps (none), and how much it may use (rlimits, a cgroup).
//
// The gateway decides a Spec per tenant and hands it to "acpgate
// supervise" in the environment variable EnvVar. The supervisor applies it
// to one locked OS thread with Confine and starts the agent from that
// thread, so the agent and everything it starts inherit the confinement,
// while the supervisor's other threads stay free to clean up after it.
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	llsyscall "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// EnvVar carries the Spec (JSON) from the gateway to the supervisor, which
// removes it before it starts the agent.
const EnvVar = "ACPGATE_SUPERVISE_SANDBOX"

// ForceNoLandlockEnv, set to 1 in the gateway's environment, makes Probe
// report that the kernel has no Landlock: the tests of what happens on
// such a kernel use it. It deliberately lacks the ACPGATE_ prefix, which
// names settings.
const ForceNoLandlockEnv = "_ACPGATE_TEST_NO_LANDLOCK"

// Spec is how one agent process is confined.
type Spec struct {
	// Landlock restricts the file system to ReadOnly and ReadWrite, and
	// IPC (abstract UNIX sockets, signals) to the agent's own domain.
	Landlock bool `json:"landlock,omitempty"`
	// ReadOnly may be read and executed; ReadWrite also written. Paths
	// that do not exist are skipped.
	ReadOnly  []string `json:"ro,omitempty"`
	ReadWrite []string `json:"rw,omitempty"`
	// Devices are character devices the agent may read and write
	// (/dev/null, /dev/tty); DevicesRO only read (/dev/urandom).
	Devices   []string `json:"dev,omitempty"`
	DevicesRO []string `json:"devro,omitempty"`
	// Net, when set, restricts TCP to these ports (Landlock ABI 4).
	Net *Net `json:"net,omitempty"`
	// Limits are rlimits; 0 leaves one as it is.
	Limits Limits `json:"limits"`
	// Cgroup is a cgroup v2 directory the supervisor moves itself into
	// before it starts the agent ("" = none).
	Cgroup string `json:"cgroup,omitempty"`
	// User, when set, is the account the agent runs as (the gateway runs
	// as root).
	User *User `json:"user,omitempty"`
}

// Net lists the TCP ports an agent may connect to and bind.
type Net struct {
	ConnectTCP []uint16 `json:"connect,omitempty"`
	BindTCP    []uint16 `json:"bind,omitempty"`
}

// Limits are resource limits set as rlimits.
type Limits struct {
	OpenFiles uint64 `json:"nofile,omitempty"`
	Processes uint64 `json:"nproc,omitempty"`
	// DataBytes caps the data segment (RLIMIT_DATA: heap and private
	// writable mappings), which V8's reservations do not count against.
	DataBytes uint64 `json:"data,omitempty"`
}

// User is a numeric account.
type User struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// Encode returns the spec as the value of EnvVar.
func (s *Spec) Encode() string {
	b, err := json.Marshal(s)
	if err != nil { // a struct of strings and numbers
		panic(err)
	}
	return string(b)
}

// Decode parses what Encode wrote.
func Decode(v string) (*Spec, error) {
	var s Spec
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return nil, fmt.Errorf("sandbox spec: %w", err)
	}
	return &s, nil
}

// SystemReadOnly are the directories and files a program needs to run:
// read and execute, nothing else. Missing ones are skipped.
var SystemReadOnly = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
	"/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
	"/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/etc/nsswitch.conf",
	"/etc/passwd", "/etc/group", "/etc/localtime", "/etc/timezone", "/etc/os-release", "/etc/mime.types",
	"/proc", "/sys",
}

// SystemDevices may be read and written; SystemDevicesRO only read.
var (
	SystemDevices   = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}
	SystemDevicesRO = []string{"/dev/random", "/dev/urandom"}
)

// Probe returns the Landlock ABI version the kernel offers, or an error
// saying why there is none.
func Probe() (int, error) {
	if os.Getenv(ForceNoLandlockEnv) == "1" {
		return 0, fmt.Errorf("forced off by %s=1", ForceNoLandlockEnv)
	}
	v, err := llsyscall.LandlockGetABIVersion()
	if err != nil {
		return 0, fmt.Errorf("the kernel offers no Landlock (%w): it needs Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= list", err)
	}
	if v < 1 {
		return 0, errors.New("the kernel offers no Landlock ABI")
	}
	return v, nil
}

// Features describes what Landlock ABI v restricts, for the log.
func Features(v int, net bool) string {
	if v < 1 {
		return "none"
	}
	f := []string{"files"}
	if v >= 2 {
		f = append(f, "refer")
	}
	if v >= 3 {
		f = append(f, "truncate")
	}
	if v >= 4 && net {
		f = append(f, "tcp")
	}
	if v >= 5 {
		f = append(f, "ioctl-dev")
	}
	if v >= 6 {
		f = append(f, "scope-abstract-unix", "scope-signal")
	}
	if v >= 9 {
		f = append(f, "resolve-unix")
	}
	return strings.Join(f, ",")
}

// Within reports whether path is dir or below it. Both must be clean and
// absolute.
func Within(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// Resolve returns path with symlinks resolved as far as it exists, so that
// a path and the file it reaches compare equal.
func Resolve(path string) string {
	path = filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	// Resolve the longest existing prefix.
	dir, base := filepath.Split(path)
	if dir == "" || dir == path || base == "" {
		return path
	}
	return filepath.Join(Resolve(filepath.Clean(dir)), base)
}

// capLastCap is the highest capability number the kernel knows.
func capLastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 40
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 40
	}
	return n
}
