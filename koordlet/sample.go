package koordlet

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the measure step of the control period: every read of the period, into
// one sample: CPU, memory, the batch pods, what the kernel holds (readback.go), and on
// statistics intervals throttling and pressure. Nothing here writes a cgroup.

// sample is what one control period read: the qos.Sample the plan decides from, and what
// the agent records and follows besides.
type sample struct {
	qos.Sample
	// nodeOK: the node's CPU has a rate (false on the agent's first sample).
	nodeOK bool
	// slow: every pod was read this period; newMemory: memory was sampled.
	slow, newMemory bool
	counts          podCounts
	// memory is the last memory sample (as old as Sample.Memory.At).
	memory MemoryUsage
	// windowStart is the previous node CPU sample's time: the window's start.
	windowStart time.Time
	// harm is the harm behind Sample.Harm (signal modes).
	harm signals.Harm
	// ticks counts the sampler's periods, this one included.
	ticks uint64
	// tierDemand is the tier's smoothed usage, which the budget is split by.
	tierDemand demand
	// tierGone: the tier was removed under the agent (recreate it). tierHeld is what the
	// kernel holds on the tier, podsHeld on the batch pods (slow periods; readback.go).
	tierGone bool
	tierHeld heldSettings
	podsHeld []podHeld
	// cgroupChanged: a pod's cgroup changed (the GPU loop's snapshot is stale); reopened
	// are the pods whose cgroup was opened anew this period (none of the limits written
	// on the old one hold there).
	cgroupChanged bool
	reopened      []*podState
	// pressure is the CPU pressure of the tier and the node (statistics intervals).
	pressure pressure
}

// pressure is the CPU pressure stall (PSI "some" avg10, a share of time) of the tier and
// of the node; ok false when unread.
type pressure struct {
	tier, node     float64
	tierOK, nodeOK bool
}

// errNodeCPU: the node's CPU could not be read; the period keeps the last budget.
var errNodeCPU = errors.New("reading node CPU")

// sampler does the control period's reads: the node's CPU, the aggregates (kubepods,
// kubelet's BestEffort cgroup, the tier), the pods, and memory. It keeps the usage
// files open and the rates between periods.
type sampler struct {
	hier     *cgroups.Hierarchy
	layout   layout
	procRoot string
	period   time.Duration
	metrics  *metrics.Agent
	log      *slog.Logger
	source   podLister
	nodeCPU  nodeCPUReader
	nodeRate collect.Rate
	// kubepods, besteffort (kubelet's BestEffort QoS cgroup) and the tier; tierInBE:
	// the tier is inside the BestEffort QoS cgroup.
	kubepods, besteffort, tierUsage aggregate
	tierInBE                        bool
	// tierCores is the tier's usage this period (tierOK: it has a rate); tierDemand
	// the tier's smoothed usage, which the budget is split by.
	tierCores  float64
	tierOK     bool
	tierDemand demand
	// tierGone: the tier was removed under the agent this period.
	tierGone bool
	// tierGroup is the tier, loaded for the read-back and the statistics; tierHeld what
	// it holds this period and podsHeld what the batch pods hold (slow periods;
	// readback.go).
	tierGroup  *cgroups.Group
	tierHeld   heldSettings
	podsHeld   []podHeld
	lastSample time.Time
	ticks      uint64
	// podsChanged: the pod set changed, read every pod next period; cgroupChanged: a
	// pod's cgroup changed this period, and reopened the pods whose cgroup was opened
	// anew.
	podsChanged, cgroupChanged bool
	reopened                   []*podState
	podBuf                     []qos.PodSample
	// batchBuf and batchPods are the sample's batch pods and their table entries,
	// reused.
	batchBuf  []qos.BatchPodSample
	batchPods []*podState
	mem       memoryReader
	// lastStats is when throttling and pressure were last read; tierStats the tier's
	// last CPU statistics.
	lastStats time.Time
	tierStats cpuStats
	// sourceErrors is the pod source's error count at the last period.
	sourceErrors uint64
}

