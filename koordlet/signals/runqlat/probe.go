package runqlat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
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

	// noWake loads the object without the wake-up ring buffer, as on
	// kernels before 5.8 (tests).
	noWake bool
}

// Probe is the loaded and attached BPF program. Its methods are safe for
// concurrent use.
type Probe struct {
	mode    Mode
	watched *ebpf.Map    // cgroup id -> histogram key
	hists   *ebpf.Map    // histogram key -> struct hist
	cfg     *ebpf.Map    // [0]: struct config (the slow-event threshold)
	slow    *ebpf.Map    // [0]: the slow-event count
	slowMem *ebpf.Memory // slow mapped into this process; nil before Linux 5.5
	n       *notifier    // the slow-event wake-up; nil before Linux 5.8
	closers []io.Closer

	mu      sync.Mutex
	closed  bool
	groups  map[uint64]uint64 // mirror of watched
	nhists  int               // entries of hists: the ids in groups that are their own key
	raw     []byte            // Watch's empty histogram
	keys    []uint64          // Read's batch buffers, as long as each other,
	vals    []Histogram       // at least nhists long (one batch takes the whole map)
	one     Histogram         // Read's buffer without batches
	noBatch bool              // the kernel has no batch lookups (before 5.6)
	zero    uint32            // the array maps' only key
	word    [8]byte           // SlowEvents' buffer
	conf    config            // what cfg holds

	attributes bool // slow delays are told batch's or not (see Attributes)
}

// config is the kernel's struct config (bpf/runqlat.c).
type config struct {
	SlowNs    uint64
	BatchOnly uint64
}

// minBatch is the shortest batch buffer Read keeps.
const minBatch = 64

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

