package devices

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/qos"
)

// Environment of an MPS client, and where clients mount the server's shared memory.
const (
	EnvMPSPipeDirectory          = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSActiveThreadPercentage = qos.GPUMPSEnvActiveThreadPercentage
	EnvMPSClientPriority         = qos.GPUMPSEnvClientPriority
	EnvMPSPinnedDeviceMemLimit   = qos.GPUMPSEnvPinnedDeviceMemLimit
	// NoMPSPipeDirectory is where a batch container that is not the agent's MPS client
	// is pointed: a path below /dev/null, where no daemon can listen, so its CUDA runs
	// without MPS instead of joining a daemon (the agent's, at the default
	// /tmp/nvidia-mps, or another) uncapped.
	NoMPSPipeDirectory = "/dev/null/understory-no-mps"
	// ShmPath is where a client sees the server's shared memory.
	ShmPath = "/dev/shm"
)

// Sentinel errors of the MPS decision. A batch container with either is refused.
var (
	// ErrMPSPlanner: the planner failed for one of the container's GPUs.
	ErrMPSPlanner = errors.New("MPS partition planning failed")
	// ErrMPSUnsafe: the planner's answer is out of range (a cap outside 1..100, a
	// priority outside 0..1, a batch client without a cap below 100 at priority 1,
	// pipe directories that differ or are not clean absolute paths).
	ErrMPSUnsafe = errors.New("unsafe MPS client")
)

// MPSSetup is the node's MPS client setup (gpu.mps).
type MPSSetup struct {
	// ShmDir is the host directory the servers see as /dev/shm (a private one, never
	// the host's /dev/shm), bind-mounted read-write at /dev/shm in every client; ""
	// mounts nothing (the runtime's /dev/shm is then the server's).
	ShmDir string
	// ClientUID is the only user ID a client may run as; never root (a container
	// running as root is no client).
	ClientUID int64
}

// MPSContainer is what the decision needs of one container.
type MPSContainer struct {
	// Pod and Container name it (Pod's spec may be nil: no GPU then).
	Pod       *corev1.Pod
	Container string
	// Batch: the pod is of the batch class.
	Batch bool
	// GPUs the container gets: the extender's devices (gpu-milli) or the device
	// plugin's whole GPUs (WholeGPUs).
	GPUs []GPU
	// RequestMilli is its share of each GPU (1000 for whole GPUs).
	RequestMilli int64
	// UID is the user its processes run as, when UIDKnown (ContainerUID).
	UID      int64
	UIDKnown bool
	// Env is its environment as the runtime creates it ("KEY=value").
	Env []string
}

// MPSMount is a bind mount of host Source at Destination, read-only when ReadOnly.
type MPSMount struct {
	Source, Destination string
	ReadOnly            bool
}

