package testenv

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// clockCalls are the calls that read or wait on the clock.
var clockCalls = []string{"time.Now(", "time.Since(", "time.Until(", "time.Sleep(", "time.After(",
	"time.AfterFunc(", "time.Tick(", "time.NewTimer(", "time.NewTicker("}

// CheckPure keeps the package in dir pure, for the layers that must be (qos, the
// placement core, the wire contract): its non-test files may import only the packages
// in allowed, and call no clock (time is allowed for its types and arithmetic; the
// caller passes now). Each violation is an error of tb naming the file.
func CheckPure(tb testing.TB, dir string, allowed ...string) {
	tb.Helper()
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		tb.Fatalf("reading the package in %s: %v", dir, err)
	}
	if len(pkg.GoFiles) == 0 {
		tb.Fatalf("no source files in %s", dir)
	}
	for _, imp := range pkg.Imports {
		if !slices.Contains(allowed, imp) {
			tb.Errorf("package %s imports %q: it must stay pure (allowed: %s)", pkg.Name, imp, strings.Join(allowed, ", "))
		}
	}
	for _, f := range pkg.GoFiles {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			tb.Fatal(err)
		}
		for _, call := range clockCalls {
			if strings.Contains(string(b), call) {
				tb.Errorf("%s calls %s: package %s reads no clock (the caller passes now)", f, call, pkg.Name)
			}
		}
	}
}
