package timeslice_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/understory/understory/koordlet/gpu/timeslice"
)

// TestInstall: the shim lands at dir/libunderstory-tsg.so, 0644, by a rename: a file
// opened before keeps the old content (a running container's mapping), a second
// install of the same bytes changes nothing, and no temporary file is left.
func TestInstall(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "src.so")
	if err := os.WriteFile(src, []byte("\x7fELF one"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "lib")
	dst, err := timeslice.Install(src, dir)
	if err != nil || dst != filepath.Join(dir, timeslice.LibraryName) {
		t.Fatalf("Install = %q, %v", dst, err)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode() != 0o644 {
		t.Fatalf("installed %v, %v; want 0644", fi.Mode(), err)
	}
	old, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := timeslice.Install(src, dir); err != nil {
		t.Fatal(err)
	}
	if fi2, err := os.Stat(dst); err != nil || !os.SameFile(fi, fi2) {
		t.Fatalf("the same bytes installed again replaced the file: %v", err)
	}
	if err := os.WriteFile(src, []byte("\x7fELF two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := timeslice.Install(src, dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "\x7fELF two" {
		t.Fatalf("after a new install: %q, %v", b, err)
	}
	buf := make([]byte, 16)
	if n, _ := old.Read(buf); string(buf[:n]) != "\x7fELF one" {
		t.Fatalf("a file opened before the install reads %q; want the old content", buf[:n])
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 {
		t.Fatalf("directory holds %v, %v; want only the library", ents, err)
	}
}

func TestInstallRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notELF := filepath.Join(dir, "x.so")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh"), 0o600); err != nil {
		t.Fatal(err)
	}
	for src, want := range map[string]error{filepath.Join(dir, "missing.so"): fs.ErrNotExist,
		notELF: timeslice.ErrLibrary} {
		if _, err := timeslice.Install(src, filepath.Join(dir, "lib")); !errors.Is(err, want) {
			t.Errorf("Install(%s) = %v; want %v", src, err, want)
		}
	}
}
