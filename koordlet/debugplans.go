package koordlet

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/understory/understory/qos"
)

// This file keeps the last plans that did something, with every write and its reason, and
// serves them at /debug/plans: what the agent did in the last minute, and why, without
// Prometheus. A period whose plan writes, freezes, evicts, publishes and tells nothing,
// and leaves the graded action as it was, is only counted (quietPeriodsBefore of the next
// record): a budget that moves within the write deadband, or a freeze that lasts, is not
// worth a record a period.

// planLogSize is how many plans /debug/plans keeps.
const planLogSize = 256

// Kinds of plan records.
const (
	planKindPeriod   = "period"   // a control period
	planKindHarm     = "harm"     // a cut on a harm signal between two periods
	planKindShutdown = "shutdown" // the graceful stop's exact writes
)

// planLog is a bounded ring of plan records. The control loop adds, the HTTP server
// reads: safe for concurrent use.
type planLog struct {
	mu      sync.Mutex
	records []planRecord // ring: next is the oldest once full
	next    int
	full    bool
	// quiet counts the periods since the last record that did nothing; level and
	// reason are the graded action of the last period.
	quiet  int
	level  qos.EscalationLevel
	reason string
}

func newPlanLog(size int) *planLog {
	return &planLog{records: make([]planRecord, size)}
}

// planRecord is one plan as /debug/plans shows it. Immutable once added.
type planRecord struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	// QuietPeriodsBefore is how many periods since the previous record did nothing.
	QuietPeriodsBefore int `json:"quietPeriodsBefore"`
	// BudgetCores is the budget in force, Reason why, Cause what cut it.
	BudgetCores float64 `json:"budgetCores"`
	Reason      string  `json:"reason"`
	Cause       string  `json:"cause,omitempty"`
	// Writes are the limits written, in order: the pods' memory, CPU, the tier's memory.
	Writes []planWrite `json:"writes,omitempty"`
	// Freezes are the freezer writes.
	Freezes []planWrite `json:"freezes,omitempty"`
	// Escalation is the graded action when it changed: a freeze, a thaw, an eviction,
	// another level or reason.
	Escalation *qos.EscalationDecision `json:"escalation,omitempty"`
	// EvictCandidates are the pods the eviction may take, in order (namespace/name).
	EvictCandidates []string `json:"evictCandidates,omitempty"`
	// BatchResources is what was handed to the Node writer.
	BatchResources *planBatchResources `json:"batchResources,omitempty"`
	Events         []qos.Notice        `json:"events,omitempty"`
	Conditions     []planCondition     `json:"conditions,omitempty"`
	// ForgotConditions are the pods (UIDs) whose condition is no longer tended.
	ForgotConditions []string `json:"forgotConditions,omitempty"`
}

// planWrite is one write of a plan.
type planWrite struct {
	// Target is tier, tierPod, inPlacePod, tierMemory or podMemory; Pod the pod's
	// namespace/name.
	Target string   `json:"target"`
	Pod    string   `json:"pod,omitempty"`
	Cores  *float64 `json:"cores,omitempty"`
	Bytes  *int64   `json:"bytes,omitempty"`
	Freeze *bool    `json:"freeze,omitempty"`
	Reason string   `json:"reason"`
}

type planBatchResources struct {
	CPUMilli     int64  `json:"cpuMilli"`
	MemoryBytes  int64  `json:"memoryBytes"`
	CPUReason    string `json:"cpuReason"`
	MemoryReason string `json:"memoryReason"`
}

