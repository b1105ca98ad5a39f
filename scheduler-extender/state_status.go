package extender

import (
	"slices"
	"strings"
	"time"

	"github.com/understory/understory/metrics"
)

// status fills out's policy, nodes, held pods and pod counts. Call with mu held
// (read suffices).
func (s *State) status(out *Status) {
	out.Policy, out.WorkloadClasses = s.sc.policy.Name(), s.sc.workload.Len()
	out.Counts = map[string]int{}
	out.Nodes, out.AssumedPods = make([]NodeStatus, 0, len(s.led.nodes)), []PodStatus{}
	for _, e := range s.led.nodes {
		out.Nodes = append(out.Nodes, e.status(out.Time))
	}
	slices.SortFunc(out.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range s.pods {
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
		ns.GPUs = append(ns.GPUs, GPUStatus{Index: i, AllocatedMilli: e.gpus.capacity(i) - f, UUID: e.gpus.uuid(i),
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