func newSampler(cfg config.Config, hier *cgroups.Hierarchy, lay layout, source podLister, nodeCPU nodeCPUReader,
	m *metrics.Agent, log *slog.Logger) *sampler {
	s := &sampler{hier: hier, layout: lay, procRoot: cfg.ProcRoot, period: cfg.Period.Duration, metrics: m, log: log,
		source: source, nodeCPU: nodeCPU,
		kubepods:   aggregate{path: lay.kubepods()},
		besteffort: aggregate{path: lay.qos(cgroups.QOSBestEffort)},
		tierUsage:  aggregate{path: lay.tier}}
	s.tierInBE = strings.HasPrefix(lay.tier, s.besteffort.path+"/")
	return s
}

// sample reads one period. The budget needs the LS usage every period. It is measured
// from aggregates: kubepods minus kubelet's BestEffort cgroup minus the tier, corrected
// by the few pods whose class does not match where kubelet put them (an LS-annotated
// BestEffort pod, a batch- or BE-annotated Burstable one), which are read every period.
// Whatever else runs in kubepods counts as LS: the safe side. Every other pod is read
// every slowEvery periods: its last sample serves for metrics, status and the demand the
// budget is split by (an average over a second anyway). With 110 pods, a pread per pod
// per period was most of the agent's cost. Without the aggregates (first period, a read
// error), LS pods are read one by one. Memory is read every memoryEvery periods, from
// the second sample on; throttling and pressure every statsInterval. req are the pods'
// requests (the pod table's). It fails (errNodeCPU) only when the node's CPU cannot be
// read.
func (s *sampler) sample(now time.Time, pods []*podState, req qos.Requests) (sample, error) {
	s.ticks++
	s.countSourceErrors()
	times, err := s.nodeCPU.Read()
	if err != nil {
		s.metrics.Errors.WithLabelValues(metrics.ErrKindProcRead).Inc()
		return sample{}, fmt.Errorf("%w: %w", errNodeCPU, err)
	}
	s.tierGone, s.cgroupChanged, s.reopened = false, false, s.reopened[:0]
	out := sample{windowStart: s.lastSample, ticks: s.ticks}
	out.Now, out.Requests = now, req
	s.lastSample = now
	nodeCores, nodeOK := s.nodeRate.Update(now, times.Busy)
	kubepodsCores, kpOK, kpErr := s.kubepods.read(s.hier, now)
	beCores, beOK, _ := s.besteffort.read(s.hier, now)
	s.readTier(now)
	cpu := qos.CPUSample{CPUs: float64(times.CPUs), NodeCores: nodeCores, Kubepods: kubepodsCores, KubepodsOK: kpOK,
		BestEffort: beCores, BestEffortOK: beOK, Tier: s.tierCores, TierOK: s.tierOK, TierInBE: s.tierInBE}
	fastLS := cpu.FastLS()
	out.slow = s.ticks%slowEvery == 1 || s.podsChanged
	s.podsChanged = false
	s.readTierHeld(out.slow)
	s.podsHeld = s.podsHeld[:0]
	if out.slow {
		s.readPodsHeld(pods)
	}
	cpu.Slow = out.slow
	cpu.Pods = s.podBuf[:0]
	for _, st := range pods {
		out.counts.add(st.class)
		mismatched := st.mismatched()
		if out.slow || (fastLS && mismatched) || (!fastLS && st.class == qos.ClassLS) {
			s.readPod(st, now)
		}
		cpu.Pods = append(cpu.Pods, qos.PodSample{Class: st.class, InTier: st.read.inTier, Mismatched: mismatched,
			Fresh: st.read.fresh, Open: st.read.reader != nil, Usage: st.read.usage})
	}
	s.podBuf = cpu.Pods
	out.CPU, out.nodeOK = cpu, nodeOK
	out.tierDemand, out.tierGone, out.tierHeld, out.podsHeld = s.tierDemand, s.tierGone, s.tierHeld, s.podsHeld
	out.cgroupChanged, out.reopened = s.cgroupChanged, s.reopened
	if !nodeOK {
		return out, nil // first sample: rates need two
	}
	// In phase with the slow periods (ticks%slowEvery == 1, slowEvery a multiple of
	// memoryEvery): only a slow memory sample reads the per-pod memory and kubepods' limit.
	out.newMemory = s.ticks%memoryEvery == 1 || !s.mem.ok
	if out.newMemory {
		s.readMemory(pods, req.LSMemory, out.slow, now)
	}
	m := s.mem.last
	out.memory = m
	out.Memory = qos.MemorySample{OK: s.mem.ok, At: s.mem.at, Capacity: m.Capacity, Used: m.Used, LS: m.LS, BE: m.BE,
		System: m.System}
	out.Batch = s.batchRows(pods)
	// Throttling and pressure change slowly and are only exported and told to the pods
	// (Prometheus scrapes every 15-30 s): read every statsInterval, not every period.
	// Reading cpu.stat of every in-place batch pod every second was a third of the
	// agent's work.
	if s.statsDue(now) {
		s.readStats(&out)
	}
	// The first period after kubepods' usage file was (re)opened has no rate yet: system
	// usage would then be the node's minus only the pods read this period, batch
	// included. The budget recovers the next period, but the reclaimer's averages would
	// carry it for tens of seconds, so it skips such a period (not a persistent error:
	// then the fallback is all there is), and the agent's first second, whose samples
	// were seen to count batch as system (`make demo`, in-place phase).
	out.Reclaim = (kpOK || kpErr != nil) && s.ticks > reclaimAfter
	return out, nil
}

