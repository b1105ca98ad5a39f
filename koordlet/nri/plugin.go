package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/timeslice"
	"github.com/understory/understory/qos"
)

// Plugin is the agent's NRI plugin (mode nri). At container creation it
//   - classifies the container's pod exactly as the agent does: qos.Classify on the
//     pod from the agent's pod source (Options.Pods), waiting for a pod the source
//     does not list yet (classifyPod);
//   - moves the containers of batch pods below the agent's tier, so that the tier's
//     single quota, weight and SCHED_IDLE bound all batch work at once;
//   - with GPU handling on (Options.Pods set), gives a container that requests
//     shared GPU (understory.io/gpu-milli) exactly the devices of the pod's
//     understory.io/gpu-devices annotation (package koordlet/gpu/devices), as CDI
//     devices or NVIDIA_VISIBLE_DEVICES, and refuses it (the runtime fails the
//     container with the reason, and the pod gets a Warning Event) when that cannot
//     be done: no annotation, a malformed one, a device the node does not have, no
//     GPU inventory;
//   - with the agent's MPS on (Options.MPS set), makes a GPU container (shared or
//     whole GPUs) an MPS client when the planner gives it a partition on each of
//     its GPUs: CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
//     CUDA_MPS_CLIENT_PRIORITY and, for batch, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
//     (overriding the pod's), the pipe directory mounted
//     read-only and the server's private shm directory at /dev/shm
//     (devices.DecideMPS). A batch container whose planning fails is refused; one
//     that is no client is pointed away from every MPS daemon
//     (devices.NoMPSPipeDirectory);
//   - with GPU handling on, pins NVIDIA_VISIBLE_DEVICES of every container to what
//     it was given: its GPUs' UUIDs, or "void" for none (devices.Visible), so that
//     an image's or a tenant's "all" adds no device where the NVIDIA runtime runs in
//     legacy mode; only pods of nri.trustedVisibilityNamespaces keep a value their
//     own spec sets;
//   - with the per-context time slices on (Options.Timeslice set,
//     gpu.timeslice.enabled), gives a shared-GPU container that is no MPS client, on
//     GPUs that do not run MPS, the time-slice shim (devices.DecideTimeslice): the
//     library mounted read-only, LD_PRELOAD with the shim first, the slice the policy
//     gives its class on its GPU, and its own report directory mounted read-write. A
//     container the planner gives no shim starts without it, never refused.
//
// Without a pod source it only moves batch containers, classified from the sandbox.
type Plugin struct {
	// driver and tier say where batch containers go: below the tier, named as
	// kubelet names cgroups under its driver.
	driver cgroups.Driver
	tier   string
	log    *slog.Logger

	pods     PodLister
	gpus     GPUInventory
	events   EventRecorder
	gpuCfg   devices.Config
	podWait  time.Duration
	mps      devices.MPSPlanner
	mpsSetup devices.MPSSetup
	tsg      devices.TimeslicePlanner
	// trustedVisibility are the namespaces whose pods keep a spec-set
	// NVIDIA_VISIBLE_DEVICES (nri.trustedVisibilityNamespaces).
	trustedVisibility []string
}

var _ stub.CreateContainerInterface = (*Plugin)(nil)

// PodLister is the agent's pod source as the NRI plugin reads it (podsource.Kube or
// podsource.Static): NRI's PodSandbox carries the pod's annotations but not its
// containers' resource requests.
type PodLister interface {
	List() []*corev1.Pod
}

// GPUInventory is the node's GPUs as NVML lists them (the GPU collector); empty when
// NVML is off or has not been read yet.
type GPUInventory interface {
	GPUs() []devices.GPU
}

// EventRecorder records Kubernetes events on pods (podsource.EventSink, or only logs
// them without a cluster).
type EventRecorder interface {
	Warn(pod *corev1.Pod, reason, message string)
}

// normalEvents is an event recorder that also records Normal events
// (podsource.EventSink, podsource.LogSink); a recorder without it only logs them.
type normalEvents interface {
	Normal(pod *corev1.Pod, reason, message string)
}

// DefaultPodWait bounds how long CreateContainer waits for a pod that the pod
// source does not list yet. NRI gives a plugin 2 s per request by default and, by
// default, drops a plugin that exceeds it.
const DefaultPodWait = 500 * time.Millisecond

