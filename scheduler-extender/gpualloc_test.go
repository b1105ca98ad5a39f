package extender

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/contract"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/scheduler-extender/placement"
)

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
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 3)}))
		}, "[1000 1000 1000 0]", map[string]string{"a": "[3]"}, 1, ""},
		{"pod after the report takes kubelet's devices, not its annotation", func(t *testing.T, s *State, now time.Time) {
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 1, 2)}))
			s.UpsertPod(testPod("ns", "a", gpus(2), onNode("n"), annotate(contract.AnnotationGPUDevices, "0,1")))
			// An informer update with the stale annotation changes nothing.
			s.UpsertPod(testPod("ns", "a", gpus(2), onNode("n"), annotate(contract.AnnotationGPUDevices, "0,1")))
		}, "[1000 0 0 1000]", map[string]string{"a": "[1 2]"}, 0, ""},
		{"an unreported pod moves out of kubelet's way", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertPod(testPod("ns", "b", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "1")))
			// kubelet gave b device 0; a is not reported yet: it moves, nothing over-commits.
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "b", "uid-ns-b", 0)}))
		}, "[0 0 1000 1000]", map[string]string{"a": "[1]", "b": "[0]"}, 1, ""},
		{"a share on a device kubelet gave away is reported", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "share", milli(500), onNode("n"), annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertPod(testPod("ns", "whole", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4),
				[]contract.PodGPUs{allocated("ns", "whole", "uid-ns-whole", 2)}))
		}, "[1000 1000 -500 1000]", map[string]string{"share": "[2]", "whole": "[2]"}, 1,
			"Warning GPUDeviceConflict kubelet allocated devices 2 of node n to ns/whole, but ns/share also hold them"},
		{"an entry without a UID matches by name while fresh", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "", 3)}))
		}, "[1000 1000 1000 0]", map[string]string{"a": "[3]"}, 1, ""},
		{"a stale entry without a UID is not trusted", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now.Add(-time.Hour), idleGPUs(4),
				[]contract.PodGPUs{allocated("ns", "a", "", 3)}))
		}, "[0 1000 1000 1000]", map[string]string{"a": "[0]"}, 0, ""},
		{"kubelet's devices out of range are ignored", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "a", "uid-ns-a", 7)}))
		}, "[0 1000 1000 1000]", map[string]string{"a": "[0]"}, 0, ""},
		{"shares are the extender's: an entry for one is ignored", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "s", milli(300), onNode("n"), annotate(contract.AnnotationGPUDevices, "1")))
			s.UpsertNode(gpuMetricsNode(t, "n", now, idleGPUs(4), []contract.PodGPUs{allocated("ns", "s", "uid-ns-s", 2)}))
		}, "[1000 700 1000 1000]", map[string]string{"s": "[1]"}, 0, ""},
		{"a version-1 node changes nothing", func(t *testing.T, s *State, now time.Time) {
			s.UpsertPod(testPod("ns", "a", gpus(1), onNode("n"), annotate(contract.AnnotationGPUDevices, "0")))
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
			s := srv.State()
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
