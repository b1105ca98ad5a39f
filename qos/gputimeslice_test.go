package qos_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/qos"
)

// tsCtx is a context of class c asked `asked` µs whose slice the observer and the shim
// both confirm.
func tsCtx(pod string, c qos.Class, asked uint64) qos.GPUTimesliceContext {
	return qos.GPUTimesliceContext{Pod: pod, PID: 100 + len(pod), Context: "0xc1/0x5c000001", Class: c, AskedUs: asked,
		ShimReported: true, ShimReadBackUs: asked, Observed: true, ObservedSetUs: asked}
}

// tsGPU is a supported GPU with LS requests of 750 milli and one batch pod of 250: the
// defaults give batch 130 µs.
func tsGPU(ctxs ...qos.GPUTimesliceContext) qos.GPUTimesliceInput {
	return qos.GPUTimesliceInput{Index: 3, DriverSupported: true, Driver: "580.95.05", LSDemandPercent: 32,
		LSRequestMilli: []int64{750}, BatchRequestMilli: []int64{250}, BatchPods: 1, Contexts: ctxs}
}

// Defaults: LS 10 ms; batch beside LS 100–240 µs; 2048 µs without LS.
const (
	tsLS        = 10000
	tsBatch     = 130 // tsGPU's: 100 + 145 × 250/1000 = 136, rounded down to 10
	tsNoLSBatch = 2048
)

