package koordlet

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
)

// A running batch pod re-annotated LS (or BE) gets kubelet's cgroup values back at once:
// cpu.idle 0, kubelet's weight from its requests and kubelet's CFS quota (none without
// CPU limits). Before, it kept SCHED_IDLE, the minimum weight and the agent's last quota.
func TestAgentRestoresKubeletValuesWhenPodLeavesBatch(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate, cgroupstest.Hybrid} {
		for _, to := range []string{"LS", "BE"} {
			t.Run(kind.String()+"/"+to, func(t *testing.T) {
				t.Parallel()
				r := newRig(t, kind, nil)
				busy := r.warmUp()
				if r.file(r.inPlace, "cpu.idle") != "1" || r.quota(r.inPlace) <= 0 {
					t.Fatalf("in-place batch pod not set up: idle %s quota %v", r.file(r.inPlace, "cpu.idle"), r.quota(r.inPlace))
				}
				r.changePods(func(i int, p *corev1.Pod) {
					if i == 1 {
						p.Annotations = map[string]string{"understory.io/qos-class": to}
					}
				})
				if got := r.file(r.inPlace, "cpu.idle"); got != "0" {
					t.Fatalf("cpu.idle = %s after the pod left batch, want 0", got)
				}
				if q := r.quota(r.inPlace); q != -1 {
					t.Fatalf("quota = %v after a BestEffort pod left batch, want unlimited (kubelet sets none)", q)
				}
				if kind.IsV2() {
					if w := r.file(r.inPlace, "cpu.weight"); w != strconv.FormatUint(cgroups.SharesToWeight(2), 10) {
						t.Fatalf("cpu.weight = %s, want kubelet's BestEffort weight", w)
					}
				} else if sh := r.file(r.inPlace, "cpu.shares"); sh != "2" {
					t.Fatalf("cpu.shares = %s, want kubelet's BestEffort 2", sh)
				}
				// It stays restored: the agent no longer writes it.
				before := r.quota(r.inPlace)
				r.step(1.5, busy)
				if q := r.quota(r.inPlace); q != before {
					t.Fatalf("quota rewritten to %v after restore", q)
				}
			})
		}
	}
}

// A Burstable batch pod with CPU limits gets kubelet's weight and quota from its spec.
func TestKubeletCgroupOfSpec(t *testing.T) {
	t.Parallel()
	pod := func(req, lim corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "a", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}}}}
	}
	rl := func(cpu, mem string) corev1.ResourceList {
		l := corev1.ResourceList{}
		if cpu != "" {
			l[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			l[corev1.ResourceMemory] = resource.MustParse(mem)
		}
		return l
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		kq   cgroups.KubeQOS
		want kubeletCgroup
	}{
		{"besteffort", pod(nil, nil), cgroups.QOSBestEffort, kubeletCgroup{shares: 2, quota: cgroups.Unlimited, memoryLimit: -1}},
		{"burstable request only", pod(rl("500m", ""), nil), cgroups.QOSBurstable,
			kubeletCgroup{shares: 512, quota: cgroups.Unlimited, memoryLimit: -1}},
		{"guaranteed", pod(rl("1500m", "1Gi"), rl("1500m", "1Gi")), cgroups.QOSGuaranteed,
			kubeletCgroup{shares: 1536, quota: 150_000_000, memoryLimit: 1 << 30}},
		{"tiny limit gets kernel minimum", pod(rl("1m", ""), rl("1m", "")), cgroups.QOSBurstable,
			kubeletCgroup{shares: 2, quota: 1_000_000, memoryLimit: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := specOf(tt.pod, tt.kq).kubelet; got != tt.want {
				t.Fatalf("kubelet cgroup = %+v, want %+v", got, tt.want)
			}
		})
	}
	// Batch limits come from the extended resources (batch-cpu counts millicores).
	p := pod(corev1.ResourceList{"understory.io/batch-cpu": resource.MustParse("1500"), "understory.io/batch-memory": resource.MustParse("2Gi")},
		corev1.ResourceList{"understory.io/batch-cpu": resource.MustParse("1500"), "understory.io/batch-memory": resource.MustParse("2Gi")})
	if s := specOf(p, cgroups.QOSBestEffort); s.batchCPU != 1.5 || s.batchMemory != 2<<30 {
		t.Fatalf("batch limits = %v cores, %v bytes; want 1.5, 2Gi", s.batchCPU, s.batchMemory)
	}
	// Koordinator's names for them, on a pod the webhook did not rename.
	k := pod(corev1.ResourceList{"kubernetes.io/batch-cpu": resource.MustParse("500"), "kubernetes.io/batch-memory": resource.MustParse("1Gi")},
		corev1.ResourceList{"kubernetes.io/batch-cpu": resource.MustParse("500"), "kubernetes.io/batch-memory": resource.MustParse("1Gi")})
	if s := specOf(k, cgroups.QOSBestEffort); s.batchCPU != 0.5 || s.batchMemory != 1<<30 {
		t.Fatalf("Koordinator's batch limits = %v cores, %v bytes; want 0.5, 1Gi", s.batchCPU, s.batchMemory)
	}
}

