package koordlet

import (
	"context"
	"errors"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// This file is the actuator's freezer: it freezes and thaws the tier and the in-place
// batch pods as the plan's freezer entries say (qos.Plan.Freezes, from the escalation),
// and thaws what it froze when a pod leaves and when the agent stops.

// freezeTimeout bounds one freeze or thaw in the control loop: a task stuck in
// uninterruptible sleep keeps a v1 freezer FREEZING; the loop must go on.
const freezeTimeout = 50 * time.Millisecond

// applyFreezes makes the plan's freezer writes in its order. A group that fails keeps
// its state, and the next plan asks again.
func (x *actuator) applyFreezes(p qos.Plan) {
	if d := p.Escalation; d.Froze {
		x.log.Info("LS leaves batch nothing; freezing batch", "starved_for", d.StarvedFor.Duration)
	} else if d.Thawed {
		x.log.Info("LS left room again; thawing batch")
	}
	for _, f := range p.Freezes {
		switch f.Kind {
		case qos.TargetTier:
			if x.tier != nil && x.freeze(x.tier, f.Freeze) {
				x.tierFrozen = f.Freeze
			}
		case qos.TargetInPlacePod:
			if f.Index >= len(x.batch) {
				continue
			}
			// A write that found the cgroup gone this period closed it.
			if st := x.batch[f.Index]; st.read.group != nil && x.freeze(st.read.group, f.Freeze) {
				st.act.frozen = f.Freeze
			}
		}
	}
}

// assumeTierFrozen takes the tier as frozen (the start-up thaw failed): the next plan
// that does not freeze thaws it.
func (x *actuator) assumeTierFrozen() { x.tierFrozen = true }

// freeze freezes or thaws one group within freezeTimeout and reports whether the group
// now counts as in the state asked: a thaw that succeeded, or a freeze that succeeded
// or timed out. A freeze that timed out goes on in the kernel (v2 keeps cgroup.freeze
// 1, v1 stays FREEZING), so it counts as frozen and a thaw, the shutdown's too, reaches it.
func (x *actuator) freeze(g *cgroups.Group, freeze bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	var err error
	if freeze {
		err = g.FreezeContext(ctx)
	} else {
		err = g.ThawContext(ctx)
	}
	if err != nil && !errors.Is(err, cgroups.ErrNotExist) {
		x.metrics.Errors.WithLabelValues(metrics.ErrKindCgroupWrite).Inc()
		x.log.Warn("freezing or thawing batch; retrying next period", "cgroup", g.Path(), "freeze", freeze, "err", err)
	}
	return err == nil || (freeze && !errors.Is(err, cgroups.ErrNotExist))
}

// thawAll thaws the tier and every batch pod the agent froze (shutdown).
func (x *actuator) thawAll(pods []*podState) {
	if x.tier != nil {
		if x.freeze(x.tier, false) {
			x.tierFrozen = false
		}
	}
	for _, st := range pods {
		if st.act.frozen && st.read.group != nil {
			if x.freeze(st.read.group, false) {
				st.act.frozen = false
			}
		}
	}
}

// forget releases a pod the table drops or replaces: a pod the agent froze is thawed (a
// pod that left batch must run). The caller then has the sampler drop its files.
func (x *actuator) forget(st *podState) {
	if st.act.frozen && st.read.group != nil {
		x.freeze(st.read.group, false)
	}
	st.act.frozen = false
}
