package sandbox

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestSpecRoundTrip(t *testing.T) {
	in := &Spec{Landlock: true, ReadOnly: []string{"/usr"}, ReadWrite: []string{"/srv/t"}, Devices: []string{"/dev/null"},
		Net: &Net{ConnectTCP: []uint16{443}}, Limits: Limits{OpenFiles: 64, DataBytes: 1 << 30}, Cgroup: "/sys/fs/cgroup/a",
		User: &User{UID: 1000, GID: 1000}}
	out, err := Decode(in.Encode())
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, in)
	}
	if _, err := Decode("{"); err == nil {
		t.Fatal("a broken spec decoded")
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"/srv/a", "/srv/a", true}, {"/srv/a/b", "/srv/a", true}, {"/srv/ab", "/srv/a", false},
		{"/srv", "/srv/a", false}, {"/x", "/", true},
	} {
		if got := Within(c.path, c.dir); got != c.want {
			t.Errorf("Within(%q, %q) = %v", c.path, c.dir, got)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	realResolved, _ := filepath.EvalSymlinks(real)
	if got := Resolve(filepath.Join(link, "missing", "file")); got != filepath.Join(realResolved, "missing", "file") {
		t.Errorf("Resolve through a link to a missing file: %q", got)
	}
}

func TestFeatures(t *testing.T) {
	if got := Features(7, false); got != "files,refer,truncate,ioctl-dev,scope-abstract-unix,scope-signal" {
		t.Errorf("Features(7) = %q", got)
	}
	if got := Features(4, true); !strings.Contains(got, "tcp") {
		t.Errorf("Features(4, net) = %q", got)
	}
	if Features(0, true) != "none" {
		t.Error("Features(0)")
	}
}

func TestProbeForcedOff(t *testing.T) {
	t.Setenv(ForceNoLandlockEnv, "1")
	if _, err := Probe(); err == nil || !strings.Contains(err.Error(), ForceNoLandlockEnv) {
		t.Fatalf("Probe with %s=1: %v", ForceNoLandlockEnv, err)
	}
}

func TestCgroupFiles(t *testing.T) {
	// A plain directory stands in for cgroupfs: the files written are what
	// the kernel would get.
	parent := t.TempDir()
	cg, err := NewCgroup(parent, "agent-acme-1", 256<<20, 64)
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"memory.max": "268435456", "pids.max": "64"} {
		if b, err := os.ReadFile(filepath.Join(cg.Path(), file)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	if err := os.WriteFile(filepath.Join(cg.Path(), "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if why := cg.Close(); why != "killed by the memory limit (1 OOM kills)" {
		t.Errorf("Close() = %q", why)
	}
	if err := PrepareCgroup(parent, true, false); err == nil {
		t.Error("a directory without cgroup.controllers was taken for a cgroup")
	}
}

// The confinement itself runs in a child process (it cannot be undone):
// TestConfineChild is that child when SANDBOX_TEST_SPEC is set.
func TestConfine(t *testing.T) {
	if _, err := Probe(); err != nil {
		t.Skipf("skipped: no Landlock on this kernel: %v", err)
	}
	dir := t.TempDir()
	allowed, denied := filepath.Join(dir, "allowed"), filepath.Join(dir, "denied")
	for _, d := range []string{allowed, denied} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe, _ := os.Executable()
	spec := &Spec{Landlock: true, ReadOnly: append(append([]string(nil), SystemReadOnly...), exe), ReadWrite: []string{allowed},
		Devices: SystemDevices, Limits: Limits{OpenFiles: 100}}
	cmd := exec.Command(exe, "-test.run=^TestConfineChild$", "-test.v")
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_SPEC="+spec.Encode(), "SANDBOX_TEST_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestConfineChild")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func TestConfineChild(t *testing.T) {
	v := os.Getenv("SANDBOX_TEST_SPEC")
	if v == "" {
		t.Skip("run by TestConfine")
	}
	spec, err := Decode(v)
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("SANDBOX_TEST_DIR")
	runtime.LockOSThread() // never unlocked: the thread dies with the test
	did, err := Confine(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("applied: %s", did)
	// Checked from this thread: another thread is not confined.
	if err := os.WriteFile(filepath.Join(dir, "allowed", "g"), []byte("y"), 0o644); err != nil {
		t.Errorf("write in the allowed tree: %v", err)
	}
	if _, err := os.ReadFile(filepath.Join(dir, "denied", "f")); err == nil {
		t.Error("read outside the allowed trees succeeded")
	}
	st, _ := os.ReadFile("/proc/thread-self/status")
	want := []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1"}
	if os.Geteuid() == 0 { // root can and must empty the bounding set too
		want = append(want, "CapBnd:\t0000000000000000")
	}
	for _, want := range want {
		if !bytes.Contains(st, []byte(want)) {
			t.Errorf("thread status lacks %q", want)
		}
	}
	// A child started from this thread inherits all of it.
	out, err := exec.Command("/bin/cat", filepath.Join(dir, "denied", "f")).CombinedOutput()
	if err == nil {
		t.Errorf("a child read outside the allowed trees: %s", out)
	}
}
