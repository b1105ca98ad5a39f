package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// The Node annotations holding the agent's NodeMetrics (contract: docs/node-metrics.md).
const (
	// AnnotationNodeMetrics holds the version-1 document. Its format never changes:
	// readers built before version 2 reject any other version, so the agent keeps
	// writing version 1 here for them.
	AnnotationNodeMetrics = "understory.io/node-metrics"
	// AnnotationNodeMetricsV2 holds the version-2 document: every version-1 field
	// plus the GPU section. Written next to the version-1 one, in the same patch.
	AnnotationNodeMetricsV2 = "understory.io/node-metrics-v2"
)

// Document versions.
const (
	// NodeMetricsVersion is the version of the document in AnnotationNodeMetrics.
	NodeMetricsVersion = 1
	// NodeMetricsVersion2 is the version of the document in AnnotationNodeMetricsV2.
	NodeMetricsVersion2 = 2
)

// MaxGPUsPerNode bounds the GPUs of one node: in a version-2 document, its device
// indices anywhere, the gpu-devices annotation, and what the extender's placement core
// tracks per node (it is the largest node the extender can place on).
const MaxGPUsPerNode = 64

// Sentinel errors returned (wrapped) by DecodeNodeMetrics and DecodeNodeAnnotations.
var (
	// ErrUnsupportedVersion means the annotation was written in a version this build does not read.
	ErrUnsupportedVersion = errors.New("unsupported node-metrics version")
	// ErrInvalidNodeMetrics means the annotation is not well-formed or holds impossible values.
	ErrInvalidNodeMetrics = errors.New("invalid node-metrics")
	// ErrNoNodeMetrics means the Node carries neither node-metrics annotation.
	ErrNoNodeMetrics = errors.New("no node-metrics annotation")
)

// Size bounds of what the decoders accept. A version-1 value is a few hundred bytes; a
// version-2 one about 180 bytes more per GPU and 100-180 per pod holding whole GPUs (a
// full 64-GPU node with long pod names: 23 KiB).
const (
	maxNodeMetricsBytes   = 16 << 10
	maxNodeMetricsV2Bytes = 64 << 10
)

// Bounds of the GPU section's strings and lists.
const (
	// maxGPUUUID: NVML's UUID buffer is 96 bytes including the NUL.
	maxGPUUUID = 95
	// maxGPUModel: NVML's name buffer is 96 bytes including the NUL.
	maxGPUModel = 95
	// maxGPUAllocPods bounds the pods in the allocation (whole GPUs are at most 64 per
	// node; the device plugin's time-slicing replicas can give one GPU to several pods).
	maxGPUAllocPods = 1024
	// Kubernetes object name and namespace lengths (DNS subdomain, DNS label) and a
	// generous bound for UIDs (36 for the API server's, any string for static pods).
	maxPodName      = 253
	maxPodNamespace = 63
	maxPodUID       = 128
)

// NodeMetrics is the node-level utilisation snapshot the agent publishes for the scheduler.
// CPU quantities are millicores averaged over Window; memory is in bytes.
//
// One value serves both documents: EncodeAnnotations writes it as version 1 (without
// GPU) and as version 2. A value with Version 1 must have GPU nil.
type NodeMetrics struct {
	Version   int       `json:"v"`
	Timestamp time.Time `json:"ts"`
	// Window is the averaging window of the usage figures, in milliseconds.
	WindowMillis int64         `json:"win"`
	CPU          CPUMetrics    `json:"cpu"`
	Memory       MemoryMetrics `json:"mem"`
	// Batch is what the agent has published as the batch extended resources on the
	// Node (status.capacity and status.allocatable); nil when it publishes none (yet),
	// and in annotations written before the field existed. A pointer, so that "none"
	// and "zero" differ: trap, == on NodeMetrics then compares the pointer, and a
	// shallow copy shares it (treat it as immutable).
	Batch *BatchResources `json:"batch,omitempty"`
	// GPU is the node's GPUs (version 2 only); nil when the agent has no GPU
	// information (no NVML on the node, or GPU features off). The same pointer trap as
	// Batch applies.
	GPU *GPUMetrics `json:"gpu,omitempty"`
}