// An agent restarted while the pod source has not synced finds the in-place batch pods
// the previous run held (their cgroups have cpu.idle=1) and bounds them within the
// budget from the first period, instead of leaving the dead agent's quotas in force.
func TestAgentRediscoversInPlaceBatchAtStart(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			busy := r.warmUp()
			// The previous run is gone; it left the pod idle with a generous quota.
			orphan := "kubepods/besteffort/pod" + string(types.UID("55555555-5555-4555-8555-555555555555"))
			cgroupstest.AddGroup(t, r.root, kind, orphan)
			g, err := r.agent.hier.Load(orphan)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.SetIdle(true); err != nil {
				t.Fatal(err)
			}
			if err := g.SetCPULimit(1900_000, 1_000_000); err != nil { // 1.9 cores (µs)
				t.Fatal(err)
			}
			cfg := r.agent.cfg
			unsynced := &fakePods{changed: make(chan struct{}, 1), unsynced: true}
			a, err := New(cfg, Deps{Pods: unsynced, Registry: nil, NodeCPU: r.cpu, Logger: r.agent.log})
			if err != nil {
				t.Fatal(err)
			}
			r.agent = a
			if st := a.pods["55555555-5555-4555-8555-555555555555"]; st == nil || st.class != "batch" {
				t.Fatalf("orphaned in-place batch cgroup not rediscovered: %+v", a.pods)
			}
			if q := r.quota(orphan); q <= 0 || q > cfg.MinPodCPU+1e-6 {
				t.Fatalf("rediscovered pod quota %v before the first period, want the %v floor", q, cfg.MinPodCPU)
			}
			busy[orphan] = 1.5
			r.step(1.9, busy) // the first sample: no rate yet
			for range 10 {
				r.step(1.9, busy)
				r.checkWithinBudget(orphan) // the rediscovered pod
			}
			if st := a.Status(); st.PodSource.Synced {
				t.Fatal("status says the pod source synced")
			}
		})
	}
}

