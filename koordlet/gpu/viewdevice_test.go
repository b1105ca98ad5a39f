package gpu

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/qos"
)

// TestViewDeviceClassifies: a process of a batch pod is batch; a process of an LS or BE
// pod, of a pod the agent does not know (yet), or of no pod counts as LS, for its
// utilisation and for "LS active" alike (docs/gpu.md, Classify: the safe side).
func TestViewDeviceClassifies(t *testing.T) {
	t.Parallel()
	const (
		ls      = types.UID("ls")
		be      = types.UID("be")
		batch   = types.UID("batch")
		unknown = types.UID("not-in-the-view")
	)
	pods := PodMap{
		ls:    {UID: ls, Namespace: "n", Name: "ls", Class: qos.ClassLS},
		be:    {UID: be, Namespace: "n", Name: "be", Class: qos.ClassBE},
		batch: {UID: batch, Namespace: "n", Name: "batch", Class: qos.ClassBatch, Cgroup: "b"},
	}
	proc := func(pid uint32, uid types.UID, sm float64) Process {
		return Process{PID: pid, SMUtil: sm, Pod: PodRef{UID: uid}}
	}
	for _, tc := range []struct {
		name             string
		procs            []Process
		utilNow          float64 // > 0: a utilisation probe (Device.UtilNow) read this
		lsActive         bool
		lsUtil, batchUtl float64
		others, batchN   int
	}{
		{"nothing", nil, 0, false, 0, 0, 0, 0},
		{"batch alone", []Process{proc(1, batch, 60)}, 0, false, 0, 60, 0, 1},
		{"LS pod, idle", []Process{proc(1, batch, 60), proc(2, ls, 0)}, 0, true, 0, 60, 1, 1},
		{"BE pod", []Process{proc(2, be, 5)}, 0, true, 5, 0, 1, 0},
		{"no pod, idle", []Process{proc(1, batch, 60), proc(3, "", 0)}, 0, true, 0, 60, 1, 1},
		{"no pod, busy", []Process{proc(3, "", 30)}, 0, true, 30, 0, 1, 0},
		{"unknown pod", []Process{proc(1, batch, 60), proc(4, unknown, 20)}, 0, true, 20, 60, 1, 1},
		// Batch frozen: the GPU's utilisation of now is the other processes', whatever the
		// last full read's per-process figures said.
		{"batch frozen, LS busy now", []Process{proc(1, batch, 60), proc(2, ls, 0)}, 35, true, 35, 0, 1, 1},
		{"batch frozen, LS idle now", []Process{proc(1, batch, 0), proc(2, ls, 40)}, -1, true, 0, 0, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := Device{Index: 0, Healthy: true, Processes: tc.procs}
			if tc.utilNow != 0 {
				d.Probed, d.UtilNow, d.Util = true, true, max(tc.utilNow, 0)
			}
			v := viewDevice(d, pods)
			if v.lsActive != tc.lsActive || v.lsUtil != tc.lsUtil || v.batchUtil != tc.batchUtl ||
				v.others != tc.others || len(v.batch) != tc.batchN {
				t.Fatalf("view: lsActive %t lsUtil %v batchUtil %v others %d batch pods %d; "+
					"want %t %v %v %d %d", v.lsActive, v.lsUtil, v.batchUtil, v.others, len(v.batch),
					tc.lsActive, tc.lsUtil, tc.batchUtl, tc.others, tc.batchN)
			}
			if in := v.input(); in.LSActive != tc.lsActive {
				t.Fatalf("throttle input LSActive %t, want %t", in.LSActive, tc.lsActive)
			}
		})
	}
}
