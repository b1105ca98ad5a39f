package clusterbench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/bench/internal/proc"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/kueueharness"
	"github.com/understory/understory/kueuequota"
)

// Names of the shipped Kueue component (manifests/components/kueue) the benchmark
// uses.
const (
	kueueComponentDir = "manifests/components/kueue"
	// kueueQueueLabel puts a Job in a LocalQueue; kueueLocalQueue is the name of
	// each tenant's LocalQueue (localqueues.yaml).
	kueueQueueLabel = "kueue.x-k8s.io/queue-name"
	kueueLocalQueue = "batch"
	kueueTenantA    = "tenant-a"
	kueueTenantB    = "tenant-b"
	// labelJobName is the label the Job controller puts on its pods.
	labelJobName = "batch.kubernetes.io/job-name"
	// kueueCohortResource is the resource the tenants' shares are measured in.
	kueueCohortResource = contract.ResourceBatchCPU
)

// errBadKueueManifest means the shipped Kueue component is not what the benchmark
// needs.
var errBadKueueManifest = errors.New("unexpected Kueue component manifest")

// kueueTenants are the tenants of the shipped component, in the order jobs are
// dealt to them.
func kueueTenants() []string { return []string{kueueTenantA, kueueTenantB} }

// tenantOf is the tenant of the trace's i-th job (arrival order): the jobs are
// dealt alternately, so each tenant gets every other arrival and about half the
// offered load (the same draw of sizes and durations on both sides).
func tenantOf(i int) string {
	ts := kueueTenants()
	return ts[i%len(ts)]
}

// kueueJob is trace job j as a batch/v1 Job in tenant's LocalQueue: suspended
// (Kueue's webhook that would suspend it is not registered, kueueharness),
// parallelism = completions = the gang's size (1 for a single pod), no retries,
// and the pod template of pod (the user's pod of userBatchPod, or its webhook
// output form without the webhook): its labels, annotations (the bench
// duration kwok completes it after, the gang annotations the extender places it
// all-or-nothing by) and spec, with restartPolicy Never.
func kueueJob(j Job, tenant string, pod *corev1.Pod) *batchv1.Job {
	n := int32(max(j.Members, 1))
	spec := *pod.Spec.DeepCopy()
	spec.RestartPolicy = corev1.RestartPolicyNever
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
		Labels: maps.Clone(pod.Labels), Annotations: maps.Clone(pod.Annotations)}, Spec: spec}
	zero := int32(0)
	suspend := true
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: j.Name, Namespace: tenant,
			Labels: map[string]string{kueueQueueLabel: kueueLocalQueue}},
		Spec: batchv1.JobSpec{Suspend: &suspend, Parallelism: &n, Completions: &n, BackoffLimit: &zero, Template: tmpl},
	}
}

// kueueComponentFiles hold the shipped component's objects the benchmark applies: the
// ResourceFlavor, the ClusterQueues, the tenants' Namespaces (tenant-namespaces.yaml,
// which the component itself does not list: it never owns tenant data) and their
// LocalQueues (not the follower's Deployment, RBAC and policies: the follower runs as
// a child process with the admin's kubeconfig).
func kueueComponentFiles() []string {
	return []string{"resourceflavor.yaml", "clusterqueues.yaml", "tenant-namespaces.yaml", "localqueues.yaml"}
}

// readKueueObjects reads kueueComponentFiles under root's component directory.
func readKueueObjects(root string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range kueueComponentFiles() {
		p := filepath.Join(root, kueueComponentDir, f)
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading Kueue component: %w", err)
		}
		objs, err := decodeObjects(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, objs...)
	}
	return out, checkKueueObjects(out)
}

// decodeObjects decodes a component file (controlplane.DecodeObjects); every
// object must have a kind and a name.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	objs, err := controlplane.DecodeObjects(data)
	if err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	for _, u := range objs {
		if u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("a document without kind or name: %w", errBadKueueManifest)
		}
	}
	return objs, nil
}

