package qos_test

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/understory/understory/qos"
)

// TestChooseGPUMPSMemLimit: a batch client's limit is its request's share of the GPU's
// memory, rounded down to whole MiB, never what LS's requests hold, at least 1 MiB; LS
// clients, batch without a request and an unknown total get none.
func TestChooseGPUMPSMemLimit(t *testing.T) {
	t.Parallel()
	const (
		mib  = 1 << 20
		h200 = 150754820096 // NVML's total of an H200 (143771 MiB)
		h100 = 85520809984  // an H100 80GB (81559 MiB)
	)
	tests := []struct {
		name     string
		in       qos.GPUMPSMemInput
		want     uint64
		reasonIn string
	}{
		{"batch 250 milli of an H200", qos.GPUMPSMemInput{Batch: true, TotalBytes: h200, BatchRequestMilli: 250},
			35942, "35942 MiB: 250 milli of 143771 MiB"},
		{"batch 500 milli of an H100", qos.GPUMPSMemInput{Batch: true, TotalBytes: h100, BatchRequestMilli: 500},
			40779, "500 milli of 81559 MiB"},
		{"rounded down to whole MiB", qos.GPUMPSMemInput{Batch: true, TotalBytes: 1000*mib + 999, BatchRequestMilli: 1},
			1, "1 MiB"},
		{"rounded down, not to nearest", qos.GPUMPSMemInput{Batch: true, TotalBytes: 3999 * mib, BatchRequestMilli: 1},
			3, ""},
		{"beside LS requests that fit", qos.GPUMPSMemInput{Batch: true, TotalBytes: 1000 * mib, BatchRequestMilli: 300,
			LSRequestMilli: []int64{500, 200}}, 300, "300 milli"},
		{"a whole-GPU batch keeps out of LS's requests", qos.GPUMPSMemInput{Batch: true, TotalBytes: 1000 * mib,
			BatchRequestMilli: 1000, LSRequestMilli: []int64{600}}, 400,
			"its request of 1000 milli bounded by LS requests of 600 milli"},
		{"LS requests fill the GPU: the 1 MiB floor", qos.GPUMPSMemInput{Batch: true, TotalBytes: h200,
			BatchRequestMilli: 100, LSRequestMilli: []int64{700, 700}}, qos.MinGPUMPSMemLimitMiB, "1 MiB: 0 milli"},
		{"a tiny GPU: the floor, never 0", qos.GPUMPSMemInput{Batch: true, TotalBytes: 512 << 10, BatchRequestMilli: 10},
			qos.MinGPUMPSMemLimitMiB, ""},
		{"requests above a GPU count as a GPU", qos.GPUMPSMemInput{Batch: true, TotalBytes: 1000 * mib,
			BatchRequestMilli: 1 << 40, LSRequestMilli: []int64{-5}}, 1000, "1000 milli"},
		{"a huge total does not overflow", qos.GPUMPSMemInput{Batch: true, TotalBytes: math.MaxUint64, BatchRequestMilli: 1000},
			math.MaxUint64 / mib, ""},
		{"LS: none", qos.GPUMPSMemInput{TotalBytes: h200, BatchRequestMilli: 250}, 0, "LS: no memory limit"},
		{"batch without a request: none", qos.GPUMPSMemInput{Batch: true, TotalBytes: h200}, 0, "without a gpu-milli request"},
		{"a negative request: none", qos.GPUMPSMemInput{Batch: true, TotalBytes: h200, BatchRequestMilli: -1}, 0, "without"},
		{"unknown total: none", qos.GPUMPSMemInput{Batch: true, BatchRequestMilli: 250}, 0, "memory is unknown"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := qos.ChooseGPUMPSMemLimit(tc.in)
			if got.MiB != tc.want || !strings.Contains(got.Reason, tc.reasonIn) {
				t.Fatalf("ChooseGPUMPSMemLimit(%+v) = %+v, want %d MiB, reason with %q", tc.in, got, tc.want, tc.reasonIn)
			}
		})
	}
}

