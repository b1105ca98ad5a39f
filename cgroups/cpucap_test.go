package cgroups

import (
	"testing"
	"time"
)

// TestLowerDescendantCPULimits: on fake roots, the descendants above the cut are lowered
// to it at their own periods (those below it are left alone) and put back, as far as the
// group's new limit allows, by RaiseDescendantCPULimits; v2 needs neither.
func TestLowerDescendantCPULimits(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h, err := Open(newFake(t, k))
			if err != nil {
				t.Fatal(err)
			}
			parent := fakeCreate(t, h, "pod")
			high := fakeCreate(t, h, "pod/high")
			low := fakeCreate(t, h, "pod/low")
			if err := high.SetCPULimit(400*ms, 200*ms); err != nil {
				t.Fatal(err)
			}
			if err := low.SetCPULimit(5*ms, 100*ms); err != nil {
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
			lowered, err := parent.LowerDescendantCPULimits(10*ms, 100*ms)
			if err != nil {
				t.Fatal(err)
			}
			if k.layout() == LayoutV2 {
				if lowered != nil || limit(high) != (CFSLimit{400 * ms, 200 * ms}) {
					t.Fatalf("v2: lowered %+v, high %+v; want nothing changed", lowered, limit(high))
				}
				return
			}
			if len(lowered) != 1 || lowered[0] != (LoweredLimit{Rel: "pod/high", Was: CFSLimit{400 * ms, 200 * ms}}) {
				t.Fatalf("lowered %+v; want pod/high with its 2 CPUs", lowered)
			}
			if h, l := limit(high), limit(low); h != (CFSLimit{20 * ms, 200 * ms}) || l != (CFSLimit{5 * ms, 100 * ms}) {
				t.Fatalf("high %+v, low %+v; want high at 0.1 CPU, low untouched", h, l)
			}
			for _, tc := range []struct {
				quota    time.Duration
				want     CFSLimit
				leftOver int
			}{
				{50 * ms, CFSLimit{100 * ms, 200 * ms}, 1},
				{Unlimited, CFSLimit{400 * ms, 200 * ms}, 0},
			} {
				left, err := h.RaiseDescendantCPULimits(lowered, tc.quota, 100*ms)
				if err != nil || len(left) != tc.leftOver || limit(high) != tc.want {
					t.Fatalf("raise to %v: high %+v, left %+v, %v; want %+v and %d left", tc.quota, limit(high), left,
						err, tc.want, tc.leftOver)
				}
			}
		})
	}
}