func TestChooseGPUTimesliceLever(t *testing.T) {
	t.Parallel()
	ls := tsCtx("prod/web", qos.ClassLS, tsLS)
	batch := tsCtx("jobs/train", qos.ClassBatch, tsBatch)
	batch2 := tsCtx("jobs/eval", qos.ClassBatch, tsBatch)
	with := func(in qos.GPUTimesliceInput, f func(*qos.GPUTimesliceInput)) qos.GPUTimesliceInput {
		f(&in)
		return in
	}
	tests := []struct {
		name           string
		in             qos.GPUTimesliceInput
		lever, reason  string
		detailIn       string
		lsUs, batchUs  uint64
		verdicts       []string // per context, in order
		suffers        bool
		sanitizedIn    string
		noSlices       bool
		wantLSPresence bool
	}{
		{name: "unhealthy GPU: the freeze, state held by GPUThrottle, no slices",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.Unknown = true }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnknown, noSlices: true},
		{name: "unknown wins over MPS",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.Unknown, in.MPS = true, true }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnknown, noSlices: true},
		{name: "MIG: the freeze, as without MPS",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.MIG = true }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonMIG, noSlices: true},
		{name: "MPS GPU keeps the MPS partition, contexts ignored",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.MPS = true }),
			lever: qos.GPULeverMPS, reason: qos.GPUTimesliceReasonMPS, noSlices: true},
		{name: "MPS GPU keeps MPS even with an unconfirmed batch context (GPUThrottle checks the caps)",
			in: with(tsGPU(ls, qos.GPUTimesliceContext{Pod: "jobs/train", Class: qos.ClassBatch}),
				func(in *qos.GPUTimesliceInput) { in.MPS = true }),
			lever: qos.GPULeverMPS, reason: qos.GPUTimesliceReasonMPS, noSlices: true},
		{name: "no batch: no lever, LS still asked its long slice",
			in: with(tsGPU(ls), func(in *qos.GPUTimesliceInput) {
				in.BatchPods, in.BatchRequestMilli = 0, nil
			}),
			lever: qos.GPULeverNone, reason: qos.GPUTimesliceReasonNoBatch, lsUs: tsLS, batchUs: 100,
			verdicts: []string{qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "empty GPU: no lever, no LS",
			in:    qos.GPUTimesliceInput{DriverSupported: true},
			lever: qos.GPULeverNone, reason: qos.GPUTimesliceReasonNoBatch, lsUs: tsLS, batchUs: tsNoLSBatch},
		{name: "no batch and the driver unsupported: still no lever",
			in: with(tsGPU(ls), func(in *qos.GPUTimesliceInput) {
				in.BatchPods, in.BatchRequestMilli, in.DriverSupported = 0, nil, false
			}),
			lever: qos.GPULeverNone, reason: qos.GPUTimesliceReasonNoBatch, lsUs: tsLS, batchUs: 100,
			verdicts: []string{qos.GPUTimesliceUnconfirmed}, wantLSPresence: true},
		{name: "batch pods without a context yet: timeslice, so that one can start",
			in:    tsGPU(ls),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonNoBatchContext, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "batch pods without a context on an unsupported driver: the freeze",
			in:    with(tsGPU(ls), func(in *qos.GPUTimesliceInput) { in.DriverSupported, in.Driver = false, "470.256.02" }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed, detailIn: "driver 470.256.02",
			lsUs: tsLS, batchUs: tsBatch, verdicts: []string{qos.GPUTimesliceUnconfirmed}, wantLSPresence: true},
		{name: "a batch context that is not of a placed pod still counts",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.BatchPods = 0 }),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "every batch context confirmed: timeslice",
			in:    tsGPU(ls, batch, batch2),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts:       []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed},
			wantLSPresence: true},
		{name: "batch alone at the driver's default: timeslice",
			in: qos.GPUTimesliceInput{DriverSupported: true, BatchPods: 1, BatchRequestMilli: []int64{1000},
				Contexts: []qos.GPUTimesliceContext{tsCtx("jobs/train", qos.ClassBatch, tsNoLSBatch)}},
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsNoLSBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed}},
		{name: "LS arrives where batch runs at 2048 µs: above the bound, the freeze until asked again",
			in:    with(tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, tsNoLSBatch)), func(*qos.GPUTimesliceInput) {}),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed,
			detailIn: "2048 µs in force, above the 245 µs", lsUs: tsLS, batchUs: tsBatch,
			verdicts:       []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceUnconfirmed},
			wantLSPresence: true},
		{name: "batch asked a shorter slice than wanted: confirmed (re-ask only)",
			in:    tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, 100)),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "batch asked 245 µs, at the bound: confirmed",
			in:    tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, 245)),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "batch asked 246 µs, past the bound: the freeze",
			in:    tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, 246)),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed, detailIn: "246 µs in force",
			lsUs: tsLS, batchUs: tsBatch, verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceUnconfirmed},
			wantLSPresence: true},
		{name: "batch self-set long slice: the freeze, reported",
			in: tsGPU(ls, batch, func() qos.GPUTimesliceContext {
				c := batch2
				c.SelfSet, c.SelfSetUs = true, 1000000
				return c
			}()),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonSelfSet,
			detailIn: "batch context of pod jobs/eval pid 109 (0xc1/0x5c000001) set itself a slice of 1000000 µs",
			lsUs:     tsLS, batchUs: tsBatch,
			verdicts:       []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed, qos.GPUTimesliceSelfSet},
			wantLSPresence: true},
		{name: "self-set wins over unconfirmed in the GPU's reason",
			in: tsGPU(qos.GPUTimesliceContext{Pod: "jobs/a", Class: qos.ClassBatch, AskedUs: tsBatch},
				func() qos.GPUTimesliceContext {
					c := batch2
					c.SelfSet, c.SelfSetUs = true, 5000
					return c
				}()),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonSelfSet, detailIn: "jobs/eval",
			lsUs: tsLS, batchUs: tsBatch, verdicts: []string{qos.GPUTimesliceUnconfirmed, qos.GPUTimesliceSelfSet},
			wantLSPresence: true},
		{name: "batch self-set long, refused by the driver: noted, still confirmed",
			in: tsGPU(ls, func() qos.GPUTimesliceContext {
				c := batch
				c.SelfSet, c.SelfSetUs, c.SelfSetStatus = true, 1000000, 0x1f
				return c
			}()),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "batch self-set shorter, accepted: in force, confirmed",
			in: tsGPU(ls, func() qos.GPUTimesliceContext {
				c := batch
				c.SelfSet, c.SelfSetUs = true, 50
				return c
			}()),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "batch asked 2048 before LS, self-set 1000 (not above the agent's 2048) but above the bound: the freeze",
			in: tsGPU(ls, func() qos.GPUTimesliceContext {
				c := tsCtx("jobs/train", qos.ClassBatch, tsNoLSBatch)
				c.SelfSet, c.SelfSetUs = true, 1000
				return c
			}()),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed, detailIn: "1000 µs in force",
			lsUs: tsLS, batchUs: tsBatch, verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceUnconfirmed},
			wantLSPresence: true},
		{name: "LS self-set long slice: reported only",
			in: tsGPU(func() qos.GPUTimesliceContext {
				c := ls
				c.SelfSet, c.SelfSetUs = true, 50000
				return c
			}(), batch),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceSelfSet, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "LS context unconfirmed: reported, the lever stays",
			in: tsGPU(qos.GPUTimesliceContext{Pod: "prod/web", Class: qos.ClassLS, AskedUs: tsLS, ShimReported: true,
				ShimReadBackUs: tsLS}, batch),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceUnconfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "a BE context gets LS's slice and rules",
			in: with(tsGPU(tsCtx("misc/be", qos.ClassBE, tsLS), batch), func(in *qos.GPUTimesliceInput) {
				in.LSRequestMilli, in.LSDemandPercent = nil, 0
			}),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: 130,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "two batch contexts unconfirmed: the first named, the count given",
			in: tsGPU(ls, qos.GPUTimesliceContext{Pod: "jobs/a", PID: 7, Class: qos.ClassBatch, AskedUs: tsBatch},
				qos.GPUTimesliceContext{Pod: "jobs/b", PID: 8, Class: qos.ClassBatch, AskedUs: tsBatch}),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed, detailIn: "jobs/a pid 7",
			lsUs: tsLS, batchUs: tsBatch,
			verdicts:       []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceUnconfirmed, qos.GPUTimesliceUnconfirmed},
			wantLSPresence: true},
		{name: "escalation: LS demand above freezeAbovePercent",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.LSDemandPercent = 85 }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonEscalated, detailIn: "LS demand 85 %",
			lsUs: tsLS, batchUs: 120, verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed},
			suffers: true, wantLSPresence: true},
		{name: "no escalation at freezeAbovePercent itself (LS's 800 of demand leave batch 200: 120 µs)",
			in:    with(tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, 120)), func(in *qos.GPUTimesliceInput) { in.LSDemandPercent = 80 }),
			lever: qos.GPULeverTimeslice, reason: qos.GPUTimesliceReasonConfirmed, lsUs: tsLS, batchUs: 120,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, wantLSPresence: true},
		{name: "escalation: the caller's harm signal",
			in:    with(tsGPU(ls, batch), func(in *qos.GPUTimesliceInput) { in.LSHarm = true }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonEscalated, detailIn: "LS harmed",
			lsUs: tsLS, batchUs: tsBatch, verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed},
			suffers: true, wantLSPresence: true},
		{name: "escalation with no batch context yet",
			in:    with(tsGPU(ls), func(in *qos.GPUTimesliceInput) { in.LSHarm = true }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonEscalated, lsUs: tsLS, batchUs: tsBatch,
			verdicts: []string{qos.GPUTimesliceConfirmed}, suffers: true, wantLSPresence: true},
		{name: "unusable LS demand: taken as 100, escalated, shortest batch slice",
			in:    with(tsGPU(ls, tsCtx("jobs/train", qos.ClassBatch, 100)), func(in *qos.GPUTimesliceInput) { in.LSDemandPercent = math.NaN() }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonEscalated, lsUs: tsLS, batchUs: 100,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceConfirmed}, suffers: true,
			sanitizedIn: "lsDemand=NaN unusable: assumed 100", wantLSPresence: true},
		{name: "unconfirmed wins over escalated in the reason; lsSuffers still said",
			in: with(tsGPU(ls, qos.GPUTimesliceContext{Pod: "jobs/a", Class: qos.ClassBatch, AskedUs: 100}),
				func(in *qos.GPUTimesliceInput) { in.LSDemandPercent = 95 }),
			lever: qos.GPULeverFreeze, reason: qos.GPUTimesliceReasonUnconfirmed, lsUs: tsLS, batchUs: 100,
			verdicts: []string{qos.GPUTimesliceConfirmed, qos.GPUTimesliceUnconfirmed}, suffers: true,
			wantLSPresence: true},
		{name: "negative pod count: taken as 0",
			in:    qos.GPUTimesliceInput{DriverSupported: true, BatchPods: -2},
			lever: qos.GPULeverNone, reason: qos.GPUTimesliceReasonNoBatch, lsUs: tsLS, batchUs: tsNoLSBatch,
			sanitizedIn: "batchPods=-2 negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(), tc.in)
			if d.GPU != tc.in.Index {
				t.Errorf("GPU = %d, want %d", d.GPU, tc.in.Index)
			}
			if d.Lever != tc.lever || d.Reason != tc.reason {
				t.Fatalf("lever, reason = %s, %s (%s), want %s, %s", d.Lever, d.Reason, d.Detail, tc.lever, tc.reason)
			}
			if !strings.Contains(d.Detail, tc.detailIn) {
				t.Errorf("detail = %q, want it to contain %q", d.Detail, tc.detailIn)
			}
			if !strings.Contains(d.Sanitized, tc.sanitizedIn) || (tc.sanitizedIn == "" && d.Sanitized != "") {
				t.Errorf("sanitized = %q, want %q", d.Sanitized, tc.sanitizedIn)
			}
			if tc.noSlices {
				if d.LSSliceUs != 0 || d.BatchSliceUs != 0 || d.Contexts != nil || d.LSWorstWaitUs != 0 {
					t.Fatalf("slices or verdicts on a GPU without the lever: %+v", d)
				}
				return
			}
			if d.LSSliceUs != tc.lsUs || d.BatchSliceUs != tc.batchUs {
				t.Errorf("slices LS %d, batch %d µs, want %d, %d (%s)", d.LSSliceUs, d.BatchSliceUs, tc.lsUs,
					tc.batchUs, d.SliceReason)
			}
			if d.LSPresent != tc.wantLSPresence || d.LSSuffers != tc.suffers {
				t.Errorf("lsPresent, lsSuffers = %v, %v, want %v, %v", d.LSPresent, d.LSSuffers, tc.wantLSPresence, tc.suffers)
			}
			if got := len(d.Contexts); got != len(tc.verdicts) {
				t.Fatalf("%d verdicts, want %d: %+v", got, len(tc.verdicts), d.Contexts)
			}
			for i, v := range d.Contexts {
				if v.Verdict != tc.verdicts[i] {
					t.Errorf("context %d (%s): verdict %s (%s), want %s", i, v.Pod, v.Verdict, v.Why, tc.verdicts[i])
				}
				if (v.Verdict == qos.GPUTimesliceConfirmed) != (v.Why == "") {
					t.Errorf("context %d: verdict %s with why %q", i, v.Verdict, v.Why)
				}
				if v.Verdict != qos.GPUTimesliceConfirmed && !strings.Contains(v.Why, v.Pod) {
					t.Errorf("context %d: why %q does not name pod %s", i, v.Why, v.Pod)
				}
				want := tc.lsUs
				if v.Class == qos.ClassBatch {
					want = tc.batchUs
				}
				if v.WantUs != want || v.Reask != (v.AskedUs != want) {
					t.Errorf("context %d: want %d reask %v (asked %d), want %d", i, v.WantUs, v.Reask, v.AskedUs, want)
				}
			}
			if d.LSPresent && d.LSWorstWaitUs != d.BatchSliceUs+255 {
				t.Errorf("LS's worst wait %d µs, want batch %d + 255", d.LSWorstWaitUs, d.BatchSliceUs)
			}
			if !d.LSPresent && d.LSWorstWaitUs != 0 {
				t.Errorf("LS's worst wait %d µs without LS", d.LSWorstWaitUs)
			}
		})
	}
}

