package controlplane

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// defaultPodsPerNode is the kubelet's default maxPods.
const defaultPodsPerNode = 110

// createWorkers is how many requests CreateNodes keeps in flight.
const createWorkers = 32

// NewNode returns a node as a healthy kubelet would register it: Ready,
// no pressure, allocatable = capacity (plus pods=110 when capacity has no
// "pods"), and the well-known hostname/os/arch labels, merged with labels.
func NewNode(name string, capacity corev1.ResourceList, labels map[string]string) *corev1.Node {
	capacity = capacity.DeepCopy()
	if capacity == nil {
		capacity = corev1.ResourceList{}
	}
	if _, ok := capacity[corev1.ResourcePods]; !ok {
		capacity[corev1.ResourcePods] = *resource.NewQuantity(defaultPodsPerNode, resource.DecimalSI)
	}
	l := map[string]string{
		corev1.LabelHostname:   name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: "amd64",
	}
	for k, v := range labels {
		l[k] = v
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Phase:       corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          K8sVersion,
				OperatingSystem:         "linux",
				Architecture:            "amd64",
				ContainerRuntimeVersion: "fake://0",
			},
		},
	}
}

// CreateNode creates a fake node (see NewNode). No kubelet backs it: pods
// bound to it stay Pending.
func (cp *ControlPlane) CreateNode(ctx context.Context, name string, capacity corev1.ResourceList, labels map[string]string) (*corev1.Node, error) {
	n, err := cp.client.CoreV1().Nodes().Create(ctx, NewNode(name, capacity, labels), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", name, err)
	}
	return n, nil
}

// CreateNodes creates n fake nodes named prefix-0 ... prefix-(n-1) with
// createWorkers requests in flight, and returns their names. It stops at the
// first error.
func (cp *ControlPlane) CreateNodes(ctx context.Context, prefix string, n int, capacity corev1.ResourceList, labels map[string]string) ([]string, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	err := parallel(ctx, len(names), func(ctx context.Context, i int) error {
		_, err := cp.CreateNode(ctx, names[i], capacity, labels)
		return err
	})
	if err != nil {
		return nil, err
	}
	return names, nil
}

// CreatePods creates pods with createWorkers requests in flight and stops at
// the first error.
func (cp *ControlPlane) CreatePods(ctx context.Context, pods []*corev1.Pod) error {
	return parallel(ctx, len(pods), func(ctx context.Context, i int) error {
		p := pods[i]
		if _, err := cp.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		return nil
	})
}

// NewPod returns a single-container pod requesting requests (limits unset),
// for the default scheduler. The image is never pulled: no kubelet runs.
func NewPod(namespace, name string, requests corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "understory.invalid/pause:never-pulled",
				Resources: corev1.ResourceRequirements{Requests: requests.DeepCopy()},
			}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
}

// parallel runs fn(ctx, i) for i in [0, n) on createWorkers goroutines and
// returns the first error, cancelling the rest.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idx := make(chan int)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(n, createWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case idx <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// ScheduledBy returns who reported pod namespace/name Scheduled, sorted and without
// repeats: each Scheduled event's reportingController (a scheduler profile's name), or
// its deprecated source component. Empty before the pod is scheduled.
func ScheduledBy(ctx context.Context, c kubernetes.Interface, namespace, name string) ([]string, error) {
	list, err := c.EventsV1().Events(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing events of %s: %w", namespace, err)
	}
	var by []string
	for _, e := range list.Items {
		if e.Reason != "Scheduled" || e.Regarding.Name != name {
			continue
		}
		if e.ReportingController != "" {
			by = append(by, e.ReportingController)
		} else {
			by = append(by, e.DeprecatedSource.Component)
		}
	}
	slices.Sort(by)
	return slices.Compact(by), nil
}
