package cgroups

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ThawTree thaws every group of a subtree that asks to be frozen, a child frozen on its
// own included, in whichever freezer the layout has; a subtree no hierarchy holds is
// ErrNotExist; a group the kernel keeps frozen is ErrTimeout, named.
func TestThawTree(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			pod, ctr := "kubepods/besteffort/poda", "kubepods/besteffort/poda/ctr"
			fakeCreate(t, h, pod)
			fakeCreate(t, h, ctr)
			v1 := h.freezerDir != ""
			state := func(rel string) string {
				if v1 {
					return strings.TrimSpace(mustRead(t, filepath.Join(h.freezerDir, rel, "freezer.state")))
				}
				return strings.TrimSpace(mustRead(t, filepath.Join(h.unifiedDir, rel, "cgroup.freeze")))
			}
			for _, rel := range []string{pod, ctr} {
				switch {
				case v1:
					mustWrite(t, filepath.Join(h.freezerDir, rel, "freezer.state"), "FROZEN\n")
				case h.unifiedDir != "":
					// Asked to freeze, not yet frozen: a freeze the thaw cancels.
					mustWrite(t, filepath.Join(h.unifiedDir, rel, "cgroup.freeze"), "1\n")
				}
			}
			ctx := context.Background()
			thawed, err := h.ThawTree(ctx, "kubepods")
			if err != nil {
				t.Fatalf("ThawTree: %v", err)
			}
			if k == fakeV1NoFreezer {
				if len(thawed) != 0 {
					t.Fatalf("thawed %q without any freezer", thawed)
				}
				return
			}
			if !slices.Equal(thawed, []string{pod, ctr}) {
				t.Errorf("thawed %q, want the pod then its container", thawed)
			}
			for _, rel := range []string{pod, ctr} {
				if s := state(rel); s != "THAWED" && s != "0" {
					t.Errorf("%s after ThawTree: %q", rel, s)
				}
			}
			if _, err := h.ThawTree(ctx, "kubepods.slice/nope"); !errors.Is(err, ErrNotExist) {
				t.Errorf("ThawTree of a missing subtree = %v, want ErrNotExist", err)
			}
			if v1 {
				return
			}
			// The kernel keeps reporting the container frozen: the wait ends with the
			// deadline and names it.
			mustWrite(t, filepath.Join(h.unifiedDir, ctr, "cgroup.events"), "populated 1\nfrozen 1\n")
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if _, err := h.ThawTree(short, "kubepods"); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), ctr) {
				t.Errorf("ThawTree of a group that stays frozen = %v, want ErrTimeout naming %s", err, ctr)
			}
		})
	}
}