// TestChooseGPUTimesliceUnconfirmed takes one batch context through each way its slice
// can fail confirmation: every one sends the GPU to the freeze, naming the context.
func TestChooseGPUTimesliceUnconfirmed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		driver  bool
		mod     func(*qos.GPUTimesliceContext)
		whyIn   string
		readOut uint64
	}{
		{"no outside observer (the shim's word alone)", true,
			func(c *qos.GPUTimesliceContext) { c.Observed = false }, "no outside observation", tsBatch},
		{"no shim report (no shim in the container)", true,
			func(c *qos.GPUTimesliceContext) { c.ShimReported, c.ShimReadBackUs = false, 0 }, "no shim report", 0},
		{"nothing seen at all (a process NVML lists)", true,
			func(c *qos.GPUTimesliceContext) {
				*c = qos.GPUTimesliceContext{Pod: c.Pod, PID: c.PID, Class: qos.ClassBatch, AskedUs: tsBatch}
			}, "no outside observation", 0},
		{"the shim refused (old driver)", true,
			func(c *qos.GPUTimesliceContext) { c.ShimRefused = "mode unsupported, driver 530.41.03" },
			"the shim set nothing: mode unsupported, driver 530.41.03", tsBatch},
		{"driver refused, seen from outside", true,
			func(c *qos.GPUTimesliceContext) { c.ObservedStatus = 0x1f }, "the driver refused its slice (errno 0, status 0x1f", tsBatch},
		{"ioctl error, seen from outside", true,
			func(c *qos.GPUTimesliceContext) { c.ObservedErrno = 22 }, "errno 22", tsBatch},
		{"another value seen set from outside", true,
			func(c *qos.GPUTimesliceContext) { c.ObservedSetUs = 2048 }, "seen set to 2048 µs from outside, the agent asked 130 µs", tsBatch},
		{"firmware refused, by the shim", true,
			func(c *qos.GPUTimesliceContext) { c.ShimStatus = 0x56 }, "refused it (errno 0, status 0x56)", 0},
		{"ioctl error, by the shim", true,
			func(c *qos.GPUTimesliceContext) { c.ShimErrno = 1 }, "errno 1,", 0},
		{"read back differs (firmware floored it)", true,
			func(c *qos.GPUTimesliceContext) { c.ShimReadBackUs = 1000 }, "read back 1000 µs, the agent asked 130 µs", 1000},
		{"the agent asked nothing", true,
			func(c *qos.GPUTimesliceContext) { c.AskedUs, c.ShimReadBackUs, c.ObservedSetUs = 0, 0, 0 },
			"the agent asked it no slice", 0},
		{"unsupported driver", false,
			func(*qos.GPUTimesliceContext) {}, "driver 580.95.05 is not a supported version", tsBatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tsCtx("jobs/train", qos.ClassBatch, tsBatch)
			tc.mod(&c)
			in := tsGPU(tsCtx("prod/web", qos.ClassLS, tsLS), tsCtx("jobs/ok", qos.ClassBatch, tsBatch), c)
			in.DriverSupported = tc.driver
			d := qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(), in)
			if d.Lever != qos.GPULeverFreeze || d.Reason != qos.GPUTimesliceReasonUnconfirmed {
				t.Fatalf("lever %s, reason %s (%s), want freeze, %s", d.Lever, d.Reason, d.Detail,
					qos.GPUTimesliceReasonUnconfirmed)
			}
			v := d.Contexts[2]
			if v.Verdict != qos.GPUTimesliceUnconfirmed || !strings.Contains(v.Why, tc.whyIn) ||
				!strings.Contains(v.Why, "batch context of pod jobs/train") {
				t.Errorf("verdict %s, why %q, want unconfirmed naming jobs/train with %q", v.Verdict, v.Why, tc.whyIn)
			}
			if v.ReadBackUs != tc.readOut {
				t.Errorf("readBackUs %d, want %d", v.ReadBackUs, tc.readOut)
			}
			if tc.driver {
				if !strings.Contains(d.Detail, "jobs/train") || !strings.Contains(d.Detail, tc.whyIn) {
					t.Errorf("detail %q does not name the context and %q", d.Detail, tc.whyIn)
				}
				if d.Contexts[1].Verdict != qos.GPUTimesliceConfirmed {
					t.Errorf("the good batch context: %+v", d.Contexts[1])
				}
			} else if !strings.Contains(d.Detail, "driver 580.95.05") {
				t.Errorf("detail %q does not name the driver", d.Detail)
			}
		})
	}
}

