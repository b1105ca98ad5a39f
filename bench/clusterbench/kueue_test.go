package clusterbench

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/understory/understory/contract"
)

func TestKueueJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		job     Job
		tenant  string
		members int32
		gang    bool
		pod     func(Job, int) *corev1.Pod
	}{
		{"single user pod", Job{Name: "cpu-1", Duration: 30 * time.Second, Members: 1, CPUMilli: 1500, MemBytes: 1 << 30}, kueueTenantA, 1, false, userBatchPod},
		{"gang user pods", Job{Name: "gang-2", Duration: time.Minute, Members: 4, CPUMilli: 2000, MemBytes: 1 << 30}, kueueTenantB, 4, true, userBatchPod},
		{"gpu share", Job{Name: "gpu-3", Duration: time.Minute, Members: 1, CPUMilli: 1000, MemBytes: 1 << 30, NumGPU: 1, GPUMilli: 500}, kueueTenantA, 1, false, userBatchPod},
		{"webhook output form", Job{Name: "cpu-4", Duration: time.Minute, Members: 1, CPUMilli: 800, MemBytes: 1 << 20}, kueueTenantB, 1, false,
			func(j Job, m int) *corev1.Pod { return batchPod(j, m, "understory-batch") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := tc.pod(tc.job, 0)
			j := kueueJob(tc.job, tc.tenant, pod)
			if j.Name != tc.job.Name || j.Namespace != tc.tenant || j.Labels[kueueQueueLabel] != kueueLocalQueue {
				t.Errorf("job %s/%s labels %v, want %s/%s in queue %s", j.Namespace, j.Name, j.Labels, tc.tenant, tc.job.Name, kueueLocalQueue)
			}
			if j.Spec.Suspend == nil || !*j.Spec.Suspend {
				t.Error("job not suspended")
			}
			if *j.Spec.Parallelism != tc.members || *j.Spec.Completions != tc.members || *j.Spec.BackoffLimit != 0 {
				t.Errorf("parallelism %d completions %d backoff %d, want %d %d 0", *j.Spec.Parallelism, *j.Spec.Completions,
					*j.Spec.BackoffLimit, tc.members, tc.members)
			}
			tmpl := j.Spec.Template
			if tmpl.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restart policy %q", tmpl.Spec.RestartPolicy)
			}
			if got := tmpl.Annotations[annDuration]; got != tc.job.Duration.String() {
				t.Errorf("duration annotation %q, want %q", got, tc.job.Duration)
			}
			_, gang := tmpl.Annotations[contract.AnnotationKoordinatorMinAvailable]
			if gang != tc.gang || (gang && tmpl.Annotations[contract.AnnotationKoordinatorName] != tc.job.Name) {
				t.Errorf("gang annotations %v, want gang %v", tmpl.Annotations, tc.gang)
			}
			if tmpl.Name != "" || tmpl.Namespace != "" {
				t.Errorf("template named %s/%s", tmpl.Namespace, tmpl.Name)
			}
			want := pod.Spec.Containers[0].Resources
			got := tmpl.Spec.Containers[0].Resources
			for n, q := range want.Requests {
				if g := got.Requests[n]; g.Cmp(q) != 0 {
					t.Errorf("request %s %s, want %s", n, g.String(), q.String())
				}
			}
			// The template is a copy: changing it leaves the pod alone.
			tmpl.Annotations["x"] = "y"
			if _, ok := pod.Annotations["x"]; ok {
				t.Error("template shares the pod's annotations")
			}
		})
	}
}

func TestTenantOf(t *testing.T) {
	t.Parallel()
	counts := map[string]int{}
	for i := range 10 {
		counts[tenantOf(i)]++
		if tenantOf(i) == tenantOf(i+1) {
			t.Errorf("jobs %d and %d both go to %s", i, i+1, tenantOf(i))
		}
	}
	if counts[kueueTenantA] != 5 || counts[kueueTenantB] != 5 {
		t.Errorf("counts %v, want 5 each", counts)
	}
}

