package runqlat

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Sentinels of Load and Watch; test with errors.Is.
var (
	// ErrPermission: the kernel refused BPF (no CAP_BPF+CAP_PERFMON or
	// CAP_SYS_ADMIN, a seccomp or LSM policy, or RLIMIT_MEMLOCK on kernels
	// before 5.11 that could not be raised).
	ErrPermission = errors.New("eBPF not permitted")
	// ErrNoBTF: the kernel has no BTF (/sys/kernel/btf/vmlinux, or
	// Options.KernelBTF, missing), so tp_btf cannot be used.
	ErrNoBTF = errors.New("kernel BTF not available")
	// ErrNoTracefs: tracefs is not mounted where Options.TracefsRoot says, so
	// classic tracepoints cannot be attached. `mount -t tracefs tracefs
	// /sys/kernel/tracing` fixes it.
	ErrNoTracefs = errors.New("tracefs not mounted")
	// ErrFull: Watch would pass Options.MaxCgroups.
	ErrFull = errors.New("watched cgroups full")
	// ErrInvalid: an invalid Options value or cgroup id.
	ErrInvalid = errors.New("invalid argument")
)

// Mode is how the probe attaches to the scheduler's tracepoints.
type Mode string

const (
	// ModeAuto tries ModeBTF, then ModeTracepoint.
	ModeAuto Mode = ""
	// ModeBTF: BTF-typed raw tracepoints (tp_btf, Linux 5.5+ with BTF). The
	// cheaper one: no tracefs and no per-event buffer copy.
	ModeBTF Mode = "tp_btf"
	// ModeTracepoint: classic tracepoints through tracefs; needs no BTF.
	ModeTracepoint Mode = "tracepoint"
)

// Defaults of Options.
const (
	DefaultKernelBTF  = "/sys/kernel/btf/vmlinux"
	DefaultMaxCgroups = 1024
)

// defaultTracefsRoots are tried in order when Options.TracefsRoot is empty.
var defaultTracefsRoots = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// Options configures Load. The zero value is ready to use.
type Options struct {
	// Mode forces an attach mode; ModeAuto (the zero value) falls back from
	// tp_btf to classic tracepoints.
	Mode Mode
	// TracefsRoot is where tracefs is mounted, for ModeTracepoint. Empty:
	// /sys/kernel/tracing, then /sys/kernel/debug/tracing.
	TracefsRoot string
	// KernelBTF is the kernel's BTF, for ModeBTF. Empty: DefaultKernelBTF.
	// Another path (a host mount, a BTFHub file) is used for the CO-RE
	// offsets; attaching still needs the kernel's own BTF.
	KernelBTF string
	// MaxCgroups bounds the watched cgroups and histograms (each map);
	// 0 is DefaultMaxCgroups. Histograms are preallocated: ~300 bytes each.
	MaxCgroups int
}

// Probe is the loaded and attached BPF program. Its methods are safe for
// concurrent use.
type Probe struct {
	mode    Mode
	watched *ebpf.Map // cgroup id -> histogram key
	hists   *ebpf.Map // histogram key -> struct hist
	closers []io.Closer

	mu     sync.Mutex
	closed bool
	groups map[uint64]uint64 // mirror of watched
	raw    []byte            // Read's buffer
}

// Load loads the BPF programs and attaches them (see Options.Mode). The
// caller must Close the probe. Errors wrap ErrPermission, ErrNoBTF or
// ErrNoTracefs when that is the cause; with ModeAuto an error wraps the
// reasons of both modes.
func Load(opts Options) (*Probe, error) {
	if strconv.IntSize != 64 {
		// The classic tracepoint contexts in bpf/runqlat.c assume a 64-bit long.
		return nil, fmt.Errorf("runqlat: 32-bit kernels: %w", errors.ErrUnsupported)
	}
	if opts.MaxCgroups < 0 {
		return nil, fmt.Errorf("runqlat: MaxCgroups %d: %w", opts.MaxCgroups, ErrInvalid)
	}
	if opts.MaxCgroups == 0 {
		opts.MaxCgroups = DefaultMaxCgroups
	}
	// A no-op since 5.11 (BPF memory is charged to the memory cgroup). It
	// fails without CAP_SYS_RESOURCE; the load then says whether BPF is
	// denied, and this error is added to the load's.
	memlockErr := rlimit.RemoveMemlock()
	p, err := load(opts)
	if err != nil && memlockErr != nil {
		err = fmt.Errorf("%w (raising RLIMIT_MEMLOCK failed too: %v)", err, memlockErr)
	}
	return p, err
}