// MPSDecision is the MPS part of a container's creation.
type MPSDecision struct {
	// Client is the client the container runs as when OK.
	Client MPSClient
	OK     bool
	// Env is what to set: the client's three variables and, where it has a memory limit,
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (overriding the pod's), or, for a batch container
	// that is no client, CUDA_MPS_PIPE_DIRECTORY pinned to NoMPSPipeDirectory. Nil:
	// leave the environment alone.
	Env map[string]string
	// Mounts are the client's: the pipe directory (same path, read-only: a client
	// connects to the daemon's socket there but cannot remove, replace or add
	// anything) and the server's shm directory at /dev/shm (read-write).
	Mounts []MPSMount
	// Skipped says why a GPU container is no client; "" when it is one or uses no GPU.
	Skipped string
	// Err is the planner's failure for an LS container, which starts without MPS.
	Err error
}

// DecideMPS decides whether and how the container runs as an MPS client: one
// planner call per GPU, a client only if every GPU has one (a process's MPS
// connection covers all its GPUs), with the lowest cap, the lowest priority
// (highest number) and the lowest memory limit of them. The memory limit goes to every
// CUDA device ordinal of the container (0 to its GPU count − 1; a shared-GPU container
// has one GPU, ordinal 0): the container sees only its own GPUs (Visible pins
// NVIDIA_VISIBLE_DEVICES to them), and the same value on each ordinal holds whatever
// order CUDA enumerates them in. A batch container whose planner call fails, or is
// answered with an unsafe client, is refused with an error wrapping ErrMPSPlanner
// or ErrMPSUnsafe, never started as an unlimited client. A nil planner (the agent's
// MPS off) leaves every container alone.
func DecideMPS(p MPSPlanner, s MPSSetup, c MPSContainer) (MPSDecision, error) {
	if p == nil {
		return MPSDecision{}, nil
	}
	var d MPSDecision
	switch {
	case len(c.GPUs) == 0:
		if c.Batch && hasMPSEnv(c.Env) {
			d.Env = map[string]string{EnvMPSPipeDirectory: NoMPSPipeDirectory}
		}
		return d, nil
	case !c.UIDKnown:
		d.Skipped = "its user ID is unknown (set runAsUser)"
	case c.UID == 0:
		// The control daemon starts each server with its client's UID: a root client
		// would get a root MPS server on the host.
		d.Skipped = fmt.Sprintf("it runs as root and MPS clients run as UID %d", s.ClientUID)
	case c.UID != s.ClientUID:
		d.Skipped = fmt.Sprintf("it runs as UID %d and MPS clients run as UID %d", c.UID, s.ClientUID)
	default:
		cl, ok, err := plan(p, c)
		switch {
		case err != nil && c.Batch:
			return MPSDecision{}, err
		case err != nil:
			d.Err, d.Skipped = err, "planning failed"
		case !ok:
			d.Skipped = "MPS is not available on its GPU"
		default:
			d.Client, d.OK = cl, true
		}
	}
	if !d.OK {
		if c.Batch {
			d.Env = map[string]string{EnvMPSPipeDirectory: NoMPSPipeDirectory}
		}
		return d, nil
	}
	d.Env = map[string]string{
		EnvMPSPipeDirectory:          d.Client.PipeDir,
		EnvMPSActiveThreadPercentage: strconv.Itoa(d.Client.ActiveThreadPercent),
		EnvMPSClientPriority:         strconv.Itoa(d.Client.Priority),
	}
	if v := qos.GPUMPSPinnedMemLimitValue(len(c.GPUs), d.Client.PinnedMemLimitMiB); v != "" {
		d.Env[EnvMPSPinnedDeviceMemLimit] = v
	}
	d.Mounts = []MPSMount{{Source: d.Client.PipeDir, Destination: d.Client.PipeDir, ReadOnly: true}}
	if s.ShmDir != "" {
		d.Mounts = append(d.Mounts, MPSMount{Source: s.ShmDir, Destination: ShmPath})
	}
	return d, nil
}

// plan asks the planner for every GPU and combines the answers.
func plan(p MPSPlanner, c MPSContainer) (MPSClient, bool, error) {
	var out MPSClient
	for i, g := range c.GPUs {
		req := MPSRequest{GPU: g, Container: c.Container, Batch: c.Batch, RequestMilli: c.RequestMilli,
			Devices: len(c.GPUs)}
		if c.Pod != nil {
			req.PodUID, req.Namespace, req.Name = c.Pod.UID, c.Pod.Namespace, c.Pod.Name
		}
		cl, ok, err := p.MPSClient(req)
		if err != nil {
			return MPSClient{}, false, fmt.Errorf("GPU %d (%s): %w: %w", g.Index, g.UUID, ErrMPSPlanner, err)
		}
		if !ok {
			return MPSClient{}, false, nil
		}
		if err := checkClient(cl, c.Batch); err != nil {
			return MPSClient{}, false, fmt.Errorf("GPU %d (%s): %w", g.Index, g.UUID, err)
		}
		if i == 0 {
			out = cl
			continue
		}
		if cl.PipeDir != out.PipeDir {
			return MPSClient{}, false, fmt.Errorf("pipe directories %q and %q: %w", out.PipeDir, cl.PipeDir,
				ErrMPSUnsafe)
		}
		out.ActiveThreadPercent = min(out.ActiveThreadPercent, cl.ActiveThreadPercent)
		out.Priority = max(out.Priority, cl.Priority)
		// The lowest limit of the GPUs that have one: which ordinal is which GPU is the
		// client's enumeration, so every ordinal gets the strictest.
		if out.PinnedMemLimitMiB == 0 || (cl.PinnedMemLimitMiB != 0 && cl.PinnedMemLimitMiB < out.PinnedMemLimitMiB) {
			out.PinnedMemLimitMiB = cl.PinnedMemLimitMiB
		}
	}
	return out, true, nil
}

// checkClient refuses an answer that would start a client unsafely.
func checkClient(cl MPSClient, batch bool) error {
	p := cl.PipeDir
	switch {
	case !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00\n,:="):
		return fmt.Errorf("pipe directory %q: %w", p, ErrMPSUnsafe)
	case cl.ActiveThreadPercent < 1 || cl.ActiveThreadPercent > 100:
		return fmt.Errorf("active thread percentage %d: %w", cl.ActiveThreadPercent, ErrMPSUnsafe)
	case cl.Priority < 0 || cl.Priority > 1:
		return fmt.Errorf("client priority %d: %w", cl.Priority, ErrMPSUnsafe)
	case batch && (cl.ActiveThreadPercent >= 100 || cl.Priority != 1):
		return fmt.Errorf("batch client at %d %% priority %d (want a cap below 100 at priority 1): %w",
			cl.ActiveThreadPercent, cl.Priority, ErrMPSUnsafe)
	}
	return nil
}

// hasMPSEnv reports whether env sets any CUDA_MPS_ variable.
func hasMPSEnv(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "CUDA_MPS_") {
			return true
		}
	}
	return false
}

