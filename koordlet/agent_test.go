package koordlet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/qos"
)

// fakePods is a pod source with a fixed, settable pod list.
type fakePods struct {
	mu       sync.Mutex
	pods     []*corev1.Pod
	changed  chan struct{}
	unsynced bool
}

var _ podLister = (*fakePods)(nil)

func newFakePods(pods ...*corev1.Pod) *fakePods {
	return &fakePods{pods: pods, changed: make(chan struct{}, 1)}
}
func (f *fakePods) List() []*corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods
}
func (f *fakePods) Changed() <-chan struct{} { return f.changed }
func (f *fakePods) HasSynced() bool          { return !f.unsynced }

// fakeCPU is a node CPU reader the test advances.
type fakeCPU struct {
	mu    sync.Mutex
	times collect.CPUTimes
}

func (f *fakeCPU) Read() (collect.CPUTimes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.times, nil
}

func (f *fakeCPU) add(busy, total time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.times.Busy += busy
	f.times.Total += total
}

// fakeEvents records warnings.
type fakeEvents struct {
	mu   sync.Mutex
	msgs []string
}

func (f *fakeEvents) Warn(pod *corev1.Pod, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, pod.Name+": "+reason+": "+message)
}

// has reports whether an event starts with prefix ("pod: reason: message").
func (f *fakeEvents) has(prefix string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// all returns a copy of the events recorded.
func (f *fakeEvents) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

func testPod(name string, uid types.UID, ann map[string]string, cpuReq string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	if cpuReq != "" {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuReq)}
	}
	return p
}

// rig is an agent on a fake cgroup v2 root, driven period by period with a fake clock.
type rig struct {
	t       *testing.T
	root    string
	kind    cgroupstest.Kind
	agent   *Agent
	reg     *prometheus.Registry
	cpu     *fakeCPU
	events  *fakeEvents
	now     time.Time
	usage   map[string]time.Duration // cumulative usage per cgroup
	period  time.Duration
	tier    string
	lsCg    string
	inPlace string // in-place batch pod cgroup
	inTier  string // batch pod cgroup below the tier
	pods    *fakePods
}

const (
	lsUID      = types.UID("11111111-1111-4111-8111-111111111111")
	batchUID1  = types.UID("22222222-2222-4222-8222-222222222222")
	batchUID2  = types.UID("33333333-3333-4333-8333-333333333333")
	invalidUID = types.UID("44444444-4444-4444-8444-444444444444")
)

func newRig(t *testing.T, kind cgroupstest.Kind, mutate func(*config.Config)) *rig {
	t.Helper()
	return newRigWith(t, kind, mutate, nil)
}

func newRigWith(t *testing.T, kind cgroupstest.Kind, mutate func(*config.Config), pub nodeMetricsPublisher,
	open ...SignalOpener) *rig {
	t.Helper()
	o := rigOptions{mutate: mutate, pub: pub}
	if len(open) > 0 {
		o.open = open[0]
	}
	return newRigOpts(t, kind, o)
}

// rigOptions are newRigOpts' optional parts.
type rigOptions struct {
	mutate func(*config.Config)
	pub    nodeMetricsPublisher
	open   SignalOpener
	// gpu is the GPU source (nil: GPU features off); pods changes the rig's pods before
	// the agent starts.
	gpu  gpu.Source
	pods func(pods []*corev1.Pod)
	// conditions receives the batch pod condition (nil: none).
	conditions podConditionSink
}

