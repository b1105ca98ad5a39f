package gpu

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu/devices"
	"github.com/understory/understory/qos"
)

var partT0 = time.Unix(1_700_000_000, 0)

// testMemTotal is GPU-0's memory in the tests: 1000 MiB, so that a gpu-milli request is
// its memory limit in MiB.
const testMemTotal = 1000 << 20

// newTestPartitions returns Partitions on a fake clock, with GPU-0 (index 0, MPS on,
// testMemTotal) and GPU-1 (index 1, MIG: no MPS) observed once, the server ready.
func newTestPartitions(t *testing.T, lsUtil float64) (*Partitions, *time.Time) {
	t.Helper()
	p := NewPartitions(qos.DefaultGPUMPSPolicy())
	now := partT0
	p.now = func() time.Time { return now }
	p.observe(now, true, "/run/mps", []partitionGPUObs{
		{index: 0, uuid: "GPU-0", mpsOn: true, lsUtil: lsUtil, lsKnown: true, memTotal: testMemTotal},
		{index: 1, uuid: "GPU-1", mpsOn: false, lsKnown: true},
	}, func(types.UID) bool { return true })
	return p, &now
}

func req(pod, ctr string, gpu int, batch bool, milli int64) devices.MPSRequest {
	return devices.MPSRequest{GPU: devices.GPU{Index: gpu, UUID: fmt.Sprintf("GPU-%d", gpu)}, PodUID: types.UID(pod),
		Namespace: "ns", Name: pod, Container: ctr, Batch: batch, RequestMilli: milli}
}

func TestPartitionsMPSClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		lsUtil  float64
		before  []devices.MPSRequest // planned first
		req     devices.MPSRequest
		want    devices.MPSClient
		ok      bool
		wantErr error
	}{
		{name: "batch: 25 % at priority 1, its share of the memory", lsUtil: 33, req: req("b", "c", 0, true, 100), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 100}},
		{name: "batch 250 milli: a quarter of the memory", req: req("b", "c", 0, true, 250), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 25, Priority: 1, PinnedMemLimitMiB: 250}},
		{name: "batch's memory never what LS's requests hold", before: []devices.MPSRequest{req("l", "c", 0, false, 950)},
			req: req("b", "c", 0, true, 100), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 5, Priority: 1, PinnedMemLimitMiB: 50}},
		{name: "batch without a request: no memory limit", req: req("b", "c", 0, true, 0), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 25, Priority: 1}},
		{name: "LS: the rest at priority 0, no memory limit", lsUtil: 33, req: req("l", "c", 0, false, 300), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 75, Priority: 0}},
		{name: "LS demand squeezes batch", lsUtil: 60, req: req("b", "c", 0, true, 0), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 15, Priority: 1}},
		{name: "LS requests on the GPU bound batch", before: []devices.MPSRequest{req("l", "c", 0, false, 950)},
			req: req("b", "c", 0, true, 0), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 5, Priority: 1}},
		{name: "LS's own request covered", req: req("l", "c", 0, false, 900), ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 90, Priority: 0}},
		{name: "a GPU found by index without UUID", req: devices.MPSRequest{GPU: devices.GPU{Index: 0}, PodUID: "b",
			Container: "c", Batch: true}, ok: true,
			want: devices.MPSClient{PipeDir: "/run/mps", ActiveThreadPercent: 25, Priority: 1}},
		{name: "MIG GPU: no client", req: req("b", "c", 1, true, 0)},
		{name: "unknown GPU: no client", req: req("b", "c", 7, true, 0)},
		{name: "no pod UID", req: devices.MPSRequest{GPU: devices.GPU{UUID: "GPU-0"}, Container: "c"}, wantErr: ErrMPSRequest},
		{name: "no container", req: devices.MPSRequest{GPU: devices.GPU{UUID: "GPU-0"}, PodUID: "p"}, wantErr: ErrMPSRequest},
		{name: "no GPU", req: devices.MPSRequest{GPU: devices.GPU{Index: -1}, PodUID: "p", Container: "c"}, wantErr: ErrMPSRequest},
		{name: "negative request", req: req("b", "c", 0, true, -1), wantErr: ErrMPSRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, _ := newTestPartitions(t, tc.lsUtil)
			for _, b := range tc.before {
				if _, ok, err := p.MPSClient(b); !ok || err != nil {
					t.Fatalf("planning %+v: %v %v", b, ok, err)
				}
			}
			got, ok, err := p.MPSClient(tc.req)
			if !errors.Is(err, tc.wantErr) || ok != tc.ok || got != tc.want {
				t.Fatalf("MPSClient = %+v, %v, %v; want %+v, %v, %v", got, ok, err, tc.want, tc.ok, tc.wantErr)
			}
			if n := len(p.Clients()); n != len(tc.before)+map[bool]int{true: 1}[ok] {
				t.Fatalf("%d clients recorded", n)
			}
		})
	}
}

