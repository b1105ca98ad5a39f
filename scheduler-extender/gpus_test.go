package extender

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/placement"
	"github.com/understory/understory/scheduler-extender/wire"
)

const h100 = "NVIDIA-H100-80GB-HBM3"

// sharedNode is a node whose device plugin time-slices its GPUs into replicas: it
// advertises gpus×replicas nvidia.com/gpu and GPU feature discovery's labels.
func sharedNode(name string, gpus, replicas int) *corev1.Node {
	n := testNode(name, h100+"-SHARED", gpus*replicas, 64, 256)
	n.Labels[LabelGPUReplicas] = fmt.Sprint(replicas)
	n.Labels[LabelGPUSharingStrategy] = "time-slicing"
	return n
}

// withAgentGPUs adds node-metrics version 2 listing devs, stamped at stamp.
func withAgentGPUs(t *testing.T, n *corev1.Node, stamp time.Time, devs ...contract.GPUDevice) *corev1.Node {
	t.Helper()
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion2, Timestamp: stamp, WindowMillis: 10000,
		CPU: contract.CPUMetrics{Capacity: 64000}, GPU: &contract.GPUMetrics{Devices: devs}}
	ann, err := m.EncodeAnnotations()
	if err != nil {
		t.Fatal(err)
	}
	n.Annotations = ann
	return n
}

func gpuDev(i int, uuid string, healthy bool) contract.GPUDevice {
	return contract.GPUDevice{Index: i, UUID: uuid, Model: "NVIDIA H100 80GB HBM3", Healthy: healthy, Reclaimable: 1}
}

// TestNodeGPUsPhysical: a node's GPU slots are its physical GPUs: the agent's list
// (unhealthy or unlisted ones take no booking), else allocatable over the replicas.
func TestNodeGPUsPhysical(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	four := []contract.GPUDevice{gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-b", true), gpuDev(2, "GPU-c", true),
		gpuDev(3, "GPU-d", true)}
	tests := []struct {
		name   string
		node   *corev1.Node
		free   string
		model  string
		source string
		uuids  []string
	}{
		{"replicas do not count as GPUs", sharedNode("n", 4, 4), "[1000 1000 1000 1000]", h100,
			gpuSourceAllocatable, []string{"", "", "", ""}},
		{"GPU feature discovery's count bounds it", func() *corev1.Node {
			n := testNode("n", "T4", 16, 64, 256)
			n.Labels[LabelGPUCount] = "2"
			return n
		}(), "[1000 1000]", "T4", gpuSourceAllocatable, []string{"", ""}},
		{"the agent's list over replicas", withAgentGPUs(t, sharedNode("n", 4, 4), now, four...),
			"[1000 1000 1000 1000]", h100, gpuSourceAgent, []string{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}},
		{"an unhealthy GPU the device plugin dropped keeps its index, with no room", withAgentGPUs(t,
			testNode("n", h100, 3, 64, 256), now, gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-b", false),
			gpuDev(2, "GPU-c", true), gpuDev(3, "GPU-d", true)),
			"[1000 0 1000 1000]", h100, gpuSourceAgent, []string{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}},
		{"an index the agent does not list has no room", withAgentGPUs(t, testNode("n", h100, 2, 64, 256), now,
			gpuDev(0, "GPU-a", true), gpuDev(2, "GPU-c", true)),
			"[1000 0 1000]", h100, gpuSourceAgent, []string{"GPU-a", "", "GPU-c"}},
		{"the model from the agent without a label", withAgentGPUs(t, testNode("n", "", 1, 64, 256), now,
			gpuDev(0, "GPU-a", true)), "[1000]", h100, gpuSourceAgent, []string{"GPU-a"}},
		{"no device plugin, no GPU", withAgentGPUs(t, testNode("n", "", 0, 64, 256), now, four...),
			"[]", "", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := contract.DecodeNodeAnnotations(tc.node.Annotations)
			mp := &m
			if err != nil {
				mp = nil
			}
			n, table := nodeFromAPI(tc.node, mp)
			if got := fmt.Sprint(n.GPUFree); got != tc.free || n.Model != tc.model || table.source != tc.source ||
				!slices.Equal(table.uuids, tc.uuids) {
				t.Fatalf("GPUFree %s model %q source %q uuids %q; want %s %q %q %q", got, n.Model, table.source,
					table.uuids, tc.free, tc.model, tc.source, tc.uuids)
			}
		})
	}
}

