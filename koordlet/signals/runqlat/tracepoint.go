package runqlat

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Classic tracepoints are attached here rather than with cilium/ebpf's
// link.Tracepoint: the library finds tracefs itself, caches a failure to
// find it for the life of the process (mounting tracefs later does not
// help), and reports it as an error text callers cannot branch on. Here the
// root is a value (a host mount in a container) and a missing tracefs is
// ErrNoTracefs.

// tracefsRoot returns root, or the first default mount with sched events.
func tracefsRoot(root string) (string, error) {
	roots := defaultTracefsRoots
	if root != "" {
		roots = []string{root}
	}
	for _, r := range roots {
		if _, err := os.Stat(filepath.Join(r, "events", "sched")); err == nil {
			return r, nil
		}
	}
	return "", fmt.Errorf("runqlat tracepoint: no events/sched under %s: %w",
		strings.Join(roots, " or "), ErrNoTracefs)
}

// tracepointID reads the id of tracepoint group/name under a tracefs root.
func tracepointID(root, group, name string) (uint64, error) {
	path := filepath.Join(root, "events", group, name, "id")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("runqlat tracepoint: %w: %w", ErrNoTracefs, err)
	}
	if err != nil {
		return 0, classify(fmt.Errorf("runqlat tracepoint: %w", err))
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("runqlat tracepoint: %s: %w", path, err)
	}
	return id, nil
}

// perfAttachment is a tracepoint perf event with the program set on it;
// closing the event detaches the program.
type perfAttachment struct{ f *os.File }

func (a perfAttachment) Close() error { return a.f.Close() }

// attachTracepoint opens the tracepoint's perf event and sets prog on it. One
// event, on CPU 0, is enough: a BPF program on a tracepoint runs wherever the
// tracepoint fires. PERF_EVENT_IOC_SET_BPF works on every kernel with
// BPF tracepoints (4.7+).
func attachTracepoint(id uint64, prog *ebpf.Program) (perfAttachment, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_TRACEPOINT,
		Size:        uint32(unix.PERF_ATTR_SIZE_VER0),
		Config:      id,
		Sample_type: unix.PERF_SAMPLE_RAW,
		Sample:      1,
		Wakeup:      1,
	}
	fd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.EACCES) { // perf_event_paranoid, CAP_PERFMON
			err = fmt.Errorf("%w: %w", ErrPermission, err)
		}
		return perfAttachment{}, fmt.Errorf("perf_event_open: %w", err)
	}
	a := perfAttachment{os.NewFile(uintptr(fd), "perf_event:tracepoint:"+strconv.FormatUint(id, 10))}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_SET_BPF, prog.FD()); err != nil {
		a.Close()
		return perfAttachment{}, fmt.Errorf("PERF_EVENT_IOC_SET_BPF: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		a.Close()
		return perfAttachment{}, fmt.Errorf("PERF_EVENT_IOC_ENABLE: %w", err)
	}
	return a, nil
}