func TestTenantShares(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		samples [][]float64
		shares  []float64
		err     float64
	}{
		{"none", nil, nil, math.NaN()},
		{"only empty samples", [][]float64{{0, 0}}, nil, math.NaN()},
		{"equal", [][]float64{{4000, 4000}, {1000, 1000}}, []float64{0.5, 0.5}, 0},
		{"skewed", [][]float64{{3000, 1000}}, []float64{0.75, 0.25}, 0.5},
		{"mean of shares, empty skipped", [][]float64{{1000, 0}, {0, 0}, {1000, 3000}}, []float64{0.625, 0.375}, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shares, err := tenantShares(tc.samples)
			if math.IsNaN(tc.err) != math.IsNaN(err) || (!math.IsNaN(err) && math.Abs(err-tc.err) > 1e-9) {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			if len(shares) != len(tc.shares) {
				t.Fatalf("shares %v, want %v", shares, tc.shares)
			}
			for i := range shares {
				if math.Abs(shares[i]-tc.shares[i]) > 1e-9 {
					t.Errorf("shares %v, want %v", shares, tc.shares)
				}
			}
		})
	}
}

func workloadObject(conds []map[string]any, evictions []any) map[string]any {
	cs := make([]any, len(conds))
	for i, c := range conds {
		cs[i] = c
	}
	st := map[string]any{"conditions": cs}
	if evictions != nil {
		st["schedulingStats"] = map[string]any{"evictions": evictions}
	}
	return map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "status": st}
}

func TestParseWorkload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		obj                map[string]any
		admitted, finished bool
		evictions          map[string]int
	}{
		{"empty", map[string]any{}, false, false, nil},
		{"admitted", workloadObject([]map[string]any{{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}}, nil), true, false, nil},
		{"admission false", workloadObject([]map[string]any{{"type": "Admitted", "status": "False"}}, nil), false, false, nil},
		{"finished, evicted twice", workloadObject([]map[string]any{{"type": "Admitted", "status": "True"}, {"type": "Finished", "status": "True"}},
			[]any{map[string]any{"reason": "PodsReadyTimeout", "count": int64(1)}, map[string]any{"reason": "Preempted", "underlyingCause": "x", "count": float64(1)},
				map[string]any{"reason": "Preempted", "count": int64(1)}}),
			true, true, map[string]int{"PodsReadyTimeout": 1, "Preempted": 2}},
		{"malformed entries skipped", workloadObject(nil, []any{"x", map[string]any{"count": int64(3)}}), false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := parseWorkload(tc.obj)
			if v.admitted != tc.admitted || v.finished != tc.finished || len(v.evictions) != len(tc.evictions) {
				t.Fatalf("got %+v, want admitted %v finished %v evictions %v", v, tc.admitted, tc.finished, tc.evictions)
			}
			for r, n := range tc.evictions {
				if v.evictions[r] != n {
					t.Errorf("evictions %v, want %v", v.evictions, tc.evictions)
				}
			}
		})
	}
}

func TestWorkloadFigures(t *testing.T) {
	t.Parallel()
	from := time.Unix(1000, 0)
	to := from.Add(time.Minute)
	at := func(s int) time.Time { return from.Add(time.Duration(s) * time.Second) }
	ws := []wlState{
		{created: at(-10), admitted: at(5), finished: at(20)},       // admitted and finished inside, created before
		{created: at(10), admitted: at(12)},                         // admitted inside, still running
		{created: at(30)},                                           // pending at the end
		{created: at(50), admitted: at(70)},                         // admitted after the window: pending at the end
		{created: at(-30), admitted: at(-20), finished: at(-5)},     // before the window
		{created: at(1), evictions: map[string]int{"Preempted": 2}}, // evicted, pending
		{created: at(2), admitted: at(3), evictions: map[string]int{"PodsReadyTimeout": 1, "Preempted": 1}},
	}
	f := workloadFigures(ws, from, to)
	if f.Created != 5 || f.Admitted != 3 || f.Finished != 1 || f.PendingAtEnd != 3 {
		t.Errorf("created/admitted/finished/pending %d/%d/%d/%d, want 5/3/1/3", f.Created, f.Admitted, f.Finished, f.PendingAtEnd)
	}
	// Waits 15, 2 and 1 s: nearest-rank p50 2 s, p99 15 s.
	if f.WaitP50 != 2 || f.WaitP99 != 15 {
		t.Errorf("wait p50 %v p99 %v, want 2 and 15", f.WaitP50, f.WaitP99)
	}
	if f.Evicted != 2 || f.Evictions["Preempted"] != 3 || f.Evictions["PodsReadyTimeout"] != 1 {
		t.Errorf("evicted %d %v, want 2, Preempted 3, PodsReadyTimeout 1", f.Evicted, f.Evictions)
	}
}

