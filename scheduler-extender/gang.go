package extender

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/scheduler-extender/placement"
)

// Gang membership keys of the three dialects the extender understands.
const (
	// LabelPodGroup names the scheduler-plugins (coscheduling) PodGroup of a pod;
	// minMember and scheduleTimeoutSeconds come from the PodGroup object.
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// AnnotationVolcanoGroupName and AnnotationVolcanoGroupNameAlt name a Volcano group.
	AnnotationVolcanoGroupName    = "scheduling.k8s.io/group-name"
	AnnotationVolcanoGroupNameAlt = "scheduling.volcano.sh/group-name"
	// AnnotationVolcanoMinMember is the Volcano group's minimum member count.
	AnnotationVolcanoMinMember = "scheduling.volcano.sh/group-min-member"
	// AnnotationKoordinatorName and AnnotationKoordinatorMinAvailable are Koordinator's lightweight gang protocol.
	AnnotationKoordinatorName         = "gang.scheduling.koordinator.sh/name"
	AnnotationKoordinatorMinAvailable = "gang.scheduling.koordinator.sh/min-available"
	// AnnotationGangState is written by the extender on planned members so that
	// kube-scheduler requeues them (a pod update moves a pod out of the
	// unschedulable queue) and so that people can see the plan.
	AnnotationGangState = "understory.io/gang-state"
)

// Gang dialects.
const (
	DialectPodGroup    = "podgroup"
	DialectVolcano     = "volcano"
	DialectKoordinator = "koordinator"
)

// Gang states reported in /status and metrics.
const (
	GangWaiting       = "waiting"
	GangPlanned       = "planned"
	GangBinding       = "binding"
	GangAdmitted      = "admitted"
	GangUnschedulable = "unschedulable"
	GangInvalid       = "invalid"
)

// MaxGangSize bounds minMember.
const MaxGangSize = 10000

// ErrInvalidGang means a pod's gang annotations or its PodGroup are malformed.
var ErrInvalidGang = errors.New("invalid gang spec")

// errGangBind is the base of every error a gang member's bind returns.
var errGangBind = errors.New("gang bind failed")

// gangRef is what a pod says about its gang.
type gangRef struct {
	key, namespace, name, dialect string
	min                           int   // from the pod's annotation (volcano, koordinator); 0 if absent
	err                           error // malformed annotation
}

// podGang reports the gang a pod belongs to, if any. The scheduler-plugins label
// wins over Volcano, Volcano over Koordinator.
func podGang(pod *corev1.Pod) (gangRef, bool) {
	ref := gangRef{namespace: pod.Namespace}
	minKey := ""
	switch {
	case pod.Labels[LabelPodGroup] != "":
		ref.name, ref.dialect = pod.Labels[LabelPodGroup], DialectPodGroup
	case pod.Annotations[AnnotationVolcanoGroupName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationVolcanoGroupName], DialectVolcano, AnnotationVolcanoMinMember
	case pod.Annotations[AnnotationVolcanoGroupNameAlt] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationVolcanoGroupNameAlt], DialectVolcano, AnnotationVolcanoMinMember
	case pod.Annotations[AnnotationKoordinatorName] != "":
		ref.name, ref.dialect, minKey = pod.Annotations[AnnotationKoordinatorName], DialectKoordinator, AnnotationKoordinatorMinAvailable
	default:
		return ref, false
	}
	ref.key = ref.namespace + "/" + ref.name
	if minKey != "" {
		v, ok := pod.Annotations[minKey]
		if !ok {
			if ref.dialect != DialectVolcano { // Volcano's minMember is its PodGroup's
				ref.err = fmt.Errorf("annotation %s missing: %w", minKey, ErrInvalidGang)
			}
		} else if m, err := ParseMinMember(v); err != nil {
			ref.err = fmt.Errorf("annotation %s: %w", minKey, err)
		} else {
			ref.min = m
		}
	}
	return ref, true
}

