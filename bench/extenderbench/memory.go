package extenderbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/contract"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	extender "github.com/understory/understory/scheduler-extender"
)

// Memory is the extender's memory with Nodes nodes and Pods pods: the
// extender runs as a child process with its real informers (and their
// transforms) against a fake API server in this process, which serves the
// lists as kube-apiserver would (full objects: managedFields, a
// last-applied annotation, env, volumes, status) and keeps the watches open.
// RSS is the child's VmRSS once synced and after a GC; PeakRSS its VmHWM (the
// initial lists are decoded whole before the transform slims each object).
type Memory struct {
	Date        time.Time `json:"date"`
	Machine     Machine   `json:"machine"`
	Nodes       int       `json:"nodes"`
	Pods        int       `json:"pods"`
	BoundPods   int       `json:"bound_pods"`
	GPUPods     int       `json:"gpu_pods"`
	PodBytes    int       `json:"pod_json_bytes"` // one typical pod as served
	SyncSeconds float64   `json:"sync_seconds"`
	RSSMiB      float64   `json:"rss_mib"`
	PeakRSSMiB  float64   `json:"peak_rss_mib"`
	HeapMiB     float64   `json:"heap_inuse_mib"`
	TargetMiB   float64   `json:"target_rss_mib"`
	Pass        bool      `json:"pass"`
}

// childReport is what the child prints.
type childReport struct {
	SyncSeconds float64 `json:"sync_seconds"`
	RSSKiB      int64   `json:"rss_kib"`
	PeakKiB     int64   `json:"peak_kib"`
	HeapBytes   uint64  `json:"heap_bytes"`
	Nodes, Pods int
}

// gpuDevice is one device of the memory cluster.
type gpuDevice struct{ node, dev int }

// memPod is pod i of the memory cluster: 90 % bound, a fifth of those with
// a 250-milli GPU share on the devices in turn (at most 4 per device), the
// rest CPU only; 10 % pending.
func memPod(i, pods int, nodes []*corev1.Node, devs []gpuDevice) (*corev1.Pod, bool, bool) {
	name := fmt.Sprintf("pod-%06d", i)
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("team-%02d", i%40), Name: name,
			UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), ResourceVersion: "1",
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000+int64(i), 0)),
			Labels:            map[string]string{"app": fmt.Sprintf("job-%d", i/20), "pod-template-hash": "5d8f7c9b4"},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("{\"spec\":{}}", 60),
				"prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: fmt.Sprintf("job-%d-5d8f7c9b4", i/20),
				UID: "11111111-2222-3333-4444-555555555555"}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(
					`{"f:metadata":{"f:labels":{".":{},"f:app":{}},"f:ownerReferences":{}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:env":{},"f:image":{},"f:resources":{}}}}}`)}}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.example.com/team/train:v1.2.3",
				Command: []string{"python", "-m", "train", "--epochs", "10"},
				Env: []corev1.EnvVar{{Name: "MASTER_ADDR", Value: "job-master"}, {Name: "WORLD_SIZE", Value: "8"},
					{Name: "NCCL_DEBUG", Value: "INFO"}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits: corev1.ResourceList{}},
				VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}, PeriodSeconds: 10},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
			ServiceAccountName: "default",
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if i%10 == 9 {
		return p, false, false // pending
	}
	bound := i * 9 / 10
	gpu := bound%5 == 0
	node := nodes[bound%len(nodes)]
	if gpu {
		d := devs[(bound/5)%len(devs)]
		node = nodes[d.node]
		p.Spec.Containers[0].Resources.Limits[contract.ResourceGPUMilli] = *resource.NewQuantity(250, resource.DecimalSI)
		p.Annotations[contract.AnnotationGPUDevices] = strconv.Itoa(d.dev)
	}
	p.Spec.NodeName = node.Name
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.1.0.1",
		StartTime: &metav1.Time{Time: time.Unix(1700000100, 0)},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Ready: true, Image: "registry.example.com/team/train:v1.2.3",
			ImageID: "registry.example.com/team/train@sha256:" + strings.Repeat("ab", 32), ContainerID: "containerd://" + strings.Repeat("cd", 32)}}}
	return p, true, gpu
}

// fakeAPI serves the node and pod lists and endless, empty watches.
func fakeAPI(nodes []*corev1.Node, pods int, devs []gpuDevice) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			<-r.Context().Done()
			return
		}
		bw := bufio.NewWriterSize(w, 1<<20)
		defer bw.Flush()
		enc := json.NewEncoder(bw)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/nodes":
			fmt.Fprint(bw, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[`)
			for i, n := range nodes {
				if i > 0 {
					fmt.Fprint(bw, ",")
				}
				_ = enc.Encode(n)
			}
		case "/api/v1/pods":
			fmt.Fprint(bw, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[`)
			for i := range pods {
				if i > 0 {
					fmt.Fprint(bw, ",")
				}
				p, _, _ := memPod(i, pods, nodes, devs)
				_ = enc.Encode(p)
			}
		default:
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(bw, "]}")
	})
}

