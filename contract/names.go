package contract

// Resource names, annotations and labels that cross a binary boundary: one binary writes
// them, another (or kube-scheduler, or a user) reads them. Each is declared here once.
const (
	// ResourceBatchCPU is reclaimable batch CPU in millicores (1 = one millicore). The
	// node agent publishes it on its Node; the admission webhook moves an opted-in pod's
	// cpu requests and limits onto it; kube-scheduler and the extender count batch pods
	// against it; the agent enforces a batch pod's limit of it.
	ResourceBatchCPU = "understory.io/batch-cpu"
	// ResourceBatchMemory is reclaimable batch memory in bytes, like ResourceBatchCPU.
	ResourceBatchMemory = "understory.io/batch-memory"
	// ResourceKoordinatorBatchCPU and ResourceKoordinatorBatchMemory are Koordinator's
	// names for the same resources, in the same units (millicores, bytes): aliases that
	// pods written for Koordinator ask for. The admission webhook renames them to
	// ResourceBatchCPU and ResourceBatchMemory; the agent and the extender read them
	// where a pod still has them (BatchResourceName). Nodes publish only Understory's
	// names.
	ResourceKoordinatorBatchCPU    = "kubernetes.io/batch-cpu"
	ResourceKoordinatorBatchMemory = "kubernetes.io/batch-memory"
	// ResourceGPUMilli is a share of one GPU, 1..MilliPerGPU: the agent publishes it on
	// GPU nodes, the extender places it and writes AnnotationGPUDevices, the agent's NRI
	// plugin gives the container those devices.
	ResourceGPUMilli = "understory.io/gpu-milli"
	// ResourceGPU is a whole GPU, allocated by NVIDIA's device plugin.
	ResourceGPU = "nvidia.com/gpu"
	// AnnotationGPUDevices holds the device indices the extender bound a gpu-milli pod
	// to (FormatGPUDevices; read with ParseGPUDevices). Only the extender's identity may
	// set or change it (the admission rules).
	AnnotationGPUDevices = "understory.io/gpu-devices"
	// AnnotationOriginalResources holds, as JSON, the cpu and memory requests and limits
	// a batch pod's containers had before the admission webhook moved them to the batch
	// resources (package admission).
	AnnotationOriginalResources = "understory.io/original-resources"
	// AnnotationQOSClass is a pod's class (LS, BE or batch), written by users or the
	// admission webhook and read by the agent (qos.Classify).
	AnnotationQOSClass = "understory.io/qos-class"
	// ConditionBatchSlowed is the type of the pod condition the node agent writes on a
	// batch pod it holds back (True, reason Throttled, Frozen, Suspended or Evicted) or
	// lets run free again (False, reason Running); package qos decides it. The kubectl
	// plugin reads it to say why a batch pod is slow, and so do people (kubectl
	// describe pod). A Kubernetes corev1.PodConditionType; untyped here, as the contract
	// imports no Kubernetes package.
	ConditionBatchSlowed = "understory.io/BatchSlowed"
)

// Gang membership keys of the three gang dialects Understory understands. Tenants (or
// their job controllers) write them on their pods; Understory writes none of them. The
// scheduler extender reads them to find a pod's gang and its minimum, the admission
// webhook bounds the minimum (rule gang-min-member: 1..MaxGangSize), and the kubectl
// plugin reads them to explain a pending gang member.
const (
	// LabelPodGroup names the scheduler-plugins (coscheduling) PodGroup of a pod;
	// minMember and scheduleTimeoutSeconds come from the PodGroup object.
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// AnnotationVolcanoGroupName and AnnotationVolcanoGroupNameAlt each name a Volcano
	// group; the extender reads the first before the second.
	AnnotationVolcanoGroupName    = "scheduling.k8s.io/group-name"
	AnnotationVolcanoGroupNameAlt = "scheduling.volcano.sh/group-name"
	// AnnotationVolcanoMinMember is a Volcano group's minimum member count, a decimal
	// integer in 1..MaxGangSize.
	AnnotationVolcanoMinMember = "scheduling.volcano.sh/group-min-member"
	// AnnotationKoordinatorName and AnnotationKoordinatorMinAvailable are Koordinator's
	// lightweight gang protocol: the gang's name and its minimum member count (a decimal
	// integer in 1..MaxGangSize).
	AnnotationKoordinatorName         = "gang.scheduling.koordinator.sh/name"
	AnnotationKoordinatorMinAvailable = "gang.scheduling.koordinator.sh/min-available"
)

// MaxGangSize bounds a gang's minimum member count: the admission webhook refuses a
// larger AnnotationVolcanoMinMember or AnnotationKoordinatorMinAvailable (and its
// ValidatingAdmissionPolicy names the same number), the extender treats a larger one,
// or a larger PodGroup minMember, as an invalid gang.
const MaxGangSize = 10000

// BatchResourceName returns the batch resource a resource name stands for: name itself
// for ResourceBatchCPU and ResourceBatchMemory, Understory's name for Koordinator's
// aliases; ok is false for any other name.
func BatchResourceName(name string) (canonical string, ok bool) {
	switch name {
	case ResourceBatchCPU, ResourceKoordinatorBatchCPU:
		return ResourceBatchCPU, true
	case ResourceBatchMemory, ResourceKoordinatorBatchMemory:
		return ResourceBatchMemory, true
	}
	return "", false
}

// KoordinatorAlias returns Koordinator's alias of a batch resource name ("" for any
// other name).
func KoordinatorAlias(name string) string {
	switch name {
	case ResourceBatchCPU:
		return ResourceKoordinatorBatchCPU
	case ResourceBatchMemory:
		return ResourceKoordinatorBatchMemory
	}
	return ""
}