// spec is the embedded collection with the maps sized, and the wake-up's maps
// made for it (nil on kernels without ring buffers: the object without them).
func spec(opts Options) (*ebpf.CollectionSpec, *notifier, error) {
	load := loadRunqlat
	wake := !opts.noWake && haveRingbuf()
	if !wake {
		load = loadRunqlatpoll
	}
	s, err := load()
	if err != nil {
		return nil, nil, err
	}
	s.Maps[runqlatMapWatched].MaxEntries = uint32(opts.MaxCgroups)
	s.Maps[runqlatMapHists].MaxEntries = uint32(opts.MaxCgroups)
	// The slow-event count is read every poll: mapped into this process it
	// costs a memory load, not a syscall. Linux 5.5+; older kernels refuse
	// the flag, and SlowEvents looks the count up instead.
	if features.HaveMapFlag(features.BPF_F_MMAPABLE) == nil {
		s.Maps[runqlatMapSlow].Flags |= uint32(features.BPF_F_MMAPABLE)
	}
	if !wake {
		return s, nil, nil
	}
	n, err := newNotifier(s)
	if err != nil {
		return nil, nil, err
	}
	return s, n, nil
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
	attributes, err := hasGroupIdle(progOpts.KernelTypes)
	if err != nil {
		return nil, noBTF(err)
	}
	s, n, err := spec(opts)
	if err != nil {
		return nil, fmt.Errorf("runqlat tp_btf: %w", err)
	}
	var objs struct {
		Watched   *ebpf.Map     `ebpf:"watched"`
		Hists     *ebpf.Map     `ebpf:"hists"`
		Cfg       *ebpf.Map     `ebpf:"cfg"`
		Slow      *ebpf.Map     `ebpf:"slow"`
		Starts    *ebpf.Map     `ebpf:"starts"`
		Wakeup    *ebpf.Program `ebpf:"tp_btf_sched_wakeup"`
		WakeupNew *ebpf.Program `ebpf:"tp_btf_sched_wakeup_new"`
		Switch    *ebpf.Program `ebpf:"tp_btf_sched_switch"`
	}
	err = s.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: progOpts, MapReplacements: n.replacements()})
	if err != nil {
		if n != nil {
			_ = n.close()
		}
		if errors.Is(err, btf.ErrNotSupported) {
			return nil, noBTF(err)
		}
		return nil, classify(fmt.Errorf("runqlat tp_btf: loading: %w", err))
	}
	p := newProbe(ModeBTF, objs.Watched, objs.Hists, objs.Cfg, objs.Slow, n)
	p.attributes = attributes
	// Links go first in closers: detach before the programs and maps close.
	for _, prog := range []*ebpf.Program{objs.Wakeup, objs.WakeupNew, objs.Switch} {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			p.closeAll(objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts)
			return nil, classify(fmt.Errorf("runqlat tp_btf: attaching %s: %w", prog, err))
		}
		p.closers = append(p.closers, l)
	}
	p.closers = append(p.closers, objs.Wakeup, objs.WakeupNew, objs.Switch, objs.Starts, objs.Watched, objs.Hists,
		objs.Cfg, objs.Slow)
	if err := p.startWake(); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("runqlat tp_btf: %w", err)
	}
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
	s, n, err := spec(opts)
	if err != nil {
		return nil, fmt.Errorf("runqlat tracepoint: %w", err)
	}
	var objs struct {
		Watched   *ebpf.Map     `ebpf:"watched"`
		Hists     *ebpf.Map     `ebpf:"hists"`
		Cfg       *ebpf.Map     `ebpf:"cfg"`
		Slow      *ebpf.Map     `ebpf:"slow"`
		Starts    *ebpf.Map     `ebpf:"starts"`
		Tidcg     *ebpf.Map     `ebpf:"tidcg"`
		Wakeup    *ebpf.Program `ebpf:"tp_sched_wakeup"`
		WakeupNew *ebpf.Program `ebpf:"tp_sched_wakeup_new"`
		Switch    *ebpf.Program `ebpf:"tp_sched_switch"`
	}
	if err := s.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: n.replacements()}); err != nil {
		if n != nil {
			_ = n.close()
		}
		return nil, classify(fmt.Errorf("runqlat tracepoint: loading: %w", err))
	}
	p := newProbe(ModeTracepoint, objs.Watched, objs.Hists, objs.Cfg, objs.Slow, n)
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
		objs.Watched, objs.Hists, objs.Cfg, objs.Slow)
	if err := p.startWake(); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("runqlat tracepoint: %w", err)
	}
	return p, nil
}

func newProbe(mode Mode, watched, hists, cfg, slow *ebpf.Map, n *notifier) *Probe {
	p := &Probe{
		mode: mode, watched: watched, hists: hists, cfg: cfg, slow: slow, n: n,
		groups: map[uint64]uint64{},
		raw:    make([]byte, rawHistogramSize),
		keys:   make([]uint64, minBatch),
		vals:   make([]Histogram, minBatch),
	}
	// ErrNotSupported when the map is not mmapable (before Linux 5.5):
	// SlowEvents then looks the count up.
	if mm, err := slow.Memory(); err == nil && mm.Size() >= 8 {
		p.slowMem = mm
	}
	return p
}

// hasGroupIdle says whether the kernel's task groups have cpu.idle (Linux
// 5.15+: struct task_group's idle), from its BTF (nil: the running kernel's).
func hasGroupIdle(kernel *btf.Spec) (bool, error) {
	if kernel == nil {
		var err error
		if kernel, err = btf.LoadKernelSpec(); err != nil {
			return false, err
		}
	}
	var tg *btf.Struct
	switch err := kernel.TypeByName("task_group", &tg); {
	case errors.Is(err, btf.ErrNotFound):
		return false, nil // no CONFIG_CGROUP_SCHED
	case err != nil:
		return false, err
	}
	for _, m := range tg.Members {
		if m.Name == "idle" {
			return true, nil
		}
	}
	return false, nil
}

