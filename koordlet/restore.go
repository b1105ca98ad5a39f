package koordlet

import (
	"errors"
	"fmt"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/metrics"
)

// restore is a pod cgroup that stopped being batch (re-annotated LS or BE while
// running) and must get back what kubelet wrote to it: cpu.idle 0, kubelet's weight and
// CFS quota (and memory limit). Until that succeeds it is retried every period: a pod
// left at SCHED_IDLE, the minimum weight and the agent's last quota would starve as LS.
type restore struct {
	pod    string // namespace/name, for logs
	cgroup string
	to     kubeletCgroup
	// memory reports whether the agent may have set a memory limit that kubelet's
	// value must replace.
	memory bool
	// lowered are the descendants (containers) whose CFS limits a v1 cut lowered: their
	// own limits come back after the pod's.
	lowered []cgroups.LoweredLimit
}

// leaveBatch queues a running batch pod whose class changed for restoring kubelet's
// values, and applies them at once. A pod below the tier cannot leave it (its containers
// were created there); it stays bounded by the tier and is reported.
func (x *actuator) leaveBatch(st *podState, spec podSpec) {
	if st.cgroup == "" {
		return // never found: the agent wrote nothing
	}
	if st.inTier {
		x.log.Warn("pod is no longer batch but runs below the batch tier; it stays there until it is recreated",
			logAttrsPod(st))
		return
	}
	r := restore{pod: st.key(), cgroup: st.cgroup, to: spec.kubelet, memory: st.wroteMemory, lowered: st.quota.lowered}
	if err := x.applyRestore(r); err != nil {
		x.log.Error("restoring kubelet's cgroup values of a pod that left batch; retrying", logAttrsPod(st), "err", err)
		x.restores = append(x.restores, r)
		return
	}
	x.metrics.Actions.WithLabelValues(metrics.ActionRestoreKubelet).Inc()
	x.log.Info("pod left batch; kubelet's cgroup values restored", logAttrsPod(st))
}

// retryRestores retries the restores that failed, dropping those whose cgroup is gone.
func (x *actuator) retryRestores() {
	if len(x.restores) == 0 {
		return
	}
	kept := x.restores[:0]
	for _, r := range x.restores {
		err := x.applyRestore(r)
		switch {
		case err == nil:
			x.metrics.Actions.WithLabelValues(metrics.ActionRestoreKubelet).Inc()
			x.log.Info("pod left batch; kubelet's cgroup values restored", "pod", r.pod, "cgroup", r.cgroup)
		case !errors.Is(err, cgroups.ErrNotExist):
			kept = append(kept, r)
		}
	}
	clear(x.restores[len(kept):])
	x.restores = kept
}

// applyRestore writes kubelet's values: SCHED_IDLE off first (an idle group refuses
// weight writes), then the weight, the quota over kubelet's period, and the memory limit.
func (x *actuator) applyRestore(r restore) error {
	g, err := x.hier.Load(r.cgroup)
	if err != nil {
		return err
	}
	if err := g.SetIdle(false); err != nil && !errors.Is(err, cgroups.ErrUnsupported) {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		return fmt.Errorf("clearing cpu.idle: %w", err)
	}
	if err := g.SetCPUShares(r.to.shares); err != nil {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		return fmt.Errorf("restoring weight: %w", err)
	}
	if err := g.SetCPULimit(r.to.quota, kubeletCFSPeriod); err != nil {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		return fmt.Errorf("restoring CFS quota: %w", err)
	}
	if _, err := x.hier.RaiseDescendantCPULimits(r.lowered, r.to.quota, kubeletCFSPeriod); err != nil {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		return fmt.Errorf("restoring the containers' CFS quotas: %w", err)
	}
	if r.memory {
		if err := g.SetMemoryLimit(r.to.memoryLimit, -1); err != nil {
			x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
			return fmt.Errorf("restoring memory limit: %w", err)
		}
	}
	return nil
}
