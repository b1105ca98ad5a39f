package koordlet

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/understory/understory/cgroups"
)

func TestTierContainerPath(t *testing.T) {
	t.Parallel()
	const uid = "0b5e6f1c-1111-4222-8333-444455556666"
	for _, tc := range []struct {
		name   string
		d      cgroups.Driver
		parent string
		orig   string
		want   string
		err    bool
	}{
		{"cgroupfs kubepods tier", cgroups.DriverCgroupfs, TierParentKubepods,
			"/kubepods/besteffort/pod" + uid + "/abc123",
			"/kubepods/understory-batch/pod" + uid + "/abc123", false},
		{"cgroupfs besteffort tier", cgroups.DriverCgroupfs, TierParentBestEffort,
			"/kubepods/besteffort/pod" + uid + "/abc123",
			"/kubepods/besteffort/understory-batch/pod" + uid + "/abc123", false},
		{"systemd kubepods tier", cgroups.DriverSystemd, TierParentKubepods,
			"kubepods-besteffort-pod0b5e6f1c_1111_4222_8333_444455556666.slice:cri-containerd:abc123",
			"kubepods-understory_batch-pod0b5e6f1c_1111_4222_8333_444455556666.slice:cri-containerd:abc123", false},
		{"systemd malformed", cgroups.DriverSystemd, TierParentKubepods, "kubepods.slice", "", true},
		{"cgroupfs relative", cgroups.DriverCgroupfs, TierParentKubepods, "kubepods/x", "", true},
		{"cgroupfs dotdot", cgroups.DriverCgroupfs, TierParentKubepods, "/kubepods/../x", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tier, err := TierCgroup(tc.d, "/", tc.parent, DefaultTierName)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tierContainerPath(tc.d, tier, uid, tc.orig)
			if tc.err {
				if !errors.Is(err, errBadCgroupsPath) {
					t.Fatalf("got %q, %v; want errBadCgroupsPath", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("tierContainerPath = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := tierContainerPath(cgroups.DriverCgroupfs, "kubepods/understory-batch", "../../etc", "/kubepods/x/y"); !errors.Is(err, cgroups.ErrInvalidPath) {
		t.Fatalf("an escaping UID was accepted: %v", err)
	}
}

func TestNRIPluginMovesOnlyBatch(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	p, err := NewNRIPlugin(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctr := &api.Container{Name: "main", Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/podu1/c1"}}
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		labels map[string]string
		parent string
		want   string
	}{
		{"batch annotation", map[string]string{"understory.io/qos-class": "batch"}, nil, "/kubepods/besteffort/podu1", "/kubepods/understory-batch/podu1/c1"},
		{"koordinator BE label", nil, map[string]string{"koordinator.sh/qosClass": "BE"}, "/kubepods/besteffort/podu1", "/kubepods/understory-batch/podu1/c1"},
		{"plain besteffort", nil, nil, "/kubepods/besteffort/podu1", ""},
		{"LS", map[string]string{"understory.io/qos-class": "LS"}, nil, "/kubepods/burstable/podu1", ""},
		{"invalid value stays put", map[string]string{"understory.io/qos-class": "gold"}, nil, "/kubepods/besteffort/podu1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &api.PodSandbox{Name: "p", Namespace: "ns", Uid: "u1", Annotations: tc.ann, Labels: tc.labels,
				Linux: &api.LinuxPodSandbox{CgroupParent: tc.parent}}
			adj, upd, err := p.CreateContainer(context.Background(), pod, ctr)
			if err != nil || upd != nil {
				t.Fatalf("CreateContainer: %v, %v", upd, err)
			}
			got := ""
			if adj != nil && adj.Linux != nil {
				got = adj.Linux.CgroupsPath
			}
			if got != tc.want {
				t.Fatalf("cgroups path = %q, want %q", got, tc.want)
			}
		})
	}
}