// Not ready, or before the first observation: no client, and MPSOn is false.
func TestPartitionsNotReady(t *testing.T) {
	t.Parallel()
	p := NewPartitions(qos.DefaultGPUMPSPolicy())
	if _, ok, err := p.MPSClient(req("b", "c", 0, true, 0)); ok || err != nil || p.MPSOn("GPU-0") {
		t.Fatalf("before any step: ok %v err %v MPSOn %v", ok, err, p.MPSOn("GPU-0"))
	}
	p.observe(partT0, false, "/run/mps", []partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true}},
		func(types.UID) bool { return true })
	if _, ok, _ := p.MPSClient(req("b", "c", 0, true, 0)); ok || p.MPSOn("GPU-0") {
		t.Fatal("a client while the server is not ready")
	}
	p.observe(partT0, true, "/run/mps", []partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true}},
		func(types.UID) bool { return true })
	if !p.MPSOn("GPU-0") || p.MPSOn("GPU-9") {
		t.Fatalf("MPSOn GPU-0 %v GPU-9 %v", p.MPSOn("GPU-0"), p.MPSOn("GPU-9"))
	}
}

// Records follow the pods and GPUs: a pod that left the snapshot is forgotten, one never
// seen after partitionPodGrace, and every client of a GPU that vanished.
func TestPartitionsForget(t *testing.T) {
	t.Parallel()
	p, now := newTestPartitions(t, 0)
	for _, r := range []devices.MPSRequest{req("seen", "c", 0, true, 0), req("late", "c", 0, false, 0),
		req("seen", "d", 0, true, 0)} {
		if _, ok, err := p.MPSClient(r); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	gpus := []partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true, lsKnown: true}}
	alive := map[types.UID]bool{"seen": true}
	observe := func() map[string]map[types.UID]clientCaps {
		return p.observe(*now, true, "/run/mps", gpus, func(uid types.UID) bool { return alive[uid] })
	}
	got := observe()
	if c := got["GPU-0"]; len(c) != 2 || c["seen"] != (clientCaps{batch: true, cap: 25, memDevices: 1, memNone: true}) ||
		c["late"] != (clientCaps{cap: 75, memDevices: 1, memNone: true}) {
		t.Fatalf("clients %+v", got)
	}
	*now = now.Add(partitionPodGrace + time.Second)
	got = observe()
	if c := got["GPU-0"]; len(c) != 1 || len(p.Clients()) != 2 {
		t.Fatalf("after the grace, the pod never seen is forgotten: %+v, %+v", got, p.Clients())
	}
	alive["seen"] = false
	if got = observe(); len(got) != 0 || len(p.Clients()) != 0 {
		t.Fatalf("a pod that left is forgotten: %+v", p.Clients())
	}
	if _, ok, _ := p.MPSClient(req("seen", "c", 0, true, 0)); !ok {
		t.Fatal("planning again")
	}
	gpus = nil
	if got = observe(); len(got) != 0 || len(p.Clients()) != 0 || p.MPSOn("GPU-0") {
		t.Fatalf("a GPU that vanished keeps clients: %+v", p.Clients())
	}
}

