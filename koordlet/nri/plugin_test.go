package nri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu/devices"
)

func TestTierContainerPath(t *testing.T) {
	t.Parallel()
	const uid = "0b5e6f1c-1111-4222-8333-444455556666"
	const esc = "0b5e6f1c_1111_4222_8333_444455556666"
	for _, tc := range []struct {
		name   string
		d      cgroups.Driver
		root   string
		parent string
		orig   string
		want   string
		err    bool
	}{
		{"cgroupfs kubepods tier", cgroups.DriverCgroupfs, "/", config.TierParentKubepods,
			"/kubepods/besteffort/pod" + uid + "/abc123",
			"/kubepods/understory-batch/pod" + uid + "/abc123", false},
		{"cgroupfs besteffort tier", cgroups.DriverCgroupfs, "/", config.TierParentBestEffort,
			"/kubepods/besteffort/pod" + uid + "/abc123",
			"/kubepods/besteffort/understory-batch/pod" + uid + "/abc123", false},
		{"systemd kubepods tier", cgroups.DriverSystemd, "/", config.TierParentKubepods,
			"kubepods-besteffort-pod" + esc + ".slice:cri-containerd:abc123",
			"kubepods-understory_batch-pod" + esc + ".slice:cri-containerd:abc123", false},
		// Below kind's --cgroup-root /kubelet.
		{"cgroupfs kind root", cgroups.DriverCgroupfs, "/kubelet", config.TierParentKubepods,
			"/kubelet/kubepods/besteffort/pod" + uid + "/abc123",
			"/kubelet/kubepods/understory-batch/pod" + uid + "/abc123", false},
		{"systemd kind root kubepods tier", cgroups.DriverSystemd, "/kubelet", config.TierParentKubepods,
			"kubelet-kubepods-besteffort-pod" + esc + ".slice:cri-containerd:abc123",
			"kubelet-kubepods-understory_batch-pod" + esc + ".slice:cri-containerd:abc123", false},
		{"systemd kind root besteffort tier", cgroups.DriverSystemd, "/kubelet", config.TierParentBestEffort,
			"kubelet-kubepods-besteffort-pod" + esc + ".slice:crio:abc123",
			"kubelet-kubepods-besteffort-understory_batch-pod" + esc + ".slice:crio:abc123", false},
		{"systemd malformed", cgroups.DriverSystemd, "/", config.TierParentKubepods, "kubepods.slice", "", true},
		{"cgroupfs relative", cgroups.DriverCgroupfs, "/", config.TierParentKubepods, "kubepods/x", "", true},
		{"cgroupfs dotdot", cgroups.DriverCgroupfs, "/", config.TierParentKubepods, "/kubepods/../x", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tier, err := config.TierCgroup(tc.d, tc.root, tc.parent, config.DefaultTierName)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tierContainerPath(tc.d, tier, uid, tc.orig)
			if tc.err {
				if !errors.Is(err, errBadCgroupsPath) {
					t.Fatalf("got %q, %v; want errBadCgroupsPath", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("tierContainerPath = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := tierContainerPath(cgroups.DriverCgroupfs, "kubepods/understory-batch", "../../etc", "/kubepods/x/y"); !errors.Is(err, cgroups.ErrInvalidPath) {
		t.Fatalf("an escaping UID was accepted: %v", err)
	}
}

func TestNRIPluginMovesOnlyBatch(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	p, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := &api.Container{Name: "main", Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/podu1/c1"}}
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		labels map[string]string
		parent string
		want   string
	}{
		{"batch annotation", map[string]string{"understory.io/qos-class": "batch"}, nil, "/kubepods/besteffort/podu1", "/kubepods/understory-batch/podu1/c1"},
		{"koordinator BE label", nil, map[string]string{"koordinator.sh/qosClass": "BE"}, "/kubepods/besteffort/podu1", "/kubepods/understory-batch/podu1/c1"},
		{"plain besteffort", nil, nil, "/kubepods/besteffort/podu1", ""},
		{"LS", map[string]string{"understory.io/qos-class": "LS"}, nil, "/kubepods/burstable/podu1", ""},
		{"invalid value stays put", map[string]string{"understory.io/qos-class": "gold"}, nil, "/kubepods/besteffort/podu1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &api.PodSandbox{Name: "p", Namespace: "ns", Uid: "u1", Annotations: tc.ann, Labels: tc.labels,
				Linux: &api.LinuxPodSandbox{CgroupParent: tc.parent}}
			adj, upd, err := p.CreateContainer(context.Background(), pod, ctr)
			if err != nil || upd != nil {
				t.Fatalf("CreateContainer: %v, %v", upd, err)
			}
			got := ""
			if adj != nil && adj.Linux != nil {
				got = adj.Linux.CgroupsPath
			}
			if got != tc.want {
				t.Fatalf("cgroups path = %q, want %q", got, tc.want)
			}
		})
	}
}

// nriPods is a pod source for the NRI plugin; a pod can be held back until a time.
type nriPods struct {
	mu    sync.Mutex
	pods  []*corev1.Pod
	after map[types.UID]time.Time
}

func (s *nriPods) List() []*corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range s.pods {
		if t, ok := s.after[p.UID]; ok && time.Now().Before(t) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func (s *nriPods) add(p *corev1.Pod, visibleAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.after == nil {
		s.after = map[types.UID]time.Time{}
	}
	s.pods = append(s.pods, p)
	s.after[p.UID] = time.Now().Add(visibleAfter)
}

type gpuList []devices.GPU

func (g gpuList) GPUs() []devices.GPU { return g }

type nriEvent struct{ uid, reason, message string }

type nriEvents struct {
	mu  sync.Mutex
	evs []nriEvent
}

func (e *nriEvents) Warn(pod *corev1.Pod, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, nriEvent{string(pod.UID), reason, message})
}

func (e *nriEvents) forPod(uid string) []nriEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []nriEvent
	for _, ev := range e.evs {
		if ev.uid == uid {
			out = append(out, ev)
		}
	}
	return out
}

// nriRuntime is NRI's own runtime side (pkg/adaptation, what containerd embeds) on a
// unix socket, with the agent's plugin connected through pkg/stub by Plugin.Run.
type nriRuntime struct {
	t   *testing.T
	rt  *nri.Adaptation
	seq atomic.Int64
}

func startNRI(t *testing.T, opts Options) *nriRuntime {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	if len(socket) > 100 { // sun_path holds 108 bytes
		t.Fatalf("socket path %q too long for a unix socket", socket)
	}
	rt, err := nri.New("understory-test", "0.0.1",
		func(ctx context.Context, cb nri.SyncCB) error { _, err := cb(ctx, nil, nil); return err },
		func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil },
		nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nri.WithSocketPath(socket))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := New(config.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, socket) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Plugin.Run = %v after cancel", err)
		}
		rt.Stop()
	})
	r := &nriRuntime{t: t, rt: rt}
	// The plugin is registered once a batch container comes back moved below the tier
	// (the plugin classifies the pods its source lists).
	if src, ok := opts.Pods.(*nriPods); ok {
		src.add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "ns", UID: "probe-uid",
			Annotations: map[string]string{"understory.io/qos-class": "batch"}}}, 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		sb := &api.PodSandbox{Id: "probe", Name: "probe", Namespace: "ns", Uid: "probe-uid",
			Annotations: map[string]string{"understory.io/qos-class": "batch"},
			Linux:       &api.LinuxPodSandbox{CgroupParent: "/kubepods/besteffort/podprobe-uid"}}
		resp, err := r.create(sb, "probe", nil)
		if err == nil && resp.GetAdjust().GetLinux().GetCgroupsPath() != "" {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin did not register with the runtime: %v, %v", resp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// create sends the runtime's CreateContainer for a container of sb, as containerd does.
func (r *nriRuntime) create(sb *api.PodSandbox, name string, env []string) (*api.CreateContainerResponse, error) {
	b := r.rt.BlockPluginSync()
	defer b.Unblock()
	id := fmt.Sprintf("ctr%d", r.seq.Add(1))
	cgroups := "/kubepods/besteffort/pod" + sb.Uid + "/" + id
	return r.rt.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: sb,
		Container: &api.Container{Id: id, PodSandboxId: sb.Id, Name: name, Env: env,
			Linux: &api.LinuxContainer{CgroupsPath: cgroups}}})
}

