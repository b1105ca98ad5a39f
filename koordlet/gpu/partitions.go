package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/qos"
)

// ErrMPSRequest is wrapped by Partitions.MPSClient for a request it cannot plan (no pod
// UID, no container, no GPU, a negative request).
var ErrMPSRequest = errors.New("gpu: invalid MPS client request")

// partitionPodGrace is how long a client record waits for its pod to appear in the
// agent's pod snapshot (refreshed every second) before a pod never seen is forgotten.
const partitionPodGrace = time.Minute

// Partitions plans the MPS clients of the node's shared GPUs: the NRI plugin asks it,
// at each container's creation, whether the container runs as a client of the agent's
// MPS server and with which SM cap and priority (devices.MPSPlanner); the GPU Manager
// updates it every loop step (the server's readiness, which GPUs may use MPS, LS's
// measured demand on each) and reads back which pods are clients with which caps, to
// choose each GPU's lever. Safe for concurrent use.
//
// Rules: batch gets client priority 1 and a cap below 100 (never an unlimited batch
// client next to LS), LS priority 0 and the rest of the GPU (qos.ChooseGPUMPSCaps, from
// LS's recent demand peak and the LS containers' understory.io/gpu-milli requests).
// Batch also gets a device memory limit, its request's share of the GPU's memory
// (qos.ChooseGPUMPSMemLimit, from the total NVML read at the Manager's steps); LS none. A
// cap is fixed for the client's life: when LS outgrows it later, the Manager freezes
// batch (qos.GPUReasonMPSCapStale). No client (ok false) while the server is not ready,
// for a GPU the Manager has not seen or that cannot use MPS (unhealthy, MIG): the
// container then time-slices and the freeze lever protects LS.
type Partitions struct {
	policy qos.GPUMPSPolicy
	now    func() time.Time

	mu      sync.Mutex
	ready   bool
	pipeDir string
	gpus    map[string]*partitionGPU // by UUID
	clients map[clientKey]*PartitionClient
}

var _ devices.MPSPlanner = (*Partitions)(nil)

// partitionGPU is what Partitions knows of one GPU.
type partitionGPU struct {
	index int
	mpsOn bool
	peak  qos.GPUDemandPeak
	// memTotal is the GPU's memory, bytes, as last read (0: never read).
	memTotal uint64
}

type clientKey struct {
	pod       types.UID
	container string
	gpu       string
}

// PartitionClient is one MPS client handed out, as /status shows it.
type PartitionClient struct {
	PodUID       types.UID `json:"podUID"`
	Namespace    string    `json:"namespace"`
	Name         string    `json:"name"`
	Container    string    `json:"container"`
	GPU          string    `json:"gpu"` // UUID
	GPUIndex     int       `json:"gpuIndex"`
	Batch        bool      `json:"batch"`
	CapPercent   int       `json:"capPercent"`
	Priority     int       `json:"priority"`
	RequestMilli int64     `json:"requestMilli"`
	// MemLimitMiB is the pinned device memory limit handed out for the GPU, MiB (absent:
	// none); MemReason says how it was chosen or why there is none. A container of
	// several GPUs gets the lowest of its GPUs' limits on each.
	MemLimitMiB uint64 `json:"memLimitMiB,omitempty"`
	MemReason   string `json:"memReason"`
	// LSDemandPercent is LS's demand peak the cap was chosen from; Reason says what bound it.
	LSDemandPercent float64   `json:"lsDemandPercent"`
	Reason          string    `json:"reason"`
	Since           time.Time `json:"since"`
	// devices is the number of GPUs the container got: the ordinals its limit covers.
	devices int
	// seen: the pod was in the agent's pod snapshot once (then it is forgotten as soon as
	// it leaves it).
	seen bool
}

// NewPartitions returns Partitions choosing caps by p (forced into range, see
// qos.ChooseGPUMPSCaps). Until the Manager's first step it hands out no client.
func NewPartitions(p qos.GPUMPSPolicy) *Partitions {
	return &Partitions{policy: p, now: time.Now, gpus: map[string]*partitionGPU{},
		clients: map[clientKey]*PartitionClient{}}
}

