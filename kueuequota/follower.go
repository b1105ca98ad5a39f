package kueuequota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/kueuequota/quota"
)

// Names the follower reads and writes.
const (
	// LabelFollow selects the ClusterQueues the follower manages (value "true").
	LabelFollow = "understory.io/quota-follower"
	// AnnotationWeight is a ClusterQueue's weight (a positive decimal; default 1).
	AnnotationWeight = "understory.io/quota-weight"
	// LabelEvicted marks a Workload the follower deactivated, to reactivate it
	// once Kueue has evicted it.
	LabelEvicted = contract.LabelQuotaEvicted
	// DefaultFlavor is the component's ResourceFlavor.
	DefaultFlavor = "understory-batch"
)

// Event reasons.
const (
	ReasonQuotaFollowed = "QuotaFollowed"
	ReasonQuotaEvicted  = "QuotaEvicted"
	ReasonQuotaRequeued = "QuotaRequeued"
	ReasonBadWeight     = "QuotaWeightInvalid"
)

// ErrConfig marks an unusable Config.
var ErrConfig = errors.New("invalid kueue quota follower config")

// GVRs of Kueue's storage version.
var (
	clusterQueuesGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
	workloadsGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
)

// Config is the follower's configuration (cmd/kueue-quota's flags).
type Config struct {
	// Resources are the published resources the quotas follow.
	Resources []string
	// Flavor is the ResourceFlavor whose nominalQuota is written.
	Flavor string
	// Interval is the time between passes.
	Interval time.Duration
	// Params damp the quotas (quota.Decide).
	Params quota.Params
	// EvictOverQuota deactivates admitted Workloads when the cohort's
	// reservations exceed the quotas (see the package doc), and reactivates them
	// once Kueue has evicted them.
	EvictOverQuota bool
	// EvictAfter is how long the cohort's reservations must have stayed over the
	// quotas, seen on every pass since, before the follower deactivates anything;
	// then it deactivates at most one Workload per pass. A dip shorter than this (a
	// cordon, a node restarting, one late agent) lowers the quotas at once, so Kueue
	// admits nothing new, but evicts nobody. 0: from the first pass that sees the
	// excess (still one per pass).
	EvictAfter time.Duration
	// MetricsMaxAge and MetricsMaxSkew bound the agent's node-metrics document
	// (contract.NodeMetrics.Fresh): a Node whose document is older than
	// MetricsMaxAge, stamped more than MetricsMaxSkew ahead, or missing, has no live
	// agent and counts 0. The defaults (contract.DefaultMetricsMaxAge,
	// DefaultMetricsMaxSkew) are the scheduler extender's too, so both see the
	// same nodes as live.
	MetricsMaxAge  time.Duration
	MetricsMaxSkew time.Duration
	// Component names the Events' source.
	Component string
}

// DefaultConfig: the four batch resources, flavor understory-batch, a pass every
// 30 s, quota.DefaultParams, eviction on after an excess of 2 min (four
// passes), node-metrics older than 5 min (or 10 s ahead) counted as no agent
// (contract's default bounds, the extender's).
func DefaultConfig() Config {
	return Config{
		Resources:      []string{contract.ResourceBatchCPU, contract.ResourceBatchMemory, contract.ResourceGPUMilli, contract.ResourceGPU},
		Flavor:         DefaultFlavor,
		Interval:       30 * time.Second,
		Params:         quota.DefaultParams(),
		EvictOverQuota: true,
		EvictAfter:     2 * time.Minute,
		MetricsMaxAge:  contract.DefaultMetricsMaxAge,
		MetricsMaxSkew: contract.DefaultMetricsMaxSkew,
		Component:      "understory-kueue-quota",
	}
}

