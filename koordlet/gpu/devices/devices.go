package devices

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
)

// Resource names and the annotation the decision reads.
const (
	// ResourceGPUMilli and ResourceGPU are contract's names as resource names (a share of
	// one GPU placed by the extender; a whole GPU allocated by NVIDIA's device plugin).
	ResourceGPUMilli = corev1.ResourceName(contract.ResourceGPUMilli)
	ResourceGPU      = corev1.ResourceName(contract.ResourceGPU)
	// AnnotationDevices is the extender's choice of device indices (contract's codec).
	AnnotationDevices = contract.AnnotationGPUDevices
	// EnvVisibleDevices is the NVIDIA Container Runtime's device selection variable.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// DefaultCDIKind is the vendor/class of NVIDIA's CDI devices.
	DefaultCDIKind = "nvidia.com/gpu"
)

// Sentinel errors: why a container is refused. Each has an Event reason (Reason).
var (
	// ErrNoAnnotation: a gpu-milli container in a pod without understory.io/gpu-devices
	// (not placed by the extender, or the annotation was removed).
	ErrNoAnnotation = errors.New("pod requests " + string(ResourceGPUMilli) + " but has no " +
		AnnotationDevices + " annotation")
	// ErrMalformed: the annotation is not a list of distinct device indices.
	ErrMalformed = errors.New("malformed " + AnnotationDevices + " annotation")
	// ErrAbsentDevice: the annotation names a device the node's inventory does not have.
	ErrAbsentDevice = errors.New("GPU device not on this node")
	// ErrNoInventory: the agent has no GPU inventory (NVML off or not read yet).
	ErrNoInventory = errors.New("no GPU inventory on this node")
	// ErrBadInventory: the inventory itself is unusable (an index twice, a UUID twice).
	ErrBadInventory = errors.New("inconsistent GPU inventory")
	// ErrConflict: a container requests both whole and shared GPUs.
	ErrConflict = errors.New("container requests both " + string(ResourceGPU) + " and " +
		string(ResourceGPUMilli))
	// ErrInvalidConfig: an unknown mode or CDI naming.
	ErrInvalidConfig = errors.New("invalid GPU device config")
)

// Reason is the Kubernetes Event reason for a refusal error; "GPUDevicesRefused" for
// an error wrapping none of the sentinels.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoAnnotation):
		return "GPUDevicesMissing"
	case errors.Is(err, ErrMalformed):
		return "GPUDevicesInvalid"
	case errors.Is(err, ErrAbsentDevice):
		return "GPUDeviceAbsent"
	case errors.Is(err, ErrNoInventory):
		return "NoGPUInventory"
	case errors.Is(err, ErrBadInventory):
		return "GPUInventoryInvalid"
	case errors.Is(err, ErrConflict):
		return "GPURequestConflict"
	case errors.Is(err, ErrMPSPlanner):
		return "MPSPlanningFailed"
	case errors.Is(err, ErrMPSUnsafe):
		return "MPSClientUnsafe"
	}
	return "GPUDevicesRefused"
}

// Mode is how the devices reach the container.
type Mode string

// Modes.
const (
	// ModeCDI adds CDI device references (containerd ≥ 1.7 and CRI-O with CDI on).
	ModeCDI Mode = "cdi"
	// ModeEnv sets NVIDIA_VISIBLE_DEVICES for the NVIDIA Container Runtime.
	ModeEnv Mode = "env"
)

// Naming is how CDI devices are named.
type Naming string

// CDI namings (nvidia-ctk's --device-name-strategy).
const (
	// NamingUUID: nvidia.com/gpu=GPU-8a6f... (stable across re-enumeration).
	NamingUUID Naming = "uuid"
	// NamingIndex: nvidia.com/gpu=0.
	NamingIndex Naming = "index"
)

// Config chooses the output. The zero value is mode cdi, kind nvidia.com/gpu, UUID names.
type Config struct {
	Mode Mode `json:"mode,omitempty"`
	// CDIKind is the vendor/class prefix of CDI names (default nvidia.com/gpu).
	CDIKind string `json:"cdiKind,omitempty"`
	// CDINames is the naming of the node's CDI spec (default uuid).
	CDINames Naming `json:"cdiNames,omitempty"`
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeCDI
	}
	if c.CDIKind == "" {
		c.CDIKind = DefaultCDIKind
	}
	if c.CDINames == "" {
		c.CDINames = NamingUUID
	}
	return c
}

// Validate checks c after defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.Mode != ModeCDI && c.Mode != ModeEnv {
		return fmt.Errorf("mode %q: want %s or %s: %w", c.Mode, ModeCDI, ModeEnv, ErrInvalidConfig)
	}
	if c.CDINames != NamingUUID && c.CDINames != NamingIndex {
		return fmt.Errorf("cdiNames %q: want %s or %s: %w", c.CDINames, NamingUUID, NamingIndex, ErrInvalidConfig)
	}
	// A CDI kind is "vendor/class": vendor a domain-like name, class a simple name.
	vendor, class, ok := strings.Cut(c.CDIKind, "/")
	if !ok || !cdiName(vendor, ".-_") || !cdiName(class, "-_") {
		return fmt.Errorf("cdiKind %q: want vendor/class like %s: %w", c.CDIKind, DefaultCDIKind, ErrInvalidConfig)
	}
	return nil
}

// cdiName reports whether s is 1..95 letters, digits and the runes of extra.
func cdiName(s, extra string) bool {
	if s == "" || len(s) > 95 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(extra, r)) {
			return false
		}
	}
	return true
}

// GPU is one device of the node's inventory.
type GPU struct {
	// Index is the NVML index, the one the extender's annotation names.
	Index int
	// UUID is NVML's device UUID ("GPU-..."); needed for mode env and UUID names.
	UUID string
}

