package devices

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// NoDevices is the NVIDIA_VISIBLE_DEVICES value that gives a container no GPU: the
// NVIDIA Container Runtime then injects nothing, in legacy and in CDI mode alike.
const NoDevices = "void"

// VisibleContainer is what the visibility decision needs of one container.
type VisibleContainer struct {
	// Pod is the container's pod from the agent's pod source; nil when the source did
	// not list it in time.
	Pod *corev1.Pod
	// Container is the container's name.
	Container string
	// Shared are the devices the extender gave it (a gpu-milli container); nil else.
	Shared []GPU
	// Env and CDI are its environment ("KEY=value") and CDI device names as the
	// runtime creates it, the image's and the device plugin's included.
	Env, CDI []string
	// CDIKind is the vendor/class of the node's GPU CDI devices.
	CDIKind string
	// Inventory is the node's GPUs.
	Inventory []GPU
	// TrustSpec: the pod is of a trusted system namespace, and keeps an
	// NVIDIA_VISIBLE_DEVICES its own spec sets.
	TrustSpec bool
}

// Visible returns the NVIDIA_VISIBLE_DEVICES value a container is pinned to, so that
// neither its image nor its spec widens what it was given; "" leaves the variable
// as it is.
//   - A shared-GPU container: the UUIDs of its devices (indices where the inventory
//     has no UUID), in mode cdi too, where the legacy runtime then injects exactly the
//     CDI devices again.
//   - A container requesting whole GPUs: the UUIDs of the devices NVIDIA's device
//     plugin gave it (its last NVIDIA_VISIBLE_DEVICES or its CDI devices, WholeGPUs),
//     so that an image's "all" next to CDI devices adds nothing; left alone where the
//     devices cannot be named (MIG devices, IDs the inventory lacks).
//   - A container requesting no GPU: NoDevices, unless its pod is trusted (TrustSpec:
//     a system namespace) and its own spec sets NVIDIA_VISIBLE_DEVICES (the node's
//     GPU agents, exporters and device plugins ask for "all" that way). A tenant's
//     spec that sets it gets NoDevices all the same.
//   - A container whose pod the agent does not know: NoDevices when its variable is
//     "all", else left (a device plugin's device list).
func Visible(c VisibleContainer) string {
	if len(c.Shared) > 0 {
		return ids(c.Shared)
	}
	if c.Pod == nil {
		if lastVisible(c.Env) == "all" {
			return NoDevices
		}
		return ""
	}
	if _, whole := GPURequest(c.Pod, c.Container); whole {
		if gs := WholeGPUs(c.Env, c.CDI, c.CDIKind, c.Inventory); len(gs) > 0 {
			return ids(gs)
		}
		return ""
	}
	if c.TrustSpec && specSetsVisible(c.Pod, c.Container) {
		return ""
	}
	return NoDevices
}

// ids lists gs as NVIDIA_VISIBLE_DEVICES names them: UUIDs, else indices.
func ids(gs []GPU) string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.UUID
		if g.UUID == "" {
			out[i] = strconv.Itoa(g.Index)
		}
	}
	return strings.Join(out, ",")
}

// lastVisible is the effective NVIDIA_VISIBLE_DEVICES of env (the last one wins);
// "" when unset.
func lastVisible(env []string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, EnvVisibleDevices+"="); ok {
			v = s
		}
	}
	return v
}

// specSetsVisible reports whether container ctr of pod sets NVIDIA_VISIBLE_DEVICES
// in its spec.
func specSetsVisible(pod *corev1.Pod, ctr string) bool {
	c := findContainer(pod, ctr)
	if c == nil {
		return false
	}
	for _, e := range c.Env {
		if e.Name == EnvVisibleDevices {
			return true
		}
	}
	return false
}
