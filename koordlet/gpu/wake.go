package gpu

import (
	"time"

	"github.com/understory/understory/qos"
)

// userHZ is the unit of /proc/<pid>/stat's utime and stime: USER_HZ, which the kernel's
// ABI fixes at 100 a second on the architectures the agent is built for (amd64, arm64),
// whatever its internal tick rate.
const userHZ = 100

// wakeWindow is the shortest span an LS process's CPU use is measured over. utime and
// stime move in 10 ms ticks: over 100 ms one tick is 10 % of a core, so the default
// lsWakeCPUPercent (20 %) takes two ticks, and a stray tick of a background thread is no
// wake. A window spans two steps of the 50 ms loop; a step in between reports the last
// window's figure again.
const wakeWindow = 100 * time.Millisecond

// wakeWatch measures the CPU use of the LS processes on GPUs where batch runs beside
// them on the freeze lever, for the throttle's wake rule (qos.GPUReasonLSWoke): an LS
// process that holds its CUDA context and starts sending uses the CPU at once, while the
// driver's per-process sample shows its GPU work up to a second (on an H200, next to a
// deep-queue batch, 4.7 s) later. It reads one /proc/<pid>/stat per such LS process
// and step, nothing elsewhere. The Run goroutine owns it.
type wakeWatch struct {
	procRoot string
	buf      []byte
	step     uint64
	pids     map[uint32]cpuMark
}

// cpuMark is one process's CPU at the start of its current window and its last
// window's use.
type cpuMark struct {
	start uint64 // the process's start time: a reused PID starts over
	ticks uint64 // utime + stime at `at`
	at    time.Time
	pct   float64 // the last window's CPU, percent of one core
	has   bool    // pct is measured
	step  uint64  // the last step that read the process
}

func newWakeWatch(procRoot string) *wakeWatch {
	return &wakeWatch{procRoot: procRoot, buf: make([]byte, statBufSize), pids: map[uint32]cpuMark{}}
}

// observe fills LSCPUPercent and LSCPUKnown of ins (by view) at now for every healthy GPU
// where batch pods run beside LS processes on the freeze lever (lsPIDs: each GPU's
// non-batch PIDs without the MPS server, from leverState), and forgets the processes it
// did not read. A GPU's figure is its busiest LS process's; it is known once one of its
// processes has a whole window behind it.
func (w *wakeWatch) observe(now time.Time, views []deviceView, lsPIDs map[int][]uint32,
	ins []qos.GPUThrottleInput) {
	w.step++
	for i, v := range views {
		in := &ins[i]
		if !v.dev.Healthy || in.Unknown || in.MPS || len(v.batch) == 0 {
			continue
		}
		for _, pid := range lsPIDs[v.dev.Index] {
			pct, ok := w.read(now, pid)
			if !ok {
				continue
			}
			if !in.LSCPUKnown || pct > in.LSCPUPercent {
				in.LSCPUPercent, in.LSCPUKnown = pct, true
			}
		}
	}
	for pid, m := range w.pids {
		if m.step != w.step {
			delete(w.pids, pid)
		}
	}
}

// read returns process pid's CPU use over its last whole window, percent of one core;
// ok is false before the first window is whole, or when the process cannot be read (it
// exited: it leaves NVML's list at the next scrape).
func (w *wakeWatch) read(now time.Time, pid uint32) (float64, bool) {
	m, seen := w.pids[pid]
	if seen && m.step == w.step {
		return m.pct, m.has // on several GPUs: read once a step
	}
	st, err := readProcessStat(w.procRoot, pid, w.buf)
	if err != nil {
		delete(w.pids, pid)
		return 0, false
	}
	if !seen || m.start != st.start || st.cpuTicks < m.ticks || now.Before(m.at) {
		w.pids[pid] = cpuMark{start: st.start, ticks: st.cpuTicks, at: now, step: w.step}
		return 0, false
	}
	m.step = w.step
	if span := now.Sub(m.at); span >= wakeWindow {
		used := time.Duration(st.cpuTicks-m.ticks) * (time.Second / userHZ)
		m.pct = 100 * used.Seconds() / span.Seconds()
		m.has = true
		m.ticks, m.at = st.cpuTicks, now
	}
	w.pids[pid] = m
	return m.pct, m.has
}
