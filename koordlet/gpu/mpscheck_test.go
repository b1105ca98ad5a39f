package gpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/gpu/mps"
	"github.com/understory/understory/qos"
)

// writeEnviron writes <procRoot>/<pid>/environ as the kernel shows it: NUL-terminated
// KEY=VALUE entries.
func writeEnviron(t *testing.T, procRoot string, pid uint32, env ...string) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range env {
		b.WriteString(e)
		b.WriteByte(0)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newPlannedMPSRig is an mpsRig whose GPU 0 was seen with the MPS server alone and then
// given an LS and a batch client; it checks the batch client's plan (25 %, priority 1,
// 8192 MiB: 200 milli of the GPU's 40 GiB), the values the environments below are
// written against. It returns the server's process.
func newPlannedMPSRig(t *testing.T) (*mpsRig, Process) {
	t.Helper()
	r := newMPSRig(t)
	server := Process{PID: mpsServerPID}
	r.step(t, server)
	r.plan(t, false)
	if c := r.plan(t, true); c.ActiveThreadPercent != 25 || c.Priority != qos.GPUMPSBatchPriority ||
		c.PinnedMemLimitMiB != 8192 {
		t.Fatalf("batch client %+v, want 25 %% at priority %d, 8192 MiB", c, qos.GPUMPSBatchPriority)
	}
	return r, server
}

// plannedMem is the batch client's memory limit as the NRI plugin hands it out.
const plannedMem = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"

// TestManagerFreezesUncappedMPSClient: the agent checks each batch MPS client's cap,
// priority and device memory limit from outside the tenant (its /proc/<pid>/environ,
// and the control daemon's limit for its server). A batch client that runs above its
// planned cap, at a higher priority than planned, with a larger memory limit or none,
// without the variables, or whose environment cannot be read puts its GPU on the freeze
// lever (mps-cap-unconfirmed): frozen while LS is on the GPU, with one lever event. A
// client that runs as planned, or whose server the daemon caps at its planned cap, keeps
// the MPS lever.
func TestManagerFreezesUncappedMPSClient(t *testing.T) {
	t.Parallel()
	const batchPID = 200 // batchProc
	cases := []struct {
		name string
		// env is the batch client's environment; nil: write environ as a directory (a
		// read error other than the process being gone).
		env []string
		// servers is the control daemon's view (nil: none).
		servers    []mps.Server
		wantFrozen bool
	}{
		{name: "capped as planned", env: []string{"PATH=/usr/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1", plannedMem}},
		{name: "a lower cap than planned", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10",
			"CUDA_MPS_CLIENT_PRIORITY=1", plannedMem}},
		{name: "a stricter memory limit than planned", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G"}},
		{name: "a larger memory limit than planned", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40G"}, wantFrozen: true},
		{name: "without a memory limit", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1"}, wantFrozen: true},
		{name: "the first memory limit counts (getenv)", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40G", plannedMem}, wantFrozen: true},
		{name: "uncapped at LS's priority", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
			"CUDA_MPS_CLIENT_PRIORITY=0"}, wantFrozen: true},
		{name: "above its cap", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26", "CUDA_MPS_CLIENT_PRIORITY=1"},
			wantFrozen: true},
		{name: "LS's priority", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_CLIENT_PRIORITY=0"},
			wantFrozen: true},
		{name: "without the variables", env: []string{"PATH=/usr/bin"}, wantFrozen: true},
		{name: "the first of two values counts (getenv)", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_CLIENT_PRIORITY=1"}, wantFrozen: true},
		{name: "unreadable environment", env: nil, wantFrozen: true},
		{name: "uncapped client, but the daemon caps its server at the plan", env: []string{
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_CLIENT_PRIORITY=1", plannedMem},
			servers: []mps.Server{{PID: mpsServerPID, ActiveThreadPercent: 25, Clients: []int{100, batchPID}}}},
		{name: "the daemon's limit above the plan confirms nothing", env: []string{
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_CLIENT_PRIORITY=1"},
			servers:    []mps.Server{{PID: mpsServerPID, ActiveThreadPercent: 100, Clients: []int{100, batchPID}}},
			wantFrozen: true},
		{name: "a client of the daemon of no planned pod", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_CLIENT_PRIORITY=1"},
			servers:    []mps.Server{{PID: mpsServerPID, ActiveThreadPercent: 100, Clients: []int{100, batchPID, 777}}},
			wantFrozen: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, server := newPlannedMPSRig(t)
			if tc.env == nil {
				if err := os.MkdirAll(filepath.Join(r.procRoot, strconv.Itoa(batchPID), "environ"), 0o755); err != nil {
					t.Fatal(err)
				}
			} else {
				writeEnviron(t, r.procRoot, batchPID, tc.env...)
			}
			// PID 777: a client of the daemon in no pod (a host service's cgroup).
			writeEnviron(t, r.procRoot, 777, "CUDA_MPS_CLIENT_PRIORITY=0")
			if err := os.WriteFile(filepath.Join(r.procRoot, "777", "cgroup"),
				[]byte("0::/system.slice/cuda-job.service\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r.srv.setServers(tc.servers)
			for i := range 5 {
				d := r.step(t, server, lsProc(45), batchProc)
				if !tc.wantFrozen {
					if d.Frozen || d.Lever != qos.GPULeverMPS || d.Reason != qos.GPUReasonMPSWithinCap {
						t.Fatalf("step %d: %+v, want the MPS lever with batch running", i, d)
					}
					continue
				}
				if !d.Frozen || d.Lever != qos.GPULeverFreeze || d.Reason != qos.GPUReasonMPSCapUnconfirmed ||
					d.MPSCapUnconfirmed == "" {
					t.Fatalf("step %d: %+v, want the freeze lever, frozen, reason mps-cap-unconfirmed", i, d)
				}
			}
			wantEvents := 0
			if tc.wantFrozen {
				wantEvents = 1
			}
			if n := r.nEvents(); n != wantEvents {
				t.Fatalf("%d lever events, want %d", n, wantEvents)
			}
			if wantEvents == 1 {
				r.mu.Lock()
				e := r.events[0]
				r.mu.Unlock()
				if e.Reason != qos.GPUReasonMPSCapUnconfirmed || len(e.BatchPods) != 1 || e.BatchPods[0].UID != mgrBatchUID {
					t.Fatalf("event %+v", e)
				}
			}
		})
	}
}

// TestMPSCapCheckReadsOnFullScrapes: the environment is read when a client is first seen
// and again at each full read of its GPU (a change of the process list, and every
// fullScrapePeriod), not at a probing step: a client that execs itself in place with a
// new environment is caught at the next full read.
func TestMPSCapCheckReadsOnFullScrapes(t *testing.T) {
	t.Parallel()
	r, server := newPlannedMPSRig(t)
	writeEnviron(t, r.procRoot, 200, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_CLIENT_PRIORITY=1", plannedMem)
	if d := r.step(t, server, lsProc(45), batchProc); d.Lever != qos.GPULeverMPS || d.Frozen {
		t.Fatalf("capped client: %+v", d)
	}
	writeEnviron(t, r.procRoot, 200, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_CLIENT_PRIORITY=0")
	probed := device(server, lsProc(45), batchProc)
	probed.Probed = true
	r.next = Sample{Devices: []Device{probed}}
	r.m.step(context.Background(), r.now)
	r.now = r.now.Add(50 * time.Millisecond)
	if d := r.m.Status().GPUs[0].Decision; d.Lever != qos.GPULeverMPS {
		t.Fatalf("a probing step read the environment again: %+v", d)
	}
	if d := r.step(t, server, lsProc(45), batchProc); !d.Frozen || d.Reason != qos.GPUReasonMPSCapUnconfirmed ||
		!strings.Contains(d.MPSCapUnconfirmed, "pid 200") {
		t.Fatalf("full read after the exec: %+v", d)
	}
	// Status and the metrics' reason carry it.
	if st := r.m.Status(); st.GPUs[0].Decision.MPSCapUnconfirmed == "" {
		t.Fatalf("status %+v", st.GPUs[0].Decision)
	}
}

// TestParseMPSEnviron: the first entry of each name counts, entries without '=' are
// skipped, and a name must match whole.
func TestParseMPSEnviron(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		data string
		want MPSEnviron
	}{
		{"empty", "", MPSEnviron{}},
		{"both", "A=1\x00CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\x00CUDA_MPS_CLIENT_PRIORITY=1\x00",
			MPSEnviron{Cap: "25", CapSet: true, Priority: "1", PrioritySet: true}},
		{"no final NUL", "CUDA_MPS_CLIENT_PRIORITY=0", MPSEnviron{Priority: "0", PrioritySet: true}},
		{"first wins", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\x00CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\x00",
			MPSEnviron{Cap: "100", CapSet: true}},
		{"empty value is set", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=\x00", MPSEnviron{CapSet: true}},
		{"no '=' skipped", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\x00CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10\x00",
			MPSEnviron{Cap: "10", CapSet: true}},
		{"prefix is another name", "XCUDA_MPS_CLIENT_PRIORITY=0\x00CUDA_MPS_CLIENT_PRIORITY_X=0\x00", MPSEnviron{}},
		{"value with '='", "CUDA_MPS_CLIENT_PRIORITY=1=0\x00", MPSEnviron{Priority: "1=0", PrioritySet: true}},
		{"long value clipped", "CUDA_MPS_CLIENT_PRIORITY=" + strings.Repeat("1", 500),
			MPSEnviron{Priority: strings.Repeat("1", maxEnvValue), PrioritySet: true}},
		{"memory limit", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M,1=8192M\x00CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M\x00",
			MPSEnviron{MemLimit: "0=8192M,1=8192M", MemLimitSet: true}},
		{"a long memory limit is kept further", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + strings.Repeat("0=1M,", 100),
			MPSEnviron{MemLimit: strings.Repeat("0=1M,", 100), MemLimitSet: true}},
		{"an oversized memory limit clipped", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + strings.Repeat("9", 5000),
			MPSEnviron{MemLimit: strings.Repeat("9", maxMemEnvValue), MemLimitSet: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ParseMPSEnviron([]byte(tc.data)); got != tc.want {
				t.Fatalf("ParseMPSEnviron(%q) = %+v, want %+v", tc.data, got, tc.want)
			}
		})
	}
}

// TestReadMPSEnviron: a missing /proc entry is a process gone; an oversized environment
// or a read error is an error of its own.
func TestReadMPSEnviron(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if _, _, err := readMPSEnviron(root, 5, nil); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("missing: %v", err)
	}
	writeEnviron(t, root, 6, strings.Repeat("X", maxEnviron))
	if _, _, err := readMPSEnviron(root, 6, nil); !errors.Is(err, errEnvironTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "7", "environ"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readMPSEnviron(root, 7, nil); err == nil || errors.Is(err, ErrProcessGone) {
		t.Fatalf("unreadable: %v", err)
	}
	if _, _, err := readMPSEnviron("", 7, nil); err == nil || errors.Is(err, ErrProcessGone) {
		t.Fatalf("no proc root: %v", err)
	}
}

// FuzzParseMPSEnviron: outside input (a tenant writes its own environment). The parser
// never panics, keeps at most maxEnvValue bytes of a value, and agrees with a plain
// getenv over the NUL-separated entries.
func FuzzParseMPSEnviron(f *testing.F) {
	f.Add([]byte("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\x00CUDA_MPS_CLIENT_PRIORITY=1\x00"))
	f.Add([]byte("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\x00CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"))
	f.Add([]byte("\x00\x00=\x00CUDA_MPS_CLIENT_PRIORITY\x00CUDA_MPS_CLIENT_PRIORITY==\xff"))
	f.Add([]byte("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M\x00CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=9G"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got := ParseMPSEnviron(data)
		getenv := func(name string, most int) (string, bool) {
			for e := range strings.SplitSeq(string(data), "\x00") {
				if k, v, ok := strings.Cut(e, "="); ok && k == name {
					return v[:min(len(v), most)], true
				}
			}
			return "", false
		}
		capV, capOK := getenv(qos.GPUMPSEnvActiveThreadPercentage, maxEnvValue)
		prioV, prioOK := getenv(qos.GPUMPSEnvClientPriority, maxEnvValue)
		memV, memOK := getenv(qos.GPUMPSEnvPinnedDeviceMemLimit, maxMemEnvValue)
		want := MPSEnviron{Cap: capV, CapSet: capOK, Priority: prioV, PrioritySet: prioOK, MemLimit: memV,
			MemLimitSet: memOK}
		if got != want {
			t.Fatalf("ParseMPSEnviron(%q) = %+v, want %+v", data, got, want)
		}
		if len(got.Cap) > maxEnvValue || len(got.Priority) > maxEnvValue {
			t.Fatalf("values longer than %d bytes: %+v", maxEnvValue, got)
		}
	})
}
