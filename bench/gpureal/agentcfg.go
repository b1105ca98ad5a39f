package gpureal

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/qos"
)

// MPS settings of the run (-mps).
const (
	// mpsRun: the freeze section writes gpu.mps.mode disabled; the MPS section runs with
	// gpu.mps.mode run.
	mpsRun = "run"
	// mpsOff: gpu.mps.mode disabled, no MPS section (a GPU without MPS, or a quick run).
	mpsOff = "off"
	// mpsNone: no gpu.mps block at all and no MPS section (an agent without MPS support).
	mpsNone = "none"
)

// mpsClientUID is gpu.mps.clientUID (the agent's default) and the user the MPS
// section's stand-ins run as.
const mpsClientUID = 1000

// agentConfigSpec is what the driver chooses of the agent's configuration.
type agentConfigSpec struct {
	CgroupRoot  string
	KubeletRoot string
	Manifests   string
	Listen      string
	NRISocket   string
	// MPSMode is gpu.mps.mode: "disabled", "run"; "" leaves the block out.
	MPSMode string
	MPSPipe string
	MPSLog  string
	// MPSShm is gpu.mps.shmDirectory: the daemon's servers' and the clients' /dev/shm.
	MPSShm string
	// MPSClientUID is gpu.mps.clientUID: the MPS section's stand-ins' user (never root:
	// root is no MPS client).
	MPSClientUID int
	// Extra is merged over the rendered config, key by key at the top level and one
	// level down (the dry-run test turns the agent's CPU freeze off: a shared 2-core
	// machine starves batch's CPU budget for reasons that are not the GPU's).
	Extra map[string]map[string]any
}

// renderAgentConfig is the agent's YAML configuration (config.Load's format, koordlet/config):
// no cluster, kubelet's cgroupfs layout below the run's own kubelet root, NRI on the
// socket the driver hosts, GPU devices as NVIDIA_VISIBLE_DEVICES (the stand-ins are
// host processes, not containers: CDI devices could not be applied), MPS per section.
func renderAgentConfig(s agentConfigSpec) ([]byte, error) {
	gpu := map[string]any{
		"mode":    "auto",
		"devices": map[string]any{"mode": "env"},
	}
	if s.MPSMode != "" {
		gpu["mps"] = map[string]any{
			"mode":          s.MPSMode,
			"pipeDirectory": s.MPSPipe,
			"logDirectory":  s.MPSLog,
			"shmDirectory":  s.MPSShm,
			"controlBinary": "nvidia-cuda-mps-control",
			"clientUID":     s.MPSClientUID,
		}
	}
	cfg := map[string]any{
		"cgroupRoot":        s.CgroupRoot,
		"procRoot":          "/proc",
		"cgroupDriver":      "cgroupfs",
		"kubeletCgroupRoot": s.KubeletRoot,
		"staticPodDir":      s.Manifests,
		"listenAddress":     s.Listen,
		"nri":               map[string]any{"enabled": true, "socket": s.NRISocket},
		"gpu":               gpu,
	}
	for k, fields := range s.Extra {
		m, ok := cfg[k].(map[string]any)
		if !ok {
			m = map[string]any{}
			cfg[k] = m
		}
		for f, v := range fields {
			m[f] = v
		}
	}
	return yaml.Marshal(cfg)
}

// podSpec is one bench pod.
type podSpec struct {
	Name string
	UID  types.UID
	// Class is the Understory class (LS or batch).
	Class qos.Class
	// GPUMilli is the container's understory.io/gpu-milli; 0: no shared-GPU request
	// (and no device annotation).
	GPUMilli int
	// CPURequest is the container's CPU request in millicores (0: none, BestEffort).
	CPURequestMilli int
}

// benchNamespace is the namespace of the bench's pods.
const benchNamespace = "gpureal"

// containerName is the one container of every bench pod.
const containerName = "main"

// pod builds the Kubernetes pod of s: a static pod manifest for the agent, and what the
// runtime's sandbox carries.
func (s podSpec) pod() *corev1.Pod {
	ann := map[string]string{contract.AnnotationQOSClass: string(s.Class)}
	res := corev1.ResourceRequirements{}
	if s.CPURequestMilli > 0 {
		res.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(s.CPURequestMilli),
			resource.DecimalSI)}
	}
	if s.GPUMilli > 0 {
		ann[contract.AnnotationGPUDevices] = contract.FormatGPUDevices([]int{0})
		res.Limits = corev1.ResourceList{contract.ResourceGPUMilli: resource.MustParse(strconv.Itoa(s.GPUMilli))}
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: benchNamespace, UID: s.UID, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: containerName, Image: "understory/gpureal-standin", Resources: res,
		}}},
	}
}

// renderManifest is s's static pod manifest.
func renderManifest(s podSpec) ([]byte, error) {
	if s.UID == "" || s.Name == "" {
		return nil, fmt.Errorf("pod %q: name and uid are required", s.Name)
	}
	return yaml.Marshal(s.pod())
}