const (
	nriUUID0 = "GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	nriUUID1 = "GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b"
)

var nriInventory = gpuList{{Index: 0, UUID: nriUUID0}, {Index: 1, UUID: nriUUID1}}

// nriGPUPod is a pod whose container "main" requests gpu-milli (devices annotated when
// devs is not "-") and whose "sidecar" requests nothing; batch pods are also moved.
func nriGPUPod(uid, devs string, batch bool) (*corev1.Pod, *api.PodSandbox) {
	ann := map[string]string{}
	if devs != "-" {
		ann[devices.AnnotationDevices] = devs
	}
	if batch {
		ann["understory.io/qos-class"] = "batch"
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid, Namespace: "ml", UID: types.UID(uid),
		Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "main", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{devices.ResourceGPUMilli: resource.MustParse("300")}}},
			{Name: "sidecar"},
		}}}
	sb := &api.PodSandbox{Id: "sb-" + uid, Name: pod.Name, Namespace: pod.Namespace, Uid: uid, Annotations: ann,
		Linux: &api.LinuxPodSandbox{CgroupParent: "/kubepods/besteffort/pod" + uid}}
	return pod, sb
}

func envOf(adj *api.ContainerAdjustment) map[string]string {
	out := map[string]string{}
	for _, kv := range adj.GetEnv() {
		out[kv.Key] = kv.Value
	}
	return out
}

