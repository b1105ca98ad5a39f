package colo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
)

// TestMemoryEndToEnd runs the memory scenario with a tiny node and short phases on this
// machine: the phase without the agent must show LS harm, and nothing may be left.
func TestMemoryEndToEnd(t *testing.T) {
	sc := realScenarioConfig(t, "the memory scenario")
	mc := defaultMemoryConfig()
	mc.Node, mc.LSAnon, mc.LSFile, mc.LSRequest = 384*mib, 32*mib, 128*mib, 176*mib
	mc.BatchData, mc.ReadRate, mc.GrowRate = 160*mib, 128*mib, 128*mib
	mc.Rate, mc.Conns = 200, 16
	mc.Phase, mc.Ramp, mc.Warmup = 3*time.Second, 3*time.Second, 500*time.Millisecond
	var out bytes.Buffer
	res, err := runMemory(context.Background(), sc, mc, func(f string, a ...any) { fmt.Fprintf(&out, f, a...) })
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("memory scenario: %v", err)
	}
	for _, row := range []string{"LS alone", "LS + batch, no agent", "LS + batch, agent"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("output lacks the %q row", row)
		}
	}
	if len(res.Phases) != 3 {
		t.Fatalf("%d phases, want 3", len(res.Phases))
	}
	solo, vanilla := res.Phases[0], res.Phases[1]
	// Without the agent LS may be OOM-killed and restarted (failed requests are the harm);
	// alone and with the agent it must serve.
	for _, p := range []memoryPhase{res.Phases[0], res.Phases[2]} {
		if p.Requests == 0 || p.Errors > p.Requests/10 {
			t.Errorf("%s: %d requests, %d errors", p.Name, p.Requests, p.Errors)
		}
	}
	// Without the agent, batch grows until the node is short and takes LS's page cache:
	// LS reads it again from disk, and stalls on memory or slows down.
	if vanilla.LSRefaultMiB <= solo.LSRefaultMiB {
		t.Errorf("no LS page cache refaults without the agent (%.1f MiB, solo %.1f MiB): no memory pressure on LS",
			vanilla.LSRefaultMiB, solo.LSRefaultMiB)
	}
	if vanilla.LSPSISome <= solo.LSPSISome && res.RatioVanilla < 1.2 {
		t.Errorf("without the agent LS neither stalled on memory (PSI some %.2f%%) nor slowed (p99 %.2fx solo)",
			vanilla.LSPSISome, res.RatioVanilla)
	}
	// The node was short: full at the end of the phase, or someone was OOM-killed in it
	// (then the figures at its end are those of the restarted processes).
	if vanilla.KubepodsMiB < 0.9*float64(mc.Node)/mib && vanilla.BatchOOM+vanilla.LSOOMKills == 0 {
		t.Errorf("without the agent batch used %.0f MiB and kubepods %.0f MiB of %d, no OOM kill: the node was not short",
			vanilla.BatchMiB, vanilla.KubepodsMiB, mc.Node/mib)
	}
	// With the agent each batch pod had its batch-memory as its memory limit, under the
	// tier's limit, and the jobs sized their heaps to it, not to the node.
	agent := res.Phases[2]
	if want := float64(res.Config.BatchPods) * float64(res.Config.BatchMemoryMiB); agent.BatchLimMiB < want ||
		agent.BatchLimMiB > want+float64(res.Config.BatchPods) {
		t.Errorf("agent phase: batch pod memory limits %.1f MiB in all, want %d × %d MiB (the pods' batch-memory)",
			agent.BatchLimMiB, res.Config.BatchPods, res.Config.BatchMemoryMiB)
	}
	if agent.TierLimitMiB <= 0 || agent.TierLimitMiB > float64(mc.Node)/mib {
		t.Errorf("agent phase: tier memory limit %.1f MiB, want one within the node's %d MiB", agent.TierLimitMiB, mc.Node/mib)
	}
	if !(agent.BatchHeapMiB > 0) || agent.BatchHeapMiB >= vanilla.BatchHeapMiB {
		t.Errorf("batch heap %.0f MiB with the agent, %.0f MiB without: the jobs did not see their limits",
			agent.BatchHeapMiB, vanilla.BatchHeapMiB)
	}
	base := fmt.Sprintf("understory-demo-%d", os.Getpid())
	for _, c := range []string{"cpu", "cpuacct", "freezer", "memory", "unified"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, base)); err == nil {
			t.Errorf("the memory scenario left /sys/fs/cgroup/%s/%s behind", c, base)
		}
	}
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "understory-colo-mem-*"))
	for _, d := range left {
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) < time.Minute {
			t.Errorf("the memory scenario left %s behind", d)
		}
	}
}

