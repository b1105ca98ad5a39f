package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// On this Debian machine the loader and libc the GPU agent's image copies belong to
// libc6, found under either spelling of a merged /usr; a file of no package is not.
func TestDpkgPackage(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		testenv.SkipOrFailInCI(t, "no dpkg-query: not a Debian machine")
	}
	for _, p := range []string{"/lib64/ld-linux-x86-64.so.2", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"} {
		name, stanza, err := dpkgPackage(p)
		if err != nil {
			if matches, _ := filepath.Glob(p); len(matches) == 0 {
				continue // another architecture's machine
			}
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !strings.HasPrefix(name, "libc6") || !strings.Contains(string(stanza), "Package: libc6\n") ||
			!strings.Contains(string(stanza), "\nVersion: ") {
			t.Errorf("%s: package %q, stanza %q", p, name, stanza)
		}
	}
	if _, _, err := dpkgPackage(filepath.Join(t.TempDir(), "mine.so")); !errors.Is(err, errNoPackage) {
		t.Errorf("a file of no package: %v", err)
	}
	if dpkgLookup("/opt/sysroot") != nil {
		t.Error("a lookup on this host's dpkg for libraries from a root it did not install")
	}
	// A Debian cross sysroot's libc is libc6 of that architecture, at the version
	// dpkg-cross repacked.
	if _, err := filepath.Glob("/usr/aarch64-linux-gnu/lib/libc.so.6"); err == nil {
		if name, stanza, err := crossPackage("/usr/aarch64-linux-gnu/lib/libc.so.6"); err == nil {
			if name != "libc6:arm64" || !strings.Contains(string(stanza), "Package: libc6\nStatus: install ok installed\nArchitecture: arm64\nVersion: 2.") ||
				strings.Contains(string(stanza), "Version: 2.36-8cross") {
				t.Errorf("cross libc: %q %q", name, stanza)
			}
		} else if matches, _ := filepath.Glob("/usr/aarch64-linux-gnu/lib/libc.so.6"); len(matches) > 0 {
			t.Errorf("cross libc: %v", err)
		}
	}
}