// memNodes is the openb mix as kubelets register it (capacity, conditions,
// images, managedFields).
func memNodes(n int, seed int64) ([]*corev1.Node, []gpuDevice) {
	rng := newRand(seed)
	nodes := make([]*corev1.Node, n)
	var devs []gpuDevice
	for i := range n {
		t := pickNodeType(rng)
		node := mkNode(i, t)
		node.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
		node.ResourceVersion = "1"
		node.Status.Capacity = node.Status.Allocatable.DeepCopy()
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
		node.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.34.4", OSImage: "Ubuntu 24.04", ContainerRuntimeVersion: "containerd://2.0"}
		for k := range 8 {
			node.Status.Images = append(node.Status.Images, corev1.ContainerImage{
				Names: []string{fmt.Sprintf("registry.example.com/team/image-%d@sha256:%s", k, strings.Repeat("ef", 32))}, SizeBytes: 1 << 30})
		}
		nodes[i] = node
		for d := range t.gpus {
			devs = append(devs, gpuDevice{i, d})
		}
	}
	return nodes, devs
}

// runMemory starts the child (this binary with -rss-child-api, which cmd/extender-bench
// hands to MemoryChild) against the fake API server and reads its report.
func runMemory(ctx context.Context, o Options) (Memory, error) {
	nodes, devs := memNodes(o.Nodes, o.Seed)
	res := Memory{Date: time.Now().UTC(), Nodes: o.Nodes, Pods: o.RSSPods, TargetMiB: o.TargetRSSMiB,
		Machine: thisMachine()}
	for i := range o.RSSPods {
		_, bound, gpu := memPod(i, o.RSSPods, nodes, devs)
		if bound {
			res.BoundPods++
		}
		if gpu {
			res.GPUPods++
		}
	}
	p, _, _ := memPod(0, o.RSSPods, nodes, devs)
	b, err := json.Marshal(p)
	if err != nil {
		return res, err
	}
	res.PodBytes = len(b)
	api := httptest.NewServer(fakeAPI(nodes, o.RSSPods, devs))
	defer api.Close()
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, self, "-rss-child-api", api.URL, "-nodes", strconv.Itoa(o.Nodes),
		"-rss-pods", strconv.Itoa(o.RSSPods), "-memprofile", o.MemProfile)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return res, fmt.Errorf("memory child: %w\n%s", err, stderr.String())
	}
	var rep childReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return res, fmt.Errorf("memory child report %q: %w", out, err)
	}
	if rep.Nodes != o.Nodes || rep.Pods != o.RSSPods {
		return res, fmt.Errorf("memory child indexed %d nodes and %d pods, want %d and %d", rep.Nodes, rep.Pods, o.Nodes, o.RSSPods)
	}
	res.SyncSeconds = rep.SyncSeconds
	res.RSSMiB, res.PeakRSSMiB = float64(rep.RSSKiB)/1024, float64(rep.PeakKiB)/1024
	res.HeapMiB = float64(rep.HeapBytes) / (1 << 20)
	res.Pass = res.RSSMiB <= res.TargetMiB
	return res, nil
}

// MemoryChild is the extender side of the memory run: informers on apiURL, then the
// report on stdout once synced and collected (and the heap profile in memprofile, if
// set). cmd/extender-bench runs it when started with -rss-child-api.
func MemoryChild(apiURL, memprofile string, stdout io.Writer) error {
	client, err := kubernetes.NewForConfig(&rest.Config{Host: apiURL, QPS: -1})
	if err != nil {
		return err
	}
	srv, err := extender.NewServer(extender.DefaultConfig(), extender.Deps{Client: client,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- srv.Run(ctx) }()
	for !srv.Ready() {
		select {
		case err := <-done:
			return errors.Join(errors.New("extender stopped before sync"), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	rep := childReport{SyncSeconds: time.Since(start).Seconds()}
	runtime.GC()
	time.Sleep(2 * time.Second) // let the runtime return what the lists freed
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.HeapBytes = ms.HeapInuse
	rep.RSSKiB, rep.PeakKiB = procStatus("VmRSS"), procStatus("VmHWM")
	if memprofile != "" {
		f, err := os.Create(memprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.WriteHeapProfile(f); err != nil {
			return err
		}
	}
	st := srv.Status() // after the measurement: it allocates
	rep.Nodes = len(st.Nodes)
	for _, n := range st.Counts {
		rep.Pods += n
	}
	return json.NewEncoder(stdout).Encode(rep)
}

// procStatus reads a kB field of /proc/self/status.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }
