package gpu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/qos"
)

// ErrTimesliceRequest is wrapped by Timeslices.TimesliceClient for a request it cannot
// plan (no pod UID or one unfit for a directory name, no container or an invalid name,
// no GPU, a negative request); the container then starts without the shim.
var ErrTimesliceRequest = errors.New("gpu: invalid time-slice request")

// Host layout below TimesliceOptions.Directory.
const (
	// TimesliceLibDir holds the installed shim (timeslice.Install).
	TimesliceLibDir = "lib"
	// TimesliceReportsDir holds reports/<pod UID>/<container>/, one directory per
	// container with the shim, each mounted read-write into its container.
	TimesliceReportsDir = "reports"
)

// timesliceSweepEvery is how often the reports directory is swept of pods that left
// (records the agent lost in a restart); timesliceDirGrace how old a pod's directory
// without a record must be before the sweep removes it.
const (
	timesliceSweepEvery = time.Minute
	timesliceDirGrace   = time.Minute
)

// TimesliceOptions configure Timeslices.
type TimesliceOptions struct {
	// Policy chooses the slices (qos.ChooseGPUTimeslice; forced into range there).
	Policy qos.GPUTimeslicePolicy
	// Directory is the host directory of lib/ and reports/ (the agent sees it at the
	// same path); absolute.
	Directory string
	// Library is the installed shim on the host ("": not installed, no container gets
	// the shim).
	Library string
	// MPSOn reports whether a GPU (by UUID) runs the agent's MPS server for new clients
	// (Partitions.MPSOn); nil: no MPS.
	MPSOn func(uuid string) bool
}

// Timeslices is the time-slice shim's planner and the record of the containers given
// it: the NRI plugin asks it, at each shared-GPU container's creation, whether the
// container gets the shim and with which slice (devices.TimeslicePlanner), and it
// creates the container's report directory; the GPU Manager updates it every step (its
// GPUs, LS's demand on each) and reads back the records to attribute the shim's reports.
// Safe for concurrent use.
//
// The slice is qos.ChooseGPUTimeslice's for the container's class on its GPU now, from
// LS's demand peak there, the gpu-milli requests of the containers recorded on it and
// this one's, and whether LS processes run there. A GPU the Manager has not read yet
// (or could not read) is taken as fully used by LS, which gives batch the shortest
// slice. No shim where the GPU runs MPS (its clients share one context) or is in MIG
// mode, or where the shim is not installed.
type Timeslices struct {
	policy  qos.GPUTimeslicePolicy
	reports string // <Directory>/reports
	library string
	mpsOn   func(uuid string) bool
	now     func() time.Time

	mu        sync.Mutex
	gpus      map[string]*timesliceGPU // by UUID
	clients   map[timesliceKey]*TimesliceClient
	lastSweep time.Time
}

var _ devices.TimeslicePlanner = (*Timeslices)(nil)

// timesliceGPU is what Timeslices knows of one GPU.
type timesliceGPU struct {
	index int
	// read: the last step read the GPU (healthy); everRead: a step did; mig: it is in
	// MIG mode.
	read, everRead, mig bool
	// lsProcs: an LS process was on it at the last step.
	lsProcs bool
	peak    qos.GPUDemandPeak
}

type timesliceKey struct {
	pod       types.UID
	container string
}

