package wire

import "time"

// Status is the JSON served at /status.
type Status struct {
	Time   time.Time `json:"time"`
	Policy string    `json:"policy"`
	// WorkloadClasses is how many request classes the policy's target workload
	// keeps (0 before the first refresh, or for random and bestfit's empty one).
	WorkloadClasses int  `json:"workloadClasses"`
	Synced          bool `json:"synced"`
	// Leader is the replica holding the leader lease as last observed, and
	// Leading whether this replica leads and serves; LeaderElection is false
	// when it runs without election (one replica: it always serves).
	LeaderElection bool   `json:"leaderElection"`
	Leader         string `json:"leader,omitempty"`
	Leading        bool   `json:"leading"`
	// LeaderCatchUpSeconds is how long this replica, when it last took the
	// lease, caught up with the API before it served.
	LeaderCatchUpSeconds float64 `json:"leaderCatchUpSeconds,omitempty"`
	// LeaderCatchUpBy is how: "barrier" (its own pod's annotation, delivered
	// by its informer) or "list" (every bound pod listed).
	LeaderCatchUpBy string `json:"leaderCatchUpBy,omitempty"`
	// Refused says why filter, prioritize and bind are refused (not synced,
	// standby, lease lost); empty while served.
	Refused string `json:"refused,omitempty"`
	// Informers is each informer's contact with the API server (staleness).
	Informers []InformerStatus `json:"informers"`
	// BindsRefused says why binds are refused now: an informer binds depend on
	// (nodes, pods) has been stale beyond the extender's MaxCacheStaleness.
	BindsRefused string         `json:"bindsRefused,omitempty"`
	Nodes        []NodeStatus   `json:"nodes"`
	AssumedPods  []PodStatus    `json:"assumedPods"`
	Gangs        []GangStatus   `json:"gangs"`
	Counts       map[string]int `json:"podsByPhase"`
}

// NodeStatus is one node in /status.
type NodeStatus struct {
	Name          string      `json:"name"`
	Model         string      `json:"model,omitempty"`
	CPUMilli      int64       `json:"cpuMilli"`
	UsedCPUMilli  int64       `json:"usedCpuMilli"`
	MemoryMiB     int64       `json:"memoryMiB"`
	UsedMemoryMiB int64       `json:"usedMemoryMiB"`
	Pods          int         `json:"pods"`
	GPUs          []GPUStatus `json:"gpus,omitempty"`
	// GPUSource is where the GPU slots come from: "agent" (the node agent's
	// node-metrics GPU list: physical GPUs by NVML index, UUID and health) or
	// "allocatable" (no agent GPU list: allocatable nvidia.com/gpu divided by the
	// device plugin's nvidia.com/gpu.replicas, indices assumed).
	GPUSource      string `json:"gpuSource,omitempty"`
	MetricsFresh   bool   `json:"metricsFresh"`
	MetricsProblem string `json:"metricsProblem,omitempty"`
	Learned        bool   `json:"learnedFromArgs,omitempty"`
}

// GPUStatus is one device's allocation.
type GPUStatus struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
	// Unavailable: the agent reports the GPU unhealthy, or does not list its
	// index; it takes no new booking (capacity 0), pods already there stay.
	Unavailable    bool     `json:"unavailable,omitempty"`
	AllocatedMilli int      `json:"allocatedMilli"`
	Pods           []string `json:"pods,omitempty"`
}

// PodStatus is a pod the extender holds capacity for without the informer having confirmed it.
type PodStatus struct {
	Pod      string     `json:"pod"`
	Phase    string     `json:"phase"`
	Node     string     `json:"node"`
	Devices  []int      `json:"devices,omitempty"`
	Expires  *time.Time `json:"expires,omitempty"`
	Gang     string     `json:"gang,omitempty"`
	Inferred bool       `json:"devicesInferred,omitempty"`
}

// GangStatus is one gang.
type GangStatus struct {
	Gang      string   `json:"gang"`
	Dialect   string   `json:"dialect"`
	State     string   `json:"state"`
	MinMember int      `json:"minMember"`
	Members   int      `json:"members"`
	Bound     int      `json:"bound"`
	Reason    string   `json:"reason,omitempty"`
	Plan      []string `json:"plan,omitempty"` // pod→node
	AtBind    int      `json:"atBind,omitempty"`
	// Recorded counts the plan's members whose pod, as the informer last saw
	// it, carries this plan's gang-state record: a restart resumes the plan
	// only once every member still needed is recorded.
	Recorded   int        `json:"recorded,omitempty"`
	PlanExpiry *time.Time `json:"planExpires,omitempty"`
}

// InformerStatus is one informer in /status.
type InformerStatus struct {
	Name string `json:"name"`
	// Watching: a watch stream is open, the cache is current.
	Watching bool `json:"watching"`
	// LastContact is the last successful list, event or end of a stream.
	LastContact *time.Time `json:"lastContact,omitempty"`
	// StalenessSeconds is 0 while watching, else the time since LastContact.
	StalenessSeconds float64 `json:"stalenessSeconds"`
}