func newRigOpts(t *testing.T, kind cgroupstest.Kind, o rigOptions) *rig {
	t.Helper()
	mutate, pub := o.mutate, o.pub
	r := &rig{t: t, root: cgroupstest.NewRoot(t, kind), kind: kind, cpu: &fakeCPU{times: collect.CPUTimes{CPUs: 2}},
		events: &fakeEvents{}, now: time.Unix(1_800_000_000, 0), usage: map[string]time.Duration{}, period: 100 * time.Millisecond,
		tier: "kubepods/understory-batch", lsCg: "kubepods/burstable/pod" + string(lsUID),
		inPlace: "kubepods/besteffort/pod" + string(batchUID1), inTier: "kubepods/understory-batch/pod" + string(batchUID2)}
	// The kernel's part: the cgroups kubelet (and the runtime, for the tier pod) made.
	for _, cg := range []string{r.tier, r.lsCg, r.inPlace, r.inTier, "kubepods/burstable/pod" + string(invalidUID)} {
		cgroupstest.AddGroup(t, r.root, kind, cg)
	}
	cfg := config.Default()
	cfg.CgroupRoot = r.root
	cfg.ProcRoot = t.TempDir()
	// Utilisation only, the agent's behaviour these tests pin down; harm_test.go drives
	// the signal modes with fake sources.
	cfg.Signals.Mode = string(signals.ModeSampling)
	if mutate != nil {
		mutate(&cfg)
	}
	pods := newFakePods(
		testPod("ls", lsUID, nil, "500m"),
		testPod("batch-inplace", batchUID1, map[string]string{"understory.io/qos-class": "batch"}, ""),
		testPod("batch-tier", batchUID2, map[string]string{"understory.io/qos-class": "Batch"}, ""),
		testPod("bad-annotation", invalidUID, map[string]string{"understory.io/qos-class": "gold"}, "100m"),
	)
	if o.pods != nil {
		o.pods(pods.pods)
	}
	r.pods = pods
	r.reg = prometheus.NewRegistry()
	deps := Deps{Pods: pods, Events: r.events, Registry: r.reg, NodeCPU: r.cpu, Publisher: pub,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Signals: o.open}
	if o.gpu != nil {
		deps.GPU = o.gpu
	}
	if o.conditions != nil {
		deps.PodConditions = o.conditions
	}
	a, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	r.agent = a
	a.syncPods(pods.List())
	return r
}

// step advances the clock one period in which the node was busy for node cores and each
// cgroup used the given cores, then runs one control period.
func (r *rig) step(node float64, cores map[string]float64) {
	r.t.Helper()
	r.now = r.now.Add(r.period)
	r.cpu.add(time.Duration(node*float64(r.period)), 2*r.period)
	kubepods, besteffort := 0.0, 0.0
	for cg, c := range cores {
		r.usage[cg] += time.Duration(c * float64(r.period))
		cgroupstest.SetUsage(r.t, r.root, r.kind, cg, r.usage[cg])
		if cg != r.tier {
			kubepods += c
		}
		if strings.HasPrefix(cg, "kubepods/besteffort/") {
			besteffort += c
		}
	}
	r.usage["kubepods/besteffort"] += time.Duration(besteffort * float64(r.period))
	cgroupstest.SetUsage(r.t, r.root, r.kind, "kubepods/besteffort", r.usage["kubepods/besteffort"])
	// Parents account for their children, as the kernel does.
	tier := cores[r.inTier]
	r.usage[r.tier] += time.Duration(tier * float64(r.period))
	cgroupstest.SetUsage(r.t, r.root, r.kind, r.tier, r.usage[r.tier])
	r.usage["kubepods"] += time.Duration(kubepods * float64(r.period))
	cgroupstest.SetUsage(r.t, r.root, r.kind, "kubepods", r.usage["kubepods"])
	r.agent.tick(context.Background(), r.now)
}

// warmUp takes the rig past its first sample with the usual load (LS 0.3, batch 0.5 in
// place and 0.6 below the tier, on a node using 1.5) and returns that load.
func (r *rig) warmUp() map[string]float64 {
	r.t.Helper()
	busy := map[string]float64{r.lsCg: 0.3, r.inPlace: 0.5, r.inTier: 0.6}
	r.step(0, nil)
	r.step(1.5, busy)
	return busy
}