func TestReadKueueObjects(t *testing.T) {
	t.Parallel()
	objs, err := readKueueObjects(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() != "Namespace" {
			if _, err := kueueResource(o.GetKind()); err != nil {
				t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
			}
			if !strings.HasPrefix(o.GetAPIVersion(), "kueue.x-k8s.io/v1beta2") {
				t.Errorf("%s %s is %s, the harness needs v1beta2", o.GetKind(), o.GetName(), o.GetAPIVersion())
			}
		}
	}
	if kinds["ResourceFlavor"] != 1 || kinds["ClusterQueue"] != 2 || kinds["LocalQueue"] != 2 || kinds["Namespace"] != 2 {
		t.Errorf("kinds %v", kinds)
	}
	// A component without tenant-b's LocalQueue is refused.
	var less []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() != "LocalQueue" || o.GetNamespace() != kueueTenantB {
			less = append(less, o)
		}
	}
	if err := checkKueueObjects(less); !errors.Is(err, errBadKueueManifest) {
		t.Errorf("missing LocalQueue: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte("apiVersion: v1\nkind: Namespace\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "x.yaml"))
	if _, err := decodeObjects(data); !errors.Is(err, errBadKueueManifest) {
		t.Errorf("nameless object: %v", err)
	}
	if _, err := kueueResource("Workload"); !errors.Is(err, errBadKueueManifest) {
		t.Errorf("unknown kind: %v", err)
	}
}

