package koordlet

import (
	"errors"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/qos"
)

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
