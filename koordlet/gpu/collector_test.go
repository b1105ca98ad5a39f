//go:build cgo

package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Queries a gpuStep can fail.
const (
	qHandle   = "handle"
	qUUID     = "uuid"
	qMemory   = "memory"
	qUtil     = "util"
	qRunning  = "running"
	qProcUtil = "procutil"
)

// gpuStep is what one GPU answers during one scrape of a trace. The zero value is an
// idle GPU: no processes, no utilisation samples (ERROR_NOT_FOUND).
type gpuStep struct {
	util, memUtil uint32
	memUsed       uint64
	running       []nvml.ProcessInfo
	samples       []nvml.ProcessUtilizationSample
	// procUtilRet overrides GetProcessUtilization's return (e.g. INSUFFICIENT_SIZE).
	procUtilRet nvml.Return
	// procUtilPanics is how many GetProcessUtilization calls of the step panic, as
	// go-nvml's does when samples arrive between its two driver calls.
	procUtilPanics int
	// memV2Ret overrides GetMemoryInfo_v2's return (an older driver, a lost GPU).
	memV2Ret nvml.Return
	fail     map[string]nvml.Return
}

// fakeNode is an 8-GPU DGX A100 from go-nvml's mocks whose per-scrape answers
// come from a trace.
type fakeNode struct {
	srv *dgxa100.Server

	mu     sync.Mutex
	steps  map[int]gpuStep
	panics map[int]int // GPU → GetProcessUtilization calls left to panic
}

func newFakeNode() *fakeNode {
	f := &fakeNode{srv: dgxa100.New()}
	for i, dev := range f.srv.Devices {
		d := dev.(*dgxa100.Device)
		d.UUID = fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
		failed := func(q string) nvml.Return {
			if r, ok := f.step(i).fail[q]; ok {
				return r
			}
			return nvml.SUCCESS
		}
		d.GetUUIDFunc = func() (string, nvml.Return) {
			if r := failed(qUUID); r != nvml.SUCCESS {
				return "", r
			}
			return d.UUID, nvml.SUCCESS
		}
		// v1 counts the driver's reserved memory as used, v2 apart.
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			if r := failed(qMemory); r != nvml.SUCCESS {
				return nvml.Memory{}, r
			}
			used := f.step(i).memUsed + fakeReserved
			return nvml.Memory{Total: d.MemoryInfo.Total, Used: used, Free: d.MemoryInfo.Total - used}, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			if r := failed(qMemory); r != nvml.SUCCESS {
				return nvml.Memory_v2{}, r
			}
			s := f.step(i)
			if s.memV2Ret != nvml.SUCCESS {
				return nvml.Memory_v2{}, s.memV2Ret
			}
			return nvml.Memory_v2{Total: d.MemoryInfo.Total, Reserved: fakeReserved, Used: s.memUsed,
				Free: d.MemoryInfo.Total - fakeReserved - s.memUsed}, nvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			if r := failed(qUtil); r != nvml.SUCCESS {
				return nvml.Utilization{}, r
			}
			s := f.step(i)
			return nvml.Utilization{Gpu: s.util, Memory: s.memUtil}, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if r := failed(qRunning); r != nvml.SUCCESS {
				return nil, r
			}
			return f.step(i).running, nvml.SUCCESS
		}
		d.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			if r := failed(qProcUtil); r != nvml.SUCCESS {
				return nil, r
			}
			if f.panicNow(i) {
				var buf []nvml.ProcessUtilizationSample
				n := 1
				return buf[:n], nvml.ERROR_INSUFFICIENT_SIZE // go-nvml's slice past its buffer
			}
			s := f.step(i)
			// Like the driver: only samples newer than since.
			var out []nvml.ProcessUtilizationSample
			for _, x := range s.samples {
				if x.TimeStamp > since {
					out = append(out, x)
				}
			}
			if s.procUtilRet != nvml.SUCCESS {
				return append([]nvml.ProcessUtilizationSample{}, out...), s.procUtilRet
			}
			if len(out) == 0 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return out, nvml.SUCCESS
		}
	}
	handle := f.srv.DeviceGetHandleByIndexFunc
	f.srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if r, ok := f.step(i).fail[qHandle]; ok {
			return nil, r
		}
		return handle(i)
	}
	return f
}

func (f *fakeNode) step(i int) gpuStep {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.steps[i]
}

func (f *fakeNode) set(steps map[int]gpuStep) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = steps
	f.panics = map[int]int{}
	for i, s := range steps {
		f.panics[i] = s.procUtilPanics
	}
}

// panicNow reports whether this GetProcessUtilization call of GPU i panics (the step's
// procUtilPanics first calls do).
func (f *fakeNode) panicNow(i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics[i] > 0 {
		f.panics[i]--
		return true
	}
	return false
}

// sinceArgs returns the lastSeenTimestamp arguments GPU i was asked with.
func (f *fakeNode) sinceArgs(i int) []uint64 {
	var out []uint64
	for _, c := range f.srv.Devices[i].(*dgxa100.Device).GetProcessUtilizationCalls() {
		out = append(out, c.V)
	}
	return out
}

// The fake /proc's processes.
const (
	pidLS     = 101 // an LS pod (cgroupfs, v2)
	pidBatch  = 202 // a batch pod below the agent's tier (systemd, v2)
	pidSystem = 303 // a system daemon
	pidExited = 404 // no /proc entry: exited, or another PID namespace
	pidLS2    = 505 // a second container of the LS pod (hybrid v1)
	lsUID     = "11111111-aaaa-4bbb-8ccc-dddddddddddd"
	batchUID  = "22222222-aaaa-4bbb-8ccc-dddddddddddd"
	lsCtr     = "aa00000000000000000000000000000000000000000000000000000000000001"
	lsCtr2    = "aa00000000000000000000000000000000000000000000000000000000000002"
	batchCtr  = "bb00000000000000000000000000000000000000000000000000000000000001"
	mib       = 1 << 20
	// fakeReserved is the memory the fake driver reserves: v1 counts it as used.
	fakeReserved = 600 * mib
	scrapeStep   = 100 * time.Millisecond
)