// BatchResources are the batch extended resources on the Node, in the units of the
// resources: understory.io/batch-cpu in millicores, understory.io/batch-memory in bytes.
type BatchResources struct {
	CPU    int64 `json:"cpu"`
	Memory int64 `json:"mem"`
}

// CPUMetrics are the node's CPU figures in millicores.
type CPUMetrics struct {
	// Capacity is the node's CPU count × 1000.
	Capacity int64 `json:"cap"`
	// Used is everything the node ran: pods and system.
	Used int64 `json:"used"`
	// LS is what latency-sensitive pods used.
	LS int64 `json:"ls"`
	// Batch is what batch pods used.
	Batch int64 `json:"batch"`
	// BatchBudget is the CPU the agent currently lets batch pods use.
	BatchBudget int64 `json:"budget"`
}

// MemoryMetrics are the node's memory figures in bytes.
type MemoryMetrics struct {
	Capacity int64 `json:"cap"`
	Used     int64 `json:"used"`
	LS       int64 `json:"ls"`
	Batch    int64 `json:"batch"`
}

// GPUMetrics is the GPU section of a version-2 document.
type GPUMetrics struct {
	// Devices are the node's GPUs in increasing Index order, at most MaxGPUsPerNode;
	// empty (not nil) when NVML works and the node has no GPU.
	Devices []GPUDevice `json:"devs"`
	// Alloc is kubelet's real allocation of whole GPUs (nvidia.com/gpu, through
	// NVIDIA's device plugin), read from kubelet's PodResources API; nil when it is
	// unknown (the API was unreachable), which is not the same as no pod holding one.
	Alloc *GPUAllocation `json:"alloc,omitempty"`
}

// GPUDevice is one GPU over the averaging window. Utilisation is percent (0..100) of
// the device's SM time; memory is bytes.
type GPUDevice struct {
	// Index is the NVML device index: the index the extender's
	// understory.io/gpu-devices annotation names.
	Index int    `json:"i"`
	UUID  string `json:"uuid"`
	Model string `json:"model,omitempty"`
	// Healthy is false when a query of the device failed in the window; its figures
	// are then not to be trusted, and a reader must count the device as unknown,
	// never as idle.
	Healthy bool `json:"ok"`
	// Util is the whole device's utilisation, LSUtil the part of it used by
	// latency-sensitive pods' processes (and processes the agent could not attribute,
	// counted as LS: the safe side). Both are means over the window; LSUtil comes from
	// per-process samples and may slightly exceed Util.
	Util   float64 `json:"util"`
	LSUtil float64 `json:"ls"`
	// MemUsed and MemTotal are the device memory in use and installed.
	MemUsed  int64 `json:"memUsed"`
	MemTotal int64 `json:"memCap"`
	// Reclaimable is the share of the device (0..1) the agent lets batch use now: what
	// LS leaves, after the agent's GPU throttle.
	Reclaimable float64 `json:"reclaim"`
	// LSFreeMilli is the SM share LS leaves free, in milli-GPU (0..MilliPerGPU), the
	// unit of understory.io/gpu-milli: MilliPerGPU minus the larger of LS's peak SM
	// utilisation over the window and, on an MPS GPU, the SM cap LS's MPS clients
	// hold. nil: unknown (an agent older than the field, or a device not Healthy);
	// never read it as free. A pointer, so that "unknown" and 0 differ (the Batch
	// pointer trap applies).
	LSFreeMilli *int `json:"lsFree,omitempty"`
	// MPS is true when the GPU runs an MPS server whose clients the agent places
	// (batch containers start as capped MPS clients there); false also in documents
	// of agents older than the field.
	MPS bool `json:"mps,omitempty"`
}

// MilliPerGPU is one whole GPU in milli-GPU, the unit of understory.io/gpu-milli and
// of GPUDevice.LSFreeMilli.
const MilliPerGPU = 1000

