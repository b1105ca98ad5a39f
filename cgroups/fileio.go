package cgroups

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// readFile reads a small cgroup file, classifying errors (see classify).
func readFile(dir, name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, classify("reading", dir, name, err)
	}
	return b, nil
}

// readInt reads a file holding one decimal integer (e.g. cpu.cfs_quota_us).
func readInt(dir, name string) (int64, error) {
	b, err := readFile(dir, name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, classifyMalformed(dir, name, err)
	}
	return v, nil
}

// writeFile writes value to an existing cgroup file. It never creates the
// file (O_CREAT on a fake root would hide a missing kernel feature) and
// classifies errors (see classify).
//
// Trap: os.OpenFile registers a cgroup2 file with the runtime's poller (kernfs
// files support poll) and makes it non-blocking; a write the kernel answers with
// EAGAIN (memory.reclaim when it cannot reclaim the whole amount) then waits for
// a readiness event that never comes, for ever. The file is opened blocking and
// wrapped with os.NewFile, which leaves it out of the poller: EAGAIN is returned.
func writeFile(dir, name, value string) error {
	path := filepath.Join(dir, name)
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC, 0)
	if err != nil {
		return classify("writing", dir, name, &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	_, werr := f.WriteString(value)
	cerr := f.Close()
	if werr != nil {
		return classify("writing "+strconv.Quote(value)+" to", dir, name, werr)
	}
	if cerr != nil {
		return classify("writing "+strconv.Quote(value)+" to", dir, name, cerr)
	}
	return nil
}

// requireFile returns nil when dir/name exists, otherwise the classified
// ENOENT (ErrUnsupported when only the file is missing, ErrNotExist when the
// group is gone). Used before library writes that would O_CREAT the file.
func requireFile(dir, name string) error {
	_, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return classify("writing", dir, name, err)
	}
	return nil
}
