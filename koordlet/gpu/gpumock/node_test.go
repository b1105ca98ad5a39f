//go:build cgo

package gpumock

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/koordlet/gpu"
)

const (
	ls1   = 100
	ls2   = 101
	batch = 200
	gib   = uint64(1) << 30
)

func TestNodeDevices(t *testing.T) {
	t.Parallel()
	total := dgxa100.New().Devices[0].(*dgxa100.Device).MemoryInfo.Total
	for _, tc := range []struct {
		name     string
		procs    []Proc
		duty     float64
		util     nvml.Utilization // device utilisation
		memUsed  uint64
		running  []uint32 // PIDs GetComputeRunningProcesses lists
		smByPID  map[uint32]uint32
		noSample bool // GetProcessUtilization(0) answers ERROR_NOT_FOUND
	}{
		{name: "idle", noSample: true},
		{name: "sums", procs: []Proc{{PID: ls1, SMUtil: 30, MemUtil: 10, MemUsed: 2 * gib},
			{PID: ls2, SMUtil: 25, MemUtil: 5, MemUsed: 3 * gib}},
			util: nvml.Utilization{Gpu: 55, Memory: 15}, memUsed: 5 * gib, running: []uint32{ls1, ls2},
			smByPID: map[uint32]uint32{ls1: 30, ls2: 25}},
		{name: "utilisation caps at 100", procs: []Proc{{PID: ls1, SMUtil: 70, MemUtil: 60},
			{PID: ls2, SMUtil: 50, MemUtil: 45}},
			util: nvml.Utilization{Gpu: 100, Memory: 100}, running: []uint32{ls1, ls2},
			smByPID: map[uint32]uint32{ls1: 70, ls2: 50}},
		{name: "memory caps at total", procs: []Proc{{PID: ls1, MemUsed: total}, {PID: ls2, MemUsed: gib}},
			memUsed: total - Reserved, running: []uint32{ls1, ls2}, noSample: true},
		{name: "no sample for a process that did not compute", procs: []Proc{{PID: ls1, SMUtil: 40},
			{PID: ls2, MemUsed: gib}},
			util: nvml.Utilization{Gpu: 40}, memUsed: gib, running: []uint32{ls1, ls2},
			smByPID: map[uint32]uint32{ls1: 40}},
		{name: "batch at duty 0", procs: []Proc{{PID: batch, SMUtil: 80, MemUtil: 20, Batch: true}},
			util: nvml.Utilization{Gpu: 80, Memory: 20}, running: []uint32{batch},
			smByPID: map[uint32]uint32{batch: 80}},
		{name: "batch SM shrinks with the duty", duty: 0.25,
			procs: []Proc{{PID: ls1, SMUtil: 10, MemUtil: 5}, {PID: batch, SMUtil: 80, MemUtil: 20, Batch: true}},
			util:  nvml.Utilization{Gpu: 70, Memory: 25}, running: []uint32{ls1, batch},
			smByPID: map[uint32]uint32{ls1: 10, batch: 60}},
		{name: "batch frozen keeps its memory", duty: 1,
			procs: []Proc{{PID: batch, SMUtil: 80, MemUtil: 20, MemUsed: 4 * gib, Batch: true}},
			util:  nvml.Utilization{Memory: 20}, memUsed: 4 * gib, running: []uint32{batch},
			smByPID: map[uint32]uint32{batch: 0}},
		{name: "duty above 1 clamps", duty: 1.5,
			procs: []Proc{{PID: batch, SMUtil: 80, Batch: true}}, running: []uint32{batch}, noSample: true},
		{name: "negative duty clamps", duty: -0.5,
			procs: []Proc{{PID: batch, SMUtil: 80, Batch: true}}, util: nvml.Utilization{Gpu: 80},
			running: []uint32{batch}, smByPID: map[uint32]uint32{batch: 80}},
		{name: "NaN duty reads 0", duty: math.NaN(),
			procs: []Proc{{PID: batch, SMUtil: 80, Batch: true}}, util: nvml.Utilization{Gpu: 80},
			running: []uint32{batch}, smByPID: map[uint32]uint32{batch: 80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := New()
			if got := len(n.Server().Devices); got != GPUs {
				t.Fatalf("%d devices, want GPUs = %d", got, GPUs)
			}
			const g = 3
			n.Set(g, tc.procs...)
			n.SetDuty(g, tc.duty)
			dev := n.Server().Devices[g]

			u, ret := dev.GetUtilizationRates()
			if ret != nvml.SUCCESS || u != tc.util {
				t.Errorf("utilisation %+v, %v; want %+v", u, ret, tc.util)
			}
			// v2 reports the driver's reserved memory apart, v1 counts it as used.
			m2, ret := dev.GetMemoryInfo_v2()
			if want := (nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total,
				Reserved: Reserved, Used: tc.memUsed, Free: total - Reserved - tc.memUsed}); ret != nvml.SUCCESS ||
				m2 != want {
				t.Errorf("memory v2 %+v, %v; want %+v", m2, ret, want)
			}
			m, ret := dev.GetMemoryInfo()
			if v1 := tc.memUsed + Reserved; ret != nvml.SUCCESS || m != (nvml.Memory{Total: total, Used: v1, Free: total - v1}) {
				t.Errorf("memory v1 %+v, %v; want used %d of %d", m, ret, v1, total)
			}
			ps, ret := dev.GetComputeRunningProcesses()
			var pids []uint32
			for _, p := range ps {
				pids = append(pids, p.Pid)
			}
			if ret != nvml.SUCCESS || !slices.Equal(pids, tc.running) {
				t.Errorf("running %v, %v; want %v", pids, ret, tc.running)
			}

			before := uint64(time.Now().UnixMicro())
			samples, ret := dev.GetProcessUtilization(0)
			if tc.noSample {
				if ret != nvml.ERROR_NOT_FOUND || samples != nil {
					t.Errorf("process utilisation %+v, %v; want ERROR_NOT_FOUND", samples, ret)
				}
			} else {
				got := map[uint32]uint32{}
				for _, s := range samples {
					got[s.Pid] = s.SmUtil
					if s.TimeStamp < before {
						t.Errorf("sample of %d stamped %d, before the query (%d)", s.Pid, s.TimeStamp, before)
					}
				}
				if ret != nvml.SUCCESS || len(got) != len(tc.smByPID) {
					t.Errorf("process utilisation %+v, %v; want SM %v", samples, ret, tc.smByPID)
				}
				for pid, want := range tc.smByPID {
					if sm, ok := got[pid]; !ok || sm != want {
						t.Errorf("process %d: SM %d (sampled %t), want %d", pid, sm, ok, want)
					}
				}
			}
			// The driver returns only samples newer than since.
			future := uint64(time.Now().Add(time.Hour).UnixMicro())
			if samples, ret := dev.GetProcessUtilization(future); ret != nvml.ERROR_NOT_FOUND || samples != nil {
				t.Errorf("process utilisation since an hour ahead: %+v, %v; want ERROR_NOT_FOUND", samples, ret)
			}
			// The other GPUs stay idle.
			if u, _ := n.Server().Devices[g+1].GetUtilizationRates(); u != (nvml.Utilization{}) {
				t.Errorf("GPU %d: utilisation %+v, want idle", g+1, u)
			}
		})
	}
}

