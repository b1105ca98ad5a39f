package gpureal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/understory/understory/contract"
)

// runtime is the container runtime's side of NRI (github.com/containerd/nri's
// pkg/adaptation, what containerd embeds) on a unix socket the agent's plugin connects
// to. The driver calls it as containerd would around each stand-in: RunPodSandbox,
// CreateContainer (whose adjustments it applies), StartContainer, and on teardown
// StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox.
type nriRuntime struct {
	rt     *nri.Adaptation
	socket string
}

// startRuntime listens on dir/nri.sock. No plugin is registered until an agent connects.
func startRuntime(dir string) (*nriRuntime, error) {
	socket := filepath.Join(dir, "nri.sock")
	if len(socket) > 100 { // sun_path holds 108 bytes
		return nil, fmt.Errorf("NRI socket path %q too long for a unix socket", socket)
	}
	rt, err := nri.New("understory-gpureal", "0.0.1",
		func(ctx context.Context, cb nri.SyncCB) error { _, err := cb(ctx, nil, nil); return err },
		func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil },
		nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nri.WithSocketPath(socket))
	if err != nil {
		return nil, err
	}
	if err := rt.Start(); err != nil {
		return nil, err
	}
	return &nriRuntime{rt: rt, socket: socket}, nil
}

func (r *nriRuntime) stop() { r.rt.Stop() }