// ParseMinMember parses a minimum member count: a decimal integer in 1..MaxGangSize.
func ParseMinMember(s string) (int, error) {
	m, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || m < 1 || m > MaxGangSize {
		return 0, fmt.Errorf("min member %q must be an integer in 1..%d: %w", s, MaxGangSize, ErrInvalidGang)
	}
	return m, nil
}

// reqKey identifies a request shape.
type reqKey struct {
	cpu, mem, bcpu, bmem int64
	num, milli           int
	models               string
}

func keyOf(r placement.Request) reqKey {
	return reqKey{r.CPUMilli, r.MemoryMiB, r.BatchCPUMilli, r.BatchMemoryMiB, r.NumGPU, r.GPUMilli, strings.Join(r.Models, ",")}
}

// gang is the extender's view of one gang.
type gang struct {
	key, namespace, name, dialect string
	members                       map[types.UID]*podEntry
	state                         string
	reason                        string // why it waits (last filter verdict)
	min                           int    // last resolved minMember
	plan                          *gangPlan

	everGen  uint64 // capGen the ever-fits verdict was computed at (0: none)
	everMin  int
	everKey  reqKey
	everCons string // constraints key of the pod it was computed for
	everFits int

	version  uint64       // bumped on every change of a member (keys noFit)
	planning bool         // a member's filter is planning outside the lock
	noFit    planCacheKey // the inputs of the last plan that did not fit (zero: none)
	noFitN   int          // how many members fit in it
}

// gangPlan is a reserved placement for a whole gang.
type gangPlan struct {
	id         uint64
	members    map[types.UID]bool // value: reached bind
	arrived    int
	expires    time.Time
	committing bool
	done       chan struct{} // closed when the plan is finished (bound, failed or expired)
	results    map[types.UID]error
	err        error // whole-plan failure
}

// emit queues an Event on p.
func (s *State) emit(p *podEntry, warning bool, reason, msg string) {
	s.out.event(event{p.namespace, p.name, p.uid, warning, reason, msg})
}

func (s *State) count(ev string) {
	if s.met != nil {
		s.met.GangTransitions.WithLabelValues(ev).Inc()
	}
}

// planSlot is one member's place in a plan.
type planSlot struct {
	p    *podEntry
	node string
	devs []int
}

// planMember is what planning reads of a member: copied under the lock, so that
// planning can run without it.
type planMember struct {
	p    *podEntry // identity only: never read outside the lock
	req  placement.Request
	cons *podConstraints // replaced, never modified, by gangBook.join
}

func planMembersOf(ps []*podEntry) []planMember {
	out := make([]planMember, len(ps))
	for i, p := range ps {
		out[i] = planMember{p: p, req: p.req, cons: p.cons}
	}
	return out
}

// placeAll places members on nodes (cloning a node before its first change) and
// returns the slots of those that fit. meta[i] is the name, labels and taints of
// nodes[i]: a member goes only to nodes its constraints allow, condition taints
// counting or not as conditions says (see podConstraints.allows). It reads only
// its arguments: gang planning runs it without the index lock.
func placeAll(pol placement.Policy, nodes []*placement.Node, meta []*corev1.Node, idx map[string]int, members []planMember, conditions bool) []planSlot {
	order := slices.Clone(members)
	slices.SortStableFunc(order, func(a, b planMember) int {
		return cmp.Or(cmp.Compare(b.req.GPUTotalMilli(), a.req.GPUTotalMilli()), cmp.Compare(b.req.CPUMilli, a.req.CPUMilli))
	})
	cloned := make(map[int]bool)
	allowed := make(map[string][]int) // constraints key → indices of the nodes they allow
	cand := make([]*placement.Node, 0, len(nodes))
	var slots []planSlot
	for _, m := range order {
		key := m.cons.cacheKey()
		ix, ok := allowed[key]
		if !ok {
			ix = []int{}
			for i := range nodes {
				if m.cons.allows(meta[i], conditions) {
					ix = append(ix, i)
				}
			}
			allowed[key] = ix
		}
		cand = cand[:0]
		for _, i := range ix {
			cand = append(cand, nodes[i]) // after clones: nodes[i] is the current copy
		}
		best, devs, err := placement.Select(pol, cand, m.req, nil)
		if err != nil {
			continue
		}
		i := idx[best.Name]
		if !cloned[i] {
			nodes[i], cloned[i] = nodes[i].Clone(), true
		}
		if nodes[i].Place(m.req, devs) != nil {
			continue
		}
		slots = append(slots, planSlot{p: m.p, node: best.Name, devs: devs})
	}
	return slots
}