// TestChooseGPUTimesliceSelfSet covers the self-set rule's edges for both classes.
func TestChooseGPUTimesliceSelfSet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		class    qos.Class
		asked    uint64
		selfUs   uint64
		status   uint32
		errno    int
		verdict  string
		noteIn   string
		lever    string
		whyIn    string
		selfOut  uint64
		readBack uint64
	}{
		{"batch one µs above the agent's", qos.ClassBatch, tsBatch, tsBatch + 1, 0, 0, qos.GPUTimesliceSelfSet, "",
			qos.GPULeverFreeze, "set itself a slice of 131 µs, longer than the agent's 130 µs", tsBatch + 1, tsBatch},
		{"batch equal to the agent's", qos.ClassBatch, tsBatch, tsBatch, 0, 0, qos.GPUTimesliceConfirmed,
			"not longer than the agent's", qos.GPULeverTimeslice, "", tsBatch, tsBatch},
		{"batch asked 100, wanted 130, self-set 120: within the agent's, confirmed", qos.ClassBatch, 100, 120, 0, 0,
			qos.GPUTimesliceConfirmed, "set itself 120 µs", qos.GPULeverTimeslice, "", 120, 100},
		{"batch long, errno", qos.ClassBatch, tsBatch, 1 << 40, 0, 5, qos.GPUTimesliceConfirmed,
			"refused by the driver (errno 5", qos.GPULeverTimeslice, "", 1 << 40, tsBatch},
		{"LS above its 10 ms", qos.ClassLS, tsLS, tsLS + 1, 0, 0, qos.GPUTimesliceSelfSet, "",
			qos.GPULeverTimeslice, "LS context of pod p pid 101 (0xc1/0x5c000001) set itself a slice of 10001 µs", tsLS + 1, tsLS},
		{"LS shorter: in force, confirmed", qos.ClassLS, tsLS, 2048, 0, 0, qos.GPUTimesliceConfirmed,
			"set itself 2048 µs", qos.GPULeverTimeslice, "", 2048, tsLS},
		{"LS long, refused", qos.ClassLS, tsLS, 1 << 30, 0x3, 0, qos.GPUTimesliceConfirmed, "status 0x3",
			qos.GPULeverTimeslice, "", 1 << 30, tsLS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tsCtx("p", tc.class, tc.asked)
			c.SelfSet, c.SelfSetUs, c.SelfSetStatus, c.SelfSetErrno = true, tc.selfUs, tc.status, tc.errno
			ctxs := []qos.GPUTimesliceContext{c}
			if tc.class != qos.ClassBatch {
				ctxs = append(ctxs, tsCtx("jobs/train", qos.ClassBatch, tsBatch))
			} else {
				ctxs = append(ctxs, tsCtx("prod/web", qos.ClassLS, tsLS))
			}
			d := qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(), tsGPU(ctxs...))
			v := d.Contexts[0]
			if v.Verdict != tc.verdict || !strings.Contains(v.Note, tc.noteIn) || !strings.Contains(v.Why, tc.whyIn) {
				t.Errorf("verdict %s, why %q, note %q; want %s, why with %q, note with %q", v.Verdict, v.Why, v.Note,
					tc.verdict, tc.whyIn, tc.noteIn)
			}
			if v.SelfSetUs != tc.selfOut || v.ReadBackUs != tc.readBack {
				t.Errorf("selfSetUs %d readBackUs %d, want %d %d", v.SelfSetUs, v.ReadBackUs, tc.selfOut, tc.readBack)
			}
			if d.Lever != tc.lever {
				t.Errorf("lever %s (%s: %s), want %s", d.Lever, d.Reason, d.Detail, tc.lever)
			}
		})
	}
}