func load(opts Options) (*Probe, error) {
	switch opts.Mode {
	case ModeBTF:
		return loadBTF(opts)
	case ModeTracepoint:
		return loadTracepoint(opts)
	case ModeAuto:
		p, errBTF := loadBTF(opts)
		if errBTF == nil {
			return p, nil
		}
		if errors.Is(errBTF, ErrPermission) {
			return nil, errBTF // no better with tracepoints
		}
		p, errTP := loadTracepoint(opts)
		if errTP == nil {
			return p, nil
		}
		return nil, errors.Join(errBTF, errTP)
	}
	return nil, fmt.Errorf("runqlat: mode %q: %w", opts.Mode, ErrInvalid)
}

// spec is the embedded collection with the maps sized.
func spec(opts Options) (*ebpf.CollectionSpec, error) {
	s, err := loadRunqlat()
	if err != nil {
		return nil, err
	}
	s.Maps[runqlatMapWatched].MaxEntries = uint32(opts.MaxCgroups)
	s.Maps[runqlatMapHists].MaxEntries = uint32(opts.MaxCgroups)
	return s, nil
}

func loadBTF(opts Options) (*Probe, error) {
	var progOpts ebpf.ProgramOptions
	if opts.KernelBTF == "" {
		// The library reads it itself (and caches it); only look for it here
		// to give a clear error.
		if _, err := os.Stat(DefaultKernelBTF); err != nil {
			return nil, noBTF(err)
		}
	} else {
		kt, err := btf.LoadSpec(opts.KernelBTF)
		if err != nil {
			return nil, noBTF(err)
		}
		progOpts.KernelTypes = kt
	}
	s, err := spec(opts)
	if err != nil {
		return nil, fmt.Errorf("runqlat tp_btf: %w", err)
	}
	var objs struct {
		Watched   *ebpf.Map     `ebpf:"watched"`
		Hists     *ebpf.Map     `ebpf:"hists"`
		Starts    *ebpf.Map     `ebpf:"starts"`
		Wakeup    *ebpf.Program `ebpf:"tp_btf_sched_wakeup"`
		WakeupNew *ebpf.Program `ebpf:"tp_btf_sched_wakeup_new"`
		Switch    *ebpf.Program `ebpf:"tp_btf_sched_switch"`
	}
	if err := s.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: progOpts}); err != nil {
		if errors.Is(err, btf.ErrNotSupported) {
			return nil, noBTF(err)
		}
		return nil, classify(fmt.Errorf("runqlat tp_btf: loading: %w", err))
	}
	p := newProbe(ModeBTF, objs.Watched, objs.Hists)
	// Links go first in closers: detach before the programs and maps close.
	for _, prog := range []*ebpf.Program{objs.Wakeup, objs.WakeupNew, objs.Switch} {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			p.closeAll(objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts)
			return nil, classify(fmt.Errorf("runqlat tp_btf: attaching %s: %w", prog, err))
		}
		p.closers = append(p.closers, l)
	}
	p.closers = append(p.closers, objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts, objs.Watched, objs.Hists)
	return p, nil
}

func loadTracepoint(opts Options) (*Probe, error) {
	root, err := tracefsRoot(opts.TracefsRoot)
	if err != nil {
		return nil, err
	}
	events := []string{"sched_wakeup", "sched_wakeup_new", "sched_switch"}
	ids := make([]uint64, len(events))
	for i, ev := range events {
		if ids[i], err = tracepointID(root, "sched", ev); err != nil {
			return nil, err
		}
	}
	s, err := spec(opts)
	if err != nil {
		return nil, fmt.Errorf("runqlat tracepoint: %w", err)
	}
	var objs struct {
		Watched   *ebpf.Map     `ebpf:"watched"`
		Hists     *ebpf.Map     `ebpf:"hists"`
		Starts    *ebpf.Map     `ebpf:"starts"`
		Tidcg     *ebpf.Map     `ebpf:"tidcg"`
		Wakeup    *ebpf.Program `ebpf:"tp_sched_wakeup"`
		WakeupNew *ebpf.Program `ebpf:"tp_sched_wakeup_new"`
		Switch    *ebpf.Program `ebpf:"tp_sched_switch"`
	}
	if err := s.LoadAndAssign(&objs, nil); err != nil {
		return nil, classify(fmt.Errorf("runqlat tracepoint: loading: %w", err))
	}
	p := newProbe(ModeTracepoint, objs.Watched, objs.Hists)
	progs := []*ebpf.Program{objs.Wakeup, objs.WakeupNew, objs.Switch}
	for i, prog := range progs {
		a, err := attachTracepoint(ids[i], prog)
		if err != nil {
			p.closeAll(objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts, objs.Tidcg)
			return nil, classify(fmt.Errorf("runqlat tracepoint: attaching sched/%s: %w", events[i], err))
		}
		p.closers = append(p.closers, a)
	}
	p.closers = append(p.closers, objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts, objs.Tidcg,
		objs.Watched, objs.Hists)
	return p, nil
}