// checkWithinBudget fails unless the batch pod cgroup cg and the tier both have a
// bounded quota and the two fit the budget in force together.
func (r *rig) checkWithinBudget(cg string) {
	r.t.Helper()
	budget := r.agent.Status().Budget.Applied
	if q, tier := r.quota(cg), r.quota(r.tier); q <= 0 || tier <= 0 || q+tier > budget+1e-6 {
		r.t.Fatalf("pod quota %v + tier %v with budget %v: want both bounded within it", q, tier, budget)
	}
}

// changePods hands the agent the rig's pods again, each first changed by change (called
// with the pod's index in the rig's list: 0 LS, 1 in-place batch, 2 tier batch, 3 the
// pod with a bad annotation), as a pod source would after updates.
func (r *rig) changePods(change func(i int, p *corev1.Pod)) {
	r.t.Helper()
	var out []*corev1.Pod
	for i, p := range r.agent.source.List() {
		p = p.DeepCopy()
		change(i, p)
		out = append(out, p)
	}
	r.agent.syncPods(out)
}

// quota returns a cgroup's CFS quota in cores (-1 unlimited).
func (r *rig) quota(cg string) float64 {
	r.t.Helper()
	if r.kind.IsV2() {
		f := strings.Fields(r.read(cg, "cpu.max"))
		if len(f) != 2 {
			r.t.Fatalf("%s cpu.max %q: want quota and period", cg, f)
		}
		if f[0] == "max" {
			return -1
		}
		q, _ := strconv.ParseFloat(f[0], 64)
		p, _ := strconv.ParseFloat(f[1], 64)
		return q / p
	}
	q, _ := strconv.ParseFloat(strings.TrimSpace(r.read(cg, "cpu.cfs_quota_us")), 64)
	p, _ := strconv.ParseFloat(strings.TrimSpace(r.read(cg, "cpu.cfs_period_us")), 64)
	if q < 0 {
		return -1
	}
	return q / p
}

// read returns a control file of the fake root. A running control loop rewrites these
// files with truncate-then-write (a real cgroup file takes each write whole), so a read
// between the two sees an empty file: read waits for the content, up to a second.
func (r *rig) read(cg, file string) string {
	r.t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		s := cgroupstest.Read(r.t, r.root, r.kind, cg, file)
		if strings.TrimSpace(s) != "" || time.Now().After(deadline) {
			return s
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *rig) file(cg, name string) string {
	r.t.Helper()
	return strings.TrimSpace(r.read(cg, name))
}

func near(a, b float64) bool { return math.Abs(a-b) < 0.011 }

func TestAgentBudgetCutAndRestore(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate, cgroupstest.Hybrid} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			// The tier starts bounded at the policy minimum: a (re)started agent never unleashes batch.
			if q := r.quota(r.tier); !near(q, 0.1) {
				t.Fatalf("tier quota at start = %v, want the 0.1 minimum", q)
			}
			if got := r.file(r.tier, "cpu.idle"); got != "1" {
				t.Fatalf("tier cpu.idle = %q, want 1", got)
			}
			r.step(0, nil) // first sample: no rates yet
			// LS uses 0.3, batch 0.6 + 0.5, system 0.1: budget = 2×0.9 − 0.3 − 0.1 = 1.4.
			busy := map[string]float64{r.lsCg: 0.3, r.inPlace: 0.5, r.inTier: 0.6}
			r.step(1.5, busy)
			st := r.agent.Status()
			if !near(st.Budget.Applied, 1.4) || !near(st.Budget.LSUsage, 0.3) || !near(st.Budget.SystemUsage, 0.1) {
				t.Fatalf("budget = %+v, want applied 1.4 from LS 0.3 and system 0.1", st.Budget)
			}
			tierQ, podQ := r.quota(r.tier), r.quota(r.inPlace)
			if tierQ <= 0 || podQ <= 0 || tierQ+podQ > 1.4+1e-9 {
				t.Fatalf("tier %v + in-place pod %v quotas must be positive and add up to at most 1.4", tierQ, podQ)
			}
			// The in-place batch pod got the tier's static settings.
			if got := r.file(r.inPlace, "cpu.idle"); got != "1" {
				t.Fatalf("in-place pod cpu.idle = %q, want 1", got)
			}
			// LS jumps to 1.2 (batch squeezed to 0.5): the budget is cut at once, in the
			// same period, to 2×0.9 − 1.2 − 0.1 = 0.5.
			r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
			st = r.agent.Status()
			const want = 0.5
			if !near(st.Budget.Applied, want) || st.Budget.Reason != "cut" {
				t.Fatalf("after the LS step: budget %+v, want a cut to %.2f", st.Budget, want)
			}
			if q := r.quota(r.tier) + r.quota(r.inPlace); q > st.Budget.Applied+1e-9 {
				t.Fatalf("quotas add up to %v > budget %v", q, st.Budget.Applied)
			}
			// LS goes idle: the budget comes back at most 10 % of the node (0.2 CPU) per period.
			prev := st.Budget.Applied
			for range 3 {
				r.step(1.2, map[string]float64{r.lsCg: 0, r.inPlace: 0.5, r.inTier: 0.6})
				st = r.agent.Status()
				if st.Budget.Applied > prev+0.2+1e-9 {
					t.Fatalf("restore from %v to %v exceeds 0.2 per period", prev, st.Budget.Applied)
				}
				prev = st.Budget.Applied
			}
			if prev <= want {
				t.Fatalf("budget did not restore: %v", prev)
			}
		})
	}
}

