package devices

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// planner answers per GPU index; it records the requests.
type planner struct {
	answers map[int]MPSClient // absent: ok false
	err     error
	reqs    []MPSRequest
}

func (p *planner) MPSClient(req MPSRequest) (MPSClient, bool, error) {
	p.reqs = append(p.reqs, req)
	if p.err != nil {
		return MPSClient{}, false, p.err
	}
	c, ok := p.answers[req.GPU.Index]
	return c, ok, nil
}

const pipe = "/tmp/nvidia-mps"

func TestDecideMPS(t *testing.T) {
	t.Parallel()
	batchCap := MPSClient{PipeDir: pipe, ActiveThreadPercent: 25, Priority: 1}
	lsCap := MPSClient{PipeDir: pipe, ActiveThreadPercent: 75, Priority: 0}
	g0, g1 := GPU{0, uuid0}, GPU{1, uuid1}
	setup := MPSSetup{ShmDir: "/run/nvidia-mps-shm", ClientUID: 1000}
	podEnv := []string{"PATH=/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_CLIENT_PRIORITY=0",
		"CUDA_MPS_PIPE_DIRECTORY=/elsewhere"}
	clientEnv := func(c MPSClient) map[string]string {
		return map[string]string{EnvMPSPipeDirectory: c.PipeDir,
			EnvMPSActiveThreadPercentage: fmt.Sprint(c.ActiveThreadPercent), EnvMPSClientPriority: fmt.Sprint(c.Priority)}
	}
	withMem := func(env map[string]string, v string) map[string]string {
		env[EnvMPSPinnedDeviceMemLimit] = v
		return env
	}
	batchMem := MPSClient{PipeDir: pipe, ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 35942}
	pinned := map[string]string{EnvMPSPipeDirectory: NoMPSPipeDirectory}
	mounts := []MPSMount{{pipe, pipe, true}, {"/run/nvidia-mps-shm", ShmPath, false}}
	for _, tc := range []struct {
		name    string
		p       *planner
		setup   MPSSetup
		c       MPSContainer
		ok      bool
		env     map[string]string
		mounts  []MPSMount
		skipped string // a word of Skipped
		lsErr   bool
		wantErr error
	}{
		{"batch client, the pod's own values overridden", &planner{answers: map[int]MPSClient{0: batchCap}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, RequestMilli: 300, UID: 1000, UIDKnown: true, Env: podEnv}, true,
			clientEnv(batchCap), mounts, "", false, nil},
		{"batch client with a memory limit, the pod's own overridden", &planner{answers: map[int]MPSClient{0: batchMem}},
			setup, MPSContainer{Batch: true, GPUs: []GPU{g0}, RequestMilli: 250, UID: 1000, UIDKnown: true,
				Env: append(podEnv, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999G")}, true,
			withMem(clientEnv(batchMem), "0=35942M"), mounts, "", false, nil},
		{"two GPUs: the lowest memory limit on both ordinals", &planner{answers: map[int]MPSClient{
			0: {PipeDir: pipe, ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 4096},
			1: {PipeDir: pipe, ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 2048}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0, g1}, RequestMilli: 1000, UID: 1000, UIDKnown: true}, true,
			withMem(clientEnv(batchCap), "0=2048M,1=2048M"), mounts, "", false, nil},
		{"two GPUs, one without a limit: the other's on both", &planner{answers: map[int]MPSClient{
			0: batchCap, 1: {PipeDir: pipe, ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 512}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0, g1}, RequestMilli: 1000, UID: 1000, UIDKnown: true}, true,
			withMem(clientEnv(batchCap), "0=512M,1=512M"), mounts, "", false, nil},
		{"LS client", &planner{answers: map[int]MPSClient{0: lsCap}}, setup,
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, true, clientEnv(lsCap), mounts, "", false, nil},
		{"no shm directory: pipe only", &planner{answers: map[int]MPSClient{0: lsCap}}, MPSSetup{ClientUID: 1000},
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, true, clientEnv(lsCap), mounts[:1], "", false, nil},
		{"two GPUs: lowest cap, lowest priority", &planner{answers: map[int]MPSClient{0: lsCap,
			1: {PipeDir: pipe, ActiveThreadPercent: 40, Priority: 1}}}, setup,
			MPSContainer{GPUs: []GPU{g0, g1}, UID: 1000, UIDKnown: true}, true,
			clientEnv(MPSClient{pipe, 40, 1, 0}), mounts, "", false, nil},
		{"client UID 1000", &planner{answers: map[int]MPSClient{0: lsCap}}, MPSSetup{ClientUID: 1000},
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, true, clientEnv(lsCap), mounts[:1], "", false, nil},
		{"root is no client, even as the client UID", &planner{answers: map[int]MPSClient{0: batchCap}},
			MPSSetup{ClientUID: 0}, MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 0, UIDKnown: true}, false, pinned, nil,
			"root", false, nil},

		// No client.
		{"planner: not on this GPU (LS untouched)", &planner{}, setup,
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true, Env: podEnv}, false, nil, nil, "not available", false, nil},
		{"planner: not on this GPU (batch pinned off MPS)", &planner{}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true, Env: podEnv}, false, pinned, nil,
			"not available", false, nil},
		{"one of two GPUs without MPS", &planner{answers: map[int]MPSClient{0: batchCap}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0, g1}, UID: 1000, UIDKnown: true}, false, pinned, nil, "not available",
			false, nil},
		{"other UID", &planner{answers: map[int]MPSClient{0: batchCap}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 2000, UIDKnown: true}, false, pinned, nil, "UID 2000",
			false, nil},
		{"unknown UID", &planner{answers: map[int]MPSClient{0: lsCap}}, setup,
			MPSContainer{GPUs: []GPU{g0}}, false, nil, nil, "unknown", false, nil},
		{"LS planner error: starts without MPS", &planner{err: errors.New("boom")}, setup,
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "planning failed", true, nil},
		{"LS unsafe answer: starts without MPS", &planner{answers: map[int]MPSClient{0: {PipeDir: pipe}}}, setup,
			MPSContainer{GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "planning failed", true, nil},
		{"batch without GPU but with MPS env: pinned", &planner{}, setup,
			MPSContainer{Batch: true, UID: 1000, UIDKnown: true, Env: podEnv}, false, pinned, nil, "", false, nil},
		{"batch without GPU or MPS env: untouched", &planner{}, setup,
			MPSContainer{Batch: true, UID: 1000, UIDKnown: true, Env: []string{"PATH=/bin"}}, false, nil, nil, "", false, nil},
		{"LS without GPU: untouched", &planner{}, setup, MPSContainer{Env: podEnv}, false, nil, nil, "", false, nil},

		// Refused.
		{"batch planner error", &planner{err: errors.New("boom")}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSPlanner},
		{"batch unlimited", &planner{answers: map[int]MPSClient{0: {pipe, 100, 1, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
		{"batch at LS priority", &planner{answers: map[int]MPSClient{0: {pipe, 25, 0, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
		{"cap 0", &planner{answers: map[int]MPSClient{0: {pipe, 0, 1, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
		{"priority 2", &planner{answers: map[int]MPSClient{0: {pipe, 20, 2, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
		{"relative pipe", &planner{answers: map[int]MPSClient{0: {"tmp/mps", 20, 1, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
		{"two pipe directories", &planner{answers: map[int]MPSClient{0: batchCap, 1: {"/run/mps", 20, 1, 0}}}, setup,
			MPSContainer{Batch: true, GPUs: []GPU{g0, g1}, UID: 1000, UIDKnown: true}, false, nil, nil, "", false, ErrMPSUnsafe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.c.Pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}
			tc.c.Container = "main"
			d, err := DecideMPS(tc.p, tc.setup, tc.c)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || d.OK || d.Env != nil {
					t.Fatalf("DecideMPS = %+v, %v; want refusal %v", d, err, tc.wantErr)
				}
				return
			}
			if err != nil || d.OK != tc.ok || !reflect.DeepEqual(d.Env, tc.env) || !reflect.DeepEqual(d.Mounts, tc.mounts) {
				t.Fatalf("DecideMPS = %+v, %v;\nwant ok %v env %v mounts %v", d, err, tc.ok, tc.env, tc.mounts)
			}
			if !strings.Contains(d.Skipped, tc.skipped) || (tc.skipped == "") != (d.Skipped == "") {
				t.Fatalf("Skipped = %q, want %q", d.Skipped, tc.skipped)
			}
			if (d.Err != nil) != tc.lsErr {
				t.Fatalf("Err = %v, want an error %v", d.Err, tc.lsErr)
			}
			for _, r := range tc.p.reqs {
				if r.PodUID != "u" || r.Namespace != "ns" || r.Name != "p" || r.Container != "main" ||
					r.Batch != tc.c.Batch || r.RequestMilli != tc.c.RequestMilli || r.Devices != len(tc.c.GPUs) {
					t.Fatalf("request %+v does not name the container", r)
				}
			}
		})
	}
	// The agent's MPS off: nothing, not even the batch pin.
	if d, err := DecideMPS(nil, setup, MPSContainer{Batch: true, GPUs: []GPU{g0}, Env: podEnv}); err != nil ||
		d.Env != nil || d.OK {
		t.Fatalf("nil planner: %+v, %v", d, err)
	}
}

func TestWholeGPUs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		cdi  []string
		want []int
	}{
		{"env uuid overrides the image's all", []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=" + uuid1},
			nil, []int{1}},
		{"env indices", []string{"NVIDIA_VISIBLE_DEVICES=3,0"}, nil, []int{3, 0}},
		{"cdi by uuid", nil, []string{"nvidia.com/gpu=" + uuid0}, []int{0}},
		{"cdi by index, env void", []string{"NVIDIA_VISIBLE_DEVICES=void"}, []string{"nvidia.com/gpu=1"}, []int{1}},
		{"same device both ways", []string{"NVIDIA_VISIBLE_DEVICES=" + uuid0}, []string{"nvidia.com/gpu=0"}, []int{0}},
		{"other cdi kind ignored", nil, []string{"example.com/nic=0"}, nil},
		{"all", []string{"NVIDIA_VISIBLE_DEVICES=" + uuid0, "NVIDIA_VISIBLE_DEVICES=all"}, nil, nil},
		{"cdi all", nil, []string{"nvidia.com/gpu=all"}, nil},
		{"mig device", []string{"NVIDIA_VISIBLE_DEVICES=MIG-1234"}, nil, nil},
		{"one unknown of two", []string{"NVIDIA_VISIBLE_DEVICES=0,GPU-unknown"}, nil, nil},
		{"none", []string{"NVIDIA_VISIBLE_DEVICES=none"}, nil, nil},
		{"nothing", []string{"PATH=/bin"}, nil, nil},
	} {
		got := WholeGPUs(tc.env, tc.cdi, DefaultCDIKind, inventory)
		var idx []int
		for _, g := range got {
			idx = append(idx, g.Index)
		}
		if !reflect.DeepEqual(idx, tc.want) {
			t.Errorf("%s: WholeGPUs = %v, want %v", tc.name, idx, tc.want)
		}
	}
}

func TestContainerUIDAndGPURequest(t *testing.T) {
	t.Parallel()
	uid := func(v int64) *int64 { return &v }
	p := pod(nil, ctr("main", list("understory.io/gpu-milli", "300"), nil),
		ctr("whole", nil, list("nvidia.com/gpu", "2")), ctr("big", nil, list("understory.io/gpu-milli", "5000")))
	if u, ok := ContainerUID(p, "main"); ok {
		t.Fatalf("UID %d known without runAsUser", u)
	}
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: uid(1000)}
	if u, ok := ContainerUID(p, "main"); !ok || u != 1000 {
		t.Fatalf("pod runAsUser: %d, %v", u, ok)
	}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: uid(0)}
	if u, ok := ContainerUID(p, "main"); !ok || u != 0 {
		t.Fatalf("container runAsUser overrides the pod's: %d, %v", u, ok)
	}
	for _, tc := range []struct {
		ctr   string
		milli int64
		whole bool
	}{{"main", 300, false}, {"whole", 1000, true}, {"big", 1000, false}, {"absent", 0, false}} {
		if m, w := GPURequest(p, tc.ctr); m != tc.milli || w != tc.whole {
			t.Errorf("GPURequest(%s) = %d, %v; want %d, %v", tc.ctr, m, w, tc.milli, tc.whole)
		}
	}
}

func FuzzWholeGPUs(f *testing.F) {
	for _, s := range []string{"all", uuid0, "0,1", "3,GPU-x", "", "void", uuid1 + "::2", "1,1", " 0 "} {
		f.Add(s, "nvidia.com/gpu="+s)
	}
	f.Fuzz(func(t *testing.T, env, cdi string) {
		got := WholeGPUs([]string{"NVIDIA_VISIBLE_DEVICES=" + env}, []string{cdi}, DefaultCDIKind, inventory)
		seen := map[int]bool{}
		for _, g := range got {
			if seen[g.Index] || !reflect.DeepEqual(g, inventory[map[int]int{0: 0, 1: 1, 3: 2}[g.Index]]) {
				t.Fatalf("WholeGPUs(%q, %q) = %v: a device twice or not of the inventory", env, cdi, got)
			}
			seen[g.Index] = true
		}
	})
}