func TestChooseGPUTimesliceSlices(t *testing.T) {
	t.Parallel()
	def := qos.DefaultGPUTimeslicePolicy()
	wide := def
	wide.BatchSlice.Duration, wide.SwitchCost.Duration, wide.LSMaxWait.Duration =
		50*time.Microsecond, 150*time.Microsecond, time.Millisecond
	odd := def
	odd.BatchSlice.Duration = 105 * time.Microsecond
	tests := []struct {
		name      string
		p         qos.GPUTimeslicePolicy
		demand    float64
		lsReq     []int64
		batchReq  []int64
		lsCtx     bool
		batchUs   uint64
		worstUs   uint64
		reasonIns []string
	}{
		{name: "no LS: the driver's default", p: def, batchReq: []int64{1000}, batchUs: 2048,
			reasonIns: []string{"no LS on the GPU"}},
		{name: "an LS context alone makes LS present", p: def, lsCtx: true, batchReq: []int64{1000},
			batchUs: 240, worstUs: 495},
		{name: "LS demand alone makes LS present", p: def, demand: 0.01, batchReq: []int64{1000},
			batchUs: 240, worstUs: 495, reasonIns: []string{"999 milli of 999 left by LS"}},
		{name: "LS requests alone make LS present, no batch request: the base", p: def, lsReq: []int64{100},
			batchUs: 100, worstUs: 355},
		{name: "the standard pair: LS 32 % busy, whole-GPU batch", p: def, demand: 32, batchReq: []int64{1000},
			batchUs: 190, worstUs: 445, reasonIns: []string{"680 milli of 680", "demand 32 %", "≤ 500 µs"}},
		{name: "a fraction of a point of demand rounds LS up", p: def, demand: 32.01, batchReq: []int64{1000},
			batchUs: 190, worstUs: 445, reasonIns: []string{"679 milli"}},
		{name: "LS 750 milli, batch 250", p: def, demand: 32, lsReq: []int64{500, 250}, batchReq: []int64{250},
			batchUs: 130, worstUs: 385},
		{name: "LS requests above its demand count", p: def, demand: 10, lsReq: []int64{900}, batchReq: []int64{1000},
			batchUs: 110, worstUs: 365},
		{name: "batch requests summed and bounded", p: def, lsReq: []int64{100}, batchReq: []int64{600, 600, -5},
			batchUs: 230, worstUs: 485},
		{name: "LS's requests over 1000 bounded: batch at the base", p: def, lsReq: []int64{800, 800},
			batchReq: []int64{500}, batchUs: 100, worstUs: 355},
		{name: "LS at 100 %: batch at the base", p: def, demand: 100, batchReq: []int64{1000}, batchUs: 100,
			worstUs: 355},
		{name: "LS demand above 100 capped", p: def, demand: 250, batchReq: []int64{1000}, batchUs: 100, worstUs: 355},
		{name: "a wider bound: 50 µs base up to 850 µs", p: wide, demand: 50, batchReq: []int64{500},
			batchUs: 450, worstUs: 600},
		{name: "a wider bound at its top", p: wide, lsCtx: true, batchReq: []int64{1000}, batchUs: 850, worstUs: 1000},
		{name: "a base off the 10 µs grid stays the floor", p: odd, demand: 100, batchReq: []int64{1000},
			batchUs: 105, worstUs: 360},
		{name: "a base off the grid, rounded down above it", p: odd, demand: 0, lsCtx: true, batchReq: []int64{1000},
			batchUs: 240, worstUs: 495},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := qos.GPUTimesliceInput{DriverSupported: true, LSDemandPercent: tc.demand, LSRequestMilli: tc.lsReq,
				BatchRequestMilli: tc.batchReq, BatchPods: 1}
			if tc.lsCtx {
				in.Contexts = []qos.GPUTimesliceContext{tsCtx("prod/web", qos.ClassLS, tsLS)}
			}
			d := qos.ChooseGPUTimeslice(tc.p, in)
			if d.BatchSliceUs != tc.batchUs || d.LSWorstWaitUs != tc.worstUs {
				t.Errorf("batch %d µs, LS's worst wait %d µs; want %d, %d (%s)", d.BatchSliceUs, d.LSWorstWaitUs,
					tc.batchUs, tc.worstUs, d.SliceReason)
			}
			if d.LSSliceUs != tsLS {
				t.Errorf("LS slice %d µs, want %d", d.LSSliceUs, tsLS)
			}
			for _, s := range tc.reasonIns {
				if !strings.Contains(d.SliceReason, s) {
					t.Errorf("slice reason %q, want it to contain %q", d.SliceReason, s)
				}
			}
		})
	}
}