// TestSharesAvoidUnhealthyGPU: the device plugin dropped unhealthy GPU 1, so
// allocatable says 3, and numbering the GPUs from that count (0..2) would book
// shares on index 1, the broken GPU. With the agent's list, no share lands
// there; a pod already running there stays charged there.
func TestSharesAvoidUnhealthyGPU(t *testing.T) {
	t.Parallel()
	rec := record.NewFakeRecorder(10)
	clock := newFakeClock()
	srv := testServer(t, clock, Deps{Recorder: rec, Registry: prometheus.NewRegistry()})
	s := srv.state
	s.UpsertNode(withAgentGPUs(t, testNode("n", h100, 3, 64, 256), clock.Now(), gpuDev(0, "GPU-a", true),
		gpuDev(1, "GPU-b", false), gpuDev(2, "GPU-c", true), gpuDev(3, "GPU-d", true)))
	// A share that ran on GPU 1 before it broke.
	s.UpsertPod(podtest.Pod("ns", "old", podtest.Milli(300), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1")))
	s.lock()
	defer s.unlock()
	e := s.led.node("n")
	for i := range 4 {
		p := s.podFromArgs(podtest.Pod("ns", fmt.Sprint("share-", i), podtest.Milli(600)))
		_, devs, ok := s.sc.servingPolicy().Score(e.n, p.req)
		if i == 3 {
			if ok {
				t.Fatalf("a fourth 600-milli share fits three healthy GPUs: devices %v", devs)
			}
			break
		}
		if !ok || slices.Contains(devs, 1) {
			t.Fatalf("share %d: devices %v, ok %v: never GPU 1, which is unhealthy", i, devs, ok)
		}
		if err := s.led.place(p, e, devs, phaseReserved); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(e.n.GPUFree); got != "[400 -300 400 400]" {
		t.Fatalf("GPUFree %s: the old share stays on GPU 1, the new ones on 0, 2, 3", got)
	}
	if p := s.pods[podtest.Pod("ns", "old").UID]; !slices.Equal(p.devices, []int{1}) || p.inferred {
		t.Fatalf("the share on the broken GPU moved: %v (inferred %v)", p.devices, p.inferred)
	}
	if n := len(rec.Events); n != 0 {
		t.Fatalf("%d events: %s", n, <-rec.Events)
	}
}

// TestBookingsFollowUUID: when the agent's list re-enumerates the GPUs, a
// reservation follows its GPU's UUID to the new index (its annotation is written
// at bind, from that index); a bound pod keeps its annotation's index, which the
// agent resolves at each container creation; a GPU that left keeps its slots.
func TestBookingsFollowUUID(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s, err := NewState(DefaultConfig(), clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	node := func(devs ...contract.GPUDevice) *corev1.Node {
		return withAgentGPUs(t, testNode("n", h100, 3, 64, 256), clock.Now(), devs...)
	}
	s.UpsertNode(node(gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-b", true), gpuDev(2, "GPU-c", true)))
	s.UpsertPod(podtest.Pod("ns", "bound", podtest.Milli(300), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
	s.lock()
	reserved := s.podFromArgs(podtest.Pod("ns", "reserved", podtest.Milli(500)))
	if err := s.led.place(reserved, s.led.node("n"), []int{1}, phaseReserved); err != nil {
		t.Fatal(err)
	}
	s.unlock()
	for _, step := range []struct {
		name      string
		node      *corev1.Node
		free      string
		held, got []int // the reserved pod's devices, the bound pod's
	}{
		{"re-enumerated", node(gpuDev(0, "GPU-b", true), gpuDev(1, "GPU-c", true), gpuDev(2, "GPU-a", true)),
			"[500 1000 700]", []int{0}, []int{2}},
		{"back", node(gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-b", true), gpuDev(2, "GPU-c", true)),
			"[1000 500 700]", []int{1}, []int{2}},
		{"its GPU left", node(gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-x", true), gpuDev(2, "GPU-c", true)),
			"[1000 500 700]", []int{1}, []int{2}},
	} {
		s.UpsertNode(step.node)
		s.mu.RLock()
		free := fmt.Sprint(s.led.nodes["n"].n.GPUFree)
		held, got := s.pods[reserved.uid].devices, s.pods[podtest.Pod("ns", "bound").UID].devices
		s.mu.RUnlock()
		if free != step.free || !slices.Equal(held, step.held) || !slices.Equal(got, step.got) {
			t.Fatalf("%s: GPUFree %s, reserved on %v, bound on %v; want %s %v %v", step.name, free, held, got,
				step.free, step.held, step.got)
		}
	}
}

// TestSharedModelMatches: the device plugin's -SHARED product suffix does not break
// a pod's GPU-model constraint, whichever side carries it.
func TestSharedModelMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		label, accepts string
		fits           bool
	}{
		{h100 + "-SHARED", h100, true},
		{h100, h100 + "-SHARED", true},
		{h100 + "-SHARED", h100 + "-SHARED", true},
		{h100 + "-SHARED", "NVIDIA-A100", false},
	} {
		t.Run(tc.label+"/"+tc.accepts, func(t *testing.T) {
			t.Parallel()
			obj := testNode("n", tc.label, 8, 64, 256)
			n, _ := nodeFromAPI(obj, nil)
			models, err := wire.ParseModels(tc.accepts)
			if err != nil {
				t.Fatal(err)
			}
			err = n.Fit(placement.Request{NumGPU: 1, GPUMilli: 500, Models: models})
			if (err == nil) != tc.fits {
				t.Fatalf("Fit = %v, want fit %v", err, tc.fits)
			}
		})
	}
	if _, err := wire.ParseModels("-SHARED"); err == nil {
		t.Fatal("a model that is only the suffix parses")
	}
}

// TestBindReplacesShareOnGPUGoneUnhealthy: a share reserved on a GPU that the agent
// reports unhealthy before the bind is placed again at bind time: the Binding's
// devices annotation never names the broken GPU. The reservation itself lands on the
// GPU whose LS-free share holds the share.
func TestBindReplacesShareOnGPUGoneUnhealthy(t *testing.T) {
	t.Parallel()
	pod := podtest.Pod("ns", "share", podtest.Milli(400))
	fc := newFakeCluster(t, pod)
	clock := newFakeClock()
	s := fedServer(t, clock, Deps{Client: fc})
	lsBusy, lsIdle := gpuDev(0, "GPU-a", true), gpuDev(1, "GPU-b", true)
	lsBusy.LSFreeMilli, lsIdle.LSFreeMilli = ptrTo(100), ptrTo(1000)
	s.state.UpsertNode(withAgentGPUs(t, testNode("n", h100, 2, 64, 256), clock.Now(), lsBusy, lsIdle))
	s.state.UpsertPod(pod)
	url := startHTTP(t, s)
	if node := passedOne(t, filter(t, url, pod, "n")); node != "n" {
		t.Fatalf("filter passed %s", node)
	}
	if got := fmt.Sprint(gpuFree(s, "n")); got != "[1000 600]" {
		t.Fatalf("reserved: GPUFree %s, want the share on GPU 1, whose LS leaves room", got)
	}
	broken := gpuDev(1, "GPU-b", false)
	s.state.UpsertNode(withAgentGPUs(t, testNode("n", h100, 1, 64, 256), clock.Now(), lsBusy, broken))
	if msg := bind(t, url, pod, "n"); msg != "" {
		t.Fatalf("bind: %s", msg)
	}
	if got := fc.pod(t, "ns", "share").Annotations[contract.AnnotationGPUDevices]; got != "0" {
		t.Fatalf("bound with %s=%q, want 0 (GPU 1 is unhealthy)", contract.AnnotationGPUDevices, got)
	}
	if got := fmt.Sprint(gpuFree(s, "n")); got != "[600 0]" {
		t.Fatalf("after bind: GPUFree %s", got)
	}
}

func ptrTo[T any](v T) *T { return &v }

// gpuMetricsNode is a 4-GPU node whose node-metrics v2 (and v1) annotations,
// stamped at stamp, report devices devs and kubelet's allocation alloc (nil:
// unknown).
func gpuMetricsNode(t *testing.T, name string, stamp time.Time, devs []contract.GPUDevice,
	alloc []contract.PodGPUs) *corev1.Node {
	t.Helper()
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion2, Timestamp: stamp, WindowMillis: 10000,
		CPU: contract.CPUMetrics{Capacity: 64000, Used: 2000}, GPU: &contract.GPUMetrics{Devices: devs}}
	if alloc != nil {
		m.GPU.Alloc = &contract.GPUAllocation{Pods: alloc}
	}
	ann, err := m.EncodeAnnotations()
	if err != nil {
		t.Fatal(err)
	}
	n := testNode(name, "A100", 4, 64, 256)
	n.Annotations = ann
	return n
}

func idleGPUs(n int) []contract.GPUDevice {
	out := make([]contract.GPUDevice, n)
	for i := range out {
		out[i] = contract.GPUDevice{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Healthy: true, MemTotal: 80 << 30,
			Reclaimable: 1}
	}
	return out
}

func allocated(ns, name, uid string, devs ...int) contract.PodGPUs {
	return contract.PodGPUs{Namespace: ns, Name: name, UID: uid, Devices: devs}
}

// TestReconcileWithKubeletAllocation: whole GPUs are the device plugin's
// choice; the ledger follows what the agent reports kubelet allocated, whichever
// of node and pod arrives first, moves unreported whole-GPU pods around it, and
// reports what still over-commits a device.
func TestReconcileWithKubeletAllocation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		setup      func(t *testing.T, s *State, now time.Time)
		want       string // GPUFree of n
		devices    map[string]string
		reconciled int
		event      string
	}{
		{"node report moves a bound pod", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 3)}))
		}, "[1000 1000 1000 0]", map[string]string{"a": "[3]"}, 1, ""},
		{"pod after the report takes kubelet's devices, not its annotation", func(t *testing.T, s *State, now time.Time) {
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 1, 2)}))
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1")))
			// An informer update with the stale annotation changes nothing.
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1")))
		}, "[1000 0 0 1000]", map[string]string{"a": "[1 2]"}, 0, ""},
		{"an unreported pod moves out of kubelet's way", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertPod(podtest.Pod("ns", "b", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1")))
			// kubelet gave b device 0; a is not reported yet: it moves, nothing over-commits.
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "b", "uid-ns-b", 0)}))
		}, "[0 0 1000 1000]", map[string]string{"a": "[1]", "b": "[0]"}, 1, ""},
		{"a share on a device kubelet gave away is reported", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "share", podtest.Milli(500), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertPod(podtest.Pod("ns", "whole", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4),
				[]contract.PodGPUs{allocated("ns", "whole", "uid-ns-whole", 2)}))
		}, "[1000 1000 -500 1000]", map[string]string{"share": "[2]", "whole": "[2]"}, 1,
			"Warning GPUDeviceConflict kubelet allocated devices 2 of node n to ns/whole, but ns/share also hold them"},
		{"an entry without a UID matches by name while fresh", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "", 3)}))
		}, "[1000 1000 1000 0]", map[string]string{"a": "[3]"}, 1, ""},
		{"a stale entry without a UID is not trusted", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now.Add(-time.Hour), idleGPUs(4),
				[]contract.PodGPUs{allocated("ns", "a", "", 3)}))
		}, "[0 1000 1000 1000]", map[string]string{"a": "[0]"}, 0, ""},
		{"kubelet's devices out of range are ignored", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 7)}))
		}, "[0 1000 1000 1000]", map[string]string{"a": "[0]"}, 0, ""},
		{"shares are the extender's: an entry for one is ignored", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "s", podtest.Milli(300), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "s", "uid-ns-s", 2)}))
		}, "[1000 700 1000 1000]", map[string]string{"s": "[1]"}, 0, ""},
		{"a version-1 node changes nothing", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			n := gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 3)})
			delete(n.Annotations, contract.AnnotationNodeMetricsV2)
			s.UpsertNode(n)
		}, "[0 1000 1000 1000]", map[string]string{"a": "[0]"}, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := record.NewFakeRecorder(10)
			clock := newFakeClock()
			srv := testServer(t, clock, Deps{Recorder: rec, Registry: prometheus.NewRegistry()})
			s := srv.state
			s.UpsertNode(testNode("n", "A100", 4, 64, 256))
			tc.setup(t, s, clock.Now())
			srv.Housekeep() // flushes the events
			s.mu.RLock()
			got := fmt.Sprint(s.led.nodes["n"].n.GPUFree)
			devs := map[string]string{}
			for _, p := range s.pods {
				devs[p.name] = fmt.Sprint(p.devices)
			}
			s.mu.RUnlock()
			if got != tc.want {
				t.Errorf("GPUFree %s, want %s", got, tc.want)
			}
			for name, want := range tc.devices {
				if devs[name] != want {
					t.Errorf("%s on devices %s, want %s", name, devs[name], want)
				}
			}
			if n := testutil.ToFloat64(srv.met.GPUReconciled); n != float64(tc.reconciled) {
				t.Errorf("gpu_ledger_reconciled_total %v, want %d", n, tc.reconciled)
			}
			select {
			case ev := <-rec.Events:
				if tc.event == "" || !strings.Contains(ev, tc.event) {
					t.Errorf("event %q, want one containing %q", ev, tc.event)
				}
			default:
				if tc.event != "" {
					t.Errorf("no event, want %q", tc.event)
				}
			}
		})
	}
}

