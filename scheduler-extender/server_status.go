package extender

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/placement"
)

// Status is the JSON served at /status.
type Status struct {
	Time   time.Time `json:"time"`
	Policy string    `json:"policy"`
	// WorkloadClasses is how many request classes the policy's target workload
	// keeps (0 before the first refresh, or for random and bestfit's empty one).
	WorkloadClasses int  `json:"workloadClasses"`
	Synced          bool `json:"synced"`
	// Informers is each informer's contact with the API server (staleness).
	Informers []InformerStatus `json:"informers"`
	// BindsRefused says why binds are refused now: an informer binds depend on
	// (nodes, pods) has been stale beyond Config.MaxCacheStaleness.
	BindsRefused string         `json:"bindsRefused,omitempty"`
	Nodes        []NodeStatus   `json:"nodes"`
	AssumedPods  []PodStatus    `json:"assumedPods"`
	Gangs        []GangStatus   `json:"gangs"`
	Counts       map[string]int `json:"podsByPhase"`
}

// NodeStatus is one node in /status.
type NodeStatus struct {
	Name           string      `json:"name"`
	Model          string      `json:"model,omitempty"`
	CPUMilli       int64       `json:"cpuMilli"`
	UsedCPUMilli   int64       `json:"usedCpuMilli"`
	MemoryMiB      int64       `json:"memoryMiB"`
	UsedMemoryMiB  int64       `json:"usedMemoryMiB"`
	Pods           int         `json:"pods"`
	GPUs           []GPUStatus `json:"gpus,omitempty"`
	MetricsFresh   bool        `json:"metricsFresh"`
	MetricsProblem string      `json:"metricsProblem,omitempty"`
	Learned        bool        `json:"learnedFromArgs,omitempty"`
}

// GPUStatus is one device's allocation.
type GPUStatus struct {
	Index          int      `json:"index"`
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
	Gang       string     `json:"gang"`
	Dialect    string     `json:"dialect"`
	State      string     `json:"state"`
	MinMember  int        `json:"minMember"`
	Members    int        `json:"members"`
	Bound      int        `json:"bound"`
	Reason     string     `json:"reason,omitempty"`
	Plan       []string   `json:"plan,omitempty"` // pod→node
	AtBind     int        `json:"atBind,omitempty"`
	PlanExpiry *time.Time `json:"planExpires,omitempty"`
}

// Status snapshots the index.
func (s *Server) Status() Status {
	st := s.state
	st.mu.RLock()
	defer st.mu.RUnlock()
	out := Status{Time: s.now(), Policy: st.policy.Name(), Synced: s.synced.Load(),
		WorkloadClasses: st.workload.Len(),
		Informers:       st.contact.status(), Counts: map[string]int{},
		Nodes: make([]NodeStatus, 0, len(st.nodes)), AssumedPods: []PodStatus{}, Gangs: []GangStatus{}}
	if err := st.staleForBind(); err != nil {
		out.BindsRefused = err.Error()
	}
	for _, e := range st.nodes {
		n := e.n
		ns := NodeStatus{Name: n.Name, Model: n.Model, CPUMilli: n.CPUMilli, UsedCPUMilli: n.UsedCPUMilli,
			MemoryMiB: n.MemoryMiB, UsedMemoryMiB: n.UsedMemoryMiB, Pods: n.Pods,
			MetricsFresh: n.Usage != nil, MetricsProblem: e.metricsErr, Learned: e.learned}
		if n.Usage == nil && ns.MetricsProblem == "" {
			ns.MetricsProblem = "older than the metrics max age"
			if e.metrics != nil && e.metrics.Timestamp.After(out.Time) {
				ns.MetricsProblem = "stamped in the future beyond the metrics max skew"
			}
		}
		for i, f := range n.GPUFree {
			ns.GPUs = append(ns.GPUs, GPUStatus{Index: i, AllocatedMilli: placement.MilliPerGPU - f})
		}
		for _, p := range e.pods {
			for _, d := range p.devices {
				if d >= 0 && d < len(ns.GPUs) {
					ns.GPUs[d].Pods = append(ns.GPUs[d].Pods, p.key())
				}
			}
		}
		for i := range ns.GPUs {
			slices.Sort(ns.GPUs[i].Pods)
		}
		out.Nodes = append(out.Nodes, ns)
	}
	slices.SortFunc(out.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range st.pods {
		out.Counts[p.phase.String()]++
		if p.phase == phasePending || p.phase == phaseBound {
			continue
		}
		ps := PodStatus{Pod: p.key(), Phase: p.phase.String(), Node: p.node, Devices: p.devices, Inferred: p.inferred}
		if p.phase == phaseReserved {
			t := p.expires
			ps.Expires = &t
		}
		if p.hasGang {
			ps.Gang = p.gang.key
		}
		out.AssumedPods = append(out.AssumedPods, ps)
	}
	slices.SortFunc(out.AssumedPods, func(a, b PodStatus) int { return strings.Compare(a.Pod, b.Pod) })
	for _, g := range st.gangs.byKey {
		gs := GangStatus{Gang: g.key, Dialect: g.dialect, State: g.state, MinMember: g.min,
			Members: len(g.members), Bound: g.bound(), Reason: g.reason}
		if pl := g.plan; pl != nil {
			for uid := range pl.members {
				if m := st.pods[uid]; m != nil {
					gs.Plan = append(gs.Plan, m.name+"→"+m.node)
				}
			}
			slices.Sort(gs.Plan)
			gs.AtBind = pl.arrived
			t := pl.expires
			gs.PlanExpiry = &t
		}
		out.Gangs = append(out.Gangs, gs)
	}
	slices.SortFunc(out.Gangs, func(a, b GangStatus) int { return cmp.Compare(a.Gang, b.Gang) })
	return out
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	body, err := json.Marshal(s.Status())
	if err != nil {
		http.Error(w, "encoding status: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// snapshotMetrics is the index's metrics.ExtenderSnapshot (gauges at scrape time).
func snapshotMetrics(s *State) metrics.ExtenderSnapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := metrics.ExtenderSnapshot{Nodes: len(s.nodes), Pods: map[string]int{}, Gangs: map[string]int{},
		CacheStaleness: s.contact.Staleness()}
	for _, e := range s.nodes {
		out.GPUs += len(e.n.GPUFree)
		for _, f := range e.n.GPUFree {
			out.GPUMilliCapacity += placement.MilliPerGPU
			out.GPUMilliAllocated += int64(placement.MilliPerGPU - f)
		}
		if e.n.Usage == nil {
			out.StaleNodeMetrics++
		}
	}
	for _, p := range s.pods {
		out.Pods[p.phase.String()]++
	}
	for _, g := range s.gangs.byKey {
		out.Gangs[g.state]++
	}
	return out
}