// TestChooseGPUTimesliceBounds sweeps LS's demand and the requests: batch's slice never
// leaves [batchSlice, lsMaxWait − switchCost] where LS is on the GPU, never grows with
// LS's demand, and LS's worst wait stays within lsMaxWait.
func TestChooseGPUTimesliceBounds(t *testing.T) {
	t.Parallel()
	def := qos.DefaultGPUTimeslicePolicy()
	tight := def
	tight.BatchSlice.Duration, tight.SwitchCost.Duration, tight.LSMaxWait.Duration =
		10*time.Microsecond, 0, 10*time.Microsecond
	slow := def
	slow.SwitchCost.Duration, slow.LSMaxWait.Duration = 1900*time.Microsecond, 2048*time.Microsecond
	for _, p := range []qos.GPUTimeslicePolicy{def, tight, slow} {
		lo := uint64(p.BatchSlice.Microseconds())
		hi := uint64((p.LSMaxWait.Duration - p.SwitchCost.Duration).Microseconds())
		for _, batchReq := range []int64{0, 1, 250, 999, 1000, 5000} {
			for _, lsReq := range []int64{0, 1, 500, 1000} {
				prev := uint64(math.MaxUint64)
				for demand := 0.0; demand <= 101; demand += 0.5 {
					in := qos.GPUTimesliceInput{DriverSupported: true, LSDemandPercent: demand,
						LSRequestMilli: []int64{lsReq}, BatchRequestMilli: []int64{batchReq}, BatchPods: 1}
					d := qos.ChooseGPUTimeslice(p, in)
					if !d.LSPresent {
						if d.BatchSliceUs != 2048 {
							t.Fatalf("%+v: no LS, batch %d µs", in, d.BatchSliceUs)
						}
						continue
					}
					if d.BatchSliceUs < lo || d.BatchSliceUs > hi {
						t.Fatalf("policy %+v, %+v: batch %d µs outside [%d, %d]", p, in, d.BatchSliceUs, lo, hi)
					}
					if d.LSWorstWaitUs > uint64(p.LSMaxWait.Microseconds()) {
						t.Fatalf("policy %+v, %+v: LS waits %d µs", p, in, d.LSWorstWaitUs)
					}
					if d.BatchSliceUs > prev {
						t.Fatalf("policy %+v, %+v: batch grew from %d to %d µs with LS's demand", p, in, prev,
							d.BatchSliceUs)
					}
					prev = d.BatchSliceUs
				}
			}
		}
	}
}

// TestChooseGPUTimesliceLeverInvariants checks the lever against the verdicts over
// many combinations: timeslice only with every batch context confirmed, a supported
// driver and LS not suffering; the freeze whenever a batch context is not confirmed.
func TestChooseGPUTimesliceLeverInvariants(t *testing.T) {
	t.Parallel()
	variants := []func(*qos.GPUTimesliceContext){
		func(*qos.GPUTimesliceContext) {},
		func(c *qos.GPUTimesliceContext) { c.Observed = false },
		func(c *qos.GPUTimesliceContext) { c.ShimReadBackUs++ },
		func(c *qos.GPUTimesliceContext) { c.SelfSet, c.SelfSetUs = true, 1<<20 },
		func(c *qos.GPUTimesliceContext) { c.SelfSet, c.SelfSetUs, c.SelfSetStatus = true, 1<<20, 1 },
		func(c *qos.GPUTimesliceContext) { c.AskedUs, c.ShimReadBackUs, c.ObservedSetUs = 2048, 2048, 2048 },
	}
	for _, class := range []qos.Class{qos.ClassLS, qos.ClassBatch} {
		for i, a := range variants {
			for j, b := range variants {
				for _, driver := range []bool{true, false} {
					for _, harm := range []bool{false, true} {
						ca := tsCtx("a", class, tsBatch)
						if class == qos.ClassLS {
							ca.AskedUs, ca.ShimReadBackUs, ca.ObservedSetUs = tsLS, tsLS, tsLS
						}
						a(&ca)
						cb := tsCtx("b", qos.ClassBatch, tsBatch)
						b(&cb)
						in := tsGPU(ca, cb)
						in.DriverSupported, in.LSHarm = driver, harm
						d := qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(), in)
						allOK := driver
						for _, v := range d.Contexts {
							if v.Class == qos.ClassBatch && v.Verdict != qos.GPUTimesliceConfirmed {
								allOK = false
							}
						}
						wantTS := allOK && !harm
						if (d.Lever == qos.GPULeverTimeslice) != wantTS {
							t.Errorf("class %s variants %d/%d driver %v harm %v: lever %s (%s: %s), want timeslice %v",
								class, i, j, driver, harm, d.Lever, d.Reason, d.Detail, wantTS)
						}
						if !wantTS && d.Lever != qos.GPULeverFreeze {
							t.Errorf("variants %d/%d: lever %s, want freeze", i, j, d.Lever)
						}
					}
				}
			}
		}
	}
}

