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
	// lastSeen is, per device UUID, the newest process-utilisation sample timestamp
	// read (driver microseconds since the Unix epoch); the next scrape asks only for
	// newer samples.
	lastSeen map[string]uint64
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
		lastSeen:  make(map[string]uint64),
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
	for uuid := range c.lastSeen {
		if !seen[uuid] {
			delete(c.lastSeen, uuid) // the device is gone (or unreadable)
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
// healthy full scrape returns that scrape again, Probed; anything else (another list, a
// failing or unsupported listing, no full scrape yet) reads the device in full.
func (c *Collector) scrape(i int, now time.Time, kind Scrape) Device {
	last, ok := c.full[i]
	if kind != ScrapeProbe || !ok || !last.dev.Healthy {
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
	if slices.Equal(c.pidBuf, last.pids) {
		d := last.dev
		d.Probed = true
		return d
	}
	return c.device(i, now, h, running, true)
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
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("reading memory", ret)
	}
	d.MemTotal, d.MemUsed = mem.Total, mem.Used
	util, ret := h.GetUtilizationRates()
	switch ret {
	case nvml.SUCCESS:
		d.Util, d.MemUtil = percent(util.Gpu), percent(util.Memory)
	case nvml.ERROR_NOT_SUPPORTED:
		d.UtilUnsupported = true // MIG mode: per-instance figures only
	default:
		return fail("reading utilisation", ret)
	}
	if !listed {
		running, ret = h.GetComputeRunningProcesses()
		switch ret {
		case nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED:
		default:
			return fail("listing compute processes", ret)
		}
	}
	samples, ret := c.processSamples(h, d.UUID, now)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		d.UtilUnsupported = true
	default:
		return fail("reading process utilisation", ret)
	}
	d.Processes = c.processes(running, samples, now)
	return d, running
}

// processSamples returns the newest utilisation sample of each process on the
// device since the last scrape, and advances the device's timestamp.
func (c *Collector) processSamples(h nvml.Device, uuid string, now time.Time) (map[uint32]nvml.ProcessUtilizationSample, nvml.Return) {
	since := c.lastSeen[uuid]
	if !now.IsZero() {
		if floor := now.Add(-processSampleWindow).UnixMicro(); floor > 0 && uint64(floor) > since {
			since = uint64(floor)
		}
	}
	raw, ret := h.GetProcessUtilization(since)
	switch {
	case ret == nvml.SUCCESS:
	case ret == nvml.ERROR_NOT_FOUND:
		// No sample newer than since: nothing ran, or the driver has not sampled yet.
		return nil, nvml.SUCCESS
	case ret == nvml.ERROR_INSUFFICIENT_SIZE && len(raw) == 0:
		// go-nvml returns this when the driver counted zero samples.
		return nil, nvml.SUCCESS
	default:
		return nil, ret
	}
	latest := make(map[uint32]nvml.ProcessUtilizationSample, len(raw))
	newest := c.lastSeen[uuid]
	for _, s := range raw {
		if s.Pid == 0 {
			continue
		}
		if old, ok := latest[s.Pid]; !ok || s.TimeStamp >= old.TimeStamp {
			latest[s.Pid] = s
		}
		newest = max(newest, s.TimeStamp)
	}
	c.lastSeen[uuid] = newest
	return latest, nvml.SUCCESS
}

// processes merges the running compute processes (memory) with the utilisation
// samples (a process the driver sampled may have stopped computing, or exited,
// since) into one entry per PID, sorted by PID, each attributed to its pod.
func (c *Collector) processes(running []nvml.ProcessInfo, samples map[uint32]nvml.ProcessUtilizationSample,
	now time.Time) []Process {
	if len(running) == 0 && len(samples) == 0 {
		return nil
	}
	byPID := make(map[uint32]*Process, len(running)+len(samples))
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
	for pid, s := range samples {
		p := get(pid)
		p.SMUtil, p.MemUtil = percent(s.SmUtil), percent(s.MemUtil)
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
// from its cgroup. A process using several GPUs is read once per scrape.
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
	if serr == nil && cached && a.kept && a.start == start {
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
	// A process never moves to another pod: its pod (or none) holds for its life,
	// unless the read failed otherwise, or there is no start time to tell the process
	// by (it exited): then the entry serves only this scrape. Read after the start
	// time, a PID reused in between is misattributed for this scrape only: the next
	// one sees another start time.
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
