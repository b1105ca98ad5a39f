//go:build linux

package devices

import (
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/understory/understory/internal/testenv"
)

// TestReadOnlyPipeMountConnects checks, on this machine's kernel, what an MPS client
// gets from the read-only bind mount of the pipe directory: in a private mount
// namespace with the directory bound read-only over itself (what the runtime does with
// the plugin's "bind,ro" mount), connect(2) to the daemon's listening socket works,
// while removing it, creating a file and binding a socket of its own there fail with
// EROFS. Needs root (CAP_SYS_ADMIN); skipped otherwise (failed in CI).
func TestReadOnlyPipeMountConnects(t *testing.T) {
	if unix.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "needs root for a private mount namespace")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "control")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			_ = c.Close()
		}
	}()

	type result struct {
		skip                      string
		connect, unlink, creat, b error
	}
	done := make(chan result, 1)
	go func() {
		// The namespace belongs to this thread only; it is never unlocked, so the
		// thread exits with the goroutine instead of returning to the scheduler.
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			r.skip = "unshare: " + err.Error()
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			r.skip = "private propagation: " + err.Error()
			return
		}
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			r.skip = "bind: " + err.Error()
			return
		}
		if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			r.skip = "remount ro: " + err.Error()
			return
		}
		r.connect = dial(sock)
		r.unlink = unix.Unlink(sock)
		fd, err := unix.Open(filepath.Join(dir, "planted"), unix.O_CREAT|unix.O_WRONLY, 0o600)
		if err == nil {
			_ = unix.Close(fd)
		}
		r.creat = err
		r.b = bindSocket(filepath.Join(dir, "control2"))
	}()
	r := <-done
	if r.skip != "" {
		testenv.SkipOrFailInCI(t, "%s", r.skip)
	}
	if r.connect != nil {
		t.Fatalf("connect through the read-only mount: %v", r.connect)
	}
	for name, err := range map[string]error{"unlink the socket": r.unlink, "create a file": r.creat,
		"bind a socket": r.b} {
		if !errors.Is(err, unix.EROFS) {
			t.Errorf("%s through the read-only mount: %v, want EROFS", name, err)
		}
	}
}

// dial connects a unix stream socket to path on the calling thread and reads a byte.
func dial(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return err
	}
	buf := make([]byte, 2)
	_, err = unix.Read(fd, buf)
	return err
}

// bindSocket binds a new unix socket at path on the calling thread.
func bindSocket(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: path})
}
