// Package timeslicetest is test support for the time-slice shim (koordlet/gpu/timeslice):
// it builds the shim, the fake driver and the program that drives them with gcc into a
// test's temporary directory. Imported only by tests.
package timeslicetest

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
)

// Built are the paths of what Build made.
type Built struct {
	// Shim is libunderstory-tsg.so, built as the Makefile builds it.
	Shim string
	// Fake is the fake driver (testdata/fake_rm.c), to preload after the shim.
	Fake string
	// Program is testdata/tsgtest.c's program.
	Program string
	// Preload is LD_PRELOAD's value for the shim over the fake: "Shim:Fake".
	Preload string
}

// ShimCFlags are the flags the Makefile builds the shim with.
func ShimCFlags() []string { return []string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra"} }

// ShimLinkFlags follow the source in the Makefile's build of the shim: libdl.so.2 as a
// needed library even where nothing of it is used (glibc 2.34 and later), so that on an
// older glibc, where dlsym lives there, the shim finds it (shim/understory_tsg.c).
func ShimLinkFlags() []string { return []string{"-Wl,--no-as-needed", "-l:libdl.so.2"} }

// SourceDir returns koordlet/gpu/timeslice, the folder of the C sources.
func SourceDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("timeslicetest: cannot locate its own source")
	}
	return filepath.Dir(filepath.Dir(file))
}

// Build compiles the shim (warnings are errors), the fake driver and the program into
// dir. Without gcc the test skips with the error (fails in CI, where gcc exists).
func Build(tb testing.TB, dir string) Built {
	tb.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.SkipOrFailInCI(tb, "the time-slice shim's tests build C with gcc: %v", err)
	}
	src := SourceDir(tb)
	b := Built{
		Shim:    filepath.Join(dir, "libunderstory-tsg.so"),
		Fake:    filepath.Join(dir, "libfake-rm.so"),
		Program: filepath.Join(dir, "tsgtest"),
	}
	b.Preload = b.Shim + ":" + b.Fake
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		append(append(append(ShimCFlags(), "-Werror", "-o", b.Shim), filepath.Join(src, "shim", "understory_tsg.c")),
			ShimLinkFlags()...),
		{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", b.Fake,
			filepath.Join(src, "testdata", "fake_rm.c"), "-ldl", "-lpthread"},
		{"-O2", "-Wall", "-Wextra", "-Werror", "-o", b.Program, filepath.Join(src, "testdata", "tsgtest.c"), "-lpthread"},
	} {
		if out, err := exec.CommandContext(ctx, gcc, args...).CombinedOutput(); err != nil {
			tb.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	return b
}
