package qos

import (
	"errors"
	"math"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/understory/understory/contract"
)

func TestReportPolicyDue(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	free := func(v int) *int { return &v }
	base := func() contract.NodeMetrics {
		return contract.NodeMetrics{Version: contract.NodeMetricsVersion2, Timestamp: t0, WindowMillis: 10000,
			CPU:    contract.CPUMetrics{Capacity: 10000, Used: 4000, LS: 2000, Batch: 1500, BatchBudget: 3000},
			Memory: contract.MemoryMetrics{Capacity: 1000, Used: 500, LS: 300, Batch: 100},
			Batch:  &contract.BatchResources{CPU: 5000, Memory: 400},
			GPU: &contract.GPUMetrics{
				Devices: []contract.GPUDevice{{Index: 0, UUID: "GPU-a", Healthy: true, Util: 50, LSUtil: 30, MemUsed: 10,
					MemTotal: 100, Reclaimable: 0.5, LSFreeMilli: free(700)}},
				Alloc: &contract.GPUAllocation{Pods: []contract.PodGPUs{{Namespace: "a", Name: "p", UID: "u1",
					Devices: []int{0}}, {Namespace: "b", Name: "q", Devices: []int{1, 2}}}},
			}}
	}
	p := DefaultReportPolicy()
	cases := []struct {
		name   string
		noLast bool
		failed bool
		change func(m *contract.NodeMetrics)
		want   ReportReason
	}{
		{name: "first", noLast: true, want: ReportFirst},
		{name: "the same 10 s later", change: func(m *contract.NodeMetrics) { m.Timestamp = t0.Add(10 * time.Second) }},
		{name: "last write failed", failed: true, want: ReportRetry},
		{name: "heartbeat", change: func(m *contract.NodeMetrics) { m.Timestamp = t0.Add(2 * time.Minute) }, want: ReportHeartbeat},
		{name: "just before the heartbeat", change: func(m *contract.NodeMetrics) {
			m.Timestamp = t0.Add(2*time.Minute - time.Millisecond)
		}},
		{name: "CPU used within 10 %", change: func(m *contract.NodeMetrics) { m.CPU.Used += 1000 }},
		{name: "CPU used past 10 %", change: func(m *contract.NodeMetrics) { m.CPU.Used += 1001 }, want: ReportCPU},
		{name: "LS CPU falls past 10 %", change: func(m *contract.NodeMetrics) { m.CPU.LS -= 1001 }, want: ReportCPU},
		{name: "batch CPU moves used: no write", change: func(m *contract.NodeMetrics) {
			m.CPU.Batch += 3000
			m.CPU.Used += 3000
		}},
		{name: "budget is no trigger", change: func(m *contract.NodeMetrics) { m.CPU.BatchBudget = 9000 }},
		{name: "batch gone but used the same: other usage rose", change: func(m *contract.NodeMetrics) { m.CPU.Batch = 0 },
			want: ReportCPU},
		{name: "memory used past 10 %", change: func(m *contract.NodeMetrics) { m.Memory.Used += 101 }, want: ReportMemory},
		{name: "batch memory moves used: no write", change: func(m *contract.NodeMetrics) {
			m.Memory.Used += 300
			m.Memory.Batch += 300
		}},
		{name: "LS memory past 10 %", change: func(m *contract.NodeMetrics) { m.Memory.LS -= 101 }, want: ReportMemory},
		{name: "CPU capacity", change: func(m *contract.NodeMetrics) { m.CPU.Capacity = 8000 }, want: ReportShape},
		{name: "version", change: func(m *contract.NodeMetrics) { m.Version, m.GPU = contract.NodeMetricsVersion, nil },
			want: ReportShape},
		{name: "published batch resources", change: func(m *contract.NodeMetrics) { m.Batch.CPU-- }, want: ReportShape},
		{name: "batch resources gone", change: func(m *contract.NodeMetrics) { m.Batch = nil }, want: ReportShape},
		{name: "GPU health", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].Healthy = false }, want: ReportShape},
		{name: "LS free unknown", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].LSFreeMilli = nil },
			want: ReportShape},
		{name: "GPU added", change: func(m *contract.NodeMetrics) {
			m.GPU.Devices = append(m.GPU.Devices, contract.GPUDevice{Index: 1, UUID: "GPU-b", Healthy: true})
		}, want: ReportShape},
		{name: "GPU utilisation past 10 points", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].Util = 61 },
			want: ReportGPU},
		{name: "GPU utilisation within 10 points", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].Util = 59 }},
		{name: "LS utilisation", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].LSUtil = 19 }, want: ReportGPU},
		{name: "LS free past 100 milli", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].LSFreeMilli = free(599) },
			want: ReportGPU},
		{name: "reclaimable", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].Reclaimable = 0.61 }, want: ReportGPU},
		{name: "GPU memory", change: func(m *contract.NodeMetrics) { m.GPU.Devices[0].MemUsed = 21 }, want: ReportGPU},
		{name: "allocation reordered", change: func(m *contract.NodeMetrics) {
			a := m.GPU.Alloc.Pods
			m.GPU.Alloc = &contract.GPUAllocation{Pods: []contract.PodGPUs{
				{Namespace: "b", Name: "q", Devices: []int{2, 1}}, a[0]}}
		}},
		{name: "allocation: a pod leaves", change: func(m *contract.NodeMetrics) {
			m.GPU.Alloc = &contract.GPUAllocation{Pods: m.GPU.Alloc.Pods[:1]}
		}, want: ReportGPUAlloc},
		{name: "allocation: other devices", change: func(m *contract.NodeMetrics) {
			m.GPU.Alloc = &contract.GPUAllocation{Pods: []contract.PodGPUs{m.GPU.Alloc.Pods[0],
				{Namespace: "b", Name: "q", Devices: []int{1, 3}}}}
		}, want: ReportGPUAlloc},
		{name: "allocation unknown", change: func(m *contract.NodeMetrics) { m.GPU.Alloc = nil }, want: ReportGPUAlloc},
	}
	for _, tc := range cases {
		last, next := base(), base()
		if tc.change != nil {
			tc.change(&next)
		}
		lp := &last
		if tc.noLast {
			lp = nil
		}
		if got := p.Due(lp, tc.failed, next); got != tc.want {
			t.Errorf("%s: Due = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestReportPolicyZeroChangeWritesEveryWindow(t *testing.T) {
	t.Parallel()
	p := ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Hour}}
	m := contract.NodeMetrics{Version: 1, CPU: contract.CPUMetrics{Capacity: 1000, Used: 10}}
	n := m
	n.CPU.Used++
	if got := p.Due(&m, false, n); got != ReportCPU {
		t.Fatalf("Due = %q, want %q for a 1-milli move at change 0", got, ReportCPU)
	}
	if got := p.Due(&m, false, m); got != ReportHeartbeat {
		t.Fatalf("Due = %q for no move at all, want %q: change 0 writes every window", got, ReportHeartbeat)
	}
}

func TestReportPolicyValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p  ReportPolicy
		ok bool
	}{
		{DefaultReportPolicy(), true},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Second}}, true},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Millisecond}}, false},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: 2 * time.Hour}}, false},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Minute}, Change: 1}, false},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Minute}, Change: -0.1}, false},
		{ReportPolicy{MaxInterval: metav1.Duration{Duration: time.Minute}, Change: math.NaN()}, false},
	} {
		err := tc.p.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: Validate = %v, want ok %v", tc.p, err, tc.ok)
		}
	}
}
