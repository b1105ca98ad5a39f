package podsource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Defaults of the PodResources client.
const (
	// DefaultPodResourcesSocket is where kubelet serves its PodResources API.
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// DefaultPodResourcesTimeout bounds one call (connecting included).
	DefaultPodResourcesTimeout = 10 * time.Second
	// DefaultPodResourcesMaxMessage bounds a response, as kubelet's own client does
	// (16 MiB: a node with 110 pods answers in a few KiB).
	DefaultPodResourcesMaxMessage = 16 << 20
)

// ErrPodResources wraps every failure to read kubelet's PodResources API (socket
// missing, kubelet down, timeout, response too large): the allocation is unknown.
var ErrPodResources = errors.New("kubelet PodResources API unavailable")

// maxAllocationProblems bounds the problems a DeviceAllocation lists one by one.
const maxAllocationProblems = 64

// maxDeviceID bounds a device ID; longer ones are reported as invalid.
const maxDeviceID = 256

// PodResourcesOption configures a PodResources client.
type PodResourcesOption func(*podResourcesConfig)

type podResourcesConfig struct {
	timeout    time.Duration
	maxMessage int
}

// WithPodResourcesTimeout replaces DefaultPodResourcesTimeout; non-positive values are ignored.
func WithPodResourcesTimeout(d time.Duration) PodResourcesOption {
	return func(c *podResourcesConfig) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithPodResourcesMaxMessage replaces DefaultPodResourcesMaxMessage; non-positive values are ignored.
func WithPodResourcesMaxMessage(n int) PodResourcesOption {
	return func(c *podResourcesConfig) {
		if n > 0 {
			c.maxMessage = n
		}
	}
}

// PodResources reads kubelet's PodResources API (k8s.io/kubelet/pkg/apis/podresources/v1,
// gRPC over kubelet's unix socket): the devices kubelet's device manager allocated to
// each container. For nvidia.com/gpu these are the IDs NVIDIA's device plugin
// advertises: GPU UUIDs by default, indices with DEVICE_ID_STRATEGY=index, MIG UUIDs
// with the MIG strategies, "<id>::<n>" replicas with time-slicing.
//
// Traps:
//   - kubelet reports pods by namespace and name only, no UID: a pod deleted and
//     recreated under the same name is indistinguishable. Join with the pod source.
//   - kubelet lets app containers reuse devices its init containers held, so one
//     device may be listed for several containers of one pod; across pods it is a
//     conflict (DeviceAllocation.Problems).
//   - The socket is root-only on most nodes; mount /var/lib/kubelet/pod-resources
//     into the agent's pod.
//   - The client connects lazily (on the first call) and reconnects by itself; every
//     call is bounded by the timeout, a missing socket included.
//
// Safe for concurrent use.
type PodResources struct {
	socket string
	cfg    podResourcesConfig
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

// NewPodResources returns a client of the PodResources API at socket (an absolute path).
// It does not connect yet.
func NewPodResources(socket string, opts ...PodResourcesOption) (*PodResources, error) {
	if !filepath.IsAbs(socket) {
		return nil, fmt.Errorf("PodResources socket %q: must be an absolute path", socket)
	}
	cfg := podResourcesConfig{timeout: DefaultPodResourcesTimeout, maxMessage: DefaultPodResourcesMaxMessage}
	for _, o := range opts {
		o(&cfg)
	}
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("PodResources client for %s: %w", socket, err)
	}
	return &PodResources{socket: socket, cfg: cfg, conn: conn,
		client: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// Close releases the connection.
func (c *PodResources) Close() error { return c.conn.Close() }

// List returns kubelet's whole answer. Errors wrap ErrPodResources.
func (c *PodResources) List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	resp, err := c.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pod resources at %s: %w: %w", c.socket, ErrPodResources, err)
	}
	return resp, nil
}

// Devices lists the devices of one resource (e.g. "nvidia.com/gpu") by pod and
// container. Errors wrap ErrPodResources.
func (c *PodResources) Devices(ctx context.Context, resource string) (DeviceAllocation, error) {
	resp, err := c.List(ctx)
	if err != nil {
		return DeviceAllocation{}, err
	}
	return MapDevices(resp, resource), nil
}

// DeviceAllocation is which pods hold which devices of one resource.
type DeviceAllocation struct {
	Resource string
	// Pods holding at least one device, by namespace and name.
	Pods []PodDevices
	// Problems found in kubelet's answer (duplicates, conflicts, invalid entries), at
	// most 64; MoreProblems counts the ones left out.
	Problems     []AllocationProblem
	MoreProblems int
}

// PodDevices is one pod's devices of the resource.
type PodDevices struct {
	Namespace, Name string
	// Containers holding devices, by name.
	Containers []ContainerDevices
	// IDs is the union over the containers, sorted.
	IDs []string
}

// ContainerDevices is one container's devices of the resource.
type ContainerDevices struct {
	Name string
	// IDs are the device IDs, sorted, each once.
	IDs []string
}

// ProblemKind classifies an AllocationProblem.
type ProblemKind string

// Problem kinds.
const (
	// ProblemInvalid: an entry without a pod name, namespace, container name or device
	// ID, or with an ID longer than 256 bytes: skipped.
	ProblemInvalid ProblemKind = "invalid"
	// ProblemDuplicate: a pod listed twice, a container listed twice in a pod, or an ID
	// listed twice for a container: merged.
	ProblemDuplicate ProblemKind = "duplicate"
	// ProblemConflict: one device ID held by containers of different pods: kept in each.
	ProblemConflict ProblemKind = "conflict"
)

// AllocationProblem is one oddity of kubelet's answer.
type AllocationProblem struct {
	Kind ProblemKind
	// Namespace and Pod name the (first) pod concerned; Container and DeviceID are set
	// when the problem is about them.
	Namespace, Pod, Container, DeviceID string
	// Detail says what was wrong (for a conflict, which other pods hold the device).
	Detail string
}

func (p AllocationProblem) String() string {
	s := string(p.Kind)
	if p.Namespace != "" || p.Pod != "" {
		s += " pod " + p.Namespace + "/" + p.Pod
	}
	if p.Container != "" {
		s += " container " + p.Container
	}
	if p.DeviceID != "" {
		s += fmt.Sprintf(" device %q", p.DeviceID)
	}
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

type podKey struct{ namespace, name string }

// MapDevices extracts the devices of resource from a List response. It never fails:
// what it cannot use is skipped and reported in Problems. A nil response maps to no pods.
func MapDevices(resp *podresourcesv1.ListPodResourcesResponse, resource string) DeviceAllocation {
	out := DeviceAllocation{Resource: resource}
	report := func(p AllocationProblem) {
		if len(out.Problems) < maxAllocationProblems {
			out.Problems = append(out.Problems, p)
		} else {
			out.MoreProblems++
		}
	}
	// pod → container → IDs
	pods := map[podKey]map[string]map[string]bool{}
	for i, pr := range resp.GetPodResources() {
		key := podKey{pr.GetNamespace(), pr.GetName()}
		if key.namespace == "" || key.name == "" {
			report(AllocationProblem{Kind: ProblemInvalid, Namespace: key.namespace, Pod: key.name,
				Detail: fmt.Sprintf("entry %d has no pod namespace or name", i)})
			continue
		}
		ctrs, seenPod := pods[key]
		if seenPod {
			report(AllocationProblem{Kind: ProblemDuplicate, Namespace: key.namespace, Pod: key.name,
				Detail: "pod listed more than once; entries merged"})
		} else {
			ctrs = map[string]map[string]bool{}
			pods[key] = ctrs
		}
		seenCtr := map[string]bool{}
		for _, cr := range pr.GetContainers() {
			name := cr.GetName()
			if name == "" {
				report(AllocationProblem{Kind: ProblemInvalid, Namespace: key.namespace, Pod: key.name,
					Detail: "container without a name"})
				continue
			}
			if seenCtr[name] {
				report(AllocationProblem{Kind: ProblemDuplicate, Namespace: key.namespace, Pod: key.name,
					Container: name, Detail: "container listed more than once; entries merged"})
			}
			seenCtr[name] = true
			for _, cd := range cr.GetDevices() {
				if cd.GetResourceName() != resource {
					continue
				}
				for _, id := range cd.GetDeviceIds() {
					if id == "" || len(id) > maxDeviceID || !utf8.ValidString(id) {
						report(AllocationProblem{Kind: ProblemInvalid, Namespace: key.namespace, Pod: key.name,
							Container: name, Detail: fmt.Sprintf("device ID of %d bytes: empty, too long or not UTF-8",
								len(id))})
						continue
					}
					ids := ctrs[name]
					if ids == nil {
						ids = map[string]bool{}
						ctrs[name] = ids
					}
					if ids[id] {
						report(AllocationProblem{Kind: ProblemDuplicate, Namespace: key.namespace, Pod: key.name,
							Container: name, DeviceID: id, Detail: "device listed twice for the container"})
					}
					ids[id] = true
				}
			}
		}
	}
	holders := map[string][]podKey{}
	for key, ctrs := range pods {
		pd := PodDevices{Namespace: key.namespace, Name: key.name}
		union := map[string]bool{}
		for name, ids := range ctrs {
			pd.Containers = append(pd.Containers, ContainerDevices{Name: name, IDs: sortedKeys(ids)})
			for id := range ids {
				union[id] = true
			}
		}
		if len(union) == 0 {
			continue
		}
		slices.SortFunc(pd.Containers, func(a, b ContainerDevices) int { return cmp.Compare(a.Name, b.Name) })
		pd.IDs = sortedKeys(union)
		for _, id := range pd.IDs {
			holders[id] = append(holders[id], key)
		}
		out.Pods = append(out.Pods, pd)
	}
	slices.SortFunc(out.Pods, func(a, b PodDevices) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, id := range sortedKeys(holders) {
		hs := holders[id]
		if len(hs) < 2 {
			continue
		}
		slices.SortFunc(hs, func(a, b podKey) int {
			return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
		})
		others := make([]string, 0, len(hs)-1)
		for _, h := range hs[1:] {
			others = append(others, h.namespace+"/"+h.name)
		}
		report(AllocationProblem{Kind: ProblemConflict, Namespace: hs[0].namespace, Pod: hs[0].name, DeviceID: id,
			Detail: fmt.Sprintf("also held by %v", others)})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
