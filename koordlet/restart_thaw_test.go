package koordlet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/signals"
)

// frozenNode is a fake node where an agent was killed while it had batch frozen: the
// tier, the pod below it, two in-place batch pods in kubelet's own pod cgroups (one
// with cpu.idle set, as the agent leaves it, one without, as on a kernel without
// cpu.idle) and a container of one of them frozen on its own. An LS pod runs thawed.
type frozenNode struct {
	root   string
	kind   cgroupstest.Kind
	driver cgroups.Driver
	// groups are every cgroup the test made; frozen those it froze.
	groups, frozen []string
}

// newFrozenNode builds the fake node below kubelet's --cgroup-root kubeletRoot ("/" by
// default).
func newFrozenNode(t *testing.T, kind cgroupstest.Kind, d cgroups.Driver, kubeletRoot string) *frozenNode {
	t.Helper()
	n := &frozenNode{root: cgroupstest.NewRoot(t, kind), kind: kind, driver: d}
	must := func(p string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	naming := cgroups.Naming{Driver: d, Root: kubeletRoot}
	if kubeletRoot != "/" {
		for _, q := range []cgroups.KubeQOS{cgroups.QOSGuaranteed, cgroups.QOSBurstable, cgroups.QOSBestEffort} {
			cgroupstest.AddGroup(t, n.root, kind, naming.QOSPath(q))
		}
	}
	tier := must(config.TierCgroup(d, kubeletRoot, config.TierParentKubepods, config.DefaultTierName))
	tierPod := must(cgroups.TierPodPath(d, tier, string(batchUID2)))
	inPlace := must(naming.PodPath(cgroups.QOSBestEffort, string(batchUID1)))
	inPlaceCtr := path.Join(inPlace, "cri-containerd-0123abcd.scope")
	noIdle := must(naming.PodPath(cgroups.QOSBurstable, string(invalidUID)))
	ls := must(naming.PodPath(cgroups.QOSBurstable, string(lsUID)))
	for _, g := range []string{tier, tierPod, inPlace, inPlaceCtr, noIdle, ls} {
		cgroupstest.AddGroup(t, n.root, kind, g)
		n.groups = append(n.groups, g)
	}
	if err := os.WriteFile(filepath.Join(cgroupstest.Dir(n.root, kind, inPlace), "cpu.idle"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// As the agent freezes: the tier (its pods with it), each in-place pod; the
	// container on its own, as a GPU duty cycle or a thaw of the pod that did not reach
	// it would leave it.
	for _, g := range []string{tier, inPlace, inPlaceCtr, noIdle} {
		n.freeze(t, g)
	}
	if kind.HasFreezer() {
		// v1: a group below a frozen one reads FROZEN too.
		n.write(t, filepath.Join(n.root, "freezer", tierPod), "freezer.state", "FROZEN\n")
	} else {
		fakeCgroup2Freezer(t, n.unified())
	}
	return n
}

func (n *frozenNode) unified() string {
	if n.kind.IsV2() {
		return n.root
	}
	return filepath.Join(n.root, "unified")
}

func (n *frozenNode) write(t *testing.T, dir, file, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// freeze freezes rel as the agent does: the v1 freezer where there is one, cgroup.freeze
// otherwise.
func (n *frozenNode) freeze(t *testing.T, rel string) {
	t.Helper()
	if n.kind.HasFreezer() {
		n.write(t, filepath.Join(n.root, "freezer", rel), "freezer.state", "FROZEN\n")
	} else {
		n.write(t, filepath.Join(n.unified(), rel), "cgroup.freeze", "1\n")
	}
	n.frozen = append(n.frozen, rel)
}

// stillFrozen lists the groups of the fake node that a freezer reports frozen or asked
// to freeze: v1 freezer.state not THAWED; cgroup2 cgroup.freeze 1 or cgroup.events
// "frozen 1".
func (n *frozenNode) stillFrozen(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, g := range n.groups {
		if n.kind.HasFreezer() {
			b, err := os.ReadFile(filepath.Join(n.root, "freezer", g, "freezer.state"))
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.TrimSpace(string(b)); s != "THAWED" {
				out = append(out, g+" freezer.state "+s)
			}
		}
		if n.kind.IsV2() || n.kind.IsHybrid() {
			dir := filepath.Join(n.unified(), g)
			for _, f := range []struct{ file, frozen string }{{"cgroup.freeze", "1"}, {"cgroup.events", "frozen 1"}} {
				b, err := os.ReadFile(filepath.Join(dir, f.file))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), f.frozen) {
					out = append(out, g+" "+f.file+" "+strings.TrimSpace(string(b)))
				}
			}
		}
	}
	return out
}

// fakeCgroup2Freezer plays the kernel's part of the cgroup2 freezer below dir until the
// test ends: each group's cgroup.events says "frozen 1" while it or an ancestor has
// cgroup.freeze 1 (the kernel also waits for the tasks; a fake group has none). It has
// settled once before it returns. cgroup.events is replaced whole (a rename), as a
// kernel file is read whole.
func fakeCgroup2Freezer(t *testing.T, dir string) {
	t.Helper()
	settle := func() error {
		eff := map[string]bool{}
		return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.freeze"))
			if errors.Is(err, fs.ErrNotExist) {
				return nil // the root
			}
			if err != nil {
				return err
			}
			frozen := strings.TrimSpace(string(b)) == "1" || eff[filepath.Dir(p)]
			eff[p] = frozen
			want := "populated 0\nfrozen 0\n"
			if frozen {
				want = "populated 0\nfrozen 1\n"
			}
			if cur, err := os.ReadFile(filepath.Join(p, "cgroup.events")); err == nil && string(cur) == want {
				return nil
			}
			tmp := filepath.Join(p, ".cgroup.events.tmp")
			if err := os.WriteFile(tmp, []byte(want), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, filepath.Join(p, "cgroup.events"))
		})
	}
	if err := settle(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				_ = settle() // a torn read of cgroup.freeze is settled on the next tick
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// restartKinds are the node shapes a restart is tested on: v1, hybrid with and without
// a v1 freezer, v2; each with kubelet's cgroupfs and systemd naming.
var restartKinds = []cgroupstest.Kind{cgroupstest.V1Separate, cgroupstest.Hybrid, cgroupstest.HybridNoFreezer, cgroupstest.V2}

// An agent killed while batch was frozen is restarted: its start-up path thaws the tier,
// the in-place batch pods (which live in kubelet's pod cgroups, not below the tier) and
// a container frozen on its own, before the pod source has synced (no API server
// needed). Both start paths: the agent's constructor, and the binary's first step
// (ThawAtStart, which runs before the configuration is validated).
func TestRestartThawsInPlacePods(t *testing.T) {
	t.Parallel()
	starts := []struct {
		name  string
		start func(t *testing.T, cfg config.Config)
	}{
		{"New", func(t *testing.T, cfg config.Config) {
			if _, err := New(cfg, Deps{Pods: newFakePods(), NodeCPU: &fakeCPU{times: collect.CPUTimes{CPUs: 2}},
				Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
				t.Fatal(err)
			}
		}},
		{"ThawAtStart", func(t *testing.T, cfg config.Config) {
			thawed, err := ThawAtStart(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if len(thawed) < 4 {
				t.Errorf("ThawAtStart reported %q, want at least the 4 groups frozen", thawed)
			}
		}},
	}
	for _, kind := range restartKinds {
		for _, d := range []cgroups.Driver{cgroups.DriverCgroupfs, cgroups.DriverSystemd} {
			for _, s := range starts {
				t.Run(fmt.Sprintf("%s/%s/%s", kind, d, s.name), func(t *testing.T) {
					t.Parallel()
					n := newFrozenNode(t, kind, d, "/")
					if got := n.stillFrozen(t); len(got) < len(n.frozen) {
						t.Fatalf("the fake node is not frozen as set up: %q", got)
					}
					cfg := config.Default()
					cfg.CgroupRoot, cfg.ProcRoot, cfg.CgroupDriver = n.root, t.TempDir(), string(d)
					cfg.Signals.Mode = string(signals.ModeSampling)
					s.start(t, cfg)
					// The start path waits for the kernel; the fake kernel may be a tick late.
					var left []string
					if !testenv.Poll(5*time.Second, func() bool { left = n.stillFrozen(t); return len(left) == 0 }) {
						t.Fatalf("after the restart, still frozen: %q", left)
					}
				})
			}
		}
	}
}

// buildAgent builds cmd/koordlet, the real agent binary, into a temp dir.
func buildAgent(t *testing.T) string {
	t.Helper()
	// Where there is no Go toolchain (the cgroup v2 VM of test/e2e/nodev2), the runner
	// passes the agent it built.
	if bin := os.Getenv("UNDERSTORY_KOORDLET_BIN"); bin != "" {
		return bin
	}
	out := filepath.Join(t.TempDir(), "koordlet")
	cmd := exec.Command("go", "build", "-o", out, "../cmd/koordlet")
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/koordlet: %v\n%s", err, b)
	}
	return out
}

// A configuration that became invalid while the agent was down (here: a period out of
// range) does not keep batch frozen: the binary thaws first, then exits non-zero with
// an error that names the bad field and says batch was thawed.
func TestInvalidConfigAtStartThaws(t *testing.T) {
	t.Parallel()
	bin := buildAgent(t)
	for _, c := range []struct {
		kind        cgroupstest.Kind
		driver      cgroups.Driver
		kubeletRoot string
		config      string
	}{
		{cgroupstest.V1Separate, cgroups.DriverCgroupfs, "/", "period: 1ms\n"},
		{cgroupstest.V2, cgroups.DriverSystemd, "/", "cgroupDriver: systemd\nperiod: 1ms\n"},
		// Not even YAML: where the cgroups are comes from the defaults and the flags.
		{cgroupstest.Hybrid, cgroups.DriverCgroupfs, "/", "period: [\n"},
		// kubelet's --cgroup-root is read from a file that does not load (a field of the
		// wrong type, an unknown one).
		{cgroupstest.V1Separate, cgroups.DriverSystemd, "/node1", "kubeletCgroupRoot: /node1\nminPodCPU: lots\nnoSuchField: 1\n"},
	} {
		t.Run(fmt.Sprintf("%s/%s/root=%s", c.kind, c.driver, c.kubeletRoot), func(t *testing.T) {
			t.Parallel()
			n := newFrozenNode(t, c.kind, c.driver, c.kubeletRoot)
			dir := t.TempDir()
			cfgPath := filepath.Join(dir, "koordlet.yaml")
			if err := os.WriteFile(cfgPath, []byte(c.config), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "-config", cfgPath, "-cgroup-root", n.root,
				"-pod-manifests", dir, "-listen", "127.0.0.1:0")
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("agent with an invalid config: %v, want a non-zero exit\n%s", err, out)
			}
			for _, want := range []string{"invalid config", "thawed first"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if left := n.stillFrozen(t); len(left) > 0 {
				t.Fatalf("the agent exited on its configuration and left frozen: %q\n%s", left, out)
			}
		})
	}
}