// errorCounter is a pod source that counts its failures (list/watch errors, broken
// manifests).
type errorCounter interface{ ErrorCount() uint64 }

// countSourceErrors adds the pod source's new failures to errors_total{kind="pod_source"}.
func (s *sampler) countSourceErrors() {
	c, ok := s.source.(errorCounter)
	if !ok {
		return
	}
	if n := c.ErrorCount(); n > s.sourceErrors {
		s.metrics.Errors.WithLabelValues(metrics.ErrKindPodSource).Add(float64(n - s.sourceErrors))
		s.sourceErrors = n
	}
}

// readTier samples the tier's usage, the demand of the pods below it. A tier removed
// under the agent sets tierGone.
func (s *sampler) readTier(now time.Time) {
	reopen := !s.tierUsage.opened()
	cores, ok, err := s.tierUsage.read(s.hier, now)
	s.tierCores, s.tierOK = cores, ok
	if err != nil {
		s.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupRead).Inc()
		s.tierGone = errors.Is(err, cgroups.ErrNotExist)
		return
	}
	if reopen {
		s.tierDemand = demand{} // a new file: the demand starts over
	}
	if ok {
		s.tierDemand.add(cores, s.period)
	}
}

// readPod samples one pod's CPU usage, opening its cgroup when needed. A missing
// cgroup (pod not started yet, or removed under us) is skipped and looked up again later.
func (s *sampler) readPod(st *podState, now time.Time) {
	st.read.fresh = false
	if len(st.candidates) == 0 {
		return
	}
	if st.read.reader == nil {
		if now.Before(st.read.nextOpen) {
			return
		}
		err := s.openPod(st)
		if err != nil {
			st.lastErr = err
			st.read.nextOpen = now.Add(reopenBackoff)
			if !errors.Is(err, cgroups.ErrNotExist) {
				s.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupRead).Inc()
			}
			return
		}
	}
	if st.class == qos.ClassBatch && !st.read.inTier && !now.Before(st.read.nextOpen) {
		// The NRI plugin puts a batch pod's containers below the tier as they are created,
		// possibly after the agent found the pod's sandbox in kubelet's cgroup: switch.
		st.read.nextOpen = now.Add(reopenBackoff)
		if s.hier.Exists(st.candidates[0]) {
			st.read.close()
			if err := s.openPod(st); err != nil {
				st.lastErr = err
				return
			}
		}
	}
	v, err := st.read.reader.Read()
	if err != nil {
		st.lastErr = err
		if !errors.Is(err, cgroups.ErrNotExist) {
			s.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupRead).Inc()
		}
		s.log.Debug("pod cgroup unreadable; skipping it", "pod", st.key(), "cgroup", st.read.cgroup, "err", err)
		st.read.close()
		st.read.nextOpen = now.Add(reopenBackoff)
		return
	}
	if cores, ok := st.read.rate.Update(now, v); ok {
		st.read.usage, st.read.fresh = cores, true
		st.read.demand.add(cores, now.Sub(st.read.sampledAt))
	}
	st.read.sampledAt = now
}

