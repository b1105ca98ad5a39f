package extender

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/understory/understory/metrics"
	"github.com/understory/understory/scheduler-extender/wire"
)

// The /status document's types (package wire).
type (
	Status     = wire.Status
	NodeStatus = wire.NodeStatus
	GangStatus = wire.GangStatus
)

// Status snapshots the index, the gangs and the informers' contact.
func (s *Server) Status() Status {
	st := s.state
	out := Status{Time: s.now(), Synced: s.feed == nil || s.feed.synced.Load(), Informers: s.contact.status(),
		LeaderElection: s.lead != nil, Leading: s.lead.serving()}
	if s.lead != nil {
		out.Leader = s.lead.holder()
		out.LeaderCatchUpSeconds = time.Duration(s.lead.catchUp.Load()).Seconds()
		if by := s.lead.catchUpBy.Load(); by != nil {
			out.LeaderCatchUpBy = *by
		}
	}
	if err := refusal(s); err != nil {
		out.Refused = err.Error()
	}
	if err := s.contact.staleForBind(s.cfg.MaxCacheStaleness); err != nil {
		out.BindsRefused = err.Error()
	}
	st.rlock()
	defer st.runlock()
	st.status(&out)
	out.Gangs = s.gangs.Status()
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

// snapshotMetrics is the server's metrics.ExtenderSnapshot (gauges at scrape time).
func snapshotMetrics(s *Server) metrics.ExtenderSnapshot {
	st := s.state
	st.rlock()
	defer st.runlock()
	out := st.snapshot()
	out.Gangs = map[string]int{}
	s.gangs.CountStates(out.Gangs)
	out.CacheStaleness = s.contact.Staleness()
	return out
}

// status fills out's policy, nodes, held pods and pod counts. Call with mu held
// (read suffices).
func (s *State) status(out *Status) {
	out.Policy, out.WorkloadClasses = s.sc.policy.Name(), s.sc.workload.Len()
	out.Counts = map[string]int{}
	out.Nodes, out.AssumedPods = make([]NodeStatus, 0, len(s.led.nodes)), []wire.PodStatus{}
	for _, e := range s.led.nodes {
		out.Nodes = append(out.Nodes, e.status(out.Time))
	}
	slices.SortFunc(out.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range s.pods {
		out.Counts[p.phase.String()]++
		if p.phase == phasePending || p.phase == phaseBound {
			continue
		}
		ps := wire.PodStatus{Pod: p.key(), Phase: p.phase.String(), Node: p.node, Devices: p.devices, Inferred: p.inferred}
		if p.phase == phaseReserved {
			t := p.expires
			ps.Expires = &t
		}
		if key, ok := p.gm.Gang(); ok {
			ps.Gang = key
		}
		out.AssumedPods = append(out.AssumedPods, ps)
	}
	slices.SortFunc(out.AssumedPods, func(a, b wire.PodStatus) int { return strings.Compare(a.Pod, b.Pod) })
}

// status is the node's /status entry at now.
func (e *nodeEntry) status(now time.Time) NodeStatus {
	n := e.n
	ns := NodeStatus{Name: n.Name, Model: n.Model, CPUMilli: n.CPUMilli, UsedCPUMilli: n.UsedCPUMilli,
		MemoryMiB: n.MemoryMiB, UsedMemoryMiB: n.UsedMemoryMiB, Pods: n.Pods,
		MetricsFresh: n.Usage != nil, MetricsProblem: e.metricsErr, Learned: e.learned}
	if n.Usage == nil && ns.MetricsProblem == "" {
		ns.MetricsProblem = "older than the metrics max age"
		if e.metrics != nil && e.metrics.Timestamp.After(now) {
			ns.MetricsProblem = "stamped in the future beyond the metrics max skew"
		}
	}
	ns.GPUSource = e.gpus.source
	for i, f := range n.GPUFree {
		ns.GPUs = append(ns.GPUs, wire.GPUStatus{Index: i, AllocatedMilli: e.gpus.capacity(i) - f, UUID: e.gpus.uuid(i),
			Unavailable: e.gpus.isOff(i)})
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
	return ns
}

// snapshot is the index's part of the scrape-time gauges (nodes, GPUs, pods
// by phase, nodes with stale metrics). Call with mu held (read suffices).
func (s *State) snapshot() metrics.ExtenderSnapshot {
	out := metrics.ExtenderSnapshot{Nodes: len(s.led.nodes), Pods: map[string]int{}}
	for _, e := range s.led.nodes {
		out.GPUs += e.gpus.usable(len(e.n.GPUFree))
		for d, f := range e.n.GPUFree {
			c := e.gpus.capacity(d)
			out.GPUMilliCapacity += int64(c)
			out.GPUMilliAllocated += int64(c - f)
		}
		if e.n.Usage == nil {
			out.StaleNodeMetrics++
		}
	}
	for _, p := range s.pods {
		out.Pods[p.phase.String()]++
	}
	return out
}
