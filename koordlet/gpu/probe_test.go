//go:build cgo

package gpu

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/qos"
)

// TestCollectProbe: a probe returns the GPU's last full read while its process list is
// unchanged, without any other NVML query or /proc read; a changed list, a failing or
// unsupported listing, or a GPU whose last read failed is read in full.
func TestCollectProbe(t *testing.T) {
	t.Parallel()
	f, c := newFakeCollector(t)
	probe := make([]Scrape, 8)
	for i := range probe {
		probe[i] = ScrapeProbe
	}
	dev := func(i int) *dgxa100.Device { return f.srv.Devices[i].(*dgxa100.Device) }
	sample := func(k int, pid uint32, util uint32) []nvml.ProcessUtilizationSample {
		return []nvml.ProcessUtilizationSample{{Pid: pid, TimeStamp: us(k), SmUtil: util}}
	}
	// Both processes on GPU 0, batch alone on GPU 1; the order of the listing does not
	// matter, nor a PID listed twice (MIG instances).
	f.set(map[int]gpuStep{0: {util: 50, running: running, samples: sample(0, pidBatch, 40)},
		1: {util: 40, running: running[1:]}})
	first, err := c.Collect(context.Background(), at(0), probe)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range first.Devices {
		if d.Probed || !d.ScrapedAt.Equal(at(0)) || !d.Healthy {
			t.Fatalf("first scrape, GPU %d: probed %t at %v healthy %t: the first read must be full", d.Index,
				d.Probed, d.ScrapedAt, d.Healthy)
		}
	}
	queries := func(i int) int { return len(dev(i).GetUUIDCalls()) + len(dev(i).GetProcessUtilizationCalls()) }
	before := queries(0)
	f.set(map[int]gpuStep{0: {util: 99, running: []nvml.ProcessInfo{running[1], running[0], running[1]},
		samples: sample(1, pidLS, 90)}, 1: {util: 40, running: running[1:]}})
	second, err := c.Collect(context.Background(), at(1), probe)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range second.Devices {
		want := first.Devices[i]
		want.Probed = true
		if diff := cmp.Diff(want, d); diff != "" {
			t.Fatalf("probe of an unchanged GPU %d (-want +got):\n%s", i, diff)
		}
	}
	if n := queries(0) - before; n != 0 {
		t.Fatalf("a probe made %d queries besides the listing", n)
	}
	if _, kept := c.attr[pidLS]; !kept {
		t.Fatal("the pod of a probed GPU's process was forgotten")
	}

	for _, tc := range []struct {
		name    string
		step    gpuStep
		healthy bool
	}{
		{"another process: read in full", gpuStep{util: 30, running: running[:1], samples: sample(2, pidLS, 30)},
			true},
		{"listing fails: read in full, unhealthy", gpuStep{fail: map[string]nvml.Return{qRunning: nvml.ERROR_UNKNOWN}},
			false},
		{"last read failed: read in full", gpuStep{util: 30, running: running[:1]}, true},
		{"listing not supported: read in full", gpuStep{util: 30,
			fail: map[string]nvml.Return{qRunning: nvml.ERROR_NOT_SUPPORTED}}, true},
		{"listing still not supported: read in full again", gpuStep{util: 30,
			fail: map[string]nvml.Return{qRunning: nvml.ERROR_NOT_SUPPORTED}}, true},
	} {
		now := at(3).Add(time.Duration(len(tc.name)) * time.Millisecond)
		f.set(map[int]gpuStep{0: tc.step, 1: {util: 40, running: running[1:]}})
		s, err := c.Collect(context.Background(), now, probe)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		d := s.Devices[0]
		if d.Probed || d.Healthy != tc.healthy || (tc.healthy && !d.ScrapedAt.Equal(now)) {
			t.Fatalf("%s: probed %t healthy %t (%s) at %v", tc.name, d.Probed, d.Healthy, d.Err, d.ScrapedAt)
		}
		if tc.healthy && d.Util != 30 {
			t.Fatalf("%s: util %v, want the new 30", tc.name, d.Util)
		}
		if !s.Devices[1].Probed || !s.Devices[1].ScrapedAt.Equal(at(0)) {
			t.Fatalf("%s: unchanged GPU 1 read again", tc.name)
		}
	}
	// Without a plan every GPU is read in full.
	s, err := c.Collect(context.Background(), at(9), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Devices {
		if d.Probed {
			t.Fatalf("GPU %d probed without a plan", d.Index)
		}
	}
}

// TestCollectUtilProbe: ScrapeUtil returns the GPU's last full read with its utilisation
// of now (Probed, UtilNow) while the process list is unchanged, with no per-process
// utilisation, UUID or memory query; a changed list, a failing utilisation query or a GPU
// without utilisation figures is read as ScrapeProbe would be.
func TestCollectUtilProbe(t *testing.T) {
	t.Parallel()
	f, c := newFakeCollector(t)
	plan := []Scrape{ScrapeUtil, ScrapeUtil}
	dev := func(i int) *dgxa100.Device { return f.srv.Devices[i].(*dgxa100.Device) }
	others := func() int {
		d := dev(0)
		return len(d.GetUUIDCalls()) + len(d.GetProcessUtilizationCalls()) + len(d.GetMemoryInfo_v2Calls())
	}
	both := gpuStep{util: 90, memUtil: 30, running: running,
		samples: []nvml.ProcessUtilizationSample{{Pid: pidLS, TimeStamp: us(0), SmUtil: 85}}}
	f.set(map[int]gpuStep{0: both})
	first, err := c.Collect(context.Background(), at(0), plan)
	if err != nil {
		t.Fatal(err)
	}
	if d := first.Devices[0]; d.Probed || d.UtilNow || !d.ScrapedAt.Equal(at(0)) {
		t.Fatalf("first scrape: probed %t utilNow %t at %v: the first read must be full", d.Probed, d.UtilNow,
			d.ScrapedAt)
	}
	before := others()
	idle := both
	idle.util, idle.memUtil, idle.samples = 0, 0, nil
	f.set(map[int]gpuStep{0: idle})
	s, err := c.Collect(context.Background(), at(1), plan)
	if err != nil {
		t.Fatal(err)
	}
	want := first.Devices[0]
	want.Probed, want.UtilNow, want.Util, want.MemUtil = true, true, 0, 0
	if diff := cmp.Diff(want, s.Devices[0]); diff != "" {
		t.Fatalf("utilisation probe of an unchanged GPU (-want +got):\n%s", diff)
	}
	if n := others() - before; n != 0 {
		t.Fatalf("a utilisation probe made %d queries besides the listing and the utilisation", n)
	}
	if d := s.Devices[1]; !d.Probed || !d.UtilNow || d.Util != 0 {
		t.Fatalf("idle GPU 1: probed %t utilNow %t util %v", d.Probed, d.UtilNow, d.Util)
	}

	for _, tc := range []struct {
		name    string
		step    gpuStep
		probed  bool
		healthy bool
	}{
		{"another process: read in full", gpuStep{util: 30, running: running[:1]}, false, true},
		{"utilisation fails: read in full, unhealthy", gpuStep{running: running[:1],
			fail: map[string]nvml.Return{qUtil: nvml.ERROR_UNKNOWN}}, false, false},
		{"read in full after the failure", gpuStep{util: 30, running: running[:1]}, false, true},
		{"unchanged again: utilisation probed", gpuStep{util: 40, running: running[:1]}, true, true},
	} {
		now := at(3).Add(time.Duration(len(tc.name)) * time.Millisecond)
		f.set(map[int]gpuStep{0: tc.step})
		s, err := c.Collect(context.Background(), now, plan)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		d := s.Devices[0]
		if d.Probed != tc.probed || d.UtilNow != tc.probed || d.Healthy != tc.healthy {
			t.Fatalf("%s: probed %t utilNow %t healthy %t (%s)", tc.name, d.Probed, d.UtilNow, d.Healthy, d.Err)
		}
		if tc.healthy && d.Util != float64(tc.step.util) {
			t.Fatalf("%s: util %v, want %d", tc.name, d.Util, tc.step.util)
		}
	}

	// A GPU without utilisation figures (MIG) is only probed: there is nothing to read.
	mig := gpuStep{running: running[:1], fail: map[string]nvml.Return{qUtil: nvml.ERROR_NOT_SUPPORTED,
		qProcUtil: nvml.ERROR_NOT_SUPPORTED}}
	f.set(map[int]gpuStep{0: mig})
	if _, err := c.Collect(context.Background(), at(5), nil); err != nil {
		t.Fatal(err)
	}
	utilCalls := len(dev(0).GetUtilizationRatesCalls())
	s, err = c.Collect(context.Background(), at(6), plan)
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Devices[0]; !d.Probed || d.UtilNow || !d.UtilUnsupported || !d.Healthy {
		t.Fatalf("MIG GPU: probed %t utilNow %t unsupported %t healthy %t", d.Probed, d.UtilNow,
			d.UtilUnsupported, d.Healthy)
	}
	if n := len(dev(0).GetUtilizationRatesCalls()) - utilCalls; n != 0 {
		t.Fatalf("%d utilisation queries of a GPU without utilisation figures", n)
	}
}

// TestManagerReactsOnProbedBatchGPU: a GPU that batch runs alone on is only probed, yet
// an LS process arriving there is read in full and cuts batch in the same step; while
// LS stays and batch is frozen, only the GPU's process list and utilisation are read
// (no per-process utilisation), and LS idle on it thaws batch after `hold`; LS beside
// running batch is read in full every period; once LS left and the duty is back to
// 0, it is probed again. Steps are driven with a fake clock; the time an LS step takes
// to reach frozen batch is the bench's reaction_ms.
func TestManagerReactsOnProbedBatchGPU(t *testing.T) {
	t.Parallel()
	f := newFakeNode()
	c, err := NewCollector(f.srv, fakeProc(t))
	if err != nil {
		t.Fatal(err)
	}
	root := cgroupstest.NewRoot(t, cgroupstest.Hybrid)
	cgroupstest.AddGroup(t, root, cgroupstest.Hybrid, batchCg)
	pods := PodMap{
		lsUID:    {UID: lsUID, Namespace: "web", Name: "infer", Class: qos.ClassLS},
		batchUID: {UID: batchUID, Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: batchCg},
	}
	policy := qos.DefaultGPUThrottlePolicy()
	policy.Hold.Duration = 100 * time.Millisecond
	cyc := newFakeCycler()
	m, err := NewManager(Options{Source: c, Pods: func() PodView { return pods },
		Groups: cgroups.OpenLayout(root, cgroups.LayoutHybrid), Cycler: cyc, Policy: policy,
		Period: 50 * time.Millisecond, FullScrapePeriod: time.Second, ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	now := t0
	smp := func(pid, util uint32) []nvml.ProcessUtilizationSample {
		return []nvml.ProcessUtilizationSample{{Pid: pid, TimeStamp: uint64(now.Add(-time.Millisecond).UnixMicro()),
			SmUtil: util}}
	}
	batchOnly := func() map[int]gpuStep {
		return map[int]gpuStep{0: {util: 60, running: running[1:], samples: smp(pidBatch, 60)}}
	}
	withLS := func() map[int]gpuStep {
		return map[int]gpuStep{0: {util: 95, running: running,
			samples: append(smp(pidBatch, 10), smp(pidLS, 85)...)}}
	}
	type want struct {
		full    bool // GPU 0 read in full this step
		duty    float64
		cadence string
	}
	step := func(name string, gpus func() map[int]gpuStep, w want) {
		t.Helper()
		f.set(gpus())
		m.step(context.Background(), now)
		st := m.Status()
		g := st.GPUs[0]
		d, _ := cyc.get("gpu0")
		if full := g.ScrapedAt.Equal(now); full != w.full || d != w.duty || g.Cadence != w.cadence || !m.fast {
			t.Fatalf("%s: GPU 0 read in full %t (want %t), duty %v (want %v), cadence %q (want %q), fast loop %t",
				name, full, w.full, d, w.duty, g.Cadence, w.cadence, m.fast)
		}
		now = now.Add(50 * time.Millisecond)
	}
	lsIdle := func() map[int]gpuStep { return map[int]gpuStep{0: {util: 0, running: running}} }
	procUtilCalls := func() int { return len(f.srv.Devices[0].(*dgxa100.Device).GetProcessUtilizationCalls()) }
	const frozen = 1.0
	step("first read", batchOnly, want{true, 0, CadenceProbe})
	step("batch alone: probed", batchOnly, want{false, 0, CadenceProbe})
	step("batch alone: probed again", batchOnly, want{false, 0, CadenceProbe})
	step("LS arrives: read in full, frozen at once", withLS, want{true, frozen, CadenceFrozen})
	calls := procUtilCalls()
	step("LS stays: the GPU's utilisation keeps batch frozen", withLS, want{false, frozen, CadenceFrozen})
	step("LS stays", withLS, want{false, frozen, CadenceFrozen})
	if n := procUtilCalls() - calls; n != 0 {
		t.Fatalf("%d per-process utilisation reads while batch was frozen, want 0", n)
	}
	step("LS idle (the GPU's utilisation 0): hold", lsIdle, want{false, frozen, CadenceFrozen})
	step("LS idle for hold: thawed", lsIdle, want{false, 0, CadenceFast})
	step("LS beside running batch: read in full every period", lsIdle, want{true, 0, CadenceFast})
	step("LS busy again: frozen", withLS, want{true, frozen, CadenceFrozen})
	step("LS leaves: seen at once, freeze held", batchOnly, want{true, frozen, CadenceProbe})
	for i := 0; i < 20; i++ {
		f.set(batchOnly())
		m.step(context.Background(), now)
		now = now.Add(50 * time.Millisecond)
	}
	step("thawed: probed again", batchOnly, want{false, 0, CadenceProbe})
}
