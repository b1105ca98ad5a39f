//go:build cgo

package gpu

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/gpu/duty"
	"github.com/understory/understory/qos"
)

// thawCycler is a cycler that records each key's duty and counts ThawAll.
type thawCycler struct {
	mu    sync.Mutex
	duty  map[string]float64
	thaws int
}

var _ cycler = (*thawCycler)(nil)

func (c *thawCycler) Set(key string, groups []*cgroups.Group, d float64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d == 0 || len(groups) == 0 {
		delete(c.duty, key)
		return nil
	}
	c.duty[key] = d
	return nil
}
func (c *thawCycler) Release(context.Context, *cgroups.Group) error { return nil }
func (c *thawCycler) ThawAll(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thaws++
	clear(c.duty)
	return nil
}
func (c *thawCycler) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (c *thawCycler) Status() []duty.KeyStatus      { return nil }
func (c *thawCycler) NextPeriod(t time.Time) time.Time {
	return t.Truncate(100 * time.Millisecond).Add(100 * time.Millisecond)
}

func (c *thawCycler) state(key string) (float64, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.duty[key], c.thaws
}

// panickyManager is a Manager over the NVML collector on a fake node whose GPU 0 runs
// LS and batch, and whose process listing panics while panicking is set.
func panickyManager(t *testing.T, panicking *atomic.Bool, log *slog.Logger) (*Manager, *thawCycler) {
	t.Helper()
	f := newFakeNode()
	f.set(map[int]gpuStep{0: {util: 90, running: running, samples: []nvml.ProcessUtilizationSample{
		{Pid: pidLS, TimeStamp: uint64(time.Now().UnixMicro()), SmUtil: 80}}}})
	d := f.srv.Devices[0].(*dgxa100.Device)
	list := d.GetComputeRunningProcessesFunc
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if panicking.Load() {
			panic("a binding bug")
		}
		return list()
	}
	c, err := NewCollector(f.srv, fakeProc(t))
	if err != nil {
		t.Fatal(err)
	}
	root := cgroupstest.NewRoot(t, cgroupstest.Hybrid)
	const cg = "kubepods/understory-batch/pod" + batchUID
	cgroupstest.AddGroup(t, root, cgroupstest.Hybrid, cg)
	pods := PodMap{
		lsUID:    {UID: lsUID, Namespace: "web", Name: "infer", Class: qos.ClassLS},
		batchUID: {UID: batchUID, Namespace: "ml", Name: "train", Class: qos.ClassBatch, Cgroup: cg},
	}
	cyc := &thawCycler{duty: map[string]float64{}}
	m, err := NewManager(Options{Source: c, Pods: func() PodView { return pods },
		Groups: cgroups.OpenLayout(root, cgroups.LayoutHybrid), Cycler: cyc, Policy: qos.DefaultGPUThrottlePolicy(),
		Period: 50 * time.Millisecond, Log: log, ProcRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return m, cyc
}

// TestStepRecoversPanic: a step that panics (here the NVML mock's process listing) is
// recovered: logged with its stack, counted, the batch the loop froze is thawed, /status
// carries the error, and the next step works again, freezing what still needs it.
func TestStepRecoversPanic(t *testing.T) {
	t.Parallel()
	var panicking atomic.Bool
	var logs syncBuffer
	m, cyc := panickyManager(t, &panicking, slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Now()
	m.step(context.Background(), now)
	if d, _ := cyc.state("gpu0"); d <= 0 {
		t.Fatalf("LS beside batch: batch duty %v, want frozen", d)
	}
	panicking.Store(true)
	for k := 1; k <= 3; k++ {
		m.step(context.Background(), now.Add(time.Duration(k)*50*time.Millisecond)) // must not panic
		d, thaws := cyc.state("gpu0")
		if d != 0 || thaws != k {
			t.Fatalf("panicking step %d: duty %v after %d thaws, want 0 after %d", k, d, thaws, k)
		}
		if st := m.Status(); st.Available || st.Error == "" || m.rec.panics.Load() != uint64(k) {
			t.Fatalf("panicking step %d: status available %t error %q, %d panics", k, st.Available, st.Error,
				m.rec.panics.Load())
		}
	}
	// Logged once with the stack (the panic's frame in it), not at every step.
	if out := logs.String(); strings.Count(out, "stack=") != 1 || !strings.Contains(out, ErrStepPanic.Error()) ||
		!strings.Contains(out, "panickyManager") {
		t.Fatalf("log, want one panic line with its stack:\n%s", out)
	}
	panicking.Store(false)
	m.step(context.Background(), now.Add(time.Second))
	if d, _ := cyc.state("gpu0"); d <= 0 {
		t.Fatalf("after the panics: batch duty %v, want frozen again", d)
	}
	if st := m.Status(); !st.Available || st.Error != "" {
		t.Fatalf("after the panics: status available %t error %q", st.Available, st.Error)
	}
}

// TestRunSurvivesPanics: the GPU goroutine (Run) keeps stepping through panicking steps
// and ends cleanly when its context does.
func TestRunSurvivesPanics(t *testing.T) {
	t.Parallel()
	var panicking atomic.Bool
	panicking.Store(true)
	m, _ := panickyManager(t, &panicking, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "three panicking steps (the loop must go on)", func() bool {
		return m.rec.panics.Load() >= 3
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
}
