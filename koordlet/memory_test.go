package koordlet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/qos"
)

const gib = 1 << 30

// memRig gives the rig's cgroups memory controller files and a /proc/meminfo.
type memRig struct {
	*rig
}

func newMemRig(t *testing.T, kind cgroupstest.Kind, mutate func(*config.Config)) memRig {
	t.Helper()
	procRoot := t.TempDir()
	r := newRig(t, kind, func(c *config.Config) {
		c.ProcRoot = procRoot
		if mutate != nil {
			mutate(c)
		}
	})
	for _, cg := range []string{"kubepods", "kubepods/besteffort", "kubepods/burstable", r.tier, r.lsCg, r.inPlace, r.inTier} {
		cgroupstest.AddMemory(t, r.root, kind, cg)
	}
	m := memRig{r}
	m.meminfo(16*gib, 12*gib)
	return m
}

func (m memRig) meminfo(total, avail uint64) {
	m.t.Helper()
	s := "MemTotal: " + strconv.FormatUint(total/1024, 10) + " kB\nMemFree: 0 kB\nMemAvailable: " +
		strconv.FormatUint(avail/1024, 10) + " kB\n"
	if err := os.WriteFile(filepath.Join(m.agent.cfg.ProcRoot, "meminfo"), []byte(s), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

// setMem sets a group's memory usage (no inactive cache).
func (m memRig) setMem(cg string, bytes uint64) {
	m.t.Helper()
	dir := cgroupstest.MemoryDir(m.root, m.kind, cg)
	file := "memory.usage_in_bytes"
	if m.kind.IsV2() {
		file = "memory.current"
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatUint(bytes, 10)+"\n"), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

func (m memRig) memFile(cg, name string) string {
	m.t.Helper()
	b, err := os.ReadFile(filepath.Join(cgroupstest.MemoryDir(m.root, m.kind, cg), name))
	if err != nil {
		m.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (m memRig) limit(cg string) float64 {
	m.t.Helper()
	name := "memory.limit_in_bytes"
	if m.kind.IsV2() {
		name = "memory.max"
	}
	v := m.memFile(cg, name)
	if v == "max" {
		return -1
	}
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

// The tier gets capacity × memory threshold − LS memory, cut at once when LS grows; a
// batch pod gets its own understory.io/batch-memory limit (with memory.high below it on
// v2); the memory figures attribute LS from the aggregates.
func TestAgentMemoryLimits(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.Hybrid} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			m := newMemRig(t, kind, nil)
			m.changePods(func(i int, p *corev1.Pod) {
				if i == 1 {
					p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
						"understory.io/batch-memory": resource.MustParse("1Gi")}
				}
			})
			// kubepods 6 GiB: LS 4 GiB (burstable), batch 1 GiB in place (besteffort), tier 1 GiB.
			m.setMem(m.lsCg, 4*gib)
			m.setMem("kubepods/burstable", 4*gib)
			m.setMem(m.inPlace, 1*gib)
			m.setMem("kubepods/besteffort", 1*gib)
			m.setMem(m.tier, 1*gib)
			m.setMem("kubepods", 6*gib)
			busy := map[string]float64{m.lsCg: 0.3, m.inPlace: 0.5, m.inTier: 0.6}
			for range 12 { // past a slow period, so per-pod memory is read
				m.step(1.5, busy)
			}
			st := m.agent.Status()
			if st.Memory.Capacity != 16*gib || st.Memory.LS != 4*gib || st.Memory.Batch != 2*gib {
				t.Fatalf("memory = %+v; want capacity 16Gi, LS 4Gi, batch 2Gi", st.Memory)
			}
			thr := m.agent.cfg.BatchResources.Memory.Threshold
			want := 16*gib*thr - 4*gib
			if got := m.limit(m.tier); got < want-1 || got > want+1 {
				t.Fatalf("tier memory limit = %v, want capacity × %v − LS = %v", got, thr, want)
			}
			if got := m.limit(m.inPlace); got != gib {
				t.Fatalf("batch pod memory limit = %v, want its batch-memory 1Gi", got)
			}
			if kind.IsV2() {
				highOf1Gi := float64(gib)
				highOf1Gi *= qos.MemoryHighShare
				if h, _ := strconv.ParseInt(m.memFile(m.inPlace, "memory.high"), 10, 64); h != int64(highOf1Gi) {
					t.Fatalf("memory.high = %v, want 0.9 of 1Gi", h)
				}
			}
			// LS grows by 3 GiB: the tier is cut in the next memory period.
			m.setMem(m.lsCg, 7*gib)
			m.setMem("kubepods/burstable", 7*gib)
			m.setMem("kubepods", 9*gib)
			for range memoryEvery {
				m.step(1.5, busy)
			}
			want = 16*gib*thr - 7*gib
			if got := m.limit(m.tier); got < want-1 || got > want+1 {
				t.Fatalf("tier memory limit after LS grew = %v, want %v (a cut is applied at once)", got, want)
			}
			if b := m.agent.Status().BatchResources.Memory; b.Capacity != 16*gib || b.LSUsage != 7*gib {
				t.Fatalf("batch memory terms = %+v", b)
			}
		})
	}
}

// kubepods' memory limit (kubelet sets it to the node's allocatable) is the capacity pods
// may use when it is below MemTotal.
func TestAgentMemoryCapacityFromKubepods(t *testing.T) {
	t.Parallel()
	m := newMemRig(t, cgroupstest.V2, nil)
	if err := os.WriteFile(filepath.Join(m.root, "kubepods", "memory.max"), []byte("12884901888\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.step(0.5, nil)
	}
	if c := m.agent.Status().Memory.Capacity; c != 12*gib {
		t.Fatalf("capacity = %v, want kubepods' limit 12Gi", c)
	}
}

// Per-pod memory (the in-place batch pods, eviction candidates by size) is read again on
// later memory samples, not only at the first one: the memory sample must fall on a slow
// period now and then.
func TestAgentPodMemoryRefreshed(t *testing.T) {
	t.Parallel()
	m := newMemRig(t, cgroupstest.V2, nil)
	m.setMem(m.inPlace, 1*gib)
	m.setMem("kubepods/besteffort", 1*gib)
	m.setMem("kubepods", 1*gib)
	m.step(0.5, nil) // first sample: no rates yet, no memory
	m.step(0.5, nil)
	if b := m.agent.Status().Memory.Batch; b != 1*gib {
		t.Fatalf("batch memory after the first sample = %v, want 1Gi", b)
	}
	m.setMem(m.inPlace, 3*gib)
	m.setMem("kubepods/besteffort", 3*gib)
	m.setMem("kubepods", 3*gib)
	for range 2 * slowEvery {
		m.step(0.5, nil)
	}
	if b := m.agent.Status().Memory.Batch; b != 3*gib {
		t.Fatalf("batch memory two slow periods later = %v, want the in-place pod's new 3Gi", b)
	}
}

// A batch pod the agent gave its batch-memory limit gets kubelet's memory limit back
// (none for a BestEffort pod) when it leaves batch.
func TestAgentRestoresMemoryLimitWhenPodLeavesBatch(t *testing.T) {
	t.Parallel()
	for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.Hybrid} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			m := newMemRig(t, kind, nil)
			m.changePods(func(i int, p *corev1.Pod) {
				if i == 1 {
					p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{
						"understory.io/batch-memory": resource.MustParse("1Gi")}
				}
			})
			m.step(0.5, nil)
			m.step(0.5, nil)
			if got := m.limit(m.inPlace); got != gib {
				t.Fatalf("batch pod memory limit = %v, want its batch-memory 1Gi", got)
			}
			m.changePods(func(i int, p *corev1.Pod) {
				if i == 1 {
					p.Annotations = map[string]string{"understory.io/qos-class": "LS"}
				}
			})
			if got := m.limit(m.inPlace); got != -1 {
				t.Fatalf("memory limit = %v after the pod left batch, want none (kubelet sets none)", got)
			}
		})
	}
}
