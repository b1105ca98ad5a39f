package koordlet

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// MemoryUsage is the node's memory by class, in bytes: the working sets (usage minus
// inactive page cache, as kubelet counts them) of kubelet's aggregates and of the pods
// that do not sit where kubelet put them.
type MemoryUsage struct {
	// Capacity is the memory pods may use: kubepods' memory limit (kubelet sets it to
	// the node's allocatable) when there is one below MemTotal, else MemTotal.
	Capacity float64 `json:"capacity"`
	// Used is what counts against Capacity: kubepods' working set when Capacity is
	// kubepods' limit, else what the node uses (MemTotal − MemAvailable).
	Used  float64 `json:"used"`
	LS    float64 `json:"ls"`
	BE    float64 `json:"be"`
	Batch float64 `json:"batch"`
	// System is what runs outside pods within Capacity: MemTotal − MemAvailable −
	// kubepods, or 0 when Capacity is kubepods' limit (the system lives outside it).
	System float64 `json:"system"`
	// LSRequests is the sum of the LS pods' memory requests.
	LSRequests float64 `json:"lsRequests"`
}

// memoryReader samples the memory figures: the aggregates (kubepods, kubelet's
// BestEffort cgroup, the tier) every memoryEvery periods, the batch pods and the pods
// whose class does not match where kubelet put them on the slow periods.
type memoryReader struct {
	kubepodsLimit float64 // bytes; 0 none; read on slow periods
	last          MemoryUsage
	ok            bool
	at            time.Time // when last was read
	// The aggregates' groups, loaded once and again after an error, and their memory
	// readers (files kept open).
	kubepods, besteffort, tier          *cgroups.Group
	kubepodsMem, besteffortMem, tierMem *cgroups.MemoryReader
	// From the last slow period: the memory of LS pods in kubelet's BestEffort cgroup,
	// of the other pods outside it, and of in-place batch pods (in BestEffort, and all).
	lsInBE, otherOutBE, inPlaceInBE, inPlace float64
}

// memoryEvery is how many control periods pass between two memory samples. Memory is
// measured from three aggregates and /proc/meminfo; every half second (at the default
// period) keeps the tier limit close behind LS memory growth while the agent stays
// within 1 % of a core with 110 pods (every other period cost 0.4 % more).
const memoryEvery = 5

// readMemory samples the node's memory into a.mem (last, ok, at). When the node's
// memory cannot be read the last figures stay; a missing memory controller only leaves
// the per-class figures at 0.
func (a *Agent) readMemory(slow bool, now time.Time) {
	r := &a.mem
	info, err := collect.ReadMemInfo(a.cfg.ProcRoot)
	if err != nil {
		a.metrics.Errors.WithLabelValues(metrics.ErrKindProcRead).Inc()
		a.log.Error("reading node memory; keeping the last memory figures", "err", err)
		return
	}
	if slow || !r.ok {
		r.kubepodsLimit = 0
		if g := a.loadOnce(&r.kubepods, a.layout.kubepods()); g != nil {
			if max, _, err := g.MemoryLimit(); err == nil && max > 0 && uint64(max) < info.Total {
				r.kubepodsLimit = float64(max)
			}
		}
		a.podMemory()
	}
	nodeUsed := float64(info.Total - min(info.Available, info.Total))
	m := MemoryUsage{Capacity: float64(info.Total), Used: nodeUsed}
	kubepods, kpErr := a.groupMemory(&r.kubepods, &r.kubepodsMem, a.layout.kubepods())
	be, beErr := a.groupMemory(&r.besteffort, &r.besteffortMem, a.besteffort.path)
	tier, tierErr := a.groupMemory(&r.tier, &r.tierMem, a.layout.tier)
	if kpErr == nil && beErr == nil && tierErr == nil {
		tierOutsideBE := tier
		if a.tierInBE {
			tierOutsideBE = 0
		}
		m.LS = math.Max(0, kubepods-be-tierOutsideBE-r.otherOutBE+r.lsInBE)
		m.BE = math.Max(0, be-r.lsInBE-r.inPlaceInBE-(tier-tierOutsideBE))
		m.Batch = tier + r.inPlace
		m.System = math.Max(0, nodeUsed-kubepods)
		if r.kubepodsLimit > 0 {
			m.Capacity, m.Used, m.System = r.kubepodsLimit, kubepods, 0
		}
	} else {
		// No memory controller for kubelet's cgroups: everything used counts as LS, the
		// safe side (batch memory is then computed from the node's use alone).
		m.LS = m.Used
	}
	m.LSRequests = a.lsMemRequests
	r.last, r.ok, r.at = m, true, now
}

// loadOnce returns *g, loading rel into it first when it is not loaded; nil when rel
// cannot be loaded (tried again next time).
func (a *Agent) loadOnce(g **cgroups.Group, rel string) *cgroups.Group {
	if *g == nil {
		*g, _ = a.hier.Load(rel)
	}
	return *g
}

// groupMemory is one aggregate's working set in bytes, read through *mr; an error drops
// the loaded group and its reader, so both are opened again next time.
func (a *Agent) groupMemory(g **cgroups.Group, mr **cgroups.MemoryReader, rel string) (float64, error) {
	if *mr == nil {
		if a.loadOnce(g, rel) == nil {
			return 0, fmt.Errorf("loading %s: %w", rel, cgroups.ErrNotExist)
		}
		r, err := (*g).MemoryReader()
		if err != nil {
			*g = nil
			return 0, err
		}
		*mr = r
	}
	v, err := (*mr).Read()
	if err != nil {
		_ = (*mr).Close()
		*g, *mr = nil, nil
		return 0, err
	}
	return float64(v), nil
}

