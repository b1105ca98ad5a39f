//go:build cgo

package gpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// processSampleWindow bounds how old the per-process utilisation samples asked from
// the driver may be when the collector has no newer timestamp of its own (the first
// scrape, or scrapes further apart than this): the driver keeps a buffer of past
// samples, and without the bound a process that exited long ago, or a burst long
// over, would read as current.
const processSampleWindow = 2 * time.Second

// maxDevices bounds the device count NVML may report (the largest servers have 16
// GPUs; MIG instances are not devices here).
const maxDevices = 1024

// Collector reads every GPU through NVML and attributes the GPU processes to pods.
// It is safe for concurrent use (scrapes are serialised).
type Collector struct {
	lib      nvml.Interface
	procRoot string
	log      *slog.Logger

	mu     sync.Mutex
	closed bool
	// samples is, per device UUID, its processes' newest utilisation samples, held
	// between the driver's sampling passes (samplehold.go), and the newest sample
	// timestamp read: the next scrape asks only for newer samples.
	samples map[string]*sampleHold
	// memV1 is, per device UUID, that the driver has no GetMemoryInfo_v2: memory is read
	// with v1, whose used memory includes the driver's reserved memory.
	memV1 map[string]bool
	// unhealthy is, per device index, whether the last scrape found the device
	// unhealthy: health changes are logged once, not every scrape.
	unhealthy map[int]bool
	// attr is each GPU process's pod, kept while the process is on a GPU: a scrape
	// reads the short /proc/<pid>/stat of a process it attributed before, and reads and
	// parses /proc/<pid>/cgroup again only when the start time differs (the PID was
	// reused). Entries of PIDs a scrape did not list are dropped.
	attr    map[uint32]attribution
	scrapes uint64 // Collect count, stamps attribution.seen
	statBuf []byte
	// full is, per device index, the device's last full scrape and the sorted PIDs of
	// its compute processes then: a probe compares the device's current list with them.
	full   map[int]fullScrape
	pidBuf []uint32

	driverOnce sync.Once
	driver     string
}

// fullScrape is one device's last full scrape.
type fullScrape struct {
	dev  Device
	pids []uint32 // sorted, without duplicates
}

// attribution is the cached pod of one process.
type attribution struct {
	start uint64 // the process's start time
	// checked is the scrape time start was last read at; it is read again once
	// attrRecheck has passed.
	checked time.Time
	ref     PodRef // zero: not a pod's, or unreadable
	seen    uint64 // the last scrape that listed the PID
	// kept: the entry holds for later scrapes while start matches; else for its
	// scrape only.
	kept bool
}

var _ Source = (*Collector)(nil)

// Open loads the driver's NVML library (libnvidia-ml.so.1), initialises it and
// returns a Collector over it. Without the library or the driver, or when
// nvmlInit fails, the error wraps ErrNoNVML: GPU features turn off, and the agent
// runs everything else. log may be nil.
func Open(procRoot string, log *slog.Logger) (Source, error) {
	return open(nvml.New(), procRoot, log)
}

// open is Open over any library (tests pass go-nvml's mocks).
func open(lib nvml.Interface, procRoot string, log *slog.Logger) (*Collector, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialising NVML: %w: %w", ErrNoNVML, ret)
	}
	c, err := NewCollector(lib, procRoot)
	if err != nil {
		_ = lib.Shutdown()
		return nil, err
	}
	c.log = log
	n, _ := lib.DeviceGetCount()
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown (" + ret.Error() + ")"
	}
	log.Info("NVML ready", "gpus", n, "driver", driver)
	return c, nil
}

// DriverVersion is the NVIDIA driver's version as NVML reports it (SystemGetDriverVersion,
// asked once: the kernel module's version, read outside any tenant), or "" when NVML
// cannot tell.
func (c *Collector) DriverVersion() string {
	c.driverOnce.Do(func() { c.driver = driverVersion(c.lib) })
	return c.driver
}

// driverVersion asks lib its driver's version; "" on failure (go-nvml's mocks panic
// where the query is not set).
func driverVersion(lib nvml.Interface) (v string) {
	defer func() {
		if recover() != nil {
			v = ""
		}
	}()
	s, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return ""
	}
	return s
}

