package nri

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// TestNRIMPSClientIsolation drives MPS clients through NRI's runtime adaptation with
// the agent's own gpu.mps defaults (config.GPU.MPSSetup of an empty gpu.mps): a client gets the
// pipe directory read-only (it can connect to the daemon's socket but not replace it
// or plant files), a private shm directory rather than the host's /dev/shm, and no
// root: the plugin never sets a user, a client runs as the non-root client UID, and a
// container running as root is no client.
func TestNRIMPSClientIsolation(t *testing.T) {
	t.Parallel()
	setup := config.GPU{MPS: mps.Config{Mode: mps.ModeFind}}.MPSSetup()
	if setup.ShmDir == "" || setup.ShmDir == "/dev/shm" || setup.ClientUID == 0 {
		t.Fatalf("gpu.mps defaults %+v: want a private shm directory and a non-root client UID", setup)
	}
	pods, events := &nriPods{}, &nriEvents{}
	r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, Events: events, PodWait: 100 * time.Millisecond,
		MPS: mpsPlanner{}, MPSSetup: setup})
	for _, tc := range []struct {
		name   string
		uid    string
		batch  bool
		user   *api.User // as the runtime resolved the image's user
		client bool
	}{
		{"batch tenant as the client UID", "iso1", true, &api.User{Uid: uint32(setup.ClientUID)}, true},
		{"LS as the client UID", "iso2", false, &api.User{Uid: uint32(setup.ClientUID)}, true},
		{"batch tenant as root", "iso3", true, &api.User{}, false},
		{"LS as root", "iso4", false, &api.User{}, false},
	} {
		pod, sb := nriGPUPod(tc.uid, "0", tc.batch)
		pods.add(pod, 0)
		resp, err := r.createWith(sb, "main", func(c *api.Container) {
			c.Env = []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}
			c.User = tc.user
		})
		if err != nil {
			t.Fatalf("%s: CreateContainer: %v", tc.name, err)
		}
		adj := resp.GetAdjust()
		env := envOf(adj)
		if got := env[devices.EnvMPSActiveThreadPercentage] != ""; got != tc.client {
			t.Fatalf("%s: MPS client %v (env %v), want %v", tc.name, got, env, tc.client)
		}
		// NRI's adjustment carries no user: the container keeps its own.
		if len(adj.GetArgs()) != 0 || adj.GetHooks().GetPrestart() != nil || adj.GetHooks().GetCreateRuntime() != nil {
			t.Fatalf("%s: adjustment changes how the container starts: %v", tc.name, adj)
		}
		if !tc.client {
			if len(adj.GetMounts()) != 0 {
				t.Fatalf("%s: mounts %v for a container that is no client", tc.name, adj.GetMounts())
			}
			continue
		}
		var pipe, shm *api.Mount
		for _, m := range adj.GetMounts() {
			switch m.Destination {
			case env[devices.EnvMPSPipeDirectory]:
				pipe = m
			case devices.ShmPath:
				shm = m
			default:
				t.Fatalf("%s: unexpected mount %v", tc.name, m)
			}
		}
		switch {
		case pipe == nil || shm == nil:
			t.Fatalf("%s: mounts %v; want the pipe directory and /dev/shm", tc.name, adj.GetMounts())
		case !slices.Contains(pipe.Options, "ro") || slices.Contains(pipe.Options, "rw") ||
			slices.Contains(pipe.Options, "rbind"):
			t.Fatalf("%s: pipe directory mounted %v; want a read-only bind", tc.name, pipe.Options)
		case shm.Source == "/dev/shm" || shm.Source != setup.ShmDir:
			t.Fatalf("%s: /dev/shm from %q; want the MPS server's private %q", tc.name, shm.Source, setup.ShmDir)
		}
		for _, m := range []*api.Mount{pipe, shm} {
			for _, o := range []string{"nosuid", "nodev", "noexec"} {
				if !slices.Contains(m.Options, o) {
					t.Fatalf("%s: mount %v lacks %s", tc.name, m, o)
				}
			}
		}
	}
}

