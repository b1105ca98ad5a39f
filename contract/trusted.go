package contract

// Keys that a component writes and later trusts: an annotation or label that one of
// Understory's identities writes and that a component reads back to decide something
// (place a pod, give it devices, resume a plan, reactivate a Workload). A tenant who
// could write such a key could decide for the component, so each is fenced in the API
// server and each reader bounds what it honours. TrustedKeys lists them all; a test
// (TestTrustedKeysFencedByPolicy, test/e2e) holds the list to the shipped policies, and
// TestSystemAnnotationsFenced proves each pod annotation's fence on a real API server.
//
// Not listed, because no component writes them: the class keys (understory.io/qos-class
// and Koordinator's koordinator.sh/qosClass, the tenant's own choice, bounded by the
// rules qos-class-value and qos-class-immutable), the gang keys of Volcano, Koordinator
// and scheduler-plugins (names.go: the tenant's, bounded by the rule gang-min-member and
// MaxGangSize), and the operator's ClusterQueue keys understory.io/quota-follower and
// understory.io/quota-weight (cluster-scoped objects tenants cannot write). Understory
// writes no Koordinator or Volcano key.

// Identities that write trusted keys, as request.userInfo.username: the service
// accounts of manifests/ (namespace understory-system). The policies name them
// literally; renaming one needs the same change there.
const (
	// UserSchedulerExtender is the scheduler extender's service account.
	UserSchedulerExtender = "system:serviceaccount:understory-system:understory-scheduler-extender"
	// UserAgent is the node agent's service account.
	UserAgent = "system:serviceaccount:understory-system:understory-koordlet"
	// UserQuotaFollower is the Kueue quota follower's service account.
	UserQuotaFollower = "system:serviceaccount:understory-system:understory-kueue-quota"
)

// Trusted keys not declared elsewhere in the contract.
const (
	// AnnotationGangState is the extender's record of a committed gang plan on each
	// member pod (a pod patch); it resumes the plan from it after a restart. The patch
	// also makes kube-scheduler requeue the member (a pod update moves a pod out of the
	// unschedulable queue), and shows people the plan (the kubectl plugin prints it).
	AnnotationGangState = "understory.io/gang-state"
	// AnnotationExtenderCatchUp is a new extender leader's catch-up barrier, written on
	// its own replica's pod.
	AnnotationExtenderCatchUp = "understory.io/extender-catch-up"
	// LabelQuotaEvicted marks a Workload the quota follower deactivated, so that it
	// reactivates exactly those.
	LabelQuotaEvicted = "understory.io/quota-evicted"
)

// TrustedKind is the object and field a trusted key lives in.
type TrustedKind string

// Trusted key kinds.
const (
	KindPodAnnotation  TrustedKind = "pod annotation"
	KindNodeAnnotation TrustedKind = "node annotation"
	KindWorkloadLabel  TrustedKind = "Workload label"
)

// Fence is how the API server keeps everyone but the writers off a key.
type Fence string

// Fences.
const (
	// FenceWriters: a fail-closed ValidatingAdmissionPolicy refuses every requester but
	// the writers a CREATE that carries the key and an UPDATE that adds, changes or
	// removes it.
	FenceWriters Fence = "writers"
	// FenceImmutable: the key is written by the mutating admission webhook inside the
	// object's own CREATE, where no requester identity tells the webhook's value from
	// the tenant's; a fail-closed policy refuses every UPDATE that adds, changes or
	// removes it, and no component decides anything on it.
	FenceImmutable Fence = "immutable"
	// FenceRBAC: tenants hold no write right on the object kind at all (Nodes); a
	// fail-closed policy keeps the writers to their own objects and keys.
	FenceRBAC Fence = "rbac"
)

// TrustedKey is one key a component writes and later trusts.
type TrustedKey struct {
	Key  string
	Kind TrustedKind
	// Writers may write the key (request.userInfo.username); empty for FenceImmutable.
	Writers []string
	// WrittenBy says, in words, which component writes it and how.
	WrittenBy string
	Fence     Fence
	// Policy is the ValidatingAdmissionPolicy that fences it, Rule the rule its
	// refusals name.
	Policy, Rule string
	// Reader says who reads the key and the bound it applies to what it honours.
	Reader string
}