func TestAgentInvalidAnnotationKeepsDefaultClass(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	r.step(0, nil)
	st := r.agent.Status()
	var found *PodEntry
	for i, e := range st.Pods["LS"] {
		if e.Name == "bad-annotation" {
			found = &st.Pods["LS"][i]
		}
	}
	if found == nil || !strings.Contains(found.ClassError, "gold") {
		t.Fatalf("bad-annotation pod not LS with its error in /status: %+v", st.Pods)
	}
	r.events.mu.Lock()
	msgs := strings.Join(r.events.msgs, "\n")
	r.events.mu.Unlock()
	if !strings.Contains(msgs, "bad-annotation: InvalidQoSClass") || !strings.Contains(msgs, "gold") {
		t.Fatalf("no warning event naming the value: %q", msgs)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Errors.WithLabelValues("annotation")); v != 1 {
		t.Fatalf("annotation errors = %v, want 1", v)
	}
	// Re-syncing the same pods does not warn again.
	r.agent.syncPods(r.agent.source.List())
	r.events.mu.Lock()
	n := len(r.events.msgs)
	r.events.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d warnings after a resync, want 1", n)
	}
}

func TestAgentSurvivesVanishedCgroup(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	busy := r.warmUp()
	cgroupstest.RemoveGroup(t, r.root, r.kind, r.inPlace)
	delete(busy, r.inPlace)
	for range slowEvery {
		r.step(1.0, busy) // must not panic; the pod is skipped
	}
	st := r.agent.Status()
	var entry PodEntry
	for _, e := range st.Pods["batch"] {
		if e.Name == "batch-inplace" {
			entry = e
		}
	}
	if entry.Error == "" {
		t.Fatalf("vanished pod shows no error: %+v", entry)
	}
	if !st.Healthy {
		t.Fatal("agent unhealthy after a vanished cgroup")
	}
	// It comes back (e.g. the pod restarted): found again after the backoff.
	cgroupstest.AddGroup(t, r.root, r.kind, r.inPlace)
	for range 12 {
		r.step(1.5, map[string]float64{r.lsCg: 0.3, r.inTier: 0.6})
	}
	for _, e := range r.agent.Status().Pods["batch"] {
		if e.Name == "batch-inplace" && e.Error != "" {
			t.Fatalf("pod cgroup not found again: %+v", e)
		}
	}
}

func TestAgentWriteErrorsCountedAndRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	busy := map[string]float64{r.lsCg: 0.3, r.inPlace: 0.5, r.inTier: 0.6}
	r.step(0, nil)
	// Make the in-place pod's cpu.max unwritable: a directory in its place.
	maxFile := filepath.Join(r.root, r.inPlace, "cpu.max")
	if err := os.Remove(maxFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(maxFile, 0o755); err != nil {
		t.Fatal(err)
	}
	r.step(1.5, busy)
	if v := testutil.ToFloat64(r.agent.metrics.Errors.WithLabelValues("cgroup_write")); v < 1 {
		t.Fatalf("cgroup_write errors = %v, want ≥ 1", v)
	}
	// Fixed: the next period writes it.
	if err := os.Remove(maxFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(maxFile, []byte("max 100000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.step(1.5, busy)
	if q := r.quota(r.inPlace); q <= 0 {
		t.Fatalf("quota not retried: %v", q)
	}
}

func TestAgentShutdownLeavesTierBounded(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, func(c *config.Config) { c.Period.Duration = 10 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	launched := time.Now()
	go func() { done <- r.agent.Run(ctx) }()
	// Stop once Run has controlled for a few periods (its ticks use the real clock).
	testenv.WaitFor(t, 10*time.Second, "three control periods of Run", func() bool {
		return r.agent.Status().Time.After(launched.Add(2 * 10 * time.Millisecond))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if q := r.quota(r.tier); q < 0 || q > 0.1+1e-9 {
		t.Fatalf("tier quota after shutdown = %v, want ≤ 0.1 (bounded)", q)
	}
	if q := r.quota(r.inPlace); q < 0 || q > 0.1+1e-9 {
		t.Fatalf("in-place quota after shutdown = %v, want bounded", q)
	}
}

// TestAgentShutdownLeavesBatchWithinFloor: after a graceful stop the tier and the
// in-place batch pods together hold at most the shutdown budget. Cuts smaller than the
// write deadband used to be skipped at shutdown too, so the pods kept their last shares
// (0.05 each here, 0.1 in all against a 0.02 floor).
func TestAgentShutdownLeavesBatchWithinFloor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		kind  cgroupstest.Kind
		floor float64
		ls    float64 // LS usage before the stop: 1.7 cuts the budget to its 0.1 minimum
	}{
		{"v2 below the minimum", cgroupstest.V2, 0.02, 1.7},
		{"v1 below the minimum", cgroupstest.V1Separate, 0.02, 1.7},
		{"v2 at a high budget", cgroupstest.V2, 0.103, 0.1},
		{"hybrid at a high budget", cgroupstest.Hybrid, 0.103, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.kind, func(c *config.Config) { c.ShutdownBudgetCPU = &tc.floor })
			r.warmUp()
			for range 5 {
				r.step(tc.ls+0.3, map[string]float64{r.lsCg: tc.ls, r.inPlace: 0.1, r.inTier: 0.1})
			}
			r.agent.shutdown()
			tier, pod := r.quota(r.tier), r.quota(r.inPlace)
			if tier < 0 || pod < 0 || tier+pod > tc.floor+1e-6 {
				t.Fatalf("after shutdown tier %.4f + in-place %.4f = %.4f; want bounded within the floor %.3f",
					tier, pod, tier+pod, tc.floor)
			}
		})
	}
}

// TestAgentStatusShowsPlan: /status carries the period's write plan as the plan made
// it: every batch group's share, whether it was written and why (or why not).
func TestAgentStatusShowsPlan(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	busy := r.warmUp()
	byID := func() map[string]qos.CPUEntry {
		m := map[string]qos.CPUEntry{}
		for _, e := range r.agent.Status().Plan {
			m[e.ID] = e
		}
		return m
	}
	plan := byID()
	tier, pod := plan["tier"], plan["default/batch-inplace"]
	if tier.Kind != qos.TargetTier || pod.Kind != qos.TargetInPlacePod || !tier.Write || !pod.Write ||
		tier.Reason == "" || pod.Reason == "" {
		t.Fatalf("plan %+v: want the tier and the in-place pod written, with reasons", r.agent.Status().Plan)
	}
	// The same load: once the demand average has settled nothing moves past the
	// deadband, nothing is written, and the plan says why.
	held := func() bool {
		for _, e := range byID() {
			if e.Write || !strings.HasPrefix(e.Reason, "held: ") {
				return false
			}
		}
		return true
	}
	for i := 0; !held(); i++ {
		if i == 5*slowEvery {
			t.Fatalf("plan %+v after %d periods of the same load: want every group held, with why",
				r.agent.Status().Plan, i)
		}
		r.step(1.5, busy)
	}
	b, err := json.Marshal(r.agent.Status())
	if err != nil || !strings.Contains(string(b), `"plan":[{"kind":`) {
		t.Fatalf("/status JSON %s (%v): want a plan", b, err)
	}
}

func TestAgentHTTP(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	srv := httptest.NewServer(r.agent.Handler(r.reg))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz before any period = %d, want 503", code)
	}
	r.step(0, nil)
	r.step(1.5, map[string]float64{r.lsCg: 0.3, r.inPlace: 0.5, r.inTier: 0.6})
	r.agent.healthy.Store(time.Now().UnixNano()) // the rig's clock is fake; health uses the wall clock
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Fatalf("healthz = %d %s", code, body)
	}
	code, body := get("/status")
	if code != http.StatusOK {
		t.Fatalf("status = %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Budget.Formula == "" || !near(st.Budget.Threshold, 0.9) || len(st.Pods["batch"]) != 2 || len(st.Pods["LS"]) != 2 {
		t.Fatalf("status lacks the budget terms or pods: %s", body)
	}
	for _, e := range st.Pods["batch"] {
		want := map[string]string{"batch-inplace": "in-place", "batch-tier": "tier"}[e.Name]
		if e.Placement != want {
			t.Fatalf("%s placement %q, want %q", e.Name, e.Placement, want)
		}
	}
	_, metricsBody := get("/metrics")
	for _, m := range []string{"understory_batch_cpu_budget_cores", "understory_ls_cpu_usage_cores", "understory_control_loop_duration_seconds_bucket"} {
		if !strings.Contains(metricsBody, m) {
			t.Fatalf("/metrics lacks %s", m)
		}
	}
}

func TestAgentRejectsEscapingUID(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	evil := testPod("evil", types.UID("../../../../tmp/x"), map[string]string{"understory.io/qos-class": "batch"}, "")
	r.agent.syncPods(append(r.agent.source.List(), evil))
	r.step(0, nil)
	r.step(1.0, map[string]float64{r.lsCg: 0.2})
	for _, e := range r.agent.Status().Pods["batch"] {
		if e.Name != "evil" {
			continue
		}
		if !strings.Contains(e.Error, "invalid") || !strings.HasPrefix(e.Cgroup, "not found") {
			t.Fatalf("escaping UID not rejected: %+v", e)
		}
		return
	}
	t.Fatal("the pod with an escaping UID is not listed with its error")
}

func TestNewFailsClearlyWithoutCgroupfs(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.CgroupRoot = t.TempDir() // empty: no controllers
	_, err := New(cfg, Deps{Pods: newFakePods(), Registry: prometheus.NewRegistry()})
	if !errors.Is(err, cgroups.ErrNoCgroupFS) || !strings.Contains(err.Error(), cfg.CgroupRoot) {
		t.Fatalf("New on an empty root: %v; want ErrNoCgroupFS naming the root", err)
	}
	if _, err := New(cfg, Deps{}); err == nil {
		t.Fatal("New without a pod source succeeded")
	}
}

// A terminating batch pod keeps a bounded quota (its share of the budget) for its whole
// grace period: lifting it to unlimited let a pod asked to stop run unbounded next to LS.
func TestAgentKeepsTerminatingPodBounded(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			busy := r.warmUp()
			now := metav1.Now()
			r.changePods(func(i int, p *corev1.Pod) {
				if i == 1 {
					p.DeletionTimestamp = &now
				}
			})
			for range 20 {
				r.step(1.5, busy)
				r.checkWithinBudget(r.inPlace) // the terminating pod
			}
		})
	}
}

