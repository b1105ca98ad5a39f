package cgroups

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/understory/understory/internal/testenv"
)

// TestRemoveEmptyReal creates a pod cgroup with a container child in every v1 hierarchy
// of this machine (as runc does) and checks RemoveEmpty takes it out of all of them, and
// refuses while a task is inside.
func TestRemoveEmptyReal(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFailInCI(t, "needs root to create cgroups")
	}
	h, err := Open("/sys/fs/cgroup")
	if err != nil {
		testenv.SkipOrFailInCI(t, "no writable cgroupfs: %v", err)
	}
	rel := fmt.Sprintf("understory-test-rm-%d/podx", rand.Uint32())
	mounts := h.mounts()
	if len(mounts) < 2 {
		t.Skipf("only %d hierarchies here", len(mounts))
	}
	t.Cleanup(func() {
		for _, m := range mounts {
			_ = removeTree(filepath.Join(m, filepath.Dir(rel)))
		}
	})
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(m, rel, "ctr"), 0o755); err != nil {
			t.Fatalf("mkdir in %s: %v", m, err)
		}
	}
	// A task inside: nothing may go.
	cmd := exec.Command("/bin/sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	g, err := h.Load(rel + "/ctr")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := h.RemoveEmpty(rel); !errors.Is(err, ErrBusy) {
		t.Fatalf("RemoveEmpty with a task inside: %v, want ErrBusy", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := h.RemoveEmpty(rel); err != nil {
		t.Fatalf("RemoveEmpty: %v", err)
	}
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, rel)); err == nil {
			t.Errorf("%s still exists", filepath.Join(m, rel))
		}
	}
	if err := h.RemoveEmpty(rel); err != nil {
		t.Fatalf("RemoveEmpty of a gone group: %v", err)
	}
	if err := h.RemoveEmpty("../etc"); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("escaping path: %v", err)
	}
}

func TestRemoveEmptyFake(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			root := newFake(t, k)
			h := OpenLayout(root, k.layout())
			// Plain directories stand in for cgroups (a fake has no kernel files to refuse rmdir).
			var made []string
			for _, m := range h.mounts() {
				d := filepath.Join(m, "kubepods/tier/podq/ctr")
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				made = append(made, d)
			}
			if len(made) == 0 {
				t.Fatal("no hierarchies found")
			}
			if err := h.RemoveEmpty("kubepods/tier/podq"); err != nil {
				t.Fatal(err)
			}
			for _, d := range made {
				if _, err := os.Stat(filepath.Dir(d)); err == nil {
					t.Errorf("%s remains", filepath.Dir(d))
				}
			}
		})
	}
}
