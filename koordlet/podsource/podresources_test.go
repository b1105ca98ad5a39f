package podsource

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

const gpuResource = "nvidia.com/gpu"

// kubeletPodResources is a PodResourcesLister server: it answers List with resp, or
// blocks until the call is cancelled when hang is set.
type kubeletPodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	resp *podresourcesv1.ListPodResourcesResponse
	hang bool
}

func (k *kubeletPodResources) List(ctx context.Context,
	_ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	if k.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return k.resp, nil
}

// serveKubelet serves srv on a unix socket in a temporary directory, like kubelet.
func serveKubelet(t *testing.T, srv podresourcesv1.PodResourcesListerServer) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(s, srv)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return socket
}

func devs(resource string, ids ...string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

func ctrRes(name string, d ...*podresourcesv1.ContainerDevices) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: d}
}

func podRes(ns, name string, c ...*podresourcesv1.ContainerResources) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: c}
}

const (
	gpuA = "GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	gpuB = "GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b"
	gpuC = "GPU-3c3c3c3c-5f60-4718-9a0b-1c2d3e4f5a6b"
)

// sampleResponse is a node with two GPU pods (one using its init container's GPU
// again), a CPU-pinned pod, a DRA pod and a pod without devices.
func sampleResponse() *podresourcesv1.ListPodResourcesResponse {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		podRes("ml", "train-1",
			ctrRes("init", devs(gpuResource, gpuB)),
			ctrRes("main", devs(gpuResource, gpuC, gpuB), devs("example.com/nic", "nic0"))),
		podRes("ml", "train-0", ctrRes("main", devs(gpuResource, gpuA))),
		podRes("web", "front", &podresourcesv1.ContainerResources{Name: "app", CpuIds: []int64{2, 3}}),
		podRes("dra", "claim", &podresourcesv1.ContainerResources{Name: "app",
			DynamicResources: []*podresourcesv1.DynamicResource{{ClaimName: "gpu", ClaimNamespace: "dra"}}}),
		podRes("kube-system", "coredns", ctrRes("coredns")),
	}}
}

