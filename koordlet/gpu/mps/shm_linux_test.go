package mps

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunDaemonPrivateShm: mode run starts the control daemon with the shm directory as
// its /dev/shm, and its servers (children forked after -d returned) too, so that they
// share memory with clients that get the same directory as /dev/shm; the host's
// /dev/shm sees none of it. The shm directory is the client UID's alone.
func TestRunDaemonPrivateShm(t *testing.T) {
	t.Parallel()
	needRoot(t)
	f := newFake(t, ModeRun)
	f.cfg.ClientUID = 4321
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	marker := "understory-mps-test-" + hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(f.root, "shm-marker"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	hostMarker := filepath.Join(HostShm, marker)
	t.Cleanup(func() { _ = os.Remove(hostMarker); _ = os.Remove(hostMarker + ".server") })

	r := start(t, f.cfg)
	waitFor(t, "ready", r.d.Ready)
	shm := f.cfg.ShmDirectory
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(shm, name))
		return strings.TrimSpace(string(b))
	}
	if got := read(marker); got != "control" {
		t.Fatalf("the daemon's /dev/shm/%s in the shm directory = %q, want \"control\" (log:\n%s)", marker, got,
			r.log.String())
	}
	// A server forked by the daemon after -d exited writes there too.
	if err := os.WriteFile(filepath.Join(f.root, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server's marker in the shm directory", func() bool { return read(marker+".server") == "server" })
	for _, p := range []string{hostMarker, hostMarker + ".server"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the host's /dev/shm got %s (%v)", p, err)
		}
	}
	fi, err := os.Lstat(shm)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || fi.Mode().Perm() != 0o700 || st.Uid != 4321 {
		t.Fatalf("shm directory %v uid %d; want a 0700 directory of uid 4321", fi.Mode(), st.Uid)
	}
	r.shutdown(t)
	if n := f.count(t, "quit"); n != 1 {
		t.Fatalf("%d quit calls, want 1", n)
	}
}

// TestPrepareShmDirRefusesALink: a link planted at the shm directory is refused, not
// followed.
func TestPrepareShmDirRefusesALink(t *testing.T) {
	t.Parallel()
	needRoot(t)
	root := t.TempDir()
	dir := filepath.Join(root, "shm")
	if err := os.Symlink(HostShm, dir); err != nil {
		t.Fatal(err)
	}
	if err := prepareShmDir(dir, DefaultClientUID); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("prepareShmDir(link) = %v", err)
	}
}

// TestStartWithPrivateShmRefusesBadArgs: the hidden entry checks what it mounts before
// it mounts anything.
func TestStartWithPrivateShmRefusesBadArgs(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		nil,
		{"/run/x", HostShm},
		{"relative", HostShm, "true"},
		{HostShm, HostShm, "true"},
		{"/nonexistent-understory-shm", HostShm, "true"},
	} {
		if err := StartWithPrivateShm(args); !errors.Is(err, ErrPrivateShm) {
			t.Errorf("StartWithPrivateShm(%q) = %v, want ErrPrivateShm", args, err)
		}
	}
}