// checkKueueObjects checks that objs hold what the benchmark relies on: a
// ClusterQueue, a Namespace and a LocalQueue named kueueLocalQueue per tenant.
func checkKueueObjects(objs []*unstructured.Unstructured) error {
	have := map[string]bool{}
	for _, o := range objs {
		have[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = true
	}
	var errs []error
	for _, t := range kueueTenants() {
		for _, k := range []string{"ClusterQueue//" + t, "Namespace//" + t, "LocalQueue/" + t + "/" + kueueLocalQueue} {
			if !have[k] {
				errs = append(errs, fmt.Errorf("no %s: %w", k, errBadKueueManifest))
			}
		}
	}
	return errors.Join(errs...)
}

// kueueResource is the v1beta2 resource of a Kueue kind.
func kueueResource(kind string) (schema.GroupVersionResource, error) {
	switch kind {
	case "ResourceFlavor":
		return kueueharness.GVR("resourceflavors"), nil
	case "ClusterQueue":
		return kueueharness.GVR("clusterqueues"), nil
	case "LocalQueue":
		return kueueharness.GVR("localqueues"), nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("kind %s: %w", kind, errBadKueueManifest)
}

// applyKueueObjects creates objs: Namespaces through cp.CreateNamespace (with
// their default ServiceAccount) and their labels, plus the admission profile's
// label admission.LabelProfile=batch so the webhook converts the Jobs' pods;
// Kueue's objects through the dynamic client.
func applyKueueObjects(ctx context.Context, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured) error {
	c := cp.Client()
	for _, o := range objs {
		if o.GetKind() != "Namespace" {
			continue
		}
		if err := cp.CreateNamespace(ctx, o.GetName()); err != nil {
			return err
		}
		ns, err := c.CoreV1().Namespaces().Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading namespace %s: %w", o.GetName(), err)
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		for k, v := range o.GetLabels() {
			ns.Labels[k] = v
		}
		ns.Labels[admission.LabelProfile] = "batch"
		if _, err := c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("labelling namespace %s: %w", ns.Name, err)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		gvr, err := kueueResource(o.GetKind())
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = cp.Dynamic().Resource(gvr)
		if ns := o.GetNamespace(); ns != "" {
			ri = cp.Dynamic().Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// kueueSetup is what Run starts for Options.Kueue.
type kueueSetup struct {
	managerPID int
	follower   *child
	workloads  *workloadWatch
}

// startKueue installs Kueue's CRDs, starts its manager (the shipped
// Configuration, kueueharness), kube-controller-manager with the Job controller
// only, applies the component's objects, and starts the quota follower (the
// binary follower, built with the extender) and a watch on the tenants'
// Workloads.
func startKueue(ctx context.Context, tb testing.TB, cp *controlplane.ControlPlane, o Options, dir, follower string) (*kueueSetup, error) {
	bin := kueueharness.Find(tb)
	objs, err := readKueueObjects(o.ModuleRoot)
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(o.ModuleRoot, kueueharness.ConfigRelPath))
	if err != nil {
		return nil, fmt.Errorf("reading Kueue configuration: %w", err)
	}
	// Job controller only: Job pods, their status (ready, succeeded) and
	// completion. Finished pods are deleted by the tracker once the Job controller
	// has counted them, so the garbage collector is not needed. Its client's
	// default 20 requests/s (and 5 Job workers) created Job pods slower than Kueue
	// admitted Jobs at 1 000 nodes, so admitted Workloads hit waitForPodsReady's
	// timeout without pods: the limits are raised as for the extender.
	cp.StartControllerManager(tb, controlplane.WithControllers("job"),
		controlplane.WithControllerManagerArgs("--kube-api-qps=500", "--kube-api-burst=1000",
			"--concurrent-job-syncs=50"))
	wh := kueueharness.InstallCRDs(ctx, tb, cp, bin)
	// Kueue's Job and Workload reconcilers with KueueWorkers workers each: with
	// the install's 5, admitted Jobs waited about 30 s to be unsuspended at 300
	// nodes (13 Jobs/s), the reconcilers' queues growing behind a busy API server.
	workers := map[string]int{"Job.batch": o.KueueWorkers, "Workload.kueue.x-k8s.io": o.KueueWorkers}
	pid := kueueharness.Start(ctx, tb, cp, bin, wh, kueueharness.Options{Config: cfg, StartTimeout: 3 * time.Minute,
		GroupKindConcurrency: workers}).Pid()
	if err := applyKueueObjects(ctx, cp, objs); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	f, err := startChild(dir, "kueue-quota", o.ComponentNice, follower, "-kubeconfig="+cp.Kubeconfig(),
		"-leader-elect=false", "-listen=127.0.0.1:"+strconv.Itoa(port), "-interval="+o.KueueQuotaInterval.String())
	if err != nil {
		return nil, err
	}
	tb.Cleanup(f.stop)
	dumpOnFailure(tb, f)
	if err := waitHTTP(ctx, f, "http://127.0.0.1:"+strconv.Itoa(port)+"/healthz", 2*time.Minute); err != nil {
		return nil, fmt.Errorf("kueue-quota: %w\n%s", err, controlplane.TailFile(f.log, 20))
	}
	ww := newWorkloadWatch()
	if err := ww.run(ctx, cp, kueueTenants()); err != nil {
		return nil, err
	}
	return &kueueSetup{managerPID: pid, follower: f, workloads: ww}, nil
}

// wlState is what the benchmark saw of one Workload: when it first saw it, saw it
// Admitted and Finished, and its evictions by reason (status.schedulingStats);
// the Job that owns it (podKey) and whether it is Admitted and Finished now.
type wlState struct {
	created, admitted, finished time.Time
	evictions                   map[string]int
	job                         string
	admittedNow, finishedNow    bool
}

// workloadView is what parseWorkload reads of a Workload object.
type workloadView struct {
	admitted, finished bool
	evictions          map[string]int
}

// parseWorkload reads a v1beta2 Workload's conditions (Admitted and Finished
// True) and status.schedulingStats.evictions (count by reason).
func parseWorkload(obj map[string]any) workloadView {
	var v workloadView
	conds, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conds {
		cm, ok := c.(map[string]any)
		if !ok || cm["status"] != "True" {
			continue
		}
		switch cm["type"] {
		case "Admitted":
			v.admitted = true
		case "Finished":
			v.finished = true
		}
	}
	ev, _, _ := unstructured.NestedSlice(obj, "status", "schedulingStats", "evictions")
	for _, e := range ev {
		em, ok := e.(map[string]any)
		if !ok {
			continue
		}
		reason, _ := em["reason"].(string)
		n, ok := em["count"].(int64)
		if !ok {
			if f, isF := em["count"].(float64); isF {
				n = int64(f)
			}
		}
		if reason != "" && n > 0 {
			if v.evictions == nil {
				v.evictions = map[string]int{}
			}
			v.evictions[reason] += int(n)
		}
	}
	return v
}

// workloadWatch follows the tenants' Workloads through an informer.
type workloadWatch struct {
	mu sync.Mutex
	wl map[string]*wlState
}

func newWorkloadWatch() *workloadWatch { return &workloadWatch{wl: map[string]*wlState{}} }

func (w *workloadWatch) run(ctx context.Context, cp *controlplane.ControlPlane, namespaces []string) error {
	for _, ns := range namespaces {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(cp.Dynamic(), 0, ns, nil)
		inf := f.ForResource(kueueharness.GVR("workloads")).Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { w.observe(o, time.Now()) },
			UpdateFunc: func(_, o any) { w.observe(o, time.Now()) },
		}); err != nil {
			return fmt.Errorf("workload handler: %w", err)
		}
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("workload informer of %s: %w", ns, ctx.Err())
		}
	}
	return nil
}

func (w *workloadWatch) observe(o any, now time.Time) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	v := parseWorkload(u.Object)
	w.mu.Lock()
	defer w.mu.Unlock()
	k := podKey(u.GetNamespace(), u.GetName())
	s := w.wl[k]
	if s == nil {
		s = &wlState{created: now}
		w.wl[k] = s
	}
	for _, ref := range u.GetOwnerReferences() {
		if ref.Kind == "Job" {
			s.job = podKey(u.GetNamespace(), ref.Name)
		}
	}
	s.admittedNow, s.finishedNow = v.admitted, v.finished
	if v.admitted && s.admitted.IsZero() {
		s.admitted = now
	}
	if v.finished && s.finished.IsZero() {
		s.finished = now
	}
	s.evictions = v.evictions
}

