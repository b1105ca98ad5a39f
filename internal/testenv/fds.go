package testenv

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fdLeakTimeout is how long RunCheckingFDs waits, after the tests return, for the
// descriptors they opened to close: a goroutine a test stopped may still be on its way
// out, and an *os.File dropped without Close is closed by the garbage collector.
const fdLeakTimeout = 5 * time.Second

// fdDir lists the descriptors of this process, one symbolic link a descriptor.
const fdDir = "/proc/self/fd"

// An openFD is a file descriptor open in this process and what it refers to: the target
// of its link in /proc/self/fd (a path, or pipe:[inode], socket:[inode],
// anon_inode:[eventpoll], anon_inode:bpf-map, ...).
type openFD struct {
	Num    int
	Target string
}

func (fd openFD) String() string { return fmt.Sprintf("fd %d -> %s", fd.Num, fd.Target) }

// openFDs lists the file descriptors open in this process now, in numeric order (the
// one it reads the list through is not in it). It reads the directory with plain
// system calls, so that listing does not start the runtime's netpoller (see
// RunCheckingFDs). Linux only: it reads /proc.
func openFDs() ([]openFD, error) {
	dir, err := syscall.Open(fdDir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listing open file descriptors: %w", &fs.PathError{Op: "open", Path: fdDir, Err: err})
	}
	defer func() { _ = syscall.Close(dir) }()
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := syscall.ReadDirent(dir, buf)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing open file descriptors: %w", &fs.PathError{Op: "getdents", Path: fdDir, Err: err})
		}
		if n <= 0 {
			break
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
	fds := make([]openFD, 0, len(names))
	for _, name := range names {
		num, err := strconv.Atoi(name)
		if err != nil || num == dir {
			continue
		}
		target, err := os.Readlink(fdDir + "/" + name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // closed since the directory was read
		}
		if err != nil {
			return nil, fmt.Errorf("listing open file descriptors: %w", err)
		}
		fds = append(fds, openFD{Num: num, Target: target})
	}
	slices.SortFunc(fds, func(a, b openFD) int { return cmp.Compare(a.Num, b.Num) })
	return fds, nil
}

// fdsOpenedSince returns the descriptors open now that were not in before: a number
// that was not open then, or that was open on another target (closed and reused).
func fdsOpenedSince(before []openFD) ([]openFD, error) {
	now, err := openFDs()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(now, func(fd openFD) bool { return slices.Contains(before, fd) }), nil
}

// waitForFDsClosed waits up to timeout until no descriptor opened since before is
// open, running the garbage collector between looks (it closes an unreachable
// *os.File), and returns those still open then: nil when all closed.
func waitForFDsClosed(before []openFD, timeout time.Duration) ([]openFD, error) {
	var opened []openFD
	var err error
	PollEvery(timeout, 20*time.Millisecond, func() bool {
		if opened, err = fdsOpenedSince(before); err != nil || len(opened) == 0 {
			return true
		}
		runtime.GC() // queues the cleanups of unreachable files; the next look sees them run
		return false
	})
	return opened, err
}

// RunCheckingFDs runs the tests (m.Run) and checks they left no file descriptor open:
// it lists the process's descriptors before, and after waits up to fdLeakTimeout
// (waitForFDsClosed) for every descriptor opened since to close. It returns the exit
// code for os.Exit: m.Run's when the tests failed, 1 when they passed but left
// descriptors open, each printed to stderr with its target (and, for an anonymous
// inode such as an epoll instance or a BPF map, its /proc/self/fdinfo). Use it as
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunCheckingFDs(m)) }
//
// It checks whatever ran: -run, -skip and -short pick the tests, and the check covers
// them all together (run a smaller -run to find which test leaks). Tests of a package
// run in one process, so a leak cannot be put on one test when they run in parallel.
//
// Nothing that appears while the tests run is ignored. The Go runtime opens
// descriptors of its own lazily and keeps them for the life of the process: its
// netpoller's epoll instance and wake-up eventfd, opened once, on the first pollable
// file (a pipe, a socket, any os.Open on Linux), never closed. RunCheckingFDs makes the
// runtime open them before the first list (it opens and closes a pipe), so they belong
// to the "before" and are never taken for a leak, while an epoll instance or eventfd a
// test or the code under test opens (a PSI watcher's, say) is. Descriptors open before
// TestMain calls it (inherited ones, those package initialisation opened) are not
// checked.
//
// What it cannot see: a descriptor the garbage collector closes. An *os.File (and
// cilium/ebpf's handle of a BPF map or program) dropped without Close is closed once
// unreachable, and the wait collects garbage, so it passes. The check finds a
// descriptor nothing closes (a raw one from a system call), or one something still
// reachable after the tests holds (a goroutine that did not stop, say).
func RunCheckingFDs(m *testing.M) int {
	return runCheckingFDs(m.Run, os.Stderr, fdLeakTimeout)
}

// runCheckingFDs is RunCheckingFDs for any run function, writing the leaks to w.
func runCheckingFDs(run func() int, w io.Writer, timeout time.Duration) int {
	if err := startNetpoller(); err != nil {
		_, _ = fmt.Fprintf(w, "FAIL: checking file descriptors: %v\n", err)
		return 1
	}
	before, err := openFDs()
	if err != nil {
		_, _ = fmt.Fprintf(w, "FAIL: checking file descriptors: %v\n", err)
		return 1
	}
	code := run()
	leaked, err := waitForFDsClosed(before, timeout)
	if err != nil {
		_, _ = fmt.Fprintf(w, "FAIL: checking file descriptors: %v\n", err)
		return max(code, 1)
	}
	if len(leaked) == 0 {
		return code
	}
	_, _ = fmt.Fprintf(w, "FAIL: the tests left %d file descriptor(s) open (%v after they returned):\n", len(leaked), timeout)
	for _, fd := range leaked {
		_, _ = fmt.Fprintf(w, "\t%s%s\n", fd, fdInfo(fd))
	}
	return max(code, 1)
}

// startNetpoller makes the Go runtime open its netpoller's descriptors now, if it has
// not yet: an os.Pipe is registered with the netpoller, which the runtime starts on
// the first registration (internal/poll's serverInit, runtime.netpollinit).
func startNetpoller() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting the runtime's netpoller: %w", err)
	}
	_ = r.Close()
	_ = w.Close()
	return nil
}

// fdInfo returns, for an anonymous inode (an epoll instance, an eventfd, a BPF map or
// program, an inotify instance), what /proc/self/fdinfo says of it beyond the generic
// lines, such as the descriptors an epoll instance watches or a BPF map's type and id;
// "" for anything else, whose target already names it.
func fdInfo(fd openFD) string {
	if !strings.HasPrefix(fd.Target, "anon_inode:") {
		return ""
	}
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd.Num))
	if err != nil {
		return ""
	}
	var lines []string
	for line := range strings.Lines(string(b)) {
		key, _, _ := strings.Cut(line, ":")
		switch key {
		case "pos", "flags", "mnt_id", "ino":
			continue
		}
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	if len(lines) == 0 {
		return ""
	}
	return " (" + strings.Join(lines, "; ") + ")"
}
