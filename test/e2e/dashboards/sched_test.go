package dashboards

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	extender "github.com/understory/understory/scheduler-extender"
	"github.com/understory/understory/test/e2e/extenderharness"
)

// schedNamespace is where the scheduling traffic's pods live.
const schedNamespace = "dash"

// secondSchedulerConfig is the second scheduler's KubeSchedulerConfiguration (its one
// profile, understory-scheduler, calls the extender), relative to the module root.
const secondSchedulerConfig = "manifests/components/second-scheduler/kube-scheduler-config.yaml"

// secondSchedulerName is that profile: the scheduler the traffic's pods name, as the
// webhook names it for batch and GPU pods in the managed-cluster mode.
const secondSchedulerName = "understory-scheduler"

// cluster is the real control plane, kube-scheduler configured as the second
// scheduler (the shipped configuration, the extender's URL the harness's) and the real
// extender, with three nodes: two with four A100s, one CPU-only; every node offers
// batch-cpu and batch-memory.
type cluster struct {
	cp    *controlplane.ControlPlane
	ext   *extenderharness.Extender
	sched *controlplane.Scheduler
}

func startCluster(ctx context.Context, t *testing.T) *cluster {
	t.Helper()
	cp := controlplane.Start(ctx, t, controlplane.Options{})
	if _, err := cp.InstallCRD(ctx, controlplane.PodGroupCRD()); err != nil {
		t.Fatal(err)
	}
	// The extender starts before the scheduler, so its cleanup runs after the
	// scheduler's: kube-scheduler never calls a closed extender.
	cfg := extender.DefaultConfig()
	// No Volcano CRD on this control plane: its informer would only fail to list
	// (and show as stale); the PodGroup CRD is installed above.
	cfg.VolcanoPodGroups = false
	ext := extenderharness.Start(ctx, t, cp, extenderharness.Options{Config: &cfg})
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, secondSchedulerConfig))
	if err != nil {
		t.Fatal(err)
	}
	schedCfg, err := controlplane.ManifestSchedulerConfig(manifest, ext.URL())
	if err != nil {
		t.Fatal(err)
	}
	sched := cp.StartScheduler(t, schedCfg)
	if err := cp.CreateNamespace(ctx, schedNamespace); err != nil {
		t.Fatal(err)
	}
	for i, gpus := range []int{4, 4, 0} {
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:           resource.MustParse("16"),
			corev1.ResourceMemory:        resource.MustParse("64Gi"),
			contract.ResourceBatchCPU:    resource.MustParse("6000"),
			contract.ResourceBatchMemory: resource.MustParse("16Gi"),
		}
		labels := map[string]string{}
		name := fmt.Sprintf("e2e-cpu-%d", i)
		if gpus > 0 {
			capacity[contract.ResourceGPU] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
			labels[extender.LabelGPUProduct] = "NVIDIA-A100-SXM4-80GB"
			name = fmt.Sprintf("e2e-gpu-%d", i)
		}
		if _, err := cp.CreateNode(ctx, name, capacity, labels); err != nil {
			t.Fatal(err)
		}
	}
	return &cluster{cp: cp, ext: ext, sched: sched}
}

// metricsAddr is the extender's host:port (its /metrics).
func (c *cluster) metricsAddr() string { return strings.TrimPrefix(c.ext.URL(), "http://") }

// podKind is one kind of pod of the scheduling traffic.
type podKind struct {
	prefix string
	res    corev1.ResourceList
}

func managed(name string, q int64) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceName(name): *resource.NewQuantity(q, resource.DecimalSI)}
}

// trafficKinds: whole GPUs, GPU shares and batch pods, every one of them filtered,
// scored and bound by the extender.
func trafficKinds() []podKind {
	return []podKind{
		{"gpu", managed(contract.ResourceGPU, 1)},
		{"share", managed(contract.ResourceGPUMilli, 300)},
		{"batch", managed(contract.ResourceBatchCPU, 500)},
	}
}

// newPod returns a pod asking for res (limit = request, as extended resources need).
func newPod(name string, res corev1.ResourceList, ann map[string]string) *corev1.Pod {
	p := controlplane.NewPod(schedNamespace, name, corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")})
	for k, v := range res {
		p.Spec.Containers[0].Resources.Requests[k] = v
	}
	p.Spec.Containers[0].Resources.Limits = res.DeepCopy()
	p.Spec.SchedulerName = secondSchedulerName
	p.Annotations = ann
	return p
}

// gang is a Koordinator gang of members pods asking for gpus whole GPUs each.
type gang struct {
	name          string
	members, gpus int64
}

// createGangs creates the gangs' pods (Koordinator's annotations: no CRD).
func (c *cluster) createGangs(ctx context.Context, gs ...gang) error {
	var pods []*corev1.Pod
	for _, g := range gs {
		for i := range g.members {
			pods = append(pods, newPod(fmt.Sprintf("%s-%d", g.name, i), managed(contract.ResourceGPU, g.gpus),
				map[string]string{contract.AnnotationKoordinatorName: g.name,
					contract.AnnotationKoordinatorMinAvailable: fmt.Sprint(g.members)}))
		}
	}
	return c.cp.CreatePods(ctx, pods)
}

// deleteGang deletes a gang's pods.
func (c *cluster) deleteGang(ctx context.Context, g gang) error {
	zero := int64(0)
	for i := range g.members {
		err := c.cp.Client().CoreV1().Pods(schedNamespace).Delete(ctx, fmt.Sprintf("%s-%d", g.name, i),
			metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil {
			return err
		}
	}
	return nil
}

// traffic creates one pod of each kind in turn every interval and deletes the
// bound ones older than keep, until ctx ends, so that the extender's latency,
// verdict and bind series move all along. The first error ends it.
func (c *cluster) traffic(ctx context.Context, interval, keep time.Duration) error {
	pods := c.cp.Client().CoreV1().Pods(schedNamespace)
	created := map[string]time.Time{}
	zero := int64(0)
	kinds := trafficKinds()
	for i := 0; ; i++ {
		k := kinds[i%len(kinds)]
		name := fmt.Sprintf("%s-%d", k.prefix, i)
		if _, err := pods.Create(ctx, newPod(name, k.res, nil), metav1.CreateOptions{}); err != nil {
			return ctxErr(ctx, fmt.Errorf("creating pod %s: %w", name, err))
		}
		created[name] = time.Now()
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return ctxErr(ctx, err)
		}
		for _, p := range list.Items {
			at, ours := created[p.Name]
			if ours && p.Spec.NodeName != "" && time.Since(at) > keep {
				if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
					return ctxErr(ctx, fmt.Errorf("deleting pod %s: %w", p.Name, err))
				}
				delete(created, p.Name)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// ctxErr drops err when ctx ended (the traffic stops with the test's phase).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