// Validate returns an error wrapping ErrConfig when c is unusable.
func (c Config) Validate() error {
	if len(c.Resources) == 0 {
		return fmt.Errorf("%w: no resources", ErrConfig)
	}
	for _, r := range c.Resources {
		if strings.TrimSpace(r) == "" {
			return fmt.Errorf("%w: an empty resource name", ErrConfig)
		}
	}
	if c.Flavor == "" {
		return fmt.Errorf("%w: no flavor", ErrConfig)
	}
	if c.Interval <= 0 {
		return fmt.Errorf("%w: interval %v must be positive", ErrConfig, c.Interval)
	}
	if c.EvictAfter < 0 {
		return fmt.Errorf("%w: evict-after %v must not be negative", ErrConfig, c.EvictAfter)
	}
	if c.MetricsMaxAge <= 0 {
		return fmt.Errorf("%w: metrics max age %v must be positive", ErrConfig, c.MetricsMaxAge)
	}
	if c.MetricsMaxSkew < 0 {
		return fmt.Errorf("%w: metrics max skew %v must not be negative", ErrConfig, c.MetricsMaxSkew)
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// eventRecorder is the part of record.EventRecorder the follower uses.
type eventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

var _ eventRecorder = record.EventRecorder(nil)

// Follower is the quota follower. Create it with New, then call Run (one replica)
// or RunElected (replicas electing a leader), once.
type Follower struct {
	cfg     Config
	client  kubernetes.Interface
	dyn     dynamic.Interface
	factory informers.SharedInformerFactory
	nodes   listerscorev1.NodeLister
	synced  cache.InformerSynced
	events  eventRecorder
	log     *slog.Logger
	m       *metrics
	now     func() time.Time
	// overSince is when the passes began to see the cohort over its quotas without
	// a break (zero: the last pass saw it within). Only the pass loop touches it: a
	// new leader starts from zero, so it waits EvictAfter again.
	overSince time.Time
}

// New builds a Follower reading Nodes through client and Kueue's objects through
// dyn; metrics go to reg (nil: none), Events to events (nil: none).
func New(client kubernetes.Interface, dyn dynamic.Interface, cfg Config, reg prometheus.Registerer,
	events eventRecorder, log *slog.Logger) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Core().V1().Nodes()
	f := &Follower{
		cfg: cfg, client: client, dyn: dyn, factory: factory, nodes: inf.Lister(), synced: inf.Informer().HasSynced,
		events: events, log: log, m: m, now: time.Now,
	}
	return f, nil
}

// Run starts the Node informer, waits for it, and runs a pass every Interval
// until ctx ends: one replica, no leader election (RunElected is Run among
// replicas). A failed pass is logged and counted; Run returns only when ctx ends
// (nil) or the informer never syncs.
func (f *Follower) Run(ctx context.Context) error {
	f.factory.Start(ctx.Done())
	defer f.factory.Shutdown()
	f.m.leader.Set(1)
	defer f.m.leader.Set(0)
	return f.passes(ctx)
}

// passes waits for the Node informer (started by the caller) and runs a pass
// every Interval until ctx ends.
func (f *Follower) passes(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), f.synced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("node informer did not sync")
	}
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		if err := f.Step(ctx); err != nil && ctx.Err() == nil {
			f.log.Error("quota pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Synced reports whether the Node informer has synced (for a readiness probe).
func (f *Follower) Synced() bool { return f.synced() }

// Step runs one pass (see the package doc). It needs the Node informer synced
// (Run does that). Passes must not overlap: Step keeps the excess's start between
// passes.
func (f *Follower) Step(ctx context.Context) error {
	err := f.step(ctx)
	if err != nil {
		f.m.errors.Inc()
	}
	f.m.lastPass.Set(float64(f.now().Unix()))
	return err
}

// queueState is one followed ClusterQueue as read.
type queueState struct {
	obj      *unstructured.Unstructured
	weight   float64
	current  map[string]int64
	reserved map[string]int64
}

func (f *Follower) step(ctx context.Context) error {
	now := f.now()
	published, err := f.published(now)
	if err != nil {
		return err
	}
	for r, v := range published {
		f.m.published.WithLabelValues(r).Set(float64(v))
	}
	queues, err := f.queues(ctx)
	if err != nil {
		return err
	}
	tenants := make([]quota.Tenant, 0, len(queues))
	for _, q := range queues {
		tenants = append(tenants, quota.Tenant{Name: q.obj.GetName(), Weight: q.weight, Current: q.current})
	}
	decisions, err := quota.Decide(published, tenants, f.cfg.Params)
	if err != nil {
		return err
	}
	var errs []error
	usage := make([]quota.Usage, 0, len(queues))
	for i, d := range decisions {
		q := queues[i]
		for r, v := range d.Target {
			f.m.target.WithLabelValues(d.Name, r).Set(float64(v))
		}
		if d.Changed {
			if err := f.writeQuota(ctx, d.Name, d.Quota); err != nil {
				errs = append(errs, err)
			} else {
				f.m.updates.WithLabelValues(d.Name, direction(d)).Inc()
				f.event(q.obj, corev1.EventTypeNormal, ReasonQuotaFollowed, "%s", describe(d, q.current, published))
				f.log.Info("quota followed", "clusterQueue", d.Name, "change", describe(d, q.current, published))
			}
		}
		for r, v := range d.Quota {
			f.m.nominal.WithLabelValues(d.Name, r).Set(float64(v))
		}
		usage = append(usage, quota.Usage{Name: d.Name, Nominal: d.Quota, Used: q.reserved})
	}
	if f.cfg.EvictOverQuota {
		if f.excessPersisted(quota.Over(usage, f.cfg.Params.EvictTolerance), now) {
			if err := f.evictOverQuota(ctx, usage); err != nil {
				errs = append(errs, err)
			}
		}
		if err := f.requeue(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// excessPersisted records whether this pass sees the cohort over its quotas and
// reports whether the excess has now lasted EvictAfter: the damping that keeps a
// short dip of capacity from evicting admitted work. The quotas still fall at once
// (Kueue admits nothing new meanwhile); only deactivations wait.
func (f *Follower) excessPersisted(over bool, now time.Time) bool {
	if !over {
		f.overSince = time.Time{}
		return false
	}
	if f.overSince.IsZero() {
		f.overSince = now
	}
	return now.Sub(f.overSince) >= f.cfg.EvictAfter
}

// published sums allocatable Config.Resources over the Nodes that count (every
// resource is present, 0 where no Node publishes it).
func (f *Follower) published(now time.Time) (map[string]int64, error) {
	nodes, err := f.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	out := make(map[string]int64, len(f.cfg.Resources))
	for _, r := range f.cfg.Resources {
		out[r] = 0
	}
	for _, n := range nodes {
		if !f.counts(n, now) {
			continue
		}
		for _, r := range f.cfg.Resources {
			if q, ok := n.Status.Allocatable[corev1.ResourceName(r)]; ok && q.Sign() > 0 {
				out[r] += q.Value()
			}
		}
	}
	return out, nil
}

// counts reports whether Node n's batch allocatable counts towards the quotas: it
// is schedulable, Ready (condition Ready True, no unreachable or not-ready taint)
// and its agent's node-metrics document is fresh at now. A dead node, or one whose
// agent stopped, keeps the allocatable it last carried; counting it would hand
// out quota for capacity nobody can run on.
func (f *Follower) counts(n *corev1.Node, now time.Time) bool {
	if n.Spec.Unschedulable {
		return false
	}
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady {
			return false
		}
	}
	m, err := contract.DecodeNodeAnnotations(n.Annotations)
	return err == nil && m.Fresh(now, f.cfg.MetricsMaxAge, f.cfg.MetricsMaxSkew)
}

// queues reads the followed ClusterQueues, sorted by name. A queue with a bad
// weight is left out (Event, error counted).
func (f *Follower) queues(ctx context.Context) ([]queueState, error) {
	l, err := f.dyn.Resource(clusterQueuesGVR).List(ctx, metav1.ListOptions{LabelSelector: LabelFollow + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing ClusterQueues: %w", err)
	}
	items := l.Items
	slices.SortFunc(items, func(a, b unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	out := make([]queueState, 0, len(items))
	for i := range items {
		obj := &items[i]
		w, err := parseWeight(obj.GetAnnotations()[AnnotationWeight])
		if err != nil {
			f.m.errors.Inc()
			f.event(obj, corev1.EventTypeWarning, ReasonBadWeight, "%s: %v; the queue is not followed", AnnotationWeight, err)
			f.log.Warn("ClusterQueue weight invalid, not followed", "clusterQueue", obj.GetName(), "err", err)
			continue
		}
		cur, err := NominalQuotas(obj, f.cfg.Flavor, f.cfg.Resources)
		if err != nil {
			return nil, fmt.Errorf("ClusterQueue %s: %w", obj.GetName(), err)
		}
		out = append(out, queueState{obj: obj, weight: w, current: cur, reserved: Reservations(obj, f.cfg.Flavor, f.cfg.Resources)})
	}
	return out, nil
}

// ErrWeight marks an unusable weight annotation.
var ErrWeight = errors.New("invalid weight")

func parseWeight(s string) (float64, error) {
	if s == "" {
		return 1, nil
	}
	w, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || w < 0 || w != w || w > 1e9 {
		return 0, fmt.Errorf("%w: %q (want a decimal in [0, 1e9])", ErrWeight, s)
	}
	return w, nil
}

// NominalQuotas returns a ClusterQueue's nominalQuota of resources in flavor, in
// the resources' units (the resources the flavor lists; others are absent).
func NominalQuotas(obj *unstructured.Unstructured, flavor string, resources []string) (map[string]int64, error) {
	out := map[string]int64{}
	var bad error
	forEachFlavorResource(obj.Object, flavor, func(rm map[string]any) {
		name, _ := rm["name"].(string)
		if !slices.Contains(resources, name) {
			return
		}
		q, err := resource.ParseQuantity(fmt.Sprint(rm["nominalQuota"]))
		if err != nil {
			bad = fmt.Errorf("nominalQuota of %s: %w", name, err)
			return
		}
		out[name] = q.Value()
	})
	return out, bad
}

// forEachFlavorResource calls fn with every spec.resourceGroups[].flavors[name ==
// flavor].resources[] entry (maps of obj, so fn may change them).
func forEachFlavorResource(obj map[string]any, flavor string, fn func(map[string]any)) {
	// Not unstructured.NestedSlice: it copies, and fn may change the entries.
	spec, _ := obj["spec"].(map[string]any)
	live, _ := spec["resourceGroups"].([]any)
	for _, rg := range live {
		rgm, _ := rg.(map[string]any)
		flavors, _ := rgm["flavors"].([]any)
		for _, fl := range flavors {
			fm, _ := fl.(map[string]any)
			if fm == nil || fm["name"] != flavor {
				continue
			}
			res, _ := fm["resources"].([]any)
			for _, r := range res {
				if rm, ok := r.(map[string]any); ok {
					fn(rm)
				}
			}
		}
	}
}

// Reservations reads a ClusterQueue's status.flavorsReservation of flavor: the
// total its admitted Workloads reserve of each of resources, in the resource's
// units (batch-cpu: millicores). Resources it does not list, or lists with a
// total that is not a quantity, are left out.
func Reservations(obj *unstructured.Unstructured, flavor string, resources []string) map[string]int64 {
	out := map[string]int64{}
	fr, _, _ := unstructured.NestedSlice(obj.Object, "status", "flavorsReservation")
	for _, f := range fr {
		fm, _ := f.(map[string]any)
		if fm == nil || fm["name"] != flavor {
			continue
		}
		res, _ := fm["resources"].([]any)
		for _, r := range res {
			rm, _ := r.(map[string]any)
			name, _ := rm["name"].(string)
			if !slices.Contains(resources, name) {
				continue
			}
			if q, err := resource.ParseQuantity(fmt.Sprint(rm["total"])); err == nil {
				out[name] = q.Value()
			}
		}
	}
	return out
}

// writeQuota sets the nominalQuota values of quota on ClusterQueue name (read,
// modify, update; retried on conflicts).
func (f *Follower) writeQuota(ctx context.Context, name string, quota map[string]int64) error {
	rc := f.dyn.Resource(clusterQueuesGVR)
	for attempt := 0; ; attempt++ {
		obj, err := rc.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading ClusterQueue %s: %w", name, err)
		}
		forEachFlavorResource(obj.Object, f.cfg.Flavor, func(rm map[string]any) {
			r, _ := rm["name"].(string)
			if v, ok := quota[r]; ok {
				rm["nominalQuota"] = resource.NewQuantity(v, quantityFormat(r)).String()
			}
		})
		_, err = rc.Update(ctx, obj, metav1.UpdateOptions{FieldManager: f.cfg.Component})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			return fmt.Errorf("updating ClusterQueue %s: %w", name, err)
		}
	}
}

func quantityFormat(r string) resource.Format {
	if r == contract.ResourceBatchMemory {
		return resource.BinarySI
	}
	return resource.DecimalSI
}

// evictOverQuota deactivates the first Workload quota.SelectEvictions picks,
// one per pass: the next pass counts again what is still admitted (capacity may
// have come back, Kueue may have evicted or preempted meanwhile) before it takes
// another. Usage is recomputed from the admitted, active Workloads (the queues'
// status may lag behind evictions of the previous pass).
func (f *Follower) evictOverQuota(ctx context.Context, usage []quota.Usage) error {
	l, err := f.dyn.Resource(workloadsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Workloads: %w", err)
	}
	queues := map[string]*quota.Usage{}
	for i := range usage {
		usage[i].Used = map[string]int64{}
		queues[usage[i].Name] = &usage[i]
	}
	byName := map[string]*unstructured.Unstructured{}
	var wls []quota.Workload
	for i := range l.Items {
		w := &l.Items[i]
		qw, ok := f.admitted(w)
		if !ok {
			continue
		}
		q := queues[qw.Queue]
		if q == nil {
			continue
		}
		for r, v := range qw.Usage {
			q.Used[r] += v
		}
		wls = append(wls, qw)
		byName[qw.Name] = w
	}
	var errs []error
	picked := quota.SelectEvictions(usage, wls, f.cfg.Params.EvictTolerance)
	for _, name := range picked[:min(len(picked), 1)] {
		w := byName[name]
		patch := []byte(`{"metadata":{"labels":{"` + LabelEvicted + `":"true"}},"spec":{"active":false}}`)
		if _, err := f.dyn.Resource(workloadsGVR).Namespace(w.GetNamespace()).Patch(ctx, w.GetName(), types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: f.cfg.Component}); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deactivating Workload %s: %w", name, err))
			}
			continue
		}
		queue, _, _ := unstructured.NestedString(w.Object, "status", "admission", "clusterQueue")
		f.m.evictions.WithLabelValues(queue).Inc()
		f.event(w, corev1.EventTypeNormal, ReasonQuotaEvicted,
			"ClusterQueue %s's quota fell below what its cohort has admitted (batch capacity taken back): deactivated so that Kueue evicts and requeues it", queue)
		f.log.Info("workload deactivated over quota", "workload", name, "clusterQueue", queue)
	}
	return errors.Join(errs...)
}

// admitted returns w as quota.SelectEvictions ranks it, when it holds a quota
// reservation and is active.
func (f *Follower) admitted(w *unstructured.Unstructured) (quota.Workload, bool) {
	if active, found, _ := unstructured.NestedBool(w.Object, "spec", "active"); found && !active {
		return quota.Workload{}, false
	}
	reserved, at := condition(w, "QuotaReserved")
	if !reserved {
		return quota.Workload{}, false
	}
	queue, _, _ := unstructured.NestedString(w.Object, "status", "admission", "clusterQueue")
	if queue == "" {
		return quota.Workload{}, false
	}
	prio, _, _ := unstructured.NestedInt64(w.Object, "spec", "priority")
	qw := quota.Workload{
		Name: w.GetNamespace() + "/" + w.GetName(), Queue: queue, Priority: int32(prio),
		Admitted: at.UnixNano(), Usage: map[string]int64{},
	}
	psas, _, _ := unstructured.NestedSlice(w.Object, "status", "admission", "podSetAssignments")
	for _, p := range psas {
		pm, _ := p.(map[string]any)
		flavors, _ := pm["flavors"].(map[string]any)
		ru, _ := pm["resourceUsage"].(map[string]any)
		for r, v := range ru {
			if !slices.Contains(f.cfg.Resources, r) || flavors[r] != f.cfg.Flavor {
				continue
			}
			if q, err := resource.ParseQuantity(fmt.Sprint(v)); err == nil {
				qw.Usage[r] += q.Value()
			}
		}
	}
	return qw, true
}

// condition reports whether w's condition typ is True, and since when.
func condition(w *unstructured.Unstructured, typ string) (bool, time.Time) {
	conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] != typ {
			continue
		}
		at, _ := time.Parse(time.RFC3339, fmt.Sprint(cm["lastTransitionTime"]))
		return cm["status"] == "True", at
	}
	return false, time.Time{}
}