// GPUAllocation is which pods hold which whole GPUs, as kubelet allocated them.
type GPUAllocation struct {
	// Pods in any order, each at most once.
	Pods []PodGPUs `json:"pods"`
}

// PodGPUs is one pod's whole GPUs.
type PodGPUs struct {
	Namespace string `json:"ns"`
	Name      string `json:"name"`
	// UID is the pod's UID; empty when the agent could not match kubelet's entry
	// (which names only namespace and name) with a pod it knows.
	UID string `json:"uid,omitempty"`
	// Devices are the GPU indices, distinct, not empty.
	Devices []int `json:"devs"`
}

// Encode validates m and returns its compact JSON form (a version-1 or a version-2
// document, as m.Version says).
func (m NodeMetrics) Encode() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("json: %v: %w", err, ErrInvalidNodeMetrics)
	}
	if limit := maxBytes(m.Version); len(b) > limit {
		return nil, fmt.Errorf("%d bytes exceed %d: %w", len(b), limit, ErrInvalidNodeMetrics)
	}
	return b, nil
}

// EncodeAnnotations returns the values the agent writes for m, keyed by annotation:
// the version-1 document (m without GPU) under AnnotationNodeMetrics, and the
// version-2 document (all of m) under AnnotationNodeMetricsV2. m.Version is ignored.
// Write both in one patch, so that their timestamps agree.
func (m NodeMetrics) EncodeAnnotations() (map[string]string, error) {
	v1, v2 := m, m
	v1.Version, v1.GPU = NodeMetricsVersion, nil
	v2.Version = NodeMetricsVersion2
	b1, err := v1.Encode()
	if err != nil {
		return nil, fmt.Errorf("version 1: %w", err)
	}
	b2, err := v2.Encode()
	if err != nil {
		return nil, fmt.Errorf("version 2: %w", err)
	}
	return map[string]string{AnnotationNodeMetrics: string(b1), AnnotationNodeMetricsV2: string(b2)}, nil
}

// Validate checks that m is a value a reader can trust.
func (m NodeMetrics) Validate() error {
	switch m.Version {
	case NodeMetricsVersion:
		if m.GPU != nil {
			return fmt.Errorf("gpu: needs version %d: %w", NodeMetricsVersion2, ErrInvalidNodeMetrics)
		}
	case NodeMetricsVersion2:
	default:
		return fmt.Errorf("version %d: %w", m.Version, ErrUnsupportedVersion)
	}
	if m.Timestamp.IsZero() {
		return fmt.Errorf("ts: missing: %w", ErrInvalidNodeMetrics)
	}
	if m.WindowMillis <= 0 {
		return fmt.Errorf("win: %d must be > 0: %w", m.WindowMillis, ErrInvalidNodeMetrics)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"cpu.cap", m.CPU.Capacity}, {"cpu.used", m.CPU.Used}, {"cpu.ls", m.CPU.LS},
		{"cpu.batch", m.CPU.Batch}, {"cpu.budget", m.CPU.BatchBudget},
		{"mem.cap", m.Memory.Capacity}, {"mem.used", m.Memory.Used}, {"mem.ls", m.Memory.LS},
		{"mem.batch", m.Memory.Batch},
		{"batch.cpu", m.Batch.cpu()}, {"batch.mem", m.Batch.mem()},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s: %d is negative: %w", f.name, f.v, ErrInvalidNodeMetrics)
		}
	}
	if m.CPU.Capacity == 0 {
		return fmt.Errorf("cpu.cap: must be > 0: %w", ErrInvalidNodeMetrics)
	}
	if m.GPU != nil {
		if err := m.GPU.validate(); err != nil {
			return fmt.Errorf("gpu.%w", err)
		}
	}
	return nil
}

