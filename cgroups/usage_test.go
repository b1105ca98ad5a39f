package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

func usageFile(g *Group) (string, func(d time.Duration) string) {
	if g.h.layout == LayoutV2 {
		return filepath.Join(g.cpuDir(), "cpu.stat"), func(d time.Duration) string {
			return fmt.Sprintf("usage_usec %d\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n", d.Microseconds())
		}
	}
	return filepath.Join(g.cpuacctDir(), "cpuacct.usage"), func(d time.Duration) string { return fmt.Sprintf("%d\n", d.Nanoseconds()) }
}

func TestUsageReaderFake(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			path, content := usageFile(g)
			mustWrite(t, path, content(3*time.Second))
			r, err := g.UsageReader()
			if err != nil {
				t.Fatalf("UsageReader: %v", err)
			}
			defer r.Close()
			for _, want := range []time.Duration{3 * time.Second, 3*time.Second + 1500*time.Microsecond, 12 * time.Hour} {
				// Rewrite in place (same inode) as the kernel does.
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString(content(want)); err != nil {
					t.Fatal(err)
				}
				f.Close()
				got, err := r.Read()
				if err != nil || got != want {
					t.Fatalf("Read = %v, %v; want %v", got, err, want)
				}
				st, err := g.Stats()
				if err != nil || st.Usage != want {
					t.Fatalf("Stats().Usage = %v, %v; want %v", st.Usage, err, want)
				}
			}
			// Concurrent readers share one reader safely (run under -race).
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for range 50 {
						if _, err := r.Read(); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := r.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := r.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := r.Read(); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("Read after Close = %v; want os.ErrClosed", err)
			}
		})
	}
}

// A vanished group: opening a reader, Stats and Load all report
// ErrNotExist (fs.ErrNotExist too). Reads on an fd whose kernfs node was
// removed are covered by the real-cgroup test (a plain file keeps its data).
func TestVanishedGroupFake(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			for _, dir := range groupDirs(h, g.Path()) {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := g.UsageReader(); !errors.Is(err, ErrNotExist) || !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("UsageReader on removed group = %v; want ErrNotExist", err)
			}
			if _, err := g.Stats(); !errors.Is(err, ErrNotExist) {
				t.Errorf("Stats on removed group = %v; want ErrNotExist", err)
			}
			if _, _, err := g.CPULimit(); !errors.Is(err, ErrNotExist) {
				t.Errorf("CPULimit on removed group = %v; want ErrNotExist", err)
			}
			if err := g.SetCPULimit(-1, 100*time.Millisecond); !errors.Is(err, ErrNotExist) {
				t.Errorf("SetCPULimit on removed group = %v; want ErrNotExist", err)
			}
			if err := g.SetIdle(true); !errors.Is(err, ErrNotExist) {
				t.Errorf("SetIdle on removed group = %v; want ErrNotExist", err)
			}
			if _, err := h.Load(g.Path()); !errors.Is(err, ErrNotExist) {
				t.Errorf("Load on removed group = %v; want ErrNotExist", err)
			}
		})
	}
}

func TestUsageReaderMalformed(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV1Separate, fakeV2} {
		h := OpenLayout(newFake(t, k), k.layout())
		g := fakeCreate(t, h, "x")
		path, _ := usageFile(g)
		mustWrite(t, path, "nr_periods 1\n")
		if _, err := g.UsageReader(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%v: UsageReader on garbage = %v; want ErrMalformed", k, err)
		}
	}
}

// A cpu.stat larger than the initial buffer is still read whole.
func TestUsageReaderGrowsBuffer(t *testing.T) {
	t.Parallel()
	h := OpenLayout(newFake(t, fakeV2), LayoutV2)
	g := fakeCreate(t, h, "x")
	content := ""
	for i := range 200 {
		content += fmt.Sprintf("future_key_%03d 1\n", i)
	}
	mustWrite(t, filepath.Join(g.cpuDir(), "cpu.stat"), content+"usage_usec 42\n")
	r, err := g.UsageReader()
	if err != nil {
		t.Fatalf("UsageReader: %v", err)
	}
	defer r.Close()
	if got, err := r.Read(); err != nil || got != 42*time.Microsecond {
		t.Fatalf("Read = %v, %v", got, err)
	}
}

func TestParseUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0\n", 0, true},
		{"451295837473\n", 451295837473, true},
		{"  12 \n", 12, true},
		{"9223372036854775807", 1<<63 - 1, true},
		{"9223372036854775808", 0, false},
		{"18446744073709551616", 0, false},
		{"", 0, false},
		{"-1", 0, false},
		{"1 2", 0, false},
		{"0x10", 0, false},
	} {
		got, err := parseUsageNS([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseUsageNS(%q) = %v, %v", tc.in, got, err)
		}
	}
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"usage_usec 5\n", 5, true},
		{"user_usec 1\nusage_usec 77\n", 77, true},
		{"usage_usec 77", 77, true},
		{"usage_usecs 77\n", 0, false},
		{"xusage_usec 77\n", 0, false},
		{"usage_usec\n", 0, false},
		{"usage_usec x\n", 0, false},
		{"", 0, false},
	} {
		got, err := parseUsageUsec([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseUsageUsec(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "gone")
	for _, tc := range []struct {
		name string
		dir  string
		err  error
		is   []error
		not  []error
	}{
		{"file missing, dir present", dir, syscall.ENOENT, []error{ErrUnsupported}, []error{ErrNotExist}},
		{"dir missing", missing, syscall.ENOENT, []error{ErrNotExist, fs.ErrNotExist, syscall.ENOENT}, []error{ErrUnsupported}},
		{"removed kernfs node", missing, syscall.ENODEV, []error{ErrNotExist, syscall.ENODEV}, nil},
		{"EINVAL", dir, syscall.EINVAL, []error{ErrInvalidValue, syscall.EINVAL}, nil},
		{"ERANGE", dir, syscall.ERANGE, []error{ErrInvalidValue}, nil},
		{"EROFS", dir, syscall.EROFS, []error{ErrReadOnly}, nil},
		{"EACCES", dir, syscall.EACCES, []error{ErrReadOnly}, nil},
		{"EOPNOTSUPP", dir, syscall.EOPNOTSUPP, []error{ErrUnsupported}, nil},
		{"other", dir, syscall.EIO, []error{syscall.EIO}, []error{ErrNotExist, ErrUnsupported, ErrInvalidValue}},
	} {
		err := classify("writing", tc.dir, "cpu.idle", &os.PathError{Op: "write", Path: tc.dir, Err: tc.err})
		for _, want := range tc.is {
			if !errors.Is(err, want) {
				t.Errorf("%s: %v does not wrap %v", tc.name, err, want)
			}
		}
		for _, no := range tc.not {
			if errors.Is(err, no) {
				t.Errorf("%s: %v wraps %v", tc.name, err, no)
			}
		}
	}
	if classify("x", dir, "y", nil) != nil {
		t.Error("classify(nil) != nil")
	}
}
