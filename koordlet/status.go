package koordlet

import (
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/evict"
	"github.com/understory/understory/koordlet/gpu"
	"github.com/understory/understory/koordlet/nodestatus"
	"github.com/understory/understory/koordlet/signals"
	"github.com/understory/understory/qos"
)

// Usage is one period's CPU use on the node, in cores.
type Usage struct {
	CPUs        float64 `json:"cpus"`
	Node        float64 `json:"node"`
	LS          float64 `json:"ls"`
	UnknownPods float64 `json:"unknownPods"`
	BE          float64 `json:"be"`
	Batch       float64 `json:"batch"`
	System      float64 `json:"system"`
}

// Status is what /status serves: the pods by class with their cgroups, and the budget
// with every term of its formula, so a user can see why batch got what it got.
type Status struct {
	Time   time.Time    `json:"time"`
	Node   string       `json:"node,omitempty"`
	Layout string       `json:"cgroupLayout"`
	Period string       `json:"period"`
	Usage  Usage        `json:"usageCores"`
	Budget BudgetStatus `json:"budget"`
	Tier   TierStatus   `json:"tier"`
	// Memory is the node's memory by class, bytes.
	Memory MemoryUsage `json:"memoryBytes"`
	// BatchResources explains the batch resources published on the Node, every term of
	// the formula for cpu (cores) and memory (bytes).
	BatchResources BatchResourcesStatus `json:"batchResources"`
	// Escalation is the graded action in force (throttle, freeze, evict) and why;
	// Evictions what the evictor did (dryRun in static mode).
	Escalation qos.EscalationDecision `json:"escalation"`
	Evictions  evict.Status           `json:"evictions"`
	Pods       map[string][]PodEntry  `json:"pods"`
	// PodSource says whether the pod source has delivered its first complete list (until
	// then the only pods the agent knows are the in-place batch pods it rediscovered in
	// the cgroup tree; LS usage comes from kubepods' aggregates either way) and how often
	// it failed.
	PodSource PodSourceStatus `json:"podSource"`
	// Signals is the LS harm signal source in use, why the better ones are unavailable,
	// and the last harm and cut.
	Signals SignalsStatus `json:"signals"`
	// Plan is the last period's CPU write plan (qos.WritePolicy.PlanCPU), in the order
	// it was applied: every group's share of the budget (the tier, pods below it with a
	// batch-cpu limit, in-place pods), whether it was written, and why or why not.
	Plan []qos.CPUEntry `json:"plan,omitempty"`
	// GPU is the GPU loop's state: per GPU its LS and batch pods, utilisation, the batch
	// duty and why; nil with GPU features off.
	GPU *gpu.Status `json:"gpu,omitempty"`
	// Config is the configuration in force, the sha256 of its file and what the last
	// reload of the file did (koordlet/config); nil until the Reloader published it.
	Config  *config.Status `json:"config,omitempty"`
	Healthy bool           `json:"healthy"`
}

// SignalsStatus is the state of the harm signal source.
type SignalsStatus struct {
	// Requested is signals.mode; Active the source in use (ebpf, psi or sampling);
	// Fallbacks the better sources tried first and why each could not be used.
	signals.State
	// WatchedPods is how many LS pods the source watches.
	WatchedPods int `json:"watchedPods"`
	// Error is the source's last read error (the agent was blind, and utilisation
	// decided, for that period).
	Error string `json:"error,omitempty"`
	// LastHarm is the last LS harm seen, LastCut the last budget cut and its cause.
	LastHarm *HarmStatus `json:"lastHarm,omitempty"`
	LastCut  *CutStatus  `json:"lastCut,omitempty"`
}

// HarmStatus is one harm observation.
type HarmStatus struct {
	Signal string    `json:"signal"`
	Time   time.Time `json:"time"`
	// Pod is the harmed LS pod (namespace/name); empty for the node (memory PSI).
	Pod string `json:"pod,omitempty"`
	// Value is the run-queue delay quantile or the stall in the PSI window, seconds.
	ValueSeconds float64 `json:"valueSeconds"`
}