// A batch pod's own understory.io/batch-cpu limit caps its quota inside the budget: in
// place, its share never passes it (the rest goes to the others); below the tier, its
// pod cgroup gets the limit (at most the tier's share), and the tier needs no more than
// its pods' limits together.
func TestAgentEnforcesBatchCPULimits(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, kind, nil)
			limits := map[int]string{1: "300", 2: "400"}
			r.changePods(func(i int, p *corev1.Pod) {
				if milli, ok := limits[i]; ok {
					q := resource.MustParse(milli)
					p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"understory.io/batch-cpu": q}
					p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"understory.io/batch-cpu": q}
				}
			})
			busy := map[string]float64{r.lsCg: 0.2, r.inPlace: 0.3, r.inTier: 0.4}
			r.step(0, nil)
			for range 30 {
				r.step(0.9, busy)
			}
			budget := r.agent.Status().Budget.Applied
			if budget < 1 {
				t.Fatalf("budget %v: the test wants room above the pods' limits", budget)
			}
			if q := r.quota(r.inPlace); q > 0.3+1e-6 || q < 0.29 {
				t.Fatalf("in-place pod quota %v, want its 300m limit", q)
			}
			if q := r.quota(r.inTier); q > 0.4+1e-6 || q < 0.39 {
				t.Fatalf("tier pod quota %v, want its 400m limit", q)
			}
			if q := r.quota(r.tier); q > 0.4+1e-6 {
				t.Fatalf("tier quota %v, want at most its pods' limits (0.4)", q)
			}
		})
	}
}

// The published batch resources never drop below what the node's pods request of
// them: kubelet re-admits every pod against allocatable when it restarts and would
// kill batch pods that no longer fit (found by the real-node e2e's kubelet restart).
func TestAgentPublishesAtLeastBatchRequests(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	req := map[int]string{1: "600", 2: "900"}
	r.changePods(func(i int, p *corev1.Pod) {
		if milli, ok := req[i]; ok {
			l := corev1.ResourceList{"understory.io/batch-cpu": resource.MustParse(milli),
				"understory.io/batch-memory": resource.MustParse("1Gi")}
			p.Spec.Containers[0].Resources.Limits, p.Spec.Containers[0].Resources.Requests = l, l
		}
	})
	// LS takes the whole node: what LS leaves is 0.
	busy := map[string]float64{r.lsCg: 1.9, r.inPlace: 0.05, r.inTier: 0.05}
	r.step(0, nil)
	for range 40 {
		r.step(1.9, busy)
	}
	c := r.agent.Status().BatchResources.CPU
	if c.Raw > 0 {
		t.Fatalf("raw %v: the test wants LS to leave nothing", c.Raw)
	}
	if c.BatchRequest < 1.5-1e-9 || c.BatchRequest > 1.5+1e-9 || c.Computed < 1.5-1e-9 || c.Published < 1.5-1e-9 {
		t.Fatalf("cpu terms %+v: want batchRequest, computed and published 1.5 (the pods' 600m + 900m)", c)
	}
	// Memory follows the same formula (qos.TestReclaimPolicies); this rig has no
	// memory capacity to compute it from.
}

// A pod a restarted agent rediscovered as in-place batch (cpu.idle=1 in kubelet's
// cgroup) that the pod source, synced before the first period, lists as LS gets
// kubelet's values back: the agent wrote its quota, and nothing else ever would.
func TestAgentRestoresRediscoveredPodThatIsNoLongerBatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, cgroupstest.V2, nil)
	const uid = types.UID("55555555-5555-4555-8555-555555555555")
	orphan := "kubepods/besteffort/pod" + string(uid)
	cgroupstest.AddGroup(t, r.root, r.kind, orphan)
	g, err := r.agent.hier.Load(orphan)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetIdle(true); err != nil {
		t.Fatal(err)
	}
	pods := newFakePods(testPod("now-ls", uid, map[string]string{"understory.io/qos-class": "LS"}, ""))
	a, err := New(r.agent.cfg, Deps{Pods: pods, NodeCPU: r.cpu, Logger: r.agent.log})
	if err != nil {
		t.Fatal(err)
	}
	if q := r.quota(orphan); q <= 0 {
		t.Fatalf("rediscovered pod not bounded at start: quota %v", q)
	}
	a.syncPods(pods.List()) // as Run does before its first period
	if got := r.file(orphan, "cpu.idle"); got != "0" {
		t.Fatalf("cpu.idle = %s after the rediscovered pod turned out LS, want 0", got)
	}
	if q := r.quota(orphan); q != -1 {
		t.Fatalf("quota = %v after the rediscovered pod turned out LS, want kubelet's none", q)
	}
}
