package images

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestReadBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	static := buildHello(t, dir, "static", false)
	dynamic := buildHello(t, dir, "dynamic", true)
	text := filepath.Join(dir, "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		path       string
		wantStatic bool
		wantErr    error
	}{
		{name: "static Go", path: static, wantStatic: true},
		{name: "cgo", path: dynamic, wantStatic: false},
		{name: "script", path: text, wantErr: ErrNotELF},
		{name: "missing", path: filepath.Join(dir, "nope"), wantErr: fs.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := ReadBinary(tc.path)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ReadBinary = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Arch != runtime.GOARCH || b.Static() != tc.wantStatic {
				t.Errorf("ReadBinary = %+v, want arch %s static %v", b, runtime.GOARCH, tc.wantStatic)
			}
			if !tc.wantStatic && (b.Interp == "" || !slices.Contains(b.Needed, "libc.so.6")) {
				t.Errorf("cgo binary: interp %q needed %v, want an interpreter and libc.so.6", b.Interp, b.Needed)
			}
		})
	}
}

func TestRuntimeFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	static := buildHello(t, dir, "static", false)
	dynamic := buildHello(t, dir, "dynamic", true)
	bin, err := ReadBinary(dynamic)
	if err != nil {
		t.Fatal(err)
	}
	if _, triplet, _ := archOf(machineOf(t, dynamic)); triplet == "" {
		t.Skipf("no multiarch triplet for %s", runtime.GOARCH)
	}

	t.Run("static needs nothing", func(t *testing.T) {
		t.Parallel()
		files, err := RuntimeFiles("/", static)
		if err != nil || files != nil {
			t.Fatalf("RuntimeFiles(static) = %v, %v, want nil, nil", files, err)
		}
	})
	t.Run("host", func(t *testing.T) {
		t.Parallel()
		files, err := RuntimeFiles("/", dynamic)
		if err != nil {
			t.Fatal(err)
		}
		realInterp, err := filepath.EvalSymlinks(bin.Interp)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, f := range files {
			if f.Mode != 0o755 || f.UID != 0 || seen[f.Path] {
				t.Errorf("file %+v: want mode 0755, root's, once", f)
			}
			seen[f.Path] = true
			if st, err := os.Lstat(f.Source); err != nil || !st.Mode().IsRegular() {
				t.Errorf("file %s: source %s is not a regular file (%v)", f.Path, f.Source, err)
			}
		}
		libc := filepath.Join(filepath.Dir(realInterp), "libc.so.6")
		if len(files) < 2 || files[0].Path != bin.Interp || files[0].Source != realInterp || !seen[libc] {
			t.Errorf("RuntimeFiles = %+v, want the interpreter %s (from %s) first and %s", files, bin.Interp,
				realInterp, libc)
		}
		// The loader itself says where it looks without ld.so.cache (glibc >= 2.33).
		dirs := systemSearchPath(t, bin.Interp)
		for _, f := range files[1:] {
			if !slices.Contains(dirs, filepath.Dir(f.Path)) {
				t.Errorf("%s is in none of the loader's system directories %v", f.Path, dirs)
			}
		}
	})
	// Sysroots as distributions lay them out, with absolute links resolved inside.
	t.Run("debian sysroot", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		tr := tripletOf(t, dynamic)
		ld := filepath.Base(bin.Interp)
		copyFile(t, bin.Interp, filepath.Join(root, "usr/lib", tr, ld))
		copyFile(t, hostLibc(t, dynamic), filepath.Join(root, "usr/lib", tr, "libc.so.6"))
		symlink(t, "usr/lib", filepath.Join(root, "lib"))
		symlink(t, filepath.Join("/lib", tr, ld), filepath.Join(root, bin.Interp))
		want := []File{
			{Path: bin.Interp, Mode: 0o755, Source: filepath.Join(root, "usr/lib", tr, ld)},
			{Path: filepath.Join("/usr/lib", tr, "libc.so.6"), Mode: 0o755, Source: filepath.Join(root, "usr/lib", tr, "libc.so.6")},
		}
		files, err := RuntimeFiles(root, dynamic)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(files, want, sameFile) {
			t.Errorf("RuntimeFiles = %+v\nwant %+v", files, want)
		}
	})
	t.Run("lib64 sysroot", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		tr := tripletOf(t, dynamic)
		ld := filepath.Base(bin.Interp)
		copyFile(t, bin.Interp, filepath.Join(root, "usr/lib64", ld))
		// Not an ELF in the loader's directory: skipped, as the loader skips it. The
		// real libc, found elsewhere, goes to the loader's directory.
		if err := os.WriteFile(filepath.Join(root, "usr/lib64", "libc.so.6"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		copyFile(t, hostLibc(t, dynamic), filepath.Join(root, "usr/lib", tr, "libc.so.6.real"))
		symlink(t, "libc.so.6.real", filepath.Join(root, "usr/lib", tr, "libc.so.6"))
		if bin.Interp != filepath.Join("/lib64", ld) {
			symlink(t, filepath.Join("/usr/lib64", ld), filepath.Join(root, bin.Interp))
		}
		symlink(t, "usr/lib64", filepath.Join(root, "lib64"))
		want := []File{
			{Path: bin.Interp, Mode: 0o755, Source: filepath.Join(root, "usr/lib64", ld)},
			{Path: "/usr/lib64/libc.so.6", Mode: 0o755, Source: filepath.Join(root, "usr/lib", tr, "libc.so.6.real")},
		}
		files, err := RuntimeFiles(root, dynamic)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(files, want, sameFile) {
			t.Errorf("RuntimeFiles = %+v\nwant %+v", files, want)
		}
	})
	t.Run("missing library", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		copyFile(t, bin.Interp, filepath.Join(root, bin.Interp))
		if _, err := RuntimeFiles(root, dynamic); !errors.Is(err, ErrLibraryNotFound) {
			t.Fatalf("RuntimeFiles without libc = %v, want ErrLibraryNotFound", err)
		}
	})
	t.Run("missing interpreter", func(t *testing.T) {
		t.Parallel()
		if _, err := RuntimeFiles(t.TempDir(), dynamic); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("RuntimeFiles without the loader = %v, want ErrNotExist", err)
		}
	})
}

