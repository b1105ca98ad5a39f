package qos

// The batch pod condition: what `kubectl describe pod` shows of the agent holding a
// batch pod back, designed like kubelet's DisruptionTarget. One condition type,
// ConditionBatchSlowed: status True with the reason Throttled, Frozen, Suspended or
// Evicted while the agent holds the pod back, False with the reason Running once it
// runs free again. NextBatchCondition decides when the agent writes it; the agent
// (koordlet/nodestatus.PodConditionWriter) writes.

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
)

// ConditionBatchSlowed is the type of the pod condition the node agent sets on batch
// pods: the contract's name (contract.ConditionBatchSlowed, which the kubectl plugin
// reads), typed for corev1.PodCondition.
const ConditionBatchSlowed corev1.PodConditionType = contract.ConditionBatchSlowed

// BatchSlowReason is the condition's reason: why the agent holds the pod back, or Running.
type BatchSlowReason string

// The condition's reasons, from the mildest to the hardest.
const (
	// BatchRunning: the pod runs free (status False).
	BatchRunning BatchSlowReason = "Running"
	// BatchThrottled: throttled in most of its CFS periods (HardThrottled).
	BatchThrottled BatchSlowReason = "Throttled"
	// BatchFrozen: frozen because LS leaves batch nothing.
	BatchFrozen BatchSlowReason = "Frozen"
	// BatchSuspended: its GPU work checkpointed (cuda-checkpoint) because LS needs the GPU.
	BatchSuspended BatchSlowReason = "Suspended"
	// BatchEvicted: evicted by the agent (memory, or starved too long). Final.
	BatchEvicted BatchSlowReason = "Evicted"
)

// severity orders the reasons: a harder one is written at once, a milder one waits.
func (r BatchSlowReason) severity() int {
	switch r {
	case BatchThrottled:
		return 1
	case BatchFrozen:
		return 2
	case BatchSuspended:
		return 3
	case BatchEvicted:
		return 4
	default:
		return 0
	}
}

// valid reports whether the agent writes r.
func (r BatchSlowReason) valid() bool {
	return r == BatchRunning || r.severity() > 0
}

// Status is the condition's status for the reason: True unless Running.
func (r BatchSlowReason) Status() corev1.ConditionStatus {
	if r == BatchRunning {
		return corev1.ConditionFalse
	}
	return corev1.ConditionTrue
}

// BatchCondition is one state of the condition: a reason and its message (with the
// numbers behind it).
type BatchCondition struct {
	Reason  BatchSlowReason
	Message string
}

// WrittenBatchCondition is the condition the agent last wrote on a pod: At when it was
// written, Since when its reason last changed (the condition's lastTransitionTime).
type WrittenBatchCondition struct {
	BatchCondition
	At, Since time.Time
}

// PodCondition is the Kubernetes pod condition w stands for.
func (w WrittenBatchCondition) PodCondition() corev1.PodCondition {
	return corev1.PodCondition{
		Type: ConditionBatchSlowed, Status: w.Reason.Status(), Reason: string(w.Reason), Message: w.Message,
		LastTransitionTime: metav1.NewTime(w.Since),
	}
}

// How often the condition is written on one pod at most: a harder reason at once; a
// milder one (back to Running) once BatchConditionSettle has passed since the last write,
// so a pod throttled in one statistics interval and not in the next costs at most one
// write a minute; the same reason with new numbers once BatchConditionRefresh has passed
// (like the agent's events).
const (
	BatchConditionSettle  = time.Minute
	BatchConditionRefresh = 5 * time.Minute
)

// NextBatchCondition decides whether the agent writes the condition on a pod that was
// last written prev (nil: never) and is now in state next, at now; it returns what to
// write and whether to.
//
//   - Never written: written only when the pod is held back (a pod that always ran
//     free gets no condition, and costs no write).
//   - A harder reason than the last written: at once.
//   - A milder reason: once BatchConditionSettle has passed since the last write.
//   - The same reason with a new message: once BatchConditionRefresh has passed.
//   - Evicted is final: nothing is written after it.
//
// A clock that went back counts as time passed. The transition time (Since) is now when
// the reason changes, else prev's.
func NextBatchCondition(prev *WrittenBatchCondition, next BatchCondition, now time.Time) (WrittenBatchCondition, bool) {
	if next.Reason == "" {
		next.Reason = BatchRunning
	}
	w := WrittenBatchCondition{BatchCondition: next, At: now, Since: now}
	if prev == nil {
		return w, next.Reason != BatchRunning
	}
	if prev.Reason == BatchEvicted {
		return *prev, false
	}
	wait := BatchConditionSettle
	switch {
	case prev.Reason == next.Reason && prev.Message == next.Message:
		return *prev, false
	case prev.Reason == next.Reason:
		w.Since, wait = prev.Since, BatchConditionRefresh
	case next.Reason.severity() > prev.Reason.severity():
		return w, true
	}
	if d := now.Sub(prev.At); d >= 0 && d < wait {
		return *prev, false
	}
	return w, true
}