func cdiOf(adj *api.ContainerAdjustment) []string {
	var out []string
	for _, d := range adj.GetCDIDevices() {
		out = append(out, d.Name)
	}
	return out
}

// TestNRIGPUDevices drives the plugin through NRI's runtime adaptation: shared-GPU
// containers get exactly their annotated devices (CDI or NVIDIA_VISIBLE_DEVICES),
// everything unsafe is refused with a reason and an Event, other containers are left
// alone.
func TestNRIGPUDevices(t *testing.T) {
	t.Parallel()
	for _, mode := range []devices.Mode{devices.ModeCDI, devices.ModeEnv} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pods, events := &nriPods{}, &nriEvents{}
			r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, Events: events,
				GPU: devices.Config{Mode: mode}, PodWait: 100 * time.Millisecond})
			imageEnv := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"} // CUDA images set "all"
			for _, tc := range []struct {
				name, uid, devs string
				batch           bool
				ctr             string
				late            time.Duration // the pod source lists the pod only after this
				want            string        // device UUID; "" untouched; "refused: <text>"
				reason          string
			}{
				{"device 1", "u1", "1", false, "main", 0, nriUUID1, ""},
				{"device 0 of a batch pod, also moved", "u2", "0", true, "main", 0, nriUUID0, ""},
				{"sidecar without request", "u3", "1", false, "sidecar", 0, "", ""},
				{"pod source lags", "u4", "0", false, "main", 50 * time.Millisecond, nriUUID0, ""},
				{"no annotation", "u5", "-", false, "main", 0,
					"refused: has no understory.io/gpu-devices annotation", "GPUDevicesMissing"},
				{"malformed", "u6", "0;1", false, "main", 0,
					"refused: malformed understory.io/gpu-devices annotation", "GPUDevicesInvalid"},
				{"absent device", "u7", "5", false, "main", 0, "refused: GPU device not on this node",
					"GPUDeviceAbsent"},
				{"annotated pod unknown to the agent", "u8", "0", false, "main", time.Hour,
					"refused: pod not known to the node agent yet", "PodUnknown"},
				{"unannotated pod unknown to the agent", "u9", "-", false, "main", time.Hour, "", ""},
			} {
				pod, sb := nriGPUPod(tc.uid, tc.devs, tc.batch)
				pods.add(pod, tc.late)
				resp, err := r.create(sb, tc.ctr, imageEnv)
				adj := resp.GetAdjust()
				if refusal, ok := strings.CutPrefix(tc.want, "refused: "); ok {
					if err == nil || !strings.Contains(err.Error(), refusal) || !strings.Contains(err.Error(), "main") {
						t.Fatalf("%s: CreateContainer = %v, %v; want refused with %q", tc.name, adj, err, refusal)
					}
					evs := events.forPod(tc.uid)
					if len(evs) != 1 || evs[0].reason != tc.reason || !strings.Contains(evs[0].message, refusal) {
						t.Fatalf("%s: events %+v; want one %s naming %q", tc.name, evs, tc.reason, refusal)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: CreateContainer: %v", tc.name, err)
				}
				var want []string
				if tc.want != "" {
					want = []string{tc.want}
				}
				// Visibility is pinned in both modes: the devices, or none.
				wantVisible := tc.want
				if wantVisible == "" {
					wantVisible = devices.NoDevices
				}
				switch got := envOf(adj)[devices.EnvVisibleDevices]; {
				case mode == devices.ModeCDI && !slices.Equal(cdiOf(adj), prefixed(want)):
					t.Fatalf("%s: CDI devices %q, want %q", tc.name, cdiOf(adj), prefixed(want))
				case got != wantVisible:
					t.Fatalf("%s: %s=%q, want %q (overriding the image's \"all\")", tc.name,
						devices.EnvVisibleDevices, got, wantVisible)
				case mode == devices.ModeEnv && len(cdiOf(adj)) != 0:
					t.Fatalf("%s: mode env added CDI devices %q", tc.name, cdiOf(adj))
				}
				moved := adj.GetLinux().GetCgroupsPath() != ""
				if moved != tc.batch {
					t.Fatalf("%s: cgroups path %q; batch %v", tc.name, adj.GetLinux().GetCgroupsPath(), tc.batch)
				}
				if evs := events.forPod(tc.uid); len(evs) != 0 {
					t.Fatalf("%s: events %+v for an accepted container", tc.name, evs)
				}
			}
		})
	}
}

