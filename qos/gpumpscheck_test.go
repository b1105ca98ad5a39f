package qos_test

import (
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/qos"
)

// TestCheckGPUMPSClients: a batch MPS client's cap is confirmed by its own environment
// at or below the plan, or by its server's daemon-side limit at or below the plan; its
// priority only by its environment; anything the agent could not read or place is
// unconfirmed. A client that exited is fine.
func TestCheckGPUMPSClients(t *testing.T) {
	t.Parallel()
	ok := qos.GPUMPSClientObs{PID: 7, PlannedCapPercent: 25, PlannedPriority: 1, Cap: "25", CapSet: true,
		Priority: "1", PrioritySet: true}
	with := func(f func(*qos.GPUMPSClientObs)) qos.GPUMPSClientObs {
		c := ok
		f(&c)
		return c
	}
	cases := []struct {
		name    string
		clients []qos.GPUMPSClientObs
		want    string // "" confirmed, else a part of the reason
	}{
		{"no batch client", nil, ""},
		{"as planned", []qos.GPUMPSClientObs{ok}, ""},
		{"a lower cap", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "10" })}, ""},
		{"leading zeros", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "025" })}, ""},
		{"uncapped at LS's priority (the tenant's own 100 and 0)", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Cap, c.Priority = "100", "0"
		})}, "above its planned 25"},
		{"one above its cap", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "26" })}, "above its planned"},
		{"priority 0 below the plan's 1", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Priority = "0" })},
			"a higher priority"},
		{"no cap variable", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap, c.CapSet = "", false })},
			"without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"},
		{"no priority variable (CUDA's default is 0)", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Priority, c.PrioritySet = "", false
		})}, "without CUDA_MPS_CLIENT_PRIORITY"},
		{"a fraction", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "25.5" })}, "no cap"},
		{"a space", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = " 25" })}, "no cap"},
		{"zero cap", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "0" })}, "no cap"},
		{"empty cap", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "" })}, "no cap"},
		{"a sign", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Cap = "-5" })}, "no cap"},
		{"priority 2 is no CUDA priority", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Priority = "2" })},
			"no priority"},
		{"the daemon caps the server at the plan", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Cap, c.ServerCapPercent = "100", 25
		})}, ""},
		{"the daemon's cap holds without the client's variable", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Cap, c.CapSet, c.ServerCapPercent = "", false, 20
		})}, ""},
		{"the daemon's cap above the plan", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Cap, c.ServerCapPercent = "100", 50
		})}, "above its planned"},
		{"the daemon's cap confirms no priority", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Priority, c.ServerCapPercent = "0", 25
		})}, "a higher priority"},
		{"gone", []qos.GPUMPSClientObs{{PID: 8, Read: qos.GPUMPSClientGone}}, ""},
		{"unreadable", []qos.GPUMPSClientObs{ok, {PID: 8, Read: qos.GPUMPSClientUnreadable, Detail: "permission denied"}},
			"pid 8: environment unreadable (permission denied)"},
		{"unknown client", []qos.GPUMPSClientObs{{PID: 9, Read: qos.GPUMPSClientUnknown, Detail: "not in a pod"}},
			"pid 9 of no planned"},
		{"no planned cap", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.PlannedCapPercent = 0 })},
			"no planned cap"},
		{"a read state out of range", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) { c.Read = 42 })},
			"read state 42"},
		{"the first bad client is named", []qos.GPUMPSClientObs{ok, with(func(c *qos.GPUMPSClientObs) {
			c.PID, c.Cap = 11, "99"
		})}, "pid 11"},
		{"a long value is clipped in the reason", []qos.GPUMPSClientObs{with(func(c *qos.GPUMPSClientObs) {
			c.Cap = strings.Repeat("9", 200)
		})}, "..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := qos.CheckGPUMPSClients(tc.clients)
			switch {
			case tc.want == "" && got != "":
				t.Fatalf("CheckGPUMPSClients = %q, want confirmed", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Fatalf("CheckGPUMPSClients = %q, want a reason with %q", got, tc.want)
			}
		})
	}
}

// TestGPUThrottleMPSCapUnconfirmed: an MPS GPU whose batch caps are unconfirmed uses the
// freeze lever: frozen while LS is on the GPU (even at 0 % utilisation: under MPS LS's
// work is reported under the server), thawed `hold` after LS left, never frozen with no
// LS; a confirmed GPU keeps the MPS lever. The reason is carried to the decision.
func TestGPUThrottleMPSCapUnconfirmed(t *testing.T) {
	t.Parallel()
	p := qos.DefaultGPUThrottlePolicy()
	mps := func(ls bool, why string) qos.GPUThrottleInput {
		return qos.GPUThrottleInput{Index: 0, LSActive: ls, BatchUtil: 60, BatchPods: 1, MPS: true, LSCapPercent: 75,
			BatchCapPercent: 25, MPSCapUnconfirmed: why}
	}
	const why = "batch MPS client pid 200 runs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"
	steps := []struct {
		in         qos.GPUThrottleInput
		at         time.Duration
		wantLever  string
		wantFrozen bool
		wantReason string
	}{
		{mps(true, ""), 0, qos.GPULeverMPS, false, qos.GPUReasonMPSWithinCap},
		{mps(true, why), gpuStep, qos.GPULeverFreeze, true, qos.GPUReasonMPSCapUnconfirmed},
		{mps(true, why), 2 * gpuStep, qos.GPULeverFreeze, true, qos.GPUReasonMPSCapUnconfirmed},
		{mps(false, why), 3 * gpuStep, qos.GPULeverFreeze, true, qos.GPUReasonHold},
		{mps(false, why), 2*gpuStep + time.Second, qos.GPULeverFreeze, false, qos.GPUReasonIdle},
		{mps(false, why), 3*gpuStep + time.Second, qos.GPULeverFreeze, false, qos.GPUReasonIdle},
		{mps(true, ""), 4*gpuStep + time.Second, qos.GPULeverMPS, false, qos.GPUReasonMPSWithinCap},
	}
	th := qos.NewGPUThrottle(p, gpuStep)
	for i, s := range steps {
		ds := th.Step(gpuT0.Add(s.at), []qos.GPUThrottleInput{s.in})
		d := ds[0]
		if d.Lever != s.wantLever || d.Frozen != s.wantFrozen || d.Reason != s.wantReason ||
			d.MPSCapUnconfirmed != s.in.MPSCapUnconfirmed {
			t.Fatalf("step %d: %+v, want lever %s frozen %v reason %s", i, d, s.wantLever, s.wantFrozen, s.wantReason)
		}
	}
	// A GPU given twice, once unconfirmed: merged unconfirmed (the worst case for LS).
	th = qos.NewGPUThrottle(p, gpuStep)
	ds := th.Step(gpuT0, []qos.GPUThrottleInput{mps(true, ""), mps(true, why)})
	if d := ds[0]; !d.Frozen || d.Reason != qos.GPUReasonMPSCapUnconfirmed {
		t.Fatalf("merged: %+v", d)
	}
}
