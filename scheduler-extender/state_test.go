package extender

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/record"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/scheduler-extender/internal/podtest"
	"github.com/understory/understory/scheduler-extender/placement"
)

func TestIndexAccountsBoundPods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(s *State)
		want  string // GPUFree of n
	}{
		{"devices from annotation", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1,3")))
		}, "[1000 0 1000 0]"},
		{"shares stack on one device", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.Milli(300), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertPod(podtest.Pod("ns", "b", podtest.Milli(500), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
		}, "[1000 1000 200 1000]"},
		{"missing annotation is inferred on the freest devices", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertPod(podtest.Pod("ns", "b", podtest.GPUs(2), podtest.OnNode("n")))
		}, "[0 0 0 1000]"},
		{"wrong annotation is inferred", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "7,9")))
		}, "[0 0 1000 1000]"},
		{"pod before node is an orphan until the node arrives", func(s *State) {
			s.DeleteNode("n")
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "3")))
			s.UpsertNode(testNode("n", "A100", 4, 64, 256))
		}, "[1000 1000 1000 0]"},
		{"deleted pod frees its devices", func(s *State) {
			p := podtest.Pod("ns", "a", podtest.GPUs(4), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1,2,3"))
			s.UpsertPod(p)
			s.DeletePod(p.UID)
		}, "[1000 1000 1000 1000]"},
		{"terminated pod frees its devices", func(s *State) {
			p := podtest.Pod("ns", "a", podtest.GPUs(4), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1,2,3"))
			s.UpsertPod(p)
			p = p.DeepCopy()
			p.Status.Phase = "Succeeded"
			s.UpsertPod(p)
		}, "[1000 1000 1000 1000]"},
		{"capacity change keeps placed pods", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1")))
			n := testNode("n", "A100", 4, 64, 256)
			n.Status.Allocatable["cpu"] = resource.MustParse("32")
			s.UpsertNode(n)
		}, "[1000 0 1000 1000]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := NewState(DefaultConfig(), newFakeClock().Now)
			if err != nil {
				t.Fatal(err)
			}
			s.UpsertNode(testNode("n", "A100", 4, 64, 256))
			tc.setup(s)
			s.mu.RLock()
			got := fmt.Sprint(s.led.nodes["n"].n.GPUFree)
			s.mu.RUnlock()
			if got != tc.want {
				t.Fatalf("GPUFree %s, want %s", got, tc.want)
			}
		})
	}
}

func TestNodeFromAPI(t *testing.T) {
	t.Parallel()
	n := testNode("n", "NVIDIA-A100", 8, 96, 512)
	n.Status.Allocatable[contract.ResourceBatchCPU] = resource.MustParse("12000")
	n.Status.Allocatable[contract.ResourceBatchMemory] = resource.MustParse("4Gi")
	got, _ := nodeFromAPI(n, nil)
	if got.Model != "NVIDIA-A100" || len(got.GPUFree) != 8 || got.CPUMilli != 96000 || got.MemoryMiB != 512<<10 ||
		got.MaxPods != 110 || got.BatchCPUMilli != 12000 || got.BatchMemoryMiB != 4096 {
		t.Fatalf("got %+v", got)
	}
	labelOnly := testNode("l", "", 0, 8, 8)
	labelOnly.Labels[LabelGPUProduct] = "A100"
	if got, _ := nodeFromAPI(labelOnly, nil); len(got.GPUFree) != 0 || got.Model != "" {
		t.Fatalf("a label without capacity means no GPU: %+v", got)
	}
}

// nodeWithMetrics is an 8-CPU node whose node-metrics annotation, stamped at
// stamp, reports 2 of its 8 cores used.
func nodeWithMetrics(t *testing.T, name string, stamp time.Time) *corev1.Node {
	t.Helper()
	m := contract.NodeMetrics{Version: contract.NodeMetricsVersion, Timestamp: stamp, WindowMillis: 10000,
		CPU: contract.CPUMetrics{Capacity: 8000, Used: 2000}}
	enc, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	n := testNode(name, "", 0, 8, 8)
	n.Annotations = map[string]string{contract.AnnotationNodeMetrics: string(enc)}
	return n
}

