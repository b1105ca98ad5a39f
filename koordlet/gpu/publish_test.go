package gpu

import (
	"math"
	"testing"
)

func TestLSFreeMilli(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		peak float64
		cap  int
		want int
	}{
		{"LS idle, no MPS", 0, 0, 1000},
		{"LS peak", 37.5, 0, 625},
		{"used part rounded up", 33.33, 0, 666},
		{"MPS cap above the peak", 20, 60, 400},
		{"peak above the MPS cap", 80, 60, 200},
		{"LS fills the GPU", 100, 0, 0},
		{"per-process sums past 100", 104, 0, 0},
		{"negative sample", -3, 0, 1000},
		{"unknown", math.NaN(), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := lsFreeMilli(tc.peak, tc.cap); got != tc.want {
				t.Fatalf("lsFreeMilli(%v, %d) = %d, want %d", tc.peak, tc.cap, got, tc.want)
			}
		})
	}
}

// TestNodeGPUsPublishesLSFree: node-metrics carry, per GPU, 1000 minus LS's peak over
// the window (not its mean), and no MPS flag without the agent's MPS server.
func TestNodeGPUsPublishesLSFree(t *testing.T) {
	t.Parallel()
	r := newMPSRig(t)
	r.srv.ready.Store(false) // no MPS server: the freeze lever, MPS false
	for _, util := range []float64{10, 70, 20} {
		r.step(t, lsProc(util))
	}
	g := r.m.NodeGPUs()
	if len(g.Devices) != 1 {
		t.Fatalf("devices %+v", g.Devices)
	}
	d := g.Devices[0]
	if d.LSFreeMilli == nil || *d.LSFreeMilli != 300 || d.MPS {
		t.Fatalf("lsFree %v, mps %v; want 300 (LS peak 70 %%), false", d.LSFreeMilli, d.MPS)
	}
	// A new window starts from nothing: LS idle now leaves the whole GPU.
	r.step(t)
	if d := r.m.NodeGPUs().Devices[0]; d.LSFreeMilli == nil || *d.LSFreeMilli != 1000 {
		t.Fatalf("next window: lsFree %v, want 1000", d.LSFreeMilli)
	}
}

// TestNodeGPUsPublishesMPS: on a GPU where the agent's MPS server runs, the flag is set
// and LS's MPS cap bounds the free share when it exceeds LS's measured peak.
func TestNodeGPUsPublishesMPS(t *testing.T) {
	t.Parallel()
	r := newMPSRig(t)
	r.step(t) // the Manager has seen the GPU: MPS on for it
	ls := r.plan(t, false)
	r.step(t, lsProc(5))
	d := r.m.NodeGPUs().Devices[0]
	if !d.MPS {
		t.Fatalf("mps false on a GPU with a ready MPS server")
	}
	want := lsFreeMilli(5, ls.ActiveThreadPercent)
	if ls.ActiveThreadPercent <= 5 || d.LSFreeMilli == nil || *d.LSFreeMilli != want {
		t.Fatalf("LS cap %d %%: lsFree %v, want %d", ls.ActiveThreadPercent, d.LSFreeMilli, want)
	}
}