// TimesliceClient is one container given the shim, as /status shows it.
type TimesliceClient struct {
	PodUID    types.UID `json:"podUID"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Container string    `json:"container"`
	// GPUs are its GPUs' UUIDs.
	GPUs  []string `json:"gpus"`
	Batch bool     `json:"batch"`
	// RequestMilli is its gpu-milli request.
	RequestMilli int64 `json:"requestMilli"`
	// SliceUs is the slice the agent asked (UNDERSTORY_TSG_TIMESLICE_US); Reason how it
	// was chosen.
	SliceUs uint64 `json:"sliceUs"`
	Reason  string `json:"reason"`
	// ReportDir is its report directory on the host.
	ReportDir string    `json:"reportDir"`
	Since     time.Time `json:"since"`
	// seen: the pod was in the agent's pod snapshot once.
	seen bool
}

// NewTimeslices returns the planner. It creates nothing yet: a container's report
// directory is made when the container is planned.
func NewTimeslices(o TimesliceOptions) (*Timeslices, error) {
	d := o.Directory
	if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" {
		return nil, fmt.Errorf("time-slice directory %q: not a clean absolute path: %w", d, ErrOptions)
	}
	return &Timeslices{policy: o.Policy, reports: filepath.Join(d, TimesliceReportsDir), library: o.Library,
		mpsOn: o.MPSOn, now: time.Now, gpus: map[string]*timesliceGPU{},
		clients: map[timesliceKey]*TimesliceClient{}}, nil
}

// Library is the installed shim on the host ("" : none).
func (t *Timeslices) Library() string { return t.library }

// pathSafePodUID says a pod UID may name a directory: 1..128 of [A-Za-z0-9_-], a
// letter or digit first (Kubernetes makes them RFC 4122 UUIDs; a static pod's is a hash).
func pathSafePodUID(s string) bool {
	if len(s) == 0 || len(s) > 128 || s[0] == '-' || s[0] == '_' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// dnsLabel says a container name is a DNS label (RFC 1123), as Kubernetes requires.
func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// TimesliceClient implements devices.TimeslicePlanner: it chooses req's slice, creates
// its report directory (emptied if the container had one: a restarted container's
// process IDs start again) and records the container.
func (t *Timeslices) TimesliceClient(req devices.TimesliceRequest) (devices.TimesliceClient, bool, error) {
	switch {
	case !pathSafePodUID(string(req.PodUID)):
		return devices.TimesliceClient{}, false, fmt.Errorf("pod UID %q: %w", req.PodUID, ErrTimesliceRequest)
	case !dnsLabel(req.Container):
		return devices.TimesliceClient{}, false, fmt.Errorf("container name %q: %w", req.Container, ErrTimesliceRequest)
	case len(req.GPUs) == 0:
		return devices.TimesliceClient{}, false, fmt.Errorf("pod %s/%s: no GPU: %w", req.Namespace, req.Name,
			ErrTimesliceRequest)
	case req.RequestMilli < 0:
		return devices.TimesliceClient{}, false, fmt.Errorf("pod %s/%s: gpu-milli request %d: %w", req.Namespace,
			req.Name, req.RequestMilli, ErrTimesliceRequest)
	case t.library == "":
		return devices.TimesliceClient{Why: "the time-slice shim is not installed on this node (see the agent's log)"},
			false, nil
	}
	c, why := t.plan(req)
	if why != "" {
		return devices.TimesliceClient{Why: why}, false, nil
	}
	dir, err := makeReportDir(t.reports, string(req.PodUID), req.Container)
	if err != nil {
		return devices.TimesliceClient{}, false, err
	}
	c.ReportDir = dir
	t.mu.Lock()
	// A container created again (a restart) is a new client: the newest record wins.
	t.clients[timesliceKey{req.PodUID, req.Container}] = c
	t.mu.Unlock()
	return devices.TimesliceClient{SliceUS: c.SliceUs, Library: t.library, ReportDir: dir}, true, nil
}

// plan chooses req's slice: the shortest of its GPUs' for batch (LS's is the same on
// every GPU). why is non-empty where it gets none.
func (t *Timeslices) plan(req devices.TimesliceRequest) (*TimesliceClient, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := &TimesliceClient{PodUID: req.PodUID, Namespace: req.Namespace, Name: req.Name, Container: req.Container,
		Batch: req.Batch, RequestMilli: req.RequestMilli, Since: t.now()}
	for _, g := range req.GPUs {
		uuid, info := t.gpuOf(g)
		switch {
		case uuid != "" && t.mpsOn != nil && t.mpsOn(uuid):
			return nil, fmt.Sprintf("GPU %d runs MPS (its clients share one context: slices do not apply)", g.Index)
		case info != nil && info.read && info.mig:
			return nil, fmt.Sprintf("GPU %d is in MIG mode (no per-context slices there)", g.Index)
		}
		in := t.input(uuid, info, req.PodUID, req.Container)
		if req.Batch {
			in.BatchRequestMilli = append(in.BatchRequestMilli, req.RequestMilli)
			in.BatchPods++
		} else {
			in.LSRequestMilli = append(in.LSRequestMilli, req.RequestMilli)
		}
		d := qos.ChooseGPUTimeslice(t.policy, in)
		us, reason := d.LSSliceUs, fmt.Sprintf("LS's slice on GPU %d", g.Index)
		if req.Batch {
			us, reason = d.BatchSliceUs, fmt.Sprintf("GPU %d: %s", g.Index, d.SliceReason)
		}
		if us == 0 {
			return nil, fmt.Sprintf("no slice for GPU %d (%s)", g.Index, d.Reason)
		}
		if c.SliceUs == 0 || us < c.SliceUs {
			c.SliceUs, c.Reason = us, reason
		}
		if uuid == "" {
			uuid = fmt.Sprintf("index-%d", g.Index)
		}
		c.GPUs = append(c.GPUs, uuid)
	}
	return c, ""
}

// gpuOf finds a GPU by UUID, else by index; t.mu is held.
func (t *Timeslices) gpuOf(d devices.GPU) (string, *timesliceGPU) {
	if d.UUID != "" {
		return d.UUID, t.gpus[d.UUID]
	}
	for uuid, g := range t.gpus {
		if g.index == d.Index {
			return uuid, g
		}
	}
	return "", nil
}

// input is the choice's input for a GPU from what the records and the Manager's steps
// know of it, leaving out the container (pod, ctr) being planned; t.mu is held. A GPU
// not read is taken as fully used by LS (demand unknown: the shortest batch slice).
func (t *Timeslices) input(uuid string, g *timesliceGPU, pod types.UID, ctr string) qos.GPUTimesliceInput {
	in := qos.GPUTimesliceInput{LSDemandPercent: math.NaN()}
	if g != nil {
		in.Index = g.index
		if g.everRead {
			in.LSDemandPercent = g.peak.Peak()
		}
		if g.lsProcs {
			in.Contexts = append(in.Contexts, qos.GPUTimesliceContext{Class: qos.ClassLS})
		}
	}
	batchPods := map[types.UID]bool{}
	for k, c := range t.clients {
		if (k.pod == pod && k.container == ctr) || !slices.Contains(c.GPUs, uuid) {
			continue
		}
		if c.Batch {
			in.BatchRequestMilli = append(in.BatchRequestMilli, c.RequestMilli)
			batchPods[k.pod] = true
		} else {
			in.LSRequestMilli = append(in.LSRequestMilli, c.RequestMilli)
		}
	}
	in.BatchPods = len(batchPods)
	return in
}

// requests returns the gpu-milli requests of the LS and batch containers recorded on a
// GPU and the number of batch pods among them.
func (t *Timeslices) requests(uuid string) (ls, batch []int64, batchPods int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.input(uuid, nil, "", "")
	return in.LSRequestMilli, in.BatchRequestMilli, in.BatchPods
}

// Clients returns the containers given the shim, sorted by pod UID and container.
func (t *Timeslices) Clients() []TimesliceClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TimesliceClient, 0, len(t.clients))
	for _, c := range t.clients {
		cc := *c
		cc.GPUs = slices.Clone(c.GPUs)
		out = append(out, cc)
	}
	slices.SortFunc(out, func(a, b TimesliceClient) int {
		if c := strings.Compare(string(a.PodUID), string(b.PodUID)); c != 0 {
			return c
		}
		return strings.Compare(a.Container, b.Container)
	})
	return out
}

// timesliceGPUObs is one GPU as the Manager saw it at a step.
type timesliceGPUObs struct {
	index   int
	uuid    string
	read    bool // healthy
	mig     bool
	lsUtil  float64
	lsProcs bool
}

// observe is the Manager's step: the GPUs (those absent are forgotten), LS's demand on
// each. It allocates nothing once the GPUs are known.
func (t *Timeslices) observe(now time.Time, gpus []timesliceGPUObs, window time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	syncGPUs(t.gpus, gpus, func(o timesliceGPUObs) string { return o.uuid }, func(g *timesliceGPU, o timesliceGPUObs) {
		g.index, g.read = o.index, o.read
		if !o.read {
			return // its demand and MIG mode stand as last read
		}
		g.everRead, g.mig, g.lsProcs = true, o.mig, o.lsProcs
		g.peak.Observe(now, o.lsUtil, window)
	})
}

// peak is LS's demand peak on a GPU, NaN where it was never read.
func (t *Timeslices) peak(uuid string) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if g := t.gpus[uuid]; g != nil && g.everRead {
		return g.peak.Peak()
	}
	return math.NaN()
}

// records drops the records of pods that left (or never appeared within
// partitionPodGrace), removing their report directories, sweeps the reports
// directory of pods nothing records at most every timesliceSweepEvery, and returns the
// records left by container.
func (t *Timeslices) records(now time.Time, alive func(types.UID) bool) map[timesliceKey]TimesliceClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[timesliceKey]TimesliceClient, len(t.clients))
	recorded := map[types.UID]bool{}
	for k, c := range t.clients {
		switch {
		case alive(k.pod):
			c.seen = true
		case c.seen || now.Sub(c.Since) > partitionPodGrace:
			delete(t.clients, k)
			_ = os.RemoveAll(c.ReportDir)
			_ = os.Remove(filepath.Dir(c.ReportDir)) // the pod's, once empty
			continue
		}
		recorded[k.pod] = true
		out[k] = *c
	}
	if now.Sub(t.lastSweep) >= timesliceSweepEvery || now.Before(t.lastSweep) {
		t.lastSweep = now
		sweepReports(t.reports, now, func(uid types.UID) bool { return recorded[uid] || alive(uid) })
	}
	return out
}

// maxSweepEntries bounds the entries of the reports directory one sweep reads.
const maxSweepEntries = 4096

// sweepReports removes the directories of reports whose pod is not kept and that are
// older than timesliceDirGrace (the plugin may be creating one for a pod the agent's
// snapshot does not list yet). Only the agent writes there: a pod's directory is
// root's, 0700; its containers' directories below are what tenants write.
func sweepReports(reports string, now time.Time, keep func(types.UID) bool) {
	f, err := os.Open(reports)
	if err != nil {
		return
	}
	names, _ := f.Readdirnames(maxSweepEntries)
	_ = f.Close()
	for _, n := range names {
		if keep(types.UID(n)) {
			continue
		}
		p := filepath.Join(reports, n)
		fi, err := os.Lstat(p)
		if err != nil || now.Sub(fi.ModTime()) < timesliceDirGrace {
			continue
		}
		_ = os.RemoveAll(p)
	}
}

// makeReportDir makes reports/<pod>/<ctr> for a container's shim: the reports and pod
// directories root's and 0700 (the tenant sees only its own directory, through the
// mount), the container's emptied if it exists and made 1733 (sticky, every user of the
// container may create its tsg-<pid>.log, none may list or remove another's).
func makeReportDir(reports, pod, ctr string) (string, error) {
	podDir := filepath.Join(reports, pod)
	if err := os.MkdirAll(podDir, 0o700); err != nil {
		return "", fmt.Errorf("time-slice report directory: %w", err)
	}
	dir := filepath.Join(podDir, ctr)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("emptying time-slice report directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("time-slice report directory: %w", err)
	}
	if err := os.Chmod(dir, os.ModeSticky|0o733); err != nil {
		return "", fmt.Errorf("time-slice report directory: %w", err)
	}
	return dir, nil
}