var (
	lsPod    = PodRef{UID: lsUID, ContainerID: lsCtr}
	lsPod2   = PodRef{UID: lsUID, ContainerID: lsCtr2}
	batchPod = PodRef{UID: batchUID, ContainerID: batchCtr}
	t0       = time.Unix(1_700_000_000, 0)
)

// newFakeCollector is a Collector over a new fakeNode and fakeProc, closed when the test
// ends.
func newFakeCollector(t testing.TB) (*fakeNode, *Collector) {
	t.Helper()
	f := newFakeNode()
	c, err := NewCollector(f.srv, fakeProc(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return f, c
}

func fakeProc(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	writeCgroup(t, root, pidLS, "0::/kubepods/burstable/pod"+lsUID+"/"+lsCtr+"\n")
	writeCgroup(t, root, pidBatch, "0::/kubepods.slice/kubepods-understory_batch.slice/kubepods-understory_batch-pod"+
		strings.ReplaceAll(batchUID, "-", "_")+".slice/cri-containerd-"+batchCtr+".scope\n")
	writeCgroup(t, root, pidSystem, "0::/system.slice/nvidia-persistenced.service\n")
	writeCgroup(t, root, pidLS2, v1File("/kubepods/burstable/pod"+lsUID+"/"+lsCtr2)+"0::/\n")
	for _, pid := range []uint32{pidLS, pidBatch, pidSystem, pidLS2} {
		writeStat(t, root, pid, uint64(pid)*1000)
	}
	return root
}

// at is the time of scrape k; us the driver's timestamp of a sample taken shortly
// before it.
func at(k int) time.Time { return t0.Add(time.Duration(k) * scrapeStep) }
func us(k int) uint64    { return uint64(at(k).Add(-scrapeStep / 2).UnixMicro()) }

// running lists LS and batch holding memory on a GPU.
var running = []nvml.ProcessInfo{{Pid: pidLS, UsedGpuMemory: 2048 * mib}, {Pid: pidBatch, UsedGpuMemory: 8192 * mib}}

// wantGPU is what one device must read at one scrape. Devices a scrape does not
// name must be healthy and idle.
type wantGPU struct {
	unhealthy   bool
	lost        bool
	noUUID      bool
	util        float64
	unsupported bool
	procs       []Process
	// since, when set, is the lastSeenTimestamp the driver must have been asked with;
	// calls, when set, how many times it must have been asked for samples so far.
	since uint64
	calls int
}

func TestCollectTraces(t *testing.T) {
	t.Parallel()
	lost := map[string]nvml.Return{qMemory: nvml.ERROR_GPU_IS_LOST, qUtil: nvml.ERROR_GPU_IS_LOST,
		qRunning: nvml.ERROR_GPU_IS_LOST, qProcUtil: nvml.ERROR_GPU_IS_LOST}
	// Processes hold memory but the driver has no sample since the last scrape.
	lsIdle := gpuStep{util: 40, memUsed: 10240 * mib, running: running}
	for _, tc := range []struct {
		name  string
		trace []map[int]gpuStep
		want  []map[int]wantGPU
	}{
		{
			name: "LS burst",
			trace: []map[int]gpuStep{
				{2: {util: 30, running: running, samples: []nvml.ProcessUtilizationSample{
					{Pid: pidBatch, TimeStamp: us(0), SmUtil: 30, MemUtil: 10}}}},
				{2: {util: 95, running: running, samples: []nvml.ProcessUtilizationSample{
					{Pid: pidBatch, TimeStamp: us(1), SmUtil: 10, MemUtil: 5},
					{Pid: pidLS, TimeStamp: us(1), SmUtil: 85, MemUtil: 40}}}},
				{2: {util: 100, running: running, samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(2) - 1000, SmUtil: 70},
					{Pid: pidLS, TimeStamp: us(2), SmUtil: 99, MemUtil: 50}}}},
				{2: {util: 100, running: running, samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(2), SmUtil: 99, MemUtil: 50}}}},
			},
			want: []map[int]wantGPU{
				{2: {util: 30, since: uint64(at(0).Add(-processSampleWindow).UnixMicro()), procs: []Process{
					{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod},
					{PID: pidBatch, SMUtil: 30, MemUtil: 10, MemUsed: 8192 * mib, Pod: batchPod}}}},
				{2: {util: 95, since: us(0), procs: []Process{
					{PID: pidLS, SMUtil: 85, MemUtil: 40, MemUsed: 2048 * mib, Pod: lsPod},
					{PID: pidBatch, SMUtil: 10, MemUtil: 5, MemUsed: 8192 * mib, Pod: batchPod}}}},
				// The newest of a process's samples counts; batch had none, but its last
				// one is held: the pass without it counts from the next read on.
				{2: {util: 100, since: us(1), procs: []Process{
					{PID: pidLS, SMUtil: 99, MemUtil: 50, MemUsed: 2048 * mib, Pod: lsPod},
					{PID: pidBatch, SMUtil: 10, MemUtil: 5, MemUsed: 8192 * mib, Pod: batchPod}}}},
				// A pass a read before returned (scrape 2's) lacked batch: it is idle.
				{2: {util: 100, since: us(2), procs: []Process{
					{PID: pidLS, SMUtil: 99, MemUtil: 50, MemUsed: 2048 * mib, Pod: lsPod},
					{PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}}},
			},
		},
		{
			name:  "LS idle: no samples is normal",
			trace: []map[int]gpuStep{{0: lsIdle}, {0: lsIdle}},
			want: []map[int]wantGPU{
				{0: {util: 40, procs: []Process{
					{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod}, {PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}}},
				{0: {util: 40, procs: []Process{
					{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod}, {PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}}},
			},
		},
		{
			name: "held between the driver's samples",
			trace: []map[int]gpuStep{
				{5: {util: 100, running: running[:1], samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(0), SmUtil: 100}}}},
				{5: {util: 0, running: running[:1]}},
				{5: {util: 100, running: running[:1], samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(2), SmUtil: 100}}}},
				// Scrape 3 comes before the next pass can (us(2) + the 2-scrape period
				// seen): the driver is not asked. Scrape 4: the driver still holds
				// scrape 2's sample; it must not be read twice.
				{5: {util: 0, running: running[:1], samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(2), SmUtil: 100}}}},
				{5: {util: 0, running: running[:1], samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(2), SmUtil: 100}}}},
			},
			want: []map[int]wantGPU{
				{5: {util: 100, procs: []Process{{PID: pidLS, SMUtil: 100, MemUsed: 2048 * mib, Pod: lsPod}}}},
				{5: {util: 0, since: us(0), procs: []Process{{PID: pidLS, SMUtil: 100, MemUsed: 2048 * mib, Pod: lsPod}}}},
				{5: {util: 100, since: us(0), procs: []Process{{PID: pidLS, SMUtil: 100, MemUsed: 2048 * mib, Pod: lsPod}}}},
				{5: {util: 0, calls: 3, procs: []Process{{PID: pidLS, SMUtil: 100, MemUsed: 2048 * mib, Pod: lsPod}}}},
				{5: {util: 0, since: us(2), calls: 4, procs: []Process{{PID: pidLS, SMUtil: 100, MemUsed: 2048 * mib, Pod: lsPod}}}},
			},
		},
		{
			name: "device lost mid-run",
			trace: []map[int]gpuStep{
				{3: {util: 50, running: running}},
				{3: {util: 50, running: running}},
				{3: {fail: lost}},
				{3: {fail: map[string]nvml.Return{qHandle: nvml.ERROR_GPU_IS_LOST}}},
			},
			want: []map[int]wantGPU{
				{3: {util: 50, procs: []Process{
					{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod}, {PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}}},
				{3: {util: 50, procs: []Process{
					{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod}, {PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}}},
				{3: {unhealthy: true, lost: true}},
				{3: {unhealthy: true, lost: true, noUUID: true}},
			},
		},
		{
			name: "process exits between listing and reading",
			trace: []map[int]gpuStep{{1: {util: 20, running: []nvml.ProcessInfo{
				{Pid: pidExited, UsedGpuMemory: 512 * mib}, {Pid: pidLS, UsedGpuMemory: 2048 * mib}},
				samples: []nvml.ProcessUtilizationSample{{Pid: pidExited, TimeStamp: us(0), SmUtil: 20, MemUtil: 3}}}}},
			want: []map[int]wantGPU{{1: {util: 20, procs: []Process{
				{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod},
				{PID: pidExited, SMUtil: 20, MemUtil: 3, MemUsed: 512 * mib}}}}},
		},
		{
			name: "system process, sampled-only process, second container, unknown memory",
			trace: []map[int]gpuStep{{6: {util: 60, running: []nvml.ProcessInfo{
				{Pid: pidSystem, UsedGpuMemory: 100 * mib},
				{Pid: pidLS2, UsedGpuMemory: ^uint64(0)}, // NVML_VALUE_NOT_AVAILABLE
				{Pid: pidLS2, UsedGpuMemory: 0}},
				samples: []nvml.ProcessUtilizationSample{
					{Pid: pidLS, TimeStamp: us(0), SmUtil: 60},
					{Pid: pidLS2, TimeStamp: us(0), SmUtil: 250}, // out of range: clamped
					{Pid: 0, TimeStamp: us(0), SmUtil: 1}}}}},    // no process: dropped
			want: []map[int]wantGPU{{6: {util: 60, procs: []Process{
				{PID: pidLS, SMUtil: 60, Pod: lsPod},
				{PID: pidSystem, MemUsed: 100 * mib},
				{PID: pidLS2, SMUtil: 100, Pod: lsPod2}}}}},
		},
		{
			name:  "a process on two GPUs",
			trace: []map[int]gpuStep{{0: {running: running[1:]}, 7: {running: running[1:]}}},
			want: []map[int]wantGPU{{
				0: {procs: []Process{{PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}},
				7: {procs: []Process{{PID: pidBatch, MemUsed: 8192 * mib, Pod: batchPod}}},
			}},
		},
		{
			name: "transient failure recovers",
			trace: []map[int]gpuStep{
				{4: {fail: map[string]nvml.Return{qProcUtil: nvml.ERROR_UNKNOWN}}},
				{4: {fail: map[string]nvml.Return{qRunning: nvml.ERROR_TIMEOUT}}},
				{4: {util: 10}},
			},
			want: []map[int]wantGPU{{4: {unhealthy: true}}, {4: {unhealthy: true}}, {4: {util: 10}}},
		},
		{
			name: "MIG mode: no utilisation, still healthy",
			trace: []map[int]gpuStep{{2: {running: running[:1],
				fail: map[string]nvml.Return{qUtil: nvml.ERROR_NOT_SUPPORTED, qProcUtil: nvml.ERROR_NOT_SUPPORTED}}}},
			want: []map[int]wantGPU{{2: {unsupported: true, procs: []Process{
				{PID: pidLS, MemUsed: 2048 * mib, Pod: lsPod}}}}},
		},
		{
			name:  "zero samples counted (INSUFFICIENT_SIZE, empty)",
			trace: []map[int]gpuStep{{1: {util: 5, procUtilRet: nvml.ERROR_INSUFFICIENT_SIZE}}},
			want:  []map[int]wantGPU{{1: {util: 5}}},
		},
		{
			name:  "process listing not supported",
			trace: []map[int]gpuStep{{1: {util: 5, fail: map[string]nvml.Return{qRunning: nvml.ERROR_NOT_SUPPORTED}}}},
			want:  []map[int]wantGPU{{1: {util: 5}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := newFakeCollector(t)
			for k, steps := range tc.trace {
				f.set(steps)
				s, err := c.Collect(context.Background(), at(k), nil)
				if err != nil {
					t.Fatalf("scrape %d: %v", k, err)
				}
				if !s.Time.Equal(at(k)) || len(s.Devices) != 8 {
					t.Fatalf("scrape %d: time %v, %d devices; want %v, 8", k, s.Time, len(s.Devices), at(k))
				}
				for i, d := range s.Devices {
					w := tc.want[k][i]
					checkDevice(t, k, i, d, w)
					if w.since != 0 {
						args := f.sinceArgs(i)
						if got := args[len(args)-1]; got != w.since {
							t.Errorf("scrape %d GPU %d: asked for samples since %d, want %d", k, i, got, w.since)
						}
					}
					if w.calls != 0 {
						if got := len(f.sinceArgs(i)); got != w.calls {
							t.Errorf("scrape %d GPU %d: driver asked %d times for samples, want %d", k, i, got, w.calls)
						}
					}
				}
			}
		})
	}
}

// TestCollectAttributionCache: a process's pod is read from its cgroup once and kept
// while the process (PID and start time, read again every attrRecheck) stays on a GPU; a
// reused PID, an exited process, or a PID that left every GPU is read again.
func TestCollectAttributionCache(t *testing.T) {
	t.Parallel()
	const pid = 606
	f := newFakeNode()
	root := fakeProc(t)
	c, err := NewCollector(f.srv, root)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lsPath := "0::/kubepods/burstable/pod" + lsUID + "/" + lsCtr + "\n"
	batchPath := "0::/kubepods/besteffort/pod" + batchUID + "/" + batchCtr + "\n"
	on := func(time.Time) map[int]gpuStep {
		return map[int]gpuStep{0: {running: []nvml.ProcessInfo{{Pid: pid, UsedGpuMemory: mib}}},
			3: {running: []nvml.ProcessInfo{{Pid: pid, UsedGpuMemory: mib}}}}
	}
	// The process exited; the driver still has a sample of it, taken just before now.
	sampledOnly := func(now time.Time) map[int]gpuStep {
		return map[int]gpuStep{0: {samples: []nvml.ProcessUtilizationSample{
			{Pid: pid, TimeStamp: uint64(now.Add(-time.Millisecond).UnixMicro()), SmUtil: 7}}}}
	}
	off := func(time.Time) map[int]gpuStep { return map[int]gpuStep{} }
	recheck := attrRecheck + scrapeStep
	steps := []struct {
		name  string
		after time.Duration // since the previous scrape
		setup func()
		gpus  func(now time.Time) map[int]gpuStep
		want  PodRef
	}{
		{"first sight reads the cgroup", 0, func() { writeCgroup(t, root, pid, lsPath); writeStat(t, root, pid, 500) },
			on, lsPod},
		{"same process: cached, the cgroup is not read", scrapeStep, func() { writeCgroup(t, root, pid, batchPath) },
			on, lsPod},
		{"PID reused: unseen until attrRecheck has passed", scrapeStep, func() { writeStat(t, root, pid, 900) }, on,
			lsPod},
		{"PID reused: another start time, read again", recheck, func() {}, on, batchPod},
		{"exited, within attrRecheck: its last pod", scrapeStep,
			func() { _ = os.RemoveAll(filepath.Join(root, strconv.Itoa(pid))) }, sampledOnly, batchPod},
		{"exited: unattributed", recheck, func() {}, sampledOnly, PodRef{}},
		{"back with an entry", scrapeStep, func() { writeCgroup(t, root, pid, lsPath); writeStat(t, root, pid, 900) },
			on, lsPod},
		{"off every GPU", scrapeStep, func() {}, off, PodRef{}},
		{"back with the same start time: read again", scrapeStep, func() { writeCgroup(t, root, pid, batchPath) },
			on, batchPod},
	}
	now := t0
	for _, st := range steps {
		st.setup()
		now = now.Add(st.after)
		gpus := st.gpus(now)
		f.set(gpus)
		s, err := c.Collect(context.Background(), now, nil)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		listed := 0
		for _, d := range s.Devices {
			for _, p := range d.Processes {
				if p.PID != pid {
					continue
				}
				listed++
				if p.Pod != st.want {
					t.Fatalf("%s: GPU %d attributes pid %d to %+v, want %+v", st.name, d.Index, pid, p.Pod, st.want)
				}
			}
		}
		if listed != len(gpus) {
			t.Fatalf("%s: pid %d on %d GPUs, want %d", st.name, pid, listed, len(gpus))
		}
		if _, kept := c.attr[pid]; kept != (len(gpus) > 0) {
			t.Fatalf("%s: cache entry kept %t, want %t (kept while the PID is on a GPU)", st.name, kept,
				len(gpus) > 0)
		}
	}
}

func checkDevice(t *testing.T, k, i int, d Device, w wantGPU) {
	t.Helper()
	if d.Index != i {
		t.Errorf("scrape %d: device %d has index %d", k, i, d.Index)
	}
	wantUUID := fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
	if w.noUUID {
		wantUUID = ""
	}
	if d.UUID != wantUUID {
		t.Errorf("scrape %d GPU %d: UUID %q, want %q", k, i, d.UUID, wantUUID)
	}
	if d.Healthy == w.unhealthy {
		t.Errorf("scrape %d GPU %d: healthy %v (err %q), want %v", k, i, d.Healthy, d.Err, !w.unhealthy)
	}
	if w.unhealthy {
		if d.Err == "" || d.Fault == nil || d.Err != d.Fault.Error() {
			t.Errorf("scrape %d GPU %d: unhealthy without a matching Err/Fault: %q, %v", k, i, d.Err, d.Fault)
		}
		if errors.Is(d.Fault, ErrDeviceLost) != w.lost {
			t.Errorf("scrape %d GPU %d: lost = %v, want %v (%v)", k, i, !w.lost, w.lost, d.Fault)
		}
		return
	}
	if d.Err != "" || d.Fault != nil {
		t.Errorf("scrape %d GPU %d: healthy with an error: %q, %v", k, i, d.Err, d.Fault)
	}
	if d.Model != "Mock NVIDIA A100-SXM4-40GB" || d.MemTotal != 40*1024*mib {
		t.Errorf("scrape %d GPU %d: model %q, memory %d", k, i, d.Model, d.MemTotal)
	}
	if d.Util != w.util || d.UtilUnsupported != w.unsupported {
		t.Errorf("scrape %d GPU %d: util %v (unsupported %v), want %v (%v)", k, i, d.Util, d.UtilUnsupported,
			w.util, w.unsupported)
	}
	if diff := cmp.Diff(w.procs, d.Processes, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("scrape %d GPU %d: processes (-want +got):\n%s", k, i, diff)
	}
}

// TestCollectLogsHealthChanges: a device going bad and coming back is logged
// once each way, not every scrape.
func TestCollectLogsHealthChanges(t *testing.T) {
	t.Parallel()
	f := newFakeNode()
	var buf syncBuffer
	c, err := open(f.srv, fakeProc(t), slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bad := map[int]gpuStep{1: {fail: map[string]nvml.Return{qMemory: nvml.ERROR_GPU_IS_LOST}}}
	for k, steps := range []map[int]gpuStep{nil, bad, bad, bad, nil, nil} {
		f.set(steps)
		if _, err := c.Collect(context.Background(), at(k), nil); err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	if n := strings.Count(out, "GPU unhealthy"); n != 1 || !strings.Contains(out, "lost=true") {
		t.Errorf("logged unhealthy %d times, want once with lost=true:\n%s", n, out)
	}
	if n := strings.Count(out, "GPU healthy again"); n != 1 {
		t.Errorf("logged recovery %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "NVML ready") || !strings.Contains(out, "gpus=8") {
		t.Errorf("no start line:\n%s", out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestOpenWithoutNVML(t *testing.T) {
	t.Parallel()
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED,
		nvml.ERROR_NO_PERMISSION, nvml.ERROR_LIB_RM_VERSION_MISMATCH} {
		t.Run(ret.Error(), func(t *testing.T) {
			t.Parallel()
			lib := &mock.Interface{InitFunc: func() nvml.Return { return ret }}
			c, err := open(lib, t.TempDir(), nil)
			if !errors.Is(err, ErrNoNVML) || !errors.Is(err, ret) || c != nil {
				t.Fatalf("open = %v, %v; want ErrNoNVML wrapping %v", c, err, ret)
			}
			if n := len(lib.ShutdownCalls()); n != 0 {
				t.Fatalf("Shutdown called %d times after a failed Init", n)
			}
		})
	}
}

// TestOpenReal loads the real libnvidia-ml.so.1 and scrapes every GPU through it.
// It needs the NVIDIA driver: elsewhere it skips, saying so (the GPU machine runs it
// as a compiled test binary, docs/gpu.md). TestOpenRealWithoutNVML checks the other side.
func TestOpenReal(t *testing.T) {
	t.Parallel()
	src, err := Open("/proc", nil)
	if errors.Is(err, ErrNoNVML) {
		t.Skipf("needs the NVIDIA driver's NVML (a GPU machine): %v", err)
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer src.Close()
	s, err := src.Collect(context.Background(), time.Now(), nil)
	if err != nil {
		t.Fatalf("Collect on a real GPU: %v", err)
	}
	if len(s.Devices) == 0 {
		t.Fatal("NVML opened but listed no GPU")
	}
	for _, d := range s.Devices {
		if d.Healthy && (d.UUID == "" || d.MemTotal == 0) {
			t.Errorf("real GPU %d read healthy but empty: %+v", d.Index, d)
		}
	}
}

// TestOpenRealWithoutNVML: on a machine without the NVIDIA driver, the real Open
// reports ErrNoNVML (the agent then runs with GPU features off), not another error.
func TestOpenRealWithoutNVML(t *testing.T) {
	t.Parallel()
	src, err := Open("/proc", nil)
	if err == nil {
		src.Close()
		t.Skip("NVML is present here: TestOpenReal covers this machine")
	}
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("Open without NVML: %v, want ErrNoNVML", err)
	}
}

func TestNewCollectorRejects(t *testing.T) {
	t.Parallel()
	uninit := &mock.Interface{DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }}
	for _, tc := range []struct {
		name     string
		lib      nvml.Interface
		procRoot string
		noNVML   bool
	}{
		{"nil library", nil, "/proc", true},
		{"uninitialised library", uninit, "/proc", true},
		{"empty proc root", dgxa100.New(), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewCollector(tc.lib, tc.procRoot)
			if err == nil || c != nil {
				t.Fatalf("NewCollector = %v, %v; want an error", c, err)
			}
			if errors.Is(err, ErrNoNVML) != tc.noNVML {
				t.Fatalf("errors.Is(%v, ErrNoNVML) = %v, want %v", err, !tc.noNVML, tc.noNVML)
			}
		})
	}
	// A failed NewCollector after a good Init gives the library back.
	srv := dgxa100.New()
	if _, err := open(srv, "", nil); err == nil {
		t.Fatal("open with an empty proc root succeeded")
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Fatalf("Shutdown called %d times, want 1", n)
	}
}

func TestCollectWholeScrapeErrors(t *testing.T) {
	t.Parallel()
	t.Run("device count fails", func(t *testing.T) {
		t.Parallel()
		f := newFakeNode()
		c, err := NewCollector(f.srv, fakeProc(t))
		if err != nil {
			t.Fatal(err)
		}
		f.srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
		if _, err := c.Collect(context.Background(), t0, nil); !errors.Is(err, ErrDeviceLost) {
			t.Fatalf("Collect = %v, want ErrDeviceLost", err)
		}
	})
	t.Run("context ended", func(t *testing.T) {
		t.Parallel()
		c, err := NewCollector(newFakeNode().srv, fakeProc(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Collect(ctx, t0, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Collect = %v, want context.Canceled", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		f := newFakeNode()
		c, err := NewCollector(f.srv, fakeProc(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if n := len(f.srv.ShutdownCalls()); n != 1 {
			t.Fatalf("Shutdown called %d times, want 1", n)
		}
		if _, err := c.Collect(context.Background(), t0, nil); !errors.Is(err, ErrNoNVML) {
			t.Fatalf("Collect after Close = %v, want ErrNoNVML", err)
		}
	})
	t.Run("shutdown fails", func(t *testing.T) {
		t.Parallel()
		f := newFakeNode()
		c, err := NewCollector(f.srv, fakeProc(t))
		if err != nil {
			t.Fatal(err)
		}
		f.srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
		if err := c.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
			t.Fatalf("Close = %v, want ERROR_UNKNOWN", err)
		}
	})
}

// TestCollectConcurrent: scrapes from several goroutines are serialised (run
// with -race).
func TestCollectConcurrent(t *testing.T) {
	t.Parallel()
	f := newFakeNode()
	f.set(map[int]gpuStep{0: {running: running}})
	c, err := NewCollector(f.srv, fakeProc(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for k := range 5 {
				s, err := c.Collect(context.Background(), at(g*5+k), nil)
				if err != nil {
					t.Error(err)
					return
				}
				if p := s.Devices[0].Processes; len(p) != 2 || p[0].Pod != lsPod {
					t.Errorf("processes %+v", p)
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkCollect scrapes an 8-GPU mock node with four processes per GPU, each
// attributed through a fake /proc; it reports the cost per device per scrape.
func BenchmarkCollect(b *testing.B) {
	root := b.TempDir()
	f := newFakeNode()
	steps := map[int]gpuStep{}
	for i := range 8 {
		var st gpuStep
		st.util = 70
		for p := range 4 {
			pid := uint32(1000 + 10*i + p)
			uid := fmt.Sprintf("%08d-aaaa-4bbb-8ccc-dddddddddddd", pid)
			writeCgroup(b, root, pid, fmt.Sprintf("0::/kubepods/burstable/pod%s/%064x\n", uid, pid))
			st.running = append(st.running, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 1024 * mib})
			st.samples = append(st.samples, nvml.ProcessUtilizationSample{Pid: pid, SmUtil: 15, MemUtil: 5})
		}
		steps[i] = st
	}
	f.set(steps)
	c, err := NewCollector(f.srv, root)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	k := 0
	for b.Loop() {
		// Fresh samples every scrape, as a busy driver has them.
		f.mu.Lock()
		for i, st := range f.steps {
			for j := range st.samples {
				st.samples[j].TimeStamp = us(k + 1)
			}
			f.steps[i] = st
		}
		f.mu.Unlock()
		s, err := c.Collect(ctx, at(k+1), nil)
		if err != nil || len(s.Devices) != 8 || !s.Devices[7].Processes[3].Pod.Attributed() {
			b.Fatalf("scrape: %v", err)
		}
		k++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(k)/8/1e3, "us/device")
}

// TestCollectMemory: used memory is GetMemoryInfo_v2's, without the driver's reserved
// memory (v1 counted it: 615 MiB above nvidia-smi on an H200); a driver without v2 is
// read with v1, and v2 is not asked again; a v2 failure is a failure.
func TestCollectMemory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		v2       nvml.Return
		used     uint64
		v2Calls  int // over two scrapes
		healthy  bool
		lostWant bool
	}{
		{"v2", nvml.SUCCESS, 3000 * mib, 2, true, false},
		{"no v2 in the driver", nvml.ERROR_FUNCTION_NOT_FOUND, 3000*mib + fakeReserved, 1, true, false},
		{"v2 not supported", nvml.ERROR_NOT_SUPPORTED, 3000*mib + fakeReserved, 1, true, false},
		{"v2 struct too new", nvml.ERROR_ARGUMENT_VERSION_MISMATCH, 3000*mib + fakeReserved, 1, true, false},
		{"lost", nvml.ERROR_GPU_IS_LOST, 0, 2, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := newFakeCollector(t)
			f.set(map[int]gpuStep{1: {memUsed: 3000 * mib, memV2Ret: tc.v2}})
			for k := range 2 {
				s, err := c.Collect(context.Background(), at(k), nil)
				if err != nil {
					t.Fatal(err)
				}
				d := s.Devices[1]
				if d.Healthy != tc.healthy || errors.Is(d.Fault, ErrDeviceLost) != tc.lostWant {
					t.Fatalf("scrape %d: healthy %t (%v), want %t, lost %t", k, d.Healthy, d.Fault, tc.healthy,
						tc.lostWant)
				}
				if d.MemUsed != tc.used || (tc.healthy && d.MemTotal != 40*1024*mib) {
					t.Fatalf("scrape %d: memory used %d MiB of %d MiB, want %d MiB", k, d.MemUsed/mib,
						d.MemTotal/mib, tc.used/mib)
				}
				if used := s.Devices[0].MemUsed; used != 0 {
					t.Fatalf("scrape %d: idle GPU 0 uses %d MiB, want 0 (v2)", k, used/mib)
				}
			}
			if n := len(f.srv.Devices[1].(*dgxa100.Device).GetMemoryInfo_v2Calls()); n != tc.v2Calls {
				t.Fatalf("GetMemoryInfo_v2 called %d times, want %d", n, tc.v2Calls)
			}
		})
	}
}

// driverProc is one process as a scripted driver samples it: busy (SM percent) from
// `from` to `to` (steps of the loop).
type driverProc struct {
	pid      uint32
	sm       uint32
	from, to int
}

// TestCollectHoldsSamples drives a scripted driver over many loop steps: it samples
// every period (a pass; the sample carries the pass's time) and returns a sample only for
// the processes busy in that pass, and the device's utilisation of its last pass, while
// the loop reads every 50 ms. A busy process must never read 0 between passes, and an
// idle one must read 0 within `idleWithin` of the end of its work: one pass and a read
// when another process computes or the device reads idle, about a second when the
// device's utilisation does not tell (a graphics client keeps it above 0).
func TestCollectHoldsSamples(t *testing.T) {
	t.Parallel()
	const step = 50 * time.Millisecond
	for _, tc := range []struct {
		name       string
		period     time.Duration // the driver's sample period
		jitter     time.Duration // each process's sample is stamped up to this after the pass
		procs      []driverProc
		steps      int
		idleWithin time.Duration
		// otherUtil is device utilisation of no compute process (graphics, another
		// container's without a sample): the device never reads idle.
		otherUtil uint32
		// maxCalls, when set, bounds the driver's GetProcessUtilization calls: with a
		// process computing throughout, about one per pass, not one per step.
		maxCalls int
	}{
		{name: "H200: LS stops beside busy batch", period: time.Second / 6, jitter: 3 * time.Millisecond,
			procs: []driverProc{{pidLS, 40, 0, 100}, {pidBatch, 60, 0, 400}, {pidLS, 35, 200, 300}}, steps: 400,
			idleWithin: time.Second/6 + 2*step, maxCalls: 400 * int(step) / int(time.Second/6) * 11 / 10},
		{name: "H200: both stop (batch frozen, LS idle)", period: time.Second / 6,
			procs: []driverProc{{pidLS, 40, 0, 100}, {pidBatch, 60, 0, 100}}, steps: 200,
			idleWithin: 2*time.Second/6 + samplePass + step},
		{name: "H200: both stop, the device busy otherwise", period: time.Second / 6, otherUtil: 5,
			procs: []driverProc{{pidLS, 40, 0, 100}, {pidBatch, 60, 0, 100}}, steps: 200,
			idleWithin: sampleFresh + step},
		{name: "slow driver: LS alone", period: time.Second,
			procs: []driverProc{{pidLS, 20, 0, 200}}, steps: 300,
			idleWithin: 2*time.Second + samplePass + step},
		{name: "slow driver: LS alone, the device busy otherwise", period: time.Second, otherUtil: 3,
			procs: []driverProc{{pidLS, 20, 0, 200}}, steps: 300,
			idleWithin: 2*time.Second + 2*step},
		{name: "LS computes briefly: its one sample", period: time.Second / 4,
			procs: []driverProc{{pidLS, 90, 10, 12}}, steps: 100,
			idleWithin: sampleHoldUnknown + step},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c := newFakeCollector(t)
			clock := func(k int) time.Time { return t0.Add(time.Duration(k) * step) }
			busy := func(p driverProc, at time.Time) bool {
				return !at.Before(clock(p.from)) && at.Before(clock(p.to))
			}
			var samples []nvml.ProcessUtilizationSample // every pass so far
			nextPass := t0.Add(7 * time.Millisecond)
			zeros := 0
			util := tc.otherUtil // the device's, over its last pass
			for k := range tc.steps {
				now := clock(k)
				for !nextPass.After(now) {
					util = tc.otherUtil
					for j, p := range tc.procs {
						if busy(p, nextPass) {
							util = min(util+p.sm, 100)
							ts := nextPass.Add(time.Duration(j) * tc.jitter / time.Duration(len(tc.procs)))
							samples = append(samples, nvml.ProcessUtilizationSample{Pid: p.pid,
								TimeStamp: uint64(ts.UnixMicro()), SmUtil: p.sm})
						}
					}
					nextPass = nextPass.Add(tc.period)
				}
				f.set(map[int]gpuStep{0: {util: util, running: running, samples: slices.Clone(samples)}})
				s, err := c.Collect(context.Background(), now, nil)
				if err != nil {
					t.Fatal(err)
				}
				got := map[uint32]float64{}
				for _, p := range s.Devices[0].Processes {
					got[p.PID] = p.SMUtil
				}
				for _, pid := range []uint32{pidLS, pidBatch} {
					var busyNow, sampled bool
					var want uint32
					idleSince := time.Duration(-1)
					for _, p := range tc.procs {
						if p.pid != pid {
							continue
						}
						if busy(p, now) {
							busyNow, want = true, p.sm
							// Sampled once a pass in its busy interval came.
							first := t0.Add(7 * time.Millisecond)
							for first.Before(clock(p.from)) {
								first = first.Add(tc.period)
							}
							sampled = !now.Before(first)
						} else if !now.Before(clock(p.to)) {
							idleSince = now.Sub(clock(p.to))
						}
					}
					switch {
					case busyNow && sampled && got[pid] != float64(want):
						t.Errorf("step %d: busy pid %d reads %v%%, want %d%%", k, pid, got[pid], want)
						zeros++
					case !busyNow && idleSince >= tc.idleWithin && got[pid] != 0:
						t.Errorf("step %d: pid %d idle for %v reads %v%%, want 0 within %v", k, pid, idleSince,
							got[pid], tc.idleWithin)
					}
				}
				if zeros > 5 {
					t.FailNow()
				}
			}
			if n := len(f.sinceArgs(0)); tc.maxCalls > 0 && n > tc.maxCalls {
				t.Errorf("the driver was asked for samples %d times in %d steps, want at most %d (one a pass)",
					n, tc.steps, tc.maxCalls)
			}
		})
	}
}

// TestCollectRecoversProcessUtilizationPanic: go-nvml's GetProcessUtilization panics when
// samples arrive between its size query and its read. The collector retries once; when
// that panics too, the scrape reads no new sample (the held ones stay) and the GPU stays
// healthy. The same for a second answer that still says ERROR_INSUFFICIENT_SIZE.
func TestCollectRecoversProcessUtilizationPanic(t *testing.T) {
	t.Parallel()
	f := newFakeNode()
	var logs syncBuffer
	c, err := open(f.srv, fakeProc(t), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sample := func(k int, sm uint32) []nvml.ProcessUtilizationSample {
		return []nvml.ProcessUtilizationSample{{Pid: pidLS, TimeStamp: us(k), SmUtil: sm}}
	}
	for k, tc := range []struct {
		name   string
		step   gpuStep
		want   float64
		calls  int // GetProcessUtilization calls of the scrape
		logged int // scrapes that read nothing so far (logged once each)
	}{
		{"no panic", gpuStep{running: running, samples: sample(0, 30)}, 30, 1, 0},
		{"one panic: retried", gpuStep{running: running, samples: sample(1, 45), procUtilPanics: 1}, 45, 2, 0},
		{"two panics: no sample this scrape, the held one stays",
			gpuStep{running: running, samples: sample(2, 80), procUtilPanics: 2}, 45, 2, 1},
		{"next scrape reads again", gpuStep{running: running, samples: sample(3, 70)}, 70, 1, 1},
		{"INSUFFICIENT_SIZE with samples, twice: a race too", gpuStep{running: running, samples: sample(4, 20),
			procUtilRet: nvml.ERROR_INSUFFICIENT_SIZE}, 70, 2, 2},
	} {
		f.set(map[int]gpuStep{4: tc.step})
		before := len(f.sinceArgs(4))
		s, err := c.Collect(context.Background(), at(k), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		d := s.Devices[4]
		if !d.Healthy {
			t.Fatalf("%s: unhealthy: %v", tc.name, d.Fault)
		}
		if len(d.Processes) != 2 || d.Processes[0].PID != pidLS || d.Processes[0].SMUtil != tc.want {
			t.Fatalf("%s: processes %+v, want LS at %v%%", tc.name, d.Processes, tc.want)
		}
		if n := len(f.sinceArgs(4)) - before; n != tc.calls {
			t.Fatalf("%s: %d GetProcessUtilization calls, want %d", tc.name, n, tc.calls)
		}
		if got := strings.Count(logs.String(), "GPU process utilisation unread"); got != tc.logged {
			t.Fatalf("%s: %d unread scrapes logged, want %d:\n%s", tc.name, got, tc.logged, logs.String())
		}
	}
	if n := strings.Count(logs.String(), ErrNVMLPanic.Error()); n != 1 {
		t.Fatalf("the panic logged %d times, want once:\n%s", n, logs.String())
	}
	if _, _, err := getProcessUtilization(&mock.Device{GetProcessUtilizationFunc: func(uint64) (
		[]nvml.ProcessUtilizationSample, nvml.Return) {
		panic("runtime error: slice bounds out of range [:3] with capacity 2")
	}}, 0); !errors.Is(err, ErrNVMLPanic) {
		t.Fatalf("getProcessUtilization of a panicking call = %v, want ErrNVMLPanic", err)
	}
}

// TestCollectAttributesLateJoiner: a process first seen outside its pod's cgroup (it
// opened its CUDA context before the runtime or a launcher moved it), or in its pod's
// cgroup but no container's, is attributed once it moves: its cgroup is read again every
// attrRecheck (no sooner) while it is not fully attributed.
func TestCollectAttributesLateJoiner(t *testing.T) {
	t.Parallel()
	const pid = 707
	f := newFakeNode()
	root := fakeProc(t)
	c, err := NewCollector(f.srv, root)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f.set(map[int]gpuStep{2: {running: []nvml.ProcessInfo{{Pid: pid, UsedGpuMemory: mib}}}})
	writeStat(t, root, pid, 700)
	outside := "0::/system.slice/containerd.service\n"
	podOnly := "0::/kubepods/burstable/pod" + lsUID + "\n"
	inside := "0::/kubepods/burstable/pod" + lsUID + "/" + lsCtr + "\n"
	steps := []struct {
		name   string
		after  time.Duration
		cgroup string // written before the scrape; "" leaves it
		want   PodRef
	}{
		{"first seen outside any pod", 0, outside, PodRef{}},
		{"moved, within attrRecheck: not read yet", scrapeStep, podOnly, PodRef{}},
		{"attrRecheck passed: read again, the pod without its container", attrRecheck, "", PodRef{UID: lsUID}},
		{"moved into its container, within attrRecheck", scrapeStep, inside, PodRef{UID: lsUID}},
		{"attrRecheck passed: attributed", attrRecheck, "", lsPod},
		{"attributed for its life: not read again", attrRecheck + scrapeStep, outside, lsPod},
	}
	now := t0
	for _, st := range steps {
		if st.cgroup != "" {
			writeCgroup(t, root, pid, st.cgroup)
		}
		now = now.Add(st.after)
		s, err := c.Collect(context.Background(), now, nil)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		ps := s.Devices[2].Processes
		if len(ps) != 1 || ps[0].Pod != st.want {
			t.Fatalf("%s: processes %+v, want pid %d in %+v", st.name, ps, pid, st.want)
		}
	}
}