// neverAdmitted counts the Workloads seen and not yet seen Admitted.
func (w *workloadWatch) neverAdmitted() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.wl {
		if s.admitted.IsZero() {
			n++
		}
	}
	return n
}

// admittedJobs returns the Jobs of the Workloads Admitted now and not Finished.
func (w *workloadWatch) admittedJobs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.wl {
		if s.admittedNow && !s.finishedNow && s.job != "" {
			out = append(out, s.job)
		}
	}
	return out
}

// admittedStages counts the admitted, unfinished Workloads by where their Job's
// pods are: none seen yet (the Job not unsuspended, or its pods not created),
// some waiting to be bound, some bound and running, all finished (the Workload
// not yet Finished: quota still held).
type admittedStages struct{ noPods, unbound, running, allDone int }

func stagesOf(jobs []string, pods map[string]jobPods) admittedStages {
	var st admittedStages
	for _, j := range jobs {
		switch c := pods[j]; {
		case c.pods == 0:
			st.noPods++
		case c.unbound > 0:
			st.unbound++
		case c.live > 0:
			st.running++
		default:
			st.allDone++
		}
	}
	return st
}

func (w *workloadWatch) states() []wlState {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]wlState, 0, len(w.wl))
	for _, s := range w.wl {
		out = append(out, *s)
	}
	return out
}

