package gpu

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// Escalation outcomes in GPUStatus.Escalation.
const (
	EscalationSuspended = "suspended"
	EscalationEvict     = "evict-requested"
	EscalationReported  = "reported"
)

// Bounds of the escalation steps.
const (
	// evictEvery is the shortest gap between two eviction requests for one GPU (the
	// evictor has its own rate limit; this keeps the loop from resubmitting every step).
	evictEvery = 30 * time.Second
)

// escalate acts on a GPU whose batch has been frozen solid past starveAfter: suspend its
// batch processes (cuda-checkpoint, when enabled), else ask for an eviction, else only
// report it.
func (m *Manager) escalate(ctx context.Context, now time.Time, v deviceView, d qos.GPUThrottleDecision) string {
	if !d.Escalate {
		return ""
	}
	if m.o.Suspend != nil && m.suspend(ctx, now, v) {
		return EscalationSuspended
	}
	if m.o.Evict == nil {
		return EscalationReported
	}
	if last, ok := m.evictedAt[v.dev.Index]; ok && now.Sub(last) < evictEvery && now.After(last) {
		return EscalationEvict
	}
	var cands []qos.EvictionCandidate
	for _, p := range v.batch {
		if p.Terminating {
			continue
		}
		cands = append(cands, qos.EvictionCandidate{UID: p.UID, Namespace: p.Namespace, Name: p.Name,
			Class: p.Class, Priority: p.Priority, StartTime: p.StartTime})
	}
	req := qos.EvictionRequest{Reason: qos.EvictReasonGPUStarvation, GPU: v.dev.Index,
		StarvedFor: d.StarvedFor, StarvationTimeout: metav1.Duration{Duration: m.o.Policy.StarveAfter.Duration}}
	if err := m.o.Evict.Submit(req, cands); err != nil {
		m.log.Error("GPU starvation eviction refused", "gpu", v.dev.Index, "err", err)
		return EscalationReported
	}
	m.evictedAt[v.dev.Index] = now
	return EscalationEvict
}

// suspend checkpoints the GPU's batch processes. A frozen process cannot be suspended
// (cuda-checkpoint talks to a thread inside it), so each pod is released from the duty
// cycle first; once suspended it holds no GPU and leaves the GPU's process list. It
// reports whether any process is suspended now.
func (m *Manager) suspend(ctx context.Context, now time.Time, v deviceView) bool {
	held := false
	for _, p := range v.batch {
		if p.Terminating {
			continue
		}
		if h := m.groups[p.Cgroup]; h != nil {
			if err := m.o.Cycler.Release(ctx, h.g); err != nil {
				m.log.Warn("cannot thaw batch pod before suspending it", "pod", p.Namespace+"/"+p.Name, "err", err)
				continue
			}
		}
		for _, pid := range v.batchPIDs[p.UID] {
			if _, done := m.suspended[pid]; done {
				held = true
				continue
			}
			// Bounded by the suspender's own timeout (gpu.suspend.timeout).
			err := m.o.Suspend.Suspend(ctx, pid)
			if err != nil {
				m.log.Warn("cuda-checkpoint suspend failed; falling back to eviction", "pod", p.Namespace+"/"+p.Name,
					"pid", pid, "err", err)
				continue
			}
			m.log.Info("batch process suspended: LS needs the GPU", "pod", p.Namespace+"/"+p.Name, "pid", pid,
				"gpu", v.dev.Index)
			m.suspended[pid] = suspendedProc{gpu: v.dev.Index, pod: p.UID, at: now}
			held = true
		}
	}
	return held
}

// podSuspended reports whether one of uid's processes is suspended: its cgroup stays
// out of the duty cycle (a frozen process cannot be resumed either).
func (m *Manager) podSuspended(uid types.UID) bool {
	for _, s := range m.suspended {
		if s.pod == uid {
			return true
		}
	}
	return false
}

// resumeReleased resumes the suspended processes of GPUs that LS has left: LS has been
// idle for the hold, so batch would no longer be frozen (or the GPU is gone).
func (m *Manager) resumeReleased(ctx context.Context, decisions []qos.GPUThrottleDecision) {
	for pid, s := range m.suspended {
		d, ok := decisionFor(decisions, s.gpu)
		if ok && (d.Frozen || d.LSNeedsGPU || d.Reason == qos.GPUReasonUnknown) {
			continue
		}
		m.resume(ctx, pid, s)
	}
}

// resumeAll resumes every suspended process (the loop is ending).
func (m *Manager) resumeAll(ctx context.Context) {
	for pid, s := range m.suspended {
		m.resume(ctx, pid, s)
	}
}

func (m *Manager) resume(ctx context.Context, pid int, s suspendedProc) {
	err := m.o.Suspend.Resume(ctx, pid)
	if err != nil && ctx.Err() == nil {
		// A process that exited cannot be resumed; anything else is retried next step.
		m.log.Warn("cuda-checkpoint resume failed", "pid", pid, "gpu", s.gpu, "err", err)
		if m.processGone(pid) {
			delete(m.suspended, pid)
		}
		return
	}
	m.log.Info("batch process resumed", "pid", pid, "gpu", s.gpu)
	delete(m.suspended, pid)
}

// processGone reports whether pid has exited (no /proc entry).
func (m *Manager) processGone(pid int) bool {
	_, err := os.Stat(filepath.Join(m.o.ProcRoot, strconv.Itoa(pid)))
	return errors.Is(err, fs.ErrNotExist)
}

func (m *Manager) suspendedStatus() []SuspendedStatus {
	out := make([]SuspendedStatus, 0, len(m.suspended))
	for pid, s := range m.suspended {
		out = append(out, SuspendedStatus{PID: pid, GPU: s.gpu, PodID: s.pod, Since: s.at})
	}
	slices.SortFunc(out, func(a, b SuspendedStatus) int { return a.PID - b.PID })
	return out
}