// podPoll is how often the pod source is re-listed while waiting.
const podPoll = 20 * time.Millisecond

// errPodUnknown means a container's pod is not (yet) in the agent's pod source.
var errPodUnknown = errors.New("pod not known to the node agent yet")

// Options are the NRI plugin's optional collaborators. The zero value handles no GPU.
type Options struct {
	// Pods is the agent's pod source, which classification reads (the agent's).
	// Nil turns GPU handling off: containers requesting understory.io/gpu-milli are
	// then left as they are (and get no GPU from the agent), and pods are classified
	// from the sandbox's labels, annotations and cgroup parent.
	Pods PodLister
	// GPUs is the node's GPU inventory. Nil, like an empty inventory, refuses every
	// container that requests understory.io/gpu-milli ("no GPU inventory on this node").
	GPUs GPUInventory
	// Events records a Warning Event on a pod whose container was refused; nil only logs.
	Events EventRecorder
	// GPU chooses CDI devices or NVIDIA_VISIBLE_DEVICES (devices.Config's zero value:
	// CDI names by UUID).
	GPU devices.Config
	// PodWait replaces DefaultPodWait; non-positive values keep the default.
	PodWait time.Duration
	// MPS plans the MPS clients (the agent: its GPU manager's partitions). Nil: the
	// agent's MPS is off and no container's MPS environment is touched.
	MPS devices.MPSPlanner
	// MPSSetup is the clients' /dev/shm source and UID (gpu.mps).
	MPSSetup devices.MPSSetup
	// Timeslice plans the time-slice shim of shared-GPU containers (the agent: its GPU
	// manager's Timeslices). Nil: gpu.timeslice off, no container gets the shim.
	Timeslice devices.TimeslicePlanner
}