// TestNRIPinsVisibleDevices: with CDI injection (and in mode env), every container the
// plugin adjusts has NVIDIA_VISIBLE_DEVICES pinned over its image's "all": a
// shared-GPU container to its devices' UUIDs, a container that asks for no GPU to
// "void", a whole-GPU container to the device plugin's devices; batch and LS alike.
// A tenant's own pod spec setting "all" is pinned the same way; only a pod of a
// trusted system namespace (nri.trustedVisibilityNamespaces: understory-system and
// kube-system by default) keeps a value its spec sets.
func TestNRIPinsVisibleDevices(t *testing.T) {
	t.Parallel()
	imageAll := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}
	// specAll sets NVIDIA_VISIBLE_DEVICES=all in the pod spec of ctr, as a tenant (or a
	// node agent) may, and the runtime passes it on in the container's environment.
	specAll := func(ns string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			if ns != "" {
				p.Namespace = ns
			}
			for i := range p.Spec.Containers {
				p.Spec.Containers[i].Env = []corev1.EnvVar{{Name: devices.EnvVisibleDevices, Value: "all"}}
			}
		}
	}
	for _, mode := range []devices.Mode{devices.ModeCDI, devices.ModeEnv} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pods := &nriPods{}
			r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, GPU: devices.Config{Mode: mode},
				PodWait: 50 * time.Millisecond, MPS: mpsPlanner{}, MPSSetup: config.GPU{}.MPSSetup()})
			for i, tc := range []struct {
				name  string
				batch bool
				ctr   string // main requests gpu-milli on devs, sidecar nothing
				devs  string
				whole bool // main requests nvidia.com/gpu instead
				late  time.Duration
				mod   func(*api.Container)
				pod   func(*corev1.Pod)
				want  string // "": left as it is
			}{
				{"LS shared GPU", false, "main", "1", false, 0, nil, nil, nriUUID1},
				{"batch shared GPU", true, "main", "0", false, 0, nil, nil, nriUUID0},
				{"LS shared, two GPUs", false, "main", "0,1", false, 0, nil, nil, nriUUID0 + "," + nriUUID1},
				{"LS without GPU", false, "sidecar", "1", false, 0, nil, nil, devices.NoDevices},
				{"batch without GPU", true, "sidecar", "0", false, 0, nil, nil, devices.NoDevices},
				{"whole GPU by CDI next to the image's all", false, "main", "-", true, 0, func(c *api.Container) {
					c.CDIDevices = []*api.CDIDevice{{Name: devices.DefaultCDIKind + "=" + nriUUID1}}
				}, nil, nriUUID1},
				{"batch whole GPU by the device plugin's env", true, "main", "-", true, 0, func(c *api.Container) {
					c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES="+nriUUID0)
				}, nil, nriUUID0},
				{"pod unknown to the agent", true, "sidecar", "-", false, time.Hour, nil, nil, devices.NoDevices},
				{"tenant spec sets all, no GPU", false, "sidecar", "-", false, 0, nil, specAll(""), devices.NoDevices},
				{"batch tenant spec sets all, no GPU", true, "sidecar", "-", false, 0, nil, specAll(""),
					devices.NoDevices},
				{"tenant spec sets all, shared GPU", true, "main", "1", false, 0, nil, specAll(""), nriUUID1},
				{"tenant in a namespace named like a system one", false, "sidecar", "-", false, 0, nil,
					specAll("understory-system-tenant"), devices.NoDevices},
				{"understory-system spec sets all", false, "sidecar", "-", false, 0, nil,
					specAll("understory-system"), ""},
				{"kube-system spec sets all", false, "sidecar", "-", false, 0, nil, specAll("kube-system"), ""},
			} {
				uid := fmt.Sprintf("vis%d", i)
				pod, sb := nriGPUPod(uid, tc.devs, tc.batch)
				if tc.whole {
					pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{devices.ResourceGPU: resource.MustParse("1")}
				}
				if tc.pod != nil {
					tc.pod(pod)
					sb.Namespace = pod.Namespace
				}
				pods.add(pod, tc.late)
				resp, err := r.createWith(sb, tc.ctr, func(c *api.Container) {
					c.Env = slices.Clone(imageAll)
					c.User = &api.User{Uid: 1000}
					if tc.mod != nil {
						tc.mod(c)
					}
				})
				if err != nil {
					t.Fatalf("%s: CreateContainer: %v", tc.name, err)
				}
				got, set := envOf(resp.GetAdjust())[devices.EnvVisibleDevices]
				if got != tc.want || set != (tc.want != "") {
					t.Fatalf("%s: %s=%q (set %v), want %q", tc.name, devices.EnvVisibleDevices, got, set, tc.want)
				}
			}
		})
	}
}