func (g *GPUMetrics) validate() error {
	if g.Devices == nil {
		return fmt.Errorf("devs: missing (empty list for no GPU): %w", ErrInvalidNodeMetrics)
	}
	if len(g.Devices) > MaxGPUsPerNode {
		return fmt.Errorf("devs: %d GPUs exceed %d: %w", len(g.Devices), MaxGPUsPerNode, ErrInvalidNodeMetrics)
	}
	uuids := make(map[string]bool, len(g.Devices))
	for i, d := range g.Devices {
		if err := d.validate(); err != nil {
			return fmt.Errorf("devs[%d].%w", i, err)
		}
		if i > 0 && d.Index <= g.Devices[i-1].Index {
			return fmt.Errorf("devs[%d].i: %d after %d: indices must increase: %w", i, d.Index,
				g.Devices[i-1].Index, ErrInvalidNodeMetrics)
		}
		if uuids[d.UUID] {
			return fmt.Errorf("devs[%d].uuid: %q twice: %w", i, d.UUID, ErrInvalidNodeMetrics)
		}
		uuids[d.UUID] = true
	}
	if g.Alloc != nil {
		if err := g.Alloc.validate(); err != nil {
			return fmt.Errorf("alloc.%w", err)
		}
	}
	return nil
}

func (d GPUDevice) validate() error {
	if err := validIndex(d.Index); err != nil {
		return fmt.Errorf("i: %w", err)
	}
	if err := printable(d.UUID, maxGPUUUID, true); err != nil {
		return fmt.Errorf("uuid: %w", err)
	}
	if err := gpuUUID(d.UUID); err != nil {
		return fmt.Errorf("uuid: %w", err)
	}
	if len(d.Model) > maxGPUModel || !utf8.ValidString(d.Model) {
		return fmt.Errorf("model: longer than %d bytes or not UTF-8: %w", maxGPUModel, ErrInvalidNodeMetrics)
	}
	for _, f := range []struct {
		name   string
		v, max float64
	}{{"util", d.Util, 100}, {"ls", d.LSUtil, 100}, {"reclaim", d.Reclaimable, 1}} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > f.max {
			return fmt.Errorf("%s: %v out of 0..%v: %w", f.name, f.v, f.max, ErrInvalidNodeMetrics)
		}
	}
	if d.MemUsed < 0 || d.MemTotal < 0 {
		return fmt.Errorf("mem: negative (used %d, total %d): %w", d.MemUsed, d.MemTotal, ErrInvalidNodeMetrics)
	}
	if f := d.LSFreeMilli; f != nil && (*f < 0 || *f > MilliPerGPU) {
		return fmt.Errorf("lsFree: %d out of 0..%d: %w", *f, MilliPerGPU, ErrInvalidNodeMetrics)
	}
	return nil
}

// gpuUUIDPrefix starts every NVML UUID of a whole GPU (MIG devices' start "MIG-" and
// are never listed).
const gpuUUIDPrefix = "GPU-"

// gpuUUID checks the shape of an NVML GPU UUID: "GPU-" and then letters, digits and
// dashes (NVML writes hex groups: GPU-8a6f3b5e-1c2d-...). The extender keys its
// bookings by it, so a UUID that is not one must not reach it.
func gpuUUID(s string) error {
	rest, ok := strings.CutPrefix(s, gpuUUIDPrefix)
	if !ok || rest == "" {
		return fmt.Errorf("%q: want %s followed by the device's hex groups: %w", s, gpuUUIDPrefix, ErrInvalidNodeMetrics)
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return fmt.Errorf("%q: byte %d is not a letter, digit or dash: %w", s, len(gpuUUIDPrefix)+i,
				ErrInvalidNodeMetrics)
		}
	}
	return nil
}