// ContainerUID is the user ID of container ctr of pod from its spec: the
// container's runAsUser, else the pod's. Without either the image decides, which the
// spec does not tell (ok false).
func ContainerUID(pod *corev1.Pod, ctr string) (int64, bool) {
	if pod == nil {
		return 0, false
	}
	if c := findContainer(pod, ctr); c != nil && c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return *c.SecurityContext.RunAsUser, true
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		return *sc.RunAsUser, true
	}
	return 0, false
}

// GPURequest returns what container ctr of pod asks of the GPU: its gpu-milli
// share (requests, else limits; at most 1000) or, for whole GPUs, 1000. whole tells
// which; both zero: no GPU request.
func GPURequest(pod *corev1.Pod, ctr string) (milli int64, whole bool) {
	if pod == nil {
		return 0, false
	}
	c := findContainer(pod, ctr)
	if c == nil {
		return 0, false
	}
	if requests(c, ResourceGPU) {
		return milliPerGPU, true
	}
	for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		if q, ok := l[ResourceGPUMilli]; ok && q.Sign() > 0 {
			return min(q.Value(), milliPerGPU), false
		}
	}
	return 0, false
}

// milliPerGPU is one whole GPU in understory.io/gpu-milli.
const milliPerGPU = 1000

// WholeGPUs returns the GPUs of the inventory that NVIDIA's device plugin gave a
// container, from its environment (the last NVIDIA_VISIBLE_DEVICES: UUIDs or
// indices, the plugin's envvar strategy) and its CDI devices of kind (cdiKind=<UUID
// or index>, its CDI strategies). It returns nil when it cannot name every device:
// "all", "none" or "void", MIG devices, IDs the inventory does not have.
func WholeGPUs(env, cdi []string, cdiKind string, inv []GPU) []GPU {
	var ids []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, EnvVisibleDevices+"="); ok {
			ids = ids[:0]
			if v == "" || v == "all" || v == "none" || v == "void" {
				continue
			}
			ids = append(ids, strings.Split(v, ",")...)
		}
	}
	for _, name := range cdi {
		kind, id, ok := strings.Cut(name, "=")
		if !ok || kind != cdiKind {
			continue
		}
		if id == "all" {
			return nil
		}
		ids = append(ids, id)
	}
	var out []GPU
	for _, id := range ids {
		g, ok := ResolveID(inv, strings.TrimSpace(id))
		if !ok {
			return nil
		}
		dup := false
		for _, o := range out {
			dup = dup || o.Index == g.Index
		}
		if !dup {
			out = append(out, g)
		}
	}
	return out
}