// kueueFigures are the Workloads' figures of a run.
type kueueFigures struct {
	// Created, Admitted, Finished: Workloads first seen, first seen Admitted, seen
	// Finished in [from, to]; PendingAtEnd: created by to and not admitted by then.
	Created, Admitted, Finished, PendingAtEnd int
	// WaitP50, WaitP99: seconds from creation to first admission of the Workloads
	// admitted in the window.
	WaitP50, WaitP99 float64
	// Evicted: Workloads evicted at least once (whole run); Evictions by reason.
	Evicted   int
	Evictions map[string]int
}

func workloadFigures(ws []wlState, from, to time.Time) kueueFigures {
	var f kueueFigures
	in := func(at time.Time) bool { return !at.IsZero() && !at.Before(from) && !at.After(to) }
	var waits []float64
	for _, s := range ws {
		if in(s.created) {
			f.Created++
		}
		if in(s.admitted) {
			f.Admitted++
			waits = append(waits, s.admitted.Sub(s.created).Seconds())
		}
		if in(s.finished) {
			f.Finished++
		}
		if !s.created.After(to) && (s.admitted.IsZero() || s.admitted.After(to)) {
			f.PendingAtEnd++
		}
		if len(s.evictions) > 0 {
			f.Evicted++
			if f.Evictions == nil {
				f.Evictions = map[string]int{}
			}
			for r, n := range s.evictions {
				f.Evictions[r] += n
			}
		}
	}
	f.WaitP50, f.WaitP99 = quantile(waits, 0.5), quantile(waits, 0.99)
	return f
}