func newProbe(mode Mode, watched, hists *ebpf.Map) *Probe {
	return &Probe{
		mode: mode, watched: watched, hists: hists,
		groups: map[uint64]uint64{},
		raw:    make([]byte, rawHistogramSize),
	}
}

// closeAll closes what a failed load made: the links so far, then extra.
func (p *Probe) closeAll(extra ...io.Closer) {
	for _, c := range append(p.closers, extra...) {
		_ = c.Close()
	}
	_ = p.watched.Close()
	_ = p.hists.Close()
}

// classify wraps err in ErrPermission when the kernel said EPERM.
func classify(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w: %w", ErrPermission, err)
	}
	return err
}

func noBTF(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, btf.ErrNotSupported) {
		return fmt.Errorf("runqlat tp_btf: %w: %w", ErrNoBTF, err)
	}
	return fmt.Errorf("runqlat tp_btf: reading kernel BTF: %w", err)
}

// Attach is the mode the probe runs in: ModeBTF or ModeTracepoint.
func (p *Probe) Attach() Mode { return p.mode }

// Watch counts the run-queue delay of the tasks in cgroup id, and in each of
// children, into id's histogram. A pod's tasks run in its containers'
// cgroups, not in the pod cgroup itself: pass those as children (calling
// Watch again adds more; the histogram is kept). Ids are cgroup v2 ids
// (CgroupID). A child that has a histogram of its own must be unwatched
// first (ErrInvalid). Fails with ErrFull past Options.MaxCgroups.
func (p *Probe) Watch(id uint64, children ...uint64) error {
	if id == 0 {
		return fmt.Errorf("runqlat: watch cgroup id 0: %w", ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("runqlat: watch: %w", os.ErrClosed)
	}
	if key, ok := p.groups[id]; ok && key != id {
		return fmt.Errorf("runqlat: cgroup %d is counted into %d: %w", id, key, ErrInvalid)
	}
	for _, c := range children {
		if c == 0 {
			return fmt.Errorf("runqlat: watch child cgroup id 0: %w", ErrInvalid)
		}
		if key, ok := p.groups[c]; ok && key == c && c != id {
			return fmt.Errorf("runqlat: child cgroup %d has its own histogram: %w", c, ErrInvalid)
		}
	}
	// The histogram first, so no delay of a watched task is dropped. The
	// programs never create one.
	clear(p.raw)
	if err := p.hists.Update(id, p.raw, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return mapErr("creating histogram of cgroup", id, err)
	}
	for _, c := range append([]uint64{id}, children...) {
		if err := p.watched.Update(c, id, ebpf.UpdateAny); err != nil {
			return mapErr("watching cgroup", c, err)
		}
		p.groups[c] = id
	}
	return nil
}

// Unwatch stops counting cgroup id. When id has a histogram (it was passed to
// Watch first), the histogram and every child counted into it go too; a
// child alone stops counting and its delays so far stay in the parent's
// histogram. Unwatching an id not watched does nothing.
func (p *Probe) Unwatch(id uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("runqlat: unwatch: %w", os.ErrClosed)
	}
	key, ok := p.groups[id]
	if !ok {
		return nil
	}
	drop := []uint64{id}
	if key == id {
		for c, k := range p.groups {
			if k == id && c != id {
				drop = append(drop, c)
			}
		}
	}
	for _, c := range drop {
		if err := p.watched.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return mapErr("unwatching cgroup", c, err)
		}
		delete(p.groups, c)
	}
	if key == id {
		if err := p.hists.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return mapErr("deleting histogram of cgroup", id, err)
		}
	}
	return nil
}

func mapErr(what string, id uint64, err error) error {
	if errors.Is(err, unix.E2BIG) {
		err = fmt.Errorf("%w: %w", ErrFull, err)
	}
	return classify(fmt.Errorf("runqlat: %s %d: %w", what, id, err))
}

// Read replaces dst's contents with the cumulative histogram of every cgroup
// passed to Watch as id (children are in their parent's), counted since
// Watch. Use Histogram.Sub for the delays between two reads.
func (p *Probe) Read(dst map[uint64]Histogram) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(dst)
	if p.closed {
		return fmt.Errorf("runqlat: read: %w", os.ErrClosed)
	}
	for c, key := range p.groups {
		if c != key {
			continue
		}
		if err := p.hists.Lookup(key, p.raw); err != nil {
			return classify(fmt.Errorf("runqlat: reading histogram of cgroup %d: %w", key, err))
		}
		h, err := DecodeHistogram(p.raw)
		if err != nil {
			return err
		}
		dst[key] = h
	}
	return nil
}

// Close detaches the programs and frees the maps. Later calls do nothing.
func (p *Probe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, c := range p.closers {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("runqlat: close: %w", err)
	}
	return nil
}
