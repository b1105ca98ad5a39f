package koordlet

import (
	"math"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// The agent's settings are read back, not remembered. Under kubelet's systemd driver the
// tier and every pod cgroup are units systemd knows (the tier once runc started a scope
// below it), and systemd writes a unit's attributes from its own properties whenever it
// realises the unit and on every daemon-reload: cpu.max "max", cpu.weight 100, cpu.idle
// 0, memory.max "max" for a unit nobody gave properties. An operator may write them too.
// So every period the sampler reads what holds on the tier, and on slow periods on each
// batch pod; a limit found changed is forgotten (the plan writes it again, as after a
// failed write) and a group that lost SCHED_IDLE is set up again.

// heldSettings is what the kernel holds on one group the agent writes.
type heldSettings struct {
	// cpuOK: quota and period were read (quota < 0: unlimited).
	cpuOK         bool
	quota, period time.Duration
	// idleOK: idle was read (a kernel without cpu.idle leaves it false).
	idleOK, idle bool
	// memOK: memMax was read (< 0: unlimited).
	memOK  bool
	memMax int64
	// freezeOK: freezeAsked was read (the group asks to be frozen).
	freezeOK, freezeAsked bool
}

// readHeld reads g's CPU limit, cpu.idle and, with memory, its memory limit, with
// freezer its freezer request. Errors leave the field unread: nothing is concluded from
// a failed read.
func readHeld(g *cgroups.Group, memory, freezer bool) heldSettings {
	var h heldSettings
	if q, p, err := g.CPULimit(); err == nil {
		h.cpuOK, h.quota, h.period = true, q, p
	}
	if idle, err := g.Idle(); err == nil {
		h.idleOK, h.idle = true, idle
	}
	if memory {
		if m, _, err := g.MemoryLimit(); err == nil {
			h.memOK, h.memMax = true, m
		}
	}
	if freezer {
		if f, err := g.FreezeRequested(); err == nil {
			h.freezeOK, h.freezeAsked = true, f
		}
	}
	return h
}

// podHeld is one batch pod's read-back.
type podHeld struct {
	st   *podState
	held heldSettings
}

// readTierHeld reads the tier's settings every period (its memory limit on slow periods).
func (s *sampler) readTierHeld(slow bool) {
	s.tierHeld = heldSettings{}
	if s.tierGroup == nil {
		g, err := s.hier.Load(s.layout.tier)
		if err != nil {
			return
		}
		s.tierGroup = g
	}
	s.tierHeld = readHeld(s.tierGroup, slow, true)
	if !s.tierHeld.cpuOK {
		s.tierGroup = nil // gone or unreadable: look it up again next period
	}
}

// readPodsHeld reads every open batch pod's settings (slow periods only).
func (s *sampler) readPodsHeld(pods []*podState) {
	s.podsHeld = s.podsHeld[:0]
	for _, st := range pods {
		if st.read.group == nil || st.class != qos.ClassBatch {
			continue
		}
		s.podsHeld = append(s.podsHeld, podHeld{st: st, held: readHeld(st.read.group, st.spec.batchMemory > 0, false)})
	}
}

// cpuDiffers reports whether the held limit is not what s records as written.
func cpuDiffers(h heldSettings, s *cpuState, want func(float64) time.Duration, period time.Duration) bool {
	if !h.cpuOK || math.IsNaN(s.Cores) || s.Clamped > 0 {
		return false
	}
	w := want(s.Cores)
	if w < 0 {
		return h.quota >= 0
	}
	return h.quota != w || h.period != period
}

// memDiffers reports whether the held memory limit is not what s records as written.
func memDiffers(h heldSettings, s *memState) bool {
	if !h.memOK || math.IsNaN(s.Bytes) {
		return false
	}
	if s.Bytes < 0 {
		return h.memMax >= 0
	}
	// The kernel rounds a limit down to its page size.
	return h.memMax < 0 || math.Abs(float64(h.memMax)-s.Bytes) > memReadBackSlack
}

// memReadBackSlack is more than any page size a kernel rounds a memory limit to.
const memReadBackSlack = 1 << 20

// reconcileTier forgets the tier's limits the kernel no longer holds and reports whether
// the tier lost SCHED_IDLE (the caller sets it up again). The freezer state is taken from
// the kernel: a tier thawed under the agent (systemd thaws a unit on daemon-reload) is
// frozen again while the escalation still decides so, and a tier asking to be frozen
// that the agent holds thawed (a freeze it lost track of) is thawed by the next decision.
func (x *actuator) reconcileTier(h heldSettings) (lostIdle bool) {
	if x.tier == nil {
		return false
	}
	if h.freezeOK && h.freezeAsked != x.tierFrozen {
		x.log.Warn("the batch tier's freezer state was changed by another writer; following the escalation's decision again",
			"cgroup", x.tierRel, "asked_frozen", h.freezeAsked)
		x.tierFrozen = h.freezeAsked
		x.metrics.Actions.WithLabelValues(metrics.ActionRewritten).Inc()
	}
	if h.idleOK && !h.idle {
		x.metrics.Actions.WithLabelValues(metrics.ActionRewritten).Inc()
		return true
	}
	if cpuDiffers(h, &x.tierCPU, x.policy.Quota, x.policy.CFSPeriod) {
		x.log.Warn("the batch tier's CPU limit was changed by another writer; writing it again",
			"cgroup", x.tierRel, "held", h.quota, "written_cores", x.tierCPU.Cores)
		x.tierCPU.Cores = math.NaN()
		x.metrics.Actions.WithLabelValues(metrics.ActionRewritten).Inc()
	}
	if memDiffers(h, &x.tierMem) {
		x.tierMem.Bytes = math.NaN()
		x.metrics.Actions.WithLabelValues(metrics.ActionRewritten).Inc()
	}
	return false
}

// reconcilePods forgets each batch pod's settings the kernel no longer holds: its quota
// and memory limit are written again by the next plan, an in-place pod that lost
// SCHED_IDLE is set up again.
func (x *actuator) reconcilePods(held []podHeld) {
	for _, p := range held {
		st, h := p.st, p.held
		changed := false
		if cpuDiffers(h, &st.act.quota, x.policy.Quota, x.policy.CFSPeriod) {
			st.act.quota.Cores, changed = math.NaN(), true
		}
		if st.act.wroteMemory && memDiffers(h, &st.act.memory) {
			st.act.memory.Bytes, changed = math.NaN(), true
		}
		if !st.read.inTier && st.act.setUp && h.idleOK && !h.idle {
			st.act.setUp, changed = false, true
		}
		if changed {
			x.log.Warn("a batch pod's limits were changed by another writer; writing them again", logAttrsPod(st))
			x.metrics.Actions.WithLabelValues(metrics.ActionRewritten).Inc()
		}
	}
}
