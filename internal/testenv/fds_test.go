package testenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunCheckingFDs is not parallel, nor are its cases: the check counts every
// descriptor of the process, which a test running beside it would change. Parallel
// top-level tests wait until every sequential one has returned, so none runs with it.
func TestRunCheckingFDs(t *testing.T) {
	// openRaw opens path with a plain system call: no *os.File, so no garbage
	// collection closes it; a real leak until the test's cleanup.
	openRaw := func(t *testing.T, path string) int {
		t.Helper()
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Close(fd) })
		return fd
	}
	tests := []struct {
		name string
		// tests returns the tests to check; what it does itself is done before the
		// check lists the descriptors.
		tests    func(t *testing.T, dir string) func() int
		leaks    bool // the check waits a short time only
		wantCode int
		wantOut  []string // substrings of the output; nil: no output
	}{
		{
			name: "file left open",
			tests: func(t *testing.T, dir string) func() int {
				return func() int {
					openRaw(t, filepath.Join(dir, "leaked"))
					return 0
				}
			},
			leaks:    true,
			wantCode: 1,
			wantOut:  []string{"left 1 file descriptor(s) open", "leaked"},
		},
		{
			name: "file closed",
			tests: func(t *testing.T, dir string) func() int {
				return func() int {
					f, err := os.Create(filepath.Join(dir, "closed"))
					if err != nil {
						t.Fatal(err)
					}
					if err := f.Close(); err != nil {
						t.Fatal(err)
					}
					return 0
				}
			},
		},
		{
			name: "file closed after the tests returned",
			tests: func(t *testing.T, dir string) func() int {
				return func() int {
					f, err := os.Create(filepath.Join(dir, "late"))
					if err != nil {
						t.Fatal(err)
					}
					time.AfterFunc(100*time.Millisecond, func() { _ = f.Close() })
					return 0
				}
			},
		},
		{
			name: "*os.File dropped without Close: the garbage collector closes it",
			tests: func(t *testing.T, dir string) func() int {
				return func() int {
					if _, err := os.Create(filepath.Join(dir, "dropped")); err != nil {
						t.Fatal(err)
					}
					return 0
				}
			},
		},
		{
			name: "epoll instance left open",
			tests: func(t *testing.T, _ string) func() int {
				return func() int {
					fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = syscall.Close(fd) })
					return 0
				}
			},
			leaks:    true,
			wantCode: 1,
			wantOut:  []string{"left 1 file descriptor(s) open", "anon_inode:[eventpoll]"},
		},
		{
			name: "descriptor open before, closed, its number reused",
			tests: func(t *testing.T, dir string) func() int {
				before := openRaw(t, filepath.Join(dir, "before"))
				return func() int {
					if err := syscall.Close(before); err != nil {
						t.Fatal(err)
					}
					openRaw(t, filepath.Join(dir, "reused"))
					return 0
				}
			},
			leaks:    true,
			wantCode: 1,
			wantOut:  []string{"left 1 file descriptor(s) open", "reused"},
		},
		{
			name: "open before, still open",
			tests: func(t *testing.T, dir string) func() int {
				openRaw(t, filepath.Join(dir, "before"))
				return func() int { return 0 }
			},
		},
		{
			name:     "tests failed, nothing left open",
			tests:    func(*testing.T, string) func() int { return func() int { return 1 } },
			wantCode: 1,
		},
		{
			name: "tests failed and left a file open: their code",
			tests: func(t *testing.T, dir string) func() int {
				return func() int {
					openRaw(t, filepath.Join(dir, "leaked"))
					return 2
				}
			},
			leaks:    true,
			wantCode: 2,
			wantOut:  []string{"left 1 file descriptor(s) open", "leaked"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			timeout := 10 * time.Second // returns as soon as all closed
			if tc.leaks {
				timeout = 200 * time.Millisecond
			}
			run := tc.tests(t, t.TempDir())
			var out bytes.Buffer
			code := runCheckingFDs(run, &out, timeout)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tc.wantCode, &out)
			}
			if tc.wantOut == nil && out.Len() > 0 {
				t.Errorf("unexpected output:\n%s", &out)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not name %q:\n%s", w, &out)
				}
			}
		})
	}
}

// TestRunCheckingFDsNetpoller: the runtime opens its netpoller's epoll instance and
// eventfd at the first pollable file and keeps them; RunCheckingFDs must not take them
// for a leak of the test that happened to open that file. Only a fresh process shows
// it: the helper checks that the netpoller is not started yet, then runs
// TestNetpollerHelper, which opens the first pipe, under RunCheckingFDs.
func TestRunCheckingFDsNetpoller(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNetpollerHelper$")
	cmd.Env = append(os.Environ(), fdHelperEnv+"=netpoller")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == netpollerStartedExit:
		t.Fatalf("the helper cannot show it: %s", out)
	case err != nil:
		t.Fatalf("helper: %v; output:\n%s", err, out)
	case !strings.Contains(string(out), "PASS"):
		t.Fatalf("helper did not run its test; output:\n%s", out)
	}
}

// TestNetpollerHelper is the helper process's test (TestRunCheckingFDsNetpoller): its
// pipe is the process's first pollable file. It does nothing in a plain run.
func TestNetpollerHelper(t *testing.T) {
	if os.Getenv(fdHelperEnv) != "netpoller" {
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fds, err := openFDs()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmtFDs(fds), "anon_inode:[eventpoll]") {
		t.Errorf("no epoll instance after the first pipe: %s", fmtFDs(fds))
	}
	_ = r.Close()
	_ = w.Close()
}

func fmtFDs(fds []openFD) string {
	var b strings.Builder
	for _, fd := range fds {
		b.WriteString(fd.String() + "; ")
	}
	return b.String()
}
