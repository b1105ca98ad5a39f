package cgroups

import (
	"errors"
	"testing"
	"time"
)

// TestRealLowerDescendantCPULimits: a cut below a child's own limit (an in-place batch
// pod's container) is in force on both versions. On v1, where the kernel refuses a
// parent below its children, the child and the grandchild below it are lowered so that
// the cut itself is applied, not clamped; a later raise puts their limits back as far as
// the group's new limit allows, and all the way once it is above them. On v2 the kernel
// takes the cut as written and bounds the descendants by it without touching their own
// limits (cpu.max is min()ed along the path): nothing is lowered, nothing is left to
// raise, and a busy loop in the grandchild gets no more than the cut until it is raised.
func TestRealLowerDescendantCPULimits(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	base := uniqueName(t)
	cleanupGroup(t, h, base)
	parent, err := h.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	child, err := h.Create(base + "/child")
	if err != nil {
		t.Fatal(err)
	}
	grand, err := h.Create(base + "/child/grand")
	if err != nil {
		t.Fatal(err)
	}
	const ms = time.Millisecond
	if err := child.SetCPULimit(200*ms, 100*ms); err != nil {
		t.Fatal(err)
	}
	if err := grand.SetCPULimit(30*ms, 20*ms); err != nil {
		t.Fatal(err)
	}
	if h.Layout() == LayoutV2 {
		lowerDescendantsV2(t, h, parent, child, grand)
		return
	}
	// Without lowering, the kernel clamps the cut at the child's 2 CPUs.
	if err := parent.SetCPULimit(10*ms, 100*ms); !errors.Is(err, ErrClamped) {
		t.Fatalf("cut below the child = %v; want ErrClamped (the fault)", err)
	}
	lowered, err := parent.LowerDescendantCPULimits(10*ms, 100*ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(lowered) != 2 || lowered[0].Rel != base+"/child/grand" || lowered[0].Was != (CFSLimit{30 * ms, 20 * ms}) ||
		lowered[1].Rel != base+"/child" || lowered[1].Was != (CFSLimit{200 * ms, 100 * ms}) {
		t.Fatalf("lowered %+v; want the grandchild then the child with their old limits", lowered)
	}
	if err := parent.SetCPULimit(10*ms, 100*ms); err != nil {
		t.Fatalf("cut after lowering: %v", err)
	}
	if c, g := cfsLimitOf(t, child), cfsLimitOf(t, grand); c != (CFSLimit{10 * ms, 100 * ms}) || g != (CFSLimit{2 * ms, 20 * ms}) {
		t.Fatalf("child %+v, grandchild %+v; want 0.1 CPU each", c, g)
	}
	// A raise to 0.5 CPU: the child gets 0.5, the grandchild 0.5 (below its 1.5).
	if err := parent.SetCPULimit(50*ms, 100*ms); err != nil {
		t.Fatal(err)
	}
	left, err := h.RaiseDescendantCPULimits(lowered, 50*ms, 100*ms)
	if err != nil || len(left) != 2 {
		t.Fatalf("raise to 0.5: left %+v, %v; want both still below their old limits", left, err)
	}
	if c, g := cfsLimitOf(t, child), cfsLimitOf(t, grand); c != (CFSLimit{50 * ms, 100 * ms}) || g != (CFSLimit{10 * ms, 20 * ms}) {
		t.Fatalf("after a raise to 0.5: child %+v, grandchild %+v", c, g)
	}
	// A raise above both: their own limits come back, nothing is left to restore.
	if err := parent.SetCPULimit(300*ms, 100*ms); err != nil {
		t.Fatal(err)
	}
	left, err = h.RaiseDescendantCPULimits(left, 300*ms, 100*ms)
	if err != nil || len(left) != 0 {
		t.Fatalf("raise to 3: left %+v, %v; want nothing", left, err)
	}
	if c, g := cfsLimitOf(t, child), cfsLimitOf(t, grand); c != (CFSLimit{200 * ms, 100 * ms}) || g != (CFSLimit{30 * ms, 20 * ms}) {
		t.Fatalf("after a raise to 3: child %+v, grandchild %+v; want their own limits", c, g)
	}
}

// cfsLimitOf is g's CFS limit.
func cfsLimitOf(t *testing.T, g *Group) CFSLimit {
	t.Helper()
	q, p, err := g.CPULimit()
	if err != nil {
		t.Fatal(err)
	}
	return CFSLimit{q, p}
}

// lowerDescendantsV2 is TestRealLowerDescendantCPULimits on v2: parent unlimited, child
// at 2 CPUs, grandchild at 1.5.
func lowerDescendantsV2(t *testing.T, h *Hierarchy, parent, child, grand *Group) {
	t.Helper()
	const ms = time.Millisecond
	own := func() {
		t.Helper()
		if c, g := cfsLimitOf(t, child), cfsLimitOf(t, grand); c != (CFSLimit{200 * ms, 100 * ms}) || g != (CFSLimit{30 * ms, 20 * ms}) {
			t.Fatalf("child %+v, grandchild %+v; want their own limits untouched", c, g)
		}
	}
	if err := parent.SetCPULimit(10*ms, 100*ms); err != nil {
		t.Fatalf("cut below the child on v2 = %v; want it taken as written", err)
	}
	if got := cfsLimitOf(t, parent); got != (CFSLimit{10 * ms, 100 * ms}) {
		t.Fatalf("parent after the cut %+v; want 10ms/100ms", got)
	}
	lowered, err := parent.LowerDescendantCPULimits(10*ms, 100*ms)
	if err != nil || lowered != nil {
		t.Fatalf("LowerDescendantCPULimits on v2 = %+v, %v; want nothing lowered", lowered, err)
	}
	own()
	burner := startBurner(t)
	if err := grand.AddProc(burner.Process.Pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	// The kernel holds the whole subtree to the parent's 0.1 CPU.
	cpus, thr := measure(t, parent, 1500*time.Millisecond)
	t.Logf("cut to 0.1 CPU: a busy loop two levels below used %.3f CPUs, %d throttled periods", cpus, thr)
	if cpus > 0.15 || thr == 0 {
		t.Fatalf("a busy loop below a child limited to 2 CPUs used %.3f CPUs (%d throttled periods) under a 0.1 CPU parent", cpus, thr)
	}
	// A raise: nothing to put back, and the busy loop gets more than the cut again.
	if err := parent.SetCPULimit(300*ms, 100*ms); err != nil {
		t.Fatal(err)
	}
	left, err := h.RaiseDescendantCPULimits(lowered, 300*ms, 100*ms)
	if err != nil || len(left) != 0 {
		t.Fatalf("raise on v2: left %+v, %v; want nothing", left, err)
	}
	own()
	var ok bool
	for try := 0; try < 3 && !ok; try++ {
		cpus, _ = measure(t, parent, 1500*time.Millisecond)
		t.Logf("raised to 3 CPUs: the busy loop used %.3f CPUs", cpus)
		ok = cpus >= 0.3
	}
	if !ok {
		t.Fatalf("the busy loop stayed at %.3f CPUs after the parent was raised to 3", cpus)
	}
}