// New returns the plugin for cfg's driver, kubelet root and tier,
// with the collaborators of opts.
func New(cfg config.Config, log *slog.Logger, opts Options) (*Plugin, error) {
	naming, tier, err := cfg.Cgroups()
	if err != nil {
		return nil, err
	}
	if err := opts.GPU.Validate(); err != nil {
		return nil, fmt.Errorf("NRI GPU devices: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wait := opts.PodWait
	if wait <= 0 {
		wait = DefaultPodWait
	}
	if d := opts.MPSSetup.ShmDir; d != "" && (!path.IsAbs(d) || path.Clean(d) != d) {
		return nil, fmt.Errorf("NRI MPS shm directory %q: not a clean absolute path: %w", d, config.ErrInvalid)
	}
	return &Plugin{driver: naming.Driver, tier: tier, log: log, pods: opts.Pods, gpus: opts.GPUs, events: opts.Events,
		gpuCfg: opts.GPU.WithDefaults(), podWait: wait, mps: opts.MPS, mpsSetup: opts.MPSSetup, tsg: opts.Timeslice,
		trustedVisibility: slices.Clone(cfg.NRI.TrustedVisibilityNamespaces)}, nil
}

// CreateContainer gives shared-GPU containers their devices (or refuses them), makes
// GPU containers MPS clients, pins every container's device visibility, and rewrites
// the cgroups path of batch containers.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	orig := ctr.GetLinux().GetCgroupsPath()
	kpod, batch := p.classifyPod(ctx, pod)
	var adj *api.ContainerAdjustment
	if p.pods != nil {
		var err error
		if adj, err = p.gpuAdjust(pod, kpod, ctr, batch); err != nil {
			return nil, nil, err
		}
	}
	// Only a known batch pod moves below the tier: one unknown to the pod source (nil)
	// stays where kubelet put it.
	if !batch || kpod == nil || orig == "" {
		return adj, nil, nil
	}
	newPath, err := tierContainerPath(p.driver, p.tier, pod.GetUid(), orig)
	if err != nil {
		// Fail open: a container that cannot be moved still runs, under kubelet's limits.
		p.log.Error("cannot place batch container below the tier", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "err", err)
		return adj, nil, nil
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	adj.SetLinuxCgroupsPath(newPath)
	p.log.Info("batch container placed below the tier", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "cgroupsPath", newPath)
	return adj, nil, nil
}

// classifyPod classifies the container's pod as the agent does: qos.Classify on the
// pod from the agent's pod source (lookupPod waits for one it does not list yet).
// A pod still unknown after the wait gets the most restrictive treatment that
// cannot harm a pod of another class: MPS as batch, and its containers left where
// kubelet put them, where the agent, once its source lists the pod, bounds it in
// place if it is batch. Without a pod source (GPU handling off) the sandbox's labels,
// annotations and cgroup parent stand in for the pod. It returns the pod (nil when
// unknown) and whether it is treated as batch (an unknown one is, for MPS: a batch
// client's cap and priority, never LS's).
func (p *Plugin) classifyPod(ctx context.Context, sb *api.PodSandbox) (*corev1.Pod, bool) {
	who := sb.GetNamespace() + "/" + sb.GetName()
	var kpod *corev1.Pod
	if p.pods == nil {
		kpod = podFromSandbox(sb)
	} else if kpod = p.lookupPod(ctx, sb); kpod == nil {
		p.log.Warn("pod not in the agent's pod source in time; treated as batch for MPS, container left where kubelet put it",
			"pod", who, "uid", sb.GetUid(), "waited", p.podWait)
		return nil, true
	}
	class, err := qos.Classify(kpod)
	if err != nil {
		p.log.Warn("invalid QoS annotation", "pod", who, "class", class, "err", err)
	}
	return kpod, class == qos.ClassBatch
}

// gpuAdjust is the GPU part of a container's creation: its devices, its device
// visibility and its MPS client. kpod is the container's pod (nil: unknown to the
// pod source). Nil: nothing to change.
func (p *Plugin) gpuAdjust(sb *api.PodSandbox, kpod *corev1.Pod, ctr *api.Container,
	batch bool) (*api.ContainerAdjustment, error) {
	a, ok, err := p.gpuDevices(sb, kpod, ctr)
	if err != nil {
		return nil, err
	}
	var adj *api.ContainerAdjustment
	if ok {
		adj = &api.ContainerAdjustment{}
		for _, name := range a.CDIDevices {
			adj.AddCDIDevice(&api.CDIDevice{Name: name})
		}
		p.log.Info("GPU devices given to container", "pod", sb.GetNamespace()+"/"+sb.GetName(),
			"container", ctr.GetName(), "cdi", a.CDIDevices, "env", a.Env)
	}
	if v := p.visible(kpod, ctr, a.Devices); v != "" {
		if adj == nil {
			adj = &api.ContainerAdjustment{}
		}
		adj.AddEnv(devices.EnvVisibleDevices, v)
	}
	mpsOK := false
	if p.mps != nil {
		d, err := p.mpsClient(kpod, sb, ctr, batch, a.Devices)
		if err != nil {
			return adj, err
		}
		mpsOK = d.OK
		if d.Env != nil {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			for _, k := range []string{devices.EnvMPSPipeDirectory, devices.EnvMPSActiveThreadPercentage,
				devices.EnvMPSClientPriority, devices.EnvMPSPinnedDeviceMemLimit} {
				if v, set := d.Env[k]; set {
					adj.AddEnv(k, v)
				}
			}
			for _, m := range d.Mounts {
				// The pipe directory is bound without its submounts ("bind") and read-only:
				// clients connect to the daemon's socket, which needs no write access to the
				// mount, and cannot remove, replace or add anything there.
				opts := []string{"rbind", "rw", "nosuid", "nodev", "noexec"}
				if m.ReadOnly {
					opts = []string{"bind", "ro", "nosuid", "nodev", "noexec"}
				}
				adj.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
			}
		}
	}
	if p.tsg != nil && ok {
		adj = p.timesliceShim(sb, kpod, ctr, batch, a.Devices, mpsOK, adj)
	}
	return adj, nil
}

// timesliceShim gives a shared-GPU container the time-slice shim where the planner
// gives it a slice (devices.DecideTimeslice), adding to adj (made if nil). A container
// without one starts as it is: its contexts count as unconfirmed and the freeze
// protects LS.
func (p *Plugin) timesliceShim(sb *api.PodSandbox, kpod *corev1.Pod, ctr *api.Container, batch bool,
	gpus []devices.GPU, mpsClient bool, adj *api.ContainerAdjustment) *api.ContainerAdjustment {
	name := ctr.GetName()
	milli, _ := devices.GPURequest(kpod, name)
	d := devices.DecideTimeslice(p.tsg, devices.TimesliceContainer{Pod: kpod, Container: name, Batch: batch,
		GPUs: gpus, RequestMilli: milli, MPSClient: mpsClient, Env: ctr.GetEnv()})
	who := []any{"pod", sb.GetNamespace() + "/" + sb.GetName(), "container", name, "batch", batch}
	switch {
	case d.Err != nil:
		p.log.Warn("time-slice planning failed; container starts without the shim", append(who, "err", d.Err)...)
		if p.events != nil && kpod != nil {
			p.events.Warn(kpod, "GPUTimeslicePlanningFailed", fmt.Sprintf(
				"container %s starts without the GPU time-slice shim (the agent's freeze protects LS): %v", name, d.Err))
		}
		return adj
	case !d.OK:
		if d.Skipped != "" {
			p.log.Info("no time-slice shim", append(who, "gpus", gpuNames(gpus), "why", d.Skipped)...)
		}
		return adj
	}
	if adj == nil {
		adj = &api.ContainerAdjustment{}
	}
	for _, k := range []string{devices.EnvLDPreload, timeslice.EnvTimesliceUS, timeslice.EnvReport,
		timeslice.EnvReportMaxBytes} {
		adj.AddEnv(k, d.Env[k])
	}
	for _, m := range d.Mounts {
		// The library must stay executable (the loader maps it PROT_EXEC): no noexec.
		opts := []string{"bind", "ro", "nosuid", "nodev"}
		if !m.ReadOnly {
			opts = []string{"bind", "rw", "nosuid", "nodev", "noexec"}
		}
		adj.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
	}
	p.log.Info("GPU time-slice shim", append(who, "gpus", gpuNames(gpus), "sliceUs", d.Client.SliceUS,
		"reportDir", d.Client.ReportDir)...)
	p.normal(kpod, "GPUTimeslice", fmt.Sprintf("container %s runs with the GPU time-slice shim (LD_PRELOAD %s): "+
		"its contexts on GPU %s get a %d µs time slice, reported to the node agent", name,
		devices.ShimContainerPath, gpuNames(gpus), d.Client.SliceUS))
	return adj
}

// visible is the NVIDIA_VISIBLE_DEVICES value the container is pinned to
// (devices.Visible); "" leaves it. Only a pod of a trusted namespace, as the agent's
// pod source has it, keeps a value its own spec sets.
func (p *Plugin) visible(kpod *corev1.Pod, ctr *api.Container, shared []devices.GPU) string {
	return devices.Visible(devices.VisibleContainer{Pod: kpod, Container: ctr.GetName(), Shared: shared,
		Env: ctr.GetEnv(), CDI: cdiNames(ctr), CDIKind: p.gpuCfg.CDIKind, Inventory: p.inventory(),
		TrustSpec: kpod != nil && slices.Contains(p.trustedVisibility, kpod.Namespace)})
}

// inventory is the node's GPUs (none without an inventory).
func (p *Plugin) inventory() []devices.GPU {
	if p.gpus == nil {
		return nil
	}
	return p.gpus.GPUs()
}

// cdiNames are the names of the CDI devices the container already has (the device
// plugin's).
func cdiNames(ctr *api.Container) []string {
	var cdi []string
	for _, c := range ctr.GetCDIDevices() {
		cdi = append(cdi, c.GetName())
	}
	return cdi
}

// mpsClient decides the container's MPS client (devices.DecideMPS) on the devices
// it gets: the extender's (shared) or, for whole GPUs, the device plugin's as its
// environment and CDI devices name them. A refusal is returned as the runtime's
// error; the outcome is logged and recorded as an Event on the pod.
func (p *Plugin) mpsClient(kpod *corev1.Pod, sb *api.PodSandbox, ctr *api.Container, batch bool,
	shared []devices.GPU) (devices.MPSDecision, error) {
	name := ctr.GetName()
	in := devices.MPSContainer{Pod: kpod, Container: name, Batch: batch, Env: ctr.GetEnv()}
	if kpod != nil {
		milli, whole := devices.GPURequest(kpod, name)
		in.RequestMilli = milli
		switch {
		case len(shared) > 0:
			in.GPUs = shared
		case whole && p.gpus != nil:
			in.GPUs = devices.WholeGPUs(ctr.GetEnv(), cdiNames(ctr), p.gpuCfg.CDIKind, p.gpus.GPUs())
		}
		// The runtime's user (the image's USER resolved) where it reports one, else
		// the spec's runAsUser.
		if u := ctr.GetUser(); u != nil {
			in.UID, in.UIDKnown = int64(u.GetUid()), true
		} else {
			in.UID, in.UIDKnown = devices.ContainerUID(kpod, name)
		}
	}
	evPod := kpod
	if evPod == nil {
		evPod = podFromSandbox(sb)
	}
	d, err := devices.DecideMPS(p.mps, p.mpsSetup, in)
	if err != nil {
		return d, p.refuse(evPod, name, devices.Reason(err), err)
	}
	who := []any{"pod", evPod.Namespace + "/" + evPod.Name, "container", name, "batch", batch}
	switch {
	case d.OK:
		msg := fmt.Sprintf("container %s runs as an MPS client on GPU %s: %d %% of the SMs, client priority %d",
			name, gpuNames(in.GPUs), d.Client.ActiveThreadPercent, d.Client.Priority)
		if m := d.Client.PinnedMemLimitMiB; m > 0 {
			msg += fmt.Sprintf(", at most %d MiB of device memory per GPU", m)
		}
		p.log.Info("MPS client", append(who, "gpus", gpuNames(in.GPUs), "activeThreadPercent",
			d.Client.ActiveThreadPercent, "priority", d.Client.Priority, "memLimitMiB", d.Client.PinnedMemLimitMiB)...)
		p.normal(evPod, "MPSClient", msg)
	case d.Err != nil:
		p.log.Warn("MPS planning failed; LS container starts without MPS (time-sliced)", append(who, "err", d.Err)...)
		if p.events != nil {
			p.events.Warn(evPod, devices.Reason(d.Err), fmt.Sprintf(
				"container %s starts without MPS (time-sliced; the agent's freeze protects it): %v", name, d.Err))
		}
	case d.Skipped != "":
		msg := fmt.Sprintf("container %s is no MPS client (time-sliced): %s", name, d.Skipped)
		p.log.Info("no MPS client", append(who, "gpus", gpuNames(in.GPUs), "why", d.Skipped)...)
		p.normal(evPod, "NoMPSClient", msg)
	default:
		p.log.Info("batch container's MPS variables pointed away from every daemon", who...)
	}
	return d, nil
}

// normal records a Normal Event where the recorder can.
func (p *Plugin) normal(pod *corev1.Pod, reason, message string) {
	if n, ok := p.events.(normalEvents); ok {
		n.Normal(pod, reason, message)
	}
}

// gpuNames lists GPUs as "0 (GPU-...)" for messages.
func gpuNames(gs []devices.GPU) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%d (%s)", g.Index, g.UUID)
	}
	return strings.Join(parts, ", ")
}

