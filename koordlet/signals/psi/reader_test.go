package psi

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestReader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu.pressure")
	writeFile(t, path, sampleGroupCPU)
	r, err := OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if r.Path() != path {
		t.Errorf("Path = %q", r.Path())
	}
	p, err := r.Read()
	if err != nil || p.Some.Total != 1805081*time.Microsecond {
		t.Fatalf("Read = %+v, %v", p, err)
	}
	writeFile(t, path, "some avg10=0.00 avg60=0.00 avg300=0.00 total=2000000\n")
	if p, err = r.Read(); err != nil || p.Some.Total != 2*time.Second || p.Full != (Line{}) {
		t.Fatalf("Read after rewrite = %+v, %v", p, err)
	}
	// Concurrent use is safe (run with -race).
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

	writeFile(t, path, "garbage\n")
	if _, err := r.Read(); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), path) {
		t.Errorf("garbage: err = %v, want ErrFormat naming the file", err)
	}
	writeFile(t, path, sampleOldCPU+strings.Repeat(" ", maxBytes)) // over the bound: cut and refused
	if _, err := r.Read(); !errors.Is(err, ErrFormat) {
		t.Errorf("oversized: err = %v, want ErrFormat", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Read after Close: %v, want os.ErrClosed", err)
	}
}

func TestReadFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "memory.pressure")
	writeFile(t, good, sampleNodeMemory)
	bad := filepath.Join(dir, "io.pressure")
	writeFile(t, bad, "some avg10=1\n")
	unreadable := filepath.Join(dir, "cpu.pressure")
	writeFile(t, unreadable, sampleOldCPU)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}

	if p, err := ReadFile(good); err != nil || p.Full.Total != 32718171*time.Microsecond {
		t.Errorf("ReadFile(good) = %+v, %v", p, err)
	}
	tests := []struct {
		name string
		path string
		want error
	}{
		{"malformed", bad, ErrFormat},
		{"file missing, directory there (no PSI)", filepath.Join(dir, "irq.pressure"), ErrUnsupported},
		{"group gone", filepath.Join(dir, "pod1", "cpu.pressure"), ErrNotExist},
	}
	if os.Geteuid() != 0 { // root reads a 0000 file anyway
		tests = append(tests, struct {
			name string
			path string
			want error
		}{"unreadable", unreadable, ErrPermission})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := ReadFile(tc.path); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := ReadFile(filepath.Join(dir, "gone", "cpu.pressure")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ErrNotExist does not wrap fs.ErrNotExist: %v", err)
	}
}

// TestReadersNoAlloc: the agent reads ~100 pressure files and cpu.stats
// every period. (AllocsPerRun cannot run in a parallel test.)
func TestReadersNoAlloc(t *testing.T) {
	dir := t.TempDir()
	pp, sp := filepath.Join(dir, "cpu.pressure"), filepath.Join(dir, "cpu.stat")
	writeFile(t, pp, sampleNodeCPU)
	writeFile(t, sp, sampleV2Stat)
	r, err := OpenReader(pp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tr, err := OpenThrottleReader(sp)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if allocs := testing.AllocsPerRun(50, func() { _, _ = r.Read() }); allocs != 0 {
		t.Errorf("Reader.Read allocates %.1f times, want 0", allocs)
	}
	if allocs := testing.AllocsPerRun(50, func() { _, _ = tr.Read() }); allocs != 0 {
		t.Errorf("ThrottleReader.Read allocates %.1f times, want 0", allocs)
	}
	b := []byte(sampleV1Stat)
	if allocs := testing.AllocsPerRun(50, func() { _, _ = ParseThrottle(b) }); allocs != 0 {
		t.Errorf("ParseThrottle allocates %.1f times, want 0", allocs)
	}
}