func (a *GPUAllocation) validate() error {
	if a.Pods == nil {
		return fmt.Errorf("pods: missing (empty list for none): %w", ErrInvalidNodeMetrics)
	}
	if len(a.Pods) > maxGPUAllocPods {
		return fmt.Errorf("pods: %d exceed %d: %w", len(a.Pods), maxGPUAllocPods, ErrInvalidNodeMetrics)
	}
	type key struct{ ns, name string }
	seen := make(map[key]bool, len(a.Pods))
	for i, p := range a.Pods {
		for _, f := range []struct {
			name, v  string
			max      int
			required bool
		}{
			{"ns", p.Namespace, maxPodNamespace, true}, {"name", p.Name, maxPodName, true},
			{"uid", p.UID, maxPodUID, false},
		} {
			if err := printable(f.v, f.max, f.required); err != nil {
				return fmt.Errorf("pods[%d].%s: %w", i, f.name, err)
			}
		}
		k := key{p.Namespace, p.Name}
		if seen[k] {
			return fmt.Errorf("pods[%d]: %s/%s twice: %w", i, p.Namespace, p.Name, ErrInvalidNodeMetrics)
		}
		seen[k] = true
		if len(p.Devices) == 0 || len(p.Devices) > MaxGPUsPerNode {
			return fmt.Errorf("pods[%d].devs: %d devices, want 1..%d: %w", i, len(p.Devices), MaxGPUsPerNode,
				ErrInvalidNodeMetrics)
		}
		var devs uint64
		for _, d := range p.Devices {
			if err := validIndex(d); err != nil {
				return fmt.Errorf("pods[%d].devs: %w", i, err)
			}
			if devs&(1<<uint(d)) != 0 {
				return fmt.Errorf("pods[%d].devs: %d twice: %w", i, d, ErrInvalidNodeMetrics)
			}
			devs |= 1 << uint(d)
		}
	}
	return nil
}

func validIndex(i int) error {
	if i < 0 || i >= MaxGPUsPerNode {
		return fmt.Errorf("%d out of 0..%d: %w", i, MaxGPUsPerNode-1, ErrInvalidNodeMetrics)
	}
	return nil
}

// printable checks s is at most max bytes of printable ASCII other than space and
// comma (UUIDs are joined with commas into NVIDIA_VISIBLE_DEVICES), and not empty when
// required.
func printable(s string, max int, required bool) error {
	switch {
	case s == "" && required:
		return fmt.Errorf("empty: %w", ErrInvalidNodeMetrics)
	case len(s) > max:
		return fmt.Errorf("%d bytes exceed %d: %w", len(s), max, ErrInvalidNodeMetrics)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == ',' {
			return fmt.Errorf("%q: byte %d is not printable ASCII (or is a comma): %w", s, i, ErrInvalidNodeMetrics)
		}
	}
	return nil
}

func (b *BatchResources) cpu() int64 {
	if b == nil {
		return 0
	}
	return b.CPU
}

func (b *BatchResources) mem() int64 {
	if b == nil {
		return 0
	}
	return b.Memory
}

func maxBytes(version int) int {
	if version == NodeMetricsVersion {
		return maxNodeMetricsBytes
	}
	return maxNodeMetricsV2Bytes
}

// DecodeNodeMetrics parses and validates one annotation value: a version-1 or a
// version-2 document (16 KiB and 64 KiB at most). A "gpu" field in a version-1
// document is ignored, as readers of version 1 always ignored unknown fields.
func DecodeNodeMetrics(s string) (NodeMetrics, error) {
	var m NodeMetrics
	if len(s) > maxNodeMetricsV2Bytes {
		return m, fmt.Errorf("%d bytes exceeds %d: %w", len(s), maxNodeMetricsV2Bytes, ErrInvalidNodeMetrics)
	}
	var probe struct {
		Version int `json:"v"`
	}
	if err := json.Unmarshal([]byte(s), &probe); err != nil {
		return m, fmt.Errorf("json: %v: %w", err, ErrInvalidNodeMetrics)
	}
	if probe.Version != NodeMetricsVersion && probe.Version != NodeMetricsVersion2 {
		return m, fmt.Errorf("version %d: %w", probe.Version, ErrUnsupportedVersion)
	}
	if limit := maxBytes(probe.Version); len(s) > limit {
		return m, fmt.Errorf("%d bytes exceeds %d: %w", len(s), limit, ErrInvalidNodeMetrics)
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return NodeMetrics{}, fmt.Errorf("json: %v: %w", err, ErrInvalidNodeMetrics)
	}
	if m.Version == NodeMetricsVersion {
		m.GPU = nil
	}
	if err := m.Validate(); err != nil {
		return NodeMetrics{}, err
	}
	return m, nil
}

