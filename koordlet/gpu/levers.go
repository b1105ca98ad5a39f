package gpu

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// mpsServer is the node's MPS control daemon (mps.Daemon).
type mpsServer interface {
	// Ready: the control daemon answers; new clients may start.
	Ready() bool
	// PipeDir is CUDA_MPS_PIPE_DIRECTORY of its clients (a host path).
	PipeDir() string
}

var _ mpsServer = (*mps.Daemon)(nil)

// mpsServerName is the executable of the per-user MPS server the control daemon
// spawns; it is a compute process on every GPU it serves, but neither LS nor batch.
// /proc/<pid>/comm holds at most 15 bytes (TASK_COMM_LEN 16), so the kernel shows it
// as mpsServerComm, which the control daemon (nvidia-cuda-mps-control, never a GPU
// process) shares: the server is told by argv[0] in /proc/<pid>/cmdline, the
// truncated comm only where cmdline cannot be read. Measured on an H200: the first
// real run compared comm with the full name, never matched, and counted the server
// (which carries every client's SM use) as an LS process outside MPS.
const (
	mpsServerName = "nvidia-cuda-mps-server"
	mpsServerComm = "nvidia-cuda-mps"
)

// LeverEvent is a change of a GPU's lever worth a Kubernetes Event on its batch pods
// (Options.OnLever).
type LeverEvent struct {
	Time time.Time
	GPU  int
	UUID string
	// Reason is the throttle's reason: qos.GPUReasonMPSCapStale (LS outgrew the partition
	// that batch's fixed MPS cap leaves it; batch is frozen until LS has been idle for
	// gpu.throttle.hold, or restarted or evicted to start with a new cap) or
	// qos.GPUReasonMPSCapUnconfirmed (a batch client's cap or priority could not be
	// confirmed from outside it: the GPU uses the freeze lever).
	Reason  string
	Message string
	// BatchPods are the GPU's batch pods (the Event's objects).
	BatchPods []EventPod
}

// EventPod names a pod for an Event.
type EventPod struct {
	UID             types.UID
	Namespace, Name string
}

// leverState is the levers' part of the loop (Run goroutine's own): each GPU's
// non-batch PIDs at the last step (to see LS arrive), which PIDs are the MPS server,
// whether each GPU was frozen (for the lever events).
type leverState struct {
	procRoot string
	mps      mpsServer   // nil: no MPS on the node
	parts    *Partitions // nil: no MPS client planned
	onLever  func(LeverEvent)
	hold     time.Duration
	log      *slog.Logger

	step       uint64 // stamps serverPIDs
	lsPIDs     map[int][]uint32
	pidScratch []uint32
	serverPIDs map[uint32]pidMark
	obsScratch []partitionGPUObs
	frozen     map[int]bool
	check      mpsCheck // mpscheck.go: the batch clients' caps
}

func newLeverState(o Options) *leverState {
	return &leverState{procRoot: o.ProcRoot, mps: o.MPS, parts: o.Partitions, onLever: o.OnLever,
		hold: o.Policy.Hold.Duration, log: o.Log, lsPIDs: map[int][]uint32{}, serverPIDs: map[uint32]pidMark{},
		frozen: map[int]bool{}, check: newMPSCheck(o.MPS)}
}

// lsProcs is what the throttle needs of one GPU's processes beyond the view.
type lsProcs struct {
	// arrived: a non-batch process that was not on the GPU at the last step.
	arrived bool
	// serverUtil and servers: the MPS servers' utilisation and count (taken out of LS).
	serverUtil float64
	servers    int
}

// scanLS classifies v's processes once more for the levers: the MPS server (by its
// command name, only where the agent uses MPS) and the non-batch processes that were not
// on the GPU at the last step (l.lsPIDs, updated).
func (l *leverState) scanLS(v deviceView, pods PodView) lsProcs {
	var r lsProcs
	prev := l.lsPIDs[v.dev.Index]
	cur := l.pidScratch[:0]
	for _, p := range v.dev.Processes {
		if isBatch(p, pods) {
			continue
		}
		if l.mps != nil && l.isMPSServer(p.PID) {
			r.serverUtil += p.SMUtil
			r.servers++
			continue
		}
		cur = append(cur, p.PID)
		if !slices.Contains(prev, p.PID) {
			r.arrived = true
		}
	}
	// Keep this GPU's PIDs; the previous slice is the scratch of the next GPU.
	l.lsPIDs[v.dev.Index], l.pidScratch = cur, prev[:0]
	return r
}