type planCondition struct {
	Pod     string `json:"pod"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// podNamer names a plan's pod entries: the actuator, which holds them in the plan's order
// for the period.
type podNamer interface {
	podName(kind qos.CPUTargetKind, i int) string
}

// add records p, decided at now, if it did something; otherwise it counts a quiet period.
func (l *planLog) add(now time.Time, kind string, p qos.Plan, names podNamer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := p.Escalation
	escalated := d.Froze || d.Thawed || d.Evict != nil
	if kind == planKindPeriod { // a harm cut or the shutdown decides no graded action
		escalated = escalated || d.Level != l.level || d.Reason != l.reason
		l.level, l.reason = d.Level, d.Reason
	}
	r, ok := recordOf(p, names, escalated)
	if !ok {
		l.quiet++
		return
	}
	r.Time, r.Kind, r.QuietPeriodsBefore = now, kind, l.quiet
	l.quiet = 0
	l.records[l.next] = r
	l.next++
	if l.next == len(l.records) {
		l.next, l.full = 0, true
	}
}

// recordOf is the record of p (with its graded action when escalated); ok is false when p
// writes, freezes, evicts, publishes and tells nothing and did not escalate.
func recordOf(p qos.Plan, names podNamer, escalated bool) (planRecord, bool) {
	// Every period comes here: only what is recorded may allocate (the pointers are to
	// copies made for it).
	r := planRecord{BudgetCores: p.Budget.Applied, Reason: p.Budget.Reason, Cause: string(p.Cause)}
	for i := range p.PodMemory {
		if e := &p.PodMemory[i]; e.Write {
			r.Writes = append(r.Writes, planWrite{Target: string(memoryTarget), Pod: names.podName(memoryTarget, i),
				Bytes: ptr(e.Max), Reason: e.Reason})
		}
	}
	for i := range p.CPU {
		if e := &p.CPU[i]; e.Write {
			r.Writes = append(r.Writes, planWrite{Target: string(e.Kind), Pod: names.podName(e.Kind, e.Index),
				Cores: ptr(e.Cores), Reason: e.Reason})
		}
	}
	if e := p.TierMemory; e.Write {
		r.Writes = append(r.Writes, planWrite{Target: "tierMemory", Bytes: ptr(e.Max), Reason: e.Reason})
	}
	for _, f := range p.Freezes {
		w := planWrite{Target: string(f.Kind), Freeze: ptr(f.Freeze), Reason: f.Reason}
		if f.Kind == qos.TargetInPlacePod {
			w.Pod = names.podName(batchTarget, f.Index)
		}
		r.Freezes = append(r.Freezes, w)
	}
	if escalated {
		r.Escalation = ptr(p.Escalation)
	}
	for _, c := range p.EvictCandidates {
		r.EvictCandidates = append(r.EvictCandidates, c.Namespace+"/"+c.Name)
	}
	if rc := p.Reclaimed; p.Reclaim && (rc.CPU.Write || rc.Memory.Write) {
		r.BatchResources = &planBatchResources{CPUMilli: rc.BatchCPUMilli(), MemoryBytes: rc.BatchMemoryBytes(),
			CPUReason: rc.CPU.Reason, MemoryReason: rc.Memory.Reason}
	}
	r.Events = p.Notices
	for _, c := range p.Conditions {
		r.Conditions = append(r.Conditions, planCondition{Pod: c.Pod, Status: string(c.Condition.Reason.Status()),
			Reason: string(c.Condition.Reason), Message: c.Condition.Message})
	}
	for _, uid := range p.Forget {
		r.ForgotConditions = append(r.ForgotConditions, string(uid))
	}
	ok := len(r.Writes) > 0 || len(r.Freezes) > 0 || r.Escalation != nil || r.BatchResources != nil ||
		len(r.Events) > 0 || len(r.Conditions) > 0 || len(r.ForgotConditions) > 0
	return r, ok
}

// ptr is a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

// planLogStatus is what /debug/plans serves.
type planLogStatus struct {
	// Capacity is how many records are kept; QuietPeriods how many periods since the
	// last record did nothing.
	Capacity     int `json:"capacity"`
	QuietPeriods int `json:"quietPeriods"`
	// Plans are the records, oldest first.
	Plans []planRecord `json:"plans"`
}

// snapshot returns the records, oldest first.
func (l *planLog) snapshot() planLogStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := planLogStatus{Capacity: len(l.records), QuietPeriods: l.quiet, Plans: []planRecord{}}
	if l.full {
		out.Plans = append(out.Plans, l.records[l.next:]...)
	}
	out.Plans = append(out.Plans, l.records[:l.next]...)
	return out
}

// ServeHTTP serves the records as JSON.
func (l *planLog) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b, err := json.MarshalIndent(l.snapshot(), "", "  ")
	if err != nil { // a non-finite number: say so rather than answer an empty body
		http.Error(w, "encoding plans: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
