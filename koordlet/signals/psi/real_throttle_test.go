package psi

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/internal/testenv"
)

// TestRealThrottleDiscount: a busy loop held to 10 ms per 100 ms by its own
// v1 CFS quota stalls in its unified group's cpu.pressure (the kernel keeps
// throttled tasks runnable for PSI), its throttled time grows alike, and
// Harm discounts the stall to nearly nothing. It also records the lag of
// the throttled time and the same stall in the node's cpu pressure.
func TestRealThrottleDiscount(t *testing.T) {
	env := requireReal(t, true)
	if env.cpuV1 == "" {
		testenv.SkipOrFailInCI(t, "needs a hybrid node (v1 cpu quota, pressure in the unified hierarchy)")
	}
	lockCPU(t)
	name := uniqueName(t)
	v1 := makeGroup(t, env.cpuV1, name)
	unified := makeGroup(t, env.cgroup2, name)
	writeFile(t, filepath.Join(v1, "cpu.cfs_period_us"), "100000")
	writeFile(t, filepath.Join(v1, "cpu.cfs_quota_us"), "10000")

	pressureFile, err := CgroupFile(env.cgroup2, name, CPU)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := OpenReader(pressureFile)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	tr, err := OpenThrottleReader(filepath.Join(v1, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	nodeFile, err := ProcFile(realProc, CPU)
	if err != nil {
		t.Fatal(err)
	}
	node, err := OpenReader(nodeFile)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	usageFile := filepath.Join(unified, "cpu.stat")

	sample := func() Sample {
		t.Helper()
		p, err := pr.Read()
		if err != nil {
			t.Fatal(err)
		}
		th, err := tr.Read()
		if err != nil {
			t.Fatal(err)
		}
		return Sample{Time: time.Now(), Stall: p.Some.Total, Throttled: th.Time, Usage: usageUsec(t, usageFile)}
	}
	// aligned samples just after the throttled time stepped (a run queue was
	// unthrottled at a period refill), when it has caught up with the stall.
	aligned := func() Sample {
		t.Helper()
		first := sample()
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
			th, err := tr.Read()
			if err != nil {
				t.Fatal(err)
			}
			if th.Time != first.Throttled {
				return sample()
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatal("throttled time did not step within 300 ms: is the busy loop throttled?")
		return Sample{}
	}

	throttled0 := sample().Throttled
	startHelper(t, "burn:-1", v1, unified)
	// The quota bites once the throttled time first steps: the busy loop ran out of a
	// period's quota and waited for the refill.
	testenv.WaitFor(t, 5*time.Second, "the busy loop's first throttling (cpu.stat throttled time)", func() bool {
		th, err := tr.Read()
		if err != nil {
			t.Fatal(err)
		}
		return th.Time > throttled0
	})

	// Twenty 25 ms intervals, unaligned: the throttled time arrives in steps
	// at period refills while the stall grows steadily.
	prev, lagging := sample(), 0
	for range 20 {
		time.Sleep(25 * time.Millisecond)
		cur := sample()
		w := cur.Since(prev)
		if w.Throttled == 0 && w.Stall > 0 {
			lagging++
		}
		t.Logf("25 ms interval: stall %v, throttled %v, usage %v -> harm %v", w.Stall, w.Throttled, w.Usage, Harm(w))
		prev = cur
	}
	t.Logf("%d of 20 unaligned 25 ms intervals had stall but no throttled time yet (all of it harm)", lagging)
	if lagging == 0 {
		t.Errorf("throttled time grew in every 25 ms interval: the lag the package doc describes is gone")
	}

	s0 := aligned()
	n0, err := node.Read()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	s1 := aligned()
	n1, err := node.Read()
	if err != nil {
		t.Fatal(err)
	}
	w := s1.Since(s0)
	nodeStall := n1.Some.Total - n0.Some.Total
	harm := Harm(w)
	t.Logf("aligned %v: stall %v, throttled %v, usage %v -> explained %v, harm %v (%.1f%% of the stall); "+
		"node cpu stall %v", w.Wall, w.Stall, w.Throttled, w.Usage, Explained(w), harm,
		100*float64(harm)/float64(max(w.Stall, 1)), nodeStall)

	// 10 ms of 100: the loop is throttled ~90% of the time.
	if w.Stall < w.Wall/2 {
		t.Errorf("stall %v over %v: the kernel did not count the throttled task as stalled", w.Stall, w.Wall)
	}
	if w.Throttled < w.Wall/2 {
		t.Errorf("throttled time %v over %v: quota not biting", w.Throttled, w.Wall)
	}
	if harm > w.Stall/5 {
		t.Errorf("harm %v of stall %v: the discount left more than a fifth", harm, w.Stall)
	}
	// The node counts the throttled task's stall too (see the package doc):
	// its CPU is stalled ~90% and weighs at least as much as the other CPUs.
	if nodeStall < w.Wall*3/10 {
		t.Errorf("node cpu stall %v over %v: expected the throttled task's stall there too", nodeStall, w.Wall)
	}
}

// usageUsec reads usage_usec from a cgroup2 cpu.stat.
func usageUsec(t *testing.T, path string) time.Duration {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return time.Duration(us) * time.Microsecond
		}
	}
	t.Fatalf("%s has no usage_usec", path)
	return 0
}