// NewCollector returns a Collector over lib, which must be initialised (nvmlInit
// done). The Collector takes lib over: Close shuts it down, balancing that Init.
// procRoot is the host's /proc, where GPU processes are attributed to pods.
func NewCollector(lib nvml.Interface, procRoot string) (*Collector, error) {
	if lib == nil {
		return nil, fmt.Errorf("nil NVML library: %w", ErrNoNVML)
	}
	if procRoot == "" {
		return nil, errors.New("GPU collector: empty proc root")
	}
	if _, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w: %w", ErrNoNVML, ret)
	}
	return &Collector{
		lib:       lib,
		procRoot:  procRoot,
		log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		samples:   make(map[string]*sampleHold),
		memV1:     make(map[string]bool),
		unhealthy: make(map[int]bool),
		attr:      make(map[uint32]attribution),
		statBuf:   make([]byte, statBufSize),
		full:      make(map[int]fullScrape),
	}, nil
}

// Collect scrapes every GPU once, each as plan says (see Scrape; nil: every GPU in
// full). A device whose queries fail is reported unhealthy (Err, Fault) and the others
// are still read; the error is only for a scrape that yields nothing: the device count
// failed, the collector is closed, or ctx ended.
func (c *Collector) Collect(ctx context.Context, now time.Time, plan []Scrape) (Sample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Sample{}, fmt.Errorf("GPU collector closed: %w", ErrNoNVML)
	}
	if err := ctx.Err(); err != nil {
		return Sample{}, err
	}
	n, ret := c.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Sample{}, fmt.Errorf("counting GPUs: %w", nvmlErr(ret))
	}
	if n < 0 || n > maxDevices {
		return Sample{}, fmt.Errorf("NVML counts %d GPUs, want 0..%d", n, maxDevices)
	}
	s := Sample{Time: now, Devices: make([]Device, 0, n)}
	c.scrapes++
	seen := make(map[string]bool, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return Sample{}, err
		}
		kind := ScrapeFull
		if i < len(plan) {
			kind = plan[i]
		}
		d := c.scrape(i, now, kind)
		if d.UUID != "" {
			seen[d.UUID] = true
		}
		c.noteHealth(d)
		s.Devices = append(s.Devices, d)
	}
	for uuid := range c.samples {
		if !seen[uuid] {
			delete(c.samples, uuid) // the device is gone (or unreadable)
		}
	}
	for uuid := range c.memV1 {
		if !seen[uuid] {
			delete(c.memV1, uuid)
		}
	}
	for i := range c.unhealthy {
		if i >= n {
			delete(c.unhealthy, i)
		}
	}
	for i := range c.full {
		if i >= n {
			delete(c.full, i)
		}
	}
	// The processes of a probed device are still on it: keep their pods (a process a
	// full scrape listed was attributed, and stamped, above).
	for _, d := range s.Devices {
		if !d.Probed {
			continue
		}
		for _, p := range d.Processes {
			if a, ok := c.attr[p.PID]; ok {
				a.seen = c.scrapes
				c.attr[p.PID] = a
			}
		}
	}
	for pid, a := range c.attr {
		if a.seen != c.scrapes {
			delete(c.attr, pid) // off every GPU: its PID may be reused before it is back
		}
	}
	return s, nil
}

// scrape reads device i as kind says. A probe that finds the PIDs of the device's last
// healthy full scrape returns that scrape again, Probed (ScrapeUtil: with the device's
// utilisation read now, UtilNow); anything else (another list, a failing or unsupported
// listing or utilisation, no full scrape yet) reads the device in full.
func (c *Collector) scrape(i int, now time.Time, kind Scrape) Device {
	last, ok := c.full[i]
	if (kind != ScrapeProbe && kind != ScrapeUtil) || !ok || !last.dev.Healthy {
		return c.device(i, now, nil, nil, false)
	}
	h, ret := c.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return c.device(i, now, nil, nil, false) // reports the failure
	}
	running, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return c.device(i, now, h, nil, false) // not supported, or failing: reported there
	}
	c.pidBuf = sortedPIDs(c.pidBuf[:0], running)
	if !slices.Equal(c.pidBuf, last.pids) {
		return c.device(i, now, h, running, true)
	}
	d := last.dev
	d.Probed = true
	if kind == ScrapeUtil && !d.UtilUnsupported {
		util, ret := h.GetUtilizationRates()
		if ret != nvml.SUCCESS {
			return c.device(i, now, h, running, true) // reports the failure, or reads past it
		}
		d.Util, d.MemUtil, d.UtilNow = percent(util.Gpu), percent(util.Memory), true
	}
	return d
}

