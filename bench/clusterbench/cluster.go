package clusterbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/understory/understory/admission"
	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	extender "github.com/understory/understory/scheduler-extender"
)

// Names the benchmark gives its objects.
const (
	nsBatch = "batch"
	nsLS    = "ls"
	// kwokLabel selects the nodes kwok manages.
	kwokLabel = "understory.io/bench-kwok"
	// annDuration is how long kwok keeps a batch pod Running (a Go duration).
	annDuration = "understory.io/bench-duration"
	nodePods    = 500
)

// kwokStages are the Stages kwok plays: nodes stay Ready (heartbeat through the
// node Lease; status rewritten every 10-20 min, kwok's own default with leases),
// pods bound to a node become Running, a batch pod carrying annDuration Succeeds
// after it, and a deleted pod is removed.
const kwokStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 1200000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
  immediateNextStage: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Running']
  next:
    statusTemplate: |
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["` + annDuration + `"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["` + annDuration + `"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    finalizers:
      empty: true
    delete: true
`

// child is a process the benchmark started, in its own process group, killed with
// the benchmark (PR_SET_PDEATHSIG).
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// A nice other than 0 runs it through nice(1), which execs it: every thread of the
// program has that niceness from its start, and the pid is the program's.
func startChild(dir, name string, nice int, bin string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating %s log: %w", name, err)
	}
	if nice != 0 {
		args = append([]string{"-n", strconv.Itoa(nice), bin}, args...)
		bin = "nice"
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); f.Close(); close(c.done) }()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) stop() {
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// dumpOnFailure prints the tail of c's log when tb failed (registered after
// c.stop, so it runs first: cleanups run last-registered first).
func dumpOnFailure(tb testing.TB, c *child) {
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s log %s, last lines:\n%s", filepath.Base(c.cmd.Path), c.log, controlplane.TailFile(c.log, 30))
		}
	})
}

// freePort picks a loopback port (another process may take it before it is bound).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls url until it answers 200, the child exits or timeout passes.
func waitHTTP(ctx context.Context, c *child, url string, timeout time.Duration) error {
	return waitHTTPWith(ctx, c, &http.Client{Timeout: 2 * time.Second}, url, timeout)
}

// waitHTTPWith is waitHTTP through hc (the webhook's: HTTPS with its CA).
func waitHTTPWith(ctx context.Context, c *child, hc *http.Client, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if c.exited() {
			return fmt.Errorf("%s exited before %s answered (log %s): %w", c.cmd.Path, url, c.log, errChildExited)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %v: %w", url, timeout, context.DeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// benchNode is one node of the run.
type benchNode struct {
	name  string
	shape NodeShape
	// LS requests (fractions of allocatable), from the node's trace.
	lsCPUReq, lsMemReq float64
}

func nodeName(i int) string { return "kwok-" + strconv.Itoa(i) }

// newNode is the Node object of n: Ready, allocatable = capacity, the GPU
// resources on GPU nodes (the agent publishes understory.io/gpu-milli once; it is
// written at creation here).
func newNode(n benchNode) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(n.shape.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(n.shape.MemBytes, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(nodePods, resource.DecimalSI),
	}
	labels := map[string]string{kwokLabel: "true", corev1.LabelHostname: n.name}
	if n.shape.GPUs > 0 {
		capacity[contract.ResourceGPU] = *resource.NewQuantity(int64(n.shape.GPUs), resource.DecimalSI)
		capacity[contract.ResourceGPUMilli] = *resource.NewQuantity(int64(n.shape.GPUs)*contract.MilliPerGPU, resource.DecimalSI)
		labels[extender.LabelGPUProduct] = n.shape.Model
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity.DeepCopy(),
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// lsPod is node n's LS pod: bound at creation (as a DaemonSet's pods are),
// requesting the trace's LS requests.
func lsPod(n benchNode) *corev1.Pod {
	cpu := int64(n.lsCPUReq * float64(n.shape.CPUMilli))
	mem := int64(n.lsMemReq * float64(n.shape.MemBytes))
	req := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(cpu, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ls-" + n.name, Namespace: nsLS},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "svc", Image: "ls",
			Resources: corev1.ResourceRequirements{Requests: req, Limits: req}}}},
	}
}

// batchPod is member m of job j in the form the admission webhook gives a
// user's batch pod (userBatchPod) through the shipped profile: batch resources
// instead of cpu and memory, the class annotation and profile label, and the
// profile's PriorityClass. The benchmark writes it itself when the webhook is off
// (-clusterbench.admission=false).
func batchPod(j Job, m int, priorityClass string) *corev1.Pod {
	p := userBatchPod(j, m)
	req := p.Spec.Containers[0].Resources.Requests
	delete(req, corev1.ResourceCPU)
	delete(req, corev1.ResourceMemory)
	req[contract.ResourceBatchCPU] = *resource.NewQuantity(max(j.CPUMilli, 1), resource.DecimalSI)
	req[contract.ResourceBatchMemory] = *resource.NewQuantity(max(j.MemBytes, 1), resource.DecimalSI)
	p.Spec.Containers[0].Resources.Limits = req.DeepCopy()
	p.Annotations[contract.AnnotationQOSClass] = "batch"
	p.Labels = map[string]string{admission.LabelProfile: "batch"}
	p.Spec.PriorityClassName = priorityClass
	return p
}

// userBatchPod is member m of job j as a user writes it for the webhook
// (docs/admission.md): in nsBatch, whose label admission.LabelProfile=batch the
// shipped profile selects, with plain cpu and memory requests; a GPU job asks for
// whole GPUs (nvidia.com/gpu) or one share (understory.io/gpu-milli), which the
// webhook leaves as they are (extended resources: request = limit).
func userBatchPod(j Job, m int) *corev1.Pod {
	req := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(max(j.CPUMilli, 1), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(max(j.MemBytes, 1), resource.BinarySI),
	}
	var lim corev1.ResourceList
	gpu := func(name corev1.ResourceName, v int64) {
		q := *resource.NewQuantity(v, resource.DecimalSI)
		req[name], lim = q, corev1.ResourceList{name: q}
	}
	switch {
	case j.NumGPU > 0 && j.GPUMilli >= contract.MilliPerGPU:
		gpu(contract.ResourceGPU, int64(j.NumGPU))
	case j.NumGPU > 0:
		gpu(contract.ResourceGPUMilli, int64(j.GPUMilli))
	}
	ann := map[string]string{annDuration: j.Duration.String()}
	name := j.Name
	if j.Members > 1 {
		ann[contract.AnnotationKoordinatorName] = j.Name
		ann[contract.AnnotationKoordinatorMinAvailable] = strconv.Itoa(j.Members)
		name = fmt.Sprintf("%s-%d", j.Name, m)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nsBatch, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "job", Image: "batch",
			Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}},
			TerminationGracePeriodSeconds: new(int64)},
	}
}

// buildCommands builds the main packages pkgs (./cmd/...) of the module at root
// into dir, in one go build (the binaries are named after their directories).
func buildCommands(ctx context.Context, root, dir string, pkgs ...string) error {
	build := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w: %s", strings.Join(pkgs, " "), err, controlplane.TailLines(string(out), 20))
	}
	return nil
}

// forEach runs fn(i) for i in [0, n) on workers goroutines and returns the first error.
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// createAll creates the nodes and LS pods.
func createAll(ctx context.Context, c kubernetes.Interface, nodes []benchNode) error {
	if err := forEach(ctx, len(nodes), 16, func(ctx context.Context, i int) error {
		n := newNode(nodes[i])
		st := n.Status
		got, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		got.Status = st
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", n.Name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	return forEach(ctx, len(nodes), 16, func(ctx context.Context, i int) error {
		if _, err := c.CoreV1().Pods(nsLS).Create(ctx, lsPod(nodes[i]), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating LS pod on %s: %w", nodes[i].name, err)
		}
		return nil
	})
}

// errChildExited means a child process died during its start-up.
var errChildExited = errors.New("child process exited")

// kubernetesClient is what submit needs.
type kubernetesClient = kubernetes.Interface

func createPod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) error {
	if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating pod %s: %w", p.Name, err)
	}
	return nil
}