func TestSetCopies(t *testing.T) {
	t.Parallel()
	n := New()
	procs := []Proc{{PID: ls1, SMUtil: 10}}
	n.Set(0, procs...)
	procs[0].SMUtil = 99
	got := n.Procs(0)
	got[0].SMUtil = 77
	if p := n.Procs(0); p[0].SMUtil != 10 {
		t.Errorf("SM %d after changing the caller's slices, want 10", p[0].SMUtil)
	}
	n.Set(0)
	if p := n.Procs(0); len(p) != 0 {
		t.Errorf("Set with no processes left %+v", p)
	}
}

// TestCollector checks that the agent's collector reads the mock through Collector and
// attributes its processes to pods through WriteProc's fake /proc.
func TestCollector(t *testing.T) {
	t.Parallel()
	const (
		uid = "9a5b0000-0000-4000-8000-000000000001"
		ctr = "00000000000000000000000000000000000000000000000000000000c0ffee01"
	)
	procRoot := t.TempDir()
	if err := WriteProc(procRoot, ls1, HybridProcCgroup("/kubepods/burstable/pod"+uid+"/"+ctr)); err != nil {
		t.Fatal(err)
	}
	n := New()
	n.Set(1, Proc{PID: ls1, SMUtil: 40, MemUtil: 10, MemUsed: gib})
	c, err := n.Collector(procRoot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.Collect(context.Background(), time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Devices) != GPUs {
		t.Fatalf("%d devices, want %d", len(s.Devices), GPUs)
	}
	d := s.Devices[1]
	want := gpu.Process{PID: ls1, SMUtil: 40, MemUtil: 10, MemUsed: gib,
		Pod: gpu.PodRef{UID: types.UID(uid), ContainerID: ctr}}
	if !d.Healthy || d.Util != 40 || d.MemUsed != gib || len(d.Processes) != 1 || d.Processes[0] != want {
		t.Errorf("GPU 1: %+v, want healthy at 40 %% with %+v", d, want)
	}
}