// cohortSample is one reading of the tenants' ClusterQueues.
type cohortSample struct {
	// reserved: each tenant's reserved kueueCohortResource (kueueTenants order);
	// quota: their nominalQuota of it, summed. In the resource's units.
	reserved []float64
	quota    float64
}

// sampleCohort reads the tenants' ClusterQueues (kueuequota.Reservations and
// NominalQuotas of the shipped component's one flavor, the follower's default).
func sampleCohort(ctx context.Context, cp *controlplane.ControlPlane) (cohortSample, error) {
	var s cohortSample
	res := []string{kueueCohortResource}
	for _, t := range kueueTenants() {
		obj, err := cp.Dynamic().Resource(kueueharness.GVR("clusterqueues")).Get(ctx, t, metav1.GetOptions{})
		if err != nil {
			return s, fmt.Errorf("reading ClusterQueue %s: %w", t, err)
		}
		s.reserved = append(s.reserved, float64(kueuequota.Reservations(obj, kueuequota.DefaultFlavor, res)[kueueCohortResource]))
		q, err := kueuequota.NominalQuotas(obj, kueuequota.DefaultFlavor, res)
		if err != nil {
			return s, fmt.Errorf("ClusterQueue %s: %w", t, err)
		}
		s.quota += float64(q[kueueCohortResource])
	}
	return s, nil
}

// tenantShares is each tenant's mean share of what the tenants hold together,
// over the samples in which they hold anything (each sample one amount per
// tenant), and the fair-share error: the largest |share − 1/n| / (1/n) (the
// tenants' weights are equal). No usable sample: nil, NaN.
func tenantShares(samples [][]float64) ([]float64, float64) {
	var sums []float64
	n := 0
	for _, s := range samples {
		tot := sum(s)
		if tot <= 0 {
			continue
		}
		if sums == nil {
			sums = make([]float64, len(s))
		}
		if len(s) != len(sums) {
			continue
		}
		for i, v := range s {
			sums[i] += v / tot
		}
		n++
	}
	if n == 0 {
		return nil, math.NaN()
	}
	fair := 1 / float64(len(sums))
	worst := 0.0
	for i := range sums {
		sums[i] /= float64(n)
		worst = max(worst, math.Abs(sums[i]-fair)/fair)
	}
	return sums, worst
}

// kueueMeter follows Kueue's manager's and the follower's CPU and RSS, the
// tenants' shares and the cohort's series over the measured part.
type kueueMeter struct {
	k                  *kueueSetup
	cp                 *controlplane.ControlPlane
	tk                 *tracker
	from               time.Time
	mgrCPU0, folCPU0   time.Duration
	mgrPeak, folPeak   uint64
	samples            [][]float64
	series             []KueuePoint
	sampleErrs         int
	lastErr            error
	partialGangTimeout time.Duration
}

func startKueueMeter(k *kueueSetup, cp *controlplane.ControlPlane, tk *tracker, from time.Time) *kueueMeter {
	m := &kueueMeter{k: k, cp: cp, tk: tk, from: from, partialGangTimeout: 30 * time.Second}
	m.mgrCPU0, _ = proc.ReadCPU("/proc", k.managerPID)
	m.folCPU0, _ = proc.ReadCPU("/proc", k.follower.pid())
	return m
}

func (m *kueueMeter) sample(ctx context.Context) {
	if rss, _, err := proc.ReadRSS("/proc", m.k.managerPID); err == nil {
		m.mgrPeak = max(m.mgrPeak, rss)
	}
	if rss, _, err := proc.ReadRSS("/proc", m.k.follower.pid()); err == nil {
		m.folPeak = max(m.folPeak, rss)
	}
	at := time.Since(m.from).Seconds()
	s, err := sampleCohort(ctx, m.cp)
	if err != nil {
		m.sampleErrs++
		m.lastErr = err
		return
	}
	m.samples = append(m.samples, s.reserved)
	st := stagesOf(m.k.workloads.admittedJobs(), m.tk.podsByJob())
	m.series = append(m.series, KueuePoint{T: at, QuotaCores: s.quota / 1000, ReservedCores: sum(s.reserved) / 1000,
		BoundCores: float64(m.tk.boundCPUMilli()) / 1000, WaitingWorkloads: m.k.workloads.neverAdmitted(),
		AdmittedNoPods: st.noPods, AdmittedPodsUnbound: st.unbound, AdmittedRunning: st.running, AdmittedPodsDone: st.allDone})
}