// Attributes says whether the probe tells batch's slow delays from the rest
// (Histogram.Batch): attached with tp_btf on a kernel with cpu.idle (5.15+),
// where the agent's batch tasks run in idle cgroups. Otherwise Batch counts
// SCHED_IDLE tasks only (tp_btf on older kernels) or every slow delay
// (classic tracepoints), and a reader should not take Batch as the cause.
func (p *Probe) Attributes() bool { return p.attributes }

// closeAll closes what a failed load made: the links so far, then extra.
func (p *Probe) closeAll(extra ...io.Closer) {
	for _, c := range append(p.closers, extra...) {
		_ = c.Close()
	}
	_ = p.watched.Close()
	_ = p.hists.Close()
	_ = p.cfg.Close()
	_ = p.slow.Close()
	if p.n != nil {
		_ = p.n.close()
	}
}

// startWake starts reading the wake-up ring buffer, once the programs are
// attached; the probe then needs Close.
func (p *Probe) startWake() error {
	if p.n == nil {
		return nil
	}
	return p.n.start()
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
	err := p.hists.Update(id, p.raw, ebpf.UpdateNoExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return mapErr("creating histogram of cgroup", id, err)
	}
	if err == nil {
		p.nhists++
		if n := len(p.keys); p.nhists > n {
			// Room for every histogram: a batch shorter than one of the
			// hash's buckets fails (ENOSPC).
			p.keys, p.vals = make([]uint64, 2*n), make([]Histogram, 2*n)
		}
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
		err := p.hists.Delete(id)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return mapErr("deleting histogram of cgroup", id, err)
		}
		if err == nil {
			p.nhists--
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
//
// One batch lookup takes the whole map (Linux 5.6+; one lookup per histogram
// before), into buffers kept between calls. Keys already in dst are
// overwritten in place: a Histogram is too big for a map slot, and a new key
// costs an allocation.
func (p *Probe) Read(dst map[uint64]Histogram) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		clear(dst)
		return fmt.Errorf("runqlat: read: %w", os.ErrClosed)
	}
	n, err := 0, ebpf.ErrNotSupported
	if !p.noBatch {
		n, err = p.readBatch(dst)
		p.noBatch = errors.Is(err, ebpf.ErrNotSupported)
	}
	if p.noBatch {
		n, err = p.readEach(dst)
	}
	if err != nil {
		clear(dst)
		return err
	}
	if len(dst) > n {
		// Keys of cgroups unwatched since dst was filled. Without them
		// dst holds exactly the n keys just read.
		for k := range dst {
			if p.groups[k] != k {
				delete(dst, k)
			}
		}
	}
	return nil
}

// readBatch reads the histogram map into dst in batches (one, with buffers
// at least as long as the map) and says how many it read. The kernel says
// the end with ENOENT, which comes with the last entries.
func (p *Probe) readBatch(dst map[uint64]Histogram) (int, error) {
	var (
		cursor ebpf.MapBatchCursor
		read   int
	)
	for {
		n, err := p.hists.BatchLookup(&cursor, p.keys, p.vals, nil)
		for i := range n {
			// Only what Watch made: a Watch that failed half-way may leave
			// a histogram behind.
			if k := p.keys[i]; p.groups[k] == k {
				dst[k] = p.vals[i]
				read++
			}
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return read, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return 0, err
		case err != nil:
			return 0, classify(fmt.Errorf("runqlat: reading histograms: %w", err))
		case n == 0:
			// Not seen from the kernel; never loop on it.
			return 0, fmt.Errorf("runqlat: reading histograms: batch lookup returned nothing")
		}
	}
}

// readEach reads the histograms one lookup each (kernels before 5.6).
func (p *Probe) readEach(dst map[uint64]Histogram) (int, error) {
	read := 0
	for c, key := range p.groups {
		if c != key {
			continue
		}
		if err := p.hists.Lookup(key, &p.one); err != nil {
			return 0, classify(fmt.Errorf("runqlat: reading histogram of cgroup %d: %w", key, err))
		}
		dst[key] = p.one
		read++
	}
	return read, nil
}