// TestTrackerJobPods checks the tracker on pods of Kueue Jobs: submission at the
// Job's creation, a gang bound whole is not partial, one bound in part is, pods
// deleted unfinished (an eviction) free their node and leave the count.
func TestTrackerJobPods(t *testing.T) {
	t.Parallel()
	nodes := []benchNode{{name: nodeName(0)}, {name: nodeName(1)}}
	used := make([]usage, len(nodes))
	tk := newTracker(nil, nodes, used, kueueTenantA)
	created := time.Now().Add(-30 * time.Second)
	gangPod := func(job string, m int, node string) *corev1.Pod {
		p := batchPod(Job{Name: job, Duration: time.Minute, Members: 2, CPUMilli: 1000, MemBytes: 1 << 20}, m, "p")
		p.Namespace = kueueTenantA
		p.Labels[labelJobName] = job
		p.Finalizers = []string{jobTrackingFinalizer}
		p.Spec.NodeName = node
		return p
	}
	tk.jobSubmitted(kueueTenantA, "whole", 2, created)
	tk.jobSubmitted(kueueTenantA, "part", 2, created)
	// Not admitted yet: no pods, but its 3 count as submitted and pending.
	tk.jobSubmitted(kueueTenantA, "queued", 3, created)
	whole0, whole1 := gangPod("whole", 0, nodeName(0)), gangPod("whole", 1, nodeName(1))
	part0, part1 := gangPod("part", 0, nodeName(0)), gangPod("part", 1, "")
	for _, p := range []*corev1.Pod{whole0, whole1, part0, part1} {
		tk.observe(p)
	}
	if n := tk.partialGangs(); n != 1 {
		t.Errorf("partial gangs %d, want 1", n)
	}
	if got := used[0].cpuMilli.Load(); got != 2000 {
		t.Errorf("node 0 holds %d millicores, want 2000", got)
	}
	if got := tk.boundCPUMilli(); got != 3000 {
		t.Errorf("bound pods hold %d millicores, want 3000 (3 bound of 1 000)", got)
	}
	if got, want := tk.podsByJob(), map[string]jobPods{
		podKey(kueueTenantA, "whole"): {pods: 2, live: 2},
		podKey(kueueTenantA, "part"):  {pods: 2, unbound: 1, live: 1},
	}; !maps.Equal(got, want) {
		t.Errorf("pods by Job %v, want %v", got, want)
	}
	s := tk.stats(created.Add(-time.Second), time.Now())
	if s.Submitted != 7 || s.Bound != 3 || s.StillPending != 4 || s.QueueP50 < 29 {
		t.Errorf("stats %+v: want 7 submitted at the Jobs' creation, 3 bound after about 30 s, 4 pending", s)
	}
	// Kueue evicts "part": its pods are deleted unfinished.
	tk.deleted(part0)
	tk.deleted(cacheTombstone(part1))
	if n := tk.partialGangs(); n != 0 {
		t.Errorf("partial gangs after the eviction %d, want 0", n)
	}
	if got := used[0].cpuMilli.Load(); got != 1000 {
		t.Errorf("node 0 holds %d millicores after the eviction, want 1000", got)
	}
	if s := tk.stats(created.Add(-time.Second), time.Now()); s.StillPending != 5 {
		t.Errorf("pending after the eviction %d, want 5 (both of part's, queued's 3)", s.StillPending)
	}
	// One member of "whole" finishes first: not partial.
	done := whole0.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	tk.observe(done)
	if n := tk.partialGangs(); n != 0 {
		t.Errorf("partial gangs with one member done %d, want 0", n)
	}
	// Not deleted while the Job controller's finalizer is on it; queued once off.
	if len(tk.deletes) != 0 {
		t.Fatalf("%d deletes queued before the finalizer went", len(tk.deletes))
	}
	done.Finalizers = nil
	tk.observe(done)
	tk.observe(done)
	if len(tk.deletes) != 1 {
		t.Errorf("%d deletes queued, want 1", len(tk.deletes))
	}
	if got := used[0].cpuMilli.Load(); got != 0 {
		t.Errorf("node 0 holds %d millicores, want 0", got)
	}
	if got := tk.boundCPUMilli(); got != 1000 {
		t.Errorf("bound pods hold %d millicores, want 1000 (whole's member on node 1)", got)
	}
	if got, want := tk.podsByJob(), map[string]jobPods{podKey(kueueTenantA, "whole"): {pods: 2, live: 1, done: 1}}; !maps.Equal(got, want) {
		t.Errorf("pods by Job after the eviction and a finish %v, want %v (part's deleted pods left out)", got, want)
	}
}