func TestGPUTimeslicePolicyValidate(t *testing.T) {
	t.Parallel()
	def := qos.DefaultGPUTimeslicePolicy()
	mod := func(f func(*qos.GPUTimeslicePolicy)) qos.GPUTimeslicePolicy {
		p := def
		f(&p)
		return p
	}
	us := func(n int) metav1.Duration { return metav1.Duration{Duration: time.Duration(n) * time.Microsecond} }
	tests := []struct {
		name  string
		p     qos.GPUTimeslicePolicy
		errIn []string // empty: valid
	}{
		{"defaults", def, nil},
		{"the widest valid", mod(func(p *qos.GPUTimeslicePolicy) {
			p.LSSlice, p.BatchSlice, p.SwitchCost, p.LSMaxWait, p.FreezeAbovePercent = us(100000), us(10), us(0), us(2048), 100
		}), nil},
		{"LS slice at the driver's default", mod(func(p *qos.GPUTimeslicePolicy) { p.LSSlice = us(2048) }), nil},
		{"batch + switch exactly the bound", mod(func(p *qos.GPUTimeslicePolicy) {
			p.BatchSlice, p.SwitchCost, p.LSMaxWait = us(245), us(255), us(500)
		}), nil},
		{"zero policy", qos.GPUTimeslicePolicy{}, []string{"timeslice.lsSlice: 0s", "timeslice.batchSlice: 0s",
			"timeslice.lsMaxWait: 0s", "timeslice.freezeAbovePercent: 0"}},
		{"LS slice below the driver's default", mod(func(p *qos.GPUTimeslicePolicy) { p.LSSlice = us(2047) }),
			[]string{"timeslice.lsSlice: 2.047ms must be in [2.048ms, 100ms]"}},
		{"LS slice too long", mod(func(p *qos.GPUTimeslicePolicy) { p.LSSlice = us(100001) }),
			[]string{"timeslice.lsSlice"}},
		{"LS slice not whole µs", mod(func(p *qos.GPUTimeslicePolicy) { p.LSSlice.Duration += 1 }),
			[]string{"timeslice.lsSlice: 10.000001ms must be whole microseconds"}},
		{"batch slice below 10 µs", mod(func(p *qos.GPUTimeslicePolicy) { p.BatchSlice = us(9) }),
			[]string{"timeslice.batchSlice: 9µs must be in [10µs, lsMaxWait − switchCost]"}},
		{"batch slice in nanoseconds", mod(func(p *qos.GPUTimeslicePolicy) {
			p.BatchSlice = metav1.Duration{Duration: 100500 * time.Nanosecond}
		}), []string{"timeslice.batchSlice: 100.5µs must be whole microseconds"}},
		{"negative switch cost", mod(func(p *qos.GPUTimeslicePolicy) { p.SwitchCost = us(-1) }),
			[]string{"timeslice.switchCost: -1µs must be in [0, 2.048ms)"}},
		{"switch cost at the default slice", mod(func(p *qos.GPUTimeslicePolicy) { p.SwitchCost = us(2048) }),
			[]string{"timeslice.switchCost"}},
		{"bound above the driver's default", mod(func(p *qos.GPUTimeslicePolicy) { p.LSMaxWait = us(2049) }),
			[]string{"timeslice.lsMaxWait: 2.049ms must be in [batchSlice + switchCost, 2.048ms]"}},
		{"bound below batch + switch", mod(func(p *qos.GPUTimeslicePolicy) { p.LSMaxWait = us(354) }),
			[]string{"timeslice.lsMaxWait: 354µs must be at least batchSlice + switchCost (100µs + 255µs)"}},
		{"switch cost eats the bound", mod(func(p *qos.GPUTimeslicePolicy) { p.SwitchCost = us(450) }),
			[]string{"must be at least batchSlice + switchCost (100µs + 450µs)"}},
		{"freezeAbovePercent 0", mod(func(p *qos.GPUTimeslicePolicy) { p.FreezeAbovePercent = 0 }),
			[]string{"timeslice.freezeAbovePercent: 0 must be in (0, 100]"}},
		{"freezeAbovePercent above 100", mod(func(p *qos.GPUTimeslicePolicy) { p.FreezeAbovePercent = 100.5 }),
			[]string{"freezeAbovePercent: 100.5"}},
		{"freezeAbovePercent NaN", mod(func(p *qos.GPUTimeslicePolicy) { p.FreezeAbovePercent = math.NaN() }),
			[]string{"freezeAbovePercent: NaN"}},
		{"every field bad, each reported", qos.GPUTimeslicePolicy{
			LSSlice: us(1), BatchSlice: us(1), SwitchCost: us(-5), LSMaxWait: us(-1), FreezeAbovePercent: -1,
		}, []string{"lsSlice", "batchSlice", "switchCost", "lsMaxWait", "freezeAbovePercent"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.p.Validate()
			if len(tc.errIn) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, qos.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidConfig", err)
			}
			for _, s := range tc.errIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Validate() = %q, want it to contain %q", err, s)
				}
			}
		})
	}
}

