package gpu

import (
	"bytes"
	"errors"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// The MPS cap check: the partitions hand each batch client its SM cap and priority as
// CUDA_MPS_* variables in its container, which the tenant's own process could override.
// Each step, for every GPU on the MPS lever, the levers read what each batch client was
// started with (/proc/<pid>/environ: its cap, priority and device memory limit) and what
// the control daemon caps its server at, and qos.CheckGPUMPSClients decides whether the
// caps are confirmed; a GPU where they are not
// uses the freeze lever (qos.GPUReasonMPSCapUnconfirmed).

// maxEnviron bounds the read of /proc/<pid>/environ: a process started with more is
// unreadable here (its caps unconfirmed), as an environment that large is no MPS client
// the NRI plugin made.
const maxEnviron = 256 << 10

// maxEnvValue bounds a kept variable's value: a cap or priority is 1 to 3 digits, so
// a longer value is malformed however it ends.
const maxEnvValue = 64

// maxMemEnvValue bounds the kept memory limit: the agent writes at most 64 entries
// ("63=<12 digits>M," is 17 bytes) on a node of that many GPUs; a longer value is
// unconfirmed (the check reads a clipped list as malformed or short).
const maxMemEnvValue = 1 << 10

// errEnvironTooLarge: /proc/<pid>/environ is larger than maxEnviron.
var errEnvironTooLarge = errors.New("environment larger than the agent reads")

// MPSEnviron is what a process's environment sets of the MPS client variables.
type MPSEnviron struct {
	// Cap and Priority are the first values of CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
	// CUDA_MPS_CLIENT_PRIORITY (at most maxEnvValue bytes of each); CapSet and
	// PrioritySet whether the environment has them.
	Cap, Priority       string
	CapSet, PrioritySet bool
	// MemLimit is the first CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (at most maxMemEnvValue
	// bytes), MemLimitSet whether the environment has one.
	MemLimit    string
	MemLimitSet bool
}

// ParseMPSEnviron reads the MPS client variables from the contents of a
// /proc/<pid>/environ file: NUL-separated KEY=VALUE entries (the last NUL may be
// missing). As getenv does, the first entry of a name counts and entries without '='
// are skipped.
func ParseMPSEnviron(data []byte) MPSEnviron {
	var e MPSEnviron
	for len(data) > 0 {
		var entry []byte
		if i := bytes.IndexByte(data, 0); i >= 0 {
			entry, data = data[:i], data[i+1:]
		} else {
			entry, data = data, nil
		}
		key, val, ok := bytes.Cut(entry, []byte{'='})
		if !ok {
			continue
		}
		if len(val) > maxMemEnvValue {
			val = val[:maxMemEnvValue]
		}
		if len(val) > maxEnvValue && string(key) != qos.GPUMPSEnvPinnedDeviceMemLimit {
			val = val[:maxEnvValue]
		}
		switch string(key) {
		case qos.GPUMPSEnvActiveThreadPercentage:
			if !e.CapSet {
				e.Cap, e.CapSet = string(val), true
			}
		case qos.GPUMPSEnvClientPriority:
			if !e.PrioritySet {
				e.Priority, e.PrioritySet = string(val), true
			}
		case qos.GPUMPSEnvPinnedDeviceMemLimit:
			if !e.MemLimitSet {
				e.MemLimit, e.MemLimitSet = string(val), true
			}
		}
	}
	return e
}

// readMPSEnviron reads and parses <procRoot>/<pid>/environ into buf (scratch space,
// returned grown for the next read). A process without a /proc entry yields
// ErrProcessGone.
func readMPSEnviron(procRoot string, pid uint32, buf []byte) (MPSEnviron, []byte, error) {
	if procRoot == "" {
		return MPSEnviron{}, buf, errors.New("no proc root configured")
	}
	data, err := readProcFile(procRoot, pid, "environ", maxEnviron, errEnvironTooLarge, buf)
	if err != nil {
		return MPSEnviron{}, data, err
	}
	return ParseMPSEnviron(data), data, nil
}

// mpsServerLister is the control daemon's view of its servers and their clients
// (mps.Daemon); optional on an mpsServer.
type mpsServerLister interface {
	Servers() mps.ServerList
}

var _ mpsServerLister = (*mps.Daemon)(nil)

// mpsEnvMark is one MPS client's environment as last read.
type mpsEnvMark struct {
	env    MPSEnviron
	read   qos.GPUMPSClientRead
	detail string
	readAt uint64 // the step of the read
	seen   uint64 // the step that last needed it
}

// daemonClient is one client of the daemon's list, attributed once per list.
type daemonClient struct {
	pid  uint32
	pod  PodRef
	gone bool
	why  string // why it is of no pod ("" when it is)
}

// mpsCheck is the cap check's part of the levers (Run goroutine's own).
type mpsCheck struct {
	lister mpsServerLister // nil: no daemon view
	envs   map[uint32]mpsEnvMark
	// gen is the daemon list the clients below are of; fresh: it is new at this step.
	gen       uint64
	fresh     bool
	clients   []daemonClient
	serverCap map[uint32]float64 // client PID → its server's active thread percentage
	obs       []qos.GPUMPSClientObs
	buf       []byte // scratch for reading an environment
}

func newMPSCheck(srv mpsServer) mpsCheck {
	c := mpsCheck{envs: map[uint32]mpsEnvMark{}, serverCap: map[uint32]float64{}}
	if l, ok := srv.(mpsServerLister); ok {
		c.lister = l
	}
	return c
}

// clientEnv returns pid's environment, read again when it was not read before or when
// fresh (and not already at this step): the levers pass fresh for a device read in full
// (its process list changed, or fullScrapePeriod passed), so an exec in place with a new
// environment is seen within fullScrapePeriod, and a probing step reads nothing.
func (l *leverState) clientEnv(pid uint32, fresh bool) mpsEnvMark {
	e, ok := l.check.envs[pid]
	if !ok || (fresh && e.readAt != l.step) {
		e = mpsEnvMark{readAt: l.step}
		var env MPSEnviron
		var err error
		env, l.check.buf, err = readMPSEnviron(l.procRoot, pid, l.check.buf)
		switch {
		case err == nil:
			e.env = env
		case errors.Is(err, ErrProcessGone):
			e.read = qos.GPUMPSClientGone
		default:
			e.read, e.detail = qos.GPUMPSClientUnreadable, err.Error()
		}
	}
	e.seen = l.step
	l.check.envs[pid] = e
	return e
}

// clientObs is the check's input for batch client pid of a pod planned as c.
func (l *leverState) clientObs(pid uint32, c clientCaps, fresh bool) qos.GPUMPSClientObs {
	e := l.clientEnv(pid, fresh)
	o := qos.GPUMPSClientObs{PID: int(pid), Read: e.read, Detail: e.detail, PlannedCapPercent: c.cap,
		PlannedPriority: qos.GPUMPSBatchPriority, Cap: e.env.Cap, CapSet: e.env.CapSet,
		Priority: e.env.Priority, PrioritySet: e.env.PrioritySet, ServerCapPercent: l.check.serverCap[pid],
		MemLimit: e.env.MemLimit, MemLimitSet: e.env.MemLimitSet}
	if !c.memNone {
		// The pod's largest limit, on the most ordinals of its containers.
		o.PlannedMemLimitMiB, o.PlannedMemDevices = c.memMiB, c.memDevices
	}
	return o
}

// daemonList takes the daemon's newest list of servers and clients, attributing each
// client to its pod once per list.
func (l *leverState) daemonList() {
	c := &l.check
	c.fresh = false
	if c.lister == nil {
		return
	}
	list := c.lister.Servers()
	if list.Gen == c.gen {
		return
	}
	c.gen, c.fresh = list.Gen, true
	c.clients = c.clients[:0]
	clear(c.serverCap)
	for _, s := range list.Servers {
		for _, pid := range s.Clients {
			if pid <= 0 || pid > maxPID {
				continue
			}
			dc := daemonClient{pid: uint32(pid)}
			ref, err := PodOfPID(l.procRoot, dc.pid)
			switch {
			case err == nil:
				dc.pod = ref
			case errors.Is(err, ErrProcessGone):
				dc.gone = true
			default:
				dc.why = err.Error()
			}
			c.clients = append(c.clients, dc)
			c.serverCap[dc.pid] = s.ActiveThreadPercent
		}
	}
}

// maxPID bounds the PIDs taken from the daemon (Linux's PID_MAX_LIMIT is 2^22).
const maxPID = 1 << 22

// confirmCaps checks the batch MPS clients of every GPU the step put on the MPS lever
// (ins[i].MPS) and sets ins[i].MPSCapUnconfirmed where qos.CheckGPUMPSClients does not
// confirm them. clients are the partitions' planned clients by GPU UUID.
func (l *leverState) confirmCaps(views []deviceView, pods PodView, ins []qos.GPUThrottleInput,
	clients map[string]map[types.UID]clientCaps) {
	l.daemonList()
	// A client of the daemon that is of no planned pod could be on any GPU: it leaves
	// every MPS GPU unconfirmed.
	unknown := ""
	for _, dc := range l.check.clients {
		if dc.gone {
			continue
		}
		planned := false
		if dc.pod.Attributed() {
			for _, byPod := range clients {
				if _, ok := byPod[dc.pod.UID]; ok {
					planned = true
					break
				}
			}
		}
		if !planned {
			why := dc.why
			if why == "" {
				why = "pod " + string(dc.pod.UID) + " has no planned client"
			}
			unknown = qos.CheckGPUMPSClients([]qos.GPUMPSClientObs{{PID: int(dc.pid),
				Read: qos.GPUMPSClientUnknown, Detail: why}})
			break
		}
	}
	for i, v := range views {
		in := &ins[i]
		if !in.MPS {
			continue
		}
		if unknown != "" {
			in.MPSCapUnconfirmed = unknown
			continue
		}
		caps := clients[v.dev.UUID]
		obs := l.check.obs[:0]
		for _, p := range v.dev.Processes {
			if !isBatch(p, pods) {
				continue
			}
			obs = append(obs, l.clientObs(p.PID, caps[p.Pod.UID], !v.dev.Probed))
		}
		// The daemon's clients of this GPU's batch pods that NVML does not list (yet).
		for _, dc := range l.check.clients {
			c, ok := caps[dc.pod.UID]
			if dc.gone || !ok || !c.batch || !dc.pod.Attributed() ||
				containsPID(v.dev.Processes, dc.pid) {
				continue
			}
			obs = append(obs, l.clientObs(dc.pid, c, l.check.fresh))
		}
		in.MPSCapUnconfirmed = qos.CheckGPUMPSClients(obs)
		clear(obs)
		l.check.obs = obs[:0]
	}
}

// containsPID reports whether pid is among procs.
func containsPID(procs []Process, pid uint32) bool {
	for _, p := range procs {
		if p.PID == pid {
			return true
		}
	}
	return false
}

// forgetEnvs drops the environments of PIDs no step needed now.
func (l *leverState) forgetEnvs() {
	for pid, e := range l.check.envs {
		if e.seen != l.step {
			delete(l.check.envs, pid)
		}
	}
}