// openPod finds the first of the pod's candidate cgroups that exists and opens it.
func (s *sampler) openPod(st *podState) error {
	var err error
	for i, cg := range st.candidates {
		var g *cgroups.Group
		if g, err = s.hier.Load(cg); err != nil {
			continue
		}
		r, err := g.UsageReader()
		if err != nil {
			return err
		}
		if st.read.memReader != nil { // of the group this one replaces
			_ = st.read.memReader.Close()
			st.read.memReader = nil
		}
		st.read.group, st.read.reader, st.lastErr = g, r, nil
		s.cgroupChanged = s.cgroupChanged || st.read.cgroup != cg
		st.read.cgroup, st.read.inTier = cg, st.class == qos.ClassBatch && i == 0
		st.read.nextOpen = time.Time{}
		st.read.rate, st.read.demand = collect.Rate{}, demand{}
		s.reopened = append(s.reopened, st)
		return nil
	}
	return err
}

// memory is the node's memory and the working sets of its LS and batch pods, read once
// per node-metrics window (per-pod memory changes slowly; the CPU loop does not read it).
func (s *sampler) memory(pods []*podState) (contract.MemoryMetrics, error) {
	info, err := collect.ReadMemInfo(s.procRoot)
	if err != nil {
		return contract.MemoryMetrics{}, err
	}
	m := contract.MemoryMetrics{Capacity: int64(info.Total), Used: int64(info.Total - min(info.Available, info.Total))}
	for _, st := range pods {
		if st.read.group == nil || (st.class != qos.ClassLS && st.class != qos.ClassBatch) {
			continue
		}
		v, err := st.read.group.MemoryUsage()
		if err != nil {
			continue // no memory controller, or the pod just went: its share stays unknown
		}
		if st.class == qos.ClassLS {
			m.LS += int64(v)
		} else {
			m.Batch += int64(v)
		}
	}
	return m, nil
}

// statsDue reports whether throttling and pressure are due (every statsInterval), and
// starts a new interval if so.
func (s *sampler) statsDue(now time.Time) bool {
	if now.Sub(s.lastStats) < statsInterval {
		return false
	}
	s.lastStats = now
	return true
}

// batchRows are the batch pods as the plan needs them (qos.BatchPodSample), in the
// table's order; batchPods keeps their entries, index-aligned, for readStats.
func (s *sampler) batchRows(pods []*podState) []qos.BatchPodSample {
	rows, entries := s.batchBuf[:0], s.batchPods[:0]
	for _, st := range pods {
		if st.class != qos.ClassBatch {
			continue
		}
		rows = append(rows, qos.BatchPodSample{UID: st.uid, Namespace: st.namespace, Name: st.name,
			InTier: st.read.inTier, Terminating: st.terminating, Priority: st.spec.priority,
			StartTime: st.spec.started, MemoryBytes: int64(st.read.memUsage)})
		entries = append(entries, st)
	}
	s.batchBuf, s.batchPods = rows, entries
	return rows
}

// readStats reads the statistics interval's throttling (the tier's, then each in-place
// batch pod's, into out.Batch) and the CPU pressure of the tier and the node.
func (s *sampler) readStats(out *sample) {
	out.Stats = qos.StatsSample{Due: true, Interval: statsInterval}
	out.Stats.Tier, out.Stats.TierOK = s.addThrottling(&s.tierStats, s.tierGroup)
	for i, st := range s.batchPods {
		if st.read.group != nil && !st.read.inTier {
			out.Batch[i].Throttle, out.Batch[i].ThrottleOK = s.addThrottling(&st.read.stats, st.read.group)
		}
	}
	if s.tierGroup != nil {
		if psi, err := s.tierGroup.Pressure(); err == nil {
			out.pressure.tier, out.pressure.tierOK = psi.Some.Avg10/100, true
		}
	}
	if psi, err := collect.ReadPressure(s.procRoot, "cpu"); err == nil {
		out.pressure.node, out.pressure.nodeOK = psi.Some.Avg10/100, true
	}
}

// addThrottling counts what g was throttled since prev, the first read being the
// baseline; ok is false for that first read (or a failed one).
func (s *sampler) addThrottling(prev *cpuStats, g *cgroups.Group) (qos.Throttling, bool) {
	if g == nil {
		return qos.Throttling{}, false
	}
	st, err := g.Stats()
	if err != nil {
		return qos.Throttling{}, false
	}
	var t qos.Throttling
	ok := prev.valid && st.Throttled >= prev.Throttled && st.NrThrottled >= prev.NrThrottled &&
		st.NrPeriods >= prev.NrPeriods
	if ok {
		s.metrics.BatchThrottled.Add((st.Throttled - prev.Throttled).Seconds())
		s.metrics.BatchPeriods.Add(float64(st.NrThrottled - prev.NrThrottled))
		t = qos.Throttling{Periods: st.NrPeriods - prev.NrPeriods, Throttled: st.NrThrottled - prev.NrThrottled}
	}
	*prev = cpuStats{CPUStats: st, valid: true}
	return t, ok
}