// DecodeNodeAnnotations returns the node metrics of a Node from its annotations: the
// version-2 document when it decodes, else the version-1 one. Version tells which one
// came back; a version-1 result (or a nil GPU) means the GPU figures are unknown.
//
// When both decode and the version-1 document is the newer one, it wins: an agent
// rolled back to a build that writes only version 1 leaves its last version-2 value
// behind, going stale. A version-2 document that does not decode is skipped in favour
// of a good version-1 one, silently; call DecodeNodeMetrics on it to learn why. The
// error is ErrNoNodeMetrics without either annotation, else the decoding errors of
// both (wrapping ErrInvalidNodeMetrics or ErrUnsupportedVersion).
func DecodeNodeAnnotations(annotations map[string]string) (NodeMetrics, error) {
	s1, ok1 := annotations[AnnotationNodeMetrics]
	s2, ok2 := annotations[AnnotationNodeMetricsV2]
	if !ok1 && !ok2 {
		return NodeMetrics{}, ErrNoNodeMetrics
	}
	var (
		m1, m2     NodeMetrics
		err1, err2 error
	)
	if ok1 {
		if m1, err1 = DecodeNodeMetrics(s1); err1 == nil && m1.Version != NodeMetricsVersion {
			// A reader built before version 2 would refuse it: a writer error.
			m1, err1 = NodeMetrics{}, fmt.Errorf("version %d in %s: %w", m1.Version, AnnotationNodeMetrics,
				ErrUnsupportedVersion)
		}
		err1 = annotationErr(AnnotationNodeMetrics, err1)
	}
	if ok2 {
		if m2, err2 = DecodeNodeMetrics(s2); err2 == nil && m2.Version != NodeMetricsVersion2 {
			m2, err2 = NodeMetrics{}, fmt.Errorf("version %d in %s: %w", m2.Version, AnnotationNodeMetricsV2,
				ErrUnsupportedVersion)
		}
		err2 = annotationErr(AnnotationNodeMetricsV2, err2)
	}
	good1, good2 := ok1 && err1 == nil, ok2 && err2 == nil
	switch {
	case good2 && good1 && m1.Timestamp.After(m2.Timestamp):
		return m1, nil
	case good2:
		return m2, nil
	case good1:
		return m1, nil
	}
	return NodeMetrics{}, errors.Join(err2, err1)
}

func annotationErr(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Age is how old m is at now. A timestamp in the future counts as age 0.
func (m NodeMetrics) Age(now time.Time) time.Duration {
	if d := now.Sub(m.Timestamp); d > 0 {
		return d
	}
	return 0
}

// DefaultMetricsMaxAge and DefaultMetricsMaxSkew are the readers' default bounds for
// Fresh: the scheduler extender's and the Kueue quota follower's -metrics-max-age and
// -metrics-max-skew, equal so that both see the same nodes as live. An agent rewrites an
// unchanged document every nodeMetricsReport.maxInterval (2 min by default).
const (
	DefaultMetricsMaxAge  = 5 * time.Minute
	DefaultMetricsMaxSkew = 10 * time.Second
)

// Fresh reports whether m is usable at now: no older than maxAge, and stamped at most
// maxSkew in the future. A timestamp further ahead (a node clock ahead of the reader's,
// or a forged or corrupted value, say a year ahead) would otherwise read as fresh for
// as long as it stays ahead: such a document is unknown, never current. A negative
// maxSkew counts as 0.
func (m NodeMetrics) Fresh(now time.Time, maxAge, maxSkew time.Duration) bool {
	return m.Timestamp.Sub(now) <= max(maxSkew, 0) && m.Age(now) <= maxAge
}