// sortedPIDs appends the PIDs of running to buf, sorted, without 0 and duplicates (a
// process on several MIG instances is listed once per instance).
func sortedPIDs(buf []uint32, running []nvml.ProcessInfo) []uint32 {
	for _, r := range running {
		if r.Pid != 0 {
			buf = append(buf, r.Pid)
		}
	}
	slices.Sort(buf)
	return slices.Compact(buf)
}

// device reads device i in full (h, when not nil, is its handle; running, when listed,
// its compute processes, just listed by a probe) and keeps the result for later probes.
// At the first failing query it stops (a lost GPU fails every query, and each can take
// long) and returns what it had, unhealthy.
func (c *Collector) device(i int, now time.Time, h nvml.Device, running []nvml.ProcessInfo, listed bool) Device {
	d, running := c.readDevice(i, now, h, running, listed)
	if d.Healthy {
		last := c.full[i]
		c.full[i] = fullScrape{dev: d, pids: sortedPIDs(last.pids[:0], running)}
	} else {
		delete(c.full, i)
	}
	return d
}

// readDevice is device's reading. It returns the compute processes listed (running
// when listed, else the ones it lists itself).
func (c *Collector) readDevice(i int, now time.Time, h nvml.Device, running []nvml.ProcessInfo,
	listed bool) (Device, []nvml.ProcessInfo) {
	d := Device{Index: i, Healthy: true, ScrapedAt: now}
	fail := func(query string, ret nvml.Return) (Device, []nvml.ProcessInfo) {
		d.Healthy = false
		d.Fault = fmt.Errorf("GPU %d: %s: %w", i, query, nvmlErr(ret))
		d.Err = d.Fault.Error()
		return d, nil
	}
	var ret nvml.Return
	if h == nil {
		if h, ret = c.lib.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
			return fail("getting the handle", ret)
		}
	}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return fail("reading the UUID", ret)
	}
	if d.Model, ret = h.GetName(); ret != nvml.SUCCESS {
		return fail("reading the name", ret)
	}
	if ret = c.readMemory(h, &d); ret != nvml.SUCCESS {
		return fail("reading memory", ret)
	}
	util, ret := h.GetUtilizationRates()
	switch ret {
	case nvml.SUCCESS:
		d.Util, d.MemUtil = percent(util.Gpu), percent(util.Memory)
	case nvml.ERROR_NOT_SUPPORTED:
		d.UtilUnsupported = true // MIG mode: per-instance figures only
	default:
		return fail("reading utilisation", ret)
	}
	canList := true
	if !listed {
		running, ret = h.GetComputeRunningProcesses()
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			canList = false
		default:
			return fail("listing compute processes", ret)
		}
	}
	devIdle := !d.UtilUnsupported && util.Gpu == 0
	samples, ret := c.processSamples(h, d.UUID, now, devIdle)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		d.UtilUnsupported = true
	default:
		return fail("reading process utilisation", ret)
	}
	d.Processes = c.processes(running, canList, samples, now)
	return d, running
}

// readMemory reads the device's memory into d: GetMemoryInfo_v2, whose used memory
// leaves out what the driver reserves (as nvidia-smi shows it; v1 counted it as used,
// 615 MiB more on an H200), else, on drivers without v2, GetMemoryInfo.
func (c *Collector) readMemory(h nvml.Device, d *Device) nvml.Return {
	if !c.memV1[d.UUID] {
		mem, ret := h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			d.MemTotal, d.MemUsed = mem.Total, mem.Used
			return ret
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
			// An older driver: v1, which counts the reserved memory as used.
			c.memV1[d.UUID] = true
			c.log.Info("GPU memory read with NVML v1: used memory includes the driver's reserved memory",
				"gpu", d.Index, "uuid", d.UUID, "v2", ret.Error())
		default:
			return ret
		}
	}
	mem, ret := h.GetMemoryInfo()
	if ret == nvml.SUCCESS {
		d.MemTotal, d.MemUsed = mem.Total, mem.Used
	}
	return ret
}