// everJob is the "can the gang ever fit" check: how many of minMember members
// (the gang's own requests, padded with the filtered pod's) fit on the whole
// cluster emptied of every pod, each member only on the nodes its node
// selector, required node affinity and tolerations allow (condition taints such
// as not-ready or cordoned do not count: they pass). Its verdict is cached per
// capGen (node set, capacity, labels, taints), minMember, request shape and
// constraints of the filtered pod.
type everJob struct {
	capGen  uint64
	min     int
	key     reqKey
	cons    string
	nodes   []*placement.Node
	meta    []*corev1.Node
	idx     map[string]int
	members []planMember
	fits    int
}

// everCached returns g's cached verdict for minMember and p at capGen, if any.
func (g *gang) everCached(capGen uint64, minMember int, p *podEntry) (int, bool) {
	if g.everGen == capGen && g.everMin == minMember && g.everKey == keyOf(p.req) && g.everCons == p.cons.cacheKey() {
		return g.everFits, true
	}
	return 0, false
}

// newEverJob copies what everJob.run needs from the index's nodes (at
// capacity generation capGen). Call with the index lock held.
func newEverJob(nodes map[string]*nodeEntry, capGen uint64, g *gang, minMember int, p *podEntry) *everJob {
	entries := make([]*nodeEntry, 0, len(nodes))
	for _, e := range nodes {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b *nodeEntry) int { return strings.Compare(a.n.Name, b.n.Name) })
	j := &everJob{capGen: capGen, min: minMember, key: keyOf(p.req), cons: p.cons.cacheKey(),
		nodes: make([]*placement.Node, len(entries)), meta: make([]*corev1.Node, len(entries)),
		idx: make(map[string]int, len(entries))}
	for i, e := range entries {
		n := &placement.Node{Name: e.n.Name, Model: e.n.Model, CPUMilli: e.n.CPUMilli, MemoryMiB: e.n.MemoryMiB, MaxPods: e.n.MaxPods,
			BatchCPUMilli: e.n.BatchCPUMilli, BatchMemoryMiB: e.n.BatchMemoryMiB, GPUFree: make([]int, len(e.n.GPUFree))}
		for d := range n.GPUFree {
			n.GPUFree[d] = placement.MilliPerGPU
		}
		j.nodes[i], j.meta[i], j.idx[n.Name] = n, e.meta, i
	}
	members := make([]*podEntry, 0, minMember)
	for _, m := range sortedMembers(g, p) {
		if m.reqErr == nil && len(members) < minMember {
			members = append(members, m)
		}
	}
	for len(members) < minMember {
		members = append(members, p)
	}
	j.members = planMembersOf(members)
	return j
}

func (j *everJob) run(pol placement.Policy) {
	j.fits = len(placeAll(pol, j.nodes, j.meta, j.idx, j.members, false))
}

// everStore caches j's verdict on g if the cluster's capacity is still at
// capGen, the generation j was taken at.
func (g *gang) everStore(capGen uint64, j *everJob) {
	if capGen == j.capGen {
		g.everGen, g.everMin, g.everKey, g.everCons, g.everFits = j.capGen, j.min, j.key, j.cons, j.fits
	}
}

// sortedMembers lists g's members with first in front, then by creation time and name.
func sortedMembers(g *gang, first *podEntry) []*podEntry {
	out := make([]*podEntry, 0, len(g.members))
	for _, m := range g.members {
		if m != first {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *podEntry) int {
		return cmp.Or(a.created.Compare(b.created), strings.Compare(a.name, b.name))
	})
	return append([]*podEntry{first}, out...)
}