// TrustedKeys returns every key a component writes and later trusts. A function, not
// a package variable, so there is no package-level mutable state.
func TrustedKeys() []TrustedKey {
	return []TrustedKey{
		{
			Key: AnnotationGPUDevices, Kind: KindPodAnnotation, Writers: []string{UserSchedulerExtender},
			WrittenBy: "the scheduler extender, in the Binding it creates (kube-apiserver copies it onto the pod)",
			Fence:     FenceWriters, Policy: "understory-pod-rules", Rule: "gpu-devices-writer",
			Reader: "the agent's NRI plugin gives the container exactly these devices and the extender books " +
				"them; both parse with ParseGPUDevices (distinct indices below MaxGPUsPerNode). A Binding " +
				"carrying it is fenced too (policy understory-gpu-devices-binding, same rule)",
		},
		{
			Key: AnnotationGangState, Kind: KindPodAnnotation, Writers: []string{UserSchedulerExtender},
			WrittenBy: "the scheduler extender, by pod patch, on each member of a committed gang plan",
			Fence:     FenceWriters, Policy: "understory-pod-rules", Rule: "gang-state-writer",
			Reader: "the extender resumes the plan after a restart, only for a complete gang whose record expires " +
				"at most the gang's plan TTL (+5 s of clock skew) from now, clamped to now + TTL, with an id not " +
				"in the future and one device per GPU each member requests, on a node the index knows",
		},
		{
			Key: AnnotationExtenderCatchUp, Kind: KindPodAnnotation, Writers: []string{UserSchedulerExtender},
			WrittenBy: "a new extender leader, by pod patch, on its own replica's pod only",
			Fence:     FenceWriters, Policy: "understory-pod-rules", Rule: "extender-catch-up-writer",
			Reader: "the extender, on its own pod only: it waits until its informer delivers its own write; " +
				"the value is never parsed",
		},
		{
			Key: AnnotationOriginalResources, Kind: KindPodAnnotation,
			WrittenBy: "the admission webhook's mutation, inside the pod's own CREATE",
			Fence:     FenceImmutable, Policy: "understory-pod-rules", Rule: "original-resources-immutable",
			Reader: "no component decides on it (a record for people); the webhook reads an existing value " +
				"only on reinvocation, to keep the originals of kinds it does not move again, and denies a " +
				"malformed one",
		},
		{
			Key: AnnotationNodeMetrics, Kind: KindNodeAnnotation, Writers: []string{UserAgent},
			WrittenBy: "the node agent, on its own Node (the node-name claim of its token)",
			Fence:     FenceRBAC, Policy: "understory-koordlet-node", Rule: "koordlet-own-fields",
			Reader: "the extender: DecodeNodeMetrics rejects unknown versions; a stale, future-stamped or " +
				"undecodable document is unknown, never idle",
		},
		{
			Key: AnnotationNodeMetricsV2, Kind: KindNodeAnnotation, Writers: []string{UserAgent},
			WrittenBy: "the node agent, on its own Node, in the same patch as version 1",
			Fence:     FenceRBAC, Policy: "understory-koordlet-node", Rule: "koordlet-own-fields",
			Reader: "the extender, as version 1, plus GPU UUIDs of NVML's shape and at most MaxGPUsPerNode GPUs",
		},
		{
			Key: LabelQuotaEvicted, Kind: KindWorkloadLabel, Writers: []string{UserQuotaFollower},
			WrittenBy: "the Kueue quota follower, with spec.active=false, on a Workload it deactivates",
			Fence:     FenceWriters, Policy: "understory-kueue-quota-workloads", Rule: "quota-evicted-writer",
			Reader: "the quota follower reactivates only Workloads carrying it with the value true, once Kueue " +
				"holds no quota reservation for them (Kueue's own admission then decides); it removes the label " +
				"as it reactivates",
		},
	}
}