// Assignment is the devices a container gets.
type Assignment struct {
	// Devices in annotation order.
	Devices []GPU
	// CDIDevices are the fully-qualified CDI names to add (mode cdi); nil otherwise.
	CDIDevices []string
	// Env is the variable to set (mode env), NVIDIA_VISIBLE_DEVICES=<UUIDs>; nil otherwise.
	Env map[string]string
}

// Decide returns the GPU devices of container ctr of pod. ok is false, with no error,
// when the container is not ours to touch: it requests no shared GPU (none at all, or
// whole GPUs only), or it is not in the pod's spec. A container requesting shared GPU
// gets exactly the annotated devices, or an error wrapping one of the sentinels.
func Decide(cfg Config, pod *corev1.Pod, ctr string, inventory []GPU) (a Assignment, ok bool, err error) {
	if pod == nil {
		return Assignment{}, false, nil
	}
	c := findContainer(pod, ctr)
	if c == nil {
		return Assignment{}, false, nil
	}
	milli, whole := requests(c, ResourceGPUMilli), requests(c, ResourceGPU)
	switch {
	case !milli:
		return Assignment{}, false, nil
	case whole:
		return Assignment{}, false, fmt.Errorf("container %q: %w", ctr, ErrConflict)
	}
	if err := cfg.Validate(); err != nil {
		return Assignment{}, false, err
	}
	cfg = cfg.WithDefaults()
	value, found := pod.Annotations[AnnotationDevices]
	if !found {
		return Assignment{}, false, ErrNoAnnotation
	}
	idx, err := contract.ParseGPUDevices(value)
	if err != nil {
		return Assignment{}, false, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(inventory) == 0 {
		return Assignment{}, false, ErrNoInventory
	}
	byIndex, err := indexInventory(inventory)
	if err != nil {
		return Assignment{}, false, err
	}
	a.Devices = make([]GPU, 0, len(idx))
	for _, i := range idx {
		g, ok := byIndex[i]
		if !ok {
			return Assignment{}, false, fmt.Errorf("device %d (node has %s): %w", i, describe(inventory), ErrAbsentDevice)
		}
		if g.UUID == "" && (cfg.Mode == ModeEnv || cfg.CDINames == NamingUUID) {
			return Assignment{}, false, fmt.Errorf("device %d has no UUID in the inventory: %w", i, ErrAbsentDevice)
		}
		a.Devices = append(a.Devices, g)
	}
	switch cfg.Mode {
	case ModeCDI:
		for _, g := range a.Devices {
			name := g.UUID
			if cfg.CDINames == NamingIndex {
				name = fmt.Sprint(g.Index)
			}
			a.CDIDevices = append(a.CDIDevices, cfg.CDIKind+"="+name)
		}
	case ModeEnv:
		uuids := make([]string, len(a.Devices))
		for i, g := range a.Devices {
			uuids[i] = g.UUID
		}
		a.Env = map[string]string{EnvVisibleDevices: strings.Join(uuids, ",")}
	}
	return a, true, nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	// Ephemeral containers cannot have resources: never a GPU request.
	return nil
}

// requests reports whether c asks for a positive amount of name, in its requests or
// its limits (extended resources may be given as limits only).
func requests(c *corev1.Container, name corev1.ResourceName) bool {
	for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		if q, ok := l[name]; ok && q.Sign() > 0 {
			return true
		}
	}
	return false
}

// indexInventory maps index → GPU, refusing an inventory that names an index or a
// UUID twice (it could hand a container the wrong device), or holds a UUID that is not
// a valid CDI device name or would split the NVIDIA_VISIBLE_DEVICES list.
func indexInventory(inv []GPU) (map[int]GPU, error) {
	out := make(map[int]GPU, len(inv))
	uuids := make(map[string]int, len(inv))
	for _, g := range inv {
		if g.UUID != "" && !cdiName(g.UUID, "-_.:") {
			return nil, fmt.Errorf("index %d: UUID %q: %w", g.Index, g.UUID, ErrBadInventory)
		}
		if _, dup := out[g.Index]; dup {
			return nil, fmt.Errorf("index %d twice: %w", g.Index, ErrBadInventory)
		}
		if prev, dup := uuids[g.UUID]; dup && g.UUID != "" {
			return nil, fmt.Errorf("UUID %s at indices %d and %d: %w", g.UUID, prev, g.Index, ErrBadInventory)
		}
		out[g.Index] = g
		uuids[g.UUID] = g.Index
	}
	return out, nil
}

// describe lists the inventory's indices for an error message.
func describe(inv []GPU) string {
	var b strings.Builder
	b.WriteString("indices ")
	for i, g := range inv {
		if i > 0 {
			b.WriteByte(',')
		}
		if i == 16 {
			fmt.Fprintf(&b, "... (%d devices)", len(inv))
			break
		}
		fmt.Fprint(&b, g.Index)
	}
	return b.String()
}

// ResolveID maps a device ID that kubelet's PodResources API reports for nvidia.com/gpu
// to a device of the inventory. NVIDIA's device plugin reports GPU UUIDs (its default
// DEVICE_ID_STRATEGY=uuid) or decimal indices (=index); its time-slicing replicas add
// a "::<n>" suffix. IDs of MIG devices and of other plugins match nothing.
func ResolveID(inventory []GPU, id string) (GPU, bool) {
	id, _, _ = strings.Cut(id, "::")
	if id == "" {
		return GPU{}, false
	}
	if i, isIndex := contract.ParseGPUIndex(id); isIndex {
		for _, g := range inventory {
			if g.Index == i {
				return g, true
			}
		}
		return GPU{}, false
	}
	for _, g := range inventory {
		if g.UUID != "" && g.UUID == id {
			return g, true
		}
	}
	return GPU{}, false
}
