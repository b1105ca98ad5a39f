package cgroups

import (
	"errors"
	"testing"
	"time"
)

// TestRealLowerDescendantCPULimits: a cut below a child's own limit (an in-place batch
// pod's container) lowers the child, and the grandchild below it, so that the cut
// itself is applied, not clamped; a later raise puts their limits back as far as the
// group's new limit allows, and all the way once it is above them.
func TestRealLowerDescendantCPULimits(t *testing.T) {
	t.Parallel()
	h := realHierarchy(t)
	if h.Layout() == LayoutV2 {
		t.Skip("v2 does not refuse a parent below its children (cpu.max min()s them)")
	}
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
	limit := func(g *Group) CFSLimit {
		t.Helper()
		q, p, err := g.CPULimit()
		if err != nil {
			t.Fatal(err)
		}
		return CFSLimit{q, p}
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
	if c, g := limit(child), limit(grand); c != (CFSLimit{10 * ms, 100 * ms}) || g != (CFSLimit{2 * ms, 20 * ms}) {
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
	if c, g := limit(child), limit(grand); c != (CFSLimit{50 * ms, 100 * ms}) || g != (CFSLimit{10 * ms, 20 * ms}) {
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
	if c, g := limit(child), limit(grand); c != (CFSLimit{200 * ms, 100 * ms}) || g != (CFSLimit{30 * ms, 20 * ms}) {
		t.Fatalf("after a raise to 3: child %+v, grandchild %+v; want their own limits", c, g)
	}
}