// requeue reactivates the Workloads the follower deactivated once Kueue has
// evicted them (they hold no quota reservation).
func (f *Follower) requeue(ctx context.Context) error {
	l, err := f.dyn.Resource(workloadsGVR).List(ctx, metav1.ListOptions{LabelSelector: LabelEvicted + "=true"})
	if err != nil {
		return fmt.Errorf("listing evicted Workloads: %w", err)
	}
	var errs []error
	for i := range l.Items {
		w := &l.Items[i]
		if reserved, _ := condition(w, "QuotaReserved"); reserved {
			continue // Kueue has not evicted it yet
		}
		patch := []byte(`{"metadata":{"labels":{"` + LabelEvicted + `":null}},"spec":{"active":true}}`)
		if _, err := f.dyn.Resource(workloadsGVR).Namespace(w.GetNamespace()).Patch(ctx, w.GetName(), types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: f.cfg.Component}); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("reactivating Workload %s/%s: %w", w.GetNamespace(), w.GetName(), err))
			}
			continue
		}
		f.m.requeues.Inc()
		f.event(w, corev1.EventTypeNormal, ReasonQuotaRequeued, "evicted by Kueue after its queue's quota fell; reactivated: Kueue requeues it")
		f.log.Info("workload reactivated", "workload", w.GetNamespace()+"/"+w.GetName())
	}
	return errors.Join(errs...)
}

func (f *Follower) event(obj runtime.Object, typ, reason, format string, args ...any) {
	if f.events != nil {
		f.events.Eventf(obj, typ, reason, format, args...)
	}
}

func direction(d quota.Decision) string {
	switch {
	case len(d.Fell) > 0 && len(d.Rose) > 0:
		return "both"
	case len(d.Fell) > 0:
		return "down"
	}
	return "up"
}

// describe is a decision as an Event message: "understory.io/batch-cpu 8000 -> 6000
// (target 6000 of 12000 published)".
func describe(d quota.Decision, cur, published map[string]int64) string {
	var parts []string
	for _, r := range append(slices.Clone(d.Fell), d.Rose...) {
		parts = append(parts, fmt.Sprintf("%s %d -> %d (target %d of %d published)", r, cur[r], d.Quota[r], d.Target[r], published[r]))
	}
	return strings.Join(parts, "; ")
}
