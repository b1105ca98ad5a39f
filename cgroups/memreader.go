package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// MemoryReader reads a group's working set (what MemoryUsage returns) repeatedly and
// cheaply: it keeps the usage file and memory.stat open and preads both at offset 0
// (kernfs regenerates them on every read at 0), so one Read is two syscalls and no
// allocation instead of two opens, reads and closes. For groups read every period or
// second (the agent's aggregates and batch pods). Safe for concurrent use; Close it
// when done.
type MemoryReader struct {
	mu          sync.Mutex
	usage, stat *os.File
	inactiveKey string
	buf         []byte
	dir         string
	usageName   string
}

// MemoryReader opens the group's memory usage and memory.stat. A missing group wraps
// ErrNotExist; no memory hierarchy wraps ErrUnsupported.
func (g *Group) MemoryReader() (*MemoryReader, error) {
	dir, usageName, key, err := g.memoryFiles()
	if err != nil {
		return nil, err
	}
	usage, err := os.Open(filepath.Join(dir, usageName))
	if err != nil {
		return nil, classify("opening", dir, usageName, err)
	}
	stat, err := os.Open(filepath.Join(dir, fileMemoryStat))
	if err != nil {
		_ = usage.Close()
		return nil, classify("opening", dir, fileMemoryStat, err)
	}
	r := &MemoryReader{usage: usage, stat: stat, inactiveKey: key, buf: make([]byte, 4096), dir: dir,
		usageName: usageName}
	if _, err := r.Read(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// Read returns the group's working set in bytes: usage minus inactive file cache
// (0 when the cache exceeds the usage). A removed group wraps ErrNotExist (the kernel
// answers ENODEV on the open files).
func (r *MemoryReader) Read() (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usage == nil {
		return 0, fmt.Errorf("reading memory of %s: %w", r.dir, os.ErrClosed)
	}
	b, err := r.pread(r.usage, r.usageName)
	if err != nil {
		return 0, err
	}
	usage, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil || usage < 0 {
		if err == nil {
			err = fmt.Errorf("negative usage %d", usage)
		}
		return 0, classifyMalformed(r.dir, r.usageName, err)
	}
	if b, err = r.pread(r.stat, fileMemoryStat); err != nil {
		return 0, err
	}
	inactive, err := statValue(b, r.inactiveKey)
	if err != nil {
		return 0, classifyMalformed(r.dir, fileMemoryStat, err)
	}
	return workingSet(uint64(usage), inactive), nil
}

// pread reads all of f into r.buf (growing it up to 256 KiB) and returns the bytes.
func (r *MemoryReader) pread(f *os.File, name string) ([]byte, error) {
	for {
		n, err := unix.Pread(int(f.Fd()), r.buf, 0)
		runtime.KeepAlive(f)
		if err != nil {
			if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("reading %s/%s: %w: %w", r.dir, name, ErrNotExist, err)
			}
			return nil, fmt.Errorf("reading %s/%s: %w", r.dir, name, err)
		}
		if n == len(r.buf) && len(r.buf) < 256<<10 {
			r.buf = make([]byte, 2*len(r.buf))
			continue
		}
		return r.buf[:n], nil
	}
}

// Close releases the open files. Read after Close fails with os.ErrClosed.
func (r *MemoryReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usage == nil {
		return nil
	}
	err := errors.Join(r.usage.Close(), r.stat.Close())
	r.usage, r.stat = nil, nil
	return err
}
