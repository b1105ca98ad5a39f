package timeslice

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// LibraryName is the shim's file name, in the agent's image and on the host.
const LibraryName = "libunderstory-tsg.so"

// maxLibraryBytes bounds the shim Install copies (it is about 30 KiB).
const maxLibraryBytes = 16 << 20

// ErrLibrary: the shim to install is not a plausible shared library (empty, too large,
// not ELF).
var ErrLibrary = errors.New("not a time-slice shim library")

// Install copies the shim src (a file of the agent's image) to dir/LibraryName on the
// host, where the NRI plugin mounts it into containers, and returns that path. The copy
// is atomic: written to a temporary file in dir, synced, made 0644 and renamed over
// the old one, so a container created meanwhile mounts the old file or the new one,
// never a part; a running process keeps the file it mapped (the old inode). A file
// already equal to src is left as it is. dir is made 0755 if missing.
func Install(src, dir string) (string, error) {
	data, err := readLibrary(src)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("installing the time-slice shim: %w", err)
	}
	dst := filepath.Join(dir, LibraryName)
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Lstat(dst); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o644 {
			return dst, nil
		}
	}
	tmp, err := os.CreateTemp(dir, "."+LibraryName+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("installing the time-slice shim: %w", err)
	}
	name, installed := tmp.Name(), false
	defer func() {
		if !installed {
			_ = tmp.Close() // a second Close only reports it was closed
			_ = os.Remove(name)
		}
	}()
	for _, step := range []func() error{
		func() error { _, err := tmp.Write(data); return err },
		func() error { return tmp.Chmod(0o644) },
		tmp.Sync,
		tmp.Close,
		func() error { return os.Rename(name, dst) },
	} {
		if err := step(); err != nil {
			return "", fmt.Errorf("installing the time-slice shim: %w", err)
		}
	}
	installed = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename outlives a crash
		_ = d.Close()
	}
	return dst, nil
}

// readLibrary reads src, bounded, and checks it looks like an ELF shared object.
func readLibrary(src string) ([]byte, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, fmt.Errorf("reading the time-slice shim: %w", err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxLibraryBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading the time-slice shim: %w", err)
	case len(data) > maxLibraryBytes:
		return nil, fmt.Errorf("%s: larger than %d bytes: %w", src, maxLibraryBytes, ErrLibrary)
	case !bytes.HasPrefix(data, []byte("\x7fELF")):
		return nil, fmt.Errorf("%s: no ELF header: %w", src, ErrLibrary)
	}
	return data, nil
}