func prefixed(uuids []string) []string {
	var out []string
	for _, u := range uuids {
		out = append(out, devices.DefaultCDIKind+"="+u)
	}
	return out
}

// TestNRIGPUWithoutInventory: with NVML off the agent has no inventory, and a
// shared-GPU container is refused rather than started without isolation; without a pod
// source the plugin handles no GPU at all.
func TestNRIGPUWithoutInventory(t *testing.T) {
	t.Parallel()
	pods, events := &nriPods{}, &nriEvents{}
	pod, sb := nriGPUPod("u1", "0", false)
	pods.add(pod, 0)
	r := startNRI(t, Options{Pods: pods, GPUs: gpuList{}, Events: events})
	_, err := r.create(sb, "main", nil)
	if err == nil || !strings.Contains(err.Error(), "no GPU inventory on this node") {
		t.Fatalf("CreateContainer without inventory = %v; want refused", err)
	}
	if evs := events.forPod("u1"); len(evs) != 1 || evs[0].reason != "NoGPUInventory" {
		t.Fatalf("events %+v", evs)
	}
	if resp, err := r.create(sb, "sidecar", nil); err != nil || len(resp.GetAdjust().GetCDIDevices()) != 0 ||
		len(resp.GetAdjust().GetEnv()) != 1 || envOf(resp.GetAdjust())[devices.EnvVisibleDevices] != devices.NoDevices {
		t.Fatalf("sidecar: %v, %v; want only its visibility pinned to none", resp, err)
	}

	off := startNRI(t, Options{})
	resp, err := off.create(sb, "main", nil)
	if err != nil || len(resp.GetAdjust().GetCDIDevices()) != 0 || len(resp.GetAdjust().GetEnv()) != 0 {
		t.Fatalf("GPU handling off: %v, %v; want untouched", resp, err)
	}
}

func TestOptionsRejectBadGPUConfig(t *testing.T) {
	t.Parallel()
	_, err := New(config.Default(), nil, Options{GPU: devices.Config{Mode: "all"}})
	if !errors.Is(err, devices.ErrInvalidConfig) {
		t.Fatalf("New(mode all) = %v, want devices.ErrInvalidConfig", err)
	}
}