// TestChooseGPUTimesliceBadPolicy: an invalid policy is forced into range field by field,
// never giving batch a slice past the defaults' bound.
func TestChooseGPUTimesliceBadPolicy(t *testing.T) {
	t.Parallel()
	def := qos.DefaultGPUTimeslicePolicy()
	tests := []struct {
		name             string
		mod              func(*qos.GPUTimeslicePolicy)
		lsUs, batchUs    uint64
		worstUs          uint64
		escalatesAtFifty bool
	}{
		{"zero policy: each bad field its default, the zero switch cost (valid) kept",
			func(p *qos.GPUTimeslicePolicy) { *p = qos.GPUTimeslicePolicy{} }, tsLS, 370, 370, false},
		{"a bound that does not fit: all three defaults", func(p *qos.GPUTimeslicePolicy) {
			p.BatchSlice.Duration, p.SwitchCost.Duration, p.LSMaxWait.Duration = 2*time.Millisecond, 0, time.Millisecond
		}, tsLS, 190, 445, false},
		{"a bad LS slice alone", func(p *qos.GPUTimeslicePolicy) { p.LSSlice.Duration = time.Second },
			tsLS, 190, 445, false},
		{"a good LS slice and freeze threshold kept", func(p *qos.GPUTimeslicePolicy) {
			p.LSSlice.Duration, p.FreezeAbovePercent = 20*time.Millisecond, 40
		}, 20000, 190, 445, true},
		{"NaN threshold: the default", func(p *qos.GPUTimeslicePolicy) { p.FreezeAbovePercent = math.NaN() },
			tsLS, 190, 445, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := def
			tc.mod(&p)
			in := qos.GPUTimesliceInput{DriverSupported: true, LSDemandPercent: 32, BatchRequestMilli: []int64{1000},
				BatchPods: 1}
			d := qos.ChooseGPUTimeslice(p, in)
			if d.LSSliceUs != tc.lsUs || d.BatchSliceUs != tc.batchUs || d.LSWorstWaitUs != tc.worstUs {
				t.Errorf("LS %d, batch %d, wait %d µs; want %d, %d, %d", d.LSSliceUs, d.BatchSliceUs, d.LSWorstWaitUs,
					tc.lsUs, tc.batchUs, tc.worstUs)
			}
			in.LSDemandPercent = 50
			if got := qos.ChooseGPUTimeslice(p, in).LSSuffers; got != tc.escalatesAtFifty {
				t.Errorf("LS at 50 %%: suffers %v, want %v", got, tc.escalatesAtFifty)
			}
		})
	}
}

// TestGPUTimesliceDecisionJSON: /status renders the decision; its keys are part of
// what operators read.
func TestGPUTimesliceDecisionJSON(t *testing.T) {
	t.Parallel()
	self := tsCtx("jobs/eval", qos.ClassBatch, tsBatch)
	self.SelfSet, self.SelfSetUs = true, 50000
	d := qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(),
		tsGPU(tsCtx("prod/web", qos.ClassLS, tsLS), tsCtx("jobs/train", qos.ClassBatch, 100), self))
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"gpu":3`, `"lever":"freeze"`, `"reason":"self-set-slice"`, `"lsPresent":true`,
		`"lsSliceUs":10000`, `"batchSliceUs":130`, `"lsWorstWaitUs":385`, `"verdict":"self-set"`,
		`"verdict":"confirmed"`, `"selfSetUs":50000`, `"askedUs":100`, `"wantUs":130`, `"reask":true`,
		`"readBackUs":100`, `"class":"batch"`, `"class":"LS"`, `"pod":"jobs/eval"`, `"context":"0xc1/0x5c000001"`} {
		if !strings.Contains(s, want) {
			t.Errorf("JSON %s lacks %s", s, want)
		}
	}
	for _, absent := range []string{`"sanitized"`, `"lsSuffers"`} {
		if strings.Contains(s, absent) {
			t.Errorf("JSON %s has %s", s, absent)
		}
	}
	var back qos.GPUTimesliceDecision
	if err := json.Unmarshal(b, &back); err != nil || back.Lever != d.Lever || len(back.Contexts) != 3 {
		t.Errorf("round trip: %+v, %v", back, err)
	}
	mps, err := json.Marshal(qos.ChooseGPUTimeslice(qos.DefaultGPUTimeslicePolicy(), qos.GPUTimesliceInput{MPS: true}))
	if err != nil || string(mps) != `{"gpu":0,"lever":"mps","reason":"mps","lsPresent":false}` {
		t.Errorf("MPS GPU JSON %s, %v", mps, err)
	}
}

// TestGPUTimeslicePolicyYAML: the policy as a config file holds it, durations as
// strings, and the defaults survive a round trip.
func TestGPUTimeslicePolicyYAML(t *testing.T) {
	t.Parallel()
	p := qos.DefaultGPUTimeslicePolicy()
	if err := yaml.Unmarshal([]byte("lsSlice: 20ms\nbatchSlice: 150us\nfreezeAbovePercent: 90\n"), &p); err != nil {
		t.Fatal(err)
	}
	want := qos.DefaultGPUTimeslicePolicy()
	want.LSSlice.Duration, want.BatchSlice.Duration, want.FreezeAbovePercent = 20*time.Millisecond, 150*time.Microsecond, 90
	if p != want {
		t.Fatalf("unmarshalled %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(qos.DefaultGPUTimeslicePolicy())
	if err != nil {
		t.Fatal(err)
	}
	var back qos.GPUTimeslicePolicy
	if err := yaml.Unmarshal(out, &back); err != nil || back != qos.DefaultGPUTimeslicePolicy() {
		t.Fatalf("round trip of %s: %+v, %v", out, back, err)
	}
}