// The LS usage the budget uses is measured every period from aggregates (kubepods minus
// BestEffort minus the tier), so swings of batch held in place never leak into it, LS
// changes show at once even in periods that read no pod, and CPU in kubepods that no
// known pod accounts for counts as LS.
func TestAgentLSFromAggregates(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.Hybrid} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			r.step(0, nil)
			r.step(1.0, map[string]float64{r.lsCg: 0.2, r.inPlace: 0.3, r.inTier: 0.3}) // a slow period
			for i, c := range []struct {
				ls, inPlace, unknown float64
			}{
				{0.2, 1.2, 0}, // in-place batch bursts: LS unchanged
				{0.2, 0.0, 0}, // and stops
				{0.7, 0.3, 0}, // LS grows in a period that reads no LS pod
				{0.2, 0.3, 0.4},
			} {
				cores := map[string]float64{r.lsCg: c.ls, r.inPlace: c.inPlace, r.inTier: 0.3}
				if c.unknown > 0 {
					cores["kubepods/burstable/pod"+"0badc0de-0000-4000-8000-00000000abcd"] = c.unknown
				}
				r.step(c.ls+c.inPlace+0.3+c.unknown+0.1, cores)
				if got, want := r.agent.Status().Budget.LSUsage, c.ls+c.unknown; !near(got, want) {
					t.Fatalf("step %d: budget LS usage %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestAgentCutObservesReaction: a cut observes understory_batch_cut_reaction_seconds
// from the start of the window in which the LS rise became visible (the previous
// sample, one period before) to after the write; restores observe nothing.
func TestAgentCutObservesReaction(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	busy := r.warmUp()
	h := r.agent.metrics.CutReaction
	if n := testutil.CollectAndCount(h); n != 4 {
		t.Fatalf("%d histogram series, want one per signal (4)", n)
	}
	count := func() (uint64, float64) {
		t.Helper()
		fams, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "understory_batch_cut_reaction_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "utilisation" {
					hist := m.GetHistogram()
					return hist.GetSampleCount(), hist.GetSampleSum()
				}
			}
		}
		t.Fatal("understory_batch_cut_reaction_seconds not registered")
		return 0, 0
	}
	if n, _ := count(); n != 0 {
		t.Fatalf("%d reactions observed before any cut", n)
	}
	// LS jumps from 0.3 to 1.2: the budget is cut in this period.
	r.step(1.8, map[string]float64{r.lsCg: 1.2, r.inPlace: 0.2, r.inTier: 0.3})
	if st := r.agent.Status(); st.Budget.Reason != "cut" {
		t.Fatalf("budget %+v, want a cut", st.Budget)
	}
	n, sum := count()
	// The window is one period of the fake clock; the write adds this period's real
	// work, well under a second even under -race on a busy machine.
	if n != 1 || sum < r.period.Seconds() || sum > r.period.Seconds()+1 {
		t.Fatalf("after one cut: %d observations summing to %vs, want 1 of %v plus the write", n, sum, r.period)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Actions.WithLabelValues("cut")); v != 1 {
		t.Fatalf("cut counted %v times, want 1", v)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Cuts.WithLabelValues("utilisation")); v != 1 {
		t.Fatalf("utilisation cuts %v, want 1", v)
	}
	if c := r.agent.Status().Signals.LastCut; c == nil || c.Signal != "utilisation" || c.ReactionSeconds < r.period.Seconds() {
		t.Fatalf("status lastCut %+v, want the utilisation cut and its reaction", c)
	}
	// LS goes back down: restores, no more observations.
	for range 3 {
		r.step(1.5, busy)
	}
	if v := testutil.ToFloat64(r.agent.metrics.Actions.WithLabelValues("restore")); v < 1 {
		t.Fatalf("no restore counted after LS fell")
	}
	if n, _ := count(); n != 1 {
		t.Fatalf("%d observations after restores, want still 1", n)
	}
}
