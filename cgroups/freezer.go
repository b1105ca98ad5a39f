package cgroups

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultFreezeTimeout bounds Freeze and Thaw. A task stuck in
// uninterruptible sleep (D state, e.g. on NFS or a hung device) keeps a v1
// freezer in FREEZING indefinitely; containerd/cgroups' own Freeze would spin
// forever, so the wait here is bounded and ctx-aware.
const DefaultFreezeTimeout = 5 * time.Second

const (
	fileFreezerState = "freezer.state"
	fileFreeze       = "cgroup.freeze"
	fileEvents       = "cgroup.events"
)

// Freeze stops every task in the group and its descendants and waits until
// the kernel reports them frozen (at most DefaultFreezeTimeout). v1 (and
// hybrid with a v1 freezer): freezer.state FROZEN, written again every few
// checks while it reads FREEZING (see v1Rewrite). v2 (and hybrid without a v1 freezer): cgroup.freeze=1,
// then cgroup.events "frozen 1". On timeout the error wraps ErrTimeout and
// the group may be partly frozen; call Thaw to undo.
func (g *Group) Freeze() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultFreezeTimeout)
	defer cancel()
	return g.FreezeContext(ctx)
}

// Thaw resumes the group's tasks (bounded like Freeze).
func (g *Group) Thaw() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultFreezeTimeout)
	defer cancel()
	return g.ThawContext(ctx)
}

// FreezeContext is Freeze with the wait bounded by ctx instead.
func (g *Group) FreezeContext(ctx context.Context) error { return g.setFrozen(ctx, true) }

// ThawContext is Thaw with the wait bounded by ctx instead.
func (g *Group) ThawContext(ctx context.Context) error { return g.setFrozen(ctx, false) }

// Frozen reports whether the group is completely frozen (a v1 group still
// FREEZING is not).
func (g *Group) Frozen() (bool, error) {
	if g.useV1Freezer() {
		s, err := g.v1FreezerState()
		return s == "FROZEN", err
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return false, err
	}
	return readEventsFrozen(dir)
}

func (g *Group) useV1Freezer() bool {
	return g.h.layout != LayoutV2 && g.h.freezerDir != ""
}

func (g *Group) freezerDir() string { return g.h.freezerDir + "/" + g.rel }

func (g *Group) v1FreezerState() (string, error) { return readV1FreezerState(g.freezerDir()) }

// readV1FreezerState reads the v1 freezer.state of the group at dir: FROZEN, FREEZING
// or THAWED.
func readV1FreezerState(dir string) (string, error) {
	var buf [16]byte // "FREEZING\n" is the longest state
	n, err := readSmall(dir, fileFreezerState, buf[:])
	if err != nil {
		return "", err
	}
	switch b := bytes.TrimSpace(buf[:n]); string(b) { // no allocation: the cases are constants
	case "FROZEN":
		return "FROZEN", nil
	case "FREEZING":
		return "FREEZING", nil
	case "THAWED":
		return "THAWED", nil
	default:
		return "", classifyMalformed(dir, fileFreezerState, fmt.Errorf("unknown state %q", b))
	}
}

// v2FreezerDir returns the cgroup2 directory used for freezing, or
// ErrUnsupported when there is none (v1 without freezer).
func (g *Group) v2FreezerDir() (string, error) {
	d := g.unifiedDir()
	if d == "" || g.v2 == nil {
		if g.h.layout == LayoutV1 {
			return "", fmt.Errorf("freezing cgroup %s: no v1 freezer hierarchy: %w", g.rel, ErrUnsupported)
		}
		return "", fmt.Errorf("freezing cgroup %s: no unified group (call Create): %w", g.rel, ErrNotExist)
	}
	return d, nil
}

// FreezeNoWait asks the kernel to freeze the group and returns without waiting for its
// tasks to stop: one write (v1 freezer.state FROZEN, v2 cgroup.freeze 1). The kernel
// completes the freeze on its own as each task reaches a point where it can stop; Frozen
// tells when all have. For a caller that writes the state again soon anyway (a duty
// cycle): a task that escaped a v1 freeze (one forked while it began) runs until the next
// write, and a task in uninterruptible sleep stops when it wakes, without holding the
// caller up.
func (g *Group) FreezeNoWait() error { return g.request(true) }

// ThawNoWait undoes FreezeNoWait (or a Freeze) with one write, without reading the state
// back. A group whose ancestor is frozen stays frozen (v1: freezer.state reads FROZEN or
// FREEZING, freezer.self_freezing 0).
func (g *Group) ThawNoWait() error { return g.request(false) }

// FreezeRequested reports whether the group itself asks to be frozen, whether or not
// the kernel finished: v1 freezer.state not THAWED, v2 cgroup.freeze 1. Another writer
// (systemd re-applying a unit's freezer state on daemon-reload) can change it.
func (g *Group) FreezeRequested() (bool, error) {
	if g.useV1Freezer() {
		s, err := g.v1FreezerState()
		return err == nil && s != v1State(false), err
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return false, err
	}
	return freezerTree{dir: dir}.asked(dir)
}

