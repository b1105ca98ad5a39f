package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
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

// restorer gives pods that left batch kubelet's values back, and retries those it could
// not yet (apply step; the control loop's).
type restorer struct {
	hier    *cgroups.Hierarchy
	metrics *metrics.Agent
	log     *slog.Logger
	// pending are pods that left batch whose kubelet values could not be written yet.
	pending []restore
}

// leaveBatch queues a running batch pod whose class changed for restoring kubelet's
// values, and applies them at once. A pod below the tier cannot leave it (its containers
// were created there); it stays bounded by the tier and is reported.
func (x *restorer) leaveBatch(st *podState, spec podSpec) {
	if st.read.cgroup == "" {
		return // never found: the agent wrote nothing
	}
	if st.read.inTier {
		x.log.Warn("pod is no longer batch but runs below the batch tier; it stays there until it is recreated",
			logAttrsPod(st))
		return
	}
	r := restore{pod: st.key(), cgroup: st.read.cgroup, to: spec.kubelet, memory: st.act.wroteMemory, lowered: st.act.quota.lowered}
	if err := x.applyRestore(r); err != nil {
		x.log.Error("restoring kubelet's cgroup values of a pod that left batch; retrying", logAttrsPod(st), "err", err)
		x.pending = append(x.pending, r)
		return
	}
	x.metrics.Actions.WithLabelValues(metrics.ActionRestoreKubelet).Inc()
	x.log.Info("pod left batch; kubelet's cgroup values restored", logAttrsPod(st))
}

// retry retries the restores that failed, dropping those whose cgroup is gone.
func (x *restorer) retry() {
	if len(x.pending) == 0 {
		return
	}
	kept := x.pending[:0]
	for _, r := range x.pending {
		err := x.applyRestore(r)
		switch {
		case err == nil:
			x.metrics.Actions.WithLabelValues(metrics.ActionRestoreKubelet).Inc()
			x.log.Info("pod left batch; kubelet's cgroup values restored", "pod", r.pod, "cgroup", r.cgroup)
		case !errors.Is(err, cgroups.ErrNotExist):
			kept = append(kept, r)
		}
	}
	clear(x.pending[len(kept):])
	x.pending = kept
}

// applyRestore writes kubelet's values: SCHED_IDLE off first (an idle group refuses
// weight writes), then the weight, the quota over kubelet's period, and the memory limit.
func (x *restorer) applyRestore(r restore) error {
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

// thawAtStartTimeout bounds the start-up thaw: every pass over the kubepods tree, until
// the kernel reports nothing frozen there.
const thawAtStartTimeout = cgroups.DefaultFreezeTimeout

// ThawAtStart thaws every cgroup a previous run of the agent may have left frozen, from
// what cfg says of the node: the cgroup mount (cgroupRoot) and kubelet's --cgroup-root
// (kubeletCgroupRoot). It is the first thing the agent does, before anything that can
// fail (the configuration's validation, API clients, NVML): an agent killed (SIGKILL,
// OOM) while batch was frozen would otherwise leave it frozen until its next freeze
// episode, or for ever if it can no longer start; a frozen v1 task cannot even die.
//
// cfg need not be valid (a crash loop on a bad configuration still thaws): each field it
// reads falls back to the default when unusable. It thaws the whole kubepods tree of
// both kubelet drivers' naming below kubelet's root (cgroupfs "kubepods", systemd
// "kubepods.slice"; below kind's /kubelet "kubelet/kubepods" and
// "kubelet.slice/kubelet-kubepods.slice"): the tier, the pods below it, the in-place
// batch pods in kubelet's own pod cgroups and every child of them, each frozen on its
// own or not, in every freezer the node has (v1 freezer.state, cgroup2 cgroup.freeze).
// It thaws every frozen group it finds there without asking whose pod it is, so that
// no API server is needed: kubelet never freezes a cgroup, so at start any frozen one
// is the agent's. (A container runtime freezes one for a few milliseconds while it
// updates a v1 device list; thawing that early is harmless next to leaving batch
// frozen.) The duty cycle's freezer pin, beside kubepods, is thawed too. It returns the
// groups it found frozen; a tree the node lacks (the other driver's) is skipped.
func ThawAtStart(ctx context.Context, cfg config.Config, log *slog.Logger) ([]string, error) {
	root := cfg.CgroupRoot
	if root == "" {
		root = config.DefaultCgroupRoot
	}
	hier, err := cgroups.Open(root)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup root %s to thaw what a previous run left frozen: %w", root, err)
	}
	kubeletRoot := cfg.KubeletCgroupRoot
	if err := (cgroups.Naming{Driver: cgroups.DriverCgroupfs, Root: kubeletRoot}).Validate(); err != nil {
		log.Warn("kubeletCgroupRoot is unusable; thawing below the default", "kubeletCgroupRoot", kubeletRoot, "err", err)
		kubeletRoot = "/"
	}
	return thawLeftFrozen(ctx, hier, kubeletRoot, log)
}