// SetThreshold makes the programs count every delay of a watched task at or
// above d as a slow event (SlowEvents); 0 stops counting. Slow events are the
// cheap gate of a poller: when the count did not move, no watched task
// waited d or more since, and the histograms need not be read. The slow
// delays that took the CPU from batch are also counted per histogram
// (Histogram.Batch).
func (p *Probe) SetThreshold(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("runqlat: slow-event threshold %v: %w", d, ErrInvalid)
	}
	return p.setConfig("the slow-event threshold", func(c *config) { c.SlowNs = uint64(d) })
}

// SetBatchOnly makes SlowEvents and the wake-up (Arm) count only the slow
// delays that took the CPU from batch (Histogram.Batch), when on: a poller
// that acts only on harm batch caused is then not woken by the rest. The
// histograms count every delay either way. With classic tracepoints every
// slow delay counts as batch's, so it changes nothing there.
func (p *Probe) SetBatchOnly(on bool) error {
	return p.setConfig("batch-only slow events", func(c *config) {
		c.BatchOnly = 0
		if on {
			c.BatchOnly = 1
		}
	})
}

func (p *Probe) setConfig(what string, set func(*config)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("runqlat: setting %s: %w", what, os.ErrClosed)
	}
	c := p.conf
	set(&c)
	if err := p.cfg.Update(&p.zero, &c, ebpf.UpdateAny); err != nil {
		return classify(fmt.Errorf("runqlat: setting %s: %w", what, err))
	}
	p.conf = c
	return nil
}

// SlowEvents is the number of delays at or above SetThreshold's threshold
// counted since Load, in any watched cgroup (only batch's after
// SetBatchOnly(true)); it only grows. On Linux 5.5+ it
// is read from memory shared with the kernel (no syscall, no allocation);
// before, with one map lookup.
//
// The kernel counts a delay after adding it to its histogram: a Read after a
// SlowEvents that saw the count move finds every delay that moved it.
func (p *Probe) SlowEvents() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, fmt.Errorf("runqlat: slow events: %w", os.ErrClosed)
	}
	if p.slowMem != nil {
		// An aligned 8-byte copy: one load on amd64 and arm64, not torn.
		if _, err := p.slowMem.ReadAt(p.word[:], 0); err != nil {
			return 0, fmt.Errorf("runqlat: reading slow events: %w", err)
		}
	} else if err := p.slow.Lookup(&p.zero, p.word[:]); err != nil {
		return 0, classify(fmt.Errorf("runqlat: reading slow events: %w", err))
	}
	return binary.NativeEndian.Uint64(p.word[:]), nil
}

// Arm makes the next delay at or above SetThreshold's threshold, in any watched
// cgroup (only batch's after SetBatchOnly(true)), send one value on Wake; the probe disarms itself as it sends, so a
// burst of slow delays wakes the reader once, and the reader re-arms when it
// wants the next. Arming an armed probe does nothing. Without BPF ring buffers
// (before Linux 5.8) it fails with ErrNoWake: poll SlowEvents instead.
//
// Trap: a slow delay between the reader's last look at SlowEvents and Arm
// sends nothing. Look at SlowEvents once more after Arm.
func (p *Probe) Arm() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("runqlat: arm: %w", os.ErrClosed)
	}
	if p.n == nil {
		return fmt.Errorf("runqlat: arm: %w", ErrNoWake)
	}
	return p.n.arm()
}

// Wake receives a value after Arm when a watched task waited at least the
// slow-event threshold (SlowEvents has counted it by then). Values do not
// queue: one pending value stands for any number of wake-ups. It is nil
// without ring buffers (ErrNoWake: a nil channel never receives) and closed
// by Close.
func (p *Probe) Wake() <-chan struct{} {
	if p.n == nil {
		return nil
	}
	return p.n.wake
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
	if p.n != nil {
		// After the programs: nothing writes to the ring any more.
		if err := p.n.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("runqlat: close: %w", err)
	}
	return nil
}
