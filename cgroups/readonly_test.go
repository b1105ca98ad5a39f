package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A host cgroupfs mounted read-only (a common container mistake) must fail
// Open with ErrReadOnly, not later on the first write. Root bypasses mode
// bits, so the fake is bind-mounted read-only (needs CAP_SYS_ADMIN).
func TestOpenReadOnly(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount a read-only fake cgroup root")
	}
	for _, k := range []fakeKind{fakeV1Separate, fakeV1Combined, fakeHybrid, fakeV2} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			src := newFake(t, k)
			dst := t.TempDir()
			if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				t.Skipf("cannot bind-mount (no CAP_SYS_ADMIN here?): %v", err)
			}
			t.Cleanup(func() {
				if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
					t.Errorf("unmount %s: %v", dst, err)
				}
			})
			if _, err := Open(dst); err != nil {
				t.Fatalf("Open(rw bind mount) = %v", err)
			}
			if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
				t.Fatalf("remount ro: %v", err)
			}
			_, err := Open(dst)
			if !errors.Is(err, ErrReadOnly) {
				t.Fatalf("Open(ro) = %v; want ErrReadOnly", err)
			}
			// Detection itself still works read-only.
			if l, err := DetectLayout(dst); err != nil || l != k.layout() {
				t.Fatalf("DetectLayout(ro) = %v, %v", l, err)
			}
		})
	}
}

// Only the unified part read-only (hybrid with a ro cgroup2 mount) is
// caught too.
func TestOpenHybridUnifiedReadOnly(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount a read-only fake cgroup root")
	}
	root := newFake(t, fakeHybrid)
	unified := filepath.Join(root, "unified")
	if err := unix.Mount(unified, unified, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(unified, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if err := unix.Mount("", unified, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount ro: %v", err)
	}
	if _, err := Open(root); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Open with ro unified = %v; want ErrReadOnly", err)
	}
}