// gpuDevices decides the container's GPU devices; kpod is its pod (nil when the pod
// source does not list it). A refusal is logged, recorded as an Event on the pod and
// returned as the error the runtime fails the container with.
func (p *Plugin) gpuDevices(sb *api.PodSandbox, kpod *corev1.Pod,
	ctr *api.Container) (devices.Assignment, bool, error) {
	if kpod == nil {
		if _, annotated := sb.GetAnnotations()[devices.AnnotationDevices]; !annotated {
			// Not placed on shared GPUs by the extender, as far as the runtime knows; a
			// gpu-milli pod without the annotation slips through only while the pod
			// source lags (it then gets no GPU from us, never every GPU in mode cdi).
			p.log.Debug("container's pod not in the pod source; no GPU handling", "pod",
				sb.GetNamespace()+"/"+sb.GetName(), "uid", sb.GetUid(), "container", ctr.GetName())
			return devices.Assignment{}, false, nil
		}
		// Fail closed: without the spec we cannot tell a shared-GPU container from a
		// whole-GPU one (the extender annotates both). kubelet retries the container
		// with back-off; the pod source catches up.
		return devices.Assignment{}, false, p.refuse(podFromSandbox(sb), ctr.GetName(), "PodUnknown",
			fmt.Errorf("uid %s (waited %v): %w", sb.GetUid(), p.podWait, errPodUnknown))
	}
	a, ok, err := devices.Decide(p.gpuCfg, kpod, ctr.GetName(), p.inventory())
	if err != nil {
		return devices.Assignment{}, false, p.refuse(kpod, ctr.GetName(), devices.Reason(err), err)
	}
	return a, ok, nil
}

