package runqlat

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// TestWakeBTF and TestWakeTracepoint: a victim behind four burners on one
// CPU, with a slow-event threshold it passes many times a second. Unarmed,
// the probe sends nothing; armed, the first slow delay wakes the reader well
// within 100 ms, with exactly one record until it is armed again, and the
// record names the pod. Close closes Wake. Not parallel (cgroupstest.LockCPU).
func TestWakeBTF(t *testing.T) { testWake(t, Options{Mode: ModeBTF}) }

func TestWakeTracepoint(t *testing.T) { testWake(t, Options{Mode: ModeTracepoint}) }

func testWake(t *testing.T, opts Options) {
	requireRoot(t)
	if !haveRingbuf() {
		testenv.SkipOrFailInCI(t, "no BPF ring buffers on this kernel (before 5.8): the probe cannot wake")
	}
	cgroupstest.LockCPU(t)
	p := loadProbe(t, opts)
	wake := p.Wake()
	if wake == nil {
		t.Fatal("Wake() = nil on a kernel with ring buffers")
	}
	const threshold = 512 * time.Microsecond
	if err := p.SetThreshold(threshold); err != nil {
		t.Fatal(err)
	}
	podDir, pod := testCgroup(t, "")
	ctrDir, ctr := testCgroup(t, podDir)
	burnDir, _ := testCgroup(t, "")
	if err := p.Watch(pod, ctr); err != nil {
		t.Fatal(err)
	}
	cpu := lastCPU(t)
	for range 4 {
		startHelper(t, "burn", cpu, burnDir)
	}
	startHelper(t, "victim", cpu, ctrDir)

	// Not armed: slow delays are counted, nothing is sent.
	s0 := slowEvents(t, p)
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("a slow delay (>= %v) behind four burners", threshold), func() bool {
		return slowEvents(t, p) > s0
	})
	// A deliberate window after that slow delay: a wake-up for it would come within it.
	select {
	case <-wake:
		t.Fatal("woken before Arm")
	case <-time.After(100 * time.Millisecond):
	}
	if n := p.n.records.Load(); n != 0 {
		t.Fatalf("%d records before Arm, want 0", n)
	}

	for round := uint64(1); round <= 3; round++ {
		armed := time.Now()
		if err := p.Arm(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wake:
			t.Logf("round %d: woken %v after Arm", round, time.Since(armed))
		case <-time.After(100 * time.Millisecond):
			t.Fatalf("round %d: no wake-up within 100 ms of Arm, slow events %d", round, slowEvents(t, p)-s0)
		}
		// The victim keeps waiting behind the burners: more slow delays, still one record.
		s1 := slowEvents(t, p)
		testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("round %d: a slow delay after the wake-up", round), func() bool {
			return slowEvents(t, p) > s1
		})
		// A deliberate window after that slow delay: a second wake-up would come within it.
		select {
		case <-wake:
			t.Errorf("round %d: a second wake-up without Arm", round)
		case <-time.After(100 * time.Millisecond):
		}
		if n := p.n.records.Load(); n != round {
			t.Errorf("round %d: %d records, want %d: one per Arm", round, n, round)
		}
		if k, d := p.n.lastKey.Load(), time.Duration(p.n.lastDelay.Load()); k != pod || d < threshold {
			t.Errorf("round %d: record (key %d, delay %v), want (%d, >= %v)", round, k, d, pod, threshold)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-wake:
		if ok {
			t.Error("a value on Wake after Close, want it closed")
		}
	case <-time.After(time.Second):
		t.Error("Wake not closed by Close")
	}
	if err := p.Arm(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Arm after Close = %v, want os.ErrClosed", err)
	}
}

// TestNoWake: the object for kernels without ring buffers loads and counts
// slow events; Arm says ErrNoWake and Wake is nil (a poller polls).
func TestNoWake(t *testing.T) {
	p := loadProbe(t, Options{noWake: true})
	if p.Wake() != nil {
		t.Error("Wake() != nil without the ring buffer")
	}
	if err := p.Arm(); !errors.Is(err, ErrNoWake) {
		t.Errorf("Arm() = %v, want ErrNoWake", err)
	}
	if err := p.SetThreshold(time.Microsecond); err != nil {
		t.Fatal(err)
	}
	podDir, pod := testCgroup(t, "")
	if err := p.Watch(pod); err != nil {
		t.Fatal(err)
	}
	startHelper(t, "victim", lastCPU(t), podDir)
	s0 := slowEvents(t, p)
	testenv.WaitFor(t, 5*time.Second, "a slow event counted without the ring buffer", func() bool {
		return slowEvents(t, p) > s0
	})
}
