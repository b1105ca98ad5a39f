package nodestatus

import (
	"encoding/json"
	"io"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/understory/understory/contract"
)

// gpuMilliOn is what node holds of understory.io/gpu-milli in capacity and
// allocatable (-1: absent).
func gpuMilliOn(t *testing.T, n *corev1.Node) (capacity, allocatable int64) {
	t.Helper()
	get := func(l corev1.ResourceList) int64 {
		q, ok := l[contract.ResourceGPUMilli]
		if !ok {
			return -1
		}
		return q.Value()
	}
	return get(n.Status.Capacity), get(n.Status.Allocatable)
}

func TestGPUPatchFor(t *testing.T) {
	t.Parallel()
	b, err := GPUPatchFor(2000)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"status":{"allocatable":{"understory.io/gpu-milli":"2000"},` +
		`"capacity":{"understory.io/gpu-milli":"2000"}}}`
	if string(b) != want {
		t.Fatalf("patch:\n got %s\nwant %s", b, want)
	}
	both, err := patchFor(target{batch: Resources{CPUMilli: 1, MemoryBytes: 2}, hasBatch: true, gpuMilli: 3000,
		hasGPU: true})
	if err != nil {
		t.Fatal(err)
	}
	orig, err := json.Marshal(kubeletNode("n1"))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := jsonpatch.MergePatch(orig, both)
	if err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := json.Unmarshal(merged, &n); err != nil {
		t.Fatal(err)
	}
	if c, a := gpuMilliOn(t, &n); c != 3000 || a != 3000 {
		t.Fatalf("gpu-milli capacity %d allocatable %d, want 3000", c, a)
	}
	// kubelet's keys, nvidia.com/gpu included, survive the merge.
	for k, v := range kubeletNode("n1").Status.Allocatable {
		if g := n.Status.Allocatable[k]; g.Cmp(v) != 0 {
			t.Fatalf("allocatable[%s] = %s, want kubelet's %s", k, g.String(), v.String())
		}
	}
}

// TestPublishesGPUMilli: SetGPUMilli writes understory.io/gpu-milli alone, next to the
// batch resources when those are set too; a reset by kubelet is repaired at resync; a
// Node already holding the value is not patched.
func TestPublishesGPUMilli(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(kubeletNode("n1"))
	p := newPublisher(t, c.CoreV1().Nodes(), WithResync(20*time.Millisecond), WithLogger(testLogger(io.Discard)))
	start(t, p)
	if p.SetGPUMilli(2000) {
		t.Fatal("SetGPUMilli clamped a valid value")
	}
	waitFor(t, "gpu synced", func() bool { return p.Status().Synced })
	s := p.Status()
	if s.Desired != nil || s.Written != nil || *s.DesiredGPUMilli != 2000 || *s.WrittenGPUMilli != 2000 {
		t.Fatalf("status %+v", s)
	}
	n := getNode(t, c)
	if cp, al := gpuMilliOn(t, n); cp != 2000 || al != 2000 {
		t.Fatalf("gpu-milli capacity %d allocatable %d, want 2000", cp, al)
	}
	if _, ok := n.Status.Allocatable[contract.ResourceBatchCPU]; ok {
		t.Fatal("batch resources written before Set")
	}
	if got := patches(c); len(got) != 1 || got[0] != mustGPUPatch(2000) {
		t.Fatalf("patches %q, want only the gpu-milli one", got)
	}

	batch := Resources{CPUMilli: 1500, MemoryBytes: 2 << 30}
	p.Set(batch)
	waitFor(t, "both synced", func() bool { s := p.Status(); return s.Synced && s.Written != nil })
	n = getNode(t, c)
	if cp, al := gpuMilliOn(t, n); cp != 2000 || al != 2000 {
		t.Fatalf("gpu-milli lost when the batch resources were written: %d/%d", cp, al)
	}
	if q := n.Status.Allocatable[contract.ResourceBatchCPU]; q.Value() != 1500 {
		t.Fatalf("batch-cpu %s", q.String())
	}

	// kubelet re-registers the Node and drops the extended resources it does not manage.
	n.Status.Capacity = kubeletNode("n1").Status.Capacity
	n.Status.Allocatable = kubeletNode("n1").Status.Allocatable
	if _, err := c.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "repaired", func() bool {
		cp, al := gpuMilliOn(t, getNode(t, c))
		return cp == 2000 && al == 2000
	})

	// Unchanged values are not patched again; a new one is.
	before := len(patches(c))
	p.SetGPUMilli(2000)
	p.Set(batch)
	p.SetGPUMilli(1000)
	waitFor(t, "new gpu value", func() bool {
		s := p.Status()
		return s.Synced && *s.WrittenGPUMilli == 1000
	})
	if cp, al := gpuMilliOn(t, getNode(t, c)); cp != 1000 || al != 1000 {
		t.Fatalf("gpu-milli %d/%d, want 1000", cp, al)
	}
	if got := len(patches(c)) - before; got < 1 {
		t.Fatalf("%d patches for a new gpu-milli value", got)
	}
}

func TestGPUMilliAlreadyThereAndClamped(t *testing.T) {
	t.Parallel()
	n := kubeletNode("n1")
	n.Status.Capacity[contract.ResourceGPUMilli] = resource.MustParse("0")
	n.Status.Allocatable[contract.ResourceGPUMilli] = resource.MustParse("0")
	c := fake.NewClientset(n)
	p := newPublisher(t, c.CoreV1().Nodes(), WithLogger(testLogger(io.Discard)))
	if !p.SetGPUMilli(-1000) {
		t.Fatal("a negative value was not clamped")
	}
	start(t, p)
	waitFor(t, "synced", func() bool { return p.Status().Synced })
	if s := p.Status(); s.Clamped != 1 || *s.DesiredGPUMilli != 0 || s.Writes != 0 {
		t.Fatalf("status %+v", s)
	}
	if got := patches(c); len(got) != 0 {
		t.Fatalf("patched a Node that already held the value: %q", got)
	}
}

func mustGPUPatch(milli int64) string {
	b, err := GPUPatchFor(milli)
	if err != nil {
		panic(err)
	}
	return string(b)
}
