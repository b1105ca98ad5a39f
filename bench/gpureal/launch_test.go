package gpureal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/cgroups"
)

// TestLauncherMountsAndUser: an MPS client stand-in runs as the client UID with NRI's
// bind mounts made in a mount namespace of its own: the MPS shm directory as its
// /dev/shm, the pipe directory read-only; the host's /dev/shm stays as it is.
func TestLauncherMountsAndUser(t *testing.T) {
	t.Parallel()
	h, self := rootCgroupsSelf(t, "/sys/fs/cgroup", "the launcher joins a cgroup, mounts and switches users")
	rel := fmt.Sprintf("understory-gpureal-launch-test-%d", os.Getpid())
	if _, err := h.Create(rel); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.RemoveEmpty(rel) })
	root := t.TempDir()
	shm, pipe := filepath.Join(root, "shm"), filepath.Join(root, "pipe")
	for _, d := range []string{shm, pipe} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil { // the umask aside
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shm, "server"), []byte("from the server"), 0o644); err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("understory-launch-test-%d", os.Getpid())
	t.Cleanup(func() { _ = os.Remove(filepath.Join("/dev/shm", marker)) })
	script := fmt.Sprintf(`id -u; cat /dev/shm/server; echo; echo client >/dev/shm/%s
if (echo x >%s/planted) 2>/dev/null; then echo pipe-rw; else echo pipe-ro; fi`, marker, pipe)
	var out, errOut bytes.Buffer
	cmd := launcherCommand(launchSpec{Role: "test", Self: self, CgroupRoot: "/sys/fs/cgroup", Cgroup: rel,
		UID: mpsClientUID, Mounts: []launchMount{{Source: shm, Destination: "/dev/shm"},
			{Source: pipe, Destination: pipe, ReadOnly: true}},
		Argv: []string{"/bin/sh", "-c", script}, Env: os.Environ()})
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("launcher: %v: %s", err, errOut.String())
	}
	want := fmt.Sprintf("%d\nfrom the server\npipe-ro\n", mpsClientUID)
	if out.String() != want {
		t.Fatalf("the stand-in saw %q, want %q (stderr %s)", out.String(), want, errOut.String())
	}
	if b, err := os.ReadFile(filepath.Join(shm, marker)); err != nil || strings.TrimSpace(string(b)) != "client" {
		t.Fatalf("the client's /dev/shm file is not in the shm directory: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", marker)); err == nil {
		t.Fatal("the client wrote to the host's /dev/shm")
	}
}

// TestLauncherRefusesMountsInTheHostNamespace: -mount without a mount namespace of the
// launcher's own fails before it mounts anything.
func TestLauncherRefusesMountsInTheHostNamespace(t *testing.T) {
	t.Parallel()
	if err := bindMounts([]launchMount{{Source: t.TempDir(), Destination: "/dev/shm"}}); err == nil ||
		!strings.Contains(err.Error(), "namespace") {
		t.Fatalf("bindMounts in the test's own namespace = %v", err)
	}
}

// rootCgroupsSelf skips t (what needs root) unless it runs as root with a usable cgroup
// filesystem at cgroupRoot, and returns the hierarchy and a copy of the test binary the
// MPS client UID may execute (go test's build directory is root's alone).
func rootCgroupsSelf(t *testing.T, cgroupRoot, what string) (*cgroups.Hierarchy, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(what + ": root only")
	}
	h, err := cgroups.Open(cgroupRoot)
	if err != nil {
		t.Skipf("no usable cgroup filesystem at %s: %v", cgroupRoot, err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return h, exposedCopy(t, self)
}

// exposedCopy copies the executable at path into a fresh directory every user may
// enter, executable by every user, and removes it when t ends.
func exposedCopy(t *testing.T, path string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpureal-dryrun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}
