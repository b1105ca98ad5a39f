package psi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reader reads one pressure file repeatedly and cheaply: it keeps the file
// open and preads it at offset 0, which makes the kernel regenerate it, so
// a Read is one syscall and no allocation. It is safe for concurrent use;
// Close it when done.
type Reader struct {
	mu sync.Mutex
	pr preader
}

// OpenReader opens a pressure file (a group's cpu.pressure below the
// cgroup2 root, or <proc>/pressure/<resource>) and reads it once. A missing
// file of an existing directory (a kernel without PSI) wraps
// ErrUnsupported; a missing directory (the group is gone) ErrNotExist.
func OpenReader(path string) (*Reader, error) {
	r := &Reader{}
	if err := r.pr.open(path, 256, maxBytes+1); err != nil {
		return nil, err
	}
	if _, err := r.Read(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// Read returns the file's current content. A removed group gives an error
// wrapping ErrNotExist: drop the reader, do not crash.
func (r *Reader) Read() (Pressure, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.pr.read()
	if err != nil {
		return Pressure{}, err
	}
	p, err := ParseBytes(b)
	if err != nil {
		return Pressure{}, fmt.Errorf("%s: %w", r.pr.path, err)
	}
	return p, nil
}

// Path is the file the reader reads.
func (r *Reader) Path() string { return r.pr.path }

// Close releases the file. Read after Close fails with os.ErrClosed.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pr.close()
}

// ReadFile reads and parses a pressure file once (open, read, close). For
// a file read every period use a Reader.
func ReadFile(path string) (Pressure, error) {
	r, err := OpenReader(path)
	if err != nil {
		return Pressure{}, err
	}
	p, err := r.Read()
	if cerr := r.Close(); err == nil && cerr != nil {
		return Pressure{}, fmt.Errorf("closing %s: %w", path, cerr)
	}
	return p, err
}

// preader keeps a kernel file open and preads it from offset 0 into a
// reused buffer. Not safe for concurrent use; its owner locks.
type preader struct {
	f    *os.File
	path string
	buf  []byte
	max  int // largest buffer; a file that fills it is returned cut
}

func (p *preader) open(path string, size, max int) error {
	f, err := os.Open(path)
	if err != nil {
		return openError(path, err)
	}
	p.f, p.path, p.buf, p.max = f, path, make([]byte, size), max
	return nil
}

// read returns the whole file, growing the buffer while a read fills it.
// The slice is valid until the next read.
func (p *preader) read() ([]byte, error) {
	if p.f == nil {
		return nil, fmt.Errorf("reading %s: %w", p.path, os.ErrClosed)
	}
	fd := int(p.f.Fd())
	for {
		n, err := unix.Pread(fd, p.buf, 0)
		runtime.KeepAlive(p.f)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("reading %s: %w: %w", p.path, ErrNotExist, err)
			}
			return nil, fmt.Errorf("reading %s: %w", p.path, err)
		}
		if n == len(p.buf) && len(p.buf) < p.max {
			p.buf = make([]byte, min(2*len(p.buf), p.max))
			continue
		}
		return p.buf[:n], nil
	}
}

func (p *preader) close() error {
	if p.f == nil {
		return nil
	}
	err := p.f.Close()
	p.f = nil
	return err
}

// openError classifies an error opening path: a missing file in an
// existing directory is a kernel without the feature (ErrUnsupported), a
// missing directory a group that is gone (ErrNotExist); EOPNOTSUPP
// (cgroup.pressure=0) is ErrUnsupported, EACCES/EPERM ErrPermission.
func openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(filepath.Dir(path)); serr == nil {
			return fmt.Errorf("opening %s: file absent: %w: %w", path, ErrUnsupported, err)
		}
		return fmt.Errorf("opening %s: %w: %w", path, ErrNotExist, err)
	case errors.Is(err, syscall.ENODEV):
		return fmt.Errorf("opening %s: %w: %w", path, ErrNotExist, err)
	case errors.Is(err, syscall.EOPNOTSUPP):
		return fmt.Errorf("opening %s: %w: %w", path, ErrUnsupported, err)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return fmt.Errorf("opening %s: %w: %w", path, ErrPermission, err)
	}
	return fmt.Errorf("opening %s: %w", path, err)
}
