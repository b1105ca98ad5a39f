package koordlet

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/koordlet/collect"
	"github.com/understory/understory/koordlet/config"
	"github.com/understory/understory/koordlet/nri"
	"github.com/understory/understory/koordlet/signals"
)

// kind runs kubelet with the systemd driver and --cgroup-root /kubelet. kubelet's
// cgroup names then start with the root's components, and the systemd driver makes
// every level a slice named by the '-'-joined chain of all of them
// ("kubelet.slice/kubelet-kubepods.slice/..."). The agent's tier and the batch pods
// below it are named on the same chain: the agent sets the tier up there, the NRI
// plugin hands the runtime a slice on that chain, the agent finds a batch pod the
// runtime made there, and it rediscovers an in-place batch pod a previous run held in
// kubelet's own slice.
func TestAgentSystemdKubeletRoot(t *testing.T) {
	t.Parallel()
	const (
		kubepods   = "kubelet.slice/kubelet-kubepods.slice"
		burstable  = kubepods + "/kubelet-kubepods-burstable.slice"
		besteffort = kubepods + "/kubelet-kubepods-besteffort.slice"
		ctrID      = "0123456789abcdef"
	)
	esc := func(u types.UID) string { return strings.ReplaceAll(string(u), "-", "_") }
	batch := map[string]string{"understory.io/qos-class": "batch"}
	for _, tc := range []struct {
		parent, tier string
	}{
		{config.TierParentKubepods, kubepods + "/kubelet-kubepods-understory_batch.slice"},
		{config.TierParentBestEffort, besteffort + "/kubelet-kubepods-besteffort-understory_batch.slice"},
	} {
		for _, kind := range []cgroupstest.Kind{cgroupstest.V2, cgroupstest.V1Separate} {
			t.Run(tc.parent+"/"+kind.String(), func(t *testing.T) {
				t.Parallel()
				root := cgroupstest.NewRoot(t, kind)
				inPlace := besteffort + "/kubelet-kubepods-besteffort-pod" + esc(batchUID1) + ".slice"
				ls := burstable + "/kubelet-kubepods-burstable-pod" + esc(lsUID) + ".slice"
				// The kernel's part: kubelet's slices, the tier a previous run made, and an
				// in-place batch pod that run left idle.
				for _, cg := range []string{"kubelet.slice", kubepods, burstable, besteffort, tc.tier, ls, inPlace} {
					cgroupstest.AddGroup(t, root, kind, cg)
				}
				if err := os.WriteFile(filepath.Join(cgroupstest.Dir(root, kind, inPlace), "cpu.idle"), []byte("1\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				cfg := config.Default()
				cfg.CgroupRoot, cfg.ProcRoot = root, t.TempDir()
				cfg.CgroupDriver, cfg.KubeletCgroupRoot, cfg.TierParent = "systemd", "/kubelet", tc.parent
				cfg.Signals.Mode = string(signals.ModeSampling)
				log := slog.New(slog.NewTextHandler(io.Discard, nil))
				pods := newFakePods(
					testPod("ls", lsUID, nil, "500m"),
					testPod("batch-inplace", batchUID1, batch, ""),
					testPod("batch-tier", batchUID2, batch, ""),
				)
				a, err := New(cfg, Deps{Pods: pods, NodeCPU: &fakeCPU{times: collect.CPUTimes{CPUs: 2}},
					Registry: prometheus.NewRegistry(), Logger: log})
				if err != nil {
					t.Fatal(err)
				}
				if got := a.Status().Tier.Cgroup; got != tc.tier {
					t.Fatalf("tier cgroup = %q, want %q", got, tc.tier)
				}
				if got := strings.TrimSpace(cgroupstest.Read(t, root, kind, tc.tier, "cpu.idle")); got != "1" {
					t.Fatalf("tier cpu.idle = %q, want 1", got)
				}
				// Nothing below a directory named like the root itself: that is cgroupfs naming.
				if _, err := os.Stat(cgroupstest.Dir(root, kind, "kubelet")); !os.IsNotExist(err) {
					t.Fatalf("the agent made a cgroupfs-style %q: %v", "kubelet", err)
				}
				if got := cgroupOf(a, batchUID1); got != inPlace {
					t.Fatalf("in-place batch pod a previous run held: rediscovered at %q, want %s", got, inPlace)
				}

				// The NRI plugin moves the batch pod's container to the slice on the tier's chain.
				p, err := nri.New(cfg, log, nri.Options{})
				if err != nil {
					t.Fatal(err)
				}
				kubeletUnit := "kubelet-kubepods-besteffort-pod" + esc(batchUID2) + ".slice"
				sandbox := &api.PodSandbox{Name: "batch-tier", Namespace: "default", Uid: string(batchUID2),
					Annotations: batch, Linux: &api.LinuxPodSandbox{CgroupParent: kubeletUnit}}
				ctr := &api.Container{Name: "c", Linux: &api.LinuxContainer{CgroupsPath: kubeletUnit + ":cri-containerd:" + ctrID}}
				adj, _, err := p.CreateContainer(context.Background(), sandbox, ctr)
				if err != nil {
					t.Fatal(err)
				}
				tierUnit := strings.TrimSuffix(path.Base(tc.tier), ".slice") + "-pod" + esc(batchUID2) + ".slice"
				if adj == nil || adj.Linux == nil || adj.Linux.CgroupsPath != tierUnit+":cri-containerd:"+ctrID {
					t.Fatalf("NRI adjustment %+v, want cgroups path %s", adj, tierUnit+":cri-containerd:"+ctrID)
				}

				// runc expands that slice below the tier; the agent finds the pod there.
				tierPod := tc.tier + "/" + tierUnit
				cgroupstest.AddGroup(t, root, kind, tierPod)
				a.syncPods(pods.List())
				a.tick(context.Background(), time.Now())
				for uid, want := range map[types.UID]string{batchUID1: inPlace, batchUID2: tierPod, lsUID: ls} {
					if got := cgroupOf(a, uid); got != want {
						t.Errorf("pod %s found at %q, want %s", uid, got, want)
					}
				}
			})
		}
	}
}

// cgroupOf is where the agent found the pod's cgroup ("" if nowhere or unknown).
func cgroupOf(a *Agent, uid types.UID) string {
	if st := a.pods[uid]; st != nil {
		return st.read.cgroup
	}
	return ""
}