// CutStatus is the last budget cut.
type CutStatus struct {
	// Signal is what caused it: runqueue_delay, psi_cpu, psi_memory or utilisation.
	Signal string    `json:"signal"`
	Time   time.Time `json:"time"`
	// Pod and ValueSeconds are the harm behind it (none for utilisation).
	Pod          string  `json:"pod,omitempty"`
	ValueSeconds float64 `json:"valueSeconds,omitempty"`
	// ReactionSeconds is what understory_batch_cut_reaction_seconds observed for it.
	ReactionSeconds float64 `json:"reactionSeconds"`
}

// PodSourceStatus is the state of the pod source.
type PodSourceStatus struct {
	Synced bool   `json:"synced"`
	Errors uint64 `json:"errors"`
}

// BudgetStatus explains the batch budget:
// applied = hysteresis(clamp(nodeCPUs × threshold − ls − system, min, max)).
type BudgetStatus struct {
	Formula     string  `json:"formula"`
	NodeCPUs    float64 `json:"nodeCPUs"`
	Threshold   float64 `json:"threshold"`
	LSUsage     float64 `json:"lsUsage"`
	SystemUsage float64 `json:"systemUsage"`
	Raw         float64 `json:"raw"`
	Min         float64 `json:"min"`
	Max         float64 `json:"max"`
	Target      float64 `json:"target"`
	Previous    float64 `json:"previous"`
	Applied     float64 `json:"applied"`
	Reason      string  `json:"reason"`
}

// TierStatus is the agent-owned batch tier.
type TierStatus struct {
	Cgroup     string   `json:"cgroup"`
	QuotaCores *float64 `json:"quotaCores,omitempty"`
	// MemoryLimitBytes is the tier's memory limit in force: capacity × memory
	// threshold − LS memory, at least 64 MiB.
	MemoryLimitBytes *float64 `json:"memoryLimitBytes,omitempty"`
	// MemoryLimitError is why the last memory limit write failed (a cut the kernel
	// refused while the memory is in use keeps the previous limit).
	MemoryLimitError string `json:"memoryLimitError,omitempty"`
}

// BatchResourcesStatus is what the agent publishes for the scheduler.
type BatchResourcesStatus struct {
	Formula string `json:"formula"`
	qos.Reclaimed
	// Node is the state of the writes to the Node's status (Kubernetes mode only).
	Node *nodestatus.Status `json:"node,omitempty"`
}

const reclaimFormula = "published = damped(max(clamp(capacity × threshold − lsTerm − beRecent − systemRecent, 0, capacity), " +
	"min(batchRequest, capacity))); " +
	"lsTerm = max(lsWindowPercentile, lsRecent) (policy usage), max(lsWindowPercentile, lsRecent, lsRequest) (maxUsageRequest)"

// PodEntry is one pod in /status.
type PodEntry struct {
	Namespace  string   `json:"namespace"`
	Name       string   `json:"name"`
	UID        string   `json:"uid"`
	Cgroup     string   `json:"cgroup"`
	UsageCores float64  `json:"usageCores"`
	QuotaCores *float64 `json:"quotaCores,omitempty"`
	// Placement of a batch pod: "tier" (below the agent's tier) or "in-place".
	Placement string `json:"placement,omitempty"`
	// MemoryLimitBytes is a batch pod's memory limit in force (its batch-memory);
	// MemoryLimitError why the last write failed (a limit below what the pod already
	// uses is refused by the kernel and retried).
	MemoryLimitBytes *float64 `json:"memoryLimitBytes,omitempty"`
	MemoryLimitError string   `json:"memoryLimitError,omitempty"`
	Error            string   `json:"error,omitempty"`
	ClassError       string   `json:"classError,omitempty"`
}

const budgetFormula = "applied = restoreLimited(clamp(nodeCPUs × threshold − lsUsage − systemUsage, min, max))"

// guardFormula is the budget with a harm signal (eBPF or PSI).
const guardFormula = "target = clamp(nodeCPUs × threshold − lsUsage − systemUsage, min, max); " +
	"on LS harm: applied = max(min, min(previous × (1 − cutPercent/100), target)); " +
	"no harm for restoreHold: applied grows by restorePercentPerSecond of nodeCPUs a second up to max; " +
	"utilisation alone never cuts"