// TestNRIGPUStaticPod: kubelet runs a static pod under its own UID; the pod source
// lists the API server's mirror pod under another one, found by namespace and name.
func TestNRIGPUStaticPod(t *testing.T) {
	t.Parallel()
	pod, sb := nriGPUPod("static-hash", "1", false)
	pod.UID = "mirror-uid"
	pod.Annotations[mirrorPodAnnotation] = "static-hash"
	p, err := New(config.Default(), nil, Options{Pods: &nriPods{pods: []*corev1.Pod{pod}},
		GPUs: nriInventory, PodWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(context.Background(), sb, &api.Container{Name: "main"})
	if err != nil || !slices.Equal(cdiOf(adj), []string{devices.DefaultCDIKind + "=" + nriUUID1}) {
		t.Fatalf("CreateContainer = %v, %v; want device 1", adj, err)
	}
}

func (e *nriEvents) Normal(pod *corev1.Pod, reason, message string) {
	e.Warn(pod, "normal:"+reason, message)
}

// mpsPlanner gives GPU 0 a partition (batch 25 % at priority 1, LS 75 % at 0), none
// on GPU 1, and fails for pods whose UID starts with "err".
type mpsPlanner struct{}

func (mpsPlanner) MPSClient(req devices.MPSRequest) (devices.MPSClient, bool, error) {
	switch {
	case strings.HasPrefix(string(req.PodUID), "err"):
		return devices.MPSClient{}, false, errors.New("no partition state")
	case req.GPU.Index != 0:
		return devices.MPSClient{}, false, nil
	case req.Batch:
		return devices.MPSClient{PipeDir: "/tmp/nvidia-mps", ActiveThreadPercent: 25, Priority: 1,
			PinnedMemLimitMiB: 2500}, true, nil
	}
	return devices.MPSClient{PipeDir: "/tmp/nvidia-mps", ActiveThreadPercent: 75, Priority: 0}, true, nil
}

// createWith sends CreateContainer for a container shaped by mod.
func (r *nriRuntime) createWith(sb *api.PodSandbox, name string, mod func(*api.Container)) (*api.CreateContainerResponse, error) {
	b := r.rt.BlockPluginSync()
	defer b.Unblock()
	id := fmt.Sprintf("ctr%d", r.seq.Add(1))
	c := &api.Container{Id: id, PodSandboxId: sb.Id, Name: name,
		Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/pod" + sb.Uid + "/" + id}}
	mod(c)
	return r.rt.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: sb, Container: c})
}

func mountsOf(adj *api.ContainerAdjustment) map[string]string {
	out := map[string]string{}
	for _, m := range adj.GetMounts() {
		out[m.Destination] = m.Source + " " + strings.Join(m.Options, ",")
	}
	return out
}

// TestNRIMPSClients drives the MPS injection through NRI's runtime adaptation: GPU
// containers become MPS clients with the planner's cap and priority, batch ones with its
// device memory limit on ordinal 0 (overriding the pod's own values), and get the pipe
// directory and /dev/shm; batch containers that
// are no client are pointed away from every daemon; a batch container whose planning
// fails is refused, an LS one starts without MPS; each outcome is an Event.
func TestNRIMPSClients(t *testing.T) {
	t.Parallel()
	pods, events := &nriPods{}, &nriEvents{}
	r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, Events: events, PodWait: 100 * time.Millisecond,
		MPS: mpsPlanner{}, MPSSetup: devices.MPSSetup{ShmDir: "/run/understory/mps-shm", ClientUID: 1000}})
	podEnv := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
		"CUDA_MPS_CLIENT_PRIORITY=0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999G"}
	const no = devices.NoMPSPipeDirectory
	for _, tc := range []struct {
		name, uid, devs string
		batch           bool
		ctr             string
		whole           bool // the container requests nvidia.com/gpu instead of gpu-milli
		mod             func(*api.Container)
		pipe            string // CUDA_MPS_PIPE_DIRECTORY wanted ("" unset)
		pct, prio       string
		event           string // reason of the one event; "refused" checks the error
	}{
		{"batch client on GPU 0", "m1", "0", true, "main", false, nil, "/tmp/nvidia-mps", "25", "1", "normal:MPSClient"},
		{"LS client on GPU 0", "m2", "0", false, "main", false, nil, "/tmp/nvidia-mps", "75", "0", "normal:MPSClient"},
		{"batch on GPU 1 without MPS", "m3", "1", true, "main", false, nil, no, "", "", "normal:NoMPSClient"},
		{"LS on GPU 1 without MPS", "m4", "1", false, "main", false, nil, "", "", "", "normal:NoMPSClient"},
		{"batch planning fails: refused", "err5", "0", true, "main", false, nil, "", "", "", "refused"},
		{"LS planning fails: time-sliced", "err6", "0", false, "main", false, nil, "", "", "", "MPSPlanningFailed"},
		{"whole GPU 0 from the device plugin", "m7", "-", false, "main", true, func(c *api.Container) {
			c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES="+nriUUID0)
		}, "/tmp/nvidia-mps", "75", "0", "normal:MPSClient"},
		{"batch of another UID", "m8", "0", true, "main", false, func(c *api.Container) {
			c.User = &api.User{Uid: 2000, Gid: 2000}
		}, no, "", "", "normal:NoMPSClient"},
		{"batch running as root", "m11", "0", true, "main", false, func(c *api.Container) {
			c.User = &api.User{}
		}, no, "", "", "normal:NoMPSClient"},
		{"LS of unknown UID (runtime without User, no runAsUser)", "m10", "0", false, "main", false,
			func(c *api.Container) { c.User = nil }, "", "", "", "normal:NoMPSClient"},
		{"batch sidecar with MPS variables", "m9", "0", true, "sidecar", false, func(c *api.Container) {
			c.Env = append(c.Env, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
		}, no, "", "", ""},
	} {
		pod, sb := nriGPUPod(tc.uid, tc.devs, tc.batch)
		if tc.whole {
			pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{devices.ResourceGPU: resource.MustParse("1")}
		}
		pods.add(pod, 0)
		resp, err := r.createWith(sb, tc.ctr, func(c *api.Container) {
			c.Env = slices.Clone(podEnv)
			c.User = &api.User{Uid: 1000, Gid: 1000} // the image's user, as the runtime resolved it
			if tc.mod != nil {
				tc.mod(c)
			}
		})
		evs := events.forPod(tc.uid)
		if tc.event == "refused" {
			if err == nil || !strings.Contains(err.Error(), "MPS partition planning failed") {
				t.Fatalf("%s: CreateContainer = %v, %v; want refused", tc.name, resp, err)
			}
			if len(evs) != 1 || evs[0].reason != "MPSPlanningFailed" {
				t.Fatalf("%s: events %+v; want one MPSPlanningFailed", tc.name, evs)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: CreateContainer: %v", tc.name, err)
		}
		adj := resp.GetAdjust()
		env := envOf(adj)
		if env[devices.EnvMPSPipeDirectory] != tc.pipe || env[devices.EnvMPSActiveThreadPercentage] != tc.pct ||
			env[devices.EnvMPSClientPriority] != tc.prio {
			t.Fatalf("%s: MPS env %v; want pipe %q cap %q priority %q", tc.name, env, tc.pipe, tc.pct, tc.prio)
		}
		// A batch client's memory limit replaces the pod's; LS and non-clients get none set.
		wantMem := ""
		if tc.batch && tc.pct != "" {
			wantMem = "0=2500M"
		}
		if got, set := env[devices.EnvMPSPinnedDeviceMemLimit]; got != wantMem || set != (wantMem != "") {
			t.Fatalf("%s: %s=%q (set %v); want %q", tc.name, devices.EnvMPSPinnedDeviceMemLimit, got, set, wantMem)
		}
		m := mountsOf(adj)
		if client := tc.pct != ""; client != (len(m) == 2) ||
			client && (m["/tmp/nvidia-mps"] != "/tmp/nvidia-mps bind,ro,nosuid,nodev,noexec" ||
				m["/dev/shm"] != "/run/understory/mps-shm rbind,rw,nosuid,nodev,noexec") {
			t.Fatalf("%s: mounts %v; client %v", tc.name, m, client)
		}
		if tc.event == "" {
			if len(evs) != 0 {
				t.Fatalf("%s: events %+v; want none", tc.name, evs)
			}
			continue
		}
		if len(evs) != 1 || evs[0].reason != tc.event {
			t.Fatalf("%s: events %+v; want one %s", tc.name, evs, tc.event)
		}
		if tc.pct != "" && !strings.Contains(evs[0].message, tc.pct+" % of the SMs, client priority "+tc.prio) {
			t.Fatalf("%s: event %q does not state the cap and priority", tc.name, evs[0].message)
		}
		if mem := strings.Contains(evs[0].message, "at most 2500 MiB of device memory"); mem != (tc.batch && tc.pct != "") {
			t.Fatalf("%s: event %q states a memory limit: %v", tc.name, evs[0].message, mem)
		}
	}
}

// TestNRIMPSOffLeavesEnvironment: without a planner (the agent's MPS off) no
// container's MPS variables change, not even a batch container's: NVIDIA's device
// plugin may run its own MPS there.
func TestNRIMPSOffLeavesEnvironment(t *testing.T) {
	t.Parallel()
	pod, sb := nriGPUPod("u1", "0", true)
	p, err := New(config.Default(), nil, Options{Pods: &nriPods{pods: []*corev1.Pod{pod}},
		GPUs: nriInventory, PodWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	adj, _, err := p.CreateContainer(context.Background(), sb, &api.Container{Name: "main",
		Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps/nvidia.com/gpu/pipe"}})
	if err != nil {
		t.Fatal(err)
	}
	for k := range envOf(adj) {
		if strings.HasPrefix(k, "CUDA_MPS_") {
			t.Fatalf("MPS off changed %s: %v", k, envOf(adj))
		}
	}
	if len(adj.GetMounts()) != 0 {
		t.Fatalf("MPS off added mounts %v", adj.GetMounts())
	}
	if _, err := New(config.Default(), nil, Options{MPSSetup: devices.MPSSetup{ShmDir: "dev/shm"}}); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("relative shm directory accepted: %v", err)
	}
}

// The QoS class of a sandbox comes from kubelet's cgroup parent read as kubelet names
// it, under both drivers: a kubelet --cgroup-root or a pod UID that spells a QoS class
// does not decide it.
func TestPodFromNRIQOSClass(t *testing.T) {
	t.Parallel()
	const uid, esc = "0b5e6f1c-1111-4222-8333-444455556666", "0b5e6f1c_1111_4222_8333_444455556666"
	for _, tc := range []struct {
		name, parent string
		want         corev1.PodQOSClass
	}{
		{"cgroupfs guaranteed", "/kubepods/pod" + uid, corev1.PodQOSGuaranteed},
		{"cgroupfs burstable", "/kubepods/burstable/pod" + uid, corev1.PodQOSBurstable},
		{"cgroupfs besteffort", "/kubepods/besteffort/pod" + uid, corev1.PodQOSBestEffort},
		{"systemd guaranteed", "kubepods-pod" + esc + ".slice", corev1.PodQOSGuaranteed},
		{"systemd burstable", "kubepods-burstable-pod" + esc + ".slice", corev1.PodQOSBurstable},
		{"systemd besteffort", "kubepods-besteffort-pod" + esc + ".slice", corev1.PodQOSBestEffort},
		{"cgroupfs kubelet root", "/node1/kubepods/burstable/pod" + uid, corev1.PodQOSBurstable},
		{"systemd kubelet root", "kubelet-kubepods-besteffort-pod" + esc + ".slice", corev1.PodQOSBestEffort},
		// Hostile: the class's name elsewhere in the parent.
		{"cgroupfs root named besteffort", "/besteffort-nodes/kubepods/burstable/pod" + uid, corev1.PodQOSBurstable},
		{"cgroupfs root named burstable", "/burstable/kubepods/pod" + uid, corev1.PodQOSGuaranteed},
		{"systemd root named besteffort", "besteffort_nodes-kubepods-pod" + esc + ".slice", corev1.PodQOSGuaranteed},
		{"uid spelling burstable", "/kubepods/podburstable-1", corev1.PodQOSGuaranteed},
		{"systemd uid spelling besteffort", "kubepods-burstable-podbesteffort_1.slice", corev1.PodQOSBurstable},
		// Not a pod cgroup kubelet names: the default, Guaranteed.
		{"empty", "", corev1.PodQOSGuaranteed},
		{"qos cgroup, no pod", "/kubepods/besteffort", corev1.PodQOSGuaranteed},
		{"escaping uid", "/kubepods/besteffort/pod..", corev1.PodQOSGuaranteed},
		{"foreign parent", "/machine/besteffort/pod" + uid, corev1.PodQOSGuaranteed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb := &api.PodSandbox{Name: "p", Namespace: "ns", Uid: uid, Linux: &api.LinuxPodSandbox{CgroupParent: tc.parent}}
			if got := podFromSandbox(sb).Status.QOSClass; got != tc.want {
				t.Fatalf("podFromSandbox(parent %q) QoS = %s, want %s", tc.parent, got, tc.want)
			}
		})
	}
}