// processSamples reads the device's per-process utilisation samples newer than the last
// read into its sampleHold and returns the hold: each process's newest sample while it
// is fresh (samplehold.go; devIdle: the device's utilisation read 0). Before the
// driver's next sampling pass can be due it reads nothing new without asking. A read that raced
// the driver (go-nvml panicked, see getProcessUtilization, or answered
// ERROR_INSUFFICIENT_SIZE with samples) is retried once, then read as no newer sample.
func (c *Collector) processSamples(h nvml.Device, uuid string, now time.Time, devIdle bool) (*sampleHold,
	nvml.Return) {
	hold := c.samples[uuid]
	if hold == nil {
		hold = newSampleHold()
		c.samples[uuid] = hold
	}
	since := hold.newest
	if !now.IsZero() {
		if floor := now.Add(-processSampleWindow).UnixMicro(); floor > 0 && uint64(floor) > since {
			since = uint64(floor)
		}
	}
	// Before the next pass can be due, no call: a read of no newer sample.
	var raw []nvml.ProcessUtilizationSample
	ret, err := nvml.SUCCESS, error(nil)
	if hold.due(now) {
		hold.read = now
		raw, ret, err = getProcessUtilization(h, since)
		if raced(raw, ret, err) {
			raw, ret, err = getProcessUtilization(h, since)
		}
	}
	hold.begin()
	switch {
	case raced(raw, ret, err):
		// Twice in a row: no sample this scrape; the held ones stay.
		if err == nil {
			err = fmt.Errorf("GetProcessUtilization: %d samples: %w", len(raw), ret)
		}
		c.log.Warn("GPU process utilisation unread this scrape", "uuid", uuid, "err", err)
		raw = nil
	case ret == nvml.SUCCESS:
	case ret == nvml.ERROR_NOT_FOUND:
		// No sample newer than since: nothing ran, or the driver has not sampled yet.
		raw = nil
	case ret == nvml.ERROR_INSUFFICIENT_SIZE && len(raw) == 0:
		// go-nvml returns this when the driver counted zero samples.
		raw = nil
	case ret == nvml.ERROR_NOT_SUPPORTED:
		hold.clear()
		return hold, ret
	default:
		return hold, ret
	}
	for _, s := range raw {
		if s.TimeStamp > since {
			hold.add(s.Pid, s.SmUtil, s.MemUtil, s.TimeStamp, now)
		}
	}
	hold.end(now, devIdle)
	return hold, nvml.SUCCESS
}

// raced reports whether a GetProcessUtilization read raced the driver's sampling: it
// panicked, or the driver's second answer still said ERROR_INSUFFICIENT_SIZE (with an
// empty list that answer means the driver counted no sample: not a race).
func raced(raw []nvml.ProcessUtilizationSample, ret nvml.Return, err error) bool {
	return err != nil || (ret == nvml.ERROR_INSUFFICIENT_SIZE && len(raw) > 0)
}

// getProcessUtilization is h.GetProcessUtilization, with its panic turned into an error
// wrapping ErrNVMLPanic. go-nvml asks the driver for the sample count, allocates that
// many and reads again; a sample that arrives in between makes the second call return
// ERROR_INSUFFICIENT_SIZE with a larger count, which go-nvml slices its buffer to:
// "slice bounds out of range". Its API offers no way to pass a larger buffer.
func getProcessUtilization(h nvml.Device, since uint64) (raw []nvml.ProcessUtilizationSample, ret nvml.Return,
	err error) {
	defer func() {
		if r := recover(); r != nil {
			raw, ret, err = nil, nvml.ERROR_UNKNOWN, fmt.Errorf("GetProcessUtilization: %w: %v", ErrNVMLPanic, r)
		}
	}()
	raw, ret = h.GetProcessUtilization(since)
	return raw, ret, nil
}