// request writes the freezer state once.
func (g *Group) request(frozen bool) error {
	if g.useV1Freezer() {
		return writeSmall(g.freezerDir(), fileFreezerState, v1State(frozen))
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return err
	}
	return writeSmall(dir, fileFreeze, v2Freeze(frozen))
}

func v1State(frozen bool) string {
	if frozen {
		return "FROZEN"
	}
	return "THAWED"
}

func v2Freeze(frozen bool) string {
	if frozen {
		return "1"
	}
	return "0"
}

// v1Rewrite is how many checks of a v1 group still FREEZING pass between two writes of
// FROZEN. A write makes the kernel signal every task of the group that is not frozen yet;
// a task that was already signalled freezes on its own, so every check need not write
// (that was most of a freeze's cost). A task forked into the group while it began
// freezing may escape the first signal (runc retries its freeze for that reason): the
// write is repeated, and the backoff of poll keeps it to a few writes a second.
const v1Rewrite = 4

func (g *Group) setFrozen(ctx context.Context, frozen bool) error {
	op := "thawing"
	if frozen {
		op = "freezing"
	}
	if err := g.request(frozen); err != nil {
		return err
	}
	if g.useV1Freezer() {
		want := v1State(frozen)
		checks := 0
		return poll(ctx, func() (bool, string, error) {
			if checks++; checks > 1 && (checks-1)%v1Rewrite == 0 {
				if err := writeSmall(g.freezerDir(), fileFreezerState, want); err != nil {
					return false, "", err
				}
			}
			s, err := g.v1FreezerState()
			return s == want, s, err
		}, op, g.rel)
	}
	dir, err := g.v2FreezerDir()
	if err != nil {
		return err
	}
	return poll(ctx, func() (bool, string, error) {
		f, err := readEventsFrozen(dir)
		return f == frozen, fmt.Sprintf("frozen %t", f), err
	}, op, g.rel)
}

// writeSmall writes value to an existing cgroup file with plain system calls: open,
// write, close. os.OpenFile would also register the file with Go's netpoller (cgroup
// files can be polled), which doubles the system calls of a write a duty cycle makes
// tens of times a second. It never creates the file (see writeFile).
func writeSmall(dir, name, value string) error {
	path := dir + "/" + name
	fd, err := openNoEINTR(path, syscall.O_WRONLY|syscall.O_TRUNC|syscall.O_CLOEXEC)
	if err != nil {
		return classify("writing", dir, name, &fs.PathError{Op: "open", Path: path, Err: err})
	}
	var werr error
	for {
		_, werr = syscall.Write(fd, []byte(value))
		if werr != syscall.EINTR {
			break
		}
	}
	cerr := syscall.Close(fd)
	if werr == nil {
		werr = cerr
	}
	if werr != nil {
		return classify("writing "+strconv.Quote(value)+" to", dir, name,
			&fs.PathError{Op: "write", Path: path, Err: werr})
	}
	return nil
}

// readSmall reads up to len(buf) bytes of a cgroup file with plain system calls (see
// writeSmall) and returns how many it read.
func readSmall(dir, name string, buf []byte) (int, error) {
	path := dir + "/" + name
	fd, err := openNoEINTR(path, syscall.O_RDONLY|syscall.O_CLOEXEC)
	if err != nil {
		return 0, classify("reading", dir, name, &fs.PathError{Op: "open", Path: path, Err: err})
	}
	var n int
	for {
		n, err = syscall.Read(fd, buf)
		if err != syscall.EINTR {
			break
		}
	}
	_ = syscall.Close(fd)
	if err != nil {
		return 0, classify("reading", dir, name, &fs.PathError{Op: "read", Path: path, Err: err})
	}
	return n, nil
}

func openNoEINTR(path string, mode int) (int, error) {
	for {
		fd, err := syscall.Open(path, mode, 0)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// poll calls check until it reports done, an error, or ctx ends (ErrTimeout),
// backing off from 1 ms to 20 ms.
func poll(ctx context.Context, check func() (done bool, state string, err error), op, rel string) error {
	delay := time.Millisecond
	for {
		done, state, err := check()
		if err != nil || done {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s cgroup %s: still %q: %w: %w", op, rel, state, ErrTimeout, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// readEventsFrozen reads the "frozen" key of cgroup.events (kernel >= 5.2).
func readEventsFrozen(dir string) (bool, error) {
	b, err := readFile(dir, fileEvents)
	if err != nil {
		return false, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || k != "frozen" {
			continue
		}
		switch strings.TrimSpace(v) {
		case "1":
			return true, nil
		case "0":
			return false, nil
		}
		return false, classifyMalformed(dir, fileEvents, fmt.Errorf("frozen %q", v))
	}
	return false, fmt.Errorf("reading %s/%s: no \"frozen\" key: %w", dir, fileEvents, ErrUnsupported)
}