// gangFilterLocked is Filter for a gang member. done=false means the gang is
// already admitted and p is placed like any pod. A non-nil job means the gang
// must be planned: the caller runs job.run without the lock and then
// gangFinishLocked with it. Call with mu held for writing.
func (s *State) gangFilterLocked(p *podEntry, names [][]byte, out filterOutcome) (filterOutcome, bool, *gangJob) {
	g := s.gangs.byKey[p.gang.key]
	minMember, ttl, err, retry := s.gangs.minMember(g, p)
	if err == nil && minMember > s.cfg.MaxGangMembers {
		err = fmt.Errorf("gang %s: minMember %d exceeds this extender's limit of %d (-max-gang-members): %w",
			g.key, minMember, s.cfg.MaxGangMembers, ErrInvalidGang)
	}
	if err != nil {
		if !retry {
			g.state = GangInvalid
		}
		g.reason = err.Error()
		out.failAll(names, err.Error(), !retry)
		return out, true, nil
	}
	g.min = minMember
	bound := g.bound()
	if bound >= minMember && g.plan == nil {
		g.state, g.reason = GangAdmitted, ""
		return out, false, nil
	}
	if g.plan != nil {
		if !g.plan.has(p) {
			out.failAll(names, fmt.Sprintf("gang %s: a plan holds %d other members; waiting for them to bind", g.key, len(g.plan.members)), false)
			return out, true, nil
		}
		s.filterPlannedLocked(g, p, names, &out)
		return out, true, nil
	}
	if g.planning {
		out.failAll(names, fmt.Sprintf("gang %s: another member is planning the gang; retry", g.key), false)
		return out, true, nil
	}
	if s.resumePlanLocked(g, p, minMember) && p.phase == phasePlanned {
		// The plan recorded before a restart holds again: follow it.
		s.filterPlannedLocked(g, p, names, &out)
		return out, true, nil
	}

	need := minMember - bound
	pending := make([]*podEntry, 0, need)
	for _, m := range sortedMembers(g, p) {
		if !m.phase.holds() && m.reqErr == nil && len(pending) < need {
			pending = append(pending, m)
		}
	}
	key := planCacheKey{gen: s.gen, capGen: s.capGen, version: g.version, names: hashNames(s.seed, names), min: minMember, bound: bound,
		trigger: p.uid}
	if key == g.noFit {
		// Nothing the last plan read has changed: it still does not fit.
		return s.gangWaitLocked(g, p, names, out, bound+g.noFitN, minMember, nil), true, nil
	}
	job := &gangJob{g: g, trigger: p, key: key, minMember: minMember, bound: bound, need: need, ttl: ttl,
		policy: s.policy, members: planMembersOf(pending)}
	job.idx = make(map[string]int, len(names))
	for _, b := range names {
		if e, ok := s.nodes[string(b)]; ok {
			if _, dup := job.idx[e.n.Name]; !dup {
				job.idx[e.n.Name] = len(job.nodes)
				job.nodes = append(job.nodes, e.n.Clone())
				job.meta = append(job.meta, e.meta)
			}
		}
	}
	if _, ok := g.everCached(s.capGen, minMember, p); !ok {
		job.ever = newEverJob(s.nodes, s.capGen, g, minMember, p)
	}
	g.planning = true
	return out, true, job
}

// planCacheKey is what a gang plan read: the index generation (every node
// change bumps it), the gang's member version, the candidate names, minMember,
// the bound members and the member being filtered (it goes first).
type planCacheKey struct {
	gen, capGen, version uint64
	names                uint64
	min, bound           int
	trigger              types.UID
}

// hashNames identifies a candidate list.
func hashNames(seed maphash.Seed, names [][]byte) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, b := range names {
		_, _ = h.Write(b)
		_ = h.WriteByte(0)
	}
	return h.Sum64()
}

// gangJob is one gang plan computed without the index lock: copies of the
// candidate nodes and of the pending members' requests, planned greedily
// (largest first) with the serving policy, and, when no cached verdict exists,
// the "can it ever fit" check (everJob).
type gangJob struct {
	g                      *gang
	trigger                *podEntry
	key                    planCacheKey
	minMember, bound, need int
	ttl                    time.Duration
	policy                 placement.Policy
	members                []planMember
	nodes                  []*placement.Node // clones: planning changes them
	meta                   []*corev1.Node
	idx                    map[string]int
	slots                  []planSlot
	ever                   *everJob
}