// waitPlugin waits until the agent's plugin answers: a probe batch container (never
// started, its pod unknown to the agent) comes back adjusted.
func (r *nriRuntime) waitPlugin(ctx context.Context, kubeletRoot string, timeout time.Duration) error {
	const probeUID = "00000000-0000-4000-8000-00000000beef"
	sb := &api.PodSandbox{Id: "probe", Name: "probe", Namespace: benchNamespace, Uid: probeUID,
		Annotations: map[string]string{contract.AnnotationQOSClass: "batch"},
		Linux:       &api.LinuxPodSandbox{CgroupParent: kubeletRoot + "/kubepods/besteffort/pod" + probeUID}}
	// The probe's pod is in no pod source: an agent that classifies by its pod source
	// leaves it in place but pins its image's "all" to no GPU; one without a pod
	// source moves it below the tier. Either adjustment says the plugin is there.
	ctr := &api.Container{Id: "probe", PodSandboxId: "probe", Name: "probe",
		Env:   []string{"NVIDIA_VISIBLE_DEVICES=all"},
		Linux: &api.LinuxContainer{CgroupsPath: sb.Linux.CgroupParent + "/probe"}}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := r.create(ctx, sb, ctr)
		if err == nil && (resp.GetAdjust().GetLinux().GetCgroupsPath() != "" || len(resp.GetAdjust().GetEnv()) > 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent's NRI plugin did not register on %s within %v (last: %v)", r.socket, timeout,
				err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *nriRuntime) create(ctx context.Context, sb *api.PodSandbox, ctr *api.Container) (*api.CreateContainerResponse,
	error) {
	// Plugins that connect meanwhile are synchronised before or after, never during.
	b := r.rt.BlockPluginSync()
	defer b.Unblock()
	return r.rt.CreateContainer(ctx, &api.CreateContainerRequest{Pod: sb, Container: ctr})
}

// container is one container the driver created through NRI.
type container struct {
	sb     *api.PodSandbox
	ctr    *api.Container
	report containerReport
	// cgroup is the container's cgroup relative to the hierarchy root, after NRI.
	cgroup string
	// env is what NRI set (and removed) for the process.
	setEnv    map[string]string
	removeEnv []string
	// mounts are NRI's bind mounts, which the launcher makes in the stand-in's own
	// mount namespace.
	mounts []launchMount
}

// containerReport is what NRI did to a container and what the driver applied.
type containerReport struct {
	Pod   string `json:"pod"`
	Class string `json:"class"`
	// CgroupsPath is the runtime's path; Adjusted the plugin's, when it moved it.
	CgroupsPath string            `json:"cgroupsPath"`
	Adjusted    string            `json:"adjustedCgroupsPath,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	EnvRemoved  []string          `json:"envRemoved,omitempty"`
	// Mounts are the plugin's mounts (source → destination): the launcher makes bind
	// mounts in the stand-in's own mount namespace; others are listed in NotApplied.
	Mounts     []string `json:"mounts,omitempty"`
	CDIDevices []string `json:"cdiDevices,omitempty"`
	NotApplied []string `json:"notApplied,omitempty"`
	Updates    int      `json:"updatesToOtherContainers,omitempty"`
	Refused    string   `json:"refused,omitempty"`
	PID        int      `json:"pid,omitempty"`
	// UID is the user the stand-in ran as (its /proc status once ready): the one
	// reported to NRI.
	UID int `json:"uid"`
	// Ready is what the stand-in reported when ready (device, the CUDA_MPS_* it saw).
	Device string            `json:"device,omitempty"`
	SawEnv map[string]string `json:"sawEnv,omitempty"`
	WarmMS float64           `json:"warmMs,omitempty"`
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createContainer runs the pod's sandbox and creates its container through NRI;
// podParent is kubelet's cgroup parent of the pod; uid the user the stand-in runs as.
func (r *nriRuntime) createContainer(ctx context.Context, p podSpec, podParent string, uid int) (*container, error) {
	kpod := p.pod()
	sb := &api.PodSandbox{Id: "sb-" + string(p.UID), Name: kpod.Name, Namespace: kpod.Namespace, Uid: string(p.UID),
		Annotations: kpod.Annotations, Labels: kpod.Labels, Linux: &api.LinuxPodSandbox{CgroupParent: podParent}}
	id := randomID()
	// The user the stand-in runs as (the launcher switches to it), as a runtime reports
	// the image's USER resolved: the agent makes only containers of its MPS client UID
	// MPS clients.
	ctr := &api.Container{Id: id, PodSandboxId: sb.Id, Name: containerName,
		User:  &api.User{Uid: uint32(uid), Gid: uint32(uid)},
		Linux: &api.LinuxContainer{CgroupsPath: podParent + "/" + id}}
	c := &container{sb: sb, ctr: ctr, report: containerReport{Pod: kpod.Name, Class: string(p.Class),
		CgroupsPath: ctr.Linux.CgroupsPath}}
	if err := r.rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: sb}); err != nil {
		return c, fmt.Errorf("RunPodSandbox %s: %w", kpod.Name, err)
	}
	resp, err := r.create(ctx, sb, ctr)
	if err != nil {
		c.report.Refused = err.Error()
		return c, fmt.Errorf("CreateContainer %s: %w", kpod.Name, err)
	}
	c.apply(resp)
	return c, nil
}

// apply takes the plugin's adjustments: the cgroups path, the environment and bind
// mounts are applied (the launcher makes the mounts in the stand-in's own mount
// namespace: the MPS pipe directory read-only, the shm directory at /dev/shm); other
// mounts, CDI devices and anything else are reported as not applied (the stand-ins are
// host processes).
func (c *container) apply(resp *api.CreateContainerResponse) {
	adj := resp.GetAdjust()
	c.report.Updates = len(resp.GetUpdate())
	c.cgroup = c.ctr.Linux.CgroupsPath
	if p := adj.GetLinux().GetCgroupsPath(); p != "" {
		c.cgroup, c.report.Adjusted = p, p
	}
	c.setEnv = map[string]string{}
	for _, kv := range adj.GetEnv() {
		if k, removed := api.IsMarkedForRemoval(kv.Key); removed {
			c.removeEnv = append(c.removeEnv, k)
			continue
		}
		c.setEnv[kv.Key] = kv.Value
	}
	if len(c.setEnv) > 0 {
		c.report.Env = c.setEnv
	}
	c.report.EnvRemoved = c.removeEnv
	for _, m := range adj.GetMounts() {
		s := m.GetSource() + " -> " + m.GetDestination()
		c.report.Mounts = append(c.report.Mounts, s)
		if m.GetType() != "bind" {
			c.report.NotApplied = append(c.report.NotApplied, "mount "+s)
			continue
		}
		c.mounts = append(c.mounts, launchMount{Source: m.GetSource(), Destination: m.GetDestination(),
			ReadOnly: slices.Contains(m.GetOptions(), "ro")})
	}
	for _, d := range adj.GetCDIDevices() {
		c.report.CDIDevices = append(c.report.CDIDevices, d.GetName())
		c.report.NotApplied = append(c.report.NotApplied, "CDI device "+d.GetName())
	}
	c.report.NotApplied = append(c.report.NotApplied, otherAdjustments(adj)...)
	sort.Strings(c.report.NotApplied)
}

// otherAdjustments names the adjustment fields the driver does not apply.
func otherAdjustments(adj *api.ContainerAdjustment) []string {
	var out []string
	if len(adj.GetAnnotations()) > 0 {
		out = append(out, "annotations")
	}
	if h := adj.GetHooks(); h != nil && (len(h.GetPrestart()) > 0 || len(h.GetCreateRuntime()) > 0 ||
		len(h.GetCreateContainer()) > 0 || len(h.GetStartContainer()) > 0 || len(h.GetPoststart()) > 0 ||
		len(h.GetPoststop()) > 0) {
		out = append(out, "hooks")
	}
	if len(adj.GetRlimits()) > 0 {
		out = append(out, "rlimits")
	}
	if len(adj.GetArgs()) > 0 {
		out = append(out, "args")
	}
	l := adj.GetLinux()
	if len(l.GetDevices()) > 0 {
		out = append(out, "linux devices")
	}
	if l.GetResources() != nil {
		out = append(out, "linux resources")
	}
	if l.GetOomScoreAdj() != nil {
		out = append(out, "oom score")
	}
	return slices.Clip(out)
}

// started tells the plugins the container runs (as containerd does after the task
// starts).
func (r *nriRuntime) started(ctx context.Context, c *container) error {
	return r.rt.StartContainer(ctx, &api.StartContainerRequest{Pod: c.sb, Container: c.ctr})
}

// remove stops and removes the container and its sandbox, as containerd does.
func (r *nriRuntime) remove(ctx context.Context, c *container) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	_, err := r.rt.StopContainer(ctx, &api.StopContainerRequest{Pod: c.sb, Container: c.ctr})
	keep(err)
	keep(r.rt.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: c.sb, Container: c.ctr}))
	keep(r.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: c.sb}))
	keep(r.rt.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: c.sb}))
	return first
}
