package cgroups

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFreezeFake(t *testing.T) {
	t.Parallel()
	for _, k := range allFakeKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			h := OpenLayout(newFake(t, k), k.layout())
			g := fakeCreate(t, h, "kubepods/besteffort/understory-batch")
			if k == fakeV1NoFreezer {
				if err := g.Freeze(); !errors.Is(err, ErrUnsupported) {
					t.Fatalf("Freeze without any freezer = %v; want ErrUnsupported", err)
				}
				if _, err := g.Frozen(); !errors.Is(err, ErrUnsupported) {
					t.Fatalf("Frozen without any freezer = %v; want ErrUnsupported", err)
				}
				return
			}
			v1 := k.layout() != LayoutV2 && k != fakeHybridNoFreezer
			var dir, file, frozenVal, thawedVal string
			if v1 {
				dir, file, frozenVal, thawedVal = filepath.Join(h.freezerDir, g.Path()), "freezer.state", "FROZEN", "THAWED"
			} else {
				dir, file, frozenVal, thawedVal = g.unifiedDir(), "cgroup.freeze", "1", "0"
				// The kernel reports completion in cgroup.events; the fake
				// must say so up front.
				mustWrite(t, filepath.Join(dir, "cgroup.events"), "populated 1\nfrozen 1\n")
			}
			if err := g.Freeze(); err != nil {
				t.Fatalf("Freeze: %v", err)
			}
			if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, file))); got != frozenVal {
				t.Fatalf("%s = %q after Freeze, want %q", file, got, frozenVal)
			}
			if f, err := g.Frozen(); err != nil || !f {
				t.Fatalf("Frozen = %v, %v after Freeze", f, err)
			}
			if !v1 {
				mustWrite(t, filepath.Join(dir, "cgroup.events"), "populated 1\nfrozen 0\n")
			}
			if err := g.Thaw(); err != nil {
				t.Fatalf("Thaw: %v", err)
			}
			if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, file))); got != thawedVal {
				t.Fatalf("%s = %q after Thaw, want %q", file, got, thawedVal)
			}
			if f, err := g.Frozen(); err != nil || f {
				t.Fatalf("Frozen = %v, %v after Thaw", f, err)
			}
			// The v1 freezer hierarchy is never used in v2 / hybrid-without-freezer
			// and the unified one never when a v1 freezer exists.
			if v1 && k.layout() == LayoutHybrid {
				if got := strings.TrimSpace(mustRead(t, filepath.Join(g.unifiedDir(), "cgroup.freeze"))); got != "0" {
					t.Errorf("hybrid with v1 freezer wrote unified cgroup.freeze = %q", got)
				}
			}
		})
	}
}

// The v2 freezer completes asynchronously: Freeze waits for cgroup.events
// and gives up with ErrTimeout when the kernel never reports frozen.
func TestFreezeTimeoutV2(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV2, fakeHybridNoFreezer} {
		h := OpenLayout(newFake(t, k), k.layout())
		g := fakeCreate(t, h, "x")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		err := g.FreezeContext(ctx)
		cancel()
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v: FreezeContext with events frozen 0 = %v; want ErrTimeout", k, err)
		}
	}
}

// A v1 group stuck in FREEZING (a task in D state) must time out instead of
// spinning forever like containerd/cgroups' own Freeze: poll keeps
// re-checking with backoff and gives up with ErrTimeout when ctx ends.
func TestPollTimeout(t *testing.T) {
	t.Parallel()
	calls := 0
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := poll(ctx, func() (bool, string, error) { calls++; return false, "FREEZING", nil }, "freezing", "x")
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "FREEZING") {
		t.Fatalf("poll = %v; want ErrTimeout mentioning the state", err)
	}
	if calls < 3 {
		t.Fatalf("check called %d times; want retries", calls)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("poll overran its deadline: %v", el)
	}
	// Errors and completion end the wait at once.
	boom := errors.New("boom")
	if err := poll(context.Background(), func() (bool, string, error) { return false, "", boom }, "x", "y"); !errors.Is(err, boom) {
		t.Fatalf("poll error = %v", err)
	}
	n := 0
	if err := poll(context.Background(), func() (bool, string, error) { n++; return n == 3, "", nil }, "x", "y"); err != nil || n != 3 {
		t.Fatalf("poll = %v after %d calls", err, n)
	}
}