// run plans the gang. It touches only the job's own copies: call it without the lock.
func (j *gangJob) run() {
	j.slots = placeAll(j.policy, j.nodes, j.meta, j.idx, j.members, true)
	if len(j.slots) < j.need && j.ever != nil {
		j.ever.run(j.policy)
	}
}

// gangFinishLocked commits a planned gang if everything it planned still holds
// (Node.Place re-checks each slot), or records why the gang waits. Call with mu
// held for writing.
func (s *State) gangFinishLocked(j *gangJob, names [][]byte, out filterOutcome) filterOutcome {
	g, p := j.g, j.trigger
	g.planning = false
	out.reset()
	s.gangs.forgetIfEmpty(g) // its last member may have left while it was planned
	if s.gangs.byKey[g.key] != g || s.pods[p.uid] != p || g.plan != nil {
		out.failAll(names, fmt.Sprintf("gang %s changed while it was planned; retry", g.key), false)
		return out
	}
	if len(j.members) == j.need && len(j.slots) == j.need {
		for _, sl := range j.slots {
			if s.pods[sl.p.uid] != sl.p || sl.p.phase.holds() {
				out.failAll(names, fmt.Sprintf("gang %s: a member changed while the gang was planned; retry", g.key), false)
				return out
			}
		}
		if err := s.commitPlan(g, p, j.slots, j.ttl); err != nil {
			out.failAll(names, reasonChangedRetry, false)
			return out
		}
		out.passed = append(out.passed[:0], p.node)
		out.failOthers(names, p.node, fmt.Sprintf("gang %s: member planned on node %s", g.key, p.node))
		return out
	}
	g.noFit, g.noFitN = j.key, len(j.slots)
	return s.gangWaitLocked(g, p, names, out, j.bound+len(j.slots), j.minMember, j.ever)
}

// gangWaitLocked refuses every node for a gang that does not fit now: as never
// fitting (unresolvable) when minMember members cannot fit the empty cluster,
// otherwise as waiting. ever is the check run for this verdict, nil when a cached
// one exists. Call with mu held for writing.
func (s *State) gangWaitLocked(g *gang, p *podEntry, names [][]byte, out filterOutcome, fits, minMember int, ever *everJob) filterOutcome {
	reason := fmt.Sprintf("gang %s: %d/%d members fit", g.key, fits, minMember)
	if len(g.members) < minMember {
		reason += fmt.Sprintf(" (%d of %d members exist)", len(g.members), minMember)
	}
	everFits, ok := g.everCached(s.capGen, minMember, p)
	if !ok && ever != nil {
		g.everStore(s.capGen, ever)
		everFits, ok = ever.fits, true
	}
	if ok && everFits < minMember {
		reason = fmt.Sprintf("gang %s: minMember %d can never fit the cluster (at most %d fit on empty nodes)", g.key, minMember, everFits)
		if g.state != GangUnschedulable {
			s.emit(p, true, "GangUnschedulable", reason)
			s.count("unschedulable")
		}
		g.state, g.reason = GangUnschedulable, reason
		out.failAll(names, reason, true)
		return out
	}
	if g.reason != reason {
		s.emit(p, false, "GangWaiting", reason)
	}
	g.state, g.reason = GangWaiting, reason
	out.failAll(names, reason, false)
	return out
}

// filterPlannedLocked passes a planned member's node only, or releases the
// plan when that node is no longer a candidate for it.
func (s *State) filterPlannedLocked(g *gang, p *podEntry, names [][]byte, out *filterOutcome) {
	node := p.node
	for _, b := range names {
		if string(b) == node {
			out.passed = append(out.passed[:0], node)
		}
	}
	if len(out.passed) == 0 {
		reason := fmt.Sprintf("gang %s: planned node %s is not feasible for member %s; plan released", g.key, node, p.key())
		s.failPlan(g, reason, "plan_broken")
		out.failAll(names, reason, false)
		return
	}
	out.failOthers(names, node, fmt.Sprintf("gang %s: member planned on node %s", g.key, node))
}