func TestNodeMetricsFreshness(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	cfg := DefaultConfig()
	srv := testServer(t, clock, Deps{})
	s := srv.state
	s.UpsertNode(nodeWithMetrics(t, "n", clock.Now()))
	bad := testNode("bad", "", 0, 8, 8)
	bad.Annotations = map[string]string{contract.AnnotationNodeMetrics: `{"v":99}`}
	s.UpsertNode(bad)
	usage := func(name string) *placement.Usage {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.led.nodes[name].n.Usage
	}
	if u := usage("n"); u == nil || u.CPUUsed != 2000 {
		t.Fatalf("fresh metrics not applied: %+v", u)
	}
	if usage("bad") != nil {
		t.Fatal("undecodable metrics must read as unknown")
	}
	if snapshotMetrics(srv).StaleNodeMetrics != 1 {
		t.Fatal("one node should count as stale")
	}
	clock.Advance(cfg.MetricsMaxAge + time.Second)
	srv.Housekeep()
	if usage("n") != nil {
		t.Fatal("metrics older than the max age must read as unknown, never idle")
	}
	st := srv.Status()
	for _, ns := range st.Nodes {
		if ns.MetricsFresh || ns.MetricsProblem == "" {
			t.Fatalf("node status %+v", ns)
		}
		if ns.Name == "bad" && !strings.Contains(ns.MetricsProblem, "unsupported") {
			t.Fatalf("bad node problem %q", ns.MetricsProblem)
		}
	}
}

// TestNodeMetricsFromTheFuture: an annotation stamped beyond the clock-skew
// allowance counts as unknown; within it, as fresh. Before, a future timestamp
// had age 0 and stayed fresh forever.
func TestNodeMetricsFromTheFuture(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	tests := []struct {
		name      string
		ahead     time.Duration
		wantFresh bool
	}{
		{"now", 0, true},
		{"within the skew", cfg.MetricsMaxSkew, true},
		{"beyond the skew", cfg.MetricsMaxSkew + time.Second, false},
		{"far future", 24 * time.Hour, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			srv := testServer(t, clock, Deps{})
			s := srv.state
			s.UpsertNode(nodeWithMetrics(t, "n", clock.Now().Add(tc.ahead)))
			fresh := func() bool {
				s.mu.RLock()
				defer s.mu.RUnlock()
				return s.led.nodes["n"].n.Usage != nil
			}
			if got := fresh(); got != tc.wantFresh {
				t.Fatalf("fresh = %v, want %v", got, tc.wantFresh)
			}
			if tc.ahead <= cfg.MetricsMaxAge {
				return
			}
			// A far-future stamp must not turn fresh by waiting a max age.
			clock.Advance(cfg.MetricsMaxAge)
			srv.Housekeep()
			if fresh() {
				t.Fatal("a far-future stamp turned fresh")
			}
			st := srv.Status()
			if p := st.Nodes[0].MetricsProblem; !strings.Contains(p, "future") {
				t.Fatalf("status problem %q", p)
			}
		})
	}
}

