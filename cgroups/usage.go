package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// UsageReader reads a group's cumulative CPU usage repeatedly and cheaply:
// it keeps v1 cpuacct.usage (or v2 cpu.stat) open and preads it at offset 0,
// which makes kernfs regenerate the content, so one Read is one syscall and
// no allocation. It is safe for concurrent use; Close it when done.
type UsageReader struct {
	mu   sync.Mutex
	f    *os.File
	fd   int
	v2   bool
	buf  []byte
	path string
}

// UsageReader opens the group's usage file. A missing group wraps
// ErrNotExist.
func (g *Group) UsageReader() (*UsageReader, error) {
	dir, name, v2 := g.cpuacctDir(), fileUsage, false
	if g.h.layout == LayoutV2 {
		dir, name, v2 = g.cpuDir(), fileCPUStat, true
	}
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, classify("opening", dir, name, err)
	}
	size := 64
	if v2 {
		size = 1024
	}
	r := &UsageReader{f: f, fd: int(f.Fd()), v2: v2, buf: make([]byte, size), path: path}
	if _, err := r.Read(); err != nil {
		_ = f.Close()
		return nil, err
	}
	return r, nil
}

// Read returns the cumulative CPU time used by the group. When the group
// has been removed it returns an error wrapping ErrNotExist (the kernel
// answers ENODEV on the open file): skip the group, do not crash.
func (r *UsageReader) Read() (time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0, fmt.Errorf("reading %s: %w", r.path, os.ErrClosed)
	}
	for {
		n, err := unix.Pread(r.fd, r.buf, 0)
		runtime.KeepAlive(r.f)
		if err != nil {
			if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
				return 0, fmt.Errorf("reading %s: %w: %w", r.path, ErrNotExist, err)
			}
			return 0, fmt.Errorf("reading %s: %w", r.path, err)
		}
		if n == len(r.buf) && len(r.buf) < 64<<10 {
			r.buf = make([]byte, 2*len(r.buf))
			continue
		}
		d, err := r.parse(r.buf[:n])
		if err != nil {
			return 0, fmt.Errorf("parsing %s: %w: %w", r.path, ErrMalformed, err)
		}
		return d, nil
	}
}

var errNoUsage = errors.New("no usage_usec line")

func (r *UsageReader) parse(b []byte) (time.Duration, error) {
	if !r.v2 {
		return parseUsageNS(b)
	}
	us, err := parseUsageUsec(b)
	if err != nil {
		return 0, err
	}
	return usDuration(us)
}

const usageUsecKey = "usage_usec "

// parseUsageUsec finds the "usage_usec N" line of v2 cpu.stat without
// allocating.
func parseUsageUsec(b []byte) (uint64, error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) >= len(usageUsecKey) && string(line[:len(usageUsecKey)]) == usageUsecKey {
			n, ok := parseDecimal(bytes.TrimSpace(line[len(usageUsecKey):]))
			if !ok {
				return 0, errors.New("usage_usec: not a decimal number")
			}
			return n, nil
		}
	}
	return 0, errNoUsage
}

// Close releases the open file. Read after Close fails with os.ErrClosed.
func (r *UsageReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