// cpuStats is a cgroup's last read CPU statistics.
type cpuStats struct {
	cgroups.CPUStats
	valid bool
}

// readAll makes the next period read every pod (the pod set changed).
func (s *sampler) readAll() { s.podsChanged = true }

// drop releases the files of a pod the table drops or replaces.
func (s *sampler) drop(st *podState) { st.read.close() }

// reopenBatch loads the cgroup of each batch pod closed after a failed read, so that the
// shutdown reaches the quota it still holds.
func (s *sampler) reopenBatch(pods []*podState) {
	for _, st := range pods {
		if st.class == qos.ClassBatch && st.read.group == nil && st.read.cgroup != "" {
			if g, err := s.hier.Load(st.read.cgroup); err == nil {
				st.read.group = g
			}
		}
	}
}

// lastMemory is the last memory sample (for /status).
func (s *sampler) lastMemory() MemoryUsage { return s.mem.last }

// close releases the sampler's open files.
func (s *sampler) close() {
	s.kubepods.close()
	s.besteffort.close()
	s.tierUsage.close()
	s.mem.close()
}

// demand is a consumer's smoothed CPU usage, what the budget split is based on. One
// period's usage of a quota-limited group is useless for that: the group burns its
// runtime in a burst and then sits throttled, so a period shorter than (or not aligned
// with) the CFS period sees 0 or several times the quota. An exponential average over
// about demandWindow tracks what the group actually gets.
type demand struct {
	v  float64
	ok bool
}

// demandWindow is the time constant of the demand average.
const demandWindow = time.Second

// add folds in usage measured over the last dt.
func (d *demand) add(cores float64, dt time.Duration) {
	if !d.ok {
		d.v, d.ok = cores, true
		return
	}
	alpha := math.Min(1, dt.Seconds()/demandWindow.Seconds())
	d.v += alpha * (cores - d.v)
}

// podCounts counts pods by class.
type podCounts struct{ ls, be, batch int }

func (c *podCounts) add(class qos.Class) {
	switch class {
	case qos.ClassLS:
		c.ls++
	case qos.ClassBE:
		c.be++
	case qos.ClassBatch:
		c.batch++
	}
}

// Sampling cadence.
const (
	// slowEvery is how many periods pass between reads of the pods the budget does not
	// need every period (all but LS pods).
	slowEvery = 10
	// reclaimAfter is how many periods the reclaimer waits after start (one slow
	// period, which reads every pod).
	reclaimAfter = slowEvery + 1
	// statsInterval is how often throttling and pressure are read.
	statsInterval = 10 * time.Second
)

// aggregate samples one cgroup that holds many pods (kubepods, kubelet's BestEffort
// QoS cgroup, the batch tier): one read per period instead of one per pod. It keeps the
// usage file open and reopens it after an error.
type aggregate struct {
	path   string
	reader *cgroups.UsageReader
	rate   collect.Rate
}

// read returns the cgroup's usage in cores over the last period. ok is false on the
// first sample after (re)opening and on any error; err is why the cgroup could not be
// opened or read (wrapping cgroups.ErrNotExist when it is gone). The file is opened
// again next period.
func (g *aggregate) read(h *cgroups.Hierarchy, now time.Time) (cores float64, ok bool, err error) {
	if g.reader == nil {
		cg, err := h.Load(g.path)
		if err != nil {
			return 0, false, err
		}
		if g.reader, err = cg.UsageReader(); err != nil {
			return 0, false, err
		}
		g.rate.Reset()
	}
	v, err := g.reader.Read()
	if err != nil {
		g.close()
		return 0, false, err
	}
	cores, ok = g.rate.Update(now, v)
	return cores, ok, nil
}

// opened reports whether the usage file is open (a read that opens it starts over).
func (g *aggregate) opened() bool { return g.reader != nil }

func (g *aggregate) close() {
	if g.reader != nil {
		_ = g.reader.Close()
		g.reader = nil
	}
}