func TestRefreshWorkloadInvalidatesScores(t *testing.T) {
	t.Parallel()
	s, err := NewState(DefaultConfig(), newFakeClock().Now)
	if err != nil {
		t.Fatal(err)
	}
	s.UpsertNode(testNode("n", "A100", 8, 64, 256))
	for i := range 5 {
		s.UpsertPod(podtest.Pod("ns", fmt.Sprintf("p%d", i), podtest.Milli(500)))
	}
	epoch := s.sc.epoch
	if err := s.RefreshWorkload(); err != nil {
		t.Fatal(err)
	}
	if s.sc.epoch == epoch {
		t.Fatal("a new workload must start a new score epoch")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"default", func(*Config) {}, ""},
		{"unknown policy", func(c *Config) { c.Policy = "magic" }, "unknown placement policy"},
		{"coverage", func(c *Config) { c.WorkloadCoverage = 1.5 }, "coverage"},
		{"zero ttl", func(c *Config) { c.AssumedTTL = 0 }, "assumed ttl"},
		{"write timeout too short for gang bind", func(c *Config) { c.WriteTimeout = c.GangBindTimeout }, "write timeout"},
		{"plan shorter than bind wait", func(c *Config) { c.GangPlanTTL = time.Second }, "gang plan ttl"},
		{"tiny body", func(c *Config) { c.MaxBodyBytes = 10 }, "max body"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := DefaultConfig()
			tc.mut(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidConfig) && !errors.Is(err, placement.ErrUnknownPolicy) {
				t.Fatalf("err %v wraps no sentinel", err)
			}
		})
	}
}

// TestConflictingDeviceAnnotationsFirstWins: a bound pod whose devices
// annotation names devices that pods accounted before it already fill (a pod
// copied with its annotation, two pods claiming one GPU) does not over-book
// them: the first holder keeps them, the later pod is accounted on inferred
// devices, and the conflict is a Warning Event on it and a metric. Before, both
// were charged on the same device and the index went negative there.
func TestConflictingDeviceAnnotationsFirstWins(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		setup     func(s *State)
		want      string // GPUFree of n
		conflicts int
		event     string
	}{
		{"copied whole-GPU annotation", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
			s.UpsertPod(podtest.Pod("ns", "copy", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0")))
		}, "[0 0 1000 1000]", 1,
			"Warning GPUDeviceConflict understory.io/gpu-devices=0 names devices of node n that ns/a already hold: " +
				"the first holder keeps them; ns/copy is accounted on devices 1 instead"},
		{"shares over one device", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.Milli(600), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertPod(podtest.Pod("ns", "b", podtest.Milli(600), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
		}, "[400 1000 400 1000]", 1, "ns/b is accounted on devices 0 instead"},
		{"shares that fit together are no conflict", func(s *State) {
			s.UpsertPod(podtest.Pod("ns", "a", podtest.Milli(400), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertPod(podtest.Pod("ns", "b", podtest.Milli(600), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
		}, "[1000 1000 0 1000]", 0, ""},
		{"pods bound before their node is known: the first learned wins", func(s *State) {
			s.DeleteNode("n")
			s.UpsertPod(podtest.Pod("ns", "z-first", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "1,2")))
			s.UpsertPod(podtest.Pod("ns", "a-second", podtest.GPUs(1), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "2")))
			s.UpsertNode(testNode("n", "A100", 4, 64, 256))
		}, "[0 0 0 1000]", 1, "that ns/z-first already hold: the first holder keeps them; ns/a-second is accounted on devices 0"},
		{"the same pod again is no conflict", func(s *State) {
			p := podtest.Pod("ns", "a", podtest.GPUs(2), podtest.OnNode("n"), podtest.Annotate(contract.AnnotationGPUDevices, "0,1"))
			s.UpsertPod(p)
			s.UpsertPod(p.DeepCopy())
		}, "[0 0 1000 1000]", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := record.NewFakeRecorder(10)
			reg := prometheus.NewRegistry()
			srv := testServer(t, newFakeClock(), Deps{Recorder: rec, Registry: reg})
			s := srv.state
			s.UpsertNode(testNode("n", "A100", 4, 64, 256))
			tc.setup(s)
			srv.Housekeep() // flushes the events
			s.mu.RLock()
			got := fmt.Sprint(s.led.nodes["n"].n.GPUFree)
			s.mu.RUnlock()
			if got != tc.want {
				t.Errorf("GPUFree %s, want %s", got, tc.want)
			}
			if n := testutil.ToFloat64(srv.met.DeviceConflicts); n != float64(tc.conflicts) {
				t.Errorf("device_conflicts_total %v, want %d", n, tc.conflicts)
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