// close releases the aggregates' open memory files.
func (r *memoryReader) close() {
	for _, mr := range []**cgroups.MemoryReader{&r.kubepodsMem, &r.besteffortMem, &r.tierMem} {
		if *mr != nil {
			_ = (*mr).Close()
			*mr = nil
		}
	}
}

// podMemory samples the working set of the pods the aggregates cannot attribute, on slow
// periods: batch pods (eviction candidates, the batch total) and pods of a class other
// than the one kubelet's cgroup implies.
func (a *Agent) podMemory() {
	r := &a.mem
	r.lsInBE, r.otherOutBE, r.inPlaceInBE, r.inPlace = 0, 0, 0, 0
	for _, st := range a.sorted {
		mismatched := !st.inTier && (st.class == qos.ClassLS) == (st.kubeQOS == cgroups.QOSBestEffort)
		if st.group == nil || (st.class != qos.ClassBatch && !mismatched) {
			continue
		}
		if st.memReader == nil {
			r, err := st.group.MemoryReader()
			if err != nil {
				continue // no memory controller, or the pod just went
			}
			st.memReader = r
		}
		v, err := st.memReader.Read()
		if err != nil {
			_ = st.memReader.Close() // opened again next time, if the pod is still there
			st.memReader = nil
			continue
		}
		st.memUsage = float64(v)
		switch {
		case st.class == qos.ClassBatch && st.inTier:
		case st.class == qos.ClassBatch:
			r.inPlace += st.memUsage
			if st.kubeQOS == cgroups.QOSBestEffort {
				r.inPlaceInBE += st.memUsage
			} else {
				r.otherOutBE += st.memUsage
			}
		case st.class == qos.ClassLS:
			r.lsInBE += st.memUsage
		default:
			r.otherOutBE += st.memUsage
		}
	}
}

// Memory limits.
const (
	// memoryHighShare is where a v2 memory.high is put below memory.max: reclaim (and
	// throttling of the allocating task) starts before the OOM killer.
	memoryHighShare = 0.9
	// minTierMemory is the smallest memory limit the tier gets: a few pages of headroom
	// so a cut to "nothing" does not make every batch allocation an OOM kill at once;
	// LS harm beyond that is the eviction path's job.
	minTierMemory = 64 << 20
	// memoryRaiseInterval bounds how often a memory limit is raised.
	memoryRaiseInterval = time.Second
)

// memoryLimitState is a memory limit the agent writes.
type memoryLimitState struct {
	bytes   float64 // in force; NaN unknown
	written time.Time
	// busy is when the kernel last refused a cut (memory in use it could not reclaim);
	// such a cut is retried at most every memoryRaiseInterval.
	busy time.Time
	// err is the last write error, for /status.
	err error
}

// enforceTierMemory applies the tier's memory limit: capacity × threshold − LS usage,
// cut at once, raised past a deadband at most every memoryRaiseInterval.
func (a *Agent) enforceTierMemory(m MemoryUsage, threshold float64, now time.Time) {
	want := math.Max(minTierMemory, math.Min(m.Capacity, m.Capacity*threshold-m.LS))
	a.writeMemoryLimit(a.tier, &a.tierMemory, want, now)
}

// enforcePodMemory gives a batch pod its own understory.io/batch-memory limit.
func (a *Agent) enforcePodMemory(st *podState, now time.Time) {
	if st.spec.batchMemory <= 0 || st.group == nil {
		return
	}
	a.writeMemoryLimit(st.group, &st.memory, float64(st.spec.batchMemory), now)
	st.wroteMemory = st.wroteMemory || !math.IsNaN(st.memory.bytes)
}

// writeMemoryLimit writes want (bytes) as g's memory limit when it is a cut, or a raise
// worth a write. A cut the kernel refuses because the memory is in use keeps the old
// limit and is reported; it is retried at most every memoryRaiseInterval.
func (a *Agent) writeMemoryLimit(g *cgroups.Group, s *memoryLimitState, want float64, now time.Time) {
	cur := s.bytes
	known := !math.IsNaN(cur) && cur > 0
	switch {
	case !known:
	case want < cur:
		if !s.busy.IsZero() && now.Sub(s.busy) < memoryRaiseInterval {
			return
		}
	case want-cur < memoryDeadband(cur) || now.Sub(s.written) < memoryRaiseInterval:
		return
	}
	max := int64(want)
	if err := g.SetMemoryLimit(max, int64(float64(max)*memoryHighShare)); err != nil {
		s.err = err
		if errors.Is(err, cgroups.ErrBusy) {
			s.busy = now
			a.metrics.Actions.WithLabelValues(metrics.ActionMemoryCutRefused).Inc()
			return
		}
		if !errors.Is(err, cgroups.ErrNotExist) && !errors.Is(err, cgroups.ErrUnsupported) {
			a.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
			a.log.Error("writing memory limit; retrying next period", "cgroup", g.Path(), "err", err)
		}
		s.bytes = nan()
		return
	}
	if known && want < cur {
		a.metrics.Actions.WithLabelValues(metrics.ActionMemoryCut).Inc()
	}
	s.bytes, s.written, s.busy, s.err = float64(max), now, time.Time{}, nil
}

// memoryDeadband is the smallest raise of a memory limit worth a write: 2 % of it, at
// least 16 MiB.
func memoryDeadband(cur float64) float64 { return math.Max(16<<20, 0.02*cur) }