// processes merges the compute processes (memory) with the utilisation samples into one
// entry per PID, sorted by PID, each attributed to its pod. A listed process gets its
// held sample; a process not listed (it may have stopped computing, or exited) appears
// only with a sample this read returned, or, where the driver cannot list processes
// (canList false), while its sample is held.
func (c *Collector) processes(running []nvml.ProcessInfo, canList bool, hold *sampleHold,
	now time.Time) []Process {
	if len(running) == 0 && len(hold.procs) == 0 {
		return nil
	}
	byPID := make(map[uint32]*Process, len(running)+len(hold.procs))
	get := func(pid uint32) *Process {
		p := byPID[pid]
		if p == nil {
			p = &Process{PID: pid}
			byPID[pid] = p
		}
		return p
	}
	for _, r := range running {
		if r.Pid == 0 {
			continue
		}
		p := get(r.Pid)
		// NVML_VALUE_NOT_AVAILABLE (all ones) where the driver cannot tell, e.g.
		// without permission on MIG instances: unknown, counted as 0.
		if r.UsedGpuMemory != math.MaxUint64 {
			p.MemUsed += r.UsedGpuMemory // a process on several MIG instances: summed
		}
	}
	for pid, s := range hold.procs {
		p := byPID[pid]
		if p == nil {
			if canList && !hold.fresh(pid) {
				continue
			}
			p = get(pid)
		}
		p.SMUtil, p.MemUtil = percent(s.sm), percent(s.mem)
	}
	if len(byPID) == 0 {
		return nil
	}
	out := make([]Process, 0, len(byPID))
	for pid, p := range byPID {
		p.Pod = c.attribute(pid, now)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Process) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

// attrRecheck is how often the start time of a process the collector keeps the pod of is
// read again (/proc/<pid>/stat): a fast GPU is read 20 times a second, and one stat read
// per process each time was most of a scrape's cost. A PID is reused only after its
// process exited; a process that exits leaves NVML's lists, and its entry with them, at
// the next scrape. Only an exit and a reuse of its PID by another process on a GPU
// within one scrape period goes unseen, now for up to attrRecheck instead of one scrape.
const attrRecheck = time.Second

// attribute returns the pod of process pid at scrape time now: the cached one while the
// process (its PID and start time, read again every attrRecheck) is the same, else read
// from its cgroup. A process using several GPUs is read once per scrape. The cgroup of a
// process not (fully) attributed, no pod or no container, is read again every
// attrRecheck too: a process may open its CUDA context before the runtime or a launcher
// moves it into its container's cgroup, and it would otherwise stay unattributed for
// its life.
func (c *Collector) attribute(pid uint32, now time.Time) PodRef {
	a, cached := c.attr[pid]
	if cached && a.seen == c.scrapes {
		return a.ref // another GPU of this scrape listed it
	}
	if cached && a.kept {
		if since := now.Sub(a.checked); since >= 0 && since < attrRecheck {
			a.seen = c.scrapes
			c.attr[pid] = a
			return a.ref
		}
	}
	start, serr := processStart(c.procRoot, pid, c.statBuf)
	settled := a.ref.Attributed() && a.ref.ContainerID != ""
	if serr == nil && cached && a.kept && a.start == start && settled {
		a.seen, a.checked = c.scrapes, now
		c.attr[pid] = a
		return a.ref
	}
	ref, err := PodOfPID(c.procRoot, pid)
	if err != nil {
		// Exited, another PID namespace, not a pod: counted, unattributed.
		c.log.Debug("GPU process not attributed to a pod", "pid", pid, "err", err)
		ref = PodRef{}
	}
	// A process never moves to another pod: its pod holds for its life (none, or a pod
	// without its container, only until the next read, attrRecheck later), unless the
	// read failed otherwise, or there is no start time to tell the process by (it
	// exited): then the entry serves only this scrape. Read after the start time, a PID
	// reused in between is misattributed for this scrape only: the next one sees
	// another start time.
	kept := serr == nil && (err == nil || errors.Is(err, ErrNotPod))
	c.attr[pid] = attribution{start: start, checked: now, ref: ref, seen: c.scrapes, kept: kept}
	return ref
}

// noteHealth logs a device's health changes.
func (c *Collector) noteHealth(d Device) {
	was := c.unhealthy[d.Index]
	switch {
	case !d.Healthy && !was:
		c.log.Warn("GPU unhealthy", "gpu", d.Index, "uuid", d.UUID, "err", d.Err,
			"lost", errors.Is(d.Fault, ErrDeviceLost))
	case d.Healthy && was:
		c.log.Info("GPU healthy again", "gpu", d.Index, "uuid", d.UUID)
	}
	c.unhealthy[d.Index] = !d.Healthy
}

// Close shuts NVML down; later Collects fail with ErrNoNVML. Closing twice is a
// no-op.
func (c *Collector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if ret := c.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shutting NVML down: %w", ret)
	}
	return nil
}

// nvmlErr wraps a failed NVML return; a lost GPU also wraps ErrDeviceLost.
func nvmlErr(ret nvml.Return) error {
	if ret == nvml.ERROR_GPU_IS_LOST {
		return fmt.Errorf("%w: %w", ErrDeviceLost, ret)
	}
	return ret
}

// percent converts an NVML utilisation to percent, bounded to 0..100 as NVML
// documents it, so that one bad sample never reads as more than the whole device.
func percent(v uint32) float64 { return float64(min(v, 100)) }