// refuse logs the refusal, records it on the pod and returns the error for the runtime,
// which fails the container with its text (kubelet shows it as CreateContainerError).
func (p *Plugin) refuse(pod *corev1.Pod, ctr, reason string, err error) error {
	p.log.Warn("container refused: no safe GPU device or MPS choice", "pod", pod.Namespace+"/"+pod.Name,
		"container", ctr, "reason", reason, "err", err)
	if p.events != nil {
		p.events.Warn(pod, reason, fmt.Sprintf("container %s refused: %v", ctr, err))
	}
	return fmt.Errorf("understory: pod %s/%s container %s refused: %w", pod.Namespace, pod.Name, ctr, err)
}

// mirrorPodAnnotation marks the API server's mirror of a static pod: its UID is not the
// one kubelet runs the static pod (and its sandbox) with.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// lookupPod finds the container's pod in the pod source by UID (or, for a static pod,
// its mirror pod by namespace and name), waiting up to podWait (and not past ctx's
// deadline, less a margin for the reply) for the source to catch up with a pod the
// runtime already starts.
func (p *Plugin) lookupPod(ctx context.Context, sb *api.PodSandbox) *corev1.Pod {
	uid := types.UID(sb.GetUid())
	deadline := time.Now().Add(p.podWait)
	if d, ok := ctx.Deadline(); ok && d.Add(-200*time.Millisecond).Before(deadline) {
		deadline = d.Add(-200 * time.Millisecond)
	}
	for {
		for _, pod := range p.pods.List() {
			if pod.UID == uid && uid != "" {
				return pod
			}
			if _, mirror := pod.Annotations[mirrorPodAnnotation]; mirror && pod.Namespace == sb.GetNamespace() &&
				pod.Name == sb.GetName() {
				return pod
			}
		}
		if uid == "" || !time.Now().Add(podPoll).Before(deadline) {
			return nil
		}
		t := time.NewTimer(podPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Run connects to the runtime's NRI socket and serves until ctx ends, reconnecting
// (with backoff) when the runtime restarts.
func (p *Plugin) Run(ctx context.Context, socket string) error {
	backoff := time.Second
	for {
		s, err := stub.New(p, stub.WithPluginName("understory"), stub.WithPluginIdx("50"), stub.WithSocketPath(socket))
		if err != nil {
			return fmt.Errorf("creating NRI stub: %w", err)
		}
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		p.log.Warn("NRI connection ended; reconnecting", "socket", socket, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// podFromSandbox builds the fields of a Pod that the sandbox carries: its name, labels
// and annotations, and the Kubernetes QoS class from kubelet's cgroup parent. It
// lacks the containers' resource requests: it names a pod in Events and stands in
// for it only without a pod source. A parent that is no pod cgroup kubelet names
// (nor one that hides its QoS cgroup) leaves the pod Guaranteed.
func podFromSandbox(pod *api.PodSandbox) *corev1.Pod {
	q := corev1.PodQOSGuaranteed
	if pc, err := cgroups.ParsePodCgroupParent(pod.GetLinux().GetCgroupParent()); err == nil {
		switch pc.QOS {
		case cgroups.QOSBestEffort:
			q = corev1.PodQOSBestEffort
		case cgroups.QOSBurstable:
			q = corev1.PodQOSBurstable
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.GetName(), Namespace: pod.GetNamespace(), UID: types.UID(pod.GetUid()),
			Annotations: pod.GetAnnotations(), Labels: pod.GetLabels()},
		Status: corev1.PodStatus{QOSClass: q},
	}
}

// errBadCgroupsPath means the runtime gave a container cgroups path of an unknown form.
var errBadCgroupsPath = errors.New("unrecognised container cgroups path")

// tierContainerPath rewrites a container's runtime cgroups path to put it below the tier:
// the same container (and, under systemd, the runtime's scope prefix) in the pod's
// cgroup below the tier. cgroupfs paths look like "/kubepods/besteffort/pod<uid>/<id>";
// systemd ones like "kubepods-besteffort-pod<uid_>.slice:cri-containerd:<id>".
func tierContainerPath(d cgroups.Driver, tier, uid, orig string) (string, error) {
	podCg, err := cgroups.TierPodPath(d, tier, uid)
	if err != nil {
		return "", err
	}
	rc, err := cgroups.ParseContainerCgroupsPath(d, orig)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errBadCgroupsPath, err)
	}
	return cgroups.ContainerCgroupsPath(d, podCg, rc.Prefix, rc.ID)
}