// isBatch reports whether p is a process of a known batch pod (anything else counts as
// LS, the safe side, as in viewDevice).
func isBatch(p Process, pods PodView) bool {
	if !p.Pod.Attributed() {
		return false
	}
	info, ok := pods.Pod(p.Pod.UID)
	return ok && info.Class == qos.ClassBatch
}

// isMPSServer reports whether pid runs the MPS server (cached per PID while it stays on
// a GPU; forget drops the rest).
func (l *leverState) isMPSServer(pid uint32) bool {
	if e, ok := l.serverPIDs[pid]; ok {
		l.serverPIDs[pid] = pidMark{server: e.server, step: l.step}
		return e.server
	}
	server := isMPSServerProc(l.procRoot, pid)
	l.serverPIDs[pid] = pidMark{server: server, step: l.step}
	return server
}

// isMPSServerProc reads whether pid runs the MPS server: argv[0]'s base name in
// <procRoot>/<pid>/cmdline, else the (truncated) command name in comm.
func isMPSServerProc(procRoot string, pid uint32) bool {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	if b, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && len(b) > 0 {
		argv0, _, _ := bytes.Cut(b, []byte{0})
		return filepath.Base(string(argv0)) == mpsServerName
	}
	b, err := os.ReadFile(filepath.Join(dir, "comm"))
	return err == nil && string(bytes.TrimSpace(b)) == mpsServerComm
}

// pidMark is a cached look at one PID, stamped with the step that last needed it.
type pidMark struct {
	server bool
	step   uint64
}

// forget drops what the levers remember of PIDs and GPUs no longer seen.
func (l *leverState) forget(views []deviceView) {
	for pid, e := range l.serverPIDs {
		if e.step != l.step {
			delete(l.serverPIDs, pid)
		}
	}
	for gpu := range l.lsPIDs {
		if !slices.ContainsFunc(views, func(v deviceView) bool { return v.dev.Index == gpu }) {
			delete(l.lsPIDs, gpu)
		}
	}
	l.forgetEnvs()
}

// complete completes the throttle's inputs of a step (ins, by view): LS arrivals, the
// MPS server's share taken out of LS, and the MPS lever where every LS and batch process
// on a GPU is a client of the agent's MPS server, with whether each batch client's cap
// is confirmed from outside the tenant (mpscheck.go). It feeds the partitions LS's
// demand per GPU.
func (l *leverState) complete(now time.Time, views []deviceView, pods PodView, ins []qos.GPUThrottleInput) {
	for i, v := range views {
		if !v.dev.Healthy {
			continue // Unknown: its state is held, and so are its PIDs
		}
		r := l.scanLS(v, pods)
		in := &ins[i]
		in.LSArrived = r.arrived
		if r.servers > 0 {
			if !v.dev.UtilNow { // the device's own utilisation counts the server once
				in.LSUtil = max(0, in.LSUtil-r.serverUtil)
			}
			in.LSActive = v.others > r.servers
		}
	}
	if l.parts == nil {
		return
	}
	ready, pipeDir := false, ""
	if l.mps != nil {
		ready, pipeDir = l.mps.Ready(), l.mps.PipeDir()
	}
	obs := l.obsScratch[:0]
	for i, v := range views {
		obs = append(obs, partitionGPUObs{index: v.dev.Index, uuid: v.dev.UUID,
			mpsOn: ready && v.dev.Healthy && !v.dev.UtilUnsupported, lsUtil: ins[i].LSUtil, lsKnown: !ins[i].Unknown,
			memTotal: v.dev.MemTotal})
	}
	l.obsScratch = obs
	clients := l.parts.observe(now, ready, pipeDir, obs, func(uid types.UID) bool {
		_, ok := pods.Pod(uid)
		return ok
	})
	for i, v := range views {
		caps := clients[v.dev.UUID]
		if !obs[i].mpsOn || len(caps) == 0 {
			continue
		}
		if lsCap, batchCap, batchMem, ok := l.mpsClients(v, pods, caps); ok {
			in := &ins[i]
			in.MPS, in.LSCapPercent, in.BatchCapPercent, in.BatchMemLimitMiB = true, lsCap, batchCap, batchMem
		}
	}
	l.confirmCaps(views, pods, ins, clients)
}