func TestPodResourcesList(t *testing.T) {
	t.Parallel()
	socket := serveKubelet(t, &kubeletPodResources{resp: sampleResponse()})
	c, err := NewPodResources(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	got, err := c.Devices(context.Background(), gpuResource)
	if err != nil {
		t.Fatal(err)
	}
	want := DeviceAllocation{Resource: gpuResource, Pods: []PodDevices{
		{Namespace: "ml", Name: "train-0", Containers: []ContainerDevices{{"main", []string{gpuA}}}, IDs: []string{gpuA}},
		{Namespace: "ml", Name: "train-1", Containers: []ContainerDevices{{"init", []string{gpuB}},
			{"main", []string{gpuB, gpuC}}}, IDs: []string{gpuB, gpuC}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Devices:\n got %+v\nwant %+v", got, want)
	}
	nics, err := c.Devices(context.Background(), "example.com/nic")
	if err != nil || len(nics.Pods) != 1 || !slices.Equal(nics.Pods[0].IDs, []string{"nic0"}) {
		t.Fatalf("another resource: %+v, %v", nics, err)
	}
	resp, err := c.List(context.Background())
	if err != nil || len(resp.GetPodResources()) != 5 {
		t.Fatalf("List: %v, %v", resp, err)
	}
}

func TestPodResourcesFailures(t *testing.T) {
	t.Parallel()
	big := &podresourcesv1.ListPodResourcesResponse{}
	for range 200 {
		big.PodResources = append(big.PodResources, podRes("ns", strings.Repeat("p", 200)))
	}
	for _, tc := range []struct {
		name   string
		socket func(t *testing.T) string
		opts   []PodResourcesOption
		within time.Duration
	}{
		{"no socket", func(t *testing.T) string { return filepath.Join(t.TempDir(), "kubelet.sock") }, nil,
			5 * time.Second},
		{"kubelet hangs", func(t *testing.T) string { return serveKubelet(t, &kubeletPodResources{hang: true}) },
			[]PodResourcesOption{WithPodResourcesTimeout(200 * time.Millisecond)}, 5 * time.Second},
		{"answer too large", func(t *testing.T) string { return serveKubelet(t, &kubeletPodResources{resp: big}) },
			[]PodResourcesOption{WithPodResourcesMaxMessage(1 << 10)}, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewPodResources(tc.socket(t), append(tc.opts, WithPodResourcesTimeout(-1),
				WithPodResourcesMaxMessage(0))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			start := time.Now()
			_, err = c.Devices(context.Background(), gpuResource)
			if !errors.Is(err, ErrPodResources) || !strings.Contains(err.Error(), "kubelet.sock") {
				t.Fatalf("Devices = %v, want ErrPodResources naming the socket", err)
			}
			if d := time.Since(start); d > tc.within {
				t.Fatalf("failed after %v, want within %v", d, tc.within)
			}
		})
	}
	if _, err := NewPodResources("kubelet.sock"); err == nil {
		t.Fatal("a relative socket path was accepted")
	}
}

func TestMapDevicesProblems(t *testing.T) {
	t.Parallel()
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		podRes("ml", "a", ctrRes("main", devs(gpuResource, gpuA, gpuA))),
		podRes("ml", "b", ctrRes("main", devs(gpuResource, gpuA, ""))),
		podRes("ml", "a", ctrRes("side", devs(gpuResource, gpuB))),
		podRes("", "nameless", ctrRes("main", devs(gpuResource, gpuC))),
		podRes("ml", "c", ctrRes("main", devs(gpuResource, gpuC)), ctrRes("main", devs(gpuResource, gpuB)),
			ctrRes("")),
		nil,
	}}
	got := MapDevices(resp, gpuResource)
	wantPods := []PodDevices{
		{Namespace: "ml", Name: "a", Containers: []ContainerDevices{{"main", []string{gpuA}}, {"side", []string{gpuB}}},
			IDs: []string{gpuB, gpuA}},
		{Namespace: "ml", Name: "b", Containers: []ContainerDevices{{"main", []string{gpuA}}}, IDs: []string{gpuA}},
		{Namespace: "ml", Name: "c", Containers: []ContainerDevices{{"main", []string{gpuB, gpuC}}},
			IDs: []string{gpuB, gpuC}},
	}
	if !reflect.DeepEqual(got.Pods, wantPods) {
		t.Fatalf("pods:\n got %+v\nwant %+v", got.Pods, wantPods)
	}
	var kinds []string
	for _, p := range got.Problems {
		kinds = append(kinds, p.String())
	}
	want := []string{
		`duplicate pod ml/a container main device "` + gpuA + `": device listed twice for the container`,
		`invalid pod ml/b container main: device ID of 0 bytes: empty, too long or not UTF-8`,
		`duplicate pod ml/a: pod listed more than once; entries merged`,
		`invalid pod /nameless: entry 3 has no pod namespace or name`,
		`duplicate pod ml/c container main: container listed more than once; entries merged`,
		`invalid pod ml/c: container without a name`,
		`invalid: entry 5 has no pod namespace or name`,
		`conflict pod ml/a device "` + gpuB + `": also held by [ml/c]`,
		`conflict pod ml/a device "` + gpuA + `": also held by [ml/b]`,
	}
	if !slices.Equal(kinds, want) {
		t.Fatalf("problems:\n got %q\nwant %q", kinds, want)
	}
	if m := MapDevices(nil, gpuResource); len(m.Pods) != 0 || len(m.Problems) != 0 {
		t.Fatalf("nil response: %+v", m)
	}
	// Problems are bounded; the rest are counted.
	many := &podresourcesv1.ListPodResourcesResponse{}
	for range 100 {
		many.PodResources = append(many.PodResources, podRes("", ""))
	}
	if m := MapDevices(many, gpuResource); len(m.Problems) != maxAllocationProblems || m.MoreProblems != 36 {
		t.Fatalf("%d problems, %d more; want %d and 36", len(m.Problems), m.MoreProblems, maxAllocationProblems)
	}
}

// FuzzMapDevices feeds arbitrary bytes through proto decoding into the mapping:
// garbage never panics, and whatever decodes maps to a consistent allocation.
func FuzzMapDevices(f *testing.F) {
	for _, r := range []*podresourcesv1.ListPodResourcesResponse{
		sampleResponse(),
		{PodResources: []*podresourcesv1.PodResources{podRes("ml", "a", ctrRes("m", devs(gpuResource, gpuA, gpuA))),
			podRes("ml", "b", ctrRes("m", devs(gpuResource, gpuA))), podRes("ml", "a", ctrRes("m"))}},
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var resp podresourcesv1.ListPodResourcesResponse
		if err := proto.Unmarshal(data, &resp); err != nil {
			return
		}
		a := MapDevices(&resp, gpuResource)
		holders := map[string]int{}
		for i, p := range a.Pods {
			if p.Namespace == "" || p.Name == "" || len(p.IDs) == 0 {
				t.Fatalf("pod %+v: empty name or no devices", p)
			}
			if i > 0 && (a.Pods[i-1].Namespace > p.Namespace ||
				a.Pods[i-1].Namespace == p.Namespace && a.Pods[i-1].Name >= p.Name) {
				t.Fatalf("pods not sorted or twice: %+v", a.Pods)
			}
			union := map[string]bool{}
			for _, c := range p.Containers {
				if c.Name == "" || !slices.IsSorted(c.IDs) || len(slices.Compact(slices.Clone(c.IDs))) != len(c.IDs) {
					t.Fatalf("container %+v: no name, or IDs unsorted or twice", c)
				}
				for _, id := range c.IDs {
					union[id] = true
				}
			}
			if !slices.Equal(p.IDs, sortedKeys(union)) {
				t.Fatalf("pod IDs %q are not the union of its containers' %+v", p.IDs, p.Containers)
			}
			for _, id := range p.IDs {
				holders[id]++
			}
		}
		conflicts := 0
		for _, n := range holders {
			if n > 1 {
				conflicts++
			}
		}
		reported := a.MoreProblems // a conflict left out is counted there
		for _, p := range a.Problems {
			if p.Kind == ProblemConflict {
				reported++
				if holders[p.DeviceID] < 2 {
					t.Fatalf("conflict %v for a device held once", p)
				}
			}
		}
		if reported < conflicts {
			t.Fatalf("%d devices held by several pods, %d conflicts reported", conflicts, reported)
		}
		if len(a.Problems) > maxAllocationProblems {
			t.Fatalf("%d problems listed", len(a.Problems))
		}
	})
}