// Whatever the inputs: a batch client with a request on a GPU of known memory gets a
// limit in [1 MiB, its request's share], never above what LS's requests leave (unless
// that is below the floor); anything else none.
func FuzzChooseGPUMPSMemLimit(f *testing.F) {
	f.Add(true, uint64(150754820096), int64(250), int64(0), int64(0))
	f.Add(true, uint64(1<<20), int64(1000), int64(999), int64(1))
	f.Add(false, uint64(math.MaxUint64), int64(-1), int64(2000), int64(-3))
	f.Fuzz(func(t *testing.T, batch bool, total uint64, req, r1, r2 int64) {
		got := qos.ChooseGPUMPSMemLimit(qos.GPUMPSMemInput{Batch: batch, TotalBytes: total, BatchRequestMilli: req,
			LSRequestMilli: []int64{r1, r2}})
		if !batch || req <= 0 || total == 0 {
			if got.MiB != 0 {
				t.Fatalf("no limit expected for batch %v req %d total %d: %+v", batch, req, total, got)
			}
			return
		}
		ls := min(min(max(r1, 0), 1000)+min(max(r2, 0), 1000), 1000)
		share := uint64(min(req, 1000, 1000-ls))
		// The share's bytes, as a float bound (exact enough: the limit is compared in MiB).
		most := float64(total) / (1 << 20) * float64(share) / 1000
		if got.MiB < qos.MinGPUMPSMemLimitMiB || (got.MiB > qos.MinGPUMPSMemLimitMiB && float64(got.MiB) > most*(1+1e-12)) ||
			got.Reason == "" {
			t.Fatalf("ChooseGPUMPSMemLimit(total %d, req %d, LS %d) = %+v, most %.3f MiB", total, req, ls, got, most)
		}
	})
}

// TestGPUMPSPinnedMemLimitValue: the value lists every ordinal of the client's devices at
// the limit, in MiB; no limit is no value.
func TestGPUMPSPinnedMemLimitValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		devices int
		mib     uint64
		want    string
	}{
		{1, 35942, "0=35942M"},
		{2, 1024, "0=1024M,1=1024M"},
		{12, 7, "0=7M,1=7M,2=7M,3=7M,4=7M,5=7M,6=7M,7=7M,8=7M,9=7M,10=7M,11=7M"},
		{1, 0, ""},
		{0, 100, ""},
		{-1, 100, ""},
	} {
		if got := qos.GPUMPSPinnedMemLimitValue(tc.devices, tc.mib); got != tc.want {
			t.Errorf("GPUMPSPinnedMemLimitValue(%d, %d) = %q, want %q", tc.devices, tc.mib, got, tc.want)
		}
	}
}

// TestCheckGPUMPSMemLimit: a batch client planned a memory limit is confirmed only by a
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its environment that limits every planned ordinal
// to at most the plan, in a form the agent reads as CUDA does.
func TestCheckGPUMPSMemLimit(t *testing.T) {
	t.Parallel()
	ok := qos.GPUMPSClientObs{PID: 7, PlannedCapPercent: 25, PlannedPriority: 1, Cap: "25", CapSet: true,
		Priority: "1", PrioritySet: true, PlannedMemLimitMiB: 35942, PlannedMemDevices: 1,
		MemLimit: "0=35942M", MemLimitSet: true}
	two := ok
	two.PlannedMemDevices, two.PlannedMemLimitMiB, two.MemLimit = 2, 1024, "0=1024M,1=1024M"
	cases := []struct {
		name string
		c    qos.GPUMPSClientObs
		f    func(*qos.GPUMPSClientObs)
		want string // "" confirmed, else a part of the reason
	}{
		{"as handed out", ok, nil, ""},
		{"stricter", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=100M" }, ""},
		{"in GiB, within", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=35G" }, ""},
		{"leading zeros", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "00=035942M" }, ""},
		{"other ordinals too", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "1=99999G,0=2M" }, ""},
		{"no limit planned: none needed", ok, func(c *qos.GPUMPSClientObs) {
			c.PlannedMemLimitMiB, c.MemLimit, c.MemLimitSet = 0, "", false
		}, ""},
		{"no limit planned: any value", ok, func(c *qos.GPUMPSClientObs) { c.PlannedMemLimitMiB, c.MemLimit = 0, "junk" }, ""},
		{"two devices as handed out", two, nil, ""},
		{"two devices, zero counts as one", ok, func(c *qos.GPUMPSClientObs) { c.PlannedMemDevices = 0 }, ""},
		{"larger by 1 MiB", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=35943M" },
			"limits device 0 to 35943 MiB, above its planned 35942 MiB"},
		{"larger in GiB", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=36G" }, "to 36864 MiB, above"},
		{"none (the variable absent)", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit, c.MemLimitSet = "", false },
			"runs without CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (planned 35942 MiB on 1 device(s))"},
		{"empty", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "" }, "is no limit list"},
		{"another device only", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "1=1M" }, "leaves device 0 without a limit"},
		{"the second device left out", two, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024M" },
			"leaves device 1 without a limit"},
		{"the second device above", two, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024M,1=2048M" },
			"limits device 1 to 2048 MiB"},
		{"zero (may read as no limit)", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=0M" }, "is no limit list"},
		{"no unit", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024" }, "is no limit list"},
		{"an unknown unit", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024MB" }, "is no limit list"},
		{"lower-case unit", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024m" }, "is no limit list"},
		{"a space", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0= 1024M" }, "is no limit list"},
		{"a trailing comma", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1024M," }, "is no limit list"},
		{"a sign", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=-1M" }, "is no limit list"},
		{"no ordinal", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "1024M" }, "is no limit list"},
		{"an ordinal past 63", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1M,64=1M" }, "is no limit list"},
		{"a device twice (which one CUDA takes is unknown)", ok,
			func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1M,0=99999M" }, "names device 0 twice"},
		{"too many digits", ok, func(c *qos.GPUMPSClientObs) { c.MemLimit = "0=1234567890123M" }, "is no limit list"},
		{"a long value is clipped in the reason", ok, func(c *qos.GPUMPSClientObs) {
			c.MemLimit = "0=" + strings.Repeat("9", 200)
		}, "..."},
		{"the cap is checked first", ok, func(c *qos.GPUMPSClientObs) { c.Cap, c.MemLimitSet = "99", false },
			"above its planned 25 %"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.c
			if tc.f != nil {
				tc.f(&c)
			}
			got := qos.CheckGPUMPSClients([]qos.GPUMPSClientObs{c})
			switch {
			case tc.want == "" && got != "":
				t.Fatalf("CheckGPUMPSClients = %q, want confirmed", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Fatalf("CheckGPUMPSClients = %q, want a reason with %q", got, tc.want)
			}
		})
	}
}

// FuzzCheckGPUMPSMemLimit: whatever a tenant's environment holds, the check never
// panics, and it confirms a value only if every planned ordinal is limited within the
// plan as the value itself says.
func FuzzCheckGPUMPSMemLimit(f *testing.F) {
	for _, s := range []string{"0=35942M", "0=1G,1=512M", "0=0M", "", ",", "0=", "=5M", "63=1M", "0=1M,0=1M",
		"0=99999999999G", "1=1M,0=2M"} {
		f.Add(s, uint8(1), uint32(1024))
	}
	f.Fuzz(func(t *testing.T, v string, devices uint8, planned uint32) {
		c := qos.GPUMPSClientObs{PID: 1, PlannedCapPercent: 25, PlannedPriority: 1, Cap: "25", CapSet: true,
			Priority: "1", PrioritySet: true, PlannedMemLimitMiB: uint64(planned), PlannedMemDevices: int(devices),
			MemLimit: v, MemLimitSet: true}
		if qos.CheckGPUMPSClients([]qos.GPUMPSClientObs{c}) != "" || planned == 0 {
			return
		}
		// Confirmed: read the value back the simplest way and hold it to the plan.
		limits := map[int]uint64{}
		for _, e := range strings.Split(v, ",") {
			o, val, _ := strings.Cut(e, "=")
			n, err := strconv.Atoi(o)
			if err != nil {
				t.Fatalf("confirmed %q with ordinal %q", v, o)
			}
			unit := uint64(1)
			if strings.HasSuffix(val, "G") {
				unit = 1024
			}
			m, err := strconv.ParseUint(val[:len(val)-1], 10, 64)
			if err != nil || m == 0 {
				t.Fatalf("confirmed %q with value %q", v, val)
			}
			limits[n] = m * unit
		}
		for o := range max(int(devices), 1) {
			if m, ok := limits[o]; !ok || m > uint64(planned) {
				t.Fatalf("confirmed %q for %d device(s) at %d MiB: ordinal %d at %d (set %v)", v, devices, planned, o, m, ok)
			}
		}
	})
}