// storeStatus publishes the period's snapshot. The pod list is rebuilt only with
// withPods (every slowEvery periods, or when the pod set changed); otherwise the previous
// snapshot's is reused: it is immutable once published.
func (a *Agent) storeStatus(now time.Time, u Usage, b qos.Budget, withPods bool) {
	formula := budgetFormula
	if a.ctl.signalled() {
		formula = guardFormula
	}
	s := &Status{
		Time: now, Node: a.cfg.NodeName, Layout: a.hier.Layout().String(),
		Period: a.cfg.Period.Duration.String(), Usage: u, Healthy: true,
		Budget: BudgetStatus{Formula: formula, NodeCPUs: b.NodeCPUs, Threshold: b.Threshold,
			LSUsage: b.LSUsage, SystemUsage: b.SystemUsage, Raw: b.Raw, Min: b.Min, Max: b.Max,
			Target: b.Target, Previous: b.Previous, Applied: b.Applied, Reason: b.Reason},
		Tier: TierStatus{Cgroup: a.layout.tier, QuotaCores: optional(a.act.tierCPU.Cores),
			MemoryLimitBytes: optional(a.act.tierMem.Bytes), MemoryLimitError: errString(a.act.tierMem.err)},
		Plan:           a.act.planStatus(),
		Memory:         a.sampler.lastMemory(),
		BatchResources: BatchResourcesStatus{Formula: reclaimFormula, Reclaimed: a.ctl.lastReclaim},
		PodSource:      PodSourceStatus{Synced: a.source.HasSynced(), Errors: a.sampler.sourceErrors},
		Escalation:     a.ctl.lastEscalation,
		Signals:        a.watch.status(a.ctl.lastCut),
	}
	// The evictor's and the Node writer's states change rarely and cost a lock and a
	// copy each: taken with the pods (every second), reused in between.
	prev := a.status.Load()
	if !withPods && prev != nil {
		s.Evictions, s.BatchResources.Node = prev.Evictions, prev.BatchResources.Node
	} else {
		s.Evictions = a.evictor.Status()
		if a.batchSink != nil {
			ns := a.batchSink.Status()
			s.BatchResources.Node = &ns
		}
	}
	if !withPods && prev != nil && prev.Pods != nil {
		s.Pods = prev.Pods
		a.status.Store(s)
		return
	}
	s.Pods = map[string][]PodEntry{}
	for _, st := range a.sorted {
		e := PodEntry{Namespace: st.namespace, Name: st.name, UID: string(st.uid), Cgroup: st.read.cgroup, UsageCores: st.read.usage}
		if st.class == qos.ClassBatch {
			e.Placement = "in-place"
			if st.read.inTier {
				e.Placement = "tier"
			}
			e.QuotaCores = optional(st.act.quota.Cores)
			if st.act.memory.Bytes > 0 {
				e.MemoryLimitBytes = optional(st.act.memory.Bytes)
			}
			e.MemoryLimitError = errString(st.act.memory.err)
		}
		if st.read.cgroup == "" {
			e.Cgroup = "not found: " + strings.Join(st.candidates, " or ")
		}
		if st.lastErr != nil {
			e.Error = st.lastErr.Error()
		}
		if st.classErr != nil {
			e.ClassError = st.classErr.Error()
		}
		s.Pods[string(st.class)] = append(s.Pods[string(st.class)], e)
	}
	a.status.Store(s)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func optional(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}

// Status returns the latest status snapshot.
func (a *Agent) Status() Status {
	s := *a.status.Load()
	s.Healthy = a.Healthy(time.Now()) == nil
	if g, ok := a.gpu.Status(); ok {
		s.GPU = &g
	}
	s.Config = a.live.configStatus()
	return s
}

// Handler serves /metrics (from gatherer), /healthz, /status and /debug/plans (the last
// plans that did something, debugplans.go).
func (a *Agent) Handler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.Healthy(time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /debug/plans", a.plans)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		b, err := json.MarshalIndent(a.Status(), "", "  ")
		if err != nil { // a non-finite number: say so rather than answer an empty body
			a.log.Error("encoding /status", "err", err)
			http.Error(w, "encoding status: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	})
	return mux
}