// The demand peak spans the policy's window: a burst a while ago still sizes the caps.
func TestPartitionsDemandPeak(t *testing.T) {
	t.Parallel()
	p, now := newTestPartitions(t, 0)
	step := func(util float64) {
		p.observe(*now, true, "/run/mps", []partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true, lsUtil: util,
			lsKnown: true}}, func(types.UID) bool { return true })
		*now = now.Add(time.Second)
	}
	step(70)
	for range 30 {
		step(5)
	}
	step(0) // a zero sample does not lower the peak
	c, _, _ := p.MPSClient(req("b", "c", 0, true, 0))
	if c.ActiveThreadPercent != 10 {
		t.Fatalf("batch cap %d 30 s after LS peaked at 70 %%, want 10", c.ActiveThreadPercent)
	}
	for range 130 {
		step(5)
	}
	if c, _, _ := p.MPSClient(req("b", "c", 0, true, 0)); c.ActiveThreadPercent != 25 {
		t.Fatalf("batch cap %d long after the peak, want 25", c.ActiveThreadPercent)
	}
}

// MPSClient from the NRI plugin's goroutines while the loop observes (run with -race).
func TestPartitionsConcurrent(t *testing.T) {
	t.Parallel()
	p, _ := newTestPartitions(t, 10)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				if _, ok, err := p.MPSClient(req(fmt.Sprintf("pod-%d-%d", g, i%7), "c", 0, i%2 == 0, 10)); !ok || err != nil {
					t.Errorf("MPSClient: %v %v", ok, err)
					return
				}
				_ = p.MPSOn("GPU-0")
				_ = p.Clients()
			}
		})
	}
	for i := range 200 {
		p.observe(partT0.Add(time.Duration(i)*time.Millisecond), true, "/run/mps",
			[]partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true, lsUtil: float64(i % 50), lsKnown: true}},
			func(types.UID) bool { return true })
	}
	wg.Wait()
	if n := len(p.Clients()); n != 28 {
		t.Fatalf("%d clients, want 28 (4 goroutines × 7 pods)", n)
	}
}

// The memory limit is recorded with the client, follows the GPU's total as last read (a
// step that could not read it keeps the last), is none while the total was never read,
// and the step's caps carry each pod's largest limit, their sum and its ordinals.
func TestPartitionsMemLimit(t *testing.T) {
	t.Parallel()
	p := NewPartitions(qos.DefaultGPUMPSPolicy())
	observe := func(total uint64) map[string]map[types.UID]clientCaps {
		return p.observe(partT0, true, "/run/mps", []partitionGPUObs{{index: 0, uuid: "GPU-0", mpsOn: true,
			lsKnown: true, memTotal: total}}, func(types.UID) bool { return true })
	}
	observe(0)
	if c, ok, err := p.MPSClient(req("b", "c", 0, true, 250)); !ok || err != nil || c.PinnedMemLimitMiB != 0 {
		t.Fatalf("total never read: %+v %v %v, want no limit", c, ok, err)
	}
	if cl := p.Clients()[0]; cl.MemLimitMiB != 0 || !strings.Contains(cl.MemReason, "memory is unknown") {
		t.Fatalf("record without a total: %+v", cl)
	}
	observe(2000 << 20)
	observe(0) // unreadable this step: the last total stays
	r := req("b", "c", 0, true, 250)
	r.Devices = 2
	if c, _, _ := p.MPSClient(r); c.PinnedMemLimitMiB != 500 {
		t.Fatalf("limit %d MiB, want 500 (250 milli of 2000 MiB)", c.PinnedMemLimitMiB)
	}
	if c, _, _ := p.MPSClient(req("b", "d", 0, true, 100)); c.PinnedMemLimitMiB != 200 {
		t.Fatalf("limit %d MiB, want 200", c.PinnedMemLimitMiB)
	}
	if c, _, _ := p.MPSClient(req("l", "c", 0, false, 500)); c.PinnedMemLimitMiB != 0 {
		t.Fatalf("LS limit %d MiB, want none", c.PinnedMemLimitMiB)
	}
	cls := p.Clients()
	if len(cls) != 3 || cls[0].MemLimitMiB != 500 || !strings.Contains(cls[0].MemReason, "500 MiB: 250 milli of 2000 MiB") ||
		cls[2].MemLimitMiB != 0 || !strings.Contains(cls[2].MemReason, "LS: no memory limit") {
		t.Fatalf("records %+v", cls)
	}
	caps := observe(2000 << 20)["GPU-0"]
	if caps["b"] != (clientCaps{batch: true, cap: 25, memMiB: 500, memSum: 700, memDevices: 2}) ||
		caps["l"] != (clientCaps{cap: 75, memDevices: 1, memNone: true}) {
		t.Fatalf("caps %+v", caps)
	}
}