func sameFile(a, b File) bool {
	return a.Path == b.Path && a.Mode == b.Mode && a.Source == b.Source && a.UID == b.UID && a.GID == b.GID
}

// hostLibc is the real path of this host's libc for the binary p.
func hostLibc(t *testing.T, p string) string {
	t.Helper()
	bin, err := ReadBinary(p)
	if err != nil {
		t.Fatal(err)
	}
	realInterp, err := filepath.EvalSymlinks(bin.Interp)
	if err != nil {
		t.Fatal(err)
	}
	real, _, err := findLibrary("/", "libc.so.6", machineOf(t, p), libDirs(filepath.Dir(realInterp), tripletOf(t, p)))
	if err != nil {
		t.Fatal(err)
	}
	return real
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// systemSearchPath asks the glibc loader interp for its system search path.
func systemSearchPath(t *testing.T, interp string) []string {
	t.Helper()
	out, err := exec.Command(interp, "--help").Output()
	if err != nil {
		t.Skipf("%s --help: %v (glibc < 2.33?)", interp, err)
	}
	var dirs []string
	for _, line := range strings.Split(string(out), "\n") {
		if d, ok := strings.CutSuffix(strings.TrimSpace(line), " (system search path)"); ok {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		t.Skipf("%s --help lists no system search path", interp)
	}
	return dirs
}

func TestResolveIn(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, d := range []string{"usr/lib/x", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/lib/x/f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	symlink(t, "usr/lib", filepath.Join(root, "lib"))
	symlink(t, "/lib/x/f", filepath.Join(root, "abs"))
	symlink(t, "../../../../../../lib/x/f", filepath.Join(root, "etc/up"))
	symlink(t, "loop2", filepath.Join(root, "loop1"))
	symlink(t, "loop1", filepath.Join(root, "loop2"))
	symlink(t, "/nope", filepath.Join(root, "dangling"))
	tests := []struct {
		p, want string
		err     error
	}{
		{p: "/usr/lib/x/f", want: "/usr/lib/x/f"},
		{p: "/lib/x/f", want: "/usr/lib/x/f"},
		{p: "/abs", want: "/usr/lib/x/f"},
		{p: "/etc/up", want: "/usr/lib/x/f"},
		{p: "/lib/../etc", want: "/usr/etc", err: fs.ErrNotExist}, // ".." after the link, as the kernel does
		{p: "/loop1", err: syscall.ELOOP},
		{p: "/dangling", err: fs.ErrNotExist},
		{p: "/usr/nope", err: fs.ErrNotExist},
	}
	for _, tc := range tests {
		got, err := resolveIn(root, tc.p)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("resolveIn(%s) = %q, %v; want %v", tc.p, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("resolveIn(%s) = %q, %v; want %q", tc.p, got, err, tc.want)
		}
	}
}

func machineOf(t *testing.T, p string) machine {
	t.Helper()
	info, err := readELF(p)
	if err != nil {
		t.Fatal(err)
	}
	return info.machine
}

func tripletOf(t *testing.T, p string) string {
	t.Helper()
	_, triplet, ok := archOf(machineOf(t, p))
	if !ok {
		t.Fatalf("no triplet for %s", p)
	}
	return triplet
}

// copyFile copies src (symlinks followed) to dst, creating dst's directories.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}