// sum is the sum of v.
func sum(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}

// finish fills r's Kueue figures over [from, to]; partial gangs are counted after
// to, waiting up to partialGangTimeout for gangs caught between two binds of their
// members to complete.
func (m *kueueMeter) finish(ctx context.Context, r *SizeResult, tk *tracker, from, to time.Time) error {
	secs := to.Sub(from).Seconds()
	if len(m.samples) == 0 && m.lastErr != nil {
		return m.lastErr
	}
	mgr, _ := proc.ReadCPU("/proc", m.k.managerPID)
	fol, _ := proc.ReadCPU("/proc", m.k.follower.pid())
	if _, hwm, err := proc.ReadRSS("/proc", m.k.managerPID); err == nil {
		m.mgrPeak = max(m.mgrPeak, hwm)
	}
	if _, hwm, err := proc.ReadRSS("/proc", m.k.follower.pid()); err == nil {
		m.folPeak = max(m.folPeak, hwm)
	}
	r.Kueue = true
	r.KueueCPUCores = (mgr - m.mgrCPU0).Seconds() / secs
	r.KueueRSSMiB = float64(m.mgrPeak) / (1 << 20)
	r.KueueQuotaCPUCores = (fol - m.folCPU0).Seconds() / secs
	r.KueueQuotaRSSMiB = float64(m.folPeak) / (1 << 20)
	f := workloadFigures(m.k.workloads.states(), from, to)
	r.KueueWorkloadsCreated, r.KueueWorkloadsAdmitted, r.KueueWorkloadsFinished = f.Created, f.Admitted, f.Finished
	r.KueueWorkloadsPendingAtEnd = f.PendingAtEnd
	r.KueueAdmissionWaitP50Secs, r.KueueAdmissionWaitP99Secs = f.WaitP50, f.WaitP99
	r.KueueWorkloadsEvicted, r.KueueEvictionsByReason = f.Evicted, f.Evictions
	shares, fairErr := tenantShares(m.samples)
	if shares != nil {
		r.KueueTenantCPUShares = map[string]float64{}
		for i, t := range kueueTenants() {
			r.KueueTenantCPUShares[t] = shares[i]
		}
		r.KueueFairShareError = fairErr
	}
	r.KueueShareSamples = len(m.samples)
	r.KueueSeries = m.series
	deadline := time.Now().Add(m.partialGangTimeout)
	for {
		r.KueuePartialGangs = tk.partialGangs()
		if r.KueuePartialGangs == 0 || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// kueueCheck is the smoke check of a run with Kueue: Workloads admitted and
// finished, no partial gang; "" when it holds (or Kueue was off).
func kueueCheck(r SizeResult, on bool) string {
	if !on {
		return ""
	}
	var bad []string
	if !r.Kueue {
		bad = append(bad, "no Kueue figures")
	}
	if r.KueueWorkloadsAdmitted == 0 || r.KueueWorkloadsFinished == 0 {
		bad = append(bad, fmt.Sprintf("Kueue admitted %d and finished %d of %d Workloads: want some of each",
			r.KueueWorkloadsAdmitted, r.KueueWorkloadsFinished, r.KueueWorkloadsCreated))
	}
	if r.KueuePartialGangs != 0 {
		bad = append(bad, fmt.Sprintf("%d gangs partially bound, want 0", r.KueuePartialGangs))
	}
	slices.Sort(bad)
	return strings.Join(bad, "; ")
}