func TestBurstableOOMScoreAdj(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		request, capacity int64
		want              int
	}{
		{0, 1000, 999},   // no request: kept below BestEffort's 1000
		{500, 1000, 500}, // half the node
		{999, 1000, 2},   // 1000 − 999 = 1, kept above Guaranteed
		{2000, 1000, 2},  // more than the node
		{832 * mib, 2048 * mib, 594},
	} {
		if got := burstableOOMScoreAdj(tc.request, tc.capacity); got != tc.want {
			t.Errorf("burstableOOMScoreAdj(%d, %d) = %d, want %d", tc.request, tc.capacity, got, tc.want)
		}
	}
}

func TestMemoryConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  func(*memoryConfig)
		ok   bool
	}{
		{"default", func(*memoryConfig) {}, true},
		{"tiny node", func(c *memoryConfig) { c.Node = mib }, false},
		{"LS larger than the node", func(c *memoryConfig) { c.LSFile = c.Node }, false},
		{"LS request above the node", func(c *memoryConfig) { c.LSRequest = c.Node + 1 }, false},
		{"no batch pods", func(c *memoryConfig) { c.BatchPods = 0 }, false},
		{"heap share above 1", func(c *memoryConfig) { c.HeapShare = 1.5 }, false},
		{"zero read rate", func(c *memoryConfig) { c.ReadRate = 0 }, false},
		{"threshold 0", func(c *memoryConfig) { c.Threshold = 0 }, false},
		{"zero phase", func(c *memoryConfig) { c.Phase = 0 }, false},
		{"zero rate", func(c *memoryConfig) { c.Rate = 0 }, false},
	} {
		c := defaultMemoryConfig()
		tc.mod(&c)
		if err := c.validate(); (err == nil) != tc.ok {
			t.Errorf("%s: validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestMemHierFiles reads a fake memory hierarchy of each kind through memHier: what
// package cgroups reads (working set, OOM kills, limit, pressure) and what memHier
// reads itself (charged usage, refaults, the visible limit).
func TestMemHierFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                        string
		kind                        cgroupstest.Kind
		usage, stat, events, limVal string
		wantLimit                   int64
	}{
		{name: "v1", kind: cgroupstest.Hybrid, usage: "1048576\n",
			stat: "cache 1\ntotal_inactive_file 262144\ntotal_rss 524288\ntotal_cache 524288\n" +
				"total_workingset_refault_file 7\nhierarchical_memory_limit 268435456\n",
			events: "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", limVal: "9223372036854771712\n", wantLimit: -1},
		{name: "v2", kind: cgroupstest.V2, usage: "1048576\n",
			stat:   "anon 524288\nfile 524288\ninactive_file 262144\nworkingset_refault_file 7\n",
			events: "low 0\nhigh 0\nmax 4\noom 3\noom_kill 3\noom_group_kill 0\n", limVal: "max\n", wantLimit: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := cgroupstest.NewRoot(t, tc.kind)
			rel := "kubepods/besteffort/pod1"
			v2 := tc.kind.IsV2()
			if !v2 {
				if err := os.WriteFile(filepath.Join(root, "memory", "memory.limit_in_bytes"), []byte(cgroupstest.Unlimited64), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{"kubepods", "kubepods/besteffort", rel} {
				cgroupstest.AddGroup(t, root, tc.kind, p)
				cgroupstest.AddMemory(t, root, tc.kind, p)
			}
			layout := cgroups.LayoutHybrid
			if v2 {
				layout = cgroups.LayoutV2
			}
			m, err := openMemHier(cgroups.OpenLayout(root, layout))
			if err != nil {
				t.Fatal(err)
			}
			usageFile, limitFile, eventsFile := "memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control"
			psiDir := filepath.Join(root, "unified", rel)
			if v2 {
				usageFile, limitFile, eventsFile = "memory.current", "memory.max", "memory.events"
				psiDir = filepath.Join(root, rel)
			}
			dir := cgroupstest.MemoryDir(root, tc.kind, rel)
			for name, v := range map[string]string{usageFile: tc.usage, "memory.stat": tc.stat, eventsFile: tc.events,
				limitFile: tc.limVal} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(psiDir, "memory.pressure"),
				[]byte("some avg10=1.50 avg60=0.20 avg300=0.00 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if u, err := m.usage(rel); err != nil || u != 1<<20 {
				t.Errorf("usage = %d, %v; want %d", u, err, 1<<20)
			}
			if ws, err := m.workingSet(rel); err != nil || ws != 3<<18 {
				t.Errorf("working set = %d, %v; want %d", ws, err, 3<<18)
			}
			if n, err := m.refaults(rel); err != nil || n != 7 {
				t.Errorf("refaults = %d, %v; want 7", n, err)
			}
			if n, err := m.oomKills(rel); err != nil || n != 3 {
				t.Errorf("oomKills = %d, %v; want 3", n, err)
			}
			if l, err := m.limit(rel); err != nil || l != tc.wantLimit {
				t.Errorf("limit = %d, %v; want %d", l, err, tc.wantLimit)
			}
			// Unlimited: the nearest limit above (v1 hierarchical_memory_limit, v2
			// kubepods' memory.max), as a JVM in the pod sees it.
			if err := os.WriteFile(filepath.Join(cgroupstest.MemoryDir(root, tc.kind, "kubepods"), limitFile),
				[]byte("268435456\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if l, err := m.visibleLimit(rel, t.TempDir()); err != nil || l != 256*mib {
				t.Errorf("visibleLimit = %d, %v; want %d", l, err, 256*mib)
			}
			g, err := m.h.Load(rel)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.SetMemoryLimit(64*mib, cgroups.UnlimitedMemory); err != nil {
				t.Fatal(err)
			}
			if l, err := m.limit(rel); err != nil || l != 64*mib {
				t.Errorf("limit after SetMemoryLimit = %d, %v; want %d", l, err, 64*mib)
			}
			if l, err := m.visibleLimit(rel, t.TempDir()); err != nil || l != 64*mib {
				t.Errorf("visibleLimit with a limit = %d, %v; want %d", l, err, 64*mib)
			}
			p, err := m.pressure(rel)
			if err != nil || p.Some.Avg10 != 1.5 || p.Some.Total != 123456*time.Microsecond {
				t.Errorf("pressure = %+v, %v", p, err)
			}
			if _, err := m.usage("../escape"); err == nil {
				t.Error("usage accepted a path leaving the hierarchy")
			}
			if _, err := m.refaults("../escape"); err == nil {
				t.Error("refaults accepted a path leaving the hierarchy")
			}
		})
	}
}

// TestMemHierEnableMemory: on v2 the memory controller is enabled in every parent of
// a pod cgroup, as kubelet does; on v1 nothing is written.
func TestMemHierEnableMemory(t *testing.T) {
	t.Parallel()
	for k, layout := range map[cgroupstest.Kind]cgroups.Layout{cgroupstest.V2: cgroups.LayoutV2,
		cgroupstest.Hybrid: cgroups.LayoutHybrid} {
		root := cgroupstest.NewRoot(t, k)
		rel := "kubepods/besteffort/pod1"
		cgroupstest.AddGroup(t, root, k, rel)
		m := memHier{h: cgroups.OpenLayout(root, layout), dir: root, v2: k.IsV2()}
		if err := m.enableMemory(rel); err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		for _, p := range []string{"", "kubepods", "kubepods/besteffort", rel} {
			b, err := os.ReadFile(filepath.Join(root, p, "cgroup.subtree_control"))
			want := ""
			if k.IsV2() && p != rel {
				want = "+memory"
			}
			if got := strings.TrimSpace(string(b)); got != want && !(want == "" && err != nil) {
				t.Errorf("%v: %q subtree_control = %q, %v; want %q", k, p, got, err, want)
			}
		}
		if err := m.enableMemory("../escape"); err == nil && k.IsV2() {
			t.Errorf("%v: enableMemory accepted a path leaving the hierarchy", k)
		}
	}
}

func TestOpenMemHierNoMemory(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu io\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openMemHier(cgroups.OpenLayout(root, cgroups.LayoutV2)); !errors.Is(err, errNoMemcg) {
		t.Errorf("cgroup2 without memory: %v, want errNoMemcg", err)
	}
	if _, err := openMemHier(cgroups.OpenLayout(t.TempDir(), cgroups.LayoutHybrid)); !errors.Is(err, errNoMemcg) {
		t.Errorf("hybrid without a memory hierarchy: %v, want errNoMemcg", err)
	}
}

func FuzzKeyedValue(f *testing.F) {
	f.Add([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), "oom_kill")
	f.Add([]byte("total_inactive_file 18446744073709551615\n"), "total_inactive_file")
	f.Add([]byte("oom_kill -1\n"), "oom_kill")
	f.Add([]byte(""), "x")
	f.Fuzz(func(t *testing.T, b []byte, key string) {
		v, err := keyedValue(b, key)
		if err != nil && v != 0 {
			t.Fatalf("value %d with error %v", v, err)
		}
	})
}

// The kdamond line: printed with each phase's figure where DAMON runs, not at all
// where it does not.
func TestPrintKdamond(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		phases []memoryPhase
		want   []string // "" : nothing printed
	}{
		{"DAMON off", []memoryPhase{{Name: "LS alone"}, {Name: "LS + batch, agent"}}, nil},
		{"DAMON on", []memoryPhase{{Name: "LS alone", KdamondMs: 71, KdamondThreads: 1},
			{Name: "LS + batch, agent", KdamondMs: 280.4, KdamondThreads: 1}},
			[]string{"kdamond", "LS alone 71 ms", "LS + batch, agent 280 ms"}},
		{"unreadable", []memoryPhase{{Name: "LS alone", KdamondMs: -1, KdamondThreads: 1}},
			[]string{"LS alone unreadable"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			printKdamond(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, tc.phases)
			if len(tc.want) == 0 {
				if b.Len() != 0 {
					t.Fatalf("printed %q, want nothing", b.String())
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("printed %q, want %q in it", b.String(), w)
				}
			}
		})
	}
}
