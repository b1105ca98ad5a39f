package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/understory/understory/koordlet/gpu/devices"
)

// TestReportReader: only tsg-<n>.log regular files count, read without following links
// (a FIFO does not block), bounded; lines are folded into contexts by process and
// handles (the last allocation, the longest application's value); an unchanged file is
// not parsed again, a changed one is.
func TestReportReader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	appendReport(t, dir, "tsg-7.log", allocSet(7, 100, 100), appSet(7, 100, 500), appSet(7, 100, 20000),
		appSet(7, 100, 800))
	// The same process's second group, in another file (the tenant writes what it likes).
	second := allocSet(7, 100, 90)
	second.Object = 0x5c000003
	appendReport(t, dir, "tsg-8.log", second)
	if err := os.WriteFile(filepath.Join(dir, "tsg-9.log"), []byte("tsg/1 nonsense\nnot a line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	appendReport(t, filepath.Dir(secret), "secret", allocSet(66, 100, 100))
	for name, target := range map[string]string{"tsg-66.log": secret} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "tsg-67.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	appendReport(t, dir, "other.log", allocSet(68, 100, 100))
	appendReport(t, dir, "tsg-x.log", allocSet(69, 100, 100))

	var r reportReader
	r.begin()
	ctxs, bad := r.readDir(dir)
	r.end()
	if bad != 2 || len(ctxs) != 1 || len(ctxs[7]) != 2 {
		t.Fatalf("contexts %+v, bad %d; want pid 7's two groups and 2 bad lines", ctxs, bad)
	}
	a, b := ctxs[7][0], ctxs[7][1]
	if a.object == 0x5c000003 {
		a, b = b, a
	}
	if !a.hasAlloc || a.alloc.Readback.ValueUS != 100 || a.appSets != 3 || !a.hasApp || a.app.AppUS != 20000 ||
		a.contextName() != "client 0xc1d00001 group 0x5c000002" {
		t.Fatalf("first group %+v", a)
	}
	if !b.hasAlloc || b.alloc.Readback.ValueUS != 90 || b.appSets != 0 {
		t.Fatalf("second group %+v", b)
	}
	cached := r.files[filepath.Join(dir, "tsg-7.log")]
	r.begin()
	r.readDir(dir)
	r.end()
	if r.files[filepath.Join(dir, "tsg-7.log")] != cached {
		t.Fatal("an unchanged file was parsed again")
	}
	appendReport(t, dir, "tsg-7.log", appSet(7, 100, 30000))
	r.begin()
	ctxs, _ = r.readDir(dir)
	r.end()
	for _, c := range ctxs[7] {
		if c.object == 0x5c000002 && (c.appSets != 4 || c.app.AppUS != 30000) {
			t.Fatalf("after an append: %+v", c)
		}
	}
	// A file gone is forgotten.
	if err := os.Remove(filepath.Join(dir, "tsg-8.log")); err != nil {
		t.Fatal(err)
	}
	r.begin()
	r.readDir(dir)
	r.end()
	if _, ok := r.files[filepath.Join(dir, "tsg-8.log")]; ok {
		t.Fatal("a removed file is still cached")
	}
}

// TestReportReaderBounds: no more than maxReportFiles files and ShimReportMaxBytes bytes
// of each are read.
func TestReportReaderBounds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range maxReportFiles + 10 {
		appendReport(t, dir, fmt.Sprintf("tsg-%d.log", i+1), allocSet(i+1, 100, 100))
	}
	var r reportReader
	r.begin()
	ctxs, _ := r.readDir(dir)
	if len(ctxs) != maxReportFiles {
		t.Fatalf("%d processes read; want %d", len(ctxs), maxReportFiles)
	}
	big := t.TempDir()
	line := allocSet(5, 100, 100).String() + "\n"
	data := strings.Repeat(line, devices.ShimReportMaxBytes/len(line)+10)
	if err := os.WriteFile(filepath.Join(big, "tsg-5.log"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	// A line past the bound, whose event would differ: not read.
	last := allocSet(5, 100, 100)
	last.Object = 0x77
	appendReport(t, big, "tsg-5.log", last)
	ctxs, _ = r.readDir(big)
	if len(ctxs[5]) != 1 || ctxs[5][0].object != 0x5c000002 {
		t.Fatalf("contexts %+v; want the bound to stop the read", ctxs[5])
	}
}