// TestNRIClassifiesAsAgent runs one table of pods through the agent's classification
// (syncPods on its pod source) and through the plugin's CreateContainer on NRI's
// runtime adaptation, where the sandbox carries only the pod's labels and
// annotations, as kubelet passes them: a pod is moved below the tier, and made an MPS
// client at batch's cap and priority, exactly when the agent holds it batch.
func TestNRIClassifiesAsAgent(t *testing.T) {
	t.Parallel()
	batchCPU := corev1.ResourceList{"understory.io/batch-cpu": resource.MustParse("1")}
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		labels map[string]string
		req    corev1.ResourceList // main's requests (its limits hold the GPU share)
		qos    corev1.PodQOSClass
	}{
		{"annotation LS", map[string]string{"understory.io/qos-class": "LS"}, nil, nil, corev1.PodQOSBestEffort},
		{"annotation BE", map[string]string{"understory.io/qos-class": "BE"}, nil, nil, corev1.PodQOSBestEffort},
		{"annotation batch", map[string]string{"understory.io/qos-class": "batch"}, nil, nil, corev1.PodQOSBestEffort},
		{"Koordinator label BE", nil, map[string]string{qos.LabelKoordinatorQOS: "BE"}, nil, corev1.PodQOSBestEffort},
		{"Koordinator label LSR", nil, map[string]string{qos.LabelKoordinatorQOS: "LSR"}, nil, corev1.PodQOSBestEffort},
		{"Koordinator annotation BE", map[string]string{qos.AnnotationKoordinatorQOS: "BE"}, nil, nil,
			corev1.PodQOSBestEffort},
		{"batch-cpu request, no annotation", nil, nil, batchCPU, corev1.PodQOSBestEffort},
		{"batch-memory request, no annotation", nil, nil,
			corev1.ResourceList{"understory.io/batch-memory": resource.MustParse("1Gi")}, corev1.PodQOSBestEffort},
		{"Koordinator kubernetes.io/batch-cpu", nil, nil,
			corev1.ResourceList{"kubernetes.io/batch-cpu": resource.MustParse("1000")}, corev1.PodQOSBestEffort},
		{"Koordinator kubernetes.io/batch-memory", nil, nil,
			corev1.ResourceList{"kubernetes.io/batch-memory": resource.MustParse("1Gi")}, corev1.PodQOSBestEffort},
		{"LS annotation with batch-cpu", map[string]string{"understory.io/qos-class": "LS"}, nil, batchCPU,
			corev1.PodQOSBestEffort},
		{"invalid annotation with batch-cpu", map[string]string{"understory.io/qos-class": "gold"}, nil, batchCPU,
			corev1.PodQOSBestEffort},
		{"plain BestEffort", nil, nil, nil, corev1.PodQOSBestEffort},
		{"Burstable", nil, nil, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			corev1.PodQOSBurstable},
		{"Guaranteed", nil, nil, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"),
			corev1.ResourceMemory: resource.MustParse("1Gi")}, corev1.PodQOSGuaranteed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const uid = types.UID("55555555-5555-4555-8555-555555555555")
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ml", UID: uid,
				Annotations: map[string]string{devices.AnnotationDevices: "0"}, Labels: tc.labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
					Requests: tc.req, Limits: corev1.ResourceList{devices.ResourceGPUMilli: resource.MustParse("300")}}}}},
				Status: corev1.PodStatus{QOSClass: tc.qos}}
			for k, v := range tc.ann {
				pod.Annotations[k] = v
			}
			if tc.qos == corev1.PodQOSGuaranteed {
				pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = tc.req[corev1.ResourceCPU]
				pod.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = tc.req[corev1.ResourceMemory]
			}

			// The agent's path: its pod table classifies with qos.Classify (syncPods).
			class, _ := qos.Classify(pod)
			agentBatch := class == qos.ClassBatch

			// The plugin's path: the sandbox as kubelet gives it.
			pods := &nriPods{}
			pods.add(pod, 0)
			r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, PodWait: 100 * time.Millisecond,
				MPS: mpsPlanner{}, MPSSetup: devices.MPSSetup{ShmDir: "/run/nvidia-mps-shm", ClientUID: 1000}})
			parent := "/kubepods/" + strings.ToLower(string(tc.qos)) + "/pod" + string(uid)
			if tc.qos == corev1.PodQOSGuaranteed {
				parent = "/kubepods/pod" + string(uid)
			}
			sb := &api.PodSandbox{Id: "sb", Name: pod.Name, Namespace: pod.Namespace, Uid: string(uid),
				Annotations: pod.Annotations, Labels: pod.Labels, Linux: &api.LinuxPodSandbox{CgroupParent: parent}}
			resp, err := r.createWith(sb, "main", func(c *api.Container) {
				c.Env = []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_CLIENT_PRIORITY=0"}
				c.User = &api.User{Uid: 1000}
			})
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			adj := resp.GetAdjust()
			moved := adj.GetLinux().GetCgroupsPath() != ""
			env := envOf(adj)
			wantCap, wantPrio := "75", "0"
			if agentBatch {
				wantCap, wantPrio = "25", "1"
			}
			if moved != agentBatch || env[devices.EnvMPSActiveThreadPercentage] != wantCap ||
				env[devices.EnvMPSClientPriority] != wantPrio {
				t.Fatalf("agent: class %s; plugin: moved below the tier %v, MPS cap %q priority %q",
					class, moved, env[devices.EnvMPSActiveThreadPercentage], env[devices.EnvMPSClientPriority])
			}
		})
	}
}

// TestNRIUnknownPodNeverLS: a pod the agent's source does not list within the wait
// gets no LS privilege: an MPS variable it sets is pointed away from every daemon (as
// for a batch container), and it is not moved (the agent bounds it in place once it
// lists it).
func TestNRIUnknownPodNeverLS(t *testing.T) {
	t.Parallel()
	pods := &nriPods{}
	r := startNRI(t, Options{Pods: pods, GPUs: nriInventory, PodWait: 30 * time.Millisecond,
		MPS: mpsPlanner{}, MPSSetup: devices.MPSSetup{ShmDir: "/run/nvidia-mps-shm", ClientUID: 1000}})
	pod, sb := nriGPUPod("unknown1", "-", false)
	pods.add(pod, time.Hour)
	resp, err := r.createWith(sb, "sidecar", func(c *api.Container) {
		c.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	adj := resp.GetAdjust()
	if env := envOf(adj); env[devices.EnvMPSPipeDirectory] != devices.NoMPSPipeDirectory ||
		adj.GetLinux().GetCgroupsPath() != "" {
		t.Fatalf("unknown pod: env %v, cgroups path %q; want pointed away from MPS, not moved", env,
			adj.GetLinux().GetCgroupsPath())
	}
}
