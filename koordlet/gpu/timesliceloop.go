package gpu

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/metrics"
	"github.com/understory/understory/qos"
)

// TimesliceObserver says, in /status, what confirms a context's slice from outside the
// tenant: nothing yet. Every context is unconfirmed and a GPU whose batch has a context
// stays on the freeze (qos.ChooseGPUTimeslice).
const TimesliceObserver = "none: no observer outside the tenant sees the driver's time-slice calls; every " +
	"context counts as unconfirmed and a GPU whose batch has a context stays on the freeze"

// selfSetEventEvery is the shortest time between two self-set Events on one pod.
const selfSetEventEvery = 5 * time.Minute

// TimesliceStatus is one GPU's per-context time-slice decision in /status
// (qos.ChooseGPUTimeslice), with every context on it.
type TimesliceStatus struct {
	// Lever is the lever the choice gives the GPU ("timeslice", "mps", "freeze",
	// "none"); only "timeslice" changes what the throttle does. Reason and Detail say
	// why (qos.GPUTimesliceReason*).
	Lever  string `json:"lever"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// LSPresent, the slices asked of LS's and batch's contexts (µs) and how batch's was
	// chosen, LS's worst wait behind batch, whether LS suffers: as the choice has them.
	LSPresent     bool   `json:"lsPresent"`
	LSSliceUs     uint64 `json:"lsSliceUs,omitempty"`
	BatchSliceUs  uint64 `json:"batchSliceUs,omitempty"`
	SliceReason   string `json:"sliceReason,omitempty"`
	LSWorstWaitUs uint64 `json:"lsWorstWaitUs,omitempty"`
	LSSuffers     bool   `json:"lsSuffers,omitempty"`
	Sanitized     string `json:"sanitized,omitempty"`
	// Contexts are the GPU's contexts: one per context the shim reported of a process on
	// the GPU, one per process on it that reported none.
	Contexts []TimesliceContext `json:"contexts,omitempty"`
}

// TimesliceContext is one context in /status.
type TimesliceContext struct {
	// Pod is namespace/name ("uid <UID>" for a pod the agent does not know, "" for no
	// pod); Container its container; PID the process on the host (NVML's), ContainerPID
	// as its container numbers it (what the shim reports); Context the shim's handles.
	Pod          string    `json:"pod"`
	Container    string    `json:"container,omitempty"`
	PID          uint32    `json:"pid"`
	ContainerPID int       `json:"containerPID,omitempty"`
	Context      string    `json:"context,omitempty"`
	Class        qos.Class `json:"class"`
	// AskedUs is the slice the agent asked (the container's UNDERSTORY_TSG_TIMESLICE_US;
	// 0: none); WantUs what the policy asks now; Reask: they differ.
	AskedUs uint64 `json:"askedUs"`
	WantUs  uint64 `json:"wantUs"`
	Reask   bool   `json:"reask,omitempty"`
	// Shim is what the shim reported of the context; nil: nothing.
	Shim *ShimReport `json:"shim,omitempty"`
	// Verdict is qos.GPUTimesliceConfirmed, Unconfirmed or SelfSet; Why and Note say why.
	Verdict string `json:"verdict"`
	Why     string `json:"why,omitempty"`
	Note    string `json:"note,omitempty"`
}

// ShimReport is what the shim inside the tenant's process reported of one context:
// the tenant's word, never confirmation on its own.
type ShimReport struct {
	// Mode is what the shim did at the context's allocation (timeslice.Mode*: set,
	// report, badconfig, unsupported); "" where only an application's own set was seen.
	Mode   string `json:"mode,omitempty"`
	Driver string `json:"driver,omitempty"`
	// AskedUs is the slice the shim sent (its configuration).
	AskedUs uint64 `json:"askedUs,omitempty"`
	// Status and ReadBack are the driver's answers to the SET and the GET that read the
	// slice back ("ok", "errno N", "status 0x…", "" where none was made); ReadBackUs
	// the slice read back.
	Status     string `json:"status,omitempty"`
	ReadBack   string `json:"readBack,omitempty"`
	ReadBackUs uint64 `json:"readBackUs,omitempty"`
	// AppSets counts the application's own SET_TIMESLICE calls; AppAskedUs is the
	// longest value it asked, AppStatus the driver's answer to that call (where the shim
	// worked, the call carried the agent's value instead).
	AppSets    int    `json:"appSets,omitempty"`
	AppAskedUs uint64 `json:"appAskedUs,omitempty"`
	AppStatus  string `json:"appStatus,omitempty"`
}

// TimesliceNodeStatus is the node's part of the time slices in /status.
type TimesliceNodeStatus struct {
	// Observer says what confirms slices from outside the tenant (TimesliceObserver).
	Observer string `json:"observer"`
	// Library is the installed shim on the host ("": not installed, no container gets
	// it).
	Library string `json:"library,omitempty"`
	// Driver is NVML's driver version; DriverSupported whether its branch is one the
	// shim supports (timeslice.DriverSupported).
	Driver          string `json:"driver,omitempty"`
	DriverSupported bool   `json:"driverSupported"`
	// Clients are the containers given the shim.
	Clients []TimesliceClient `json:"clients"`
}

// SelfSetEvent is a context seen setting itself a slice longer than the agent's
// (Options.OnSelfSet).
type SelfSetEvent struct {
	Time time.Time
	GPU  int
	UUID string
	// Pod is the Event's object: the pod whose context set itself the slice.
	Pod          EventPod
	Container    string
	PID          uint32
	ContainerPID int
	// AppUs is the slice the application asked, AgentUs the agent's for its class.
	AppUs, AgentUs uint64
	Message        string
}

// driverVersioner is a Source that tells the driver's version (the NVML collector).
type driverVersioner interface {
	DriverVersion() string
}

// timesliceLoop is the GPU loop's time-slice part (Run goroutine's own): it reads the
// shim's reports, builds qos.ChooseGPUTimeslice's input per GPU, and marks the
// throttle's input Timeslice where the choice says timeslice.
type timesliceLoop struct {
	ts        *Timeslices
	policy    qos.GPUTimeslicePolicy
	window    time.Duration // LS's demand window
	every     time.Duration // how often the reports are read
	procRoot  string
	source    Source
	onSelfSet func(SelfSetEvent)
	log       *slog.Logger

	driver      string
	supported   bool
	driverAsked bool

	lastRead time.Time
	hasRead  bool
	reader   reportReader
	recs     map[timesliceKey]TimesliceClient
	dirs     map[timesliceKey]map[int][]shimContext
	bad      int
	nsPIDs   map[uint32]nsPIDMark
	readGen  uint64
	gpus     map[int]*timesliceGPUState
	obs      []timesliceGPUObs
	// selfSet are the self-set contexts already reported; lastEvent the last self-set
	// Event per pod.
	selfSet   map[selfSetKey]bool
	lastEvent map[types.UID]time.Time
	pending   []SelfSetEvent
}

// nsPIDMark is a host PID's number in its own PID namespace, stamped with the read that
// last needed it.
type nsPIDMark struct {
	ns  int
	gen uint64
}

type selfSetKey struct {
	pod       types.UID
	container string
	pid       int
	context   string
}

// timesliceGPUState is what the loop keeps of one GPU between decisions.
type timesliceGPUState struct {
	uuid    string
	pids    []uint32
	healthy bool
	mps     bool
	status  *TimesliceStatus
}

func newTimesliceLoop(o Options) *timesliceLoop {
	window := o.Policy.MPS.DemandWindow.Duration
	if window <= 0 {
		window = qos.DefaultGPUMPSDemandWindow
	}
	every := o.FullScrapePeriod
	if every <= 0 {
		every = DefaultFullScrapePeriod
	}
	return &timesliceLoop{ts: o.Timeslices, policy: o.Timeslices.policy, window: window, every: every,
		procRoot: o.ProcRoot, source: o.Source, onSelfSet: o.OnSelfSet, log: o.Log,
		nsPIDs: map[uint32]nsPIDMark{}, gpus: map[int]*timesliceGPUState{}, selfSet: map[selfSetKey]bool{},
		lastEvent: map[types.UID]time.Time{}}
}

// step is the loop's time-slice part of one step, between the levers and the throttle:
// it returns each view's decision (by view) and sets ins[i].Timeslice where it is the
// timeslice lever. The reports are read every `every`; a GPU is decided again then, when
// its processes, health or MPS lever changed, and at every step while it is on the
// timeslice lever.
func (l *timesliceLoop) step(now time.Time, views []deviceView, pods PodView, ins []qos.GPUThrottleInput,
	lev *leverState) []*TimesliceStatus {
	if !l.driverAsked {
		l.driverAsked = true
		if dv, ok := l.source.(driverVersioner); ok {
			l.driver = dv.DriverVersion()
		}
		l.supported = timeslice.DriverSupported(l.driver)
	}
	obs := l.obs[:0]
	for i, v := range views {
		obs = append(obs, timesliceGPUObs{index: v.dev.Index, uuid: v.dev.UUID, read: v.dev.Healthy,
			mig: v.dev.UtilUnsupported, lsUtil: ins[i].LSUtil, lsProcs: ins[i].LSActive})
	}
	l.obs = obs
	l.ts.observe(now, obs, l.window)
	reread := !l.hasRead || now.Sub(l.lastRead) >= l.every || now.Before(l.lastRead)
	if reread {
		l.read(now, pods)
	}
	out := make([]*TimesliceStatus, len(views))
	for i, v := range views {
		g := l.gpus[v.dev.Index]
		if g == nil || g.uuid != v.dev.UUID {
			g = &timesliceGPUState{uuid: v.dev.UUID}
			l.gpus[v.dev.Index] = g
		}
		if reread || g.status == nil || g.status.Lever == qos.GPULeverTimeslice || g.healthy != v.dev.Healthy ||
			g.mps != ins[i].MPS || !samePIDs(g.pids, v.dev.Processes) {
			g.status = l.decide(now, v, pods, ins[i], lev)
			g.healthy, g.mps = v.dev.Healthy, ins[i].MPS
			g.pids = g.pids[:0]
			for _, p := range v.dev.Processes {
				g.pids = append(g.pids, p.PID)
			}
		}
		out[i] = g.status
		ins[i].Timeslice = g.status.Lever == qos.GPULeverTimeslice
	}
	for idx := range l.gpus {
		if !slices.ContainsFunc(views, func(v deviceView) bool { return v.dev.Index == idx }) {
			delete(l.gpus, idx)
		}
	}
	l.fire()
	return out
}

// samePIDs reports whether procs lists exactly pids, in order.
func samePIDs(pids []uint32, procs []Process) bool {
	if len(pids) != len(procs) {
		return false
	}
	for i, p := range procs {
		if pids[i] != p.PID {
			return false
		}
	}
	return true
}

// read takes the records (dropping pods gone) and reads their report directories.
func (l *timesliceLoop) read(now time.Time, pods PodView) {
	l.lastRead, l.hasRead = now, true
	l.readGen++
	alive := func(uid types.UID) bool {
		_, ok := pods.Pod(uid)
		return ok
	}
	l.recs = l.ts.records(now, alive)
	l.dirs = make(map[timesliceKey]map[int][]shimContext, len(l.recs))
	l.bad = 0
	l.reader.begin()
	for k, c := range l.recs {
		ctxs, bad := l.reader.readDir(c.ReportDir)
		l.bad += bad
		if ctxs != nil {
			l.dirs[k] = ctxs
		}
	}
	l.reader.end()
	for pid, m := range l.nsPIDs {
		if m.gen+1 < l.readGen {
			delete(l.nsPIDs, pid)
		}
	}
	for k := range l.selfSet {
		if !alive(k.pod) {
			delete(l.selfSet, k)
		}
	}
	for uid := range l.lastEvent {
		if !alive(uid) {
			delete(l.lastEvent, uid)
		}
	}
}

// ctxExtra is what a context's status needs beyond the choice's input.
type ctxExtra struct {
	uid       types.UID
	known     bool
	namespace string
	name      string
	container string
	pid       uint32
	nsPID     int
	shim      *shimContext
}

// decide builds one GPU's input, asks qos.ChooseGPUTimeslice and returns its status,
// queueing a self-set Event for each context newly found setting itself a longer slice.
func (l *timesliceLoop) decide(now time.Time, v deviceView, pods PodView, th qos.GPUThrottleInput,
	lev *leverState) *TimesliceStatus {
	in := qos.GPUTimesliceInput{Index: v.dev.Index, Unknown: !v.dev.Healthy, MIG: v.dev.UtilUnsupported, MPS: th.MPS,
		DriverSupported: l.supported, Driver: l.driver, LSDemandPercent: l.ts.peak(v.dev.UUID)}
	var batchPods int
	in.LSRequestMilli, in.BatchRequestMilli, batchPods = l.ts.requests(v.dev.UUID)
	in.BatchPods = max(len(v.batch), batchPods)
	var extras []ctxExtra
	if v.dev.Healthy && !v.dev.UtilUnsupported && !th.MPS {
		for _, p := range v.dev.Processes {
			if lev.mps != nil && lev.isMPSServer(p.PID) {
				continue // neither LS nor batch
			}
			in.Contexts, extras = l.contexts(in.Contexts, extras, p, pods)
		}
	}
	d := qos.ChooseGPUTimeslice(l.policy, in)
	s := &TimesliceStatus{Lever: d.Lever, Reason: d.Reason, Detail: d.Detail, LSPresent: d.LSPresent,
		LSSliceUs: d.LSSliceUs, BatchSliceUs: d.BatchSliceUs, SliceReason: d.SliceReason,
		LSWorstWaitUs: d.LSWorstWaitUs, LSSuffers: d.LSSuffers, Sanitized: d.Sanitized}
	if len(d.Contexts) > 0 {
		s.Contexts = make([]TimesliceContext, len(d.Contexts))
	}
	for i, vd := range d.Contexts {
		x := extras[i]
		c := TimesliceContext{Pod: vd.Pod, Container: x.container, PID: x.pid, Context: vd.Context, Class: vd.Class,
			AskedUs: vd.AskedUs, WantUs: vd.WantUs, Reask: vd.Reask, Verdict: vd.Verdict, Why: vd.Why, Note: vd.Note}
		if x.shim != nil {
			c.ContainerPID = x.nsPID
			c.Shim = shimReport(x.shim)
		}
		s.Contexts[i] = c
		if vd.Verdict == qos.GPUTimesliceSelfSet && x.known && x.shim != nil {
			l.selfSetSeen(now, v, x, vd)
		}
	}
	return s
}

// contexts appends process p's contexts: one per context its container's shim reported
// for it, or one with nothing seen.
func (l *timesliceLoop) contexts(ctxs []qos.GPUTimesliceContext, extras []ctxExtra, p Process,
	pods PodView) ([]qos.GPUTimesliceContext, []ctxExtra) {
	x := ctxExtra{pid: p.PID, uid: p.Pod.UID}
	c := qos.GPUTimesliceContext{PID: int(p.PID), Class: qos.ClassLS}
	if p.Pod.Attributed() {
		c.Pod = "uid " + string(p.Pod.UID)
		if info, ok := pods.Pod(p.Pod.UID); ok {
			x.known, x.namespace, x.name = true, info.Namespace, info.Name
			x.container = info.Containers[p.Pod.ContainerID]
			c.Pod = info.Namespace + "/" + info.Name
			if info.Class != "" {
				c.Class = info.Class
			}
		}
	}
	key := timesliceKey{p.Pod.UID, x.container}
	rec, recorded := l.recs[key]
	if recorded && x.container != "" {
		c.AskedUs = rec.SliceUs
	}
	var shims []shimContext
	if recorded && x.container != "" {
		x.nsPID = l.nsPID(p.PID)
		shims = l.dirs[key][x.nsPID]
	}
	if len(shims) == 0 {
		return append(ctxs, c), append(extras, x)
	}
	for i := range shims {
		s := &shims[i]
		cc := c
		cc.Context = s.contextName()
		fillShim(&cc, s)
		xx := x
		xx.shim = s
		ctxs, extras = append(ctxs, cc), append(extras, xx)
	}
	return ctxs, extras
}

// fillShim maps what the shim reported of a context onto the choice's input. An
// application's own SET_TIMESLICE with a value counts as a self-set of that value, with
// the driver's answer to the call that reached it (where the shim worked, that call
// carried the agent's value instead: the attempt is what is reported).
func fillShim(c *qos.GPUTimesliceContext, s *shimContext) {
	if s.hasAlloc {
		a := s.alloc
		switch a.Mode {
		case timeslice.ModeSet:
			c.ShimReported = true
			switch {
			case !a.Set.OK():
				c.ShimErrno, c.ShimStatus = a.Set.Errno, a.Set.Status
			case !a.Readback.OK():
				c.ShimErrno, c.ShimStatus = a.Readback.Errno, a.Readback.Status
			default:
				c.ShimReadBackUs = a.Readback.ValueUS
			}
		case timeslice.ModeReport:
			c.ShimRefused = "no slice configured (UNDERSTORY_TSG_TIMESLICE_US unset)"
		case timeslice.ModeBadConfig:
			c.ShimRefused = "the configured slice is malformed"
		case timeslice.ModeUnsupported:
			c.ShimRefused = "the driver's version is unknown or unsupported"
			if a.Driver != "" {
				c.ShimRefused = "driver " + a.Driver + " is not a supported version"
			}
		default:
			c.ShimRefused = "mode " + string(a.Mode)
		}
	}
	if s.hasApp {
		c.SelfSet, c.SelfSetUs = true, s.app.AppUS
		c.SelfSetErrno, c.SelfSetStatus = s.app.Set.Errno, s.app.Set.Status
	}
}

// shimReport is the /status form of a shim's context.
func shimReport(s *shimContext) *ShimReport {
	r := &ShimReport{AppSets: s.appSets}
	if s.hasAlloc {
		a := s.alloc
		r.Mode, r.Driver, r.Status, r.ReadBack = string(a.Mode), a.Driver, resultText(a.Set), resultText(a.Readback)
		if a.HasAsked {
			r.AskedUs = a.AskedUS
		}
		if a.Readback.OK() {
			r.ReadBackUs = a.Readback.ValueUS
		}
	}
	if s.hasApp {
		r.AppAskedUs, r.AppStatus = s.app.AppUS, resultText(s.app.Set)
	}
	return r
}

// resultText is a driver call's outcome for /status.
func resultText(r timeslice.Result) string {
	switch {
	case !r.Done:
		return ""
	case r.Errno != 0:
		return "errno " + strconv.Itoa(r.Errno)
	case r.Status != timeslice.StatusOK:
		return "status 0x" + strconv.FormatUint(uint64(r.Status), 16)
	}
	return "ok"
}

// selfSetSeen queues an Event for a context newly found setting itself a longer slice,
// at most one per pod every selfSetEventEvery.
func (l *timesliceLoop) selfSetSeen(now time.Time, v deviceView, x ctxExtra, vd qos.GPUTimesliceVerdict) {
	k := selfSetKey{pod: x.uid, container: x.container, pid: x.nsPID, context: vd.Context}
	if l.selfSet[k] {
		return
	}
	l.selfSet[k] = true
	agent := max(vd.AskedUs, vd.WantUs)
	l.log.Warn("GPU context set itself a longer time slice than the agent's", "gpu", v.dev.Index,
		"pod", x.namespace+"/"+x.name, "container", x.container, "pid", x.pid, "context", vd.Context,
		"appUs", vd.SelfSetUs, "agentUs", agent)
	if t, ok := l.lastEvent[x.uid]; ok && now.Sub(t) < selfSetEventEvery && !now.Before(t) {
		return
	}
	l.lastEvent[x.uid] = now
	msg := fmt.Sprintf("GPU %d: container %s (pid %d, %d in the container, %s) set its own GPU time slice to %d µs, "+
		"longer than the %d µs the agent asked for its class: a long slice makes the other pods on the GPU wait "+
		"for it. The GPU is kept on the freeze lever while this context runs (its shim rewrote the call to the "+
		"agent's value where it could)", v.dev.Index, x.container, x.pid, x.nsPID, vd.Context, vd.SelfSetUs, agent)
	l.pending = append(l.pending, SelfSetEvent{Time: now, GPU: v.dev.Index, UUID: v.dev.UUID,
		Pod: EventPod{UID: x.uid, Namespace: x.namespace, Name: x.name}, Container: x.container, PID: x.pid,
		ContainerPID: x.nsPID, AppUs: vd.SelfSetUs, AgentUs: agent, Message: msg})
}

// fire hands the queued self-set Events to Options.OnSelfSet.
func (l *timesliceLoop) fire() {
	if len(l.pending) == 0 {
		return
	}
	if l.onSelfSet != nil {
		for _, ev := range l.pending {
			l.onSelfSet(ev)
		}
	}
	clear(l.pending)
	l.pending = l.pending[:0]
}

// nsPID is a host process's ID in its own PID namespace (the last field of NSpid in
// <procRoot>/<pid>/status: what its getpid returns, what the shim reports), cached while
// the process is seen; the host PID where that cannot be read.
func (l *timesliceLoop) nsPID(pid uint32) int {
	if m, ok := l.nsPIDs[pid]; ok {
		l.nsPIDs[pid] = nsPIDMark{ns: m.ns, gen: l.readGen}
		return m.ns
	}
	ns := int(pid)
	if l.procRoot != "" {
		if n, ok := readNSPID(filepath.Join(l.procRoot, strconv.FormatUint(uint64(pid), 10), "status")); ok {
			ns = n
		}
	}
	l.nsPIDs[pid] = nsPIDMark{ns: ns, gen: l.readGen}
	return ns
}

// readNSPID reads the innermost PID of a /proc/<pid>/status file's NSpid line.
func readNSPID(path string) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			return 0, false
		}
		n, err := strconv.Atoi(fs[len(fs)-1])
		return n, err == nil && n > 0
	}
	return 0, false
}

// nodeStatus is the node's part of /status.
func (l *timesliceLoop) nodeStatus() *TimesliceNodeStatus {
	return &TimesliceNodeStatus{Observer: TimesliceObserver, Library: l.ts.Library(), Clients: l.ts.Clients()}
}

// timesliceMetrics is a GPU's per-pod slices for the metrics: the longest asked and the
// longest read back over each pod's contexts.
func timesliceMetrics(s *TimesliceStatus) []metrics.GPUTimesliceUsage {
	if s == nil {
		return nil
	}
	var out []metrics.GPUTimesliceUsage
	for _, c := range s.Contexts {
		ns, name, ok := strings.Cut(c.Pod, "/")
		if !ok || (c.AskedUs == 0 && (c.Shim == nil || c.Shim.ReadBackUs == 0)) {
			continue
		}
		i := slices.IndexFunc(out, func(u metrics.GPUTimesliceUsage) bool { return u.Namespace == ns && u.Pod == name })
		if i < 0 {
			out = append(out, metrics.GPUTimesliceUsage{Namespace: ns, Pod: name})
			i = len(out) - 1
		}
		u := &out[i]
		u.AskedSeconds = max(u.AskedSeconds, float64(c.AskedUs)/1e6)
		if c.Shim != nil && c.Shim.ReadBackUs > 0 {
			u.ReadBackSeconds = max(u.ReadBackSeconds, float64(c.Shim.ReadBackUs)/1e6)
		}
	}
	return out
}