func (pl *gangPlan) has(p *podEntry) bool {
	_, ok := pl.members[p.uid]
	return ok
}

// commitPlan reserves every slot for the gang for ttl and records the plan on
// every member (which nudges the others).
func (s *State) commitPlan(g *gang, trigger *podEntry, slots []planSlot, ttl time.Duration) error {
	return s.commitPlanAs(g, trigger, slots, s.gangs.nextPlanID(), s.now().Add(ttl), false)
}

// commitPlanAs reserves every slot as plan id until expires; resumed plans
// (recorded before a restart) are not recorded again.
func (s *State) commitPlanAs(g *gang, trigger *podEntry, slots []planSlot, id uint64, expires time.Time, resumed bool) error {
	plan := &gangPlan{id: id, members: map[types.UID]bool{}, expires: expires,
		done: make(chan struct{}), results: map[types.UID]error{}}
	for i, sl := range slots {
		e := s.nodes[sl.node]
		var err error
		if e == nil {
			err = fmt.Errorf("node %s vanished", sl.node)
		} else {
			err = s.reserve(sl.p, e, sl.devs, phasePlanned)
		}
		if err != nil {
			for _, done := range slots[:i] {
				s.release(done.p)
			}
			return fmt.Errorf("reserving gang %s plan: %w", g.key, err)
		}
		plan.members[sl.p.uid] = false
	}
	g.plan, g.state, g.reason = plan, GangPlanned, ""
	var where []string
	for _, sl := range slots {
		where = append(where, sl.p.name+"→"+sl.node)
		if !resumed {
			s.out.nudge(nudge{sl.p.namespace, sl.p.name, sl.p.uid, formatPlanState(plan.id, sl, plan.expires)})
		}
	}
	verb := "reserves"
	if resumed {
		verb = "resumed after a restart, reserves"
	}
	s.emit(trigger, false, "GangPlanned", fmt.Sprintf("gang %s: plan %d %s %d members until %s: %s",
		g.key, plan.id, verb, len(slots), plan.expires.UTC().Format(time.RFC3339), strings.Join(where, ", ")))
	if !resumed {
		s.count("planned")
	}
	return nil
}

// failPlan releases g's plan: every member that has not been bound is made
// pending and every member waiting at bind is woken with reason.
func (s *State) failPlan(g *gang, reason, metric string) {
	plan := g.plan
	if plan == nil || plan.committing {
		return
	}
	g.plan = nil
	s.gangs.finish(plan.id, plan.expires)
	var any *podEntry
	for uid := range plan.members {
		if m := s.pods[uid]; m != nil {
			any = m
			if m.phase == phasePlanned || m.phase == phaseBinding {
				s.release(m)
			}
		}
	}
	plan.err = fmt.Errorf("gang %s: %s: %w", g.key, reason, errGangBind)
	close(plan.done)
	g.state, g.reason = GangWaiting, reason
	if any != nil {
		s.emit(any, true, "GangPlanReleased", fmt.Sprintf("gang %s: plan %d released: %s", g.key, plan.id, reason))
	}
	s.count(metric)
}

// releasePlanOf fails the plan p is part of, if any.
func (s *State) releasePlanOf(p *podEntry, reason string) {
	if !p.hasGang {
		return
	}
	if g := s.gangs.byKey[p.gang.key]; g != nil && g.plan != nil {
		if _, ok := g.plan.members[p.uid]; ok {
			s.failPlan(g, reason, "plan_broken")
		}
	}
}

// expirePlans fails plans whose TTL passed before every member reached bind.
func (s *State) expirePlans(now time.Time) {
	for _, g := range s.gangs.byKey {
		if pl := g.plan; pl != nil && !pl.committing && now.After(pl.expires) {
			s.failPlan(g, fmt.Sprintf("plan expired with %d/%d members at bind", pl.arrived, len(pl.members)), "plan_expired")
		}
	}
}