// TestGPUUsageFromNodeMetrics: version-2 GPU figures reach placement per device
// while fresh; stale ones, unhealthy devices and devices the agent did not
// report count as unknown.
func TestGPUUsageFromNodeMetrics(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	s, err := NewState(DefaultConfig(), clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	devs := []contract.GPUDevice{
		{Index: 0, UUID: "GPU-0", Healthy: true, Util: 90, LSUtil: 90, Reclaimable: 0.1, MemTotal: 1},
		{Index: 2, UUID: "GPU-2", Healthy: false, MemTotal: 1},
		{Index: 3, UUID: "GPU-3", Healthy: true, Util: 5, Reclaimable: 1, MemTotal: 1},
	}
	s.UpsertNode(gpuMetricsNode(t, "n", clock.Now(), devs, nil))
	usage := func() *placement.Usage {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.led.nodes["n"].n.Usage
	}
	u := usage()
	if u == nil {
		t.Fatal("fresh version-2 metrics not applied")
	}
	want := []placement.GPUUsage{{Known: true, Util: 90, LSUtil: 90, Reclaimable: 0.1}, {}, {},
		{Known: true, Util: 5, Reclaimable: 1}}
	if fmt.Sprint(u.GPUs) != fmt.Sprint(want) {
		t.Fatalf("GPUs %+v, want %+v", u.GPUs, want)
	}
	// A share goes to the idle device 3, not to the LS-busy device 0 nor to the
	// unknown ones.
	s.mu.RLock()
	_, got, ok := s.sc.policy.Score(s.led.nodes["n"].n, placement.Request{CPUMilli: 100, NumGPU: 1, GPUMilli: 500})
	s.mu.RUnlock()
	if !ok || fmt.Sprint(got) != "[3]" {
		t.Fatalf("share placed on %v (ok %v), want [3]", got, ok)
	}
	clock.Advance(DefaultConfig().MetricsMaxAge + time.Second)
	s.mu.Lock()
	s.refreshAllUsage(clock.Now())
	s.mu.Unlock()
	if usage() != nil {
		t.Fatal("stale metrics must read as unknown")
	}
}