func TestStagesOf(t *testing.T) {
	t.Parallel()
	pods := map[string]jobPods{
		"a/unbound": {pods: 2, unbound: 1, live: 1},
		"a/running": {pods: 2, live: 1, done: 1},
		"a/done":    {pods: 3, done: 3},
	}
	for _, tc := range []struct {
		name string
		jobs []string
		want admittedStages
	}{
		{"none", nil, admittedStages{}},
		{"a Job without pods seen", []string{"a/none"}, admittedStages{noPods: 1}},
		{"one of each", []string{"a/none", "a/unbound", "a/running", "a/done"}, admittedStages{noPods: 1, unbound: 1, running: 1, allDone: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := stagesOf(tc.jobs, pods); got != tc.want {
				t.Errorf("stages %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestWorkloadWatchNeverAdmitted(t *testing.T) {
	t.Parallel()
	w := newWorkloadWatch()
	wl := func(name string, conds ...map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: workloadObject(conds, nil)}
		u.SetNamespace(kueueTenantA)
		u.SetName(name)
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "job-" + name}})
		return u
	}
	now := time.Now()
	admitted := map[string]any{"type": "Admitted", "status": "True"}
	finished := map[string]any{"type": "Finished", "status": "True"}
	w.observe(wl("queued"), now)
	w.observe(wl("running", admitted), now)
	w.observe(wl("evicted"), now)
	w.observe(wl("finished", admitted, finished), now)
	if n := w.neverAdmitted(); n != 2 {
		t.Errorf("never admitted %d, want 2", n)
	}
	// Admitted, then evicted and requeued: it was admitted once, and is not now.
	w.observe(wl("evicted", admitted), now)
	w.observe(wl("evicted"), now)
	if n := w.neverAdmitted(); n != 1 {
		t.Errorf("never admitted %d after one admission, want 1", n)
	}
	// Admitted now and not finished: running only, by its owning Job.
	if got, want := w.admittedJobs(), []string{podKey(kueueTenantA, "job-running")}; !slices.Equal(got, want) {
		t.Errorf("admitted Jobs %v, want %v", got, want)
	}
}

func TestKueueCheck(t *testing.T) {
	t.Parallel()
	good := SizeResult{Kueue: true, KueueWorkloadsCreated: 10, KueueWorkloadsAdmitted: 8, KueueWorkloadsFinished: 3}
	for _, tc := range []struct {
		name string
		r    SizeResult
		on   bool
		want string
	}{
		{"off", SizeResult{}, false, ""},
		{"good", good, true, ""},
		{"no figures", SizeResult{}, true, "no Kueue figures"},
		{"none finished", SizeResult{Kueue: true, KueueWorkloadsAdmitted: 2}, true, "finished 0"},
		{"partial gang", SizeResult{Kueue: true, KueueWorkloadsAdmitted: 2, KueueWorkloadsFinished: 1, KueuePartialGangs: 1}, true, "partially bound"},
	} {
		got := kueueCheck(tc.r, tc.on)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestKueueReportFields checks the report's Kueue keys (docs/cluster-bench.md).
func TestKueueReportFields(t *testing.T) {
	t.Parallel()
	r := SizeResult{Kueue: true, KueueWorkloadsCreated: 1, KueueWorkloadsAdmitted: 1, KueueWorkloadsFinished: 1,
		KueueWorkloadsPendingAtEnd: 1, KueueAdmissionWaitP50Secs: 1, KueueAdmissionWaitP99Secs: 1,
		KueueTenantCPUShares: map[string]float64{kueueTenantA: 0.5}, KueueFairShareError: 0.1, KueueShareSamples: 1,
		KueueWorkloadsEvicted: 1, KueueEvictionsByReason: map[string]int{"Preempted": 1}, KueuePartialGangs: 1,
		KueueCPUCores: 1, KueueRSSMiB: 1, KueueQuotaCPUCores: 1, KueueQuotaRSSMiB: 1,
		KueueSeries: []KueuePoint{{T: 5, QuotaCores: 1, ReservedCores: 1, BoundCores: 1, WaitingWorkloads: 1, AdmittedNoPods: 1}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"kueue", "kueue_workloads_created", "kueue_workloads_admitted", "kueue_workloads_finished",
		"kueue_workloads_pending_at_end", "kueue_admission_wait_p50_s", "kueue_admission_wait_p99_s", "kueue_tenant_cpu_shares",
		"kueue_fair_share_error", "kueue_share_samples", "kueue_workloads_evicted", "kueue_evictions_by_reason",
		"kueue_partial_gangs", "kueue_cpu_cores", "kueue_rss_peak_mib", "kueue_quota_cpu_cores", "kueue_quota_rss_peak_mib",
		"kueue_series"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report lacks %s", k)
		}
	}
	b, _ = json.Marshal(SizeResult{})
	if strings.Contains(string(b), "kueue_") {
		t.Errorf("a run without Kueue reports Kueue figures: %s", b)
	}
}

// cacheTombstone wraps p as an informer's delete of an object it missed.
func cacheTombstone(p *corev1.Pod) any {
	return cache.DeletedFinalStateUnknown{Key: p.Namespace + "/" + p.Name, Obj: p}
}