// mpsClients reports whether every process on v but the MPS server is of a pod the
// partitions made an MPS client there (of the same class), with the largest LS and
// batch caps among them and the sum of the memory limits of the batch pods among them
// (0 when one of them has none: unbounded).
func (l *leverState) mpsClients(v deviceView, pods PodView, caps map[types.UID]clientCaps) (lsCap, batchCap int,
	batchMem uint64, ok bool) {
	unbounded := false
	for i, p := range v.dev.Processes {
		batch := isBatch(p, pods)
		if !batch && l.isMPSServer(p.PID) {
			continue
		}
		c, found := caps[p.Pod.UID]
		if !found || !p.Pod.Attributed() || c.batch != batch {
			return 0, 0, 0, false
		}
		if !batch {
			lsCap = max(lsCap, c.cap)
			continue
		}
		batchCap = max(batchCap, c.cap)
		// Each batch pod once, at its first process.
		if slices.ContainsFunc(v.dev.Processes[:i], func(q Process) bool { return q.Pod.UID == p.Pod.UID }) {
			continue
		}
		unbounded = unbounded || c.memNone
		batchMem += c.memSum
	}
	if unbounded {
		batchMem = 0
	}
	return lsCap, batchCap, batchMem, true
}

// events reports each GPU that the step froze because LS outgrew its MPS partition, or
// because a batch client's MPS cap could not be confirmed (once per freeze: it fires
// again only after a thaw), to the log and Options.OnLever.
func (l *leverState) events(now time.Time, views []deviceView, decisions []qos.GPUThrottleDecision) {
	for _, v := range views {
		d, ok := decisionFor(decisions, v.dev.Index)
		if !ok || d.Reason == qos.GPUReasonUnknown {
			continue
		}
		was := l.frozen[v.dev.Index]
		l.frozen[v.dev.Index] = d.Frozen
		if !d.Frozen || was || (d.Reason != qos.GPUReasonMPSCapStale && d.Reason != qos.GPUReasonMPSCapUnconfirmed) {
			continue
		}
		var msg string
		if d.Reason == qos.GPUReasonMPSCapUnconfirmed {
			msg = fmt.Sprintf("GPU %d: %s: its MPS partition is not confirmed, so the GPU uses the freeze: batch "+
				"frozen while LS is on the GPU (and suspended or evicted after gpu.throttle.starveAfter); a batch "+
				"container that keeps the CUDA_MPS_* values the agent set runs in its partition again",
				v.dev.Index, d.MPSCapUnconfirmed)
			l.log.Warn("MPS cap not confirmed: GPU on the freeze lever, batch frozen", "gpu", v.dev.Index,
				"why", d.MPSCapUnconfirmed)
		} else {
			msg = fmt.Sprintf("GPU %d: LS uses %.0f %% of the SMs, at the %d %% its MPS partition protects "+
				"(LS cap %d %%, batch cap %d %%, fixed when the clients started): batch frozen until LS has been "+
				"idle for %v; a restart gives batch a cap from LS's demand now", v.dev.Index, d.LSUtil,
				d.ProtectedPercent, d.LSCapPercent, d.BatchCapPercent, l.hold)
			l.log.Info("MPS partition outgrown: batch frozen", "gpu", v.dev.Index, "lsUtil", d.LSUtil,
				"protected", d.ProtectedPercent, "lsCap", d.LSCapPercent, "batchCap", d.BatchCapPercent)
		}
		if l.onLever == nil {
			continue
		}
		ev := LeverEvent{Time: now, GPU: v.dev.Index, UUID: v.dev.UUID, Reason: d.Reason, Message: msg}
		for _, p := range v.batch {
			ev.BatchPods = append(ev.BatchPods, EventPod{UID: p.UID, Namespace: p.Namespace, Name: p.Name})
		}
		l.onLever(ev)
	}
	for gpu := range l.frozen {
		if !slices.ContainsFunc(views, func(v deviceView) bool { return v.dev.Index == gpu }) {
			delete(l.frozen, gpu)
		}
	}
}