// thawLeftFrozen is ThawAtStart on an open hierarchy.
func thawLeftFrozen(ctx context.Context, hier *cgroups.Hierarchy, kubeletRoot string, log *slog.Logger) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, thawAtStartTimeout)
	defer cancel()
	var (
		thawed []string
		errs   []error
	)
	// The kubepods tree and the freezer pin beside it, as each driver names them below
	// the root. The pin is an empty group: nothing runs in it, but a v1 freezer stays
	// switched on in the kernel while it is frozen.
	var trees []string
	for _, d := range []cgroups.Driver{cgroups.DriverCgroupfs, cgroups.DriverSystemd} {
		lay := layout{naming: cgroups.Naming{Driver: d, Root: kubeletRoot}}
		if lay.naming.Validate() != nil {
			continue // a root this driver cannot name: kubelet cannot have used it
		}
		for _, rel := range []string{lay.kubepods(), lay.freezerPin()} {
			if !slices.Contains(trees, rel) { // with root "/" both drivers' pins are one
				trees = append(trees, rel)
			}
		}
	}
	for _, rel := range trees {
		got, err := hier.ThawTree(ctx, rel)
		thawed = append(thawed, got...)
		if err != nil && !errors.Is(err, cgroups.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	switch {
	case err != nil:
		log.Error("CANNOT THAW cgroups a previous run may have left frozen; batch may stay frozen",
			"thawed", thawed, "err", err)
	case len(thawed) > 0:
		log.Warn("thawed cgroups a previous run of the agent left frozen", "cgroups", thawed)
	}
	return thawed, err
}

// rediscover finds the in-place batch pods a previous run of the agent held: pod cgroups
// below kubelet's QoS cgroups with cpu.idle set, which kubelet never sets on a pod
// cgroup. Their quotas live in the kernel and outlive the agent; until the pod source has
// synced they would stay at whatever the dead agent last wrote, next to a tier already
// bounded at the minimum, so their sum could exceed the budget. They join the pod table
// as batch pods of unknown name and take part in the budget split from the first period;
// they are bounded at minPodCPU at once (the tier at the budget floor); the first sync
// of the pod source names them, restores kubelet's values of those that
// are no longer batch, and forgets those whose pod is gone.
func (a *Agent) rediscover() int {
	found := 0
	for _, q := range []cgroups.KubeQOS{cgroups.QOSGuaranteed, cgroups.QOSBurstable, cgroups.QOSBestEffort} {
		parent := a.layout.qos(q)
		children, err := a.hier.ListChildren(parent)
		if err != nil {
			if !errors.Is(err, cgroups.ErrNotExist) {
				a.log.Warn("listing pod cgroups to rediscover in-place batch pods", "cgroup", parent, "err", err)
			}
			continue
		}
		for _, name := range children {
			uid, ok := a.layout.naming.PodUIDFromDir(q, name)
			if !ok || a.pods[types.UID(uid)] != nil {
				continue
			}
			cg := path.Join(parent, name)
			g, err := a.hier.Load(cg)
			if err != nil {
				continue
			}
			if idle, err := g.Idle(); err != nil || !idle {
				continue
			}
			cands, err := a.layout.podCgroups(qos.ClassBatch, q, types.UID(uid))
			if err != nil {
				continue
			}
			// cgroup is known before the pod is read: a pod the synced source lists as
			// no longer batch gets kubelet's values back (leaveBatch), and a GPU duty
			// cycle's stale freeze on it is thawed at start.
			st := &podState{uid: types.UID(uid), name: "(rediscovered " + name + ")",
				class: qos.ClassBatch, kubeQOS: q, candidates: cands, read: podRead{cgroup: cg}, act: newPodAct()}
			// Bound it at once, like the tier: the first budget needs two samples.
			if err := a.act.boundPod(st, g, a.cfg.MinPodCPU, time.Now()); err != nil {
				a.log.Warn("bounding a rediscovered in-place batch pod", "cgroup", cg, "err", err)
			}
			a.pods[types.UID(uid)] = st
			found++
		}
	}
	if found > 0 {
		a.log.Info("rediscovered in-place batch pods a previous run held; bounding them until the pod source syncs",
			"pods", found)
		a.resort()
	}
	return found
}