// MPSClient implements devices.MPSPlanner: it chooses req's client and records it. ok is
// false (no error) when MPS is off for req's GPU.
func (p *Partitions) MPSClient(req devices.MPSRequest) (devices.MPSClient, bool, error) {
	switch {
	case req.PodUID == "":
		return devices.MPSClient{}, false, fmt.Errorf("no pod UID: %w", ErrMPSRequest)
	case req.Container == "":
		return devices.MPSClient{}, false, fmt.Errorf("pod %s/%s: no container name: %w", req.Namespace, req.Name, ErrMPSRequest)
	case req.GPU.UUID == "" && req.GPU.Index < 0:
		return devices.MPSClient{}, false, fmt.Errorf("pod %s/%s: no GPU: %w", req.Namespace, req.Name, ErrMPSRequest)
	case req.RequestMilli < 0:
		return devices.MPSClient{}, false, fmt.Errorf("pod %s/%s: gpu-milli request %d: %w", req.Namespace, req.Name,
			req.RequestMilli, ErrMPSRequest)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	uuid, g := p.gpuOf(req.GPU)
	if !p.ready || g == nil || !g.mpsOn {
		return devices.MPSClient{}, false, nil
	}
	in := qos.GPUMPSCapInput{LSDemandPercent: g.peak.Peak()}
	for k, c := range p.clients {
		if k.gpu == uuid && !c.Batch && !(k.pod == req.PodUID && k.container == req.Container) {
			in.LSRequestMilli = append(in.LSRequestMilli, c.RequestMilli)
		}
	}
	if req.Batch {
		in.BatchRequestMilli = req.RequestMilli
	} else {
		in.LSRequestMilli = append(in.LSRequestMilli, req.RequestMilli)
	}
	caps := qos.ChooseGPUMPSCaps(p.policy, in)
	mem := qos.ChooseGPUMPSMemLimit(qos.GPUMPSMemInput{Batch: req.Batch, TotalBytes: g.memTotal,
		BatchRequestMilli: req.RequestMilli, LSRequestMilli: in.LSRequestMilli})
	c := &PartitionClient{PodUID: req.PodUID, Namespace: req.Namespace, Name: req.Name, Container: req.Container,
		GPU: uuid, GPUIndex: g.index, Batch: req.Batch, RequestMilli: req.RequestMilli,
		LSDemandPercent: in.LSDemandPercent, Reason: caps.Reason, Since: p.now(),
		CapPercent: caps.LSPercent, Priority: qos.GPUMPSLSPriority,
		MemLimitMiB: mem.MiB, MemReason: mem.Reason, devices: max(req.Devices, 1)}
	if req.Batch {
		c.CapPercent, c.Priority = caps.BatchPercent, qos.GPUMPSBatchPriority
	}
	// A container created again (a restart) is a new client: the newest record wins.
	p.clients[clientKey{pod: req.PodUID, container: req.Container, gpu: uuid}] = c
	return devices.MPSClient{PipeDir: p.pipeDir, ActiveThreadPercent: c.CapPercent, Priority: c.Priority,
		PinnedMemLimitMiB: c.MemLimitMiB}, true, nil
}

// gpuOf finds the GPU of a request by UUID, else by index; p.mu is held.
func (p *Partitions) gpuOf(d devices.GPU) (string, *partitionGPU) {
	if d.UUID != "" {
		return d.UUID, p.gpus[d.UUID]
	}
	for uuid, g := range p.gpus {
		if g.index == d.Index {
			return uuid, g
		}
	}
	return "", nil
}

// MPSOn reports whether the GPU with uuid runs the agent's MPS server for new clients:
// the server is ready and the GPU can use it (healthy, not MIG).
func (p *Partitions) MPSOn(uuid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.gpus[uuid]
	return p.ready && g != nil && g.mpsOn
}

// Clients returns the clients handed out, sorted by GPU index, pod and container.
func (p *Partitions) Clients() []PartitionClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PartitionClient, 0, len(p.clients))
	for _, c := range p.clients {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b PartitionClient) int {
		if a.GPUIndex != b.GPUIndex {
			return a.GPUIndex - b.GPUIndex
		}
		if c := strings.Compare(string(a.PodUID), string(b.PodUID)); c != 0 {
			return c
		}
		return strings.Compare(a.Container, b.Container)
	})
	return out
}

// partitionGPUObs is one GPU as the Manager saw it at a step.
type partitionGPUObs struct {
	index int
	uuid  string
	// mpsOn: the GPU can use MPS (healthy, utilisation supported, i.e. not MIG).
	mpsOn bool
	// lsUtil is LS's SM utilisation (percent); lsKnown false leaves the demand peak as is
	// (the GPU could not be read).
	lsUtil  float64
	lsKnown bool
	// memTotal is the GPU's memory, bytes (0: not read; the last value read stays).
	memTotal uint64
}

// clientCaps is what a step needs of one pod's clients on one GPU.
type clientCaps struct {
	batch bool
	cap   int // the largest cap of the pod's clients on the GPU
	// memMiB is the largest memory limit of the pod's clients on the GPU, on memDevices
	// ordinals (the most of them); memNone: one of them has none. memSum is the sum of
	// their limits.
	memMiB, memSum uint64
	memDevices     int
	memNone        bool
}

// observe is the Manager's step: the server's state, the GPUs (those absent are
// forgotten with their clients), and which pods still exist (alive; a record of a pod
// that left, or that never appeared within partitionPodGrace, is dropped). It returns,
// by GPU UUID, the pods that are clients there.
func (p *Partitions) observe(now time.Time, ready bool, pipeDir string, gpus []partitionGPUObs,
	alive func(types.UID) bool) map[string]map[types.UID]clientCaps {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready, p.pipeDir = ready, pipeDir
	window := p.policy.DemandWindow.Duration
	if window <= 0 {
		window = qos.DefaultGPUMPSDemandWindow
	}
	syncGPUs(p.gpus, gpus, func(o partitionGPUObs) string { return o.uuid }, func(g *partitionGPU, o partitionGPUObs) {
		g.index, g.mpsOn = o.index, o.mpsOn
		if o.memTotal > 0 {
			g.memTotal = o.memTotal
		}
		if o.lsKnown {
			g.peak.Observe(now, o.lsUtil, window)
		}
	})
	if len(p.clients) == 0 {
		return nil
	}
	out := map[string]map[types.UID]clientCaps{}
	for k, c := range p.clients {
		switch {
		case p.gpus[k.gpu] == nil:
			delete(p.clients, k) // the GPU is gone
			continue
		case alive(k.pod):
			c.seen = true
		case c.seen || now.Sub(c.Since) > partitionPodGrace:
			delete(p.clients, k)
			continue
		}
		byPod := out[k.gpu]
		if byPod == nil {
			byPod = map[types.UID]clientCaps{}
			out[k.gpu] = byPod
		}
		cc := byPod[k.pod]
		cc.batch = c.Batch
		cc.cap = max(cc.cap, c.CapPercent)
		cc.memMiB, cc.memSum = max(cc.memMiB, c.MemLimitMiB), cc.memSum+c.MemLimitMiB
		cc.memDevices = max(cc.memDevices, c.devices)
		cc.memNone = cc.memNone || c.MemLimitMiB == 0
		byPod[k.pod] = cc
	}
	return out
}