func TestFrozenMalformed(t *testing.T) {
	t.Parallel()
	h := OpenLayout(newFake(t, fakeV1Separate), LayoutV1)
	g := fakeCreate(t, h, "x")
	mustWrite(t, filepath.Join(h.freezerDir, "x", "freezer.state"), "SLUSHY\n")
	if _, err := g.Frozen(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Frozen on bad state = %v; want ErrMalformed", err)
	}
	h2 := OpenLayout(newFake(t, fakeV2), LayoutV2)
	g2 := fakeCreate(t, h2, "x")
	mustWrite(t, filepath.Join(g2.unifiedDir(), "cgroup.events"), "populated 0\n")
	if _, err := g2.Frozen(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Frozen without frozen key = %v; want ErrUnsupported", err)
	}
	mustWrite(t, filepath.Join(g2.unifiedDir(), "cgroup.events"), "frozen 2\n")
	if _, err := g2.Frozen(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Frozen with frozen 2 = %v; want ErrMalformed", err)
	}
}

// FreezeNoWait and ThawNoWait write the state once and return without waiting for the
// kernel (a v2 group whose cgroup.events still says frozen 0 is no error); a missing
// file or group is classified like any other write.
func TestFreezeNoWait(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV1Separate, fakeHybridNoFreezer, fakeV2} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			g, dir, file, frozenVal, thawedVal := fakeFreezer(t, k)
			if k != fakeV1Separate {
				mustWrite(t, filepath.Join(dir, "cgroup.events"), "populated 1\nfrozen 0\n")
			}
			// A longer value first: the write must replace it, not overwrite its start.
			mustWrite(t, filepath.Join(dir, file), "FREEZING\n")
			if err := g.FreezeNoWait(); err != nil {
				t.Fatalf("FreezeNoWait: %v", err)
			}
			if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, file))); got != frozenVal {
				t.Fatalf("%s = %q after FreezeNoWait, want %q", file, got, frozenVal)
			}
			if err := g.ThawNoWait(); err != nil {
				t.Fatalf("ThawNoWait: %v", err)
			}
			if got := strings.TrimSpace(mustRead(t, filepath.Join(dir, file))); got != thawedVal {
				t.Fatalf("%s = %q after ThawNoWait, want %q", file, got, thawedVal)
			}
			if err := os.Remove(filepath.Join(dir, file)); err != nil {
				t.Fatal(err)
			}
			if err := g.FreezeNoWait(); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("FreezeNoWait without %s = %v; want ErrUnsupported", file, err)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := g.ThawNoWait(); !errors.Is(err, ErrNotExist) {
				t.Fatalf("ThawNoWait of a removed group = %v; want ErrNotExist", err)
			}
		})
	}
}

// TestFreezeWriterFake: the writer's pwrites land in the freezer file of each layout; a
// closed writer and a removed group fail with the sentinels callers branch on.
func TestFreezeWriterFake(t *testing.T) {
	t.Parallel()
	for _, k := range []fakeKind{fakeV1Separate, fakeHybridNoFreezer, fakeV2} {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			g, dir, file, frozenVal, thawedVal := fakeFreezer(t, k)
			// A regular file keeps what a shorter write leaves behind (kernfs does not):
			// start from a value as long as the written ones.
			mustWrite(t, filepath.Join(dir, file), thawedVal)
			w, err := g.FreezeWriter()
			if err != nil {
				t.Fatalf("FreezeWriter: %v", err)
			}
			for _, tc := range []struct {
				frozen bool
				want   string
			}{{true, frozenVal}, {false, thawedVal}, {true, frozenVal}} {
				if err := w.Request(tc.frozen); err != nil {
					t.Fatalf("Request(%v): %v", tc.frozen, err)
				}
				if got := mustRead(t, filepath.Join(dir, file)); got != tc.want {
					t.Fatalf("%s = %q after Request(%v), want %q", file, got, tc.frozen, tc.want)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Request(false); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("Request after Close = %v, want os.ErrClosed", err)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := g.FreezeWriter(); !errors.Is(err, ErrNotExist) {
				t.Fatalf("FreezeWriter of a removed group = %v, want ErrNotExist", err)
			}
		})
	}
}

// fakeFreezer creates a group on a fake root of kind k and returns it with the directory
// and name of its freezer file and the values that file takes when frozen and thawed.
func fakeFreezer(t *testing.T, k fakeKind) (g *Group, dir, file, frozenVal, thawedVal string) {
	t.Helper()
	h := OpenLayout(newFake(t, k), k.layout())
	g = fakeCreate(t, h, "kubepods/besteffort/x")
	if k == fakeV1Separate {
		return g, filepath.Join(h.freezerDir, g.Path()), "freezer.state", "FROZEN", "THAWED"
	}
	return g, g.unifiedDir(), "cgroup.freeze", "1", "0"
}
